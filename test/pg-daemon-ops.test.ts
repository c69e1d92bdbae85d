/**
 * Operating daemons on a PostgreSQL mirror (issue 25, items 3 and 6): built daemons in child
 * processes (BullMQ on the test run's Redis, one random prefix and schema per test), the fake API
 * in this process.
 *
 * - `/readyz` checks PostgreSQL: ready while the database answers; 503 naming CONVO_MIRROR_DB
 *   (password masked) while it is gone (a TCP proxy in this process between the daemon and the
 *   server, closed, then opened again); ready again once it is back. `/metrics` shows the pools'
 *   connections (`convo_mirror_db_pool_connections{pool,state}`), a SQLite mirror none.
 * - `status` shows the daemons serving the prefix, each by its worker's name `<hostname>:<pid>`,
 *   and the job each runs (held at the fake, so what is running is known, never raced), then both
 *   idle once the jobs end, then none once they stop.
 * - No output (logs, `/readyz`, `/metrics`, `status`) holds the DSN's password.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { Metrics } from '../src/server/metrics.js';
import { openMirror } from '../src/store/open-mirror.js';
import { API_KEY, ACCOUNT_ID, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, closedPort, killLeftovers, run, startDaemon, waitFor, within, type Started } from './children.js';
import { dropSchema, PG_BASE, pgUrl, randomSchema } from './pg.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { NEVER, messagesPath } from './daemon-fixtures.js';
import type { QueueStatus } from '../jobs/admin.js';

const PASSWORD = `pw-${randomBytes(6).toString('hex')}`;
const prefixes = prefixSequence('pg-daemon-ops');
const schemas: string[] = [];
const dirs: string[] = [];
const fakes: FakeApi[] = [];
const proxies: PgProxy[] = [];

beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(proxies.splice(0).map((p) => p.close()));
  await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
});
afterAll(async () => {
  for (const s of schemas) await dropSchema(s);
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** A TCP proxy on 127.0.0.1 to the test server: `down()` cuts every connection and stops listening (connections refused), `up()` listens on the same port again. */
interface PgProxy {
  port: number;
  down(): Promise<void>;
  up(): Promise<void>;
  close(): Promise<void>;
}

async function pgProxy(): Promise<PgProxy> {
  const target = new URL(PG_BASE);
  const sockets = new Set<net.Socket>();
  const track = (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => {});
  };
  let server: net.Server | undefined;
  const port = await closedPort();
  const up = async () => {
    const srv = net.createServer((client) => {
      track(client);
      const upstream = net.connect(Number(target.port || 5432), target.hostname);
      track(upstream);
      client.pipe(upstream);
      upstream.pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(port, '127.0.0.1', () => resolve());
    });
    server = srv;
  };
  const down = async () => {
    const srv = server;
    server = undefined;
    for (const s of sockets) s.destroy();
    if (srv) await new Promise<void>((resolve) => srv.close(() => resolve()));
  };
  await up();
  const proxy = { port, up, down, close: down };
  proxies.push(proxy);
  return proxy;
}

/** The test server's URL (through `port` when given) with {@link PASSWORD} (trust authentication ignores it). */
function dbUrl(schema: string, port?: number): string {
  const u = new URL(PG_BASE);
  u.username ||= 'postgres';
  u.password = PASSWORD;
  if (port !== undefined) {
    u.hostname = '127.0.0.1';
    u.port = String(port);
  }
  return pgUrl(schema, u.href);
}

async function fakeApi(ws: FakeWorkspace): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(fake);
  return fake;
}

/** A daemon's environment: the fake, the mirror `db`, the queue `prefix`, schedules that never fire. */
function daemonEnv(fake: FakeApi, db: string, prefix: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const dir = tempDir('convo-mirror-pg-daemon-ops-');
  dirs.push(dir);
  return cliEnv(fake, dir, {
    CONVO_MIRROR_DB: db,
    REDIS_URL: redisUrl(),
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_JOB_LOCK_MS: '5000',
    CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
    ...extra,
  });
}

/** A GET answered within 5 s: status and body. */
async function get(url: string): Promise<{ status: number; text: string }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(5_000) });
  return { status: res.status, text: await res.text() };
}

/** SIGTERMs a daemon and waits (bounded) for it to exit 0. */
async function terminate(d: Started): Promise<string> {
  d.child.kill('SIGTERM');
  const ended = await within(d.done, 20_000, 'the daemon to stop');
  expect(ended.code, ended.stderr.slice(-2000)).toBe(0);
  return ended.stdout + ended.stderr;
}

describe('/readyz and /metrics of a daemon on PostgreSQL', () => {
  it('ready while the database answers; 503 naming CONVO_MIRROR_DB (masked) while it is gone; ready again once it is back; the pools in /metrics', async () => {
    const schema = randomSchema('readyz');
    schemas.push(schema);
    const proxy = await pgProxy();
    const db = dbUrl(schema, proxy.port);
    // As /readyz shows a reason: any user info of a URL masked (the message itself masks the password).
    const shown = db.replace(/\/\/[^@]*@/, '//***@');
    const fake = await fakeApi(FakeWorkspace.generate({ seed: 7, conversations: 3 }));
    const httpPort = await closedPort();
    const daemon = await startDaemon(daemonEnv(fake, db, prefixes.next(), { CONVO_MIRROR_HTTP_PORT: String(httpPort) }));
    const base = `http://127.0.0.1:${httpPort}`;
    const outputs: string[] = [];

    const ready = await get(`${base}/readyz`);
    expect(ready.status, ready.text).toBe(200);
    expect(JSON.parse(ready.text)).toEqual({ status: 'ready', checks: { redis: 'ok', mirror: 'ok', api: 'ok', daemon: 'ok' } });
    const metrics = await get(`${base}/metrics`);
    outputs.push(ready.text, metrics.text);
    expect(metrics.text).toContain('convo_mirror_db_pool_max{pool="queries"} 10\n');
    expect(metrics.text).toContain('convo_mirror_db_pool_max{pool="locks"} 128\n');
    for (const pool of ['queries', 'locks']) {
      for (const state of ['total', 'idle', 'waiting']) expect(metrics.text).toMatch(new RegExp(`^convo_mirror_db_pool_connections\\{pool="${pool}",state="${state}"\\} \\d+$`, 'm'));
    }
    // The owner lock's session is open for the daemon's life: the lock pool holds a connection.
    expect(Number(/^convo_mirror_db_pool_connections\{pool="locks",state="total"\} (\d+)$/m.exec(metrics.text)![1])).toBeGreaterThanOrEqual(1);

    // The database goes away.
    await proxy.down();
    let down = await get(`${base}/readyz`);
    await waitFor(async () => (down = await get(`${base}/readyz`)).status === 503, 10_000, '/readyz to answer 503');
    outputs.push(down.text);
    const body = JSON.parse(down.text) as { status: string; checks: Record<string, string>; failed: { check: string; reason: string }[] };
    expect(body.status).toBe('unavailable');
    expect(body.failed.map((f) => f.check)).toEqual(['mirror']);
    expect(body.checks.mirror!.startsWith(`CONVO_MIRROR_DB (${shown}): `), body.checks.mirror).toBe(true);
    // Once the pool's connections are known dead, a new one is refused.
    await waitFor(
      async () => ((JSON.parse((down = await get(`${base}/readyz`)).text) as { checks: Record<string, string> }).checks.mirror ?? '').includes('connection refused'),
      10_000,
      '/readyz to say the connection is refused',
    );
    outputs.push(down.text);
    expect((JSON.parse(down.text) as { checks: Record<string, string> }).checks.mirror).toBe(
      `CONVO_MIRROR_DB (${shown}): cannot connect to 127.0.0.1:${proxy.port}: connection refused (is PostgreSQL running and listening there?)`,
    );
    outputs.push((await get(`${base}/metrics`)).text);

    // It comes back.
    await proxy.up();
    await waitFor(async () => (await get(`${base}/readyz`)).status === 200, 15_000, '/readyz to answer 200 again');

    outputs.push(await terminate(daemon));
    for (const o of outputs) expect(o).not.toContain(PASSWORD);
  });

  it('a SQLite mirror has no pool: no pool samples; its ping is a read', async () => {
    const dir = tempDir('convo-mirror-pg-daemon-ops-sqlite-');
    dirs.push(dir);
    const mirror = await openMirror(path.join(dir, 'mirror.sqlite'));
    try {
      await mirror.ping();
      expect(mirror.poolStats()).toBeUndefined();
      const metrics = new Metrics({ processMetrics: false, dbPools: () => mirror.poolStats() });
      const text = await metrics.render();
      expect(text).toContain('# TYPE convo_mirror_db_pool_connections gauge');
      expect(text).not.toMatch(/^convo_mirror_db_pool_connections\{/m);
    } finally {
      await mirror.close();
    }
    await expect(mirror.ping()).rejects.toThrow();
  });
});

describe('status shows the daemons serving the prefix and what each runs', () => {
  it('two daemons on one PostgreSQL mirror: each by <hostname>:<pid>, each running one held conversation job; then idle; then none', async () => {
    const schema = randomSchema('status');
    schemas.push(schema);
    const db = dbUrl(schema);
    const shown = db.replace(`:${PASSWORD}@`, ':***@');
    const prefix = prefixes.next();
    const ws = FakeWorkspace.generate({ seed: 11, conversations: 4 });
    const fake = await fakeApi(ws);
    const [a, b] = ws.list().slice(0, 2).map((c) => c.id) as [string, string];
    // Each conversation's messages held until its gate opens: what runs is known, not raced.
    const gates = new Map<string, () => void>();
    for (const id of [a, b]) {
      const until = new Promise<void>((r) => gates.set(id, r));
      fake.injectFault({ kind: 'hold', until, match: { path: messagesPath(id) }, times: Infinity });
    }
    const release = (id: string) => gates.get(id)!();

    // One job at a time each: two held jobs keep both daemons busy, one each.
    const env = daemonEnv(fake, db, prefix, { CONVO_MIRROR_CONCURRENCY: '1' });
    const first = await startDaemon(env, [], 120_000);
    const second = await startDaemon(env, [], 120_000);
    const names = new Set([first, second].map((d) => `${os.hostname()}:${d.child.pid}`));
    const outputs: string[] = [];
    try {
      const queued = await run(['enqueue', '--conversation', a, '--conversation', b], env);
      expect(queued.code, queued.stderr).toBe(0);
      await waitFor(() => [a, b].every((id) => fake.requests.some((r) => r.path === messagesPath(id) && r.status === 0)), 15_000, 'both conversations held at the fake');

      const busy = await run(['status', '--json'], env);
      expect(busy.code, busy.stderr).toBe(0);
      outputs.push(busy.stdout + busy.stderr);
      const q = (JSON.parse(busy.stdout) as { db: string; queue: Extract<QueueStatus, { workers: unknown }> }).queue;
      expect((JSON.parse(busy.stdout) as { db: string }).db).toBe(shown);
      expect(new Set(q.workers.map((w) => w.name))).toEqual(names);
      expect(q.active).toHaveLength(2);
      expect(new Set(q.active.map((j) => j.worker))).toEqual(names);
      expect(new Set(q.active.map((j) => j.conversation_id))).toEqual(new Set([a, b]));
      for (const j of q.active) {
        expect(j).toMatchObject({ name: 'sync-conversation', account_id: ACCOUNT_ID, attempt: 1 });
        expect(j.running_ms).toBeGreaterThanOrEqual(0);
      }

      const text = await run(['status'], env);
      expect(text.code).toBe(0);
      outputs.push(text.stdout + text.stderr);
      const lines = text.stdout.split('\n');
      const at = lines.indexOf(`daemons serving ${prefix}: 2`);
      expect(at, text.stdout).toBeGreaterThan(0);
      const section = lines.slice(at + 1, at + 5);
      for (const name of names) {
        const i = section.findIndex((l) => l.startsWith(`  ${name} (from 127.0.0.1:`));
        expect(i, text.stdout).toBeGreaterThanOrEqual(0);
        expect(section[i]).toMatch(/, connected \d+.*\): 1 job running$/);
        const job = q.active.find((j) => j.worker === name)!;
        expect(section[i + 1]).toMatch(new RegExp(`^    job ${job.id} sync-conversation \\(account ${ACCOUNT_ID}, conversation ${job.conversation_id}\\): running .+, attempt 1$`));
      }

      // One after the other (each job publishes what it mirrored when it ends).
      for (const [i, id] of [a, b].entries()) {
        release(id);
        await waitFor(async () => {
          const s = await run(['status', '--json'], env);
          const qs = (JSON.parse(s.stdout) as { queue: Extract<QueueStatus, { workers: unknown }> }).queue;
          return qs.counts.completed === i + 1;
        }, 30_000, `the job of conversation ${id} to complete`);
      }
      const idle = await run(['status'], env);
      outputs.push(idle.stdout + idle.stderr);
      for (const name of names) expect(idle.stdout).toMatch(new RegExp(`^  ${name} \\(from 127\\.0\\.0\\.1:\\d+, connected .+\\): idle$`, 'm'));
    } finally {
      for (const open of gates.values()) open();
      outputs.push(await terminate(first), await terminate(second));
    }
    const none = await run(['status'], env);
    outputs.push(none.stdout + none.stderr);
    expect(none.stdout).toContain(`\ndaemons serving ${prefix}: none (start convo-mirror daemon)\n`);
    for (const o of outputs) expect(o).not.toContain(PASSWORD);
  });
});
