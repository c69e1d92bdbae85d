/**
 * Server-side rate limit of the fake (sliding 1 s window, 429 + Retry-After, RateLimit-* headers)
 * and the ApiClient's adaptive limiter: a cap learned from 429s and from the headers, pacing of
 * Remaining over Reset, the configured --max-rps as an upper bound. Real HTTP to the fake; the
 * limiter's arithmetic with an injected clock. Time is asserted on the test clock's recorded waits and
 * on the arrival times in the fake's request log (lower bounds), never on measured elapsed time; the
 * fake's own rate-limit window runs on an injected clock.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ApiClient, type ApiClientOptions } from '../src/api/client.js';
import { RECOVERY_SHARE, RateLimiter, SLOW_START_STEP, WINDOW_MARGIN_MS, parseRateLimitHeaders } from '../src/api/rate-limit.js';
import { FakeWorkspace, startFakeApi, type FakeApi, type FakeApiOptions } from '../src/fake-api/index.js';
import { frozenClock, testClock, type TestClock } from './helpers.js';

const API_KEY = 'rate-limit-test-key';
const LIST = '/v1/conversations?page=1&per_page=100';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function fakeApi(extra: Partial<FakeApiOptions> = {}): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1, 2]), apiKey: API_KEY, ...extra });
  cleanups.push(() => fake.close());
  return fake;
}

/** A client on a real-time test clock (its waits are recorded in `clock.sleeps`). */
function client(baseUrl: string, extra: Partial<ApiClientOptions> = {}): { api: ApiClient; clock: TestClock } {
  const clock = testClock({ start: Date.now(), sleep: 'real' });
  const api = new ApiClient({ baseUrl, apiKey: API_KEY, maxRps: 0, maxRetries: 10, backoff: { baseMs: 5, maxMs: 20 }, clock, ...extra });
  cleanups.push(() => api.close());
  return { api, clock };
}

/** Sends `n` list requests through `api`, `concurrency` at a time. */
async function hammer(api: ApiClient, n: number, concurrency = 8): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        next++;
        await api.getJson(LIST);
      }
    }),
  );
}

/** ms from the first to the last arrival of the requests the fake answered `status`. */
function spanOf(fake: FakeApi, status = 200): number {
  const at = fake.requests.filter((r) => r.status === status).map((r) => r.at);
  return Math.max(...at) - Math.min(...at);
}


describe('fake API rateLimit option', () => {
  it('answers 429 with Retry-After above rps in a sliding second, and RateLimit-* headers on every response', async () => {
    let now = 1_000_000;
    const fake = await fakeApi({ rateLimit: { rps: 5 }, now: () => now });
    const res = await Promise.all(
      Array.from({ length: 8 }, () => fetch(`${fake.url}${LIST}`, { headers: { 'x-api-key': API_KEY } })),
    );
    await Promise.all(res.map((r) => r.arrayBuffer()));
    const statuses = res.map((r) => r.status).sort();
    expect(statuses).toEqual([200, 200, 200, 200, 200, 429, 429, 429]);
    for (const r of res) {
      expect(r.headers.get('ratelimit-limit')).toBe('5');
      expect(r.headers.get('ratelimit-policy')).toBe('5;w=1');
      const reset = Number(r.headers.get('ratelimit-reset'));
      expect(reset).toBeGreaterThan(0);
      expect(reset).toBeLessThanOrEqual(1);
    }
    const remaining = res.filter((r) => r.status === 200).map((r) => Number(r.headers.get('ratelimit-remaining'))).sort();
    expect(remaining).toEqual([0, 1, 2, 3, 4]);
    for (const r of res.filter((x) => x.status === 429)) {
      expect(r.headers.get('retry-after')).toBe('1');
      expect(r.headers.get('ratelimit-remaining')).toBe('0');
    }
    // Unauthenticated requests are not counted and carry no headers.
    const anon = await fetch(`${fake.url}${LIST}`);
    expect(anon.status).toBe(401);
    expect(anon.headers.get('ratelimit-limit')).toBeNull();
    // Once the window has moved on, requests are accepted again.
    now += 999;
    const still = await fetch(`${fake.url}${LIST}`, { headers: { 'x-api-key': API_KEY } });
    await still.arrayBuffer();
    expect(still.status).toBe(429);
    expect(still.headers.get('ratelimit-reset')).toBe('0.001');
    now += 1;
    const again = await fetch(`${fake.url}${LIST}`, { headers: { 'x-api-key': API_KEY } });
    expect(again.status).toBe(200);
    expect(again.headers.get('ratelimit-remaining')).toBe('4');
  });

  it('can serve the limit without headers', async () => {
    const fake = await fakeApi({ rateLimit: { rps: 2, headers: false } });
    const r = await fetch(`${fake.url}${LIST}`, { headers: { 'x-api-key': API_KEY } });
    expect(r.status).toBe(200);
    expect(r.headers.get('ratelimit-limit')).toBeNull();
  });
});

describe('adaptive rate limiting against a 20 requests/s server (real HTTP)', () => {
  it('with RateLimit-* headers: paces below the limit from the first response, no 429, about requests/20 s', async () => {
    const fake = await fakeApi({ rateLimit: { rps: 20 } });
    const { api, clock } = client(fake.url);
    await hammer(api, 60);
    expect(api.stats.requests).toBe(60);
    expect(api.stats.rateLimited).toBeLessThanOrEqual(1); // < 2 % of 60
    expect(api.rateCap).toBeGreaterThan(15);
    expect(api.rateCap).toBeLessThan(20);
    // Paced below 20/s from the first response: 60 requests reach the server over more than 2.5 s
    // (60 / 20 = 3 s ideal), every one of them after a wait the limiter asked for (the first aside).
    // That it is not much slower is the learned cap above 15/s with no 429 pause.
    expect(spanOf(fake)).toBeGreaterThan(2_500);
    expect(clock.sleeps.length).toBeGreaterThanOrEqual(50);
  });

  /**
   * The statuses the fake answered, in arrival order, from the first 429 to the next accepted
   * request: the opening overrun. The fake's window stays full for a second after its 20th
   * acceptance, so every request reaching it before then is refused: the overrun is the number of
   * requests sent before the 429's Retry-After held the client (read from the request log's order,
   * not its timestamps).
   */
  const openingOverrun = (fake: FakeApi): FakeApi['requests'][number]['status'][] => {
    const statuses = fake.requests.map((r) => r.status);
    const first = statuses.indexOf(429);
    if (first < 0) return [];
    const next = statuses.indexOf(200, first);
    return statuses.slice(first, next < 0 ? undefined : next);
  };

  it('without headers: slow start meets the limit with one request in flight, so one 429 opens the pause, then pacing at 97.5 % of the limit', async () => {
    const fake = await fakeApi({ rateLimit: { rps: 20, headers: false } });
    const { api, clock } = client(fake.url);
    await hammer(api, 60);
    const statuses = fake.requests.map((r) => r.status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(60);
    // 20 accepted one at a time; the 21st is refused, and its Retry-After held everyone before the
    // gate opened: the next request to reach the server came after the pause and was accepted.
    expect(statuses.indexOf(429)).toBe(20);
    expect(openingOverrun(fake)).toEqual([429]);
    expect(clock.sleeps).toContain(1000);
    // The cap: 97.5 % of the 20 answered in the second before the 429 (19.5 requests/s).
    expect(api.rateCap).toBeGreaterThan(15);
    expect(api.rateCap).toBeLessThanOrEqual(20 * RECOVERY_SHARE);
  });

  it('without headers and without slow start, the opening burst in flight overruns the limit by more than one (what slow start prevents)', async () => {
    const fake = await fakeApi({ rateLimit: { rps: 20, headers: false } });
    const { api } = client(fake.url, { rateLimit: { slowStart: false } });
    await hammer(api, 60);
    expect(fake.requests.filter((r) => r.status === 200)).toHaveLength(60);
    expect(openingOverrun(fake).length).toBeGreaterThan(1);
  });

  it('--max-rps stays an upper bound under the learned cap', async () => {
    const fake = await fakeApi({ rateLimit: { rps: 20 } });
    const { api, clock } = client(fake.url, { maxRps: 10 });
    await hammer(api, 15);
    expect(api.stats.rateLimited).toBe(0);
    expect(api.rateCap).toBe(10);
    // 15 at 10/s: the 15th leaves 1.4 s after the first.
    expect(spanOf(fake)).toBeGreaterThan(1_300);
    expect(clock.sleeps.length).toBeGreaterThanOrEqual(14);
  });
});

describe('RateLimiter slow start (injected clock)', () => {
  const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

  it('lets one request in flight, widens by one per 25 answered without a 429, and doubles per quiet second', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    expect([l.inSlowStart, l.window]).toEqual([true, 1]);
    await l.enter();
    let second = false;
    const waiting = l.enter().then(() => (second = true));
    await flush();
    expect(second).toBe(false);
    l.observe(200);
    l.leave();
    await waiting;
    expect(second).toBe(true);
    for (let i = 1; i < SLOW_START_STEP; i++) l.observe(200);
    expect(l.window).toBe(2);
    for (let i = 0; i < SLOW_START_STEP; i++) l.observe(200);
    expect(l.window).toBe(3);
    // Three quiet seconds since the first enter: 2^3.
    clock.t += 3000;
    expect(l.window).toBe(8);
    // Six: 64 is wider than any caller's concurrency, and slow start ends.
    clock.t += 3000;
    expect(l.window).toBe(Infinity);
    expect(l.inSlowStart).toBe(false);
  });

  it('a widened window lets as many waiting requests in as it has room for', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.enter();
    let entered = 0;
    const waiting = Array.from({ length: 5 }, () => l.enter().then(() => entered++));
    await flush();
    expect(entered).toBe(0);
    clock.t += 2000; // window 4
    l.leave();
    await flush();
    expect(entered).toBe(4);
    l.leave();
    await Promise.all(waiting);
    expect(entered).toBe(5);
  });

  it('a 429 ends slow start, with the cap at 97.5 % of the rate achieved, and opens the gate to everyone waiting', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.enter();
    const waiting = Promise.all([l.enter(), l.enter(), l.enter()]);
    for (let i = 0; i < 20; i++) l.observe(200);
    await l.acquire();
    l.observe(429);
    l.onRateLimited();
    await waiting;
    expect(l.inSlowStart).toBe(false);
    expect(l.currentRps).toBeCloseTo(20 * RECOVERY_SHARE, 5);
  });

  it('a 429 with fewer than 2 answered in the last second says nothing of the rate: slow start goes on', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.enter();
    await l.acquire();
    l.observe(429);
    l.onRateLimited();
    expect([l.inSlowStart, l.window, l.currentRps]).toEqual([true, 1, 0]);
  });

  it('RateLimit headers end slow start (they pace from there); so does turning adaptation off', () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    l.observe(200, { limit: 20, windowMs: 1000 });
    expect(l.inSlowStart).toBe(false);
    const remainingOnly = new RateLimiter(0, clock);
    remainingOnly.observe(200, { remaining: 5, resetMs: 1000 });
    expect(remainingOnly.inSlowStart).toBe(false);
    expect(new RateLimiter(0, clock, { adaptive: false }).inSlowStart).toBe(false);
    expect(new RateLimiter(0, clock, { adaptive: false }).window).toBe(Infinity);
  });

  it('a request waiting for room gives up when its signal aborts, and takes no room', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.enter();
    const ac = new AbortController();
    const waiting = l.enter(ac.signal);
    ac.abort(new Error('stop'));
    await expect(waiting).rejects.toThrow('stop');
    // The slot freed goes to a live request, not to the aborted one (which would keep it forever).
    l.leave();
    const next = await Promise.race([l.enter().then(() => 'in'), flush().then(() => 'waiting')]);
    expect(next).toBe('in');
    // An already aborted signal is refused at once.
    await expect(l.enter(ac.signal)).rejects.toThrow('stop');
  });

  it('a slot freed goes to the oldest waiter: a request arriving meanwhile waits behind it', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.enter();
    const order: string[] = [];
    const b = l.enter().then(() => order.push('b'));
    await flush();
    l.leave();
    const c = l.enter().then(() => order.push('c'));
    await flush();
    expect(order).toEqual(['b']);
    l.leave();
    await Promise.all([b, c]);
    expect(order).toEqual(['b', 'c']);
  });

  it('waiters are let in when the window doubles with time, even while the first request is still out', async () => {
    vi.useFakeTimers();
    try {
      const clock = testClock({ start: Date.now(), sleep: 'real' });
      const l = new RateLimiter(0, clock);
      await l.enter();
      let second = false;
      const waiting = l.enter().then(() => (second = true));
      await vi.advanceTimersByTimeAsync(990);
      expect(second).toBe(false);
      await vi.advanceTimersByTimeAsync(20);
      await waiting;
      expect(second).toBe(true);
      expect(l.window).toBe(2);
    } finally {
      vi.useRealTimers();
    }
  });

  it('a pause (a 503 with Retry-After) keeps the quiet time earned before it: the doubling resumes where it stopped', () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    void l.enter();
    clock.t += 5000;
    expect(l.window).toBe(32);
    l.pauseUntil(clock.t + 1000);
    clock.t += 1000;
    expect(l.window).toBe(32);
    clock.t += 1000;
    expect(l.window).toBe(Infinity);
  });

  it('time paused or answered 429 is not quiet: a Retry-After of 6 s before any rate was seen leaves the window where it was', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.enter();
    await l.acquire();
    l.observe(429);
    l.pauseUntil(clock.t + 6000);
    l.onRateLimited();
    l.leave();
    clock.t += 6000;
    // Still slow start, one request at a time when the pause ends (not 2^6 = 64 at once).
    expect([l.inSlowStart, l.window]).toEqual([true, 1]);
    clock.t += 1000;
    expect(l.window).toBe(2);
  });
});

describe('RateLimiter adaptation (injected clock)', () => {
  it('after slow start, a 429 lowers the cap to 90 % of the rate achieved in the last second', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock, { slowStart: false });
    for (let i = 0; i < 30; i++) {
      clock.t += 10;
      l.observe(200);
    }
    expect(l.currentRps).toBe(0);
    l.onRateLimited();
    expect(l.currentRps).toBe(27);
    // Requests sent before the lowering that come back 429 say nothing new.
    const seqBefore = l.sentCount;
    await l.acquire();
    l.onRateLimited(seqBefore);
    expect(l.currentRps).toBe(27);
  });

  it('never goes below minRps, and a 429 with under 2 recent successes only pauses', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock, { slowStart: false });
    l.observe(200);
    l.onRateLimited();
    expect(l.currentRps).toBe(0);
    l.observe(200);
    await l.acquire();
    l.onRateLimited();
    expect(l.currentRps).toBe(1.8);
    const floor = new RateLimiter(0, clock, { minRps: 5, slowStart: false });
    floor.observe(200);
    floor.observe(200);
    floor.onRateLimited();
    expect(floor.currentRps).toBe(5);
    // Successes older than a second do not count.
    clock.t += 1500;
    const stale = new RateLimiter(0, clock);
    stale.observe(200);
    stale.observe(200);
    clock.t += 1000;
    stale.onRateLimited();
    expect(stale.currentRps).toBe(0);
  });

  it('a cap learned from 429s recovers by 5 % per quiet 10 s to 97.5 % of the rate that drew the 429, then probes per quiet minute', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(20, clock, { slowStart: false });
    for (let i = 0; i < 10; i++) l.observe(200);
    await l.acquire();
    l.onRateLimited();
    expect(l.currentRps).toBe(9);
    clock.t += 10_000;
    expect(l.currentRps).toBeCloseTo(9.45, 5);
    clock.t += 10_000;
    expect(l.currentRps).toBeCloseTo(9.45, 5); // 9.92 would pass 97.5 % of 10
    clock.t += 50_000;
    expect(l.currentRps).toBeCloseTo(9.9225, 5);
    for (let i = 0; i < 30; i++) {
      clock.t += 60_000;
      void l.currentRps;
    }
    expect(l.currentRps).toBe(20);
  });

  it('RateLimit-Limit over the policy window sets the cap; the configured cap still bounds it', () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    l.observe(200, { limit: 20, windowMs: 1000 });
    expect(l.currentRps).toBeCloseTo(19, 5);
    l.observe(200, { limit: 600, windowMs: 60_000 });
    expect(l.currentRps).toBeCloseTo(9.5, 5);
    const capped = new RateLimiter(5, clock);
    capped.observe(200, { limit: 20, windowMs: 1000 });
    expect(capped.currentRps).toBe(5);
  });

  it('under a cap learned from 429s, a timer that fires late delays the requests after it: never more than the cap in 1 s of actual send times', async () => {
    // Virtual time that moves by each wait, plus 40 ms for the 5th wait after the 429 (a busy loop).
    const clock = testClock({ sleep: 'advance' });
    const sleep = clock.sleep;
    let waits = 0;
    clock.sleep = async (ms, signal) => {
      await sleep(ms, signal);
      if (++waits === 5) clock.t += 40;
    };
    const l = new RateLimiter(0, clock);
    await l.enter();
    for (let i = 0; i < 20; i++) l.observe(200);
    await l.acquire();
    const sent = [clock.now()];
    l.onRateLimited();
    expect(l.currentRps).toBeCloseTo(19.5, 5);
    for (let i = 0; i < 60; i++) {
      await l.acquire();
      sent.push(clock.now());
    }
    // The grid alone (51.3 ms apart) would send the 25th 985.6 ms after the late 5th: 21 in a second.
    for (let i = 0; i + 20 < sent.length; i++) expect(sent[i + 20]! - sent[i]!).toBeGreaterThanOrEqual(1000 + WINDOW_MARGIN_MS);
    // What it costs is the lateness, not the pace: 61 requests in 60 intervals of the grid plus 40 ms.
    expect(sent.at(-1)! - sent[0]!).toBeLessThanOrEqual((60 * 1000) / 19.5 + 40 + 1);
    // Without a 429 there is no guard: a configured cap is paced by its grid alone.
    const configured = new RateLimiter(20, testClock({ sleep: 'advance' }), { slowStart: false });
    const waited = [];
    for (let i = 0; i < 30; i++) waited.push(await configured.acquire());
    expect(waited.slice(1).every((w) => Math.abs(w - 50) < 1e-9)).toBe(true);
  });

  it('spreads Remaining over Reset, and holds everyone until Reset when nothing remains', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    await l.acquire();
    l.observe(200, { remaining: 4, resetMs: 2000 }, l.sentCount);
    expect(await Promise.all([l.acquire(), l.acquire(), l.acquire()])).toEqual([0, 500, 1000]);
    // Three were sent since: with Remaining 2, none is left for them.
    const l2 = new RateLimiter(0, clock);
    await l2.acquire();
    const seq = l2.sentCount;
    await l2.acquire();
    await l2.acquire();
    l2.observe(200, { remaining: 2, resetMs: 700 }, seq);
    expect(await l2.acquire()).toBe(700);
  });

  it('parses the draft headers (and X- names), ignoring malformed values', () => {
    expect(
      parseRateLimitHeaders({ 'ratelimit-limit': '20', 'ratelimit-remaining': '3', 'ratelimit-reset': '0.25', 'ratelimit-policy': '20;w=1' }),
    ).toEqual({ limit: 20, remaining: 3, resetMs: 250, windowMs: 1000 });
    expect(parseRateLimitHeaders({ 'ratelimit-limit': '100, 100;w=60' })).toEqual({ limit: 100, windowMs: 60_000 });
    expect(parseRateLimitHeaders({ 'x-ratelimit-limit': '50', 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': '7' })).toEqual({
      limit: 50,
      remaining: 0,
      resetMs: 7000,
    });
    expect(parseRateLimitHeaders({ 'ratelimit-limit': 'lots', 'ratelimit-remaining': '-1' })).toEqual({});
    // An epoch-seconds reset (as some X-RateLimit-Reset headers serve) is turned into a delay.
    expect(parseRateLimitHeaders({ 'x-ratelimit-reset': '1700000030' }, 1_700_000_000_000)).toEqual({ resetMs: 30_000 });
  });
});
