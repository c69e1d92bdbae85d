/**
 * Retry delays (design habit 8: pure functions of their inputs, randomness injected).
 */

/** Options of {@link fullJitterDelay}. */
export interface BackoffOptions {
  /** Delay scale of the first retry, ms. @defaultValue 500 */
  baseMs?: number;
  /** Upper bound of any computed delay, ms. @defaultValue 30000 */
  maxMs?: number;
  /** Random source in [0, 1). @defaultValue Math.random */
  random?: () => number;
}

/**
 * Exponential backoff with full jitter: a uniform delay in `[0, min(maxMs, baseMs * 2^(retry-1)))`.
 *
 * @param retry - 1 for the first retry, 2 for the second...
 * @returns delay in ms
 */
export function fullJitterDelay(retry: number, opts: BackoffOptions = {}): number {
  const base = opts.baseMs ?? 500;
  const max = opts.maxMs ?? 30_000;
  const random = opts.random ?? Math.random;
  const ceiling = Math.min(max, base * 2 ** Math.max(0, retry - 1));
  return Math.floor(random() * ceiling);
}

/** The failed attempt as {@link retryDelay} sees it (an {@link HttpError} fits). */
export interface FailedAttempt {
  /** HTTP status, or `undefined` for a network error or timeout. */
  status?: number | undefined;
  /** The server's `Retry-After`, ms, when it sent one. */
  retryAfterMs?: number | undefined;
  /** Whether the error class allows a retry at all. */
  retryable: boolean;
}

/** Input of {@link retryDelay}. */
export interface RetryDelayInput {
  /** 1 for the first retry (after the first attempt failed), 2 for the second... */
  attempt: number;
  /** What the failed attempt answered. */
  error: FailedAttempt;
  /** Retries still allowed after this one is decided (p-retry's `retriesLeft`); 0 = none. */
  retriesLeft: number;
  /** Backoff shape when the server sent no `Retry-After`. @defaultValue base 500 ms, max 30 s */
  backoff?: BackoffOptions | undefined;
  /** Longest `Retry-After` honoured, ms; a longer one is capped to it. @defaultValue 120000 */
  maxRetryAfterMs?: number;
  /** Random source in [0, 1) for the jitter; overrides `backoff.random`. @defaultValue `backoff.random`, else Math.random */
  random?: (() => number) | undefined;
}

/**
 * How long to wait before retrying a failed request, in the spirit of got's
 * `calculate-retry-delay`: a pure function of the attempt, the error and the policy.
 *
 * - No retry (`undefined`) when the error is not retryable or no retries are left.
 * - `Retry-After` (RFC 9110 10.2.3), when the server sent one, is honoured, capped at
 *   `maxRetryAfterMs` (a 429 or 503 saying "come back in an hour" waits at most that cap).
 * - Otherwise exponential backoff with full jitter ({@link fullJitterDelay}).
 *
 * @returns the delay in ms (an integer >= 0), or `undefined` for "do not retry"
 */
export function retryDelay(input: RetryDelayInput): number | undefined {
  if (!input.error.retryable || !(input.retriesLeft > 0)) return undefined;
  const retryAfter = input.error.retryAfterMs;
  if (retryAfter !== undefined) return Math.max(0, Math.min(retryAfter, input.maxRetryAfterMs ?? 120_000));
  const random = input.random ?? input.backoff?.random;
  return fullJitterDelay(input.attempt, { ...input.backoff, ...(random ? { random } : {}) });
}

const IMF_FIXDATE = /^[A-Za-z]{3}, \d{2} [A-Za-z]{3} \d{4} \d{2}:\d{2}:\d{2} GMT$/;
const RFC850_DATE = /^[A-Za-z]+, \d{2}-[A-Za-z]{3}-\d{2} \d{2}:\d{2}:\d{2} GMT$/;
const ASCTIME_DATE = /^[A-Za-z]{3} [A-Za-z]{3} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/;

/**
 * Parses a `Retry-After` header (RFC 9110 10.2.3): delay-seconds or an HTTP-date.
 *
 * @param header - the header value, if any
 * @param nowMs - current epoch ms (for HTTP-dates)
 * @returns delay in ms (>= 0), or `undefined` when absent or unparseable
 */
export function parseRetryAfter(header: string | string[] | undefined, nowMs: number): number | undefined {
  const value = Array.isArray(header) ? header[0] : header;
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  if (trimmed === '') return undefined;
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Math.round(Number(trimmed) * 1000);
  // Only the three HTTP-date forms (IMF-fixdate, RFC 850, asctime): Date.parse alone accepts junk
  // such as '-1' or 'foo 1', which would turn into an immediate retry.
  let text: string;
  if (IMF_FIXDATE.test(trimmed) || RFC850_DATE.test(trimmed)) text = trimmed;
  else if (ASCTIME_DATE.test(trimmed)) text = `${trimmed} GMT`; // asctime carries no zone; HTTP dates are GMT
  else return undefined;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - nowMs);
}
