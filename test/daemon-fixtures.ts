/**
 * Shared fixtures of the daemon tests: the fake API, the daemon run in this process (`runDaemon`
 * with a `stop` promise the test resolves), queues on the test run's real Redis, job-state polling,
 * and what the mirror must hold after a conversation's sync. Everything started is tracked and
 * released by `afterEachTest` / `afterAllTests`; every wait is bounded.
 *
 * ```ts
 * const fx = daemonFixtures('daemon');
 * afterEach(fx.afterEachTest);
 * afterAll(fx.afterAllTests);
 * ```
 */
import fs from 'node:fs';
import { expect } from 'vitest';
import { Job, type Queue } from 'bullmq';
import { loadConfig, type Config } from '../config/index.js';
import { runDaemon, type DaemonExit } from '../jobs/daemon.js';
import { openQueue } from '../jobs/queue.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, quietLogger, readExportLines, tempDir, withMirror } from './helpers.js';
import { waitFor, within } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { sqlAll } from './sql.js';
import type { Clock } from '../src/clock.js';

/** A cron that never fires during a test run. */
export const NEVER = '0 0 1 1 *';

/** Messages path of a conversation at the fake. */
export const messagesPath = (id: string) => `/v1/conversations/${id}/messages`;

/** A daemon running in this process. */
export interface InProcessDaemon {
  config: Config;
  /** The HTTP server's URL when started with `{ http: true }`. */
  url?: string | undefined;
  done: Promise<DaemonExit>;
  /** Resolves the daemon's stop promise and waits (bounded) for it to end. */
  stop(): Promise<DaemonExit>;
}

/** The fixtures of one test file (its own queue prefixes, temp dirs, fakes, queues and daemons). */
export interface DaemonFixtures {
  /** A fresh queue prefix (removed in `afterAllTests`). */
  prefix(): string;
  /** Starts the fake API over `ws` (closed in `afterEachTest`). */
  fakeApi(ws: FakeWorkspace): Promise<FakeApi>;
  /** A daemon configuration against `fake`, a fresh mirror dir and `prefix`; schedules that never fire. */
  daemonConfig(fake: FakeApi, prefix: string, env?: Record<string, string>): Config;
  /**
   * Starts `runDaemon` in this process and waits (bounded) until its worker runs; with `http`, its
   * HTTP server listens on a free port of 127.0.0.1 (`url`).
   */
  startDaemon(config: Config, o?: { http?: boolean; clock?: Clock }): Promise<InProcessDaemon>;
  /** A queue on `prefix` (closed in `afterEachTest`). */
  queueFor(prefix: string): Queue;
  afterEachTest(): Promise<void>;
  afterAllTests(): Promise<void>;
}

/** Creates the fixtures of one test file; `label` names its queue prefixes. */
export function daemonFixtures(label: string): DaemonFixtures {
  const prefixes = prefixSequence(label);
  const dirs: string[] = [];
  const fakes: FakeApi[] = [];
  const queues: Queue[] = [];
  const daemons: InProcessDaemon[] = [];
  return {
    prefix: () => prefixes.next(),
    async fakeApi(ws) {
      const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
      fakes.push(fake);
      return fake;
    },
    daemonConfig(fake, prefix, env = {}) {
      const dir = tempDir(`convo-mirror-${label}-`);
      dirs.push(dir);
      return loadConfig({
        ...cliEnv(fake, dir, { CONVO_MIRROR_MAX_RETRIES: '1', CONVO_MIRROR_CONCURRENCY: '2', REDIS_URL: redisUrl(), CONVO_MIRROR_QUEUE_PREFIX: prefix }),
        CONVO_MIRROR_SCHEDULE: NEVER,
        CONVO_MIRROR_FULL_SCHEDULE: NEVER,
        CONVO_MIRROR_JOB_LOCK_MS: '2000',
        CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
        // No HTTP server: daemons of parallel tests would all ask for 9464 (test/server.test.ts covers it).
        CONVO_MIRROR_HTTP_PORT: '0',
        LOG_LEVEL: 'silent',
        ...env,
      });
    },
    async startDaemon(config, o = {}) {
      const d = inProcessDaemon(config, o.http === true, o.clock);
      daemons.push(d.daemon);
      d.daemon.url = (await d.ready).httpUrl;
      return d.daemon;
    },
    queueFor(prefix) {
      const q = openQueue({ redisUrl: redisUrl(), prefix });
      queues.push(q);
      return q;
    },
    async afterEachTest() {
      await Promise.allSettled(daemons.splice(0).map((d) => d.stop()));
      await Promise.allSettled(queues.splice(0).map((q) => within(q.close(), 5_000, 'closing a queue')));
      await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
    },
    async afterAllTests() {
      for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
      for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
    },
  };
}

/** `runDaemon` in this process, and a promise of its readiness (bounded: 15 s). */
function inProcessDaemon(config: Config, http: boolean, clock?: Clock): { daemon: InProcessDaemon; ready: Promise<{ httpUrl: string | undefined }> } {
  let release!: () => void;
  const stop = new Promise<void>((r) => (release = r));
  let ready!: (r: { httpUrl: string | undefined }) => void;
  const readyP = new Promise<{ httpUrl: string | undefined }>((r) => (ready = r));
  const done = runDaemon({ config, logger: quietLogger(), stop, onReady: ready, ...(http ? { httpListen: { host: '127.0.0.1', port: 0 } } : {}), ...(clock ? { clock } : {}) });
  let stopped: Promise<DaemonExit> | undefined;
  const daemon: InProcessDaemon = {
    config,
    done,
    stop: () => (stopped ??= (release(), within(done, 15_000, 'daemon shutdown'))),
  };
  const failedEarly = done.then(() => Promise.reject(new Error('daemon ended before it was ready')));
  return { daemon, ready: within(Promise.race([readyP, failedEarly]), 15_000, 'daemon startup') };
}

/** A job's state (`waiting`, `active`, `completed`, `failed`...), undefined when there is no such job. */
export async function jobState(queue: Queue, id: string): Promise<string | undefined> {
  const job = await Job.fromId(queue, id);
  return job ? job.getState() : undefined;
}

/** Waits (bounded) until job `id` is in `state`; returns the job as it is then. */
export async function waitForJob(queue: Queue, id: string, state: string, timeoutMs: number, what = `job ${id} to be ${state}`): Promise<Job> {
  await waitFor(async () => (await jobState(queue, id)) === state, timeoutMs, what);
  return (await Job.fromId(queue, id))!;
}

/**
 * The mirror holds exactly the fake's live messages of `id` (same ids, same served JSON) and no
 * message of any other conversation.
 */
export async function expectConversationMirrored(db: string, ws: FakeWorkspace, id: string): Promise<void> {
  const rows = await withMirror(db, (m) =>
    sqlAll<{ conversation_id: string; id: string; raw: string }>(m, `SELECT conversation_id, id, raw FROM messages WHERE account_id = ? AND deleted_at IS NULL`, ACCOUNT_ID),
  );
  expect(rows.filter((r) => r.conversation_id !== id).length, 'messages of other conversations in the mirror').toBe(0);
  const mirrored = new Map(rows.map((r) => [r.id, r.raw]));
  const served = new Map(ws.get(id)!.messages.map((m) => [m.id, JSON.stringify(m)]));
  expect(mirrored.size, 'messages mirrored').toBe(served.size);
  const different = [...served].filter(([mid, raw]) => mirrored.get(mid) !== raw).map(([mid]) => mid);
  expect(different, 'messages missing or different').toEqual([]);
}

/** Export lines of one conversation: exactly one insert per message, each id once. */
export function expectExportedOnce(exportDir: string, ws: FakeWorkspace, id: string): void {
  const lines = readExportLines(exportDir, 'messages');
  expect(lines.filter((l) => l.conversation_id !== id).length, 'export lines of other conversations').toBe(0);
  const ids = lines.map((l) => l.id);
  expect(lines.length, 'export lines').toBe(ws.get(id)!.messages.length);
  expect(new Set(ids).size, 'distinct ids in the export').toBe(lines.length);
  expect(new Set(ids)).toEqual(new Set(ws.get(id)!.messages.map((m) => m.id)));
}
