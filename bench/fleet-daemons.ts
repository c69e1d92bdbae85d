/**
 * The fleet, measured with real daemons (issue 25, "Bench"): 1, 2 and 3 `convo-mirror daemon`
 * processes (the BullMQ engine, started as users start them: `node <the CLI's flags>
 * dist/src/cli/index.js daemon`) share one Redis, one queue prefix, one PostgreSQL schema and one
 * export directory, and mirror a fake (in this process) serving 4 workspaces, each with its own API
 * key limited by the fake to 20 requests/s (sliding second, `RateLimit-*` headers). No cap is
 * configured (`CONVO_MIRROR_MAX_RPS=0`, or `--fleet-max-rps`): the caps are learned from the
 * headers and shared through Redis by the fleet.
 *
 * Each configuration gets a fresh schema, prefix and export directory (so each does the same work:
 * a first sync of every workspace), then the 4 workspace runs are enqueued at once
 * (`enqueueJobs`, as `convo-mirror enqueue --account <id> --wait` does) and followed to their end.
 * The workspaces' conversations have 1 to 40 messages (one page each; several messages a request,
 * so the fleet is bound by the keys' limits rather than by this machine's cores).
 *
 * Per key, from the fake's arrival log between the enqueue and the last run's end: requests (and
 * 429s) against the minimum, the achieved rate (accepted requests over the key's own span, as
 * bench/fleet-rate.ts counts it), the most arrivals in any sliding second (the fake's window) and
 * in any calendar second; per configuration, the wall time from the enqueue to the last run's end
 * against the ideal (the most requests a key needs / its limit), whether the mirror holds every
 * workspace exactly (live counts against the fake's), and each daemon's CPU time and peak RSS.
 * Targets (printed, never asserted): every second at most 2 % above the limit; with 3 daemons each
 * key at ≥ 90 % of its limit and the wall at ≤ 1.10 × the ideal.
 *
 * Called by bench/run.ts ({@link fleetDaemonsSection}); `--fleet-only` runs it alone.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { enqueueJobs } from '../jobs/admin.js';
import { FakeWorkspace, mulberry32, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { openMirror } from '../src/store/open-mirror.js';
import { crawlMinimum } from '../src/sync/crawl-totals.js';
import { PER_PAGE } from '../src/api/client.js';
import { deletePrefix, keyFigures, type KeyFigures } from './fleet-rate.js';
import { dropBenchSchema, pgTarget } from './pg-admin.js';

/** What {@link fleetDaemonsSection} runs. */
export interface FleetDaemonsOptions {
  /** dist/src/cli/index.js. */
  cliJs: string;
  /** Node flags the CLI runs with (its shebang's). */
  nodeFlags: string[];
  /** dist/bench/rss-probe.js, loaded into each daemon for its CPU time and peak RSS. */
  probeJs: string;
  /** Redis URL of the fleet. */
  redisUrl: string;
  /** PostgreSQL server and database (no `schema` parameter), e.g. `postgres://postgres@127.0.0.1:5432/test`. */
  pgBase: string;
  /** Numbers of daemons, one configuration each. @defaultValue [1, 2, 3] */
  daemons?: number[];
  /** Workspaces, each with its own key. @defaultValue 4 */
  workspaces?: number;
  /** Conversations per workspace. @defaultValue 400 (about 20 s at 20 requests/s) */
  conversations?: number;
  /** The fake's limit per key, requests/s. @defaultValue 20 */
  limitRps?: number;
  /** `CONVO_MIRROR_MAX_RPS` of the daemons: 0 (no cap: learned) or the fleet's cap, requests/s. @defaultValue 0 */
  maxRps?: number;
  /** `CONVO_MIRROR_CONCURRENCY` of each daemon. @defaultValue 4 (the setting's default) */
  concurrency?: number;
  /** Seed of the workspaces' message counts. @defaultValue 7 */
  seed?: number;
  /** Progress lines. @defaultValue none */
  log?: (msg: string) => void;
}

/** What one daemon process cost, from bench/rss-probe.ts. */
export interface DaemonCost {
  /** User + system CPU time over the process' life, ms. */
  cpuMs: number;
  /** Peak resident set size, MB. */
  peakRssMb: number;
}

/** One configuration's figures. */
export interface FleetConfigFigures {
  daemons: number;
  limitRps: number;
  maxRps: number;
  concurrency: number;
  /** From the enqueue to the last workspace run's end, ms. */
  wallMs: number;
  /** The most requests a key needs / the limit, ms. */
  idealMs: number;
  wallOverIdeal: number;
  /** Per key; `firstMs` and `lastMs`: its first and last arrival, ms after the enqueue. */
  keys: (KeyFigures & { minimumRequests: number; firstMs: number; lastMs: number })[];
  /** Every key within 2 % of its limit in every sliding second. */
  underLimit: boolean;
  /** The lowest share of its limit a key achieved. */
  minShare: number;
  /** Every workspace's live conversations and messages in the mirror equal the fake's. */
  exact: boolean;
  /** The workspace runs' outcomes (`completed`, or the failure). */
  outcomes: string[];
  daemonCosts: DaemonCost[];
  /** Messages mirrored, all workspaces. */
  messages: number;
  /** 1-minute load average at the configuration's end. */
  loadAverage: number;
}

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A cron that never fires while the bench runs (1 January, midnight). */
const NEVER = '0 0 1 1 *';

/** Workspace `i` of the bench: `n` conversations of 1 to 40 messages (seeded). */
function benchWorkspace(n: number, seed: number, i: number): FakeWorkspace {
  const rng = mulberry32(seed * 1000 + i);
  return FakeWorkspace.fromCounts(
    Array.from({ length: n }, () => 1 + Math.floor(rng() * 40)),
    seed * 1000 + i,
  );
}

/** Fewest requests that mirror `ws` in one listing pass. */
function minimumOf(ws: FakeWorkspace): number {
  const { conversations } = ws.totals();
  return Math.max(1, Math.ceil(conversations / PER_PAGE)) + ws.list().reduce((n, c) => n + crawlMinimum(c.messages.length), 0);
}

/** A daemon child and what it leaves behind. */
interface DaemonChild {
  child: ChildProcess;
  probeFile: string;
  /** The last lines it printed (for an error). */
  tail: string[];
  ready: Promise<void>;
  exited: Promise<number | null>;
}

/** Starts `convo-mirror daemon` with `env`; `ready` resolves on its `daemon ready` line. */
function startDaemon(o: FleetDaemonsOptions, env: NodeJS.ProcessEnv, probeFile: string): DaemonChild {
  const child = spawn(process.execPath, [...o.nodeFlags, '--import', o.probeJs, o.cliJs, 'daemon'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...env, CONVO_MIRROR_BENCH_RSS_FILE: probeFile },
  });
  const tail: string[] = [];
  let readyNow!: () => void;
  let failNow!: (err: Error) => void;
  const ready = new Promise<void>((resolve, reject) => {
    readyNow = resolve;
    failNow = reject;
  });
  let isReady = false;
  let partial = '';
  const onData = (b: Buffer): void => {
    partial += b.toString();
    const lines = partial.split('\n');
    partial = lines.pop()!;
    for (const line of lines) {
      tail.push(line);
      if (tail.length > 20) tail.shift();
      if (!isReady && line.includes('"msg":"daemon ready"')) {
        isReady = true;
        readyNow();
      }
    }
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  void exited.then((code) => {
    if (!isReady) failNow(new Error(`a fleet daemon exited with ${code} before it was ready:\n${tail.join('\n')}`));
  });
  return { child, probeFile, tail, ready, exited };
}

/** SIGTERMs a daemon and waits for its end (SIGKILL after 30 s); its cost from the probe file. */
async function stopDaemon(d: DaemonChild): Promise<DaemonCost | undefined> {
  if (d.child.exitCode === null && d.child.signalCode === null) {
    d.child.kill('SIGTERM');
    const timer = setTimeout(() => d.child.kill('SIGKILL'), 30_000);
    await d.exited;
    clearTimeout(timer);
  }
  try {
    const maxRssKiB = Number(fs.readFileSync(d.probeFile, 'utf8'));
    const cpu = JSON.parse(fs.readFileSync(`${d.probeFile}.cpu.json`, 'utf8')) as { userUs: number; systemUs: number };
    return { cpuMs: Math.round((cpu.userUs + cpu.systemUs) / 1000), peakRssMb: round(maxRssKiB / 1024, 1) };
  } catch {
    return undefined;
  }
}

/** Runs one configuration: `n` daemons. */
async function runConfig(n: number, o: FleetDaemonsOptions, spaces: FakeWorkspace[]): Promise<FleetConfigFigures> {
  const log = o.log ?? (() => {});
  const limitRps = o.limitRps ?? 20;
  const maxRps = o.maxRps ?? 0;
  const concurrency = o.concurrency ?? 4;
  const accounts = spaces.map(() => randomUUID());
  const keys = spaces.map((_, i) => `bench-fleetd-key-${i}-${randomBytes(6).toString('hex')}`);
  const fake: FakeApi = await startFakeApi({
    workspaces: Object.fromEntries(accounts.map((a, i) => [a, { workspace: spaces[i]!, apiKey: keys[i]! }])),
    rateLimit: { rps: limitRps },
  });
  const tag = randomBytes(6).toString('hex');
  const prefix = `bench-fleetd-${tag}`;
  const schema = `bench_fleet_${tag}`;
  const db = pgTarget(o.pgBase, schema);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-bench-fleet-'));
  const workspacesFile = path.join(dir, 'workspaces.json');
  fs.writeFileSync(workspacesFile, JSON.stringify(accounts.map((a, i) => ({ account_id: a, api_key_env: `BENCH_FLEET_KEY_${i}` }))));
  const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CONVO_MIRROR_')));
  Object.assign(env, {
    REDIS_URL: o.redisUrl,
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    CONVO_MIRROR_DB: db,
    CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports'),
    CONVO_MIRROR_BASE_URL: fake.url,
    CONVO_MIRROR_WORKSPACES: workspacesFile,
    CONVO_MIRROR_MAX_RPS: String(maxRps),
    CONVO_MIRROR_CONCURRENCY: String(concurrency),
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_HTTP_PORT: '0',
    LOG_LEVEL: 'info',
    ...Object.fromEntries(keys.map((k, i) => [`BENCH_FLEET_KEY_${i}`, k])),
  });
  fs.mkdirSync(path.join(dir, 'exports'));
  const daemons: DaemonChild[] = [];
  const outcomes: string[] = [];
  let t0 = 0;
  let t1 = 0;
  let costs: (DaemonCost | undefined)[] = [];
  let counts: { conversations: number; messages: number }[] = [];
  try {
    log(`fleet: ${n} daemon(s) on one PostgreSQL schema, ${spaces.length} workspaces with keys limited to ${limitRps} requests/s…`);
    for (let i = 0; i < n; i++) daemons.push(startDaemon(o, env, path.join(dir, `daemon-${i}.rss`)));
    await Promise.all(daemons.map((d) => d.ready));
    // The daemons' start-up checks (one list request per workspace each) leave the fake's window first.
    await sleep(1200);
    t0 = Date.now();
    const settings = { redisUrl: o.redisUrl, prefix };
    await Promise.all(
      accounts.map(async (accountId) => {
        const r = await enqueueJobs(settings, {
          accountId,
          full: false,
          policy: { attempts: 5 },
          onQueued: () => {},
          wait: { timeoutMs: 600_000, onOutcome: (j) => outcomes.push(`${accountId.slice(0, 8)}: ${j.message}`) },
        });
        if (!r.ok || r.unfinished) outcomes.push(`${accountId.slice(0, 8)}: ${r.unfinished ? `unfinished (${r.unfinished.reason})` : 'failed'}`);
      }),
    );
    t1 = Date.now();
    const mirror = await openMirror(db, { readonly: true });
    try {
      counts = await Promise.all(accounts.map((a) => mirror.liveCounts(a)));
    } finally {
      await mirror.close();
    }
  } finally {
    costs = await Promise.all(daemons.map(stopDaemon));
    await fake.close();
    await deletePrefix(o.redisUrl, prefix);
    await dropBenchSchema(o.pgBase, schema);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const keyFigs = keys.map((k, i) => {
    const log = fake.requests.filter((r) => r.apiKey === k && r.path.startsWith('/v1/') && r.at >= t0 && r.at <= t1);
    return {
      ...keyFigures(i, log, limitRps),
      minimumRequests: minimumOf(spaces[i]!),
      firstMs: log.length > 0 ? Math.min(...log.map((r) => r.at)) - t0 : 0,
      lastMs: log.length > 0 ? Math.max(...log.map((r) => r.at)) - t0 : 0,
    };
  });
  const idealMs = (Math.max(...keyFigs.map((k) => k.minimumRequests)) / limitRps) * 1000;
  const wallMs = t1 - t0;
  const exact = spaces.every((ws, i) => {
    const t = ws.totals();
    return counts[i]?.conversations === t.conversations && counts[i]?.messages === t.messages;
  });
  return {
    daemons: n,
    limitRps,
    maxRps,
    concurrency,
    wallMs,
    idealMs: Math.round(idealMs),
    wallOverIdeal: round(wallMs / idealMs, 3),
    keys: keyFigs,
    underLimit: keyFigs.every((k) => k.maxSlidingSecond <= limitRps * 1.02),
    minShare: Math.min(...keyFigs.map((k) => k.shareOfLimit)),
    exact,
    outcomes,
    daemonCosts: costs.filter((c): c is DaemonCost => c !== undefined),
    messages: spaces.reduce((m, ws) => m + ws.totals().messages, 0),
    loadAverage: round(os.loadavg()[0]!, 2),
  };
}

/**
 * Runs the fleet with each number of daemons, adds the figures to `results.fleetDaemons` and its
 * lines to `rows` (label, figure, target met or missed).
 *
 * @throws Error when a daemon cannot start (its last lines in the message)
 */
export async function fleetDaemonsSection(results: Record<string, unknown>, rows: [string, string, string][], o: FleetDaemonsOptions): Promise<FleetConfigFigures[]> {
  const w = o.workspaces ?? 4;
  const spaces = Array.from({ length: w }, (_, i) => benchWorkspace(o.conversations ?? 400, o.seed ?? 7, i));
  const limit = o.limitRps ?? 20;
  const runs: FleetConfigFigures[] = [];
  for (const n of o.daemons ?? [1, 2, 3]) {
    const run = await runConfig(n, o, spaces);
    runs.push(run);
    const label = `fleet, ${n} daemon(s), ${w} keys at ${limit}/s`;
    const requests = run.keys.map((k) => `${k.requests}`).join(', ');
    const limited = run.keys.reduce((s, k) => s + k.rateLimited, 0);
    rows.push([
      `${label}: wall vs ideal`,
      `${round(run.wallMs / 1000, 1)} s vs ${round(run.idealMs / 1000, 1)} s = ${run.wallOverIdeal}×`,
      `${n >= 3 ? `target ≤ 1.10× ${run.wallOverIdeal <= 1.1 ? 'met' : 'MISSED'}; ` : ''}mirror ${run.exact ? 'exact' : 'NOT exact'}; ${run.outcomes.length === w && run.outcomes.every((x) => x.endsWith('completed')) ? `${w} runs completed` : run.outcomes.join('; ')}`,
    ]);
    rows.push([
      `${label}: achieved per key`,
      `${run.keys.map((k) => k.achievedRps).join(', ')} /s (lowest ${round(run.minShare * 100, 1)} %)`,
      n >= 3 ? `target ≥ 90 % ${run.minShare >= 0.9 ? 'met' : 'MISSED'}` : '',
    ]);
    rows.push([
      `${label}: most in any second`,
      `${Math.max(...run.keys.map((k) => k.maxSlidingSecond))} (calendar: ${Math.max(...run.keys.map((k) => k.maxCalendarSecond))}); 429s: ${limited}`,
      `target ≤ ${limit * 1.02} ${run.underLimit ? 'met' : 'MISSED'}`,
    ]);
    const cpu = run.daemonCosts.reduce((s, c) => s + c.cpuMs, 0);
    rows.push([
      `${label}: requests per key; daemons' cost`,
      `${requests} (minimum ${run.keys.map((k) => k.minimumRequests).join(', ')})`,
      `CPU ${round(cpu / 1000, 1)} s in all (${round((cpu * 1000) / run.messages, 0)} µs per message, start-up included); peak RSS ${run.daemonCosts.map((c) => c.peakRssMb).join(', ')} MB; load ${run.loadAverage}`,
    ]);
  }
  results.fleetDaemons = runs;
  return runs;
}
