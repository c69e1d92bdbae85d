/**
 * The daemon: job schedulers + a worker over one SQLite mirror, with bounded graceful shutdown.
 * A thin shell: it builds the dependencies once, hands jobs to jobs/processors.ts, and tears down.
 */
import { Worker, type Job, type Queue } from 'bullmq';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { apiClientFromConfig, type ApiClient } from '../src/api/client.js';
import { Mirror, DEFAULT_ACCOUNT } from '../src/store/mirror.js';
import { systemClock } from '../src/clock.js';
import { ConfigError, MirrorUnusableError, describeError } from '../src/errors.js';
import { Metrics, startServer, type ReadinessCheck, type RunningServer } from '../src/server/index.js';
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
import { openMirrorForRuns, type RunSummary } from '../src/run/index.js';

/** Options of {@link runDaemon}. */
export interface DaemonOptions {
  config: Config;
  logger: Logger;
  /** Resolves when the daemon should stop (SIGTERM/SIGINT). */
  stop: Promise<unknown>;
  /**
   * Called once the worker runs and the HTTP server listens (tests and the CLI log readiness), with
   * the server's URL (`http://127.0.0.1:9464`), undefined when it is off.
   */
  onReady?: (ready: { httpUrl: string | undefined }) => void;
  /**
   * Where the HTTP server listens instead of `config.httpHost` / `config.httpPort`, for tests: here
   * port 0 means a free port chosen by the OS (its URL is given to `onReady`), whereas
   * `CONVO_MIRROR_HTTP_PORT=0` turns the server off. `false` turns it off. @defaultValue the config's
   */
  httpListen?: { host?: string; port: number } | false;
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
  /** The daemon's Prometheus metrics (served by the HTTP server). */
  metrics: Metrics;
  /** The connection of the readiness check's PING. */
  probe: RedisProbe;
  /** The HTTP server, once listening (undefined when off). */
  server?: RunningServer | undefined;
  /** Set when shutdown begins: `/readyz` answers 503 from then on. */
  stopping: boolean;
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
    // The one workspace's own crons (a workspaces file entry may set them), else the configured ones.
    const workspace = config.workspaces[0];
    const schedule = workspace?.schedule ?? config.schedule;
    const fullSchedule = workspace?.fullSchedule ?? config.fullSchedule;
    await registerSchedulers(res.queue, { schedule, fullSchedule, tz: config.tz, policy: deps.policy });
    worker = startWorker(config, logger, deps);
    await worker.waitUntilReady();
    res.server = await startHttp(config, logger, res, o.httpListen);
    logger.info(
      { redis: redisHost(config.redisUrl), prefix: config.queuePrefix, schedule, full_schedule: fullSchedule, tz: config.tz, concurrency: config.concurrency, http: res.server?.url ?? 'off' },
      'daemon ready',
    );
    o.onReady?.({ httpUrl: res.server?.url });
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
  const mirror = openMirrorForRuns(config.db, fileModes(config.groupReadable), logger);
  const abort = new AbortController();
  const queue = openQueue({ redisUrl: config.redisUrl, prefix: config.queuePrefix });
  const metrics = new Metrics({
    logger,
    // Change-log rows above the watermark (status's count; cheap while the exports keep up).
    exportLag: () => mirror.unexportedChanges(),
    queueJobCounts: () => queue.getJobCounts(),
  });
  const api = apiClientFromConfig(config, {
    logger,
    signal: abort.signal,
    onAttempt: metrics.attemptHook(accountOf(config)),
    // A 429 makes every worker of the queue back off, not just this request.
    onRateLimited: (ms) => {
      queue.rateLimit(ms).catch((err: unknown) => logger.warn({ err: describeError(err) }, 'could not set the queue rate limit'));
    },
  });
  return { mirror, queue, api, abort, metrics, probe: new RedisProbe(config.redisUrl), stopping: false };
}

/** The account the daemon mirrors (`default` without `X-Account-Id`). */
function accountOf(config: Config): string {
  return config.accountId ?? DEFAULT_ACCOUNT;
}

/**
 * Starts the HTTP server (health, readiness, metrics) on `config.httpHost:config.httpPort`, or on
 * `override`; none when the port is 0 (or `override` is false). `/readyz` checks that Redis answers
 * a PING, that the mirror answers a read, and that the daemon is not shutting down.
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_HTTP_PORT when the port is taken or not allowed,
 *   or CONVO_MIRROR_HTTP_HOST when the interface does not exist here
 */
async function startHttp(config: Config, logger: Logger, res: Resources, override: DaemonOptions['httpListen']): Promise<RunningServer | undefined> {
  if (override === false || (override === undefined && config.httpPort === 0)) return undefined;
  const host = override?.host ?? config.httpHost;
  const port = override?.port ?? config.httpPort;
  const checks: ReadinessCheck[] = [
    { name: 'redis', check: () => res.probe.ping() },
    { name: 'mirror', check: () => void res.mirror.mirrorId() },
    {
      name: 'daemon',
      check: () => {
        if (res.stopping) throw new Error('shutting down');
      },
    },
  ];
  try {
    return await startServer({ logger, metrics: res.metrics, checks }, { host, port });
  } catch (err) {
    throw listenError(err, host, port);
  }
}

/** The {@link ConfigError} of a failed listen (naming the setting to change), else `err` itself. */
function listenError(err: unknown, host: string, port: number): unknown {
  const code = (err as { code?: string }).code;
  const where = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  if (code === 'EADDRINUSE') return new ConfigError('CONVO_MIRROR_HTTP_PORT', `${where} is already in use: choose another port (--http-port), or 0 for no HTTP server`, err);
  if (code === 'EACCES') return new ConfigError('CONVO_MIRROR_HTTP_PORT', `${where}: not allowed to listen on port ${port} (ports below 1024 need privileges); choose another port`, err);
  if (code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN') {
    return new ConfigError('CONVO_MIRROR_HTTP_HOST', `cannot listen on ${host}: no such interface on this machine (${code})`, err);
  }
  return err;
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
      throw new Error(`Redis at ${redisHost(this.url)} is not connected (${this.redis.status}${this.lastError ? `: ${this.lastError}` : ''})`);
    }
    const answer = await this.redis.ping();
    if (answer !== 'PONG') throw new Error(`Redis at ${redisHost(this.url)} answered PING with ${JSON.stringify(answer)}`);
  }

  close(): void {
    this.redis.disconnect();
  }
}

/** The processors' dependencies, built once. */
function jobDeps(config: Config, logger: Logger, res: Resources, onFatal: (err: Error) => void): JobDeps {
  return {
    api: res.api,
    mirror: res.mirror,
    logger,
    clock: systemClock,
    queue: res.queue,
    accountId: accountOf(config),
    exportDir: config.exportDir,
    modes: fileModes(config.groupReadable),
    policy: { attempts: config.jobAttempts },
    signal: res.abort.signal,
    locks: new KeyedMutex(),
    changeFieldSetting: config.changeField,
    onFatal,
    onRunFinished: (summary, accountId) => res.metrics.onRunFinished(summary, accountId),
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
  res.stopping = true;
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

/** Closes the HTTP server, the queue, the client and the mirror (its writer lock released). */
async function release(res: Resources): Promise<void> {
  res.stopping = true;
  await res.server?.close().catch(() => {});
  res.probe.close();
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
