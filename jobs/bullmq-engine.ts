/**
 * The daemon's BullMQ engine (`--scheduler bullmq`, the default): job schedulers (one pair per
 * workspace) and a worker on Redis, the readiness check of Redis, and the queue dashboard. The way
 * to scale out: any number of daemons of one mirror share its queue prefix.
 */
import { UnrecoverableError, Worker, type Job, type Queue } from 'bullmq';
import { Redis } from 'ioredis';
import type { FastifyPluginAsync } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { redisShown } from '../config/redis-url.js';
import { Publisher } from '../src/export/publisher.js';
import { describeError } from '../src/errors.js';
import type { ReadinessCheck } from '../src/server/index.js';
import { jobFigures, type DaemonEngine, type EngineContext } from './engine.js';
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
 * Builds the BullMQ engine: the queue (its prefix claimed for this mirror), one set of job
 * dependencies per workspace, the Redis probe of `/readyz`, and (with `config.adminPassword`) the
 * dashboard. Nothing runs until `start()`.
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_QUEUE_PREFIX when the prefix belongs to another mirror
 */
export async function bullmqEngine(ctx: EngineContext): Promise<DaemonEngine> {
  const { config, logger } = ctx;
  const queue = openQueue({ redisUrl: config.redisUrl, prefix: config.queuePrefix });
  const probe = new RedisProbe(config.redisUrl);
  let worker: Worker | undefined;
  try {
    await claimQueuePrefix({ redisUrl: config.redisUrl, prefix: config.queuePrefix }, ctx.mirror.mirrorId());
  } catch (err) {
    probe.close();
    await queue.close().catch(() => {});
    throw err;
  }
  const deps = workspaceDeps(ctx, queue);
  const plugins: FastifyPluginAsync[] = config.adminPassword !== undefined ? [lazyDashboard({ queue, password: config.adminPassword, logger })] : [];
  return {
    name: 'bullmq',
    checks: [{ name: 'redis', check: () => probe.ping() }] satisfies ReadinessCheck[],
    plugins,
    jobCounts: () => queue.getJobCounts(),
    rateLimit(ms) {
      queue.rateLimit(ms).catch((err: unknown) => logger.warn({ err: describeError(err) }, 'could not set the queue rate limit'));
    },
    enqueueConversation: (accountId, conversationId) => enqueueConversation(queue, conversationId, { accountId, trigger: 'webhook', policy: jobPolicyOf(config) }),
    async start() {
      const removed = await registerSchedulers(
        queue,
        ctx.workspaces.map((w) => ({ accountId: w.accountId, schedule: w.workspace.schedule, fullSchedule: w.workspace.fullSchedule })),
        { tz: config.tz, policy: jobPolicyOf(config) },
      );
      if (removed.length > 0) logger.info({ schedulers: removed }, 'removed the job schedulers of workspaces no longer configured');
      worker = startWorker(config, logger, (job, token) => processJob(depsOf(deps, job), job, token));
      await worker.waitUntilReady();
    },
    describe: () => ({ redis: redisShown(config.redisUrl), prefix: config.queuePrefix }),
    async stop(graceMs, abort) {
      if (!worker) return { forced: false };
      return closeWorker(worker, graceMs, abort, logger);
    },
    async close() {
      await worker?.close(true).catch(() => {});
      probe.close();
      await queue.close().catch(() => {});
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
      afterCommit: () => void publisher.maybePublish(),
      policy: jobPolicyOf(ctx.config),
      signal: ctx.signal,
      locks,
      changeFieldSetting: ctx.config.changeField,
      onFatal: ctx.onFatal,
      onRunFinished: ctx.onRunFinished,
      onNotFound: ctx.onNotFound,
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

/** The worker: one per daemon, `config.concurrency` jobs at a time, its events logged. */
function startWorker(config: Config, logger: Logger, processor: (job: Job, token?: string) => Promise<unknown>): Worker {
  const worker = new Worker(QUEUE_NAME, processor, {
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
  worker.on('active', (job) => logger.info({ job: job.id, name: job.name, account_id: job.data?.accountId, conversation_id: job.data?.conversationId, attempt: job.attemptsMade + 1 }, 'job started'));
  worker.on('completed', (job, value: unknown) => logger.info({ job: job.id, name: job.name, account_id: job.data?.accountId, ...jobFigures(value) }, 'job completed'));
  worker.on('failed', (job, err) =>
    logger.warn({ job: job?.id, name: job?.name, account_id: job?.data?.accountId, conversation_id: job?.data?.conversationId, attempts: job?.attemptsMade, err: err.message }, 'job failed'),
  );
  return worker;
}

/**
 * No new jobs; running ones get `graceMs`, then `abort()` (they resume from their checkpoints), and
 * after 5 s more are left to their locks (picked up again by the next daemon).
 */
async function closeWorker(worker: Worker, graceMs: number, abort: () => void, logger: Logger): Promise<{ forced: boolean }> {
  let forced = false;
  const closing = worker.close();
  let timer: NodeJS.Timeout | undefined;
  const graceOver = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), graceMs)));
  if ((await Promise.race([closing.then(() => 'closed' as const), graceOver])) === 'timeout') {
    forced = true;
    logger.warn('grace period over: aborting running jobs; they resume from their checkpoints');
    abort();
  }
  clearTimeout(timer);
  const hard = await Promise.race([closing.then(() => false), new Promise<boolean>((r) => setTimeout(() => r(true), 5000).unref())]);
  if (hard) {
    logger.warn('jobs still running 5 s after the abort: closing without them; they will be picked up again');
    await worker.close(true);
  }
  return { forced };
}

/**
 * The Redis connection of `/readyz`: its own, never queueing a command while Redis is away (a
 * check then fails at once, naming the connection's state and last error) and reconnecting by
 * itself within a second of Redis coming back.
 */
class RedisProbe {
  private readonly redis: Redis;
  private lastError: string | undefined;

  constructor(private readonly url: string) {
    this.redis = new Redis({
      ...redisConnection(url),
      lazyConnect: false,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      connectTimeout: 1000,
      retryStrategy: (times: number) => Math.min(100 * times, 1000),
    });
    this.redis.on('error', (err: Error) => (this.lastError = err.message));
    this.redis.on('ready', () => (this.lastError = undefined));
  }

  /** @throws Error naming the host (never the password) when Redis does not answer PONG */
  async ping(): Promise<void> {
    if (this.redis.status !== 'ready') {
      throw new Error(`Redis at ${redisShown(this.url)} is not connected (${this.redis.status}${this.lastError ? `: ${this.lastError}` : ''})`);
    }
    const answer = await this.redis.ping();
    if (answer !== 'PONG') throw new Error(`Redis at ${redisShown(this.url)} answered PING with ${JSON.stringify(answer)}`);
  }

  close(): void {
    this.redis.disconnect();
  }
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
