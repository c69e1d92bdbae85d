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
