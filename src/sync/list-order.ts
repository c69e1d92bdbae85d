/**
 * The order of the conversation list, as the listing observes it (pure): many support APIs list
 * conversations newest activity first. When every page of a complete listing is ordered by the
 * change field, descending, the mirror records it, and an incremental listing may stop paging once
 * it is past everything that changed (see `listWorkspace`).
 */

import type { ListOrder } from '../store/mirror.js';

export type { ListOrder };

/** A signal as served: a string (an ISO 8601 time, usually) or a number. */
export type Signal = string | number;

/**
 * Compares two signals: numbers numerically, two times (both parse as dates) by instant, other
 * strings by code unit; undefined when they cannot be compared (a number against a string).
 *
 * @returns negative when `a` is older (smaller), 0 when equal, positive when newer
 */
export function compareSignals(a: Signal, b: Signal): number | undefined {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  if (typeof a !== 'string' || typeof b !== 'string') return undefined;
  const ta = Date.parse(a);
  const tb = Date.parse(b);
  if (!Number.isNaN(ta) && !Number.isNaN(tb) && ta !== tb) return ta - tb;
  return a < b ? -1 : a > b ? 1 : 0;
}

/** A usable signal of a served conversation object, or undefined. */
function signalIn(obj: Record<string, unknown>, field: string): Signal | undefined {
  const v = obj[field];
  return typeof v === 'string' || (typeof v === 'number' && Number.isFinite(v)) ? v : undefined;
}

/**
 * Follows one listing pass page by page: whether the list stays ordered by `field`, newest first
 * (ties allowed), the newest signal seen, and, with a threshold, how many pages in a row held only
 * conversations older than it.
 */
export class OrderTracker {
  /** Still ordered (descending) so far. */
  ordered = true;
  /** The first disorder seen, in words. */
  why: string | undefined;
  /** The newest signal seen. */
  newest: Signal | undefined;
  /** Consecutive pages, ending with the last one observed, whose every conversation is older than the threshold. */
  olderPages = 0;
  private prev: { id: string; signal: Signal } | undefined;

  /**
   * @param field - the change field
   * @param threshold - the newest signal of the last complete listing (early stop); undefined: none
   */
  constructor(
    private readonly field: string,
    private readonly threshold?: Signal,
  ) {}

  /** Observes one page, in list order. */
  observe(page: Record<string, unknown>[]): void {
    let allOlder = this.threshold !== undefined && page.length > 0;
    for (const obj of page) {
      const id = String(obj.id);
      const s = signalIn(obj, this.field);
      if (s === undefined) {
        this.disorder(`conversation ${id} serves no ${this.field}`);
        allOlder = false;
        continue;
      }
      if (this.prev) {
        const c = compareSignals(s, this.prev.signal);
        if (c === undefined || c > 0) this.disorder(`conversation ${id} (${this.field} ${String(s)}) comes after ${this.prev.id} (${String(this.prev.signal)})`);
      }
      if (this.newest === undefined || (compareSignals(s, this.newest) ?? 0) > 0) this.newest = s;
      if (allOlder && !((compareSignals(s, this.threshold!) ?? 0) < 0)) allOlder = false;
      this.prev = { id, signal: s };
    }
    this.olderPages = allOlder && this.ordered ? this.olderPages + 1 : 0;
  }

  private disorder(why: string): void {
    if (this.ordered) this.why = why;
    this.ordered = false;
  }
}
