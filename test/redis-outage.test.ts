/**
 * Redis down and back, with the real daemon (`node dist/src/cli/index.js daemon`, built by `npm
 * test`) against a redis-server of this file's own (test/own-redis.ts: stopped and started again on
 * its port, its data kept), never the shared one:
 *
 * - while Redis is down, `/readyz` and a signed webhook delivery both answer 503 naming Redis, and
 *   the dashboard's page and API answer 503 with the reason within 5 s (they waited 15 s and more);
 * - once `/readyz` says 200 again, the very next delivery is accepted (202): both ask the queue's
 *   own connection (`/readyz` pinged a connection of its own, back within a second, while the
 *   queue's sat in BullMQ's backoff of up to 20 s: 200 from `/readyz`, 503 for the delivery);
 * - SIGTERM a second after Redis came back: exit 0 within the grace period (it logged "grace
 *   period over" at 30 s, "closing without them" at 35 s and was still running at 40 s: BullMQ's
 *   `worker.close()` waited for the end of a connection parked in its reconnect delay);
 * - SIGTERM while Redis is down and a conversation job runs: exit 0 within the grace period plus
 *   the 5 s hard bound; the job could not be put back, so it stays active until its lock expires and
 *   the next daemon resumes it from its checkpoint, as after SIGKILL (exact mirror, each message
 *   exported once).
 *
 * Assertions are on exit codes, log lines and their order, job state and the fake's request log;
 * the only times asserted are the requirements themselves, as bounds far above what is measured
 * (each measured figure is printed).
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import { Job, type Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { Webhook } from 'standardwebhooks';
import { openQueue } from '../jobs/queue.js';
import { redisShown } from '../config/redis-url.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, closedPort, killLeftovers, run, startDaemon, waitFor, within, type Started } from './children.js';
import { closeOwnRedis, ownRedis } from './own-redis.js';
import { sqlGet } from './sql.js';
import { withMirror } from './helpers.js';
import { NEVER, expectConversationMirrored, expectExportedOnce, jobState, messagesPath } from './daemon-fixtures.js';

const SECRET = `whsec_${Buffer.from('convo-mirror-redis-outage-secret').toString('base64')}`;
const PASSWORD = 'redis-outage-admin-pw';
const PREFIX = 'cmtest-redis-outage';

const dirs: string[] = [];
const fakes: FakeApi[] = [];
const queues: Queue[] = [];

beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(queues.splice(0).map((q) => within(q.close(), 5_000, 'closing a queue')));
  await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
});
afterAll(async () => {
  await closeOwnRedis();
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

async function fakeApi(ws: FakeWorkspace): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(fake);
  return fake;
}

/** A daemon's environment against `fake` and the Redis at `redisUrl`, with small timings. */
function env(fake: FakeApi, redisUrl: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const dir = tempDir('convo-mirror-redis-outage-');
  dirs.push(dir);
  return cliEnv(fake, dir, {
    REDIS_URL: redisUrl,
    CONVO_MIRROR_QUEUE_PREFIX: PREFIX,
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_MAX_RETRIES: '1',
    CONVO_MIRROR_JOB_LOCK_MS: '2000',
    CONVO_MIRROR_CONCURRENCY: '2',
    ...extra,
  });
}

/** The daemon's JSON log lines, in order. */
function logOf(stderr: string): { msg: string; [k: string]: unknown }[] {
  return stderr
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { msg: string });
}

/** Index of the first log line with message `msg` (failing the test naming it when there is none). */
function lineIndex(stderr: string, msg: string): number {
  const i = logOf(stderr).findIndex((l) => l.msg === msg);
  expect(i, `log line "${msg}" in:\n${stderr.slice(-3000)}`).toBeGreaterThanOrEqual(0);
  return i;
}

/** `msgs` appear in the log in this order. */
function expectInOrder(stderr: string, msgs: string[]): void {
  const at = msgs.map((m) => lineIndex(stderr, m));
  expect(at, `the order of ${JSON.stringify(msgs)}`).toEqual([...at].sort((a, b) => a - b));
}

/** A GET (answered within 5 s, or the fetch fails), its status, body and how long it took. */
async function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; text: string; ms: number }> {
  const t0 = Date.now();
  const res = await fetch(url, { headers, signal: AbortSignal.timeout(5_000) });
  const text = await res.text();
  return { status: res.status, text, ms: Date.now() - t0 };
}

/**
 * Sends SIGTERM to a daemon and waits (bounded by `withinMs`) for it to exit. `exitMs` is only
 * reported, never asserted: the assertions read the daemon's own `shutdown_ms`.
 */
async function terminate(d: Started, withinMs: number, what: string): Promise<{ ended: Awaited<Started['done']>; exitMs: number }> {
  const termAt = Date.now();
  d.child.kill('SIGTERM');
  const ended = await within(d.done, withinMs, what);
  return { ended, exitMs: Date.now() - termAt };
}

/** A delivery signed with {@link SECRET} for conversation `id`: its status, body, and how long it took. */
async function deliver(base: string, id: string): Promise<{ status: number; body: Record<string, unknown>; ms: number }> {
  const body = JSON.stringify({ type: 'conversation.updated', conversation_id: id });
  const msgId = `msg_outage_${Math.random().toString(36).slice(2)}`;
  const at = new Date();
  const t0 = Date.now();
  const res = await fetch(`${base}/webhooks/conversations`, {
    method: 'POST',
    body,
    headers: {
      'content-type': 'application/json',
      'webhook-id': msgId,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': new Webhook(SECRET).sign(msgId, at, body),
    },
    signal: AbortSignal.timeout(10_000),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown>, ms: Date.now() - t0 };
}

const basic = `Basic ${Buffer.from(`admin:${PASSWORD}`).toString('base64')}`;

describe('Redis down and back', () => {
  it('/readyz and a webhook delivery agree (both 503 while down; 202 right after /readyz says 200); the dashboard answers 503 at once; SIGTERM a second after Redis is back exits 0 within the grace', async () => {
    const redis = await ownRedis();
    const ws = FakeWorkspace.fromCounts([5, 3]);
    const fake = await fakeApi(ws);
    const [x, y] = ws.list().map((c) => c.id);
    const port = await closedPort();
    const base = `http://127.0.0.1:${port}`;
    const graceMs = 10_000;
    const e = env(fake, redis.url, {
      CONVO_MIRROR_HTTP_PORT: String(port),
      CONVO_MIRROR_WEBHOOK_SECRET: SECRET,
      CONVO_MIRROR_ADMIN_PASSWORD: PASSWORD,
      CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: String(graceMs),
    });
    const daemon = await startDaemon(e, [], 60_000);
    expect((await get(`${base}/readyz`)).status).toBe(200);
    expect((await deliver(base, x!)).status).toBe(202);

    await redis.stop();
    const downAt = Date.now();
    let ready = await get(`${base}/readyz`);
    await waitFor(async () => (ready = await get(`${base}/readyz`)).status === 503, 5_000, '/readyz to answer 503', 50);
    const body = JSON.parse(ready.text) as { failed: { check: string; reason: string }[] };
    expect(body.failed.map((f) => f.check)).toEqual(['redis']);
    expect(body.failed[0]!.reason).toContain(`Redis at ${redisShown(redis.url)} is not connected`);
    // A delivery now would be refused: it is, at once, and /readyz says so too.
    const refused = await deliver(base, x!);
    expect(refused.status).toBe(503);
    expect((await get(`${base}/readyz`)).status).toBe(503);
    // The dashboard: its API and its page answer 503 with the reason (a fetch not answered within 5 s fails the test).
    const api = await get(`${base}/admin/queues/api/queues`, { authorization: basic });
    expect(api.status).toBe(503);
    expect(JSON.parse(api.text)).toEqual({ error: expect.stringContaining(`the queue dashboard needs Redis: Redis at ${redisShown(redis.url)} is not connected`) });
    const page = await get(`${base}/admin/queues`, { authorization: basic });
    expect(page.status).toBe(503);
    // Still behind the password.
    expect((await get(`${base}/admin/queues/api/queues`)).status).toBe(401);
    process.stderr.write(`redis-outage: while Redis is down: dashboard API 503 in ${api.ms} ms, page in ${page.ms} ms, delivery 503 in ${refused.ms} ms\n`);

    // Down for 11 s: BullMQ's own backoff (1 s, ..., then 3, 8 and 20 s) would now leave connections
    // waiting for seconds after Redis is back; ours retries every second.
    await new Promise((r) => setTimeout(r, Math.max(0, downAt + 11_000 - Date.now())));
    await redis.start();
    const backAt = Date.now();
    await waitFor(async () => (await get(`${base}/readyz`)).status === 200, 10_000, '/readyz to answer 200 again', 50);
    const readyAfterMs = Date.now() - backAt;
    const accepted = await deliver(base, y!);
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(202);
    expect(accepted.body).toMatchObject({ conversation_id: y, account_id: ACCOUNT_ID });
    process.stderr.write(`redis-outage: /readyz 200 ${readyAfterMs} ms after Redis came back; the next delivery 202 in ${accepted.ms} ms\n`);

    // SIGTERM a second after Redis came back.
    await new Promise((r) => setTimeout(r, Math.max(0, backAt + 1_000 - Date.now())));
    const { ended, exitMs } = await terminate(daemon, graceMs + 10_000, 'the daemon to exit after SIGTERM');
    expect(ended.code, ended.stderr.slice(-3000)).toBe(0);
    expectInOrder(ended.stderr, [
      'daemon ready',
      'lost the connection to Redis: /readyz and webhooks answer 503 and no job starts until it is back; reconnecting every second',
      'connected to Redis again',
      'shutting down: no new jobs; waiting for running ones',
      'http server closed',
      'daemon stopped',
      'exiting',
    ]);
    const stopped = logOf(ended.stderr).find((l) => l.msg === 'daemon stopped')!;
    // Within its grace: nothing had to be cut short.
    expect(stopped).toMatchObject({ forced: false });
    expect(stopped['shutdown_ms'] as number).toBeLessThan(graceMs);
    expect(ended.stderr).not.toContain('did not close in time');
    // Logged once per outage, not once a second per connection.
    expect(logOf(ended.stderr).filter((l) => l.msg === 'worker error').length).toBeLessThanOrEqual(6);
    process.stderr.write(`redis-outage: SIGTERM 1 s after Redis came back: shutdown_ms ${String(stopped['shutdown_ms'])}, process exited ${exitMs} ms after SIGTERM (grace ${graceMs} ms)\n`);
    // Both accepted deliveries made jobs on the restarted Redis (its data kept).
    const queue = openQueue({ redisUrl: redis.url, prefix: PREFIX });
    queues.push(queue);
    expect((await queue.getJobCounts('completed', 'waiting', 'active', 'delayed', 'failed')).failed).toBe(0);
  }, 90_000);

  it('SIGTERM while Redis accepts connections but answers nothing (CLIENT PAUSE): the connections are cut at the bound and the daemon exits 0', async () => {
    const redis = await ownRedis();
    const fake = await fakeApi(FakeWorkspace.fromCounts([2]));
    const graceMs = 1000;
    const daemon = await startDaemon(env(fake, redis.url, { CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: String(graceMs) }), [], 60_000);
    const admin = new Redis(redis.url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    admin.on('error', () => {});
    await admin.connect();
    await admin.call('CLIENT', 'PAUSE', '20000', 'ALL');
    admin.disconnect();
    const { ended, exitMs } = await terminate(daemon, graceMs + 5_000 + 5_000, 'the daemon to exit while Redis answers nothing');
    expect(ended.code, ended.stderr.slice(-3000)).toBe(0);
    expectInOrder(ended.stderr, ['shutting down: no new jobs; waiting for running ones', 'the Redis connections did not close in time: cutting them', 'daemon stopped', 'exiting']);
    const stopped = logOf(ended.stderr).find((l) => l.msg === 'daemon stopped')!;
    expect(stopped['shutdown_ms'] as number).toBeLessThan(graceMs + 5_000);
    process.stderr.write(`redis-outage: SIGTERM while Redis answers nothing: shutdown_ms ${String(stopped['shutdown_ms'])}, exited ${exitMs} ms after SIGTERM\n`);
    await redis.stop(); // a paused server still stops
  }, 60_000);

  it('SIGTERM while Redis is down and a conversation job runs: exit 0 within the grace plus 5 s; the next daemon resumes the job from its checkpoint, as after SIGKILL', async () => {
    const redis = await ownRedis();
    const ws = FakeWorkspace.fromCounts([1200]);
    const fake = await fakeApi(ws);
    const x = ws.list()[0]!.id;
    fake.injectFault({ kind: 'slow', delayMs: 400, match: { path: messagesPath(x) }, times: Infinity });
    const graceMs = 1500;
    const e = env(fake, redis.url, { CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: String(graceMs) });
    const db = e.CONVO_MIRROR_DB!;
    const first: Started = await startDaemon(e, [], 60_000);
    const asked = await run(['enqueue', '--conversation', x], e);
    expect(asked.code, asked.stderr).toBe(0);
    const jobId = asked.stdout.trim();
    const served = () => fake.requests.filter((r) => r.path === messagesPath(x) && r.status === 200).length;
    await waitFor(() => served() >= 3, 15_000, '3 pages served');

    await redis.stop();
    await waitFor(() => /"msg":"lost the connection to Redis|ECONNREFUSED/.test(first.stderr), 5_000, 'the daemon to see Redis gone');
    const { ended, exitMs } = await terminate(first, graceMs + 5_000 + 5_000, 'the daemon to exit after SIGTERM while Redis is down');
    expect(ended.code, ended.stderr.slice(-3000)).toBe(0);
    expectInOrder(ended.stderr, [
      'shutting down: no new jobs; waiting for running ones',
      'grace period over: aborting running jobs; they resume from their checkpoints',
      'jobs still running after the abort: closing without them; they are picked up again from their checkpoints once their lock expires',
      'daemon stopped',
      'exiting',
    ]);
    const stopped = logOf(ended.stderr).find((l) => l.msg === 'daemon stopped')!;
    expect(stopped).toMatchObject({ forced: true, abandoned: 1 });
    expect(stopped['shutdown_ms'] as number).toBeLessThan(graceMs + 5_000);
    process.stderr.write(`redis-outage: SIGTERM while Redis is down, a job running: shutdown_ms ${String(stopped['shutdown_ms'])}, exited ${exitMs} ms after SIGTERM (grace ${graceMs} ms + at most 5000)\n`);
    const checkpoint = await withMirror(db, (m) => sqlGet<{ next_page: number }>(m, `SELECT next_page FROM checkpoints WHERE account_id = ? AND conversation_id = ?`, ACCOUNT_ID, x));
    expect(checkpoint?.next_page, 'a checkpoint past page 1').toBeGreaterThan(1);

    // Redis back; the job is still active under the first daemon's lock, as after SIGKILL.
    await redis.start();
    const queue = openQueue({ redisUrl: redis.url, prefix: PREFIX });
    queues.push(queue);
    expect(await jobState(queue, jobId)).toBe('active');
    fake.clearFaults();
    const mark = fake.requests.length;
    const second = await startDaemon(e, [], 60_000);
    await waitFor(async () => (await jobState(queue, jobId)) === 'completed', 20_000, 'the job to complete on the next daemon');
    const secondLife = fake.requests.slice(mark).filter((r) => r.path === messagesPath(x));
    expect(Math.min(...secondLife.map((r) => Number(r.query['page'] ?? '1'))), 'first page requested by the next daemon').toBe(checkpoint!.next_page - 1);
    const job = (await Job.fromId(queue, jobId))!;
    expect(job.stalledCounter, 'picked up as a stalled job').toBeGreaterThanOrEqual(1);
    expect(job.returnvalue).toMatchObject({ result: { id: x, messageCount: 1200, resumed: true } });
    await expectConversationMirrored(db, ws, x);
    expectExportedOnce(e.CONVO_MIRROR_EXPORT_DIR!, ws, x);
    second.child.kill('SIGTERM');
    expect((await within(second.done, 10_000, 'the second daemon to exit')).code).toBe(0);
  }, 90_000);
});
