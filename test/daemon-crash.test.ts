/**
 * Issue 8, item 5 (SIGKILL) and issue 14, item 9 (SIGTERM, a graceful restart): a daemon stopped in the middle of a workspace run, then restarted, finishes the
 * remaining conversation jobs inside that same run and publishes them in one batch; it does not
 * shatter the run into one recorded run and one export publication per remaining conversation.
 *
 * `node dist/src/cli/index.js daemon` (built by `npm test`) against the fake API in this process and the
 * test run's real Redis, with a real SQLite mirror and export files in a temp dir. Bounded waits;
 * every child is killed in afterEach; the queue prefix is removed in afterAll.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { Job, type Queue } from 'bullmq';
import { openQueue } from '../jobs/queue.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, mirrorEqualsFake, readExportLines, tempDir as makeTempDir, withMirror } from './helpers.js';
import { assertBuilt, killLeftovers, run, startDaemon, waitFor, within } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { sqlAll, sqlValue } from './sql.js';
import { NEVER } from './daemon-fixtures.js';

const prefixes = prefixSequence('daemon-crash');
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
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('a daemon killed in the middle of a workspace run', () => {
  it.each(['SIGKILL', 'SIGTERM'] as const)('with 2,000 conversations, %s at 30 % and a restart: one run, a handful of export files, an exact mirror, no duplicate line', async (signal) => {
    const ws = FakeWorkspace.fromCounts(Array(2000).fill(3));
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const dir = makeTempDir('convo-mirror-daemon-crash-');
    dirs.push(dir);
    const prefix = prefixes.next();
    const env = cliEnv(fake, dir, {
      REDIS_URL: redisUrl(),
      CONVO_MIRROR_QUEUE_PREFIX: prefix,
      CONVO_MIRROR_SCHEDULE: NEVER,
      CONVO_MIRROR_FULL_SCHEDULE: NEVER,
      CONVO_MIRROR_MAX_RETRIES: '1',
      CONVO_MIRROR_JOB_LOCK_MS: '2000',
      CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
      CONVO_MIRROR_CONCURRENCY: '4',
      LOG_LEVEL: 'info',
    });
    const db = env.CONVO_MIRROR_DB!;
    const exportDir = env.CONVO_MIRROR_EXPORT_DIR!;
    const queue = openQueue({ redisUrl: redisUrl(), prefix });
    queues.push(queue);
    const crawled = () => new Set(fake.requests.filter((r) => r.path.endsWith('/messages') && r.status === 200).map((r) => r.path)).size;

    const a = await startDaemon(env, [], 120_000);
    const asked = await run(['enqueue'], env);
    expect(asked.code, asked.stderr).toBe(0);
    const jobId = asked.stdout.trim();
    await waitFor(() => crawled() >= 600, 60_000, '30 % of the conversations to be crawled', 5);
    a.child.kill(signal);
    const ended = await within(a.done, 10_000, 'daemon A to end');
    // SIGKILL: a crash. SIGTERM: a graceful stop (running jobs get the 2 s grace, then are cut short).
    expect(signal === 'SIGKILL' ? ended.signal : ended.code).toBe(signal === 'SIGKILL' ? 'SIGKILL' : 0);
    const atKill = crawled();
    expect(atKill).toBeLessThan(2000);

    const b = await startDaemon(env, [], 120_000);
    await waitFor(async () => (await (await Job.fromId(queue, jobId))?.getState()) === 'completed', 90_000, 'the workspace job to complete', 100);
    b.child.kill('SIGTERM');
    expect((await within(b.done, 10_000, 'daemon B to stop')).code).toBe(0);

    const runs = await withMirror(db, (m) =>
      sqlAll<{ id: number; scope: string; refresh: string; trigger: string; status: string; resumes: number; conversations_synced: number }>(
        m,
        `SELECT id, scope, refresh, trigger, status, resumes, conversations_synced FROM runs ORDER BY id`,
      ),
    );
    expect(runs.length, JSON.stringify(runs)).toBeLessThanOrEqual(3);
    expect(runs).toEqual([{ id: 1, scope: 'workspace', refresh: 'incremental', trigger: 'on-demand', status: 'succeeded', resumes: 1, conversations_synced: 2000 }]);
    const files = await withMirror(db, (m) => sqlValue(m, `SELECT count(*) FROM export_files`));
    expect(files).toBeLessThanOrEqual(12);
    await withMirror(db, (m) => {
      const eq = mirrorEqualsFake(m, ws);
      expect(eq.ok, eq.detail).toBe(true);
    });
    const lines = readExportLines(exportDir, 'messages');
    expect(lines.length).toBe(6000);
    expect(new Set(lines.map((l) => `${l.conversation_id}/${l.id}`)).size).toBe(6000);
    expect(new Set(lines.map((l) => l.seq)).size).toBe(6000);
    expect(fs.readdirSync(path.join(exportDir, 'messages'))).toEqual([`account=${ACCOUNT_ID}`]);
    process.stderr.write(`daemon-crash: ${signal} at ${atKill}/2000 conversations; runs ${runs.length}, export files ${files}\n`);
  });
});
