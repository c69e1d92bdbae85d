/**
 * The daemon's `erase` job (issue 26 item 5): `runDaemon` in this process (BullMQ on the test
 * run's real Redis, a random prefix; a SQLite mirror synced from the fake, and for the first case a
 * PostgreSQL one in a schema of its own too) with its logs kept, and
 * the built CLI as the user runs it.
 *
 * - `enqueue --erase-sender ID --reason TEXT --wait` exits 0 and says what the job did; the mirror
 *   and the archive are erased (no published file holds the message's text, no published message
 *   line the sender id), `verify --deep` passes; the subject's id is in no output: not the CLI's, not the
 *   daemon's logs, not the job's result, and no key left under the prefix (the job is removed on
 *   completion); `/metrics` counts the erasure.
 * - An invalid request (a blank reason, queued past the CLI's checks) fails at its first attempt,
 *   unretried, with one line that names the job and not the subject, and its data keeps no subject.
 * - The CLI refuses an erasure without a reason, or with --full (exit 2, nothing queued).
 * - `status` shows an erasure the mirror recorded whose archive step has not run (pending).
 */
import fs from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';
import zlib from 'node:zlib';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Job, type Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import type { Config } from '../config/index.js';
import { runDaemon, type DaemonExit } from '../jobs/daemon.js';
import { ERASE_JOB, enqueueErase, enqueueWorkspace, redisConnection, type EraseJobData } from '../jobs/queue.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import type { RunSummary } from '../src/run/index.js';
import { assertBuilt, killLeftovers, run, waitFor, within } from './children.js';
import { daemonFixtures, waitForJob } from './daemon-fixtures.js';
import { ACCOUNT_ID, cliEnv, harnessPool, snapshotFiles, withMirror } from './helpers.js';
import { dropSchema, pgUrl, randomSchema } from './pg.js';
import { redisUrl } from './redis.js';

const fx = daemonFixtures('erase-job');
const pool = harnessPool();
const stops: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  await Promise.allSettled(stops.splice(0).map((s) => s()));
  await fx.afterEachTest();
  await killLeftovers();
  await pool.closeAll();
});
const schemas: string[] = [];
afterAll(async () => {
  await fx.afterAllTests();
  for (const s of schemas) await dropSchema(s);
});
beforeAll(assertBuilt);

const SECRET = 'Wombat-Tiger-8830 card ending';

/** A daemon in this process whose log lines are kept (`logs`), its HTTP server on a free port. */
async function loggedDaemon(config: Config): Promise<{ url: string; logs: string[]; stop: () => Promise<DaemonExit> }> {
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      logs.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      cb();
    },
  });
  let release!: () => void;
  const stop = new Promise<void>((r) => (release = r));
  let ready!: (r: { httpUrl: string | undefined }) => void;
  const readyP = new Promise<{ httpUrl: string | undefined }>((r) => (ready = r));
  const done = runDaemon({ config, logger: pino({ level: 'debug' }, sink), stop, onReady: ready, httpListen: { host: '127.0.0.1', port: 0 } });
  let stopped: Promise<DaemonExit> | undefined;
  const stopIt = () => (stopped ??= (release(), within(done, 15_000, 'daemon shutdown')));
  stops.push(stopIt);
  const failedEarly = done.then(() => Promise.reject(new Error('daemon ended before it was ready')));
  const { httpUrl } = await within(Promise.race([readyP, failedEarly]), 15_000, 'daemon startup');
  return { url: httpUrl!, logs, stop: stopIt };
}

/** Which files under `dir` hold `needle` (decompressed for `.gz`). */
function holding(dir: string, needle: string): string[] {
  return [...snapshotFiles(dir)].filter(([p, b]) => (p.endsWith('.gz') ? zlib.gunzipSync(b) : b).includes(needle)).map(([p]) => p);
}

/** Every value of every key under `prefix`, as text (hashes, streams, lists, sets, strings). */
async function redisDump(prefix: string): Promise<string> {
  const r = new Redis(redisConnection(redisUrl()));
  try {
    const out: string[] = [];
    for (const key of await r.keys(`${prefix}:*`)) {
      const type = await r.type(key);
      const value =
        type === 'hash' ? await r.hgetall(key) : type === 'stream' ? await r.xrange(key, '-', '+') : type === 'list' ? await r.lrange(key, 0, -1) : type === 'zset' ? await r.zrange(key, 0, -1) : type === 'set' ? await r.smembers(key) : await r.get(key);
      out.push(`${key} ${JSON.stringify(value)}`);
    }
    return out.join('\n');
  } finally {
    r.disconnect();
  }
}

/** A daemon over a fake whose customer of conversation 1 wrote {@link SECRET}, after a first workspace run published it. */
async function publishedDaemon(engine: 'sqlite' | 'postgres' = 'sqlite'): Promise<{ config: Config; sender: string; queue: Queue; prefix: string; daemon: Awaited<ReturnType<typeof loggedDaemon>> }> {
  const ws = FakeWorkspace.fromCounts([4, 20, 3]);
  const c = ws.list()[1]!;
  const mine = c.messages.find((m) => m.sender.type === 'Customer')!;
  ws.editMessage(c.id, mine.id, SECRET);
  const fake = await fx.fakeApi(ws);
  const prefix = fx.prefix();
  let db: Record<string, string> = {};
  if (engine === 'postgres') {
    const schema = randomSchema('erasejob');
    schemas.push(schema);
    db = { CONVO_MIRROR_DB: pgUrl(schema) };
  }
  const config = fx.daemonConfig(fake, prefix, { CONVO_MIRROR_JOB_ATTEMPTS: '3', ...db });
  const daemon = await loggedDaemon(config);
  const queue = fx.queueFor(prefix);
  const first = await waitForJob(queue, await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } }), 'completed', 30_000);
  expect((first.returnvalue as RunSummary).status).toBe('succeeded');
  expect(holding(config.exportDir, SECRET).length, 'the text is published before the erasure').toBeGreaterThan(0);
  return { config, sender: mine.sender.id, queue, prefix, daemon };
}

/** The CLI's environment for the daemon's mirror, Redis and prefix. */
function envOf(config: Config, prefix: string): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    CI: 'true',
    CONVO_MIRROR_ACCOUNT_ID: ACCOUNT_ID,
    CONVO_MIRROR_DB: config.db,
    CONVO_MIRROR_EXPORT_DIR: config.exportDir,
    REDIS_URL: redisUrl(),
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    LOG_LEVEL: 'info',
  };
}

describe('the erase job', () => {
  it.each(['sqlite', 'postgres'] as const)('enqueue --erase-sender --wait (%s): the daemon erases the mirror and the archive, prints and logs what it did, never the subject; /metrics counts it; nothing left in Redis', async (engine) => {
    const { config, sender, queue, prefix, daemon } = await publishedDaemon(engine);
    const env = envOf(config, prefix);

    const r = await run(['enqueue', '--erase-sender', sender, '--reason', 'DSR-2026-0042', '--wait'], env, 60_000);
    expect(r.code, r.stderr).toBe(0);
    const id = r.stdout.trim();
    expect(id).toMatch(/^\d+$/);
    expect(r.stderr).toMatch(
      new RegExp(`^job ${id}: completed: erasure 1: a sender of account ${ACCOUNT_ID}, [1-9]\\d* messages?, 0 history versions, 0 unpublished changes, 1 conversation object redacted; archive: 2 files rewritten, [1-9]\\d* lines? replaced by stubs, erasure record \\d+$`, 'm'),
    );
    expect(`${r.stdout}${r.stderr}`).not.toContain(sender);

    // Removed on completion; nothing under the prefix names the subject (the events stream, the queue's keys).
    expect(await Job.fromId(queue, id)).toBeUndefined();
    const dump = await redisDump(prefix);
    expect(dump).toContain(ERASE_JOB); // the dump reads the events stream: it would show the job's data
    expect(dump).not.toContain(sender);
    expect(dump).not.toContain(SECRET);

    const metrics = await (await fetch(`${daemon.url}/metrics`)).text();
    expect(metrics).toContain(`convo_mirror_erasures_total{account_id="${ACCOUNT_ID}",kind="sender"} 1`);

    await daemon.stop();
    const logs = daemon.logs.join('\n');
    expect(logs).toMatch(/"msg":"erasure recorded in the mirror"/);
    const completed = daemon.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'job completed' && l.name === ERASE_JOB);
    // The sender's messages file and the conversations file (the conversation whose contact is the sender).
    expect(completed).toMatchObject({ job: id, outcome: 'erased', erasure: 1, kind: 'sender', archive: { files: 2 } });
    expect(logs).not.toContain(sender);
    expect(logs).not.toContain(SECRET);

    // The archive and the mirror hold neither the text nor the sender id; the archive verifies.
    expect(holding(config.exportDir, SECRET)).toEqual([]);
    // Nor the sender id: its messages' lines and the lines of the conversation naming it (its contact) are stubs.
    expect(holding(config.exportDir, sender)).toEqual([]);
    await withMirror(config.db, async (m) => {
      const [e] = await m.erasures();
      expect(e).toMatchObject({ id: 1, kind: 'sender', reason: 'DSR-2026-0042' });
      expect(e!.archiveDoneAt).not.toBeNull();
      expect(await m.counts()).toMatchObject({ erasures: 1, erasures_pending: 0 });
      expect((await m.counts()).messages_erased).toBe(e!.messages);
    });
    const v = await run(['verify', '--deep'], env);
    expect(v.code, v.stdout + v.stderr).toBe(0);
    expect(v.stdout + v.stderr).not.toContain(sender);
  });

  it('an invalid request (a blank reason) fails at once, unretried, in one line without the subject, and its data keeps no subject', async () => {
    const { config, queue, prefix } = await publishedDaemon();
    const subject = 'cus_subject_of_an_invalid_job';
    const id = await enqueueErase(queue, { accountId: ACCOUNT_ID, kind: 'sender', subject, reason: '   ' }, { attempts: 3 });
    const job = await waitForJob(queue, id, 'failed', 20_000);
    expect(job.attemptsMade).toBe(1);
    expect(job.failedReason).toBe(
      `erase job ${id}: not a valid request: the reason is blank: it is required (why the subject is erased, e.g. the ticket reference); queue it again with --reason; nothing erased`,
    );
    expect((job.data as EraseJobData).subject).toBeUndefined();
    expect(await redisDump(prefix)).not.toContain(subject);
    await withMirror(config.db, async (m) => expect(await m.erasures()).toEqual([]));
    // status lists the dead letter without a subject either.
    const s = await run(['status'], envOf(config, prefix));
    expect(s.code, s.stderr).toBe(0);
    expect(s.stdout).toContain(`${id} erase after 1 attempts`);
    expect(s.stdout).not.toContain(subject);
  });

  it('an archive step that fails leaves the erasure pending and the job without its subject; retried, the job runs only the archive step', async () => {
    const { config, sender, queue, prefix, daemon } = await publishedDaemon();
    const env = envOf(config, prefix);
    // A published file that is not what was published: the archive step refuses it, naming it.
    const messagesDir = path.join(config.exportDir, 'messages');
    const [rel] = holding(messagesDir, SECRET);
    const file = path.join(messagesDir, rel!);
    const original = fs.readFileSync(file);
    const mode = fs.statSync(file).mode & 0o777;
    fs.chmodSync(file, 0o600);
    fs.appendFileSync(file, '\n');

    const r = await run(['enqueue', '--erase-sender', sender, '--reason', 'DSR-9', '--wait'], env, 60_000);
    expect(r.code, r.stderr).toBe(1);
    const id = r.stdout.trim();
    expect(r.stderr).toMatch(new RegExp(`^job ${id}: .*erasure 1 is recorded in the mirror, but its archive step failed: .*${rel!.split('/').at(-1)!.replace(/\./g, '\\.')}`, 'm'));
    expect(`${r.stdout}${r.stderr}`).not.toContain(sender);
    const failed = (await Job.fromId(queue, id))!;
    expect(failed.attemptsMade).toBe(1);
    expect(failed.data).toEqual({ accountId: ACCOUNT_ID, kind: 'sender', reason: 'DSR-9', erasureId: 1 });
    expect(await redisDump(prefix)).not.toContain(sender);
    const s = await run(['status'], env);
    expect(s.stdout).toMatch(/^ {2}erasures_pending +1$/m);

    // Once the file is what was published again, the retried job finishes the same erasure.
    fs.writeFileSync(file, original);
    fs.chmodSync(file, mode);
    const retried = await run(['retry-failed'], env);
    expect(retried.code, retried.stderr).toBe(0);
    await waitFor(async () => (await withMirror(config.db, async (m) => (await m.erasures())[0]!.archiveDoneAt)) !== null, 20_000, 'the erasure to be archived');
    await waitFor(async () => (await Job.fromId(queue, id)) === undefined, 10_000, 'the completed job to be removed');
    await withMirror(config.db, async (m) => expect((await m.erasures()).map((e) => e.id)).toEqual([1]));
    expect(holding(config.exportDir, SECRET)).toEqual([]);
    const metrics = await (await fetch(`${daemon.url}/metrics`)).text();
    expect(metrics).toContain(`convo_mirror_erasures_total{account_id="${ACCOUNT_ID}",kind="sender"} 1`);
    await daemon.stop();
    const completed = daemon.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'job completed' && l.name === ERASE_JOB);
    expect(completed).toMatchObject({ job: id, erasure: 1, messages: 0, archive: { files: 2 } });
    expect(daemon.logs.join('\n')).not.toContain(sender);
  });

  it('enqueue refuses an erasure without a reason, with --full, or both kinds at once (exit 2, one line, nothing queued)', async () => {
    const prefix = fx.prefix();
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', CONVO_MIRROR_ACCOUNT_ID: ACCOUNT_ID, REDIS_URL: redisUrl(), CONVO_MIRROR_QUEUE_PREFIX: prefix };
    const cases: [string[], string][] = [
      [['--erase-sender', 'cus_1'], '--reason: is required'],
      [['--erase-sender', 'cus_1', '--reason', ' '], '--reason: is required'],
      [['--erase-conversation', 'c1', '--reason', 'T-1', '--full'], '--erase-conversation: queues an erasure: it takes neither --conversation nor --full'],
      [['--erase-sender', 'cus_1', '--erase-conversation', 'c1', '--reason', 'T-1'], '--erase-sender: give one of --erase-sender ID and --erase-conversation ID, not both'],
      [['--reason', 'T-1'], '--reason: goes with --erase-sender ID or --erase-conversation ID'],
    ];
    for (const [args, message] of cases) {
      const r = await run(['enqueue', ...args], env);
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(`convo-mirror: configuration error: ${message}`);
      expect(r.stdout).toBe('');
    }
    expect(await redisDump(prefix)).toBe('');
  });
});

describe('status and pending erasures', () => {
  it('shows an erasure recorded in the mirror whose archive step has not run, without its subject', async () => {
    const ws = FakeWorkspace.fromCounts([3, 6]);
    const c = ws.list()[1]!;
    const sender = c.messages.find((m) => m.sender.type === 'Customer')!.sender.id;
    const h = await pool.start({ workspace: ws });
    expect((await h.sync()).status).toBe('succeeded');
    // The mirror's side only: the archive step is left for the next publication.
    const erased = await h.mirror.eraseSubject({ kind: 'sender', accountId: ACCOUNT_ID, subject: sender, reason: 'DSR-7' });
    expect(erased.publishedLines).toBeGreaterThan(0);
    await h.mirror.close();
    const env = cliEnv(h.fake, h.dir, { CONVO_MIRROR_BASE_URL: undefined, CONVO_MIRROR_API_KEY: undefined, REDIS_URL: 'redis://127.0.0.1:1' });
    const s = await run(['status'], env);
    expect(s.code, s.stderr).toBe(0);
    expect(s.stdout).toMatch(/^ {2}erasures_pending +1$/m);
    expect(s.stdout).toContain("erasures pending: 1 recorded in the mirror, waiting for the archive step (the next convo-mirror erase or sync, or a daemon's publication, finishes it)");
    expect(s.stdout).not.toContain(sender);
    const j = await run(['status', '--json'], env);
    expect((JSON.parse(j.stdout) as { counts: Record<string, number> }).counts).toMatchObject({ erasures: 1, erasures_pending: 1 });
  });
});
