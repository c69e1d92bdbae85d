/**
 * Issue 25, item 3 (a fleet): three `convo-mirror daemon` PROCESSES (BullMQ engine) on one queue
 * prefix, one PostgreSQL schema and one export directory mirror a 2,000-conversation workspace of
 * the fake; the daemon that listed the workspace (and so owns its run) is SIGKILLed once ~30 % of
 * the conversations are mirrored. BullMQ's stalled-job check (CONVO_MIRROR_JOB_LOCK_MS, 2 s here)
 * hands its conversation jobs to the other two, which resume from the checkpoints. Then: the
 * mirror equals the fake, one run row, every seq exported once with no gap and no duplicate line,
 * and `verify --deep` (the CLI) passes on the PostgreSQL mirror.
 *
 * The fake runs in this process; the daemons and the CLI are children (`npm run build` first).
 * Bounded waits; every child is killed in afterEach; the schema and the queue prefix are removed
 * in afterAll.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Job, type Queue } from 'bullmq';
import { openQueue } from '../jobs/queue.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, readExportLines, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, startDaemon, waitFor, within, type Started } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { NEVER } from './daemon-fixtures.js';
import { dropSchema, pgQuery, pgUrl, randomSchema } from './pg.js';
import { expectPgMirrorEqualsFake, exportedSeqs } from './fleet-helpers.js';
import fs from 'node:fs';

const prefixes = prefixSequence('fleet');
const schemas: string[] = [];
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
  for (const s of schemas) await dropSchema(s);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('a fleet of daemons on one PostgreSQL mirror', () => {
  it('three daemon processes mirror 2,000 conversations exactly; the run owner SIGKILLed at 30 %: one run, every seq once, verify --deep passes', async () => {
    const t0 = Date.now();
    const ws = FakeWorkspace.fromCounts(Array(2000).fill(3));
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const dir = tempDir('convo-mirror-fleet-');
    dirs.push(dir);
    const schema = randomSchema('fleet');
    schemas.push(schema);
    const prefix = prefixes.next();
    const env = cliEnv(fake, dir, {
      CONVO_MIRROR_DB: pgUrl(schema),
      REDIS_URL: redisUrl(),
      CONVO_MIRROR_QUEUE_PREFIX: prefix,
      CONVO_MIRROR_SCHEDULE: NEVER,
      CONVO_MIRROR_FULL_SCHEDULE: NEVER,
      CONVO_MIRROR_MAX_RETRIES: '1',
      // The stalled-job check: a dead daemon's jobs go back to the queue 2-4 s after their last lock renewal.
      CONVO_MIRROR_JOB_LOCK_MS: '2000',
      CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
      CONVO_MIRROR_CONCURRENCY: '4',
      LOG_LEVEL: 'info',
    });
    const exportDir = env.CONVO_MIRROR_EXPORT_DIR!;
    const queue = openQueue({ redisUrl: redisUrl(), prefix });
    queues.push(queue);
    const t = (name: string) => `"${schema}".${name}`;
    const mirrored = async () => (await pgQuery<{ n: number }>(`SELECT count(*)::int AS n FROM ${t('conversations')} WHERE last_synced_at IS NOT NULL`))[0]!.n;

    // Started one after the other: the first migrates the schema (two at once: test/fleet-start.test.ts).
    const daemons: Started[] = [];
    for (let i = 0; i < 3; i++) daemons.push(await startDaemon(env, [], 180_000));
    const asked = await run(['enqueue'], env);
    expect(asked.code, asked.stderr).toBe(0);
    const jobId = asked.stdout.trim();

    // The daemon that took the workspace job listed the workspace and started (owns) the run: kill that one.
    await waitFor(() => daemons.some((d) => d.stderr.includes('"name":"sync-workspace"')), 30_000, 'a daemon to take the workspace job');
    const victim = daemons.findIndex((d) => d.stderr.includes('"name":"sync-workspace"'));
    await waitFor(async () => (await mirrored()) >= 600, 90_000, '30 % of the conversations to be mirrored', 20);
    const killed = daemons[victim]!;
    killed.child.kill('SIGKILL');
    expect((await within(killed.done, 10_000, 'the killed daemon to end')).signal).toBe('SIGKILL');
    const atKill = await mirrored();
    // The victim was at work: conversation jobs were active in it (it had started some it never completed).
    const tKill = Date.now();
    const cut = jobsCut(killed.stderr);
    expect(atKill).toBeLessThan(2000);
    expect(cut.length, 'conversation jobs running in the killed daemon').toBeGreaterThan(0);
    // Read as they complete (the queue keeps only the last 1,000 completed jobs).
    const handover: { id: string; state: string | undefined; stalls: number }[] = [];
    for (const id of cut) {
      await waitFor(async () => (await (await Job.fromId(queue, id))?.getState()) === 'completed', 60_000, `job ${id} of the killed daemon to complete`, 50);
      const job = await Job.fromId(queue, id);
      handover.push({ id, state: await job?.getState(), stalls: job?.stalledCounter ?? -1 });
    }

    await waitFor(async () => (await (await Job.fromId(queue, jobId))?.getState()) === 'completed', 150_000, 'the workspace job to complete', 100);
    const tDone = Date.now();
    const survivors = daemons.filter((d) => d !== killed);
    // BullMQ's stalled-job check handed the killed daemon's running jobs to the others: each such
    // job counts a stall and was started again by a survivor. (A job the victim completed just
    // before the kill, its log line lost, has no stall.)
    const restarted = new Set(survivors.flatMap((d) => logLines(d.stderr).filter((l) => l.msg === 'job started').map((l) => l.job)));
    const handedOver = handover.filter((h) => h.stalls > 0);
    expect(handedOver.length, `jobs of the killed daemon handed over: ${JSON.stringify(handover)}`).toBeGreaterThan(0);
    expect(handedOver.filter((h) => !restarted.has(h.id)), 'jobs handed over but never started again').toEqual([]);
    for (const d of survivors) d.child.kill('SIGTERM');
    for (const d of survivors) expect((await within(d.done, 15_000, 'a daemon to stop')).code).toBe(0);

    // One run, whichever daemons did its parts.
    const runs = await pgQuery<{ id: string; scope: string; status: string; resumes: string; conversations_synced: string; conversations_failed: string }>(
      `SELECT id::text, scope, status, resumes::text, conversations_synced::text, conversations_failed::text FROM ${t('runs')} ORDER BY id`,
    );
    expect(runs, JSON.stringify(runs)).toEqual([expect.objectContaining({ id: '1', scope: 'workspace', status: 'succeeded', conversations_synced: '2000', conversations_failed: '0' })]);

    // The mirror equals the fake.
    await expectPgMirrorEqualsFake(schema, ws);

    // Every seq of the change log exported once, no gap, no duplicate line.
    const seqs = exportedSeqs(exportDir);
    const lastSeq = Number((await pgQuery<{ last: string }>(`SELECT last::text FROM ${t('change_seq')}`))[0]!.last);
    expect(seqs.length, 'export lines').toBe(lastSeq);
    expect(seqs, 'seqs 1..last, each once').toEqual(Array.from({ length: lastSeq }, (_, i) => i + 1));
    const lines = readExportLines(exportDir, 'messages');
    expect(lines.length).toBe(6000);
    expect(new Set(lines.map((l) => `${l.conversation_id}/${l.id}`)).size).toBe(6000);

    const verified = await run(['verify', '--deep'], env, 60_000);
    expect(verified.code, verified.stdout + verified.stderr).toBe(0);
    expect(verified.stdout).toMatch(/ok +deep:/);

    const files = (await pgQuery<{ n: number }>(`SELECT count(*)::int AS n FROM ${t('export_files')}`))[0]!.n;
    process.stderr.write(
      `fleet: 3 daemons, the run's owner SIGKILLed at ${atKill}/2000 conversations (${((tKill - t0) / 1000).toFixed(1)} s) with ${cut.length} jobs running (${handover.filter((h) => h.stalls > 0).length} handed over by the stalled-job check); ` +
        `mirror = fake (2000 conversations, 6000 messages); seqs 1..${lastSeq} each once in ${files} export files; runs ${runs.length} (${runs[0]!.status}, resumes ${runs[0]!.resumes}); ` +
        `verify --deep ok; all done ${((tDone - tKill) / 1000).toFixed(1)} s after the kill, ${((Date.now() - t0) / 1000).toFixed(1)} s in all\n`,
    );
  }, 300_000);
});

/** The JSON log lines of a daemon's stderr (other lines skipped). */
function logLines(stderr: string): { msg?: string; job?: string; name?: string }[] {
  return stderr.split('\n').flatMap((l) => {
    try {
      return l.startsWith('{') ? [JSON.parse(l) as { msg?: string; job?: string; name?: string }] : [];
    } catch {
      return [];
    }
  });
}

/** The ids of the conversation jobs a daemon started and never completed nor failed (by its log). */
function jobsCut(stderr: string): string[] {
  const lines = logLines(stderr);
  const ended = new Set(lines.filter((l) => l.msg === 'job completed' || l.msg === 'job failed').map((l) => l.job));
  return [...new Set(lines.filter((l) => l.msg === 'job started' && l.name === 'sync-conversation' && !ended.has(l.job)).map((l) => l.job!))];
}
