/**
 * The daemon as a process: `node dist/src/cli/index.js daemon|enqueue|status|retry-failed` (built by
 * `npm test`) against the fake API in this process and the test run's real Redis
 * (test/global-setup.ts), on 127.0.0.1, with real SQLite and export files in temp dirs.
 *
 * Covered: on-demand sync of one conversation (and of messages added at the fake afterwards), a
 * 401 that fails once and lands in the dead letter list (status, retry-failed, fixed key), SIGTERM
 * during a long conversation (bounded grace, resume from the checkpoint, no duplicate export), a
 * SIGKILLed worker's stalled job picked up by another daemon, `status` with and without Redis, and
 * the daemon's refusals (Redis unreachable, invalid cron, mirror in use).
 *
 * Each test has its own queue prefix (derived from this file's random prefix; all removed in
 * afterAll) and its own temp dir. Every wait is bounded; every child is killed in afterEach.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import { Job, type Queue } from 'bullmq';
import { openQueue, schedulerId } from '../jobs/queue.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir as makeTempDir, withMirror } from './helpers.js';
import { assertBuilt, killLeftovers, run, start, startDaemon, waitFor, within, type Ran, type Started } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { sqlAll, sqlGet } from './sql.js';
import { NEVER, expectConversationMirrored, expectExportedOnce, jobState, messagesPath } from './daemon-fixtures.js';

/** The job schedulers of the test workspace. */
const REGULAR = schedulerId('regular', ACCOUNT_ID);
const FULL = schedulerId('full', ACCOUNT_ID);

const prefixes = prefixSequence('daemon-cli');
const testPrefix = () => prefixes.next();

const dirs: string[] = [];
const fakes: FakeApi[] = [];
const queues: Queue[] = [];

function tempDir(): string {
  const d = makeTempDir('convo-mirror-daemon-cli-');
  dirs.push(d);
  return d;
}

/** SIGTERMs a daemon and waits (bounded) for it to exit. */
async function stopDaemon(d: Started, timeoutMs = 10_000): Promise<Ran> {
  d.child.kill('SIGTERM');
  return within(d.done, timeoutMs, 'daemon shutdown');
}

async function fakeApi(ws: FakeWorkspace): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(fake);
  return fake;
}

/** Environment of a daemon/enqueue/status child for `fake`, `dir` and `prefix`, small timings. */
function env(fake: FakeApi, dir: string, prefix: string, extra: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  return cliEnv(fake, dir, {
    REDIS_URL: redisUrl(),
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_MAX_RPS: '0',
    CONVO_MIRROR_MAX_RETRIES: '1',
    CONVO_MIRROR_JOB_LOCK_MS: '2000',
    CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
    CONVO_MIRROR_CONCURRENCY: '2',
    ...extra,
  });
}

function queueFor(prefix: string): Queue {
  const q = openQueue({ redisUrl: redisUrl(), prefix });
  queues.push(q);
  return q;
}

const pageOf = (r: { query: Record<string, string> }) => Number(r.query['page'] ?? '1');

interface RunRow {
  id: number;
  mode: string;
  trigger: string;
  status: string;
  started_at: string;
  ended_at: string | null;
}

async function runsOf(db: string): Promise<RunRow[]> {
  return withMirror(db, (m) => sqlAll<RunRow>(m, `SELECT id, scope AS mode, trigger, status, started_at, ended_at FROM runs ORDER BY id`));
}

/** The conversation's checkpoint (`next_page`), if a crawl left one. */
async function checkpointOf(db: string, id: string): Promise<{ next_page: number } | undefined> {
  return withMirror(db, (m) => sqlGet<{ next_page: number }>(m, `SELECT next_page FROM checkpoints WHERE account_id = ? AND conversation_id = ?`, ACCOUNT_ID, id));
}

/** The daemon's JSON log lines with message `msg`. */
function logLines(stderr: string, msg: string): Record<string, unknown>[] {
  return stderr
    .split('\n')
    .filter((l) => l.includes(`"msg":"${msg}"`))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

beforeAll(assertBuilt);

afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(queues.splice(0).map((q) => within(q.close(), 5_000, 'closing a queue')));
  await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
});

afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('on-demand sync of one conversation', () => {
  it('enqueue --conversation ID --wait mirrors exactly that conversation, then its new messages', async () => {
    const ws = FakeWorkspace.fromCounts([120, 30, 7]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const e = env(fake, dir, testPrefix());
    const db = e.CONVO_MIRROR_DB!;
    const exportDir = e.CONVO_MIRROR_EXPORT_DIR!;
    const x = ws.list()[0]!.id;
    const daemon = await startDaemon(e);
    // The daemon's start-up check read the first list page; what follows is the job's.
    expect(fake.requests.map((r) => r.path)).toEqual(['/v1/conversations']);
    fake.requests.length = 0;

    const first = await run(['enqueue', '--conversation', x, '--wait', '--timeout', '15000'], e);
    expect(first.code, first.stderr).toBe(0);
    const jobId = first.stdout.trim();
    expect(jobId).toMatch(/^\S+$/);
    expect(first.stderr).toContain(`job ${jobId}: completed`);
    await expectConversationMirrored(db, ws, x);
    // Only that conversation was asked for at the fake.
    expect(fake.requests.every((r) => r.path === messagesPath(x))).toBe(true);
    const runs = await runsOf(db);
    expect(runs).toHaveLength(1);
    expect(runs[0]).toMatchObject({ mode: 'conversations', status: 'succeeded' });
    expect(runs[0]!.ended_at).not.toBeNull();
    expectExportedOnce(exportDir, ws, x);
    process.stderr.write(`daemon-cli: on-demand latency (enqueue --wait, 120 messages): ${first.ms} ms\n`);

    // New messages at the fake, then another on-demand job.
    ws.appendMessages(x, 7);
    const second = await run(['enqueue', '--conversation', x, '--wait', '--timeout', '15000'], e);
    expect(second.code, second.stderr).toBe(0);
    expect(second.stdout.trim()).not.toBe(jobId);
    await expectConversationMirrored(db, ws, x);
    expect(ws.get(x)!.messages).toHaveLength(127);
    expectExportedOnce(exportDir, ws, x);
    expect((await runsOf(db)).map((r) => `${r.mode} ${r.status}`)).toEqual(['conversations succeeded', 'conversations succeeded']);

    const stopped = await stopDaemon(daemon);
    expect(stopped.code, stopped.stderr.slice(-1500)).toBe(0);
  });

  it('enqueue --wait asked while that conversation runs returns only after the run it asked for', async () => {
    const ws = FakeWorkspace.fromCounts([150, 5]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const prefix = testPrefix();
    const e = env(fake, dir, prefix);
    const db = e.CONVO_MIRROR_DB!;
    const x = ws.list()[0]!.id;
    // The first run's first page is slow: the job is active while we ask again. The follow-up run's
    // first page is slow too, so an answer that comes before the follow-up finished is caught.
    fake.injectFault({ kind: 'slow', delayMs: 3000, match: { path: messagesPath(x), page: 1 }, times: 1 });
    fake.injectFault({ kind: 'slow', delayMs: 1500, match: { path: messagesPath(x), page: 1 }, times: 1 });
    const daemon = await startDaemon(e);
    const first = await run(['enqueue', '--conversation', x], e);
    expect(first.code, first.stderr).toBe(0);
    const firstId = first.stdout.trim();
    const queue = queueFor(prefix);
    await waitFor(async () => (await jobState(queue, firstId)) === 'active', 5_000, 'the first job to be active');
    await waitFor(() => fake.requests.some((r) => r.path === messagesPath(x)), 5_000, 'the first crawl to start');

    // Asked while the first run is active: the answer must cover a run that starts after the ask
    // (the first run may have read page 1 before whatever the asker wants to see).
    const asked = await run(['enqueue', '--conversation', x, '--wait', '--timeout', '15000'], e);
    expect(asked.code, asked.stderr).toBe(0);
    // Precondition: the ask landed while the first job was active (deduplication answered with it).
    expect(asked.stdout.trim(), 'the job id the ask was answered with').toBe(firstId);
    // When enqueue --wait returned, the run it asked for (the follow-up, which can only start after
    // the ask) had ended, and succeeded, as had the first.
    const runsAtReturn = await runsOf(db);
    expect(runsAtReturn.map((r) => r.status), 'runs when enqueue --wait returned').toEqual(['succeeded', 'succeeded']);
    expect(asked.stderr.match(/: completed/g), 'outcomes told: the first run and the follow-up').toHaveLength(2);

    await waitFor(async () => (await queue.getJobCounts('completed')).completed === 2, 10_000, 'two completed jobs');
    const stopped = await stopDaemon(daemon);
    expect(stopped.code).toBe(0);
  });
});

describe('failures', () => {
  it('a daemon whose only workspace refuses its key does not say ready: exit 2 at start, naming CONVO_MIRROR_API_KEY, the key never shown', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([3]));
    const bad = env(fake, tempDir(), testPrefix(), { CONVO_MIRROR_API_KEY: 'wrong-key-0000' });
    const r = await run(['daemon'], bad, 10_000);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(/convo-mirror: authentication error: GET \/v1\/conversations\?page=1&per_page=100 answered 401: the API rejected the API key: check CONVO_MIRROR_API_KEY/);
    expect(r.stderr).not.toContain('daemon ready');
    expect(r.stdout + r.stderr).not.toContain('wrong-key-0000');
    // One request: the check of the workspace's list; no job ran.
    expect(fake.requests.map((q) => [q.path, q.status])).toEqual([['/v1/conversations', 401]]);
  });

  it('a 401 fails once, lands in failed, shows in status, and retry-failed re-queues it for a daemon once the key is accepted again', async () => {
    const ws = FakeWorkspace.fromCounts([40, 3]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const prefix = testPrefix();
    const good = env(fake, dir, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '5' });
    const x = ws.list()[0]!.id;
    const queue = queueFor(prefix);

    // The key passes the daemon's start-up check, then is refused for this conversation (revoked for a moment).
    const wrong = await startDaemon(good);
    fake.injectFault({ kind: 'status', status: 401, match: { path: messagesPath(x) }, times: 1 });
    const asked = await run(['enqueue', '--conversation', x, '--wait', '--timeout', '15000'], good);
    expect(asked.code, asked.stderr).toBe(1);
    const jobId = asked.stdout.trim();
    expect(asked.stderr).toContain(`job ${jobId}:`);
    expect(await jobState(queue, jobId)).toBe('failed');
    const job = (await Job.fromId(queue, jobId))!;
    expect(job.attemptsMade).toBe(1);
    expect(job.opts.attempts).toBe(5);
    expect(job.failedReason).toMatch(/401/);
    expect(job.failedReason).not.toContain(API_KEY);
    expect((job.stacktrace ?? []).join('\n'), 'thrown as UnrecoverableError').toMatch(/UnrecoverableError/);
    // `failed` is final: a job to be retried would be `delayed` (its backoff) instead.
    expect(fake.requests.filter((r) => r.path === messagesPath(x)).map((r) => r.status)).toEqual([401]);

    const status = await run(['status', '--json'], good);
    expect(status.code, status.stderr).toBe(0);
    const s = JSON.parse(status.stdout) as { queue: { counts: Record<string, number>; failed: { id: string; conversation_id?: string; attempts: number; reason: string }[] } };
    expect(s.queue.counts.failed).toBe(1);
    expect(s.queue.failed).toHaveLength(1);
    expect(s.queue.failed[0]).toMatchObject({ id: jobId, conversation_id: x, attempts: 1 });
    expect(s.queue.failed[0]!.reason).toMatch(/401/);

    expect((await stopDaemon(wrong)).code).toBe(0);
    const retried = await run(['retry-failed'], good);
    expect(retried.code, retried.stderr).toBe(0);
    expect(retried.stdout).toContain('re-queued 1 failed job');
    expect(retried.stdout).toContain(jobId);
    expect(await jobState(queue, jobId)).toBe('waiting');

    const right = await startDaemon(good);
    await waitFor(async () => (await jobState(queue, jobId)) === 'completed', 10_000, 'the re-queued job to complete');
    await expectConversationMirrored(good.CONVO_MIRROR_DB!, ws, x);
    expect((await queue.getJobCounts('failed')).failed).toBe(0);
    expect((await stopDaemon(right)).code).toBe(0);
  });
});

describe('interruptions', () => {
  it('SIGTERM during a long conversation exits 0 within the grace period; a restarted daemon resumes from the checkpoint', async () => {
    const ws = FakeWorkspace.fromCounts([1200]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const prefix = testPrefix();
    const graceMs = 1500;
    const e = env(fake, dir, prefix, { CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: String(graceMs) });
    const db = e.CONVO_MIRROR_DB!;
    const x = ws.list()[0]!.id;
    fake.injectFault({ kind: 'slow', delayMs: 400, match: { path: messagesPath(x) }, times: Infinity });
    const queue = queueFor(prefix);

    const first = await startDaemon(e);
    const asked = await run(['enqueue', '--conversation', x], e);
    expect(asked.code, asked.stderr).toBe(0);
    const jobId = asked.stdout.trim();
    const served = () => fake.requests.filter((r) => r.path === messagesPath(x) && r.status === 200).length;
    await waitFor(() => served() >= 3, 15_000, '3 pages served');

    first.child.kill('SIGTERM');
    const ended = await within(first.done, graceMs + 5_000, 'the first daemon to exit');
    expect(ended.code, ended.stderr.slice(-2000)).toBe(0);
    // The daemon's own record of its shutdown: the grace period ran out, the running job was aborted
    // and ended at once (never left behind to its lock: no "still running" warning).
    const [stoppedLine] = logLines(ended.stderr, 'daemon stopped');
    expect(stoppedLine, 'the daemon stopped log line').toMatchObject({ forced: true });
    expect(logLines(ended.stderr, 'jobs still running after the abort: closing without them; they are picked up again from their checkpoints once their lock expires')).toHaveLength(0);
    process.stderr.write(`daemon-cli: shutdown after SIGTERM during a crawl: ${String(stoppedLine!['shutdown_ms'])} ms (grace ${graceMs} ms)\n`);
    const checkpoint = await checkpointOf(db, x);
    expect(checkpoint, 'a checkpoint after the interrupted crawl').toBeDefined();
    expect(checkpoint!.next_page).toBeGreaterThan(1);
    expect(['delayed', 'waiting']).toContain(await jobState(queue, jobId));

    fake.clearFaults();
    const mark = fake.requests.length;
    const second = await startDaemon(e);
    await waitFor(async () => (await jobState(queue, jobId)) === 'completed', 15_000, 'the retried job to complete');
    const secondLife = fake.requests.slice(mark).filter((r) => r.path === messagesPath(x));
    expect(secondLife.length).toBeGreaterThan(0);
    expect(Math.min(...secondLife.map(pageOf)), 'first page requested after the restart').toBe(checkpoint!.next_page - 1);
    await expectConversationMirrored(db, ws, x);
    expectExportedOnce(e.CONVO_MIRROR_EXPORT_DIR!, ws, x);
    const job = (await Job.fromId(queue, jobId))!;
    expect(job.returnvalue).toMatchObject({ result: { id: x, status: 'synced', messageCount: 1200, resumed: true } });
    expect((await stopDaemon(second)).code).toBe(0);
  });

  it("a SIGKILLed daemon's stalled job is picked up by another daemon after the lock expires", async () => {
    const ws = FakeWorkspace.fromCounts([1200]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const prefix = testPrefix();
    const e = env(fake, dir, prefix, { CONVO_MIRROR_JOB_LOCK_MS: '2000' });
    const db = e.CONVO_MIRROR_DB!;
    const x = ws.list()[0]!.id;
    fake.injectFault({ kind: 'slow', delayMs: 400, match: { path: messagesPath(x) }, times: Infinity });
    const queue = queueFor(prefix);

    const a = await startDaemon(e);
    const asked = await run(['enqueue', '--conversation', x], e);
    expect(asked.code, asked.stderr).toBe(0);
    const jobId = asked.stdout.trim();
    await waitFor(() => fake.requests.filter((r) => r.path === messagesPath(x) && r.status === 200).length >= 3, 15_000, '3 pages served');
    a.child.kill('SIGKILL');
    const killed = await within(a.done, 5_000, 'daemon A to die');
    expect(killed.signal).toBe('SIGKILL');
    expect(await jobState(queue, jobId)).toBe('active'); // still locked by the dead worker
    const checkpoint = await checkpointOf(db, x);
    expect(checkpoint?.next_page).toBeGreaterThan(1);

    fake.clearFaults();
    const mark = fake.requests.length;
    const b = await startDaemon(e); // same mirror: the dead process's writer lock is taken over
    await waitFor(async () => (await jobState(queue, jobId)) === 'completed', 15_000, 'the stalled job to complete on daemon B');
    const secondLife = fake.requests.slice(mark).filter((r) => r.path === messagesPath(x));
    // The gap in the fake's request log between daemon A's last request and daemon B's first.
    const pickupMs = secondLife[0]!.at - fake.requests[mark - 1]!.at;
    expect(Math.min(...secondLife.map(pageOf)), 'first page requested by daemon B').toBe(checkpoint!.next_page - 1);
    const job = (await Job.fromId(queue, jobId))!;
    expect(job.stalledCounter).toBeGreaterThanOrEqual(1);
    expect(job.returnvalue).toMatchObject({ result: { id: x, messageCount: 1200, resumed: true } });
    await expectConversationMirrored(db, ws, x);
    expectExportedOnce(e.CONVO_MIRROR_EXPORT_DIR!, ws, x);
    expect(b.stderr).toContain('"msg":"job started"');
    expect((await stopDaemon(b)).code).toBe(0);
    process.stderr.write(`daemon-cli: stalled job picked up ${pickupMs} ms after daemon A's last request\n`);
  });
});

describe('a daemon configured by a one-entry workspaces file', () => {
  it("registers that entry's schedules and mirrors with that entry's key", async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const prefix = testPrefix();
    const file = `${dir}/workspaces.json`;
    fs.writeFileSync(file, JSON.stringify([{ account_id: ACCOUNT_ID, api_key_env: 'ENTRY_KEY', schedule: '15 3 1 1 *', full_schedule: '45 4 2 1 *' }]));
    const e = env(fake, dir, prefix, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_API_KEY: undefined, CONVO_MIRROR_WORKSPACES: file, ENTRY_KEY: API_KEY });
    const daemon = await startDaemon(e);
    const x = ws.list()[0]!.id;
    const asked = await run(['enqueue', '--conversation', x, '--wait', '--timeout', '15000'], e);
    expect(asked.code, asked.stderr).toBe(0);
    expect((await stopDaemon(daemon)).code).toBe(0);
    const schedulers = await queueFor(prefix).getJobSchedulers(0, -1, true);
    expect(Object.fromEntries(schedulers.map((j) => [j.key, j.pattern]))).toEqual({ [REGULAR]: '15 3 1 1 *', [FULL]: '45 4 2 1 *' });
    await expectConversationMirrored(e.CONVO_MIRROR_DB!, ws, x);
  });
});

describe('status', () => {
  it('shows queue counts, both schedulers with their next run, and failed jobs; without Redis it still shows the mirror', async () => {
    const ws = FakeWorkspace.fromCounts([12, 3]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const prefix = testPrefix();
    const e = env(fake, dir, prefix, { CONVO_MIRROR_SCHEDULE: '15 3 1 1 *', CONVO_MIRROR_FULL_SCHEDULE: '45 4 2 1 *' });
    const queue = queueFor(prefix);
    const daemon = await startDaemon(e);
    const x = ws.list()[0]!.id;
    await run(['enqueue', '--conversation', x, '--wait', '--timeout', '15000'], e);
    // A conversation whose page breaks the documented shape: a SchemaError is permanent, one attempt.
    const missing = ws.list()[1]!.id;
    const broken = JSON.stringify({ data: [{ id: 'm1', content: 'x', visibility: 'global', created_at: '2025-01-01T00:00:00.000Z' }], meta: { current_page: 1, total_pages: 1, total_count: 1 } });
    fake.injectFault({ kind: 'status', status: 200, body: broken, match: { path: messagesPath(missing) }, times: Infinity });
    const failedRun = await run(['enqueue', '--conversation', missing, '--wait', '--timeout', '15000'], e);
    expect(failedRun.code).toBe(1);
    const failedId = failedRun.stdout.trim();
    expect(await jobState(queue, failedId)).toBe('failed');
    expect((await stopDaemon(daemon)).code).toBe(0);

    const json = await run(['status', '--json'], e);
    expect(json.code, json.stderr).toBe(0);
    const s = JSON.parse(json.stdout) as {
      counts: Record<string, number>;
      queue: {
        prefix: string;
        counts: Record<string, number>;
        schedulers: { id: string; pattern: string; tz?: string; next?: string }[];
        failed: { id: string; conversation_id?: string; attempts: number; reason: string }[];
      };
    };
    expect(s.queue.prefix).toBe(prefix);
    expect(s.queue.counts).toMatchObject({ waiting: 0, active: 0, failed: 1, completed: 1, delayed: 2 });
    const byId = new Map(s.queue.schedulers.map((x) => [x.id, x]));
    expect([...byId.keys()].sort()).toEqual([FULL, REGULAR]);
    expect(byId.get(REGULAR)).toMatchObject({ pattern: '15 3 1 1 *' });
    expect(byId.get(FULL)).toMatchObject({ pattern: '45 4 2 1 *' });
    expect(new Date(Date.parse(byId.get(FULL)!.next!)).toISOString()).toMatch(/-01-02T04:45:00\.000Z$/);
    expect(new Date(Date.parse(byId.get(REGULAR)!.next!)).toISOString()).toMatch(/-01-01T03:15:00\.000Z$/);
    expect(s.queue.failed).toEqual([expect.objectContaining({ id: failedId, conversation_id: missing, attempts: 1 })]);

    const text = await run(['status'], e);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain(`queue ${prefix} on `);
    expect(text.stdout).toMatch(/waiting 0, active 0, delayed 2, failed 1, completed 1/);
    expect(text.stdout).toContain(`${REGULAR}: 15 3 1 1 * (UTC), next run `);
    expect(text.stdout).toMatch(/workspace-regular:\S+: 15 3 1 1 \* \(UTC\), next run \d{4}-01-01T03:15:00\.000Z/);
    expect(text.stdout).toMatch(/workspace-full:\S+: 45 4 2 1 \* \(UTC\), next run \d{4}-01-02T04:45:00\.000Z/);
    expect(text.stdout).toContain('failed jobs');
    expect(text.stdout).toMatch(new RegExp(`${failedId} sync-conversation ${missing} after 1 attempts`));

    // Redis gone: the mirror part still prints, the queue is said to be unavailable, exit 0.
    const dead = { ...e, REDIS_URL: 'redis://127.0.0.1:1' };
    const noRedis = await run(['status'], dead);
    expect(noRedis.code, noRedis.stderr).toBe(0);
    expect(noRedis.stdout).toContain(`mirror ${e.CONVO_MIRROR_DB}`);
    expect(noRedis.stdout).toContain('last runs:');
    expect(noRedis.stdout).toMatch(/queue: unavailable \(.*REDIS_URL.*127\.0\.0\.1:1/);
    expect(s.counts['runs']).toBe(2);
    expect(noRedis.stdout).toContain(`  ${'runs'.padEnd(26)} 2\n`);
  });
});

describe('daemon refusals', () => {
  it('exits 2 with one line naming REDIS_URL when Redis is unreachable, naming --schedule when the cron is invalid, and "in use" on a busy mirror', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const e = env(fake, dir, testPrefix());

    const noRedis = await run(['daemon'], { ...e, REDIS_URL: 'redis://127.0.0.1:1' }, 15_000);
    expect(noRedis.code).toBe(2);
    const lines = noRedis.stderr.trim().split('\n');
    expect(lines, noRedis.stderr).toHaveLength(1);
    expect(lines[0]).toContain('REDIS_URL');
    expect(lines[0]).toContain('127.0.0.1:1');

    const badCron = await run(['daemon', '--schedule', 'every now and then'], e, 15_000);
    expect(badCron.code).toBe(2);
    expect(badCron.stderr.trim().split('\n')).toHaveLength(1);
    expect(badCron.stderr).toContain('--schedule');
    const badEnvCron = await run(['daemon'], { ...e, CONVO_MIRROR_FULL_SCHEDULE: '61 * * * *' }, 15_000);
    expect(badEnvCron.code).toBe(2);
    expect(badEnvCron.stderr).toContain('CONVO_MIRROR_FULL_SCHEDULE');

    const first = await startDaemon(e);
    const second = await run(['daemon'], e, 15_000);
    expect(second.code).toBe(2);
    expect(second.stderr).toContain('in use');
    expect(second.stderr).toContain(String(first.child.pid));
    expect(first.child.exitCode).toBeNull(); // the first one is unaffected
    expect((await stopDaemon(first)).code).toBe(0);
  });
});
