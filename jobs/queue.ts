/**
 * The BullMQ side of convo-mirror: one queue, two job kinds, the job schedulers, and Redis
 * connections. Thin: job data carries ids, modes and what a job records for its run (its run id,
 * listing figures, request tallies, a failure record; never the API key); the work is done by
 * src/run's steps through jobs/processors.ts.
 */
import { Queue, type JobsOptions } from 'bullmq';
import { Redis, type RedisOptions } from 'ioredis';
import type { Config } from '../config/index.js';
import { redisShown, redisTarget } from '../config/redis-url.js';
import { ConfigError } from '../src/errors.js';
import type { ListingFigures, RunSummary } from '../src/run/index.js';
import type { RunFailureRecord } from '../src/store/mirror.js';
import type { ConversationResult } from '../src/sync/conversation.js';
import type { RequestTally } from '../src/api/client.js';

/** Name of the queue (keys are `<prefix>:sync:*`). */
export const QUEUE_NAME = 'sync';
/** Job name of a workspace sync (regular or full). */
export const WORKSPACE_JOB = 'sync-workspace';
/** Job name of one conversation's sync. */
export const CONVERSATION_JOB = 'sync-conversation';
/** Job name of an erasure (`enqueue --erase-sender`, `--erase-conversation`): jobs/erase-job.ts. */
export const ERASE_JOB = 'erase';
/**
 * Scheduler ids: one per workspace and schedule (`workspace-regular:<account id>`), so any number of
 * daemons of one mirror make one job per tick. Versions that mirrored one workspace used the bare
 * names; {@link registerSchedulers} removes those.
 */
export const SCHEDULER_REGULAR = 'workspace-regular';
export const SCHEDULER_FULL = 'workspace-full';
/** Scheduler id of a workspace's schedule. */
export const schedulerId = (kind: 'regular' | 'full', accountId: string) => `${kind === 'full' ? SCHEDULER_FULL : SCHEDULER_REGULAR}:${accountId}`;

/** Data of a `sync-workspace` job. `step` and the rest are written by the job as it advances. */
export interface WorkspaceJobData {
  /**
   * The workspace (its account id, `default` without `X-Account-Id`); never its key. Absent in
   * jobs of versions that mirrored one workspace: then the daemon's only workspace.
   */
  accountId?: string;
  /** `regular`: resumes recent checkpoints; `full`: re-reads every page of every conversation. */
  mode: 'regular' | 'full';
  /** Who asked: a job scheduler, or `enqueue` (absent in jobs queued by older versions: told from the job). */
  trigger?: 'schedule' | 'on-demand';
  /** The step to run next: `list`, then `crawl` (waiting for the children), then `finish`. */
  step?: 'list' | 'crawl' | 'finish';
  /** The run, set by the `list` step (kept across attempts and crashes). */
  runId?: number;
  /** When the run started, epoch ms. */
  startedMs?: number;
  /**
   * The listing, written by the `list` step for `finish`. Its `failure` (an unsettled list) is a
   * `run_failures` record; a string in jobs listed by older versions.
   */
  listing?: Omit<ListingFigures, 'failure'> & { failure?: RunFailureRecord | string | undefined };
}

/** Data of a `sync-conversation` job. */
export interface ConversationJobData {
  /** The workspace the conversation belongs to; absent as in {@link WorkspaceJobData.accountId}. */
  accountId?: string;
  conversationId: string;
  /** Re-read every page (no checkpoint from before this job). */
  full?: boolean;
  /** Who asked for an on-demand job: `enqueue` (`on-demand`, the default) or a webhook. */
  trigger?: 'on-demand' | 'webhook';
  /** Set when the job is a child of a workspace run: the run it belongs to. */
  runId?: number;
  /** Set by an on-demand job at its first attempt: its own run, kept across attempts. */
  ownRunId?: number;
  /** Change signal of the workspace run (children of regular runs only). */
  changeField?: string;
  /**
   * The run's complete listing no longer shows this conversation (a re-check): only then does a
   * 404 mean it was deleted, and tombstone it.
   */
  unlisted?: boolean;
  /**
   * Written by the job: what its attempts so far asked the API and were served (requests, retries,
   * 429s, messages), so a run counts every attempt.
   */
  tally?: RequestTally;
  /**
   * Written by the job before it fails: the failure as `run_failures` records it (the error's code,
   * HTTP status and attempts), read by the workspace run's `finish` step.
   */
  failure?: RunFailureRecord;
}

/** Return value of a `sync-conversation` job. */
export interface ConversationJobResult {
  result: ConversationResult;
  /**
   * What every attempt of the job asked the API and was served (absent in jobs completed by older
   * versions: then `result.tally`, the last attempt's).
   */
  tally?: RequestTally;
  /** The run recorded for an on-demand job (absent for children of a workspace run). */
  summary?: RunSummary;
}

/**
 * Data of an `erase` job. `subject` is what the job needs to erase, so Redis holds it while the
 * job waits and runs; the job drops it from its data as soon as the mirror has recorded the
 * erasure (then `erasureId` is set), and when it fails for good. Never logged: the worker's log
 * lines and `status` read `conversationId`, which an erase job does not have.
 */
export interface EraseJobData {
  /** The workspace (its account id, `default` without `X-Account-Id`). */
  accountId: string;
  kind: 'sender' | 'conversation';
  /** The sender id or the conversation id; absent once the mirror recorded the erasure, or the job failed for good. */
  subject?: string;
  /** Why (a ticket reference); the mirror and the erasure record carry it. */
  reason: string;
  /** The mirror's erasure, once recorded: a retried attempt then runs only the archive step. */
  erasureId?: number;
}

/** Return value of an `erase` job: the erasure's id, kind, account and counts, never the subject. */
export interface EraseJobResult {
  outcome: 'erased';
  erasureId: number;
  kind: 'sender' | 'conversation';
  accountId: string;
  /** Rows the mirror redacted (0 when an earlier attempt recorded the erasure). */
  messages: number;
  history: number;
  pendingChanges: number;
  conversations: number;
  /** Published lines left to the archive step. */
  publishedLines: number;
  /** The archive step: done (files rewritten, lines stubbed, the record's batch id or null when none was needed), or left to another publisher. */
  archive: { files: number; lines: number; recordBatchId: number | null } | { pending: 'busy' | 'fenced' };
}

/** Options of {@link jobOptions}. */
export interface JobPolicy {
  /** Attempts before a job is kept as failed (dead letter). @defaultValue 5 */
  attempts: number;
  /** First retry delay of the exponential backoff, ms. @defaultValue 1000 */
  backoffMs?: number;
  /** How long a failed job (a dead letter) is kept, ms. @defaultValue {@link FAILED_JOBS_MAX_AGE_MS} (7 days) */
  failedMaxAgeMs?: number;
  /** Most failed jobs kept (the oldest are dropped first). @defaultValue {@link FAILED_JOBS_MAX_COUNT} (1,000) */
  failedMaxCount?: number;
}

/** Completed jobs kept: the last 1,000, for at most 7 days. */
const COMPLETED_KEPT = { count: 1000, age: 7 * 24 * 3600 } as const;

/** How long failed jobs are kept by default, ms (`CONVO_MIRROR_FAILED_JOBS_MAX_AGE`): 7 days. */
export const FAILED_JOBS_MAX_AGE_MS = 7 * 24 * 3600 * 1000;

/** How many failed jobs are kept by default (`CONVO_MIRROR_FAILED_JOBS_MAX_COUNT`). */
export const FAILED_JOBS_MAX_COUNT = 1000;

/**
 * Options every job gets: `attempts` with exponential backoff; completed jobs trimmed to the last
 * 1,000 (and 7 days); failed jobs, the dead letter list `status` shows and `retry-failed`
 * re-queues, kept for `failedMaxAgeMs` and at most `failedMaxCount` of them (BullMQ trims them
 * when a job fails). Every run's failures stay in the mirror (`run_failures`) whatever Redis keeps.
 */
export function jobOptions(policy: JobPolicy): JobsOptions {
  return {
    attempts: policy.attempts,
    backoff: { type: 'exponential', delay: policy.backoffMs ?? 1000 },
    removeOnComplete: COMPLETED_KEPT,
    removeOnFail: { age: Math.ceil((policy.failedMaxAgeMs ?? FAILED_JOBS_MAX_AGE_MS) / 1000), count: policy.failedMaxCount ?? FAILED_JOBS_MAX_COUNT },
  };
}

/** The job policy of a configuration: its attempts, and how long and how many failed jobs Redis keeps. */
export function jobPolicyOf(config: Pick<Config, 'jobAttempts' | 'failedJobsMaxAgeMs' | 'failedJobsMaxCount'>): JobPolicy {
  return { attempts: config.jobAttempts, failedMaxAgeMs: config.failedJobsMaxAgeMs, failedMaxCount: config.failedJobsMaxCount };
}

/** Where the daemon's keys live. */
export interface QueueSettings {
  redisUrl: string;
  /** BullMQ key prefix (one per mirror). */
  prefix: string;
}

/** Longest wait between two attempts to reconnect to Redis, ms: a connection is back within this long of Redis. */
export const REDIS_RECONNECT_MAX_MS = 1000;

/**
 * The wait before the `attempt`-th attempt to reconnect (1, 2, ...), ms: 250, 500, 750, then
 * {@link REDIS_RECONNECT_MAX_MS} (1000) for as long as Redis is away. BullMQ's own default backs off
 * to 20 s: after a Redis restart the queue's connection stayed away for up to 20 s while Redis
 * answered again (webhooks got 503 meanwhile).
 */
export const reconnectDelayMs = (attempt: number): number => Math.min(250 * attempt, REDIS_RECONNECT_MAX_MS);

/** How long a connection being closed may take before its socket is destroyed, ms. */
const DISCONNECT_TIMEOUT_MS = 300;

/** Options of {@link redisConnection}. */
export interface RedisConnectionOptions {
  /**
   * Asked each time a connection is lost: true ends it for good instead of reconnecting (its
   * pending commands fail at once). For a shutdown that must not wait for a Redis that is away.
   * @defaultValue never stop
   */
  stopReconnecting?: () => boolean;
}

/**
 * ioredis options for a Redis URL (`redis://[user:pass@]host[:port][/db]`, `rediss://` for TLS;
 * config/redis-url.ts reads it, so what is shown is what is connected to), with
 * `maxRetriesPerRequest: null` as BullMQ workers require, reconnecting every
 * {@link reconnectDelayMs} (at most 1 s apart) while Redis is away. Passing options (not a client)
 * lets BullMQ open and close its own connections.
 */
export function redisConnection(url: string, o: RedisConnectionOptions = {}): RedisOptions {
  const t = redisTarget(url);
  return {
    host: t.host,
    port: t.port,
    ...(t.username !== undefined ? { username: t.username } : {}),
    ...(t.password !== undefined ? { password: t.password } : {}),
    db: t.db,
    ...(t.tls ? { tls: {} } : {}),
    maxRetriesPerRequest: null,
    enableReadyCheck: true,
    retryStrategy: (attempt: number) => (o.stopReconnecting?.() ? null : reconnectDelayMs(attempt)),
    // On disconnect ioredis ends the socket and destroys it if it has not closed within this long;
    // it arms that timer on a socket that had already closed too (Redis gone), and the timer held
    // a stopped daemon's process for its 2 s default.
    disconnectTimeout: DISCONNECT_TIMEOUT_MS,
  };
}

/** A Redis that did not answer within the time allowed. */
class RedisTimeout extends Error {}

/**
 * Why Redis could not be used, in our words (the library's text stays in the error's `cause`):
 * refused, host not found, no answer within `timeoutMs`, a refused password, not Redis, TLS.
 */
export function redisProblem(err: unknown, timeoutMs: number): string {
  const code = String((err as { code?: unknown } | undefined)?.code ?? '');
  const text = err instanceof Error ? err.message : String(err);
  if (code === 'ECONNREFUSED') return 'connection refused';
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return 'host not found';
  if (code === 'ETIMEDOUT' || err instanceof RedisTimeout || /timed out/i.test(text)) return `no answer within ${timeoutMs / 1000} s`;
  if (/^(WRONGPASS|NOAUTH|NOPERM)/.test(text)) return 'the user name or password was refused';
  if (/DB index is out of range/i.test(text)) return 'the database number in the URL does not exist';
  if (/^Protocol error/.test(text)) return 'what answers there is not Redis';
  if (/SSL|TLS|CERT|EPROTO/i.test(`${code} ${text}`)) return 'the TLS handshake failed';
  if (code === 'ECONNRESET' || /Connection is closed|max retries per request|Stream isn't writeable/i.test(text)) return 'the connection was lost';
  return 'it did not answer as Redis does';
}

/**
 * The message and code of a Redis error, for an error's `cause` (the debug log): ioredis errors
 * carry the command they answer, and AUTH's arguments are the password.
 */
export function redisCause(err: unknown): Error {
  const code = (err as { code?: unknown } | undefined)?.code;
  return Object.assign(new Error(err instanceof Error ? err.message : String(err)), typeof code === 'string' ? { code } : {});
}

/**
 * Checks that Redis answers, quickly: one attempt, bounded in all by `timeoutMs` (a server that
 * accepts the connection and never answers included).
 *
 * @throws {@link ConfigError} naming REDIS_URL and Redis as {@link redisShown} shows it (user and password masked)
 */
export async function assertRedisReachable(url: string, timeoutMs = 3000): Promise<void> {
  // The options every connection uses (not ioredis's own reading of the URL): the database PINGed is the queue's.
  const probe = new Redis({ ...redisConnection(url), lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: timeoutMs, commandTimeout: timeoutMs, enableOfflineQueue: false, disconnectTimeout: 200 });
  let socketError: Error | undefined;
  probe.on('error', (err: Error) => (socketError ??= err));
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new RedisTimeout()), timeoutMs)));
  try {
    // SELECT explicitly: ioredis only emits an event when the URL's database does not exist, and
    // the connection then goes on in database 0.
    await Promise.race([probe.connect().then(() => probe.select(redisTarget(url).db)).then(() => probe.ping()), timedOut]);
  } catch (err) {
    const why = socketError ?? err;
    throw new ConfigError('REDIS_URL', `cannot reach Redis at ${redisShown(url)}: ${redisProblem(why, timeoutMs)}; start Redis there or set REDIS_URL`, redisCause(why));
  } finally {
    clearTimeout(timer);
    probe.disconnect();
  }
}

/**
 * Binds a queue prefix to one mirror: the first daemon writes its mirror id under
 * `<prefix>:sync:mirror`; a daemon of another mirror on the same prefix is refused, because the two
 * would take each other's jobs and mirror them into the wrong file.
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_QUEUE_PREFIX when the prefix belongs to another mirror
 */
export async function claimQueuePrefix(settings: QueueSettings, mirrorId: string): Promise<void> {
  const redis = new Redis(redisConnection(settings.redisUrl));
  redis.on('error', () => {});
  const key = `${settings.prefix}:${QUEUE_NAME}:mirror`;
  try {
    await redis.set(key, mirrorId, 'NX');
    const owner = await redis.get(key);
    if (owner !== mirrorId) {
      throw new ConfigError(
        'CONVO_MIRROR_QUEUE_PREFIX',
        `the queue prefix "${settings.prefix}" belongs to another mirror (id ${owner}; this one is ${mirrorId}): give each mirror its own prefix, or delete the Redis key ${key} if that mirror is gone`,
      );
    }
  } finally {
    redis.disconnect();
  }
}

/** Options of {@link openQueue}. */
export interface OpenQueueOptions {
  /**
   * Write nothing on opening: BullMQ's Queue otherwise writes its version into `<prefix>:sync:meta`
   * (`skipMetasUpdate`). For readers (`status`).
   */
  readOnly?: boolean;
  /**
   * A command not answered within this long (ms) fails (ioredis `commandTimeout`, one retry)
   * instead of waiting for Redis to come back, and a dead connection is dropped after 200 ms on
   * closing: for the CLI, never for a daemon's long-lived queue.
   */
  answerWithinMs?: number;
  /** See {@link RedisConnectionOptions.stopReconnecting} (the daemon's shutdown). @defaultValue never stop */
  stopReconnecting?: () => boolean;
}

/** Opens the queue (its own connection). Close it with `queue.close()`. */
export function openQueue(settings: QueueSettings, o: OpenQueueOptions = {}): Queue {
  const bounded = o.answerWithinMs !== undefined ? { commandTimeout: o.answerWithinMs, maxRetriesPerRequest: 1, disconnectTimeout: 200 } : {};
  const connection = { ...redisConnection(settings.redisUrl, o.stopReconnecting ? { stopReconnecting: o.stopReconnecting } : {}), ...bounded };
  const queue = new Queue(QUEUE_NAME, { connection, prefix: settings.prefix, ...(o.readOnly ? { skipMetasUpdate: true } : {}) });
  queue.on('error', () => {}); // reported by the callers' awaits; avoid unhandled 'error' events
  return queue;
}

/** One workspace's schedules, for {@link registerSchedulers}. */
export interface WorkspaceSchedule {
  /** Account id (`default` without `X-Account-Id`). */
  accountId: string;
  /** Cron of the regular workspace sync. */
  schedule: string;
  /** Cron of the full refresh. */
  fullSchedule: string;
}

/** Options of {@link registerSchedulers}. */
export interface ScheduleSettings {
  /** IANA time zone of every cron. */
  tz: string;
  policy: JobPolicy;
}

/**
 * Registers (or updates) two job schedulers per workspace, their jobs carrying the account id.
 * Idempotent: upserting the same ids from any number of daemons of one mirror leaves one scheduler
 * each, and each tick produces one job. Schedulers of workspaces no longer configured, and the
 * single-workspace ones of earlier versions, are removed: the configuration is the truth, so
 * daemons sharing a queue prefix must configure the same workspaces.
 *
 * @returns the ids of the schedulers removed
 */
export async function registerSchedulers(queue: Queue, workspaces: readonly WorkspaceSchedule[], s: ScheduleSettings): Promise<string[]> {
  const opts = jobOptions(s.policy);
  const wanted = new Set<string>();
  for (const w of workspaces) {
    for (const mode of ['regular', 'full'] as const) {
      const id = schedulerId(mode, w.accountId);
      wanted.add(id);
      await queue.upsertJobScheduler(
        id,
        { pattern: mode === 'full' ? w.fullSchedule : w.schedule, tz: s.tz },
        { name: WORKSPACE_JOB, data: { accountId: w.accountId, mode, trigger: 'schedule' } satisfies WorkspaceJobData, opts },
      );
    }
  }
  const removed: string[] = [];
  for (const j of await queue.getJobSchedulers()) {
    const ours = j.key === SCHEDULER_REGULAR || j.key === SCHEDULER_FULL || j.key.startsWith(`${SCHEDULER_REGULAR}:`) || j.key.startsWith(`${SCHEDULER_FULL}:`);
    if (ours && !wanted.has(j.key) && (await queue.removeJobScheduler(j.key))) removed.push(j.key);
  }
  return removed;
}

/** Deduplication id of a conversation's on-demand jobs (per workspace). */
export const conversationDedupId = (accountId: string, conversationId: string) => `conversation-${accountId}-${conversationId}`;

/**
 * Queues an on-demand sync of one conversation of workspace `o.accountId`, deduplicated per
 * conversation: while one is waiting, asking again adds nothing; while one runs, asking again leads
 * to exactly one more run after it (BullMQ `deduplication` with `keepLastIfActive`).
 *
 * @returns the id of the job now holding the conversation's deduplication key: the waiting job, or
 *   while one runs, the running job (the follow-up run gets its own id when that one ends; read it
 *   with `queue.getDeduplicationJobId(conversationDedupId(account, id))`)
 */
export async function enqueueConversation(
  queue: Queue,
  conversationId: string,
  o: { accountId: string; full?: boolean; trigger?: ConversationJobData['trigger']; policy: JobPolicy },
): Promise<string> {
  const data: ConversationJobData = { accountId: o.accountId, conversationId, ...(o.full ? { full: true } : {}), ...(o.trigger ? { trigger: o.trigger } : {}) };
  const job = await queue.add(CONVERSATION_JOB, data, {
    ...jobOptions(o.policy),
    deduplication: { id: conversationDedupId(o.accountId, conversationId), keepLastIfActive: true },
  });
  return job.id!;
}

/** Queues an on-demand sync (regular or full) of workspace `o.accountId`. @returns the job id */
export async function enqueueWorkspace(queue: Queue, o: { accountId: string; full?: boolean; policy: JobPolicy }): Promise<string> {
  const data: WorkspaceJobData = { accountId: o.accountId, mode: o.full ? 'full' : 'regular', trigger: 'on-demand' };
  const job = await queue.add(WORKSPACE_JOB, data, jobOptions(o.policy));
  return job.id!;
}

/**
 * Queues an erasure for the daemon. Not deduplicated. Removed from Redis once it completes
 * (`removeOnComplete`): its result names no subject, but its data held one. A job that fails for
 * good is kept as a dead letter like any other, without its subject (the job drops it). Checks
 * nothing: the daemon's job refuses an invalid request (jobs/erase-job.ts).
 *
 * @returns the job id
 */
export async function enqueueErase(queue: Queue, data: EraseJobData, policy: JobPolicy): Promise<string> {
  const job = await queue.add(ERASE_JOB, data, { ...jobOptions(policy), removeOnComplete: true });
  return job.id!;
}
