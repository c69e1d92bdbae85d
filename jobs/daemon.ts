/**
 * The daemon: the schedules of every configured workspace and a queue of jobs (BullMQ on Redis, or
 * in-process with `--scheduler local`) over one SQLite mirror, an HTTP server (health, readiness,
 * metrics, webhooks, dashboard), and a bounded graceful shutdown. A thin shell: it builds the
 * dependencies once, hands jobs to the engine (jobs/bullmq-engine.ts, jobs/local-engine.ts), and
 * tears down.
 */
import type { Logger } from 'pino';
import { CONFIG_FIELDS, type Config } from '../config/index.js';
import { apiClientFromConfig } from '../src/api/client.js';
import type { LimiterPool } from '../src/api/rate-limit.js';
import { DEFAULT_ACCOUNT, type Mirror } from '../src/store/mirror.js';
import { mirrorFileOf } from '../src/store/open-mirror.js';
import { systemClock, type Clock } from '../src/clock.js';
import { ConfigError, MirrorUnusableError, describeError } from '../src/errors.js';
import type { ReadinessCheck, RunningServer, WebhookOptions } from '../src/server/index.js';
import { Metrics } from '../src/server/metrics.js';
import { listenError } from '../src/server/listen.js';
import { fileModes } from '../src/private-fs.js';
import { assertWritable } from '../src/writable.js';
import { assertSafeExportDir } from '../src/export/exporter.js';
import { publishSettingsFromConfig } from '../src/export/publisher.js';
import { assertWitnessDirSetting } from '../src/export/witness.js';
import { openMirrorForRuns } from '../src/run/index.js';
import { assertRedisReachable } from './queue.js';
import { bullmqEngine } from './bullmq-engine.js';
import { localEngine } from './local-engine.js';
import { daemonLimiters, type DaemonLimiters } from './fleet-limits.js';
import { WorkspaceChecks } from './startup-check.js';
import type { DaemonEngine, DaemonWorkspace, EngineContext } from './engine.js';

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
  /**
   * Time of the runs, the mirror and publication (tests inject one to cross a day without waiting);
   * schedules, job locks and rate limits keep real time. @defaultValue the system clock
   */
  clock?: Clock;
}

/**
 * After the grace period (`CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS`), how long aborted jobs get to stop at
 * their last committed page and put themselves back, ms.
 */
export const ABORT_WAIT_MS = 2000;
/** Then how long the HTTP server gives requests in flight before it cuts their connections, ms. */
export const HTTP_CLOSE_WAIT_MS = 1000;
/** Then how long the engine's Redis connections get to close before they are cut, ms. */
export const CLOSE_WAIT_MS = 2000;
/**
 * The most a shutdown takes past its grace period, ms: 5000 ({@link ABORT_WAIT_MS} +
 * {@link HTTP_CLOSE_WAIT_MS} + {@link CLOSE_WAIT_MS}). With the default grace of 20 s a shutdown
 * ends within 25 s of SIGTERM, inside Kubernetes' default 30 s before SIGKILL.
 */
export const SHUTDOWN_HARD_BOUND_MS = ABORT_WAIT_MS + HTTP_CLOSE_WAIT_MS + CLOSE_WAIT_MS;

/**
 * Where the daemon is, as `/readyz`'s `daemon` check says it: `ready` only between the `daemon
 * ready` log line and the start of the shutdown.
 */
export type DaemonPhase = 'starting: checking the workspaces' | 'starting: registering the job schedulers and starting the worker' | 'ready' | 'shutting down';

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
  /** Every workspace mirrored, with its client. */
  workspaces: DaemonWorkspace[];
  /** The schedules and the queue (BullMQ or in-process). */
  engine: DaemonEngine;
  /** Aborted at the end of the shutdown grace period: cuts running jobs short. */
  abort: AbortController;
  /** The daemon's Prometheus metrics (served by the HTTP server). */
  metrics: Metrics;
  /** The clients' rate limiters (shared through Redis by the fleet with the BullMQ engine). */
  limiters: DaemonLimiters;
  /** The HTTP server, once listening (undefined when off). */
  server?: RunningServer | undefined;
  /** `/readyz` answers 200 only in phase `ready`. */
  phase: DaemonPhase;
  /** The workspaces' start-up checks and re-checks (jobs/startup-check.ts). */
  checks: WorkspaceChecks;
}

/**
 * Runs the daemon until `stop` resolves: checks Redis (BullMQ mode), takes the mirror's writer lock
 * (a second daemon on the same file is refused), starts the HTTP server (`/healthz` answers from
 * then on, `/readyz` says 503 and why until the daemon is ready), checks every workspace
 * (jobs/startup-check.ts: one request each; none usable: the HTTP server closes and it throws),
 * registers one pair of schedules per configured workspace (`config.workspaces`), processes jobs
 * with `config.concurrency` in parallel, and logs `daemon ready`. On stop: `/readyz` says 503; no
 * new jobs; running ones get `config.shutdownTimeoutMs` to finish, then their requests are aborted
 * (every committed page is a checkpoint, so the job resumes); then at most
 * {@link SHUTDOWN_HARD_BOUND_MS} more to close the HTTP server, Redis and SQLite.
 *
 * @throws {@link ConfigError} when Redis is unreachable, the queue prefix belongs to another
 *   mirror, or no workspace can be mirrored (every base URL or key refused; {@link AuthError} when
 *   the only workspace's key is); {@link StoreError} when the mirror is locked or unreadable
 */
export async function runDaemon(o: DaemonOptions): Promise<DaemonExit> {
  const { config, logger } = o;
  let fatal: Error | undefined;
  let onFatalStop!: () => void;
  const fatalStop = new Promise<void>((resolve) => (onFatalStop = resolve));
  const onFatal = (err: Error) => {
    // A damaged or unwritable mirror fails every job: stop rather than burn through the queue.
    if (!(err instanceof MirrorUnusableError) || fatal) return;
    fatal = err;
    logger.fatal({ err: describeError(err), code: err.code }, 'the mirror is unusable: stopping the daemon');
    onFatalStop();
  };
  const res = await openResources(config, logger, onFatal, o.clock ?? systemClock);
  // A stop asked during start-up aborts the workspace checks and skips starting the engine.
  let stopAsked = false;
  void o.stop.then(() => {
    stopAsked = true;
    res.checks.stop();
  });
  try {
    await startUp(config, logger, res, o, () => stopAsked);
  } catch (err) {
    // Startup failed: release everything (the HTTP server closes before the caller exits), report the cause.
    await release(res, logger);
    throw err;
  }
  await Promise.race([o.stop, fatalStop]);
  const exit = await shutdown(config, logger, res);
  return { ...exit, ...(fatal ? { fatal } : {}) };
}

/**
 * Starts the HTTP server (first, so `/readyz` can say what the daemon waits for), checks the
 * workspaces, starts the engine and says ready; stops short once `stopAsked()`. Each phase is in
 * `res.phase` (`/readyz`) and in the log: `http server listening on …`, `checking the workspaces`,
 * `daemon ready`.
 *
 * @throws what {@link WorkspaceChecks.initial} and the engine throw
 */
async function startUp(config: Config, logger: Logger, res: Resources, o: DaemonOptions, stopAsked: () => boolean): Promise<void> {
  res.server = await startHttp(config, logger, res, o.httpListen);
  logger.info({ workspaces: res.workspaces.map((w) => w.accountId) }, 'checking the workspaces');
  await res.checks.initial();
  if (stopAsked()) return;
  res.phase = 'starting: registering the job schedulers and starting the worker';
  await res.engine.start();
  if (stopAsked()) return;
  res.phase = 'ready';
  const checked = new Map(res.checks.states.map((c) => [c.accountId, c.state]));
  logger.info(
    {
      scheduler: res.engine.name,
      ...res.engine.describe(),
      workspaces: res.workspaces.map((w) => ({ account_id: w.accountId, schedule: w.workspace.schedule, full_schedule: w.workspace.fullSchedule, check: checked.get(w.accountId) })),
      tz: config.tz,
      concurrency: config.concurrency,
      http: res.server?.url ?? 'off',
    },
    'daemon ready',
  );
  o.onReady?.({ httpUrl: res.server?.url });
}

/**
 * Start-up: the export directory checked, Redis reachable (BullMQ mode), the mirror opened for
 * writing (its writer lock taken; runs a dead process left running marked interrupted), one client
 * per workspace (sharing a rate limiter per base URL and key), the metrics and the engine.
 */
async function openResources(config: Config, logger: Logger, onFatal: (err: Error) => void, clock: Clock): Promise<Resources> {
  const dbFile = mirrorFileOf(config.db);
  assertSafeExportDir(config.exportDir, dbFile);
  if (dbFile !== undefined) assertWritable(CONFIG_FIELDS.db.env, dbFile, 'file');
  assertWritable(CONFIG_FIELDS.exportDir.env, config.exportDir, 'dir');
  if (config.witnessDir !== undefined) assertWitnessDirSetting(config.witnessDir, config.exportDir);
  const target = publishSettingsFromConfig(config, logger);
  if (config.scheduler === 'bullmq') await assertRedisReachable(config.redisUrl);
  const mirror = await openMirrorForRuns(config.db, fileModes(config.groupReadable), logger, clock);
  const abort = new AbortController();
  let engine: DaemonEngine | undefined;
  const metrics = new Metrics({
    logger,
    // What waits above the watermark (cheap while the exports keep up): changes, and held run lines.
    exportLag: async () => {
      const waiting = await mirror.pendingExport();
      return { changes: waiting.data, runLines: waiting.runLines };
    },
    queueJobCounts: () => (engine ? engine.jobCounts() : Promise.resolve({})),
    // PostgreSQL: its pools' connections (no query); SQLite has none.
    dbPools: () => mirror.poolStats(),
  });
  const limiters = daemonLimiters(config, logger);
  // A 429 makes every worker of the BullMQ queue back off (when all workspaces share one key).
  const workspaces = workspaceClients(config, logger, metrics, abort.signal, limiters.pool, (ms) => engine?.rateLimit?.(ms));
  const ctx: EngineContext = {
    config,
    logger,
    mirror,
    workspaces,
    clock,
    target,
    signal: abort.signal,
    onFatal,
    onRunFinished: (summary, accountId) => metrics.onRunFinished(summary, accountId),
    onNotFound: (accountId) => metrics.onNotFound(accountId),
    onErasure: (kind, accountId) => metrics.onErasure(kind, accountId),
  };
  try {
    engine = config.scheduler === 'local' ? localEngine(ctx) : await bullmqEngine(ctx);
  } catch (err) {
    await Promise.allSettled(workspaces.map((w) => w.api.close()));
    limiters.close();
    await mirror.close();
    throw err;
  }
  return {
    mirror,
    workspaces,
    engine,
    abort,
    metrics,
    limiters,
    phase: 'starting: checking the workspaces',
    checks: new WorkspaceChecks(config, logger, (account) => metrics.attemptHook(account)),
  };
}

/**
 * One client per configured workspace. Workspaces of one base URL and key share a rate limiter
 * (learned rate included), so a 429 for one slows all of them, and only them; with the BullMQ
 * engine that limiter is shared through Redis by every daemon of the queue prefix. When every workspace
 * shares one, a 429 also pauses the whole BullMQ queue (every daemon of the mirror backs off); with
 * several keys that would slow workspaces the 429 does not concern, so each limiter keeps it to its own.
 */
function workspaceClients(config: Config, logger: Logger, metrics: Metrics, signal: AbortSignal, limiters: LimiterPool, onRateLimited: (ms: number) => void): DaemonWorkspace[] {
  const oneKey = new Set(config.workspaces.map((w) => `${w.baseUrl}\n${w.apiKey}`)).size === 1;
  return config.workspaces.map((workspace) => {
    const accountId = workspace.accountId ?? DEFAULT_ACCOUNT;
    const wlogger = logger.child({ account_id: accountId });
    const api = apiClientFromConfig(
      { ...config, ...workspace },
      {
        logger: wlogger,
        signal,
        limiters,
        onAttempt: metrics.attemptHook(accountId),
        ...(oneKey ? { onRateLimited } : {}),
      },
    );
    return { accountId, workspace, api, logger: wlogger };
  });
}

/**
 * Starts the HTTP server (health, readiness, metrics) on `config.httpHost:config.httpPort`, or on
 * `override`; none when the port is 0 (or `override` is false). `/readyz` checks that Redis answers
 * a PING on the queue's connection (BullMQ mode), that the mirror answers a round trip
 * (`Mirror.ping`: PostgreSQL a `SELECT 1`), that a workspace passed its check, and that the daemon
 * is in phase `ready` (else it names the phase).
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_HTTP_PORT when the port is taken or not allowed,
 *   or CONVO_MIRROR_HTTP_HOST when the interface does not exist here
 */
async function startHttp(config: Config, logger: Logger, res: Resources, override: DaemonOptions['httpListen']): Promise<RunningServer | undefined> {
  if (override === false || (override === undefined && config.httpPort === 0)) return undefined;
  const host = override?.host ?? config.httpHost;
  const port = override?.port ?? config.httpPort;
  const checks: ReadinessCheck[] = [
    ...res.engine.checks,
    // A round trip to the database (PostgreSQL: SELECT 1; its failure names CONVO_MIRROR_DB, password masked).
    { name: 'mirror', check: () => res.mirror.ping() },
    { name: 'api', check: () => res.checks.assertReady() },
    {
      name: 'daemon',
      check: () => {
        if (res.phase !== 'ready') throw new Error(res.phase);
      },
    },
  ];
  try {
    const webhooks: WebhookOptions | undefined = config.webhookSecret
      ? {
          secret: config.webhookSecret,
          idPointers: config.webhookIdPointers,
          accounts: res.workspaces.map((w) => w.accountId),
          enqueue: (accountId, conversationId) => res.engine.enqueueConversation(accountId, conversationId),
        }
      : undefined;
    // fastify loads only when the daemon serves HTTP.
    const { startServer } = await import('../src/server/index.js');
    return await startServer({ logger, metrics: res.metrics, checks, plugins: res.engine.plugins, webhooks }, { host, port });
  } catch (err) {
    throw listenError(err, host, port);
  }
}

/**
 * Shutdown: `/readyz` says 503; no new jobs; running ones get `config.shutdownTimeoutMs`, then are
 * aborted (they resume from their checkpoints) and get {@link ABORT_WAIT_MS}; everything is closed
 * within {@link HTTP_CLOSE_WAIT_MS} + {@link CLOSE_WAIT_MS} more.
 */
async function shutdown(config: Config, logger: Logger, res: Resources): Promise<Omit<DaemonExit, 'fatal'>> {
  const t0 = Date.now();
  res.phase = 'shutting down';
  logger.info({ grace_ms: config.shutdownTimeoutMs, then_at_most_ms: SHUTDOWN_HARD_BOUND_MS }, 'shutting down: no new jobs; waiting for running ones');
  const { forced, abandoned } = await res.engine.stop(config.shutdownTimeoutMs, () => res.abort.abort(new Error('daemon shutting down')), ABORT_WAIT_MS);
  await release(res, logger);
  const shutdownMs = Date.now() - t0;
  logger.info({ shutdown_ms: shutdownMs, forced, ...(abandoned > 0 ? { abandoned } : {}) }, 'daemon stopped');
  return { shutdownMs, forced };
}

/**
 * Closes the HTTP server (logging `http server closed`), the engine, the clients and the mirror
 * (its writer lock released), each bounded.
 */
async function release(res: Resources, logger: Logger): Promise<void> {
  res.phase = 'shutting down';
  res.checks.stop();
  if (res.server) {
    await res.server.close(HTTP_CLOSE_WAIT_MS).catch(() => {});
    logger.info({ http: res.server.url }, 'http server closed');
  }
  await res.engine.close(CLOSE_WAIT_MS).catch(() => {});
  await Promise.allSettled(res.workspaces.map((w) => w.api.close()));
  res.limiters.close();
  await res.mirror.close();
}
