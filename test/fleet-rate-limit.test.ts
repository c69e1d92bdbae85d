/**
 * Rate limits shared by a fleet through Redis (issue 25 item 5): three clients as three daemons
 * have them (each its own {@link FleetRateLimiterPool} on its own ioredis connection), three
 * workspaces of one API key, real HTTP to the fake, real Redis under a random prefix.
 *
 * No timed assertion: what is asserted is what the fake answered (a 429 is the fake's own sliding
 * 1 s window refusing a request), which requests reached it between a 429 and the end of its pause
 * (counted, with a bound on those already let through), and the caps each limiter holds.
 */
import { Redis } from 'ioredis';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { ApiClient } from '../src/api/client.js';
import { FleetRateLimiterPool, SLOT_LATE_MS, fleetKeyBase, recoveredCap, type FleetRateLimiter, type FleetLimiterOptions } from '../src/api/fleet-rate-limit.js';
import { RECOVERY_SHARE } from '../src/api/rate-limit.js';
import { systemClock } from '../src/clock.js';
import { FakeWorkspace, startFakeApi, type FakeApi, type FakeApiOptions, type RequestRecord } from '../src/fake-api/index.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { frozenClock, testClock, type TestClock } from './clock.js';
import { enqueueWorkspace } from '../jobs/queue.js';
import { daemonFixtures, waitForJob } from './daemon-fixtures.js';
import { ACCOUNT_ID, API_KEY as HELPER_API_KEY } from './helpers.js';

const API_KEY = 'fleet-rate-test-key-6b1f0e';
const ACCOUNTS = ['acct-a', 'acct-b', 'acct-c'] as const;
const LIST = '/v1/conversations?page=1&per_page=100';

const url = redisUrl();
const prefixes = prefixSequence('fleet-rate');
afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(url, p);
});

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A fake serving one workspace per account, all reached with {@link API_KEY}. */
async function fleetFake(extra: Partial<FakeApiOptions> = {}): Promise<FakeApi> {
  const workspaces = Object.fromEntries(ACCOUNTS.map((a, i) => [a, { workspace: FakeWorkspace.fromCounts([1, 2], i + 1), apiKey: API_KEY }]));
  const fake = await startFakeApi({ workspaces, ...extra });
  cleanups.push(() => fake.close());
  return fake;
}

/** One "daemon": its own Redis connection, its own pool, one client. */
interface Daemon {
  accountId: string;
  api: ApiClient;
  limiter: FleetRateLimiter;
  redis: Redis;
}

async function connect(): Promise<Redis> {
  const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false, commandTimeout: 2000, maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  await redis.connect();
  cleanups.push(() => redis.disconnect());
  return redis;
}

/** Three daemons on one prefix and one key, each with `maxRps` configured (0 = none). */
async function fleet(fakeUrl: string, prefix: string, maxRps: number, opts: FleetLimiterOptions = {}, accounts: readonly string[] = ACCOUNTS): Promise<Daemon[]> {
  return Promise.all(
    accounts.map(async (accountId) => {
      const redis = await connect();
      const pool = new FleetRateLimiterPool(redis, prefix, maxRps, systemClock, opts);
      const limiter = pool.limiterFor(fakeUrl, API_KEY);
      const api = new ApiClient({ baseUrl: fakeUrl, apiKey: API_KEY, accountId, limiter, maxRetries: 10, backoff: { baseMs: 5, maxMs: 20 } });
      cleanups.push(() => api.close());
      return { accountId, api, limiter, redis };
    }),
  );
}

/** Sends `total` list requests over every daemon, `concurrency` at a time in each. */
async function hammer(daemons: Daemon[], total: number, concurrency = 3): Promise<void> {
  let next = 0;
  await Promise.all(
    daemons.flatMap((d) =>
      Array.from({ length: concurrency }, async () => {
        while (next < total) {
          next++;
          await d.api.getJson(LIST);
        }
      }),
    ),
  );
}

const counted = (fake: FakeApi): RequestRecord[] => fake.requests.filter((r) => r.path === '/v1/conversations');
const statusCount = (fake: FakeApi, status: number): number => counted(fake).filter((r) => r.status === status).length;

/** The most arrival times in any window (t - 1000, t] (the fake's window), ms. */
function maxInWindow(times: number[], windowMs = 1000): number {
  const t = [...times].sort((a, b) => a - b);
  let max = 0;
  let lo = 0;
  for (let hi = 0; hi < t.length; hi++) {
    while (t[lo]! <= t[hi]! - windowMs) lo++;
    max = Math.max(max, hi - lo + 1);
  }
  return max;
}

describe('a key limited to 20 requests/s by the server, shared by three daemons', () => {
  it('the cap learned from RateLimit headers is shared: 150 requests, not one 429', async () => {
    const fake = await fleetFake({ rateLimit: { rps: 20 } });
    const daemons = await fleet(fake.url, prefixes.next(), 0);
    await hammer(daemons, 150);
    expect(statusCount(fake, 200)).toBe(150);
    // The fake's window never refused: the three together stayed at or under 20 in every second
    // (each alone would pace at 19/s, 57/s together, and be refused within the first second).
    expect(statusCount(fake, 429)).toBe(0);
    expect(maxInWindow(counted(fake).map((r) => r.at))).toBeLessThanOrEqual(20);
    for (const d of daemons) {
      expect(d.limiter.currentRps).toBeCloseTo(20 * 0.95, 5);
      // Every daemon took part.
      expect(fake.requests.filter((r) => r.accountId === d.accountId).length).toBeGreaterThan(10);
    }
  });

  it('the configured cap (--max-rps 15) is one cap for the fleet, not one per daemon: not one 429', async () => {
    // No headers: nothing is learned, the configured cap alone paces (three times 15/s would be 45/s).
    const fake = await fleetFake({ rateLimit: { rps: 20, headers: false } });
    const daemons = await fleet(fake.url, prefixes.next(), 15);
    await hammer(daemons, 120);
    expect(statusCount(fake, 200)).toBe(120);
    expect(statusCount(fake, 429)).toBe(0);
    // At most ⌈(1000 + SLOT_LATE_MS) / (1000 / 15)⌉ = 16 sends in any second, plus the send-to-arrival
    // jitter the fake's 20 leave room for.
    expect(Math.ceil((1000 + SLOT_LATE_MS) / (1000 / 15))).toBe(16);
    expect(maxInWindow(counted(fake).map((r) => r.at))).toBeLessThanOrEqual(20);
    for (const d of daemons) expect(d.limiter.currentRps).toBe(15);
  });

  it("a 429 seen by one daemon pauses the others for its Retry-After", async () => {
    const fake = await fleetFake();
    const daemons = await fleet(fake.url, prefixes.next(), 20);
    // After 20 list requests, the next one of daemon A is refused with Retry-After: 2.
    let armed = false;
    fake.beforeServe(() => {
      if (!armed && counted(fake).length >= 20) {
        armed = true;
        fake.injectFault({ kind: 'status', status: 429, retryAfter: '2', match: { accountId: 'acct-a' } });
      }
    });
    await hammer(daemons, 80, 2);
    const refused = counted(fake).find((r) => r.status === 429);
    expect(refused?.accountId).toBe('acct-a');
    const t429 = refused!.at;
    // Requests of B and C reaching the fake in the 1.9 s after the 429: only those already let
    // through when the pause reached Redis (a few ms; at 20/s fleet-wide, one or two). Without the
    // shared pause they go on at the fleet's 20/s: about 38.
    const others = counted(fake).filter((r) => r.accountId !== 'acct-a' && r.at > t429 && r.at < t429 + 1900);
    expect(others.length).toBeLessThanOrEqual(3);
    // And everything was served in the end.
    expect(statusCount(fake, 200)).toBe(80);
  });

  it('a cap learned from a 429 is seen by a daemon that has not sent anything yet, and ends its slow start', async () => {
    // No headers: only a 429 teaches the limit. Daemon A alone discovers it.
    const fake = await fleetFake({ rateLimit: { rps: 20, headers: false } });
    const prefix = prefixes.next();
    const [a] = await fleet(fake.url, prefix, 0, {}, ['acct-a']);
    let n = 0;
    while (statusCount(fake, 429) === 0 && n++ < 200) await a!.api.getJson(LIST);
    expect(statusCount(fake, 429)).toBe(1);
    await a!.limiter.settled();
    const learned = a!.limiter.currentRps;
    // 97.5 % of the fleet's successes in the second before the 429 (the fake's 20).
    expect(learned).toBeGreaterThan(15);
    expect(learned).toBeLessThanOrEqual(20 * RECOVERY_SHARE + 1e-9);

    // B and C: new pools, new connections; before their first request they know nothing.
    const [b, c] = await fleet(fake.url, prefix, 0, {}, ['acct-b', 'acct-c']);
    expect(b!.limiter.currentRps).toBe(0);
    expect(b!.limiter.inSlowStart).toBe(true);
    await b!.api.getJson(LIST);
    // One request later B paces at A's cap, out of slow start (a limit is known to the fleet).
    expect(b!.limiter.currentRps).toBeCloseTo(learned, 9);
    expect(b!.limiter.inSlowStart).toBe(false);
    // B and C go on at the shared cap.
    const before429 = statusCount(fake, 429);
    await hammer([b!, c!], 60);
    expect(c!.limiter.currentRps).toBeLessThanOrEqual(learned);
    // The learned cap (97.5 % of 20) leaves a fraction of a millisecond for jitter: a late arrival may
    // draw one more 429, which lowers the cap to 90 % of the rate and ends it. Each daemon alone
    // would start in slow start without a cap and draw at least one each.
    expect(statusCount(fake, 429) - before429).toBeLessThanOrEqual(1);
  });
});

describe('FleetRateLimiter on virtual time (real Redis, a shared test clock that sleeps by moving)', () => {
  /** Three limiters on one prefix and key, as three daemons', on one virtual clock. */
  async function virtualFleet(maxRps: number): Promise<{ clock: TestClock; limiters: FleetRateLimiter[]; redis: Redis[] }> {
    const clock = testClock({ start: 1_700_000_000_000, sleep: 'advance' });
    const prefix = prefixes.next();
    const redis = await Promise.all([connect(), connect(), connect()]);
    const limiters = redis.map((r) => new FleetRateLimiterPool(r, prefix, maxRps, clock, { redisClock: false }).limiterFor('http://127.0.0.1:1', API_KEY));
    return { clock, limiters, redis };
  }

  it('requests sent before any cap was known count against the first slots of the cap learned after them', async () => {
    const { clock, limiters, redis } = await virtualFleet(0);
    const sends: number[] = [];
    // The fleet's first requests: no cap known anywhere, each daemon sends one at once.
    for (const l of limiters) {
      await l.acquire();
      sends.push(clock.now());
    }
    // The first answer shows a limit of 20 per second (no Remaining: nothing else paces).
    limiters[0]!.observe(200, { limit: 20, windowMs: 1000 }, 1);
    await redis[0]!.ping(); // what it wrote has landed
    for (let i = 0; i < 60; i++) {
      await limiters[i % 3]!.acquire();
      sends.push(clock.now());
    }
    expect(limiters.map((l) => l.currentRps)).toEqual([19, 19, 19].map((x) => expect.closeTo(x, 9)));
    // 19/s, sent exactly on the grid (virtual time): 19 in any second, the three first requests
    // included (22 if the grid started at once after them; late sends could make it ⌈1025 / 52.63⌉ = 20).
    expect(maxInWindow(sends)).toBe(19);
  });

  it('one slot per interval across daemons: never more than the cap in any second (virtual time, so exactly on the grid)', async () => {
    const { clock, limiters } = await virtualFleet(10);
    const sends: number[] = [];
    for (let i = 0; i < 45; i++) {
      await limiters[(i * 7) % 3]!.acquire();
      sends.push(clock.now());
    }
    expect(maxInWindow(sends)).toBe(10);
    expect(new Set(sends).size).toBe(45); // one slot each
  });
});

describe('FleetRateLimiter without Redis, and its keys', () => {
  it('paces alone, as RateLimiter does, while Redis cannot be used; says so once', async () => {
    const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false }); // never connected
    redis.on('error', () => {});
    cleanups.push(() => redis.disconnect());
    const clock = frozenClock(1_000_000);
    const told: Error[] = [];
    const limiter = new FleetRateLimiterPool(redis, prefixes.next(), 10, clock, { onUnavailable: (e) => told.push(e) }).limiterFor('http://127.0.0.1:1', API_KEY);
    for (let i = 0; i < 3; i++) await limiter.acquire();
    // 10/s alone: the second and third wait 100 ms each on the local grid.
    expect(clock.sleeps).toEqual([100, 200]);
    expect(told).toHaveLength(1);
    expect(told[0]!.message).toMatch(/cannot be shared through Redis/);
    expect(told[0]!.message).not.toContain(API_KEY);
  });

  it('keeps its keys under <prefix>:ratelimit:<hash>, never the API key', async () => {
    const fake = await fleetFake({ rateLimit: { rps: 20 } });
    const prefix = prefixes.next();
    const daemons = await fleet(fake.url, prefix, 0);
    // A pause and a learned cap too (a 429 once the fleet has a rate): every kind of key.
    let armed = false;
    fake.beforeServe(() => {
      if (!armed && counted(fake).length >= 15) {
        armed = true;
        fake.injectFault({ kind: 'status', status: 429, retryAfter: '1', match: { accountId: 'acct-b' } });
      }
    });
    await hammer(daemons, 40);
    await Promise.all(daemons.map((d) => d.limiter.settled()));
    const keys = await daemons[0]!.redis.keys(`${prefix}:*`);
    const base = fleetKeyBase(prefix, fake.url, API_KEY);
    expect(base).toMatch(new RegExp(`^${prefix}:ratelimit:[0-9a-f]{32}$`));
    expect(keys.length).toBeGreaterThan(0);
    for (const k of keys) {
      expect(k.startsWith(`${base}:`)).toBe(true);
      expect(k).not.toContain(API_KEY);
    }
    const kinds = new Set(keys.map((k) => k.slice(base.length + 1).split(':')[0]));
    expect([...kinds].sort()).toEqual(expect.arrayContaining(['header-cap', 'learned', 'ok', 'slot']));
    // Another key, another base.
    expect(fleetKeyBase(prefix, fake.url, `${API_KEY}x`)).not.toBe(base);
  });
});

describe('the BullMQ daemon shares its limits through Redis', () => {
  const fx = daemonFixtures('fleet-daemon');
  afterEach(fx.afterEachTest);
  afterAll(fx.afterAllTests);

  it('holds its requests while the fleet is paused for the key (a pause another daemon was told), and claims its slots in Redis', async () => {
    const fake = await fx.fakeApi(FakeWorkspace.fromCounts([2, 3]));
    const prefix = fx.prefix();
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix, { CONVO_MIRROR_MAX_RPS: '50' }));
    const redis = await connect();
    // Another daemon of the fleet got a 429 with Retry-After: 1.5 s from now (Redis' clock).
    const [s, us] = await redis.time();
    const pauseEnd = Number(s) * 1000 + Math.floor(Number(us) / 1000) + 1500;
    const base = fleetKeyBase(prefix, fake.url, HELPER_API_KEY);
    await redis.set(`${base}:pause`, String(pauseEnd), 'PX', 1500);
    fake.requests.length = 0;
    const queue = fx.queueFor(prefix);
    const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } });
    await waitForJob(queue, id, 'completed', 20_000);
    const first = Math.min(...fake.requests.map((r) => r.at));
    // Nothing reached the API before the pause's end (a few ms for the daemon's reading of Redis' clock).
    expect(first).toBeGreaterThanOrEqual(pauseEnd - 25);
    const keys = await redis.keys(`${base}:*`);
    expect(keys.some((k) => k.startsWith(`${base}:slot:`))).toBe(true);
    await d.stop();
  });
});

describe('recoveredCap (pure)', () => {
  const rec = { rps: 10, at: 0, ceiling: 20 };
  it('grows 5 % per quiet 10 s up to 97.5 % of the rate that drew the 429, then per quiet minute', () => {
    expect(recoveredCap(rec, 9_999, 10_000, 0)).toBe(10);
    expect(recoveredCap(rec, 10_000, 10_000, 0)).toBeCloseTo(10.5, 9);
    expect(recoveredCap(rec, 25_000, 10_000, 0)).toBeCloseTo(11.025, 9);
    // 10 × 1.05^13 = 18.86 ≤ 19.5; 1.05^14 = 19.8 > 19.5: that step needs a quiet minute.
    const at13 = recoveredCap(rec, 130_000, 10_000, 0)!;
    expect(at13).toBeCloseTo(10 * 1.05 ** 13, 9);
    expect(recoveredCap(rec, 185_000, 10_000, 0)).toBeCloseTo(at13, 9);
    expect(recoveredCap(rec, 190_000, 10_000, 0)).toBeCloseTo(at13 * 1.05, 9);
  });
  it('is gone once it reaches the configured cap', () => {
    expect(recoveredCap(rec, 19_999, 10_000, 11)).toBeCloseTo(10.5, 9);
    // 10.5 × 1.05 = 11.025 ≥ 11.
    expect(recoveredCap(rec, 20_000, 10_000, 11)).toBeUndefined();
  });
});
