/**
 * Rate limits shared by a fleet (issue 25 item 5), measured: 1, 2 and 3 "daemons" (child processes,
 * each with its own {@link FleetRateLimiterPool} on its own Redis connection, one client per key)
 * send list requests for 4 API keys, each limited by the fake (this process) to 20 requests/s with
 * `RateLimit-*` headers, no cap configured (`--max-rps 0`: the caps are learned and shared). The
 * daemons draw the requests of each key from one Redis counter, so they share the work as a
 * fleet shares jobs.
 *
 * Per key, from the fake's request log: requests, 429s, the achieved rate (accepted requests over
 * the span from the key's first to its last arrival), the most arrivals in any sliding second
 * (the fake's window) and in any calendar second, against the limit. Targets (printed, never
 * asserted): every second at most 2 % above the limit; with 3 daemons each key at ≥ 90 % of it.
 *
 * Standalone: `npm run build && node dist/bench/fleet-rate.js [--daemons 1,2,3] [--keys 4]
 * [--limit 20] [--requests 200] [--concurrency 4] [--out FILE]` (Redis from `REDIS_URL`, default
 * `redis://127.0.0.1:6379`; keys under a random `bench-fleet-…` prefix, deleted at the end).
 * bench/run.ts can call {@link fleetRateSection}.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import { ApiClient } from '../src/api/client.js';
import { FleetRateLimiterPool, type FleetRateLimiter } from '../src/api/fleet-rate-limit.js';
import { systemClock } from '../src/clock.js';
import { FakeWorkspace, startFakeApi, type RequestRecord } from '../src/fake-api/index.js';

const thisFile = fileURLToPath(import.meta.url);
const LIST = '/v1/conversations?page=1&per_page=100';

/** What one run of the bench is. */
export interface FleetRateOptions {
  /** Redis URL of the fleet. */
  redisUrl: string;
  /** How many daemons (child processes) to run, one run per entry. @defaultValue [1, 2, 3] */
  daemons?: number[];
  /** API keys (each its own workspace and its own limit). @defaultValue 4 */
  keys?: number;
  /** The fake's limit per key, requests/s. @defaultValue 20 */
  limitRps?: number;
  /** Requests per key in each run. @defaultValue 200 */
  requestsPerKey?: number;
  /** Requests in flight per key in each daemon. @defaultValue 4 */
  concurrency?: number;
  /** Progress lines. @defaultValue none */
  log?: (msg: string) => void;
}

/** One key's figures in one run. */
export interface KeyFigures {
  key: number;
  requests: number;
  rateLimited: number;
  /** Accepted requests per second over the key's span (first to last arrival). */
  achievedRps: number;
  /** achievedRps / the limit. */
  shareOfLimit: number;
  /** Most arrivals (any answer) in any window (t - 1000, t]. */
  maxSlidingSecond: number;
  /** Most arrivals in one calendar second (epoch ms / 1000, floored). */
  maxCalendarSecond: number;
  /** ms from the key's first to its last arrival. */
  spanMs: number;
  /** (requests - 1) / limit, ms: the span at exactly the limit. */
  idealMs: number;
  /** What the key's limiters did, summed over the daemons ({@link FleetRateLimiter.fleetStats}). */
  limiter?: LimiterStats | undefined;
}

/** One run's figures (one number of daemons). */
export interface RunFigures {
  daemons: number;
  limitRps: number;
  wallMs: number;
  keys: KeyFigures[];
  /** Every key stayed within 2 % of its limit in every sliding second. */
  underLimit: boolean;
  /** The lowest share of its limit a key achieved. */
  minShare: number;
}

/** The most entries of sorted-or-not `times` in any window (t - windowMs, t]. */
export function maxInWindow(times: number[], windowMs = 1000): number {
  const t = [...times].sort((a, b) => a - b);
  let max = 0;
  let lo = 0;
  for (let hi = 0; hi < t.length; hi++) {
    while (t[lo]! <= t[hi]! - windowMs) lo++;
    max = Math.max(max, hi - lo + 1);
  }
  return max;
}

/** A key's figures from the fake's log of its requests. */
export function keyFigures(key: number, requests: RequestRecord[], limitRps: number): KeyFigures {
  const at = requests.map((r) => r.at).sort((a, b) => a - b);
  const accepted = requests.filter((r) => r.status === 200).length;
  const spanMs = at.length > 1 ? at[at.length - 1]! - at[0]! : 0;
  const achievedRps = spanMs > 0 ? ((accepted - 1) * 1000) / spanMs : 0;
  const perSecond = new Map<number, number>();
  for (const t of at) perSecond.set(Math.floor(t / 1000), (perSecond.get(Math.floor(t / 1000)) ?? 0) + 1);
  return {
    key,
    requests: requests.length,
    rateLimited: requests.filter((r) => r.status === 429).length,
    achievedRps: round(achievedRps, 2),
    shareOfLimit: round(achievedRps / limitRps, 3),
    maxSlidingSecond: maxInWindow(at),
    maxCalendarSecond: Math.max(0, ...perSecond.values()),
    spanMs,
    idealMs: Math.round(((accepted - 1) * 1000) / limitRps),
  };
}

const round = (x: number, digits: number): number => Math.round(x * 10 ** digits) / 10 ** digits;

/** What a daemon child is told (JSON in its argv). */
interface ChildSpec {
  fakeUrl: string;
  apiKeys: string[];
  accounts: string[];
  redisUrl: string;
  prefix: string;
  requestsPerKey: number;
  concurrency: number;
}

/** Runs the fleet once with `daemons` children; returns its figures. */
async function runFleet(daemons: number, o: Required<Omit<FleetRateOptions, 'daemons' | 'log'>>, log: (msg: string) => void): Promise<RunFigures> {
  const apiKeys = Array.from({ length: o.keys }, (_, i) => `bench-fleet-key-${i}-${randomBytes(4).toString('hex')}`);
  const accounts = apiKeys.map((_, i) => `acct-${i}`);
  const workspaces = Object.fromEntries(accounts.map((a, i) => [a, { workspace: FakeWorkspace.fromCounts([1], i + 1), apiKey: apiKeys[i]! }]));
  const fake = await startFakeApi({ workspaces, rateLimit: { rps: o.limitRps } });
  const prefix = `bench-fleet-${randomBytes(6).toString('hex')}`;
  const spec: ChildSpec = { fakeUrl: fake.url, apiKeys, accounts, redisUrl: o.redisUrl, prefix, requestsPerKey: o.requestsPerKey, concurrency: o.concurrency };
  const t0 = Date.now();
  let limiterStats: LimiterStats[] = [];
  try {
    log(`fleet rate: ${daemons} daemon(s), ${o.keys} keys limited to ${o.limitRps} requests/s, ${o.requestsPerKey} requests each…`);
    const stats = await Promise.all(Array.from({ length: daemons }, () => runChild(spec)));
    limiterStats = apiKeys.map((_, i) => sumStats(stats.map((s) => s[i]!)));
  } finally {
    await fake.close();
    await deletePrefix(o.redisUrl, prefix);
  }
  const wallMs = Date.now() - t0;
  const keys = apiKeys.map((k, i) => ({
    ...keyFigures(
      i,
      fake.requests.filter((r) => r.apiKey === k && r.path === '/v1/conversations'),
      o.limitRps,
    ),
    limiter: limiterStats[i],
  }));
  return {
    daemons,
    limitRps: o.limitRps,
    wallMs,
    keys,
    underLimit: keys.every((k) => k.maxSlidingSecond <= o.limitRps * 1.02),
    minShare: Math.min(...keys.map((k) => k.shareOfLimit)),
  };
}

/** {@link FleetRateLimiter.fleetStats} of one key, summed over the daemons. */
type LimiterStats = FleetRateLimiter['fleetStats'];

function sumStats(all: LimiterStats[]): LimiterStats {
  const out = { claims: 0, taken: 0, late: 0, changed: 0, free: 0, alone: 0 };
  for (const s of all) for (const k of Object.keys(out) as (keyof LimiterStats)[]) out[k] += s[k];
  return out;
}

/** Spawns one daemon child and waits for it to end. @returns its limiters' stats, per key @throws Error when it fails */
function runChild(spec: ChildSpec): Promise<LimiterStats[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [thisFile, '--child', JSON.stringify(spec)], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolve(JSON.parse(out) as LimiterStats[]) : reject(new Error(`fleet-rate daemon child exited with ${code}`))));
  });
}

/** Deletes every key `<prefix>:*` (SCAN + UNLINK). */
export async function deletePrefix(redisUrl: string, prefix: string): Promise<void> {
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.unlink(...keys);
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
}

/** A daemon child: one pool on its own connection, one client per key, requests drawn from Redis counters. */
async function child(spec: ChildSpec): Promise<void> {
  const redis = new Redis(spec.redisUrl, { enableOfflineQueue: false, commandTimeout: 1000, maxRetriesPerRequest: 1, lazyConnect: true });
  redis.on('error', () => {});
  await redis.connect();
  const pool = new FleetRateLimiterPool(redis, spec.prefix, 0, systemClock);
  const clients = spec.apiKeys.map(
    (apiKey, i) => new ApiClient({ baseUrl: spec.fakeUrl, apiKey, accountId: spec.accounts[i], limiter: pool.limiterFor(spec.fakeUrl, apiKey), connections: spec.concurrency * 2 }),
  );
  try {
    await Promise.all(
      clients.flatMap((api, i) =>
        Array.from({ length: spec.concurrency }, async () => {
          for (;;) {
            const ticket = await redis.incr(`${spec.prefix}:bench:next:${i}`);
            if (ticket > spec.requestsPerKey) return;
            await api.getJson(LIST);
          }
        }),
      ),
    );
    process.stdout.write(JSON.stringify(spec.apiKeys.map((apiKey) => pool.limiterFor(spec.fakeUrl, apiKey).fleetStats)));
  } finally {
    await Promise.all(clients.map((c) => c.close()));
    redis.disconnect();
  }
}

/**
 * Runs the fleet with each number of daemons and adds its figures to `results.fleetRate` and its
 * lines to `rows` (label, figure, target met or missed).
 */
export async function fleetRateSection(results: Record<string, unknown>, rows: [string, string, string][], o: FleetRateOptions): Promise<RunFigures[]> {
  const opts = { redisUrl: o.redisUrl, keys: o.keys ?? 4, limitRps: o.limitRps ?? 20, requestsPerKey: o.requestsPerKey ?? 200, concurrency: o.concurrency ?? 4 };
  const log = o.log ?? (() => {});
  const runs: RunFigures[] = [];
  for (const daemons of o.daemons ?? [1, 2, 3]) {
    const run = await runFleet(daemons, opts, log);
    runs.push(run);
    const worst = Math.max(...run.keys.map((k) => k.maxSlidingSecond));
    const limited = run.keys.reduce((n, k) => n + k.rateLimited, 0);
    const span = Math.max(...run.keys.map((k) => k.spanMs));
    const ideal = Math.max(...run.keys.map((k) => k.idealMs));
    rows.push([
      `fleet rate, ${daemons} daemon(s), ${opts.keys} keys at ${opts.limitRps}/s: most in any second`,
      `${worst} (calendar: ${Math.max(...run.keys.map((k) => k.maxCalendarSecond))}); 429s: ${limited}`,
      `target ≤ ${opts.limitRps * 1.02} ${run.underLimit ? 'met' : 'MISSED'}`,
    ]);
    const claims = run.keys.reduce((n, k) => n + (k.limiter?.claims ?? 0), 0);
    const sent = run.keys.reduce((n, k) => n + k.requests, 0);
    const lost = run.keys.reduce((n, k) => n + (k.limiter ? k.limiter.late + k.limiter.changed : 0), 0);
    rows.push([`fleet rate, ${daemons} daemon(s): slot claims per request`, `${round(claims / sent, 2)} (slots given up: ${lost})`, '']);
    rows.push([
      `fleet rate, ${daemons} daemon(s): achieved per key`,
      `${run.keys.map((k) => k.achievedRps).join(', ')} /s (lowest ${round(run.minShare * 100, 1)} %); span ${round(span / 1000, 1)} s vs ideal ${round(ideal / 1000, 1)} s`,
      daemons >= 3 ? `target ≥ 90 % ${run.minShare >= 0.9 ? 'met' : 'MISSED'}` : '',
    ]);
  }
  results.fleetRate = runs;
  return runs;
}

function argValue(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

async function main(): Promise<void> {
  const childSpec = argValue('--child');
  if (childSpec !== undefined) return child(JSON.parse(childSpec) as ChildSpec);
  const results: Record<string, unknown> = {};
  const rows: [string, string, string][] = [];
  const num = (name: string): number | undefined => (argValue(name) === undefined ? undefined : Number(argValue(name)));
  await fleetRateSection(results, rows, {
    redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
    daemons: argValue('--daemons')?.split(',').map(Number) ?? [1, 2, 3],
    keys: num('--keys'),
    limitRps: num('--limit'),
    requestsPerKey: num('--requests'),
    concurrency: num('--concurrency'),
    log: (msg) => process.stderr.write(`${msg}\n`),
  });
  const width = Math.max(...rows.map((r) => r[0].length));
  for (const [label, figure, target] of rows) console.log(`${label.padEnd(width)}  ${figure}${target ? `  (${target})` : ''}`);
  const out = argValue('--out');
  if (out) {
    fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
    fs.writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
