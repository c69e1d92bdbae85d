/**
 * The daemon's runs go through src/run like the CLI's: their figures come from request tallies
 * (listing + every child's, every attempt), and the error decides retry. `runDaemon` in this
 * process (test/daemon-fixtures.ts) against the fake over real HTTP, the test run's real Redis and
 * a real SQLite mirror; jobs are polled for their state, never waited for with a sleep.
 *
 * - A scheduled workspace run on an unchanged workspace records `messages_served` 0 and only the
 *   list requests; the first (full) one records every message of the fake.
 * - A conversation job failing with a `SchemaError` (a page breaking the documented shape) is
 *   attempted once, on demand and as a child of a workspace run, whose `run_failures` row then has
 *   the code SCHEMA_ERROR.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { Job, type Queue } from 'bullmq';
import { childJobId } from '../jobs/processors.js';
import { WORKSPACE_JOB, enqueueConversation, enqueueWorkspace, jobOptions, jobPolicyOf, type ConversationJobData, type WorkspaceJobData } from '../jobs/queue.js';
import { FakeWorkspace, type FakeApi } from '../src/fake-api/index.js';
import type { RunSummary } from '../src/run/index.js';
import { ACCOUNT_ID, testClock, withMirror } from './helpers.js';
import { sqlAll, sqlGet } from './sql.js';
import { daemonFixtures, messagesPath, waitForJob } from './daemon-fixtures.js';

const fx = daemonFixtures('jobs');
afterEach(fx.afterEachTest);
afterAll(fx.afterAllTests);

interface RunRow {
  scope: string;
  refresh: string;
  trigger: string;
  status: string;
  messages_served: number;
  messages_inserted: number;
  requests: number;
}

async function runRow(db: string, runId: number): Promise<RunRow> {
  return withMirror(db, (m) => sqlGet<RunRow>(m, `SELECT scope, refresh, trigger, status, messages_served, messages_inserted, requests FROM runs WHERE id = ?`, runId)!);
}

async function runFailures(db: string, runId: number): Promise<unknown[]> {
  return withMirror(db, (m) => sqlAll(m, `SELECT conversation_id, code, status, attempts FROM run_failures WHERE run_id = ?`, runId));
}

/** Adds a workspace job as a job scheduler's tick would (trigger `schedule`). */
async function scheduledTick(queue: Queue, mode: WorkspaceJobData['mode']): Promise<string> {
  const job = await queue.add(WORKSPACE_JOB, { mode, trigger: 'schedule' } satisfies WorkspaceJobData, jobOptions({ attempts: 3 }));
  return job.id!;
}

/** A messages page that breaks the documented shape (a message without `sender`): a SchemaError. */
const BROKEN_PAGE = JSON.stringify({
  data: [{ id: 'msg_1', content: 'x', visibility: 'global', created_at: '2025-01-01T00:00:00.000Z' }],
  meta: { current_page: 1, total_pages: 1, total_count: 1 },
});

function breakConversation(fake: FakeApi, id: string): void {
  fake.injectFault({ kind: 'status', status: 200, body: BROKEN_PAGE, match: { path: messagesPath(id) }, times: Infinity });
}

describe('figures of the daemon runs', () => {
  it('a scheduled run of an unchanged workspace records 0 messages served and only list requests; the first full one every message', async () => {
    const counts = [0, 1, 99, 100, 101, 250, 7];
    const total = counts.reduce((a, b) => a + b, 0);
    const ws = FakeWorkspace.fromCounts(counts);
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '3' }));
    // The daemon's start-up check of the workspace (one list request) is not part of any run.
    const atReady = fake.requests.length;
    const queue = fx.queueFor(prefix);

    const full = (await waitForJob(queue, await scheduledTick(queue, 'full'), 'completed', 20_000)).returnvalue as RunSummary;
    expect(full.messages.served).toBe(total);
    expect(await runRow(d.config.db, full.runId)).toEqual({
      scope: 'workspace',
      refresh: 'full',
      trigger: 'schedule',
      status: 'succeeded',
      messages_served: total,
      messages_inserted: total,
      requests: fake.requests.length - atReady,
    });

    const before = fake.requests.length;
    const quiet = (await waitForJob(queue, await scheduledTick(queue, 'regular'), 'completed', 20_000)).returnvalue as RunSummary;
    const asked = fake.requests.slice(before);
    expect(asked.length).toBeGreaterThan(0);
    expect(asked.filter((r) => r.path !== '/v1/conversations'), 'message requests of the quiet run').toEqual([]);
    expect(quiet).toMatchObject({ status: 'succeeded', messages: { served: 0, inserted: 0 }, requests: asked.length });
    expect(quiet.conversations).toMatchObject({ listed: counts.length, synced: counts.length });
    expect(await runRow(d.config.db, quiet.runId)).toEqual({
      scope: 'workspace',
      refresh: 'incremental',
      trigger: 'schedule',
      status: 'succeeded',
      messages_served: 0,
      messages_inserted: 0,
      requests: asked.length,
    });
  });
});

describe('the error decides retry', () => {
  it('an on-demand conversation job failing with a SchemaError is attempted once; its run records SCHEMA_ERROR', async () => {
    const ws = FakeWorkspace.fromCounts([4, 9]);
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const bad = ws.list()[0]!.id;
    breakConversation(fake, bad);
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '3' }));
    const queue = fx.queueFor(prefix);
    const id = await enqueueConversation(queue, bad, { accountId: ACCOUNT_ID, policy: { attempts: 3 } });
    const job = (await waitForJob(queue, id, 'failed', 15_000)) as Job<ConversationJobData>;
    // `failed` is final (a job to be retried would be `delayed`): one attempt of the three.
    expect(job.opts.attempts).toBe(3);
    expect(job.attemptsMade).toBe(1);
    expect((job.stacktrace ?? []).join('\n'), 'thrown as UnrecoverableError').toMatch(/UnrecoverableError/);
    expect(job.failedReason).toMatch(/^\[SCHEMA_ERROR\] /);
    expect(fake.requests.filter((r) => r.path === messagesPath(bad)), 'requests for the conversation').toHaveLength(1);
    expect(job.data.failure).toMatchObject({ id: bad, code: 'SCHEMA_ERROR', status: null, attempts: null });
    expect(job.data.tally).toEqual({ requests: 1, retries: 0, rateLimited: 0, served: 0 });
    const runId = job.data.ownRunId!;
    expect(await runRow(d.config.db, runId)).toMatchObject({ scope: 'conversations', trigger: 'on-demand', status: 'partial', messages_served: 0, requests: 1 });
    expect(await runFailures(d.config.db, runId)).toEqual([{ conversation_id: bad, code: 'SCHEMA_ERROR', status: null, attempts: null }]);
  });

  it('a child job failing with a SchemaError is attempted once; the workspace run records its code, and counts its request', async () => {
    const counts = [4, 9, 120];
    const ws = FakeWorkspace.fromCounts(counts);
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const bad = ws.list()[1]!.id;
    const http400 = ws.list()[2]!.id;
    breakConversation(fake, bad);
    fake.injectFault({ kind: 'status', status: 400, match: { path: messagesPath(http400) }, times: Infinity });
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '3' }));
    // The daemon's start-up check of the workspace (one list request) is not part of any run.
    const atReady = fake.requests.length;
    const queue = fx.queueFor(prefix);
    const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 3 } });
    const summary = (await waitForJob(queue, id, 'completed', 20_000)).returnvalue as RunSummary;

    for (const failing of [bad, http400]) {
      const child = (await Job.fromId(queue, childJobId(summary.runId, failing)))!;
      expect(await child.getState(), `state of ${failing}'s job`).toBe('failed');
      expect(child.attemptsMade, `attempts of ${failing}'s job`).toBe(1);
      expect(fake.requests.filter((r) => r.path === messagesPath(failing)), `requests for ${failing}`).toHaveLength(1);
    }
    expect(summary).toMatchObject({ scope: 'workspace', status: 'partial', messages: { served: 4, inserted: 4 } });
    expect(summary.failures.map((f) => [f.id, f.code]).sort()).toEqual([
      [bad, 'SCHEMA_ERROR'],
      [http400, 'HTTP_ERROR'],
    ].sort());
    const failures = await runFailures(d.config.db, summary.runId);
    expect(failures).toHaveLength(2);
    expect(failures).toEqual(
      expect.arrayContaining([
        { conversation_id: bad, code: 'SCHEMA_ERROR', status: null, attempts: null },
        { conversation_id: http400, code: 'HTTP_ERROR', status: 400, attempts: 1 },
      ]),
    );
    // Every request the run made is counted, the failed children's included.
    expect(await runRow(d.config.db, summary.runId)).toMatchObject({ status: 'partial', messages_served: 4, requests: fake.requests.length - atReady });
  });
});

describe('the dead letter list is bounded', () => {
  it('failed jobs are kept up to CONVO_MIRROR_FAILED_JOBS_MAX_COUNT, the newest; each failed run stays in the mirror', async () => {
    const ws = FakeWorkspace.fromCounts([1, 1, 1, 1, 1]);
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const ids = ws.list().map((c) => c.id);
    for (const id of ids) breakConversation(fake, id);
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix, { CONVO_MIRROR_FAILED_JOBS_MAX_COUNT: '3', CONVO_MIRROR_FAILED_JOBS_MAX_AGE: '2d' }));
    const queue = fx.queueFor(prefix);
    const policy = jobPolicyOf(d.config);
    const jobs: string[] = [];
    for (const id of ids) {
      const job = await enqueueConversation(queue, id, { accountId: ACCOUNT_ID, policy });
      await waitForJob(queue, job, 'failed', 15_000);
      jobs.push(job);
    }
    const failed = await queue.getFailed(0, -1);
    expect(failed.map((j) => j.id).sort()).toEqual(jobs.slice(-3).sort());
    expect(failed[0]!.opts.removeOnFail).toEqual({ age: 2 * 86_400, count: 3 });
    // Redis forgets the oldest; the mirror does not: five runs, each with its failure.
    expect(await withMirror(d.config.db, (m) => sqlAll(m, `SELECT count(*) AS n FROM run_failures WHERE code = 'SCHEMA_ERROR'`))).toEqual([{ n: 5 }]);
  });
});

describe('a quiet daemon adds no record every tick', () => {
  it('20 scheduled ticks on an unchanged workspace add no ledger record; the first tick after midnight UTC adds one, holding them all', async () => {
    const ws = FakeWorkspace.fromCounts([3, 120, 7]);
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const clock = testClock({ start: Date.parse('2026-11-25T09:00:00.000Z') });
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix), { clock });
    const queue = fx.queueFor(prefix);
    const tick = async () => {
      const id = await scheduledTick(queue, 'regular');
      const job = await waitForJob(queue, id, 'completed', 15_000);
      clock.advance(15 * 60_000);
      return job.returnvalue as RunSummary;
    };
    await tick(); // mirrors the workspace: its changes and its own line (2 records)
    const ledger = () => withMirror(d.config.db, async (m) => ({ records: (await m.ledgerEntries()).length, files: (await m.publishedFiles()).length, held: (await m.pendingExport()).runLines }));
    expect(await ledger()).toEqual({ records: 2, files: 3, held: 0 });
    for (let i = 1; i <= 20; i++) expect((await tick()).export.held?.lines).toBe(i);
    expect(await ledger()).toEqual({ records: 2, files: 3, held: 20 });
    clock.advance(24 * 3_600_000); // the next day
    await tick();
    expect(await ledger()).toEqual({ records: 3, files: 4, held: 1 });
  });
});
