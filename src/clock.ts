/**
 * Time as an input (design habit 8): backoff, rate limiting and timestamps read the clock through
 * this interface so tests can observe or replace it.
 */
export interface Clock {
  /** Wall-clock time in ms since the epoch. */
  now(): number;
  /**
   * Resolves after `ms` milliseconds (immediately for ms <= 0); rejects with the signal's reason
   * as soon as `signal` aborts.
   */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) => {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (ms <= 0) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal!.reason);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  },
};

/** ISO 8601 UTC with milliseconds, e.g. `2026-11-21T15:04:05.123Z`. */
export function isoNow(clock: Clock): string {
  return new Date(clock.now()).toISOString();
}

/**
 * Whether `p` settles (resolves or rejects alike) within `ms` of real time. The timer keeps the
 * process alive while it runs (a shutdown step must not let the process end in its middle) and is
 * cleared as soon as `p` settles.
 */
export async function settlesWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([
      p.then(
        () => true,
        () => true,
      ),
      timeout,
    ]);
  } finally {
    clearTimeout(timer);
  }
}
