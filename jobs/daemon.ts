/**
 * The daemon: job schedulers + a worker over one SQLite mirror, with bounded graceful shutdown.
 * A thin shell: it builds the dependencies once, hands jobs to jobs/processors.ts, and tears down.
 */
import { Worker, type Job, type Queue } from 'bullmq';
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { apiClientFromConfig, type ApiClient } from '../src/api/client.js';
import { Mirror, DEFAULT_ACCOUNT } from '../src/store/mirror.js';
import { systemClock } from '../src/clock.js';
import { MirrorUnusableError, describeError } from '../src/errors.js';
import { fileModes } from '../src/private-fs.js';
import { assertSafeExportDir } from '../src/export/exporter.js';
import {
  QUEUE_NAME,
  assertRedisReachable,
  claimQueuePrefix,
  openQueue,
  redisConnection,
  redisHost,
  registerSchedulers,
  type ConversationJobResult,
} from './queue.js';
import { KeyedMutex, processJob, type JobDeps } from './processors.js';
import { sweepInterruptedRuns, type RunSummary } from '../src/run/index.js';

/** Options of {@link runDaemon}. */
export interface DaemonOptions {
  config: Config;
  logger: Logger;
  /** Resolves when the daemon should stop (SIGTERM/SIGINT). */
  stop: Promise<unknown>;
  /** Called once the worker runs (tests and the CLI log readiness). */
  onReady?: () => void;
}

/** How a daemon ended. */
export interface DaemonExit {
  /** Shutdown time from the stop request to everything closed, ms. */
  shutdownMs: number;
  /** True when running jobs had to be cut short at the grace period's end (they resume from their checkpoints). */
  forced: boolean;
  /**
   * Set when the daemon stopped by itself because no job could succeed any more: the mirror is
   * damaged or cannot be written ({@link MirrorUnusableError}). The CLI exits 2 with its message.
   */
  fatal?: Error;
}

/** What a running daemon holds, built once at start-up and released at shutdown. */
interface Resources {
  mirror: Mirror;
  queue: Queue;
  api: ApiClient;
  /** Aborted at the end of the shutdown grace period: cuts running jobs short. */
  abort: AbortController;
}

/**
 * Runs the daemon until `stop` resolves: checks Redis, takes the mirror's writer lock (a second
 * daemon on the same file is refused), registers the job schedulers, and processes jobs with
 * `config.concurrency` in parallel. On stop: no new jobs; running ones get
 * `config.shutdownTimeoutMs` to finish, then their requests are aborted (every committed page is a
 * checkpoint, so the retried job resumes); Redis and SQLite are closed.
 *
 * @throws {@link ConfigError} when Redis is unreachable; {@link StoreError} when the mirror is locked or unreadable
 */
export async function runDaemon(o: DaemonOptions): Promise<DaemonExit> {
  const { config, logger } = o;
  const res = await openResources(config, logger);
  let fatal: Error | undefined;
  let onFatalStop!: () => void;
  const fatalStop = new Promise<void>((resolve) => (onFatalStop = resolve));
  const deps = jobDeps(config, logger, res, (err) => {
    // A damaged or unwritable mirror fails every job: stop rather than burn through the queue.
    if (!(err instanceof MirrorUnusableError) || fatal) return;
    fatal = err;
    logger.fatal({ err: describeError(err), code: err.code }, 'the mirror is unusable: stopping the daemon');
    onFatalStop();
  });
  let worker: Worker | undefined;
  try {
    await claimQueuePrefix({ redisUrl: config.redisUrl, prefix: config.queuePrefix }, res.mirror.mirrorId());
    await registerSchedulers(res.queue, { schedule: config.schedule, fullSchedule: config.fullSchedule, tz: config.tz, policy: deps.policy });
    worker = startWorker(config, logger, deps);
    await worker.waitUntilReady();
    logger.info(
      { redis: redisHost(config.redisUrl), prefix: config.queuePrefix, schedule: config.schedule, full_schedule: config.fullSchedule, tz: config.tz, concurrency: config.concurrency },
      'daemon ready',
    );
    o.onReady?.();
  } catch (err) {
    // Startup failed: release everything, report the cause.
    await worker?.close(true).catch(() => {});
    await release(res);
    throw err;
  }
  await Promise.race([o.stop, fatalStop]);
  const exit = await shutdown(config, logger, worker, res);
  return { ...exit, ...(fatal ? { fatal } : {}) };
}

/**
 * Start-up: the export directory checked, Redis reachable, the mirror opened for writing (its
 * writer lock taken; runs a dead process left running marked interrupted), the queue and the client.
 */
async function openResources(config: Config, logger: Logger): Promise<Resources> {
  assertSafeExportDir(config.exportDir, config.db);
  await assertRedisReachable(config.redisUrl);
  const mirror = Mirror.open(config.db, { modes: fileModes(config.groupReadable) });
  try {
    // We hold the writer lock: runs still 'running' belong to a process that died.
    sweepInterruptedRuns(mirror, logger);
  } catch (err) {
    mirror.close();
    throw err;
  }
  const abort = new AbortController();
  const queue = openQueue({ redisUrl: config.redisUrl, prefix: config.queuePrefix });
  const api = apiClientFromConfig(config, {
    logger,
    signal: abort.signal,
    // A 429 makes every worker of the queue back off, not just this request.
    onRateLimited: (ms) => {
      queue.rateLimit(ms).catch((err: unknown) => logger.warn({ err: describeError(err) }, 'could not set the queue rate limit'));
    },
  });
  return { mirror, queue, api, abort };
}

/** The processors' dependencies, built once. */
function jobDeps(config: Config, logger: Logger, res: Resources, onFatal: (err: Error) => void): JobDeps {
  return {
    api: res.api,
    mirror: res.mirror,
    logger,
    clock: systemClock,
    queue: res.queue,
    accountId: config.accountId ?? DEFAULT_ACCOUNT,
    exportDir: config.exportDir,
    modes: fileModes(config.groupReadable),
    policy: { attempts: config.jobAttempts },
    signal: res.abort.signal,
    locks: new KeyedMutex(),
    changeFieldSetting: config.changeField,
    onFatal,
  };
}

/** The worker: one per daemon, `config.concurrency` jobs at a time, its events logged. */
function startWorker(config: Config, logger: Logger, deps: JobDeps): Worker {
  const worker = new Worker(QUEUE_NAME, async (job: Job, token?: string) => processJob(deps, job, token), {
    connection: redisConnection(config.redisUrl),
    prefix: config.queuePrefix,
    concurrency: config.concurrency,
    // BullMQ honours queue.rateLimit() (set on a 429) only for workers with a limiter; this one
    // never binds on its own.
    limiter: { max: 1_000_000, duration: 1000 },
    lockDuration: config.jobLockMs,
    stalledInterval: config.jobLockMs,
    maxStalledCount: 3,
  });
  worker.on('error', (err) => logger.error({ err: describeError(err) }, 'worker error'));
  worker.on('active', (job) => logger.info({ job: job.id, name: job.name, conversation_id: job.data?.conversationId, attempt: job.attemptsMade + 1 }, 'job started'));
  worker.on('completed', (job, value: unknown) => logger.info({ job: job.id, name: job.name, ...jobFigures(value) }, 'job completed'));
  worker.on('failed', (job, err) =>
    logger.warn({ job: job?.id, name: job?.name, conversation_id: job?.data?.conversationId, attempts: job?.attemptsMade, err: err.message }, 'job failed'),
  );
  return worker;
}

/**
 * Shutdown: no new jobs; running ones get `config.shutdownTimeoutMs`, then are aborted (they
 * resume from their checkpoints), and after 5 s more are left to their locks; everything closed.
 */
async function shutdown(config: Config, logger: Logger, worker: Worker, res: Resources): Promise<Omit<DaemonExit, 'fatal'>> {
  const t0 = Date.now();
  let forced = false;
  logger.info({ grace_ms: config.shutdownTimeoutMs }, 'shutting down: no new jobs; waiting for running ones');
  const closing = worker.close();
  let timer: NodeJS.Timeout | undefined;
  const graceOver = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), config.shutdownTimeoutMs)));
  if ((await Promise.race([closing.then(() => 'closed' as const), graceOver])) === 'timeout') {
    forced = true;
    logger.warn('grace period over: aborting running jobs; they resume from their checkpoints');
    res.abort.abort(new Error('daemon shutting down'));
  }
  clearTimeout(timer);
  // Aborted jobs end within moments; one that does not is left to its lock (it is picked up again).
  const hard = await Promise.race([closing.then(() => false), new Promise<boolean>((r) => setTimeout(() => r(true), 5000).unref())]);
  if (hard) {
    logger.warn('jobs still running 5 s after the abort: closing without them; they will be picked up again');
    await worker.close(true);
  }
  await release(res);
  const shutdownMs = Date.now() - t0;
  logger.info({ shutdown_ms: shutdownMs, forced }, 'daemon stopped');
  return { shutdownMs, forced };
}

/** Closes the queue, the client and the mirror (its writer lock released). */
async function release(res: Resources): Promise<void> {
  await res.queue.close().catch(() => {});
  await res.api.close().catch(() => {});
  res.mirror.close();
}

function jobFigures(value: unknown): Record<string, unknown> {
  const v = value as Partial<RunSummary> & Partial<ConversationJobResult>;
  if (v?.result) return { conversation_id: v.result.id, status: v.result.status, inserted: v.result.inserted, updated: v.result.updated, deleted: v.result.deleted, pages: v.result.pages };
  if (v?.runId !== undefined) return { run: v.runId, status: v.status, conversations: v.conversations, messages: v.messages, requests: v.requests, export_lines: v.export?.lines };
  return {};
}
