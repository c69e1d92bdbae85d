/**
 * Engine-neutral helpers of the store: pure functions over the values the {@link Mirror} engines
 * and their callers share. No SQL, no driver.
 */
import type { WriteCounts } from './types.js';

/** Row counts starting at zero. */
export const zeroCounts = (): WriteCounts => ({ inserted: 0, updated: 0, unchanged: 0, deleted: 0 });

/** The change signal `field` of a conversation's served object (JSON), as a string; null when absent. */
export function signalOf(raw: string | null, field: string): string | null {
  if (raw === null) return null;
  try {
    const v = (JSON.parse(raw) as Record<string, unknown>)[field];
    return v === undefined || v === null ? null : typeof v === 'string' ? v : JSON.stringify(v);
  } catch {
    return null;
  }
}
