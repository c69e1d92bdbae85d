/**
 * The daemon in-process against real Redis (test/global-setup.ts) and the real fake API: job
 * schedulers registered by two daemons, deduplication of on-demand conversation jobs (queued and
 * active), a 503 burst retried by BullMQ, and a 429 making the whole queue back off.
 *
 * `runDaemon` from jobs/daemon.ts runs in this process with a `stop` promise the test resolves;
 * the queue is inspected with BullMQ directly. Every test uses its own queue prefix (derived from
 * this file's random prefix) and its own temp dir; all of them are removed in afterAll. Every wait
 * is bounded and every daemon started is stopped in afterEach.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { Job } from 'bullmq';
import { runDaemon } from '../jobs/daemon.js';
import { childJobId } from '../jobs/processors.js';
import {
  SCHEDULER_FULL,
  SCHEDULER_REGULAR,
  schedulerId,
  conversationDedupId,
  enqueueConversation,
  enqueueWorkspace,
  registerSchedulers,
  type ConversationJobResult,
} from '../jobs/queue.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import type { RunSummary } from '../src/run/index.js';
import { ACCOUNT_ID, API_KEY, quietLogger, readExportLines, withMirror } from './helpers.js';
import { waitFor } from './children.js';
import { sqlAll, sqlGet, sqlValue } from './sql.js';
import { daemonFixtures, expectConversationMirrored, messagesPath, waitForJob } from './daemon-fixtures.js';

const fx = daemonFixtures('daemon');
const testPrefix = fx.prefix;
const fakeApi = fx.fakeApi;
const daemonConfig = fx.daemonConfig;
const startDaemon = fx.startDaemon;
const queueFor = fx.queueFor;

async function conversationRuns(db: string): Promise<{ id: number; status: string }[]> {
  return withMirror(db, (m) => sqlAll<{ id: number; status: string }>(m, `SELECT id, status FROM runs WHERE scope = 'conversations' ORDER BY id`));
}

afterEach(fx.afterEachTest);
afterAll(fx.afterAllTests);

describe('job schedulers', () => {
  const REGULAR = schedulerId('regular', ACCOUNT_ID);
  const FULL = schedulerId('full', ACCOUNT_ID);

  it('daemons registering on one prefix leave exactly the two schedulers; a changed cron updates them in place', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([3]));
    const prefix = testPrefix();
    const env = { CONVO_MIRROR_SCHEDULE: '7 4 2 2 *', CONVO_MIRROR_FULL_SCHEDULE: '9 5 3 3 *', CONVO_MIRROR_TZ: 'Europe/Paris' };
    // A daemon registers, stops, and a second daemon of the same mirror registers again (a restart).
    const config = daemonConfig(fake, prefix, env);
    await (await startDaemon(config)).stop();
    const b = await startDaemon(config);
    // Meanwhile two more registrations race from two separate connections, as two processes would.
    const policy = { attempts: 5 };
    await Promise.all(
      [queueFor(prefix), queueFor(prefix)].map((q) => registerSchedulers(q, [{ accountId: ACCOUNT_ID, schedule: '7 4 2 2 *', fullSchedule: '9 5 3 3 *' }], { tz: 'Europe/Paris', policy })),
    );
    const queue = queueFor(prefix);

    const schedulers = await queue.getJobSchedulers(0, -1, true);
    expect(schedulers.map((s) => s.key).sort()).toEqual([FULL, REGULAR].sort());
    const byKey = new Map(schedulers.map((s) => [s.key, s]));
    expect(byKey.get(REGULAR)).toMatchObject({ pattern: '7 4 2 2 *', tz: 'Europe/Paris' });
    expect(byKey.get(FULL)).toMatchObject({ pattern: '9 5 3 3 *', tz: 'Europe/Paris' });
    // The next tick of each cron, in its time zone (Paris is UTC+1 in February and early March).
    expect(new Date(byKey.get(REGULAR)!.next!).toISOString()).toMatch(/-02-02T03:07:00\.000Z$/);
    expect(new Date(byKey.get(FULL)!.next!).toISOString()).toMatch(/-03-03T04:09:00\.000Z$/);
    // Each scheduler has exactly one pending tick, not one per daemon.
    expect(await queue.getJobCounts('delayed', 'waiting')).toEqual({ delayed: 2, waiting: 0 });
    await b.stop();

    // Upserting again (a third registration, with a changed regular cron) updates, never adds.
    const regularBefore = byKey.get(REGULAR)!.next!;
    await registerSchedulers(queueFor(prefix), [{ accountId: ACCOUNT_ID, schedule: '30 6 * * *', fullSchedule: '9 5 3 3 *' }], { tz: 'Europe/Paris', policy: { attempts: 5 } });
    const after = await queue.getJobSchedulers(0, -1, true);
    expect(after).toHaveLength(2);
    const regular = after.find((s) => s.key === REGULAR)!;
    expect(regular).toMatchObject({ pattern: '30 6 * * *', tz: 'Europe/Paris' });
    expect(regular.next).not.toBe(regularBefore);
    expect(after.find((s) => s.key === FULL)).toMatchObject({ pattern: '9 5 3 3 *' });
    expect(await queue.getJobSchedulersCount()).toBe(2);
    expect(await queue.getJobCounts('delayed', 'waiting')).toEqual({ delayed: 2, waiting: 0 });
  });

  it('schedulers of a workspace no longer configured, and the single-workspace ones of earlier versions, are removed; each job carries its account id', async () => {
    const prefix = testPrefix();
    const queue = queueFor(prefix);
    const policy = { attempts: 5 };
    const other = '0b7c9d2e-1f3a-4b5c-8d6e-7f8091a2b3c4';
    // An earlier version's bare schedulers, and another workspace's pair.
    await queue.upsertJobScheduler(SCHEDULER_REGULAR, { pattern: '1 1 1 1 *' }, { name: 'sync-workspace', data: { mode: 'regular' } });
    await queue.upsertJobScheduler(SCHEDULER_FULL, { pattern: '2 2 2 2 *' }, { name: 'sync-workspace', data: { mode: 'full' } });
    await registerSchedulers(queue, [{ accountId: other, schedule: '3 3 3 3 *', fullSchedule: '4 4 4 4 *' }], { tz: 'UTC', policy });
    expect((await queue.getJobSchedulers()).map((s) => s.key).sort()).toEqual([schedulerId('full', other), schedulerId('regular', other)].sort());

    const removed = await registerSchedulers(queue, [{ accountId: ACCOUNT_ID, schedule: '5 5 5 5 *', fullSchedule: '6 6 6 6 *' }], { tz: 'UTC', policy });
    expect(removed.sort()).toEqual([schedulerId('full', other), schedulerId('regular', other)].sort());
    expect((await queue.getJobSchedulers()).map((s) => s.key).sort()).toEqual([FULL, REGULAR].sort());
    const ticks = await queue.getJobs(['delayed']);
    expect(ticks.map((j) => j.data).sort((x, y) => String(x.mode).localeCompare(String(y.mode)))).toEqual([
      { accountId: ACCOUNT_ID, mode: 'full', trigger: 'schedule' },
      { accountId: ACCOUNT_ID, mode: 'regular', trigger: 'schedule' },
    ]);
  });
});

describe('one queue prefix per mirror', () => {
  it('a daemon of another mirror is refused on a prefix that is taken, naming CONVO_MIRROR_QUEUE_PREFIX', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([3]));
    const prefix = testPrefix();
    const a = await startDaemon(daemonConfig(fake, prefix));
    const other = daemonConfig(fake, prefix);
    await expect(runDaemon({ config: other, logger: quietLogger(), stop: new Promise(() => {}) })).rejects.toThrowError(
      /CONVO_MIRROR_QUEUE_PREFIX: the queue prefix .* belongs to another mirror/,
    );
    await a.stop();
  });
});

describe('deduplication of on-demand conversation jobs', () => {
  it('while queued: asking twice for one conversation queues one job and returns its id both times', async () => {
    const ws = FakeWorkspace.fromCounts([5, 5]);
    const prefix = testPrefix();
    const queue = queueFor(prefix);
    const [x, y] = ws.list().map((c) => c.id);
    const policy = { attempts: 5 };
    const first = await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy });
    const second = await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy });
    expect(second).toBe(first);
    expect(await queue.getWaitingCount()).toBe(1);
    // Another conversation is not deduplicated against it.
    const other = await enqueueConversation(queue, y!, { accountId: ACCOUNT_ID, policy });
    expect(other).not.toBe(first);
    expect(await queue.getWaitingCount()).toBe(2);
    const job = await Job.fromId(queue, first);
    expect(job?.data).toEqual({ accountId: ACCOUNT_ID, conversationId: x });
    expect(JSON.stringify(job?.data)).not.toContain(API_KEY);
  });

  it('while active: asking twice more leads to exactly one more run after the running one', async () => {
    const ws = FakeWorkspace.fromCounts([150, 4]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const [x] = ws.list().map((c) => c.id);
    // The first crawl's first page is slow, so the job is active while we ask again.
    fake.injectFault({ kind: 'slow', delayMs: 1200, match: { path: messagesPath(x!), page: 1 }, times: 1 });
    const d = await startDaemon(daemonConfig(fake, prefix));
    const queue = queueFor(prefix);
    const policy = { attempts: 5 };
    const first = await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy });
    await waitFor(async () => (await (await Job.fromId(queue, first))?.getState()) === 'active', 5_000, 'the first job to be active');
    await waitFor(() => fake.requests.some((r) => r.path === messagesPath(x!)), 5_000, 'the first crawl to start');
    await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy });
    await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy });

    await waitFor(
      async () => {
        const c = await queue.getJobCounts('completed', 'waiting', 'active');
        return c.completed === 2 && (c.waiting ?? 0) + (c.active ?? 0) === 0;
      },
      10_000,
      'two completed jobs and nothing left',
    );
    // No third run can follow: with keepLastIfActive, the one deferred run is added when the active
    // job ends (atomically, as it completes), and nothing is active or waiting any more. So the
    // counts are final; no wait is needed to prove that nothing more comes.
    expect(await queue.getDeduplicationJobId(conversationDedupId(ACCOUNT_ID, x!)), 'a deferred run still pending').toBeNull();
    // (The two delayed jobs are the schedulers' next ticks.)
    const counts = await queue.getJobCounts('completed', 'waiting', 'active', 'delayed', 'failed');
    expect(counts).toEqual({ completed: 2, waiting: 0, active: 0, delayed: 2, failed: 0 });
    const completed = await queue.getCompleted(0, -1);
    expect(completed.map((j) => j.data.conversationId)).toEqual([x, x]);
    const runs = await conversationRuns(d.config.db);
    expect(runs.map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
    // The first run crawled pages 1-2; the one more run is incremental: only page 2, which holds the
    // last known message (boundary check passed, nothing new).
    expect(fake.requests.filter((r) => r.path === messagesPath(x!)).map((r) => r.query['page'])).toEqual(['1', '2', '2']);
    await expectConversationMirrored(d.config.db, ws, x!);
  });
});

describe('retries', () => {
  it('a 503 burst longer than the client retries fails the first attempt; BullMQ retries the job and it completes', async () => {
    const ws = FakeWorkspace.fromCounts([130, 6]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const [x] = ws.list().map((c) => c.id);
    // maxRetries 1: an attempt sends 2 requests; 3 × 503 exhausts the first attempt and hits the second once.
    fake.injectFault({ kind: 'status', status: 503, match: { path: messagesPath(x!) }, times: 3 });
    const d = await startDaemon(daemonConfig(fake, prefix, { CONVO_MIRROR_MAX_RETRIES: '1' }));
    const queue = queueFor(prefix);
    const id = await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy: { attempts: 5 } });
    await waitFor(async () => (await (await Job.fromId(queue, id))?.getState()) === 'completed', 15_000, 'the job to complete');
    const job = (await Job.fromId(queue, id))!;
    expect(job.attemptsMade).toBeGreaterThanOrEqual(2);
    const value = job.returnvalue as ConversationJobResult;
    expect(value.result).toMatchObject({ id: x, status: 'synced', messageCount: 130 });
    expect(fake.requests.filter((r) => r.path === messagesPath(x!) && r.status === 503)).toHaveLength(3);
    await expectConversationMirrored(d.config.db, ws, x!);
    // One recorded run for the job, kept across its attempts, ending succeeded.
    const runs = await conversationRuns(d.config.db);
    expect(runs).toHaveLength(1);
    expect(runs[0]!.status).toBe('succeeded');
    const lines = readExportLines(d.config.exportDir, 'messages').filter((l) => l.conversation_id === x);
    expect(lines).toHaveLength(130);
    expect(new Set(lines.map((l) => l.id)).size).toBe(130);
  });
});

describe('429: the whole queue backs off', () => {
  it("sets the queue's rate limit shortly after a 429 with Retry-After 5", async () => {
    const ws = FakeWorkspace.fromCounts([20, 20]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const [x] = ws.list().map((c) => c.id);
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '5', match: { path: messagesPath(x!) }, times: 1 });
    const d = await startDaemon(daemonConfig(fake, prefix));
    const queue = queueFor(prefix);
    expect(await queue.getRateLimitTtl()).toBeLessThanOrEqual(0);
    const id = await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy: { attempts: 5 } });
    await waitFor(() => fake.requests.some((r) => r.status === 429), 5_000, 'the 429');
    let ttl = 0;
    await waitFor(async () => (ttl = await queue.getRateLimitTtl()) > 0, 1_000, 'a queue rate limit after the 429');
    // The limit is the Retry-After (5 s), not some shorter window of the queue's own (3 s of slack
    // for a slow machine between the 429 and this read).
    expect(ttl).toBeGreaterThan(2_000);
    expect(ttl).toBeLessThanOrEqual(5_000);
    await waitFor(async () => (await (await Job.fromId(queue, id))?.getState()) === 'completed', 15_000, 'the job to complete');
    await expectConversationMirrored(d.config.db, ws, x!);
  });

  it('while the rate limit is in force, no other worker starts a job', async () => {
    const ws = FakeWorkspace.fromCounts([20, 20]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const [x, y] = ws.list().map((c) => c.id);
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '2', match: { path: messagesPath(x!) }, times: 1 });
    // One daemon with two worker slots: one takes x and gets the 429; the other slot is free. Only
    // the queue's rate limit keeps it from taking y (else y would go active and wait in the client).
    await startDaemon(daemonConfig(fake, prefix, { CONVO_MIRROR_CONCURRENCY: '2' }));
    const queue = queueFor(prefix);
    await enqueueConversation(queue, x!, { accountId: ACCOUNT_ID, policy: { attempts: 5 } });
    await waitFor(() => fake.requests.some((r) => r.status === 429), 5_000, 'the 429');
    await waitFor(async () => (await queue.getRateLimitTtl()) > 1_000, 1_000, 'the queue rate limit of the 429 (Retry-After 2)');
    const idY = await enqueueConversation(queue, y!, { accountId: ACCOUNT_ID, policy: { attempts: 5 } });
    // Precondition: y was queued while the limit was still in force.
    expect(await queue.getRateLimitTtl(), 'rate limit in force when y was queued').toBeGreaterThan(0);
    const jobY = await waitForJob(queue, idY, 'completed', 10_000, "y's job to complete");
    // The recorded times say it: the 429 (Retry-After 2) set a 2 s limit on the whole queue, and y's
    // job went active, and its first request left, only after that limit ran out.
    const r429 = fake.requests.find((r) => r.status === 429)!;
    const firstY = fake.requests.find((r) => r.path === messagesPath(y!))!;
    expect(jobY.processedOn! - r429.at, "y's job started this long after the 429 (ms)").toBeGreaterThanOrEqual(1_900);
    expect(firstY.at - r429.at, "y's first request this long after the 429 (ms)").toBeGreaterThanOrEqual(1_900);
  });
});

describe('workspace jobs', () => {
  it('a workspace job lists, fans out one job per conversation, waits, rolls up, exports and records the run', async () => {
    const ws = FakeWorkspace.fromCounts([0, 1, 101, 250, 3, 40]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const bad = ws.list()[4]!.id;
    // One conversation fails for good: a 400 is not retryable, so neither the client nor BullMQ
    // retries it (the job has 2 attempts; it uses one).
    fake.injectFault({ kind: 'status', status: 400, match: { path: messagesPath(bad) }, times: Infinity });
    const d = await startDaemon(daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '2', CONVO_MIRROR_CONCURRENCY: '3' }));
    const queue = queueFor(prefix);
    const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 2 } });
    await waitFor(async () => (await (await Job.fromId(queue, id))?.getState()) === 'completed', 20_000, 'the workspace job to complete');
    const summary = (await Job.fromId(queue, id))!.returnvalue as RunSummary;
    expect(summary).toMatchObject({ scope: 'workspace', refresh: 'incremental', status: 'partial', listConfirmed: true });
    expect(summary.conversations).toMatchObject({ listed: 6, synced: 5, failed: 1 });
    expect(summary.failures.map((f) => f.id)).toEqual([bad]);
    expect(summary.messages.served).toBe(0 + 1 + 101 + 250 + 40);
    // Every conversation but the failing one is mirrored exactly; the run and its failure are recorded.
    await withMirror(d.config.db, (m) => {
      for (const c of ws.list()) {
        const ids = sqlAll<{ id: string }>(m, `SELECT id FROM messages WHERE conversation_id = ? AND deleted_at IS NULL ORDER BY position`, c.id).map((r) => r.id);
        expect(ids, c.id).toEqual(c.id === bad ? [] : c.messages.map((x) => x.id));
      }
    });
    const run = await withMirror(d.config.db, (m) => sqlGet(m, `SELECT scope, refresh, status, conversations_synced FROM runs WHERE id = ?`, summary.runId));
    expect(run).toEqual({ scope: 'workspace', refresh: 'incremental', status: 'partial', conversations_synced: 5 });
    const failures = await withMirror(d.config.db, (m) => sqlAll(m, `SELECT conversation_id, code, status, attempts FROM run_failures WHERE run_id = ?`, summary.runId));
    expect(failures).toEqual([{ conversation_id: bad, code: 'HTTP_ERROR', status: 400, attempts: 1 }]);
    const badJob = (await Job.fromId(queue, childJobId(summary.runId, bad)))!;
    expect(await badJob.getState()).toBe('failed');
    expect(badJob.attemptsMade, 'attempts of the failing child').toBe(1);
    expect(fake.requests.filter((r) => r.path === messagesPath(bad)), 'requests for the failing conversation').toHaveLength(1);
    const lines = readExportLines(d.config.exportDir, 'messages');
    expect(lines).toHaveLength(1 + 101 + 250 + 40);
    expect(new Set(lines.map((l) => `${l.conversation_id}/${l.id}`)).size).toBe(lines.length);
    // Each conversation was crawled by exactly one child job.
    const children = await queue.getJobs(['completed', 'failed'], 0, -1);
    expect(children.filter((j) => j.name === 'sync-conversation').map((j) => j.data.conversationId).sort()).toEqual(ws.list().map((c) => c.id).sort());
  });

  it('a full workspace job: a listed conversation answering 404 fails with its code and keeps its rows; a vanished one is tombstoned', async () => {
    const ws = FakeWorkspace.fromCounts([6, 7, 8]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const d = await startDaemon(daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '1' }));
    const queue = queueFor(prefix);
    const first = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } });
    await waitFor(async () => (await (await Job.fromId(queue, first))?.getState()) === 'completed', 15_000, 'the first workspace job');
    const [listed404, vanished] = [ws.list()[0]!, ws.list()[2]!];
    fake.injectFault({ kind: 'status', status: 404, match: { path: messagesPath(listed404.id) }, times: Infinity });
    ws.deleteConversation(vanished.id);
    const full = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, full: true, policy: { attempts: 1 } });
    await waitFor(async () => (await (await Job.fromId(queue, full))?.getState()) === 'completed', 15_000, 'the full workspace job');
    const summary = (await Job.fromId(queue, full))!.returnvalue as RunSummary;
    expect(summary).toMatchObject({ scope: 'workspace', refresh: 'full', status: 'partial' });
    expect(summary.conversations.deleted).toBe(1);
    expect(summary.failures.map((f) => [f.id, f.code])).toEqual([[listed404.id, 'LISTED_BUT_NOT_FOUND']]);
    await withMirror(d.config.db, (m) => {
      const state = (id: string) =>
        sqlGet(m, `SELECT (SELECT deleted_at IS NOT NULL FROM conversations WHERE id = ?) AS gone, sum(deleted_at IS NULL) AS live FROM messages WHERE conversation_id = ?`, id, id);
      expect(state(listed404.id)).toEqual({ gone: 0, live: 6 });
      expect(state(vanished.id)).toEqual({ gone: 1, live: 0 });
      expect(sqlAll(m, `SELECT conversation_id, code FROM run_failures WHERE run_id = ?`, summary.runId)).toEqual([
        { conversation_id: listed404.id, code: 'LISTED_BUT_NOT_FOUND' },
      ]);
    });
    const deletes = readExportLines(d.config.exportDir, 'messages').filter((l) => l.op === 'delete');
    expect(new Set(deletes.map((l) => l.conversation_id))).toEqual(new Set([vanished.id]));
  });

  it('a listing that fails for good (400, or a 503 on the last attempt) records the run as failed, never leaves it running', async () => {
    const ws = FakeWorkspace.fromCounts([2, 3]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const d = await startDaemon(daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '2' }));
    const queue = queueFor(prefix);
    for (const status of [400, 503]) {
      fake.clearFaults();
      fake.injectFault({ kind: 'status', status, match: { path: '/v1/conversations' }, times: Infinity });
      const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 2 } });
      await waitFor(async () => (await (await Job.fromId(queue, id))?.getState()) === 'failed', 20_000, `the workspace job (list answering ${status}) to fail`);
      const job = (await Job.fromId(queue, id))!;
      expect(job.attemptsMade).toBe(status === 400 ? 1 : 2); // a 400 is not retried; a 503 is, once
      const runId = (job.data as { runId: number }).runId;
      await withMirror(d.config.db, (m) => {
        expect(sqlGet(m, `SELECT status, error LIKE ? AS named FROM runs WHERE id = ?`, `%${status}%`, runId)).toEqual({ status: 'failed', named: 1 });
        expect(sqlAll(m, `SELECT conversation_id FROM run_failures WHERE run_id = ?`, runId)).toEqual([{ conversation_id: '(conversation list)' }]);
        expect(sqlValue(m, `SELECT count(*) FROM runs WHERE status = 'running'`)).toBe(0);
      });
    }
  });

  it('a full workspace job re-reads every page and tombstones what vanished', async () => {
    const ws = FakeWorkspace.fromCounts([120, 5]);
    const fake = await fakeApi(ws);
    const prefix = testPrefix();
    const d = await startDaemon(daemonConfig(fake, prefix));
    const queue = queueFor(prefix);
    const first = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 2 } });
    await waitFor(async () => (await (await Job.fromId(queue, first))?.getState()) === 'completed', 15_000, 'the first workspace job');
    const [big, small] = ws.list();
    const gone = big!.messages[3]!.id;
    ws.deleteMessage(big!.id, gone);
    ws.deleteConversation(small!.id);
    const before = fake.requests.length;
    const full = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, full: true, policy: { attempts: 2 } });
    await waitFor(async () => (await (await Job.fromId(queue, full))?.getState()) === 'completed', 15_000, 'the full workspace job');
    const summary = (await Job.fromId(queue, full))!.returnvalue as RunSummary;
    expect(summary).toMatchObject({ scope: 'workspace', refresh: 'full', status: 'succeeded' });
    expect(summary.conversations.deleted).toBe(1);
    // Every page of the remaining conversation was read again: 2 pages of 119 messages.
    expect(fake.requests.slice(before).filter((r) => r.path === messagesPath(big!.id)).map((r) => r.query['page'])).toEqual(['1', '2']);
    await withMirror(d.config.db, (m) => {
      expect(sqlValue<string | null>(m, `SELECT deleted_at FROM messages WHERE id = ?`, gone)).not.toBeNull();
      expect(sqlValue<string | null>(m, `SELECT deleted_at FROM conversations WHERE id = ?`, small!.id)).not.toBeNull();
    });
    const deletes = readExportLines(d.config.exportDir, 'messages').filter((l) => l.op === 'delete');
    expect(deletes.map((l) => l.id).sort()).toEqual([gone, ...small!.messages.map((m) => m.id)].sort());
  });
});
