/**
 * The Redis-free daemon (`--scheduler local`, issue 10): node-cron ticks and an in-process queue
 * running the same recorded runs, over two workspaces of one fake, with the same HTTP server
 * (readiness without a Redis check, metrics, webhooks enqueueing into the local queue with the same
 * per-conversation deduplication). Real HTTP, real SQLite; no Redis is used (REDIS_URL points at a
 * port where nothing listens, so any use would fail).
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig, type Config } from '../config/index.js';
import { runDaemon, type DaemonExit } from '../jobs/daemon.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { API_KEY, mirrorEqualsFake, quietLogger, tempDir, withMirror } from './helpers.js';
import { assertBuilt, killLeftovers, run, startDaemon, waitFor, within } from './children.js';
import { NEVER, messagesPath } from './daemon-fixtures.js';
import { Webhook } from 'standardwebhooks';
import { sqlAll } from './sql.js';

const A = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';
const B = '7a1c9e04-2b3d-4f5e-8a6b-1c2d3e4f5a6b';
const SECRET = `whsec_${Buffer.from('local-daemon-webhook-secret-0123').toString('base64')}`;

let seq = 0;
/** POSTs a webhook for conversation `id` of `account`, signed with the `standardwebhooks` library. */
async function webhook(url: string, account: string, id: string): Promise<{ status: number; body: { job_id: string; conversation_id: string; account_id: string } }> {
  const body = JSON.stringify({ type: 'conversation.updated', data: { account_id: account, conversation: { id } } });
  const msgId = `msg_local_${++seq}`;
  const at = new Date();
  const res = await fetch(`${url}/webhooks/conversations`, {
    method: 'POST',
    body,
    headers: { 'content-type': 'application/json', 'webhook-id': msgId, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(SECRET).sign(msgId, at, body) },
  });
  return { status: res.status, body: (await res.json()) as { job_id: string; conversation_id: string; account_id: string } };
}

let fake: FakeApi;
let wsA: FakeWorkspace;
let wsB: FakeWorkspace;
beforeAll(async () => {
  wsA = FakeWorkspace.generate({ seed: 41, conversations: 5 });
  wsB = FakeWorkspace.generate({ seed: 42, conversations: 4 });
  fake = await startFakeApi({ workspaces: { [A]: { workspace: wsA, apiKey: API_KEY }, [B]: { workspace: wsB, apiKey: API_KEY } } });
});
afterAll(async () => fake.close());

/** A running in-process daemon and its HTTP URL. */
interface Running {
  config: Config;
  url: string;
  stop(): Promise<DaemonExit>;
}
const running: Running[] = [];
afterEach(async () => {
  await Promise.allSettled(running.splice(0).map((d) => d.stop()));
  await killLeftovers();
});

/** Starts a local-scheduler daemon over both workspaces, its HTTP server on a free port. */
async function startLocal(env: Record<string, string> = {}): Promise<Running> {
  const dir = tempDir('convo-mirror-local-');
  const config = loadConfig({
    CONVO_MIRROR_BASE_URL: fake.url,
    CONVO_MIRROR_API_KEY: API_KEY,
    CONVO_MIRROR_ACCOUNT_ID: `${A},${B}`,
    CONVO_MIRROR_DB: path.join(dir, 'mirror.sqlite'),
    CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports'),
    CONVO_MIRROR_MAX_RPS: '0',
    CONVO_MIRROR_MAX_RETRIES: '1',
    CONVO_MIRROR_SCHEDULER: 'local',
    // Nothing listens there: the local scheduler must never need Redis.
    REDIS_URL: 'redis://127.0.0.1:1',
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
    LOG_LEVEL: 'silent',
    ...env,
  });
  let release!: () => void;
  const stop = new Promise<void>((r) => (release = r));
  let ready!: (r: { httpUrl: string | undefined }) => void;
  const readyP = new Promise<{ httpUrl: string | undefined }>((r) => (ready = r));
  const done = runDaemon({ config, logger: quietLogger(), stop, onReady: ready, httpListen: { host: '127.0.0.1', port: 0 } });
  const { httpUrl } = await within(Promise.race([readyP, done.then(() => Promise.reject(new Error('daemon ended before it was ready')))]), 15_000, 'daemon start');
  let stopped: Promise<DaemonExit> | undefined;
  const d: Running = { config, url: httpUrl!, stop: () => (stopped ??= (release(), within(done, 15_000, 'daemon shutdown'))) };
  running.push(d);
  return d;
}

/** Runs of a mirror: account, trigger, scope and status, in order. */
const runsOf = (db: string) =>
  withMirror(db, (m) => sqlAll<{ account_id: string; trigger: string; scope: string; status: string }>(m, 'SELECT account_id, trigger, scope, status FROM runs ORDER BY id'));

describe('the local scheduler', () => {
  it('mirrors every workspace on a tick, without Redis, and stops cleanly', async () => {
    const d = await startLocal({ CONVO_MIRROR_SCHEDULE: '* * * * * *' });
    await waitFor(
      async () => {
        const ok = (await runsOf(d.config.db)).filter((r) => r.status === 'succeeded');
        return ok.some((r) => r.account_id === A) && ok.some((r) => r.account_id === B);
      },
      10_000,
      'a succeeded scheduled run of each workspace',
    );
    const runs = await runsOf(d.config.db);
    expect(runs.every((r) => r.trigger === 'schedule' && r.scope === 'workspace')).toBe(true);
    const ready = await fetch(`${d.url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toMatchObject({ status: 'ready', checks: { mirror: 'ok', daemon: 'ok' } });
    const exit = await d.stop();
    expect(exit.forced).toBe(false);
    const a = await withMirror(d.config.db, (m) => mirrorEqualsFake(m, wsA, A));
    const b = await withMirror(d.config.db, (m) => mirrorEqualsFake(m, wsB, B));
    expect(a.ok, a.detail).toBe(true);
    expect(b.ok, b.detail).toBe(true);
  });
});

describe('a workspace whose key is refused, in the local scheduler', () => {
  it('fails its own scheduled runs (one request each) while the other workspace is mirrored', async () => {
    const dir = tempDir('convo-mirror-local-401-');
    const file = path.join(dir, 'workspaces.json');
    fs.writeFileSync(file, JSON.stringify([{ account_id: A, api_key_env: 'KEY_A' }, { account_id: B, api_key_env: 'KEY_B' }]));
    const d = await startLocal({ CONVO_MIRROR_ACCOUNT_ID: '', CONVO_MIRROR_API_KEY: '', CONVO_MIRROR_WORKSPACES: file, KEY_A: API_KEY, KEY_B: 'sk-refused-key-for-B', CONVO_MIRROR_SCHEDULE: '* * * * * *' });
    await waitFor(
      async () => {
        const runs = await runsOf(d.config.db);
        return runs.some((r) => r.account_id === A && r.status === 'succeeded') && runs.some((r) => r.account_id === B && r.status === 'failed');
      },
      10_000,
      "A's run to succeed and B's to fail",
    );
    await d.stop();
    const a = await withMirror(d.config.db, (m) => mirrorEqualsFake(m, wsA, A));
    expect(a.ok, a.detail).toBe(true);
    const bRows = (await withMirror(d.config.db, (m) => sqlAll<{ n: number }>(m, 'SELECT count(*) AS n FROM messages WHERE account_id = ?', B)))[0]!.n;
    expect(bRows).toBe(0);
    // Every run of B failed, each after one request (a refused key is not retried by the client).
    const bRuns = await withMirror(d.config.db, (m) => sqlAll<{ status: string; requests: number }>(m, 'SELECT status, requests FROM runs WHERE account_id = ?', B));
    expect(bRuns.length).toBeGreaterThan(0);
    expect(bRuns.every((r) => r.status === 'failed' && r.requests === 1), JSON.stringify(bRuns)).toBe(true);
  });
});

describe('webhooks into the local queue', () => {
  it('a signed webhook mirrors the new messages of its conversation as a recorded webhook run', async () => {
    const d = await startLocal({ CONVO_MIRROR_WEBHOOK_SECRET: SECRET });
    const x = wsB.list()[1]!.id;
    wsB.appendMessages(x, 3);
    const t0 = Date.now();
    const r = await webhook(d.url, B, x);
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ conversation_id: x, account_id: B });
    const mirrored = () =>
      withMirror(d.config.db, (m) => sqlAll<{ n: number }>(m, 'SELECT count(*) AS n FROM messages WHERE account_id = ? AND conversation_id = ? AND deleted_at IS NULL', B, x)[0]!.n);
    await waitFor(async () => (await mirrored()) === wsB.get(x)!.messages.length, 5_000, 'the conversation mirrored within 5 s');
    process.stderr.write(`daemon-local: webhook to mirrored in ${Date.now() - t0} ms\n`);
    expect(await runsOf(d.config.db)).toEqual([{ account_id: B, trigger: 'webhook', scope: 'conversations', status: 'succeeded' }]);
  });

  it('deduplicates per conversation: while its job runs, more webhooks make exactly one follow-up run', async () => {
    const d = await startLocal({ CONVO_MIRROR_WEBHOOK_SECRET: SECRET });
    const x = wsA.list()[2]!.id;
    fake.injectFault({ kind: 'slow', delayMs: 1500, match: { path: messagesPath(x), accountId: A } });
    const seen = fake.requests.length;
    const first = await webhook(d.url, A, x);
    expect(first.status).toBe(202);
    // The first job is running once its request is held by the slow fault.
    await waitFor(() => fake.requests.slice(seen).some((r) => r.path === messagesPath(x) && r.status === 0), 5_000, 'the first job to be running');
    const second = await webhook(d.url, A, x);
    const third = await webhook(d.url, A, x);
    expect(second.body.job_id).not.toBe(first.body.job_id);
    expect(third.body.job_id).toBe(second.body.job_id);
    await waitFor(async () => (await runsOf(d.config.db)).filter((r) => r.status === 'succeeded').length === 2, 10_000, 'two webhook runs');
    const runs = await runsOf(d.config.db);
    expect(runs).toEqual([
      { account_id: A, trigger: 'webhook', scope: 'conversations', status: 'succeeded' },
      { account_id: A, trigger: 'webhook', scope: 'conversations', status: 'succeeded' },
    ]);
    // A refused webhook (unknown workspace) queues nothing and asks the API nothing.
    const before = fake.requests.length;
    const refused = await webhook(d.url, 'c2e4a6b8-0d1f-4a3c-9e5b-7d9f1b3d5f7a', x);
    expect(refused.status).toBe(422);
    expect(fake.requests.length).toBe(before);
    expect(await runsOf(d.config.db)).toHaveLength(2);
  });
});

describe('overlapping runs in the local queue', () => {
  it("a webhook's crawl of a conversation waits for the scheduled run's crawl of it (never two crawls of one conversation at once)", async () => {
    const d = await startLocal({ CONVO_MIRROR_SCHEDULE: '* * * * * *', CONVO_MIRROR_WEBHOOK_SECRET: SECRET });
    const x = wsA.list()[0]!.id;
    const HOLD_MS = 1500;
    fake.injectFault({ kind: 'slow', delayMs: HOLD_MS, match: { path: messagesPath(x), accountId: A } });
    const seen = fake.requests.length;
    const toX = () => fake.requests.slice(seen).filter((r) => r.path === messagesPath(x) && r.accountId === A);
    // The scheduled run's crawl of x is held by the fake.
    await waitFor(() => toX().some((r) => r.status === 0), 10_000, "the scheduled run's crawl of x to be in flight");
    const held = toX()[0]!;
    const hook = await webhook(d.url, A, x);
    expect(hook.status).toBe(202);
    await waitFor(async () => (await runsOf(d.config.db)).some((r) => r.trigger === 'webhook' && r.status === 'succeeded'), 15_000, 'the webhook run');
    // Every later request for x arrived after the held one was answered (the fake held it HOLD_MS).
    const later = toX().slice(1);
    expect(later.length).toBeGreaterThan(0);
    for (const r of later) expect(r.at - held.at, 'a second crawl of x started while the first was in flight').toBeGreaterThanOrEqual(HOLD_MS - 5);
  });
});

describe('demo-daemon (the README quick start third line)', () => {
  it('mirrors two workspaces on ticks, answers a signed webhook, shows /metrics, stops cleanly: exit 0, no secret printed', async () => {
    assertBuilt();
    const dir = tempDir('convo-mirror-demo-daemon-');
    const r = await run(['demo-daemon', '--dir', dir, '--conversations', '6', '--schedule', '* * * * * *'], { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true' }, 60_000);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/both workspaces mirrored by the scheduled runs/);
    expect(r.stdout).toMatch(/HTTP 202; its 3 new messages mirrored \d+ ms after the webhook was sent/);
    expect(r.stdout).toMatch(/convo_mirror_api_requests_total\{account_id="[0-9a-f-]{36}",status="200"\} \d+/);
    expect(r.stdout).toMatch(/daemon stopped in \d+ ms; mirror /);
    expect(r.stdout + r.stderr).not.toMatch(/whsec_/);
  });
});

describe('convo-mirror daemon --scheduler local (the CLI)', () => {
  it('mirrors both workspaces on its ticks with no Redis, and SIGTERM exits 0; enqueue refuses the local scheduler', async () => {
    assertBuilt();
    const dir = tempDir('convo-mirror-local-cli-');
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      CI: 'true',
      CONVO_MIRROR_BASE_URL: fake.url,
      CONVO_MIRROR_API_KEY: API_KEY,
      CONVO_MIRROR_ACCOUNT_ID: `${A},${B}`,
      CONVO_MIRROR_DB: path.join(dir, 'mirror.sqlite'),
      CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports'),
      CONVO_MIRROR_MAX_RPS: '0',
      CONVO_MIRROR_HTTP_PORT: '0',
      REDIS_URL: 'redis://127.0.0.1:1',
      LOG_LEVEL: 'info',
    };
    const d = await startDaemon(env, ['--scheduler', 'local', '--schedule', '* * * * * *', '--full-schedule', '0 0 1 1 *']);
    expect(d.stderr).toContain('"scheduler":"local"');
    await waitFor(async () => (d.stderr.match(/"msg":"run finished"/g) ?? []).length >= 2 && (await runsOf(path.join(dir, 'mirror.sqlite'))).filter((r) => r.status === 'succeeded').length >= 2, 15_000, 'a run of each workspace');
    d.child.kill('SIGTERM');
    const stopped = await within(d.done, 15_000, 'daemon shutdown');
    expect(stopped.code, stopped.stderr.slice(-1500)).toBe(0);
    const db = path.join(dir, 'mirror.sqlite');
    const a = await withMirror(db, (m) => mirrorEqualsFake(m, wsA, A));
    const b = await withMirror(db, (m) => mirrorEqualsFake(m, wsB, B));
    expect(a.ok, a.detail).toBe(true);
    expect(b.ok, b.detail).toBe(true);
    expect(stopped.stderr).not.toContain(API_KEY);

    const refused = await run(['enqueue', '--scheduler', 'local', '--conversation', 'x'], env);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/CONVO_MIRROR_SCHEDULER: is local: enqueue needs the BullMQ scheduler/);
    const refused2 = await run(['retry-failed'], { ...env, CONVO_MIRROR_SCHEDULER: 'local' });
    expect(refused2.code).toBe(2);
    expect(refused2.stderr).toMatch(/retry-failed needs the BullMQ scheduler/);
  });
});
