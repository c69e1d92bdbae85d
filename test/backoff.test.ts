/**
 * Pure retry-delay functions: full-jitter backoff with injected randomness, Retry-After parsing, and
 * retryDelay (the one decision of each retry's wait). No clock, no HTTP.
 */
import { describe, expect, it } from 'vitest';
import { fullJitterDelay, parseRetryAfter, retryDelay, type RetryDelayInput } from '../src/api/backoff.js';
import { HttpError, NotFoundError, RateLimitedError } from '../src/errors.js';

describe('fullJitterDelay', () => {
  const opts = (random: number) => ({ baseMs: 100, maxMs: 1000, random: () => random });

  it('is 0 when random() is 0', () => {
    for (const retry of [1, 2, 5, 30]) expect(fullJitterDelay(retry, opts(0))).toBe(0);
  });

  it('is just under the ceiling when random() is 0.999; the ceiling doubles then caps at maxMs', () => {
    expect([1, 2, 3, 4, 5, 6, 50].map((r) => fullJitterDelay(r, opts(0.999)))).toEqual([99, 199, 399, 799, 999, 999, 999]);
  });

  it('scales linearly with random() inside the ceiling', () => {
    expect(fullJitterDelay(1, opts(0.5))).toBe(50);
    expect(fullJitterDelay(3, opts(0.25))).toBe(100);
    expect(fullJitterDelay(10, opts(0.5))).toBe(500);
  });

  it('never exceeds maxMs, even for huge retry numbers', () => {
    expect(fullJitterDelay(5000, opts(0.999999))).toBe(999);
    expect(Number.isFinite(fullJitterDelay(5000, opts(0.5)))).toBe(true);
  });

  it('treats retry <= 1 as the first retry', () => {
    expect(fullJitterDelay(0, opts(0.999))).toBe(99);
    expect(fullJitterDelay(-3, opts(0.999))).toBe(99);
  });

  it('defaults to baseMs 500 and maxMs 30000', () => {
    expect(fullJitterDelay(1, { random: () => 0.999 })).toBe(499);
    expect(fullJitterDelay(2, { random: () => 0.999 })).toBe(999);
    expect(fullJitterDelay(20, { random: () => 0.999 })).toBe(29_970);
  });

  it('with Math.random stays inside [0, ceiling) and returns integers', () => {
    for (let i = 0; i < 500; i++) {
      const d = fullJitterDelay(3, { baseMs: 10, maxMs: 1000 });
      expect(Number.isInteger(d)).toBe(true);
      expect(d).toBeGreaterThanOrEqual(0);
      expect(d).toBeLessThan(40);
    }
  });
});

describe('parseRetryAfter', () => {
  const NOW = Date.parse('2025-03-04T05:06:07.000Z');

  it('parses delay-seconds', () => {
    expect(parseRetryAfter('0', NOW)).toBe(0);
    expect(parseRetryAfter('3', NOW)).toBe(3000);
    expect(parseRetryAfter('120', NOW)).toBe(120_000);
    expect(parseRetryAfter(' 2 ', NOW)).toBe(2000);
  });

  it('parses fractional seconds', () => {
    expect(parseRetryAfter('1.5', NOW)).toBe(1500);
    expect(parseRetryAfter('0.25', NOW)).toBe(250);
  });

  it('parses an HTTP-date in the future as the time until then', () => {
    expect(parseRetryAfter(new Date(NOW + 5000).toUTCString(), NOW)).toBe(5000);
    expect(parseRetryAfter('Tue, 04 Mar 2025 05:07:07 GMT', NOW)).toBe(60_000);
  });

  it('an HTTP-date in the past is 0', () => {
    expect(parseRetryAfter(new Date(NOW - 60_000).toUTCString(), NOW)).toBe(0);
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', NOW)).toBe(0);
  });

  it('an HTTP-date uses the given now, not the system clock', () => {
    const header = 'Tue, 04 Mar 2025 05:06:17 GMT';
    expect(parseRetryAfter(header, NOW)).toBe(10_000);
    expect(parseRetryAfter(header, NOW + 4000)).toBe(6000);
  });

  it('garbage, empty and absent values are undefined', () => {
    expect(parseRetryAfter('soon', NOW)).toBeUndefined();
    expect(parseRetryAfter('', NOW)).toBeUndefined();
    expect(parseRetryAfter('   ', NOW)).toBeUndefined();
    expect(parseRetryAfter('3s', NOW)).toBeUndefined();
    expect(parseRetryAfter(undefined, NOW)).toBeUndefined();
  });

  it('garbage that a lenient date parser would accept is undefined, not an immediate retry', () => {
    // RFC 9110 10.2.3: Retry-After = HTTP-date / delay-seconds. '-1', '+3', 'foo 1' are neither; V8's
    // Date.parse reads them as dates in 2001, which would turn them into a 0 ms delay.
    expect(parseRetryAfter('-1', NOW)).toBeUndefined();
    expect(parseRetryAfter('+3', NOW)).toBeUndefined();
    expect(parseRetryAfter('foo 1', NOW)).toBeUndefined();
    expect(parseRetryAfter('1.5.2', NOW)).toBeUndefined();
  });

  it('takes the first value of a repeated header', () => {
    expect(parseRetryAfter(['4', '9'], NOW)).toBe(4000);
    expect(parseRetryAfter([], NOW)).toBeUndefined();
  });
});

describe('retryDelay', () => {
  const backoff = { baseMs: 100, maxMs: 1000 };
  const input = (over: Partial<RetryDelayInput> = {}): RetryDelayInput => ({
    attempt: 1,
    error: { status: 503, retryable: true },
    retriesLeft: 3,
    backoff,
    maxRetryAfterMs: 120_000,
    random: () => 0.5,
    ...over,
  });

  it('does not retry an error that is not retryable, whatever else it says', () => {
    expect(retryDelay(input({ error: { status: 404, retryable: false } }))).toBeUndefined();
    expect(retryDelay(input({ error: { status: 400, retryable: false, retryAfterMs: 1000 } }))).toBeUndefined();
  });

  it('does not retry when no retries are left', () => {
    expect(retryDelay(input({ retriesLeft: 0 }))).toBeUndefined();
    expect(retryDelay(input({ retriesLeft: -1 }))).toBeUndefined();
    expect(retryDelay(input({ retriesLeft: 0, error: { status: 429, retryAfterMs: 1000, retryable: true } }))).toBeUndefined();
    expect(retryDelay(input({ retriesLeft: 1 }))).toBe(50);
  });

  it('honours Retry-After exactly (0 included), whatever the attempt and the jitter', () => {
    for (const attempt of [1, 2, 7]) {
      for (const r of [0, 0.5, 0.999]) {
        expect(retryDelay(input({ attempt, random: () => r, error: { status: 429, retryAfterMs: 2000, retryable: true } }))).toBe(2000);
      }
    }
    expect(retryDelay(input({ error: { status: 503, retryAfterMs: 0, retryable: true } }))).toBe(0);
    // Longer than backoff.maxMs is fine: the server's word counts up to maxRetryAfterMs.
    expect(retryDelay(input({ error: { status: 503, retryAfterMs: 90_000, retryable: true } }))).toBe(90_000);
  });

  it('caps Retry-After at maxRetryAfterMs (default 120 s)', () => {
    expect(retryDelay(input({ maxRetryAfterMs: 50, error: { status: 429, retryAfterMs: 3_600_000, retryable: true } }))).toBe(50);
    expect(retryDelay(input({ maxRetryAfterMs: 2000, error: { status: 429, retryAfterMs: 2000, retryable: true } }))).toBe(2000);
    const { maxRetryAfterMs: _, ...noCap } = input({ error: { status: 429, retryAfterMs: 3_600_000, retryable: true } });
    expect(retryDelay(noCap)).toBe(120_000);
  });

  it('without Retry-After: full jitter below min(maxMs, baseMs * 2^(attempt-1))', () => {
    expect([1, 2, 3, 4, 5, 6].map((attempt) => retryDelay(input({ attempt, random: () => 0.999 })))).toEqual([99, 199, 399, 799, 999, 999]);
    expect([1, 2, 3].map((attempt) => retryDelay(input({ attempt, random: () => 0 })))).toEqual([0, 0, 0]);
    expect(retryDelay(input({ attempt: 3, random: () => 0.25 }))).toBe(100);
    // Network errors and timeouts (no status) back off the same way.
    expect(retryDelay(input({ attempt: 2, error: { retryable: true } }))).toBe(100);
  });

  it('takes the jitter from `random`, else from backoff.random, and the shape defaults to 500 ms .. 30 s', () => {
    expect(retryDelay(input({ random: undefined, backoff: { ...backoff, random: () => 0.5 } }))).toBe(50);
    expect(retryDelay(input({ random: () => 0.1, backoff: { ...backoff, random: () => 0.5 } }))).toBe(10);
    expect(retryDelay(input({ backoff: undefined, random: () => 0.999 }))).toBe(499);
    expect(retryDelay(input({ attempt: 20, backoff: undefined, random: () => 0.999 }))).toBe(29_970);
  });

  it('reads what it needs straight off the typed errors', () => {
    const details = { method: 'GET', path: '/v1/conversations', attempts: 1 };
    expect(retryDelay(input({ error: new RateLimitedError('429', { ...details, retryAfterMs: 1000 }) }))).toBe(1000);
    expect(retryDelay(input({ error: new HttpError('503', { ...details, status: 503 }) }))).toBe(50);
    expect(retryDelay(input({ error: new HttpError('timeout', details) }))).toBe(50);
    expect(retryDelay(input({ error: new NotFoundError('404', details) }))).toBeUndefined();
    expect(retryDelay(input({ error: new HttpError('400', { ...details, status: 400 }) }))).toBeUndefined();
  });

  it('always returns an integer >= 0 within the ceiling, with Math.random', () => {
    for (let i = 0; i < 200; i++) {
      const d = retryDelay(input({ attempt: 4, random: undefined, backoff: { baseMs: 10, maxMs: 1000 } }))!;
      expect(Number.isInteger(d)).toBe(true);
      expect(d).toBeGreaterThanOrEqual(0);
      expect(d).toBeLessThan(80);
    }
  });
});
