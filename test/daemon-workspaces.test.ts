/**
 * The daemon over several workspaces (issue 10): one pair of job schedulers per workspace, jobs
 * carrying the account id (never a key), one workspace's 401 failing only its own job and run while
 * the other is mirrored, and two daemons side by side on one Redis, each owning some workspaces with
 * its own mirror and queue prefix. Real Redis, real HTTP to one fake serving two workspaces, real
 * SQLite; the daemons run in this process.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig, type Config } from '../config/index.js';
import { enqueueWorkspace, schedulerId } from '../jobs/queue.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { API_KEY, mirrorEqualsFake, tempDir, withMirror } from './helpers.js';
import { daemonFixtures, NEVER, waitForJob } from './daemon-fixtures.js';
import { assertBuilt, run } from './children.js';
import { Job } from 'bullmq';
import { redisUrl } from './redis.js';
import { Webhook } from 'standardwebhooks';
import { sqlAll } from './sql.js';

const A = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';
const B = '7a1c9e04-2b3d-4f5e-8a6b-1c2d3e4f5a6b';
const B_KEY = 'sk-daemon-ws-B-7f3e';
const SECRET = `whsec_${Buffer.from('bullmq-daemon-webhook-secret-012').toString('base64')}`;

const fx = daemonFixtures('daemon-ws');
afterEach(fx.afterEachTest);
afterAll(fx.afterAllTests);

let fake: FakeApi;
let wsA: FakeWorkspace;
let wsB: FakeWorkspace;
beforeAll(async () => {
  wsA = FakeWorkspace.generate({ seed: 31, conversations: 6 });
  wsB = FakeWorkspace.generate({ seed: 32, conversations: 5 });
  fake = await startFakeApi({ workspaces: { [A]: { workspace: wsA, apiKey: API_KEY }, [B]: { workspace: wsB, apiKey: B_KEY } } });
});
afterAll(async () => fake.close());

/**
 * A daemon configuration over both workspaces through a workspaces file: A with its key, B with the
 * key held by `bKey` (the right one, or a wrong one for a 401).
 */
function twoWorkspaceConfig(prefix: string, bKey: string, extra: Record<string, string> = {}): Config {
  const dir = tempDir('convo-mirror-daemon-ws-');
  const file = path.join(dir, 'workspaces.json');
  fs.writeFileSync(file, JSON.stringify([
    { account_id: A, api_key_env: 'KEY_A', schedule: '1 1 1 1 *' },
    { account_id: B, api_key_env: 'KEY_B', full_schedule: '2 2 2 2 *' },
  ]));
  return loadConfig({
    CONVO_MIRROR_BASE_URL: fake.url,
    CONVO_MIRROR_WORKSPACES: file,
    KEY_A: API_KEY,
    KEY_B: bKey,
    CONVO_MIRROR_DB: path.join(dir, 'mirror.sqlite'),
    CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports'),
    CONVO_MIRROR_MAX_RPS: '0',
    CONVO_MIRROR_MAX_RETRIES: '1',
    CONVO_MIRROR_CONCURRENCY: '2',
    REDIS_URL: redisUrl(),
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_JOB_LOCK_MS: '2000',
    CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
    CONVO_MIRROR_HTTP_PORT: '0',
    LOG_LEVEL: 'silent',
    ...extra,
  });
}

/** The runs of a mirror: account, trigger and status, in order. */
const runsOf = (db: string) =>
  withMirror(db, (m) => sqlAll<{ account_id: string; trigger: string; status: string }>(m, 'SELECT account_id, trigger, status FROM runs ORDER BY id'));

/** Accounts that have rows in a mirror's messages. */
const accountsIn = (db: string) =>
  withMirror(db, (m) => sqlAll<{ account_id: string }>(m, 'SELECT DISTINCT account_id FROM messages ORDER BY account_id').map((r) => r.account_id));

describe('one daemon, several workspaces', () => {
  it('registers a pair of schedulers per workspace with its own crons, jobs carrying the account id and never a key', async () => {
    const prefix = fx.prefix();
    const config = twoWorkspaceConfig(prefix, B_KEY);
    const d = await fx.startDaemon(config);
    const queue = fx.queueFor(prefix);
    const schedulers = new Map((await queue.getJobSchedulers(0, -1, true)).map((s) => [s.key, s]));
    expect([...schedulers.keys()].sort()).toEqual([schedulerId('full', A), schedulerId('full', B), schedulerId('regular', A), schedulerId('regular', B)].sort());
    expect(schedulers.get(schedulerId('regular', A))).toMatchObject({ pattern: '1 1 1 1 *' });
    expect(schedulers.get(schedulerId('full', A))).toMatchObject({ pattern: NEVER });
    expect(schedulers.get(schedulerId('full', B))).toMatchObject({ pattern: '2 2 2 2 *' });
    const ticks = await queue.getJobs(['delayed']);
    expect(ticks).toHaveLength(4);
    for (const t of ticks) {
      expect([A, B]).toContain(t.data.accountId);
      const raw = JSON.stringify(t.data);
      expect(raw).not.toContain(API_KEY);
      expect(raw).not.toContain(B_KEY);
    }
    await d.stop();
  });

  it("a workspace whose key is refused (401) fails its own job and run; the other is mirrored exactly", async () => {
    const prefix = fx.prefix();
    const config = twoWorkspaceConfig(prefix, 'sk-wrong-key-for-B');
    await fx.startDaemon(config);
    const queue = fx.queueFor(prefix);
    const policy = { attempts: 3 };
    const jobB = await enqueueWorkspace(queue, { accountId: B, policy });
    const jobA = await enqueueWorkspace(queue, { accountId: A, policy });
    const failed = await waitForJob(queue, jobB, 'failed', 20_000);
    // Authentication is not retried: one attempt.
    expect(failed.attemptsMade).toBe(1);
    expect(failed.failedReason).toMatch(/401|AUTH/i);
    const done = await waitForJob(queue, jobA, 'completed', 30_000);
    expect((done.returnvalue as { status: string }).status).toBe('succeeded');

    const db = config.db;
    const check = await withMirror(db, (m) => mirrorEqualsFake(m, wsA, A));
    expect(check.ok, check.detail).toBe(true);
    expect(await accountsIn(db)).toEqual([A]);
    const runs = await runsOf(db);
    expect(runs.filter((r) => r.account_id === B).map((r) => r.status)).toEqual(['failed']);
    expect(runs.filter((r) => r.account_id === A).map((r) => r.status)).toEqual(['succeeded']);
  });

  it('a job for a workspace the daemon does not mirror fails at once, unretried, naming it', async () => {
    const prefix = fx.prefix();
    const config = twoWorkspaceConfig(prefix, B_KEY);
    const narrowed: Config = Object.freeze({ ...config, workspaces: config.workspaces.filter((w) => w.accountId === A) });
    await fx.startDaemon(narrowed);
    const queue = fx.queueFor(prefix);
    const seen = fake.requests.length;
    const id = await enqueueWorkspace(queue, { accountId: B, policy: { attempts: 3 } });
    const job = await waitForJob(queue, id, 'failed', 15_000);
    expect(job.attemptsMade).toBe(1);
    expect(job.failedReason).toContain(`workspace ${B}, which this daemon does not mirror`);
    expect(fake.requests.slice(seen).filter((r) => r.accountId === B), 'requests for the workspace not mirrored').toEqual([]);
  });

  it('the conversation jobs of two workspace runs queued together are taken in turns, not one run after the other', async () => {
    const prefix = fx.prefix();
    // One job at a time: the order the worker takes them in is the order the fake sees the crawls in.
    const config = twoWorkspaceConfig(prefix, B_KEY, { CONVO_MIRROR_CONCURRENCY: '1' });
    const queue = fx.queueFor(prefix);
    const policy = { attempts: 3 };
    // Both runs wait before any worker serves the queue: A's listing adds its children, then B's.
    const jobA = await enqueueWorkspace(queue, { accountId: A, policy });
    const jobB = await enqueueWorkspace(queue, { accountId: B, policy });
    const seen = fake.requests.length;
    await fx.startDaemon(config);
    await waitForJob(queue, jobA, 'completed', 30_000);
    await waitForJob(queue, jobB, 'completed', 30_000);
    // The workspace of each conversation crawled, in crawl order (a conversation's pages count once).
    const crawls = fake.requests.slice(seen).filter((r) => /^\/v1\/conversations\/[^/]+\/messages$/.test(r.path));
    const order = crawls.filter((r, i) => i === 0 || r.path !== crawls[i - 1]!.path).map((r) => (r.accountId === A ? 'A' : 'B'));
    // A has 6 conversations, B 5: A B A B A B A B A B A.
    expect(order.join('')).toBe('ABABABABABA');
    const check = await withMirror(config.db, (m) => mirrorEqualsFake(m, wsB, B));
    expect(check.ok, check.detail).toBe(true);
  });
});

describe('two daemons on one Redis, each owning some workspaces', () => {
  it('each mirrors its own workspace into its own mirror under its own prefix, and neither touches the other', async () => {
    const p1 = fx.prefix();
    const p2 = fx.prefix();
    const c1 = twoWorkspaceConfig(p1, B_KEY);
    const c2 = twoWorkspaceConfig(p2, B_KEY);
    // As `daemon --account A` and `daemon --account B` would narrow them.
    const d1 = await fx.startDaemon(Object.freeze({ ...c1, workspaces: c1.workspaces.filter((w) => w.accountId === A) }));
    const d2 = await fx.startDaemon(Object.freeze({ ...c2, workspaces: c2.workspaces.filter((w) => w.accountId === B) }));
    const q1 = fx.queueFor(p1);
    const q2 = fx.queueFor(p2);
    expect((await q1.getJobSchedulers()).map((s) => s.key).sort()).toEqual([schedulerId('full', A), schedulerId('regular', A)].sort());
    expect((await q2.getJobSchedulers()).map((s) => s.key).sort()).toEqual([schedulerId('full', B), schedulerId('regular', B)].sort());

    const j1 = await enqueueWorkspace(q1, { accountId: A, policy: { attempts: 2 } });
    const j2 = await enqueueWorkspace(q2, { accountId: B, policy: { attempts: 2 } });
    await Promise.all([waitForJob(q1, j1, 'completed', 30_000), waitForJob(q2, j2, 'completed', 30_000)]);

    expect(await accountsIn(c1.db)).toEqual([A]);
    expect(await accountsIn(c2.db)).toEqual([B]);
    const a = await withMirror(c1.db, (m) => mirrorEqualsFake(m, wsA, A));
    const b = await withMirror(c2.db, (m) => mirrorEqualsFake(m, wsB, B));
    expect(a.ok, a.detail).toBe(true);
    expect(b.ok, b.detail).toBe(true);
    expect(await runsOf(c1.db)).toEqual([{ account_id: A, trigger: 'on-demand', status: 'succeeded' }]);
    expect(await runsOf(c2.db)).toEqual([{ account_id: B, trigger: 'on-demand', status: 'succeeded' }]);
    // Each queue saw only its own jobs.
    expect((await q1.getJobs(['completed'])).every((j) => j.data.accountId === A)).toBe(true);
    expect((await q2.getJobs(['completed'])).every((j) => j.data.accountId === B)).toBe(true);
    await Promise.all([d1.stop(), d2.stop()]);
  });
});

describe('webhooks into the BullMQ queue', () => {
  it('a signed webhook queues the deduplicated conversation job of its workspace, whose run (trigger webhook) mirrors the new messages; /metrics counts what the API served', async () => {
    const prefix = fx.prefix();
    const config = twoWorkspaceConfig(prefix, B_KEY, { CONVO_MIRROR_WEBHOOK_SECRET: SECRET });
    const seen = fake.requests.length;
    const d = await fx.startDaemon(config, { http: true });
    const queue = fx.queueFor(prefix);
    const x = wsA.list()[3]!.id;
    wsA.appendMessages(x, 2);
    const body = JSON.stringify({ event: 'conversation.updated', conversation_id: x, account_id: A });
    const at = new Date();
    const t0 = Date.now();
    const res = await fetch(`${d.url}/webhooks/conversations`, {
      method: 'POST',
      body,
      headers: { 'content-type': 'application/json', 'webhook-id': 'msg_bullmq_1', 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(SECRET).sign('msg_bullmq_1', at, body) },
    });
    expect(res.status).toBe(202);
    const accepted = (await res.json()) as { job_id: string; conversation_id: string; account_id: string };
    expect(accepted).toMatchObject({ conversation_id: x, account_id: A });
    const job = await waitForJob(queue, accepted.job_id, 'completed', 15_000);
    process.stderr.write(`daemon-workspaces: webhook to mirrored (BullMQ) in ${Date.now() - t0} ms\n`);
    expect(job.data).toEqual({ accountId: A, conversationId: x, trigger: 'webhook', ownRunId: 1 });
    expect(await runsOf(config.db)).toEqual([{ account_id: A, trigger: 'webhook', status: 'succeeded' }]);
    const rows = (await withMirror(config.db, (m) => sqlAll<{ n: number }>(m, 'SELECT count(*) AS n FROM messages WHERE account_id = ? AND conversation_id = ?', A, x)))[0]!.n;
    expect(rows).toBe(wsA.get(x)!.messages.length);

    const metrics = await (await fetch(`${d.url}/metrics`)).text();
    const servedA = fake.requests.slice(seen).filter((r) => r.accountId === A).length;
    expect(metrics).toContain(`convo_mirror_api_requests_total{account_id="${A}",status="200"} ${servedA}`);
    expect(metrics).toMatch(new RegExp(`convo_mirror_messages_total\\{account_id="${A}",op="insert"\\} ${rows}`));
    expect(metrics).not.toContain(SECRET);
  });
});

describe('enqueue --account', () => {
  it('names the workspace (in its configured spelling), is required with several, and refuses one not configured', async () => {
    assertBuilt();
    const prefix = fx.prefix();
    const dir = tempDir('convo-mirror-enqueue-');
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      CI: 'true',
      CONVO_MIRROR_ACCOUNT_ID: `${A},${B}`,
      CONVO_MIRROR_DB: path.join(dir, 'mirror.sqlite'),
      REDIS_URL: redisUrl(),
      CONVO_MIRROR_QUEUE_PREFIX: prefix,
      LOG_LEVEL: 'silent',
    };
    const missing = await run(['enqueue', '--conversation', 'c-1'], env);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain(`--account: is required: 2 workspaces are configured (${A}, ${B})`);
    const unknown = await run(['enqueue', '--account', 'c2e4a6b8-0d1f-4a3c-9e5b-7d9f1b3d5f7a', '--conversation', 'c-1'], env);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('is not a configured workspace');
    const ok = await run(['enqueue', '--account', B.toUpperCase(), '--conversation', 'c-1'], env);
    expect(ok.code, ok.stderr).toBe(0);
    const job = await Job.fromId(fx.queueFor(prefix), ok.stdout.trim());
    expect(job?.data).toEqual({ accountId: B, conversationId: 'c-1' });
  });
});
