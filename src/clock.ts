/**
 * Time as an input (design habit 8): backoff, rate limiting and timestamps read the clock through
 * this interface so tests can observe or replace it.
 */
export interface Clock {
  /** Wall-clock time in ms since the epoch. */
  now(): number;
  /** Resolves after `ms` milliseconds (immediately for ms <= 0). */
  sleep(ms: number): Promise<void>;
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms) => (ms > 0 ? new Promise((resolve) => setTimeout(resolve, ms)) : Promise.resolve()),
};

/** ISO 8601 UTC with milliseconds, e.g. `2026-11-21T15:04:05.123Z`. */
export function isoNow(clock: Clock): string {
  return new Date(clock.now()).toISOString();
}
