/**
 * The daemon's BullMQ engine (`--scheduler bullmq`, the default): job schedulers (one pair per
 * workspace) and a worker on Redis, the readiness check of Redis, and the queue dashboard. The way
 * to scale out: any number of daemons of one mirror share its queue prefix.
 *
 * Its shutdown never waits on Redis without a bound: BullMQ's `worker.close()` can wait for good on
 * a connection that waits to reconnect (BullMQ issue #4656), so the running jobs are tracked here,
 * and every close is bounded, then cut.
 */
import os from 'node:os';
import { UnrecoverableError, Worker, type Job, type Queue } from 'bullmq';
import type { FastifyPluginAsync } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { redisShown } from '../config/redis-url.js';
import { Publisher } from '../src/export/publisher.js';
import { describeError } from '../src/errors.js';
import type { ReadinessCheck } from '../src/server/index.js';
import { settlesWithin } from '../src/clock.js';
import { DEFAULT_LOG_WINDOW_MS, LogThrottle } from '../src/log-throttle.js';
import { jobFigures, type DaemonEngine, type EngineContext, type EngineStopped } from './engine.js';
import { RedisLink, endParked, type LinkClient } from './redis-link.js';
import { KeyedMutex, processJob, type JobDeps } from './processors.js';
import type { DashboardOptions } from './dashboard.js';
import {
  QUEUE_NAME,
  claimQueuePrefix,
  enqueueConversation,
  jobPolicyOf,
  openQueue,
  redisConnection,
  registerSchedulers,
  type ConversationJobData,
  type WorkspaceJobData,
} from './queue.js';

/**
 * Builds the BullMQ engine: the queue (its prefix claimed for this mirror) and the state of its
 * connection (what `/readyz`, the webhook route, the metrics and the dashboard ask), one set of job
 * dependencies per workspace, and (with `config.adminPassword`) the dashboard. Nothing runs until
 * `start()`.
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_QUEUE_PREFIX when the prefix belongs to another mirror
 */
export async function bullmqEngine(ctx: EngineContext): Promise<DaemonEngine> {
  const { config, logger } = ctx;
  const where = redisShown(config.redisUrl);
  // Set during close(): a connection lost from then on ends instead of reconnecting.
  let closing = false;
  const stopReconnecting = () => closing;
  const queue = openQueue({ redisUrl: config.redisUrl, prefix: config.queuePrefix }, { stopReconnecting });
  const link = new RedisLink(queue.getBackend().client, where, {
    onLost: (reason) => logger.warn({ redis: where, reason }, 'lost the connection to Redis: /readyz and webhooks answer 503 and no job starts until it is back; reconnecting every second'),
    onBack: (awayMs) => logger.info({ redis: where, away_ms: awayMs }, 'connected to Redis again'),
  });
  const jobs = new RunningJobs();
  let worker: BullWorker | undefined;
  try {
    await claimQueuePrefix({ redisUrl: config.redisUrl, prefix: config.queuePrefix }, await ctx.mirror.mirrorId());
  } catch (err) {
    await closeConnections(undefined, queue, link, { waitMs: 1000, stopReconnecting: () => (closing = true) }, logger);
    throw err;
  }
  const deps = workspaceDeps(ctx, queue);
  const plugins: FastifyPluginAsync[] = config.adminPassword !== undefined ? [lazyDashboard({ queue, link, password: config.adminPassword, logger })] : [];
  return {
    name: 'bullmq',
    // The queue's own connection: the one a webhook's job is sent on.
    checks: [{ name: 'redis', check: () => link.ping() }] satisfies ReadinessCheck[],
    plugins,
    async jobCounts() {
      link.assertConnected();
      return queue.getJobCounts();
    },
    rateLimit(ms) {
      queue.rateLimit(ms).catch((err: unknown) => logger.warn({ err: describeError(err) }, 'could not set the queue rate limit'));
    },
    async enqueueConversation(accountId, conversationId) {
      // Refused at once while the connection is away (the route answers 503, as /readyz does),
      // rather than held in the client and sent after the 503 was answered.
      link.assertConnected();
      return enqueueConversation(queue, conversationId, { accountId, trigger: 'webhook', policy: jobPolicyOf(config) });
    },
    async start() {
      const removed = await registerSchedulers(
        queue,
        ctx.workspaces.map((w) => ({ accountId: w.accountId, schedule: w.workspace.schedule, fullSchedule: w.workspace.fullSchedule })),
        { tz: config.tz, policy: jobPolicyOf(config) },
      );
      if (removed.length > 0) logger.info({ schedulers: removed }, 'removed the job schedulers of workspaces no longer configured');
      worker = await startWorker(config, logger, stopReconnecting, (job, token) => jobs.track(processJob(depsOf(deps, job), job, token)));
    },
    describe: () => ({ redis: where, prefix: config.queuePrefix, worker: workerName() }),
    async stop(graceMs, abort, abortWaitMs) {
      if (!worker) return { forced: false, abandoned: 0 };
      return drainWorker(worker, jobs, { graceMs, abortWaitMs, abort }, logger);
    },
    async close(waitMs) {
      await closeConnections(worker, queue, link, { waitMs, stopReconnecting: () => (closing = true) }, logger);
    },
  };
}

/**
 * The job dependencies of each workspace, by account id (lower-case), built once: one mutex for all
 * (keys name the account), each workspace's own client (whose limiter is shared with the others of
 * its base URL and key).
 */
function workspaceDeps(ctx: EngineContext, queue: Queue): Map<string, JobDeps> {
  const locks = new KeyedMutex();
  const publisher = new Publisher(ctx.mirror, ctx.target, { clock: ctx.clock, logger: ctx.logger, runId: null });
  const out = new Map<string, JobDeps>();
  for (const w of ctx.workspaces) {
    out.set(w.accountId.toLowerCase(), {
      api: w.api,
      mirror: ctx.mirror,
      logger: w.logger,
      clock: ctx.clock,
      queue,
      accountId: w.accountId,
      target: ctx.target,
      // Long runs reach the exports progressively: what conversation jobs commit is published every publishIntervalMs.
      afterCommit: async () => {
        await publisher.maybePublish();
      },
      policy: jobPolicyOf(ctx.config),
      signal: ctx.signal,
      locks,
      changeFieldSetting: ctx.config.changeField,
      onFatal: ctx.onFatal,
      onRunFinished: ctx.onRunFinished,
      onNotFound: ctx.onNotFound,
      onErasure: ctx.onErasure,
    });
  }
  return out;
}

/**
 * The dependencies of the workspace a job names. A job without an account id (queued by a version
 * that mirrored one workspace) belongs to the only workspace.
 *
 * @throws `UnrecoverableError` (never retried) when the job names a workspace this daemon does not
 *   mirror, or names none while several are configured
 */
export function depsOf(deps: ReadonlyMap<string, JobDeps>, job: Job): JobDeps {
  const accountId = (job.data as WorkspaceJobData | ConversationJobData | undefined)?.accountId;
  if (accountId === undefined) {
    if (deps.size === 1) return deps.values().next().value!;
    throw new UnrecoverableError(`job ${job.id} names no workspace (queued by an earlier version) and this daemon mirrors ${deps.size}: enqueue it again with --account`);
  }
  const d = deps.get(accountId.toLowerCase());
  if (!d) throw new UnrecoverableError(`job ${job.id} is for workspace ${accountId}, which this daemon does not mirror (configured: ${[...deps.values()].map((x) => x.accountId).join(', ')})`);
  return d;
}

/** The worker and the clients of its two connections. */
interface BullWorker {
  worker: Worker;
  /** BullMQ's main connection: jobs' commands, locks. */
  main: LinkClient;
  /** The connection BullMQ waits for new jobs on (BZPOPMIN). */
  blocking: LinkClient | undefined;
}

/**
 * The name of this process's worker, `<hostname>:<pid>`: BullMQ names the worker's Redis
 * connection after it (so `status` lists the daemons serving a prefix, from `CLIENT LIST`) and
 * stamps it on each job it runs (`job.processedBy`).
 */
export function workerName(): string {
  return `${os.hostname()}:${process.pid}`;
}

/**
 * The worker: one per daemon, named {@link workerName}, `config.concurrency` jobs at a time, its
 * events logged (the same error at most once per 10 s: while Redis is away each connection fails
 * every second).
 */
async function startWorker(config: Config, logger: Logger, stopReconnecting: () => boolean, processor: (job: Job, token?: string) => Promise<unknown>): Promise<BullWorker> {
  const worker = new Worker(QUEUE_NAME, processor, {
    name: workerName(),
    connection: redisConnection(config.redisUrl, { stopReconnecting }),
    prefix: config.queuePrefix,
    concurrency: config.concurrency,
    // BullMQ honours queue.rateLimit() (set on a 429) only for workers with a limiter; this one
    // never binds on its own.
    limiter: { max: 1_000_000, duration: 1000 },
    lockDuration: config.jobLockMs,
    stalledInterval: config.jobLockMs,
    maxStalledCount: 3,
  });
  // The same error repeats every second while Redis is away: logged at most once per 10 s each.
  const errors = new LogThrottle({ onSuppressed: (message, suppressed) => logger.error({ err: message, suppressed, window_ms: DEFAULT_LOG_WINDOW_MS }, 'worker errors suppressed') });
  worker.on('error', (err) => {
    if (errors.size >= 100) errors.flush(); // bounded: messages naming ever new things
    const admitted = errors.admit(err.message);
    if (admitted) logger.error({ err: describeError(err), ...(admitted.suppressed ? { suppressed: admitted.suppressed } : {}) }, 'worker error');
  });
  worker.on('active', (job) => logger.info({ job: job.id, name: job.name, account_id: job.data?.accountId, conversation_id: job.data?.conversationId, attempt: job.attemptsMade + 1 }, 'job started'));
  worker.on('completed', (job, value: unknown) => logger.info({ job: job.id, name: job.name, account_id: job.data?.accountId, ...jobFigures(value) }, 'job completed'));
  worker.on('failed', (job, err) =>
    logger.warn({ job: job?.id, name: job?.name, account_id: job?.data?.accountId, conversation_id: job?.data?.conversationId, attempts: job?.attemptsMade, err: err.message }, 'job failed'),
  );
  await worker.waitUntilReady();
  const backend = worker.getBackend();
  return { worker, main: await backend.client, blocking: await backend.blockingClient };
}

/**
 * The jobs the worker's processor runs now, tracked here: BullMQ's `worker.close()`, which would
 * tell when they have ended, can wait for good on a connection that waits to reconnect.
 */
class RunningJobs {
  private readonly running = new Set<Promise<unknown>>();

  /** Runs `p` as a tracked job. */
  track<T>(p: Promise<T>): Promise<T> {
    this.running.add(p);
    const done = () => void this.running.delete(p);
    p.then(done, done);
    return p;
  }

  get size(): number {
    return this.running.size;
  }

  /** Resolves once no job runs (jobs started meanwhile included). */
  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
  }
}

/**
 * No new jobs (BullMQ's `worker.close()` begins); running ones get `graceMs`, then `abort()` (they
 * stop at their last committed page and put themselves back, delayed 1 s, without spending an
 * attempt) and `abortWaitMs` more. A job still running then is left to its lock: once the lock
 * expires (CONVO_MIRROR_JOB_LOCK_MS) a daemon picks it up again from its checkpoint, as after a
 * crash.
 */
async function drainWorker(w: BullWorker, jobs: RunningJobs, o: { graceMs: number; abortWaitMs: number; abort: () => void }, logger: Logger): Promise<EngineStopped> {
  void w.worker.close().catch(() => undefined);
  // BullMQ's close first disconnects the blocking connection and waits for its end, which never
  // comes while that connection waits out its reconnect delay: end it here.
  endParked([w.blocking]);
  if (await settlesWithin(jobs.idle(), o.graceMs)) return { forced: false, abandoned: 0 };
  logger.warn({ running: jobs.size }, 'grace period over: aborting running jobs; they resume from their checkpoints');
  o.abort();
  if (await settlesWithin(jobs.idle(), o.abortWaitMs)) return { forced: true, abandoned: 0 };
  logger.warn(
    { running: jobs.size, wait_ms: o.abortWaitMs },
    'jobs still running after the abort: closing without them; they are picked up again from their checkpoints once their lock expires',
  );
  return { forced: true, abandoned: jobs.size };
}

/**
 * BullMQ's close of the worker and of the queue (they record what the jobs that just ended
 * returned, then close their connections), bounded by `waitMs`. For its first half a connection
 * lost meanwhile reconnects as usual (within a second of Redis); then `stopReconnecting()` turns
 * true and a connection waiting to reconnect is ended, its queued commands failing (a job whose
 * outcome could not be recorded stays active until its lock expires, then runs again from its
 * checkpoint); what is still open at `waitMs` is cut.
 */
async function closeConnections(w: BullWorker | undefined, queue: Queue, link: RedisLink, o: { waitMs: number; stopReconnecting: () => void }, logger: Logger): Promise<void> {
  const clients = [w?.main, w?.blocking, link.raw];
  const closed = Promise.all([w?.worker.close(), queue.close()]);
  if (await settlesWithin(closed, o.waitMs / 2)) return;
  o.stopReconnecting();
  endParked(clients);
  if (await settlesWithin(closed, o.waitMs / 2)) return;
  logger.warn({ wait_ms: o.waitMs }, 'the Redis connections did not close in time: cutting them');
  for (const c of clients) c?.disconnect();
  endParked(clients);
}

/**
 * The dashboard plugin, its libraries (bull-board, basic auth) loaded when the HTTP server registers
 * it: a daemon without a dashboard never pays their memory.
 */
function lazyDashboard(o: DashboardOptions): FastifyPluginAsync {
  return async (app, opts) => {
    const { dashboardPlugin } = await import('./dashboard.js');
    await dashboardPlugin(o)(app, opts);
  };
}
