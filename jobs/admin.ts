/**
 * Queue administration for the CLI (`status`, `enqueue`, `retry-failed`): the only BullMQ the
 * commands need, kept beside the queue it administers so src/ never imports bullmq.
 *
 * Every command here is bounded: Redis is probed first (a few seconds), and each command after
 * that fails when Redis does not answer it within {@link ANSWER_MS} instead of waiting for Redis to
 * come back. `status` writes nothing to Redis.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { Job, QueueEvents, type JobState, type Queue } from 'bullmq';
import { redisShown } from '../config/redis-url.js';
import { ConfigError, describeError } from '../src/errors.js';
import {
  assertRedisReachable,
  conversationDedupId,
  enqueueConversation,
  enqueueErase,
  enqueueWorkspace,
  QUEUE_NAME,
  openQueue,
  redisCause,
  redisConnection,
  redisProblem,
  type ConversationJobData,
  type EraseJobResult,
  type JobPolicy,
  type QueueSettings,
  type WorkspaceJobData,
} from './queue.js';

/** How long one Redis command of a CLI command may go unanswered before it fails, ms. */
export const ANSWER_MS = 5000;
/**
 * How often `enqueue --wait` reads the state of the job it follows, ms, at most: the job's
 * `completed` or `failed` event wakes it at once.
 */
export const POLL_MS = 500;
/**
 * How often `enqueue --wait` checks that a worker (a daemon) serves the queue, ms; it also checks
 * at once. A queue no worker serves fails the wait within this long.
 */
export const WORKER_CHECK_MS = 2000;

/** Queue figures for `status`, or why they are missing. */
export type QueueStatus =
  | {
      /** Where the queue lives, as config/redis-url.ts `redisShown` shows it: `redis://127.0.0.1:6379/5`. */
      redis: string;
      prefix: string;
      counts: Record<string, number>;
      schedulers: { id: string; pattern?: string | undefined; tz?: string | undefined; next?: string | undefined }[];
      failed: { id?: string | undefined; name: string; conversation_id?: string | undefined; attempts: number; reason: string; failed_at?: string | undefined }[];
      /** The daemons serving the prefix now: their workers connected to Redis ({@link DaemonWorker}). */
      workers: DaemonWorker[];
      /** The jobs running now, oldest first, at most {@link MAX_ACTIVE_SHOWN} ({@link ActiveJob}). */
      active: ActiveJob[];
    }
  | { redis: string; error: string };

/**
 * A daemon's worker serving the queue, as Redis lists its connection (`CLIENT LIST`, read by
 * BullMQ's `queue.getWorkers()`).
 */
export interface DaemonWorker {
  /**
   * The worker's name, `<hostname>:<pid>` (see `workerName` in bullmq-engine.ts); `unnamed` for a
   * worker of a version that gave none.
   */
  name: string;
  /** The address its connection comes from, as Redis sees it (`host:port`). */
  addr?: string | undefined;
  /** How long its connection has been open, seconds. */
  connected_s?: number | undefined;
}

/** A job running now (BullMQ state `active`). */
export interface ActiveJob {
  id?: string | undefined;
  /** The job's name (`sync-workspace`, `sync-conversation`...). */
  name: string;
  /** The name of the worker running it ({@link DaemonWorker.name}); undefined when it did not say. */
  worker?: string | undefined;
  account_id?: string | undefined;
  conversation_id?: string | undefined;
  /** When this attempt started (ISO 8601 UTC). */
  started_at?: string | undefined;
  /** How long this attempt has been running, ms (at the time of the read; never negative). */
  running_ms?: number | undefined;
  /** This attempt's number, from 1. */
  attempt: number;
}

/** Active jobs `status` lists at most. */
export const MAX_ACTIVE_SHOWN = 100;

/** An error of the Redis connection (not answering, closed, refused), as ioredis and BullMQ word it. */
function isConnectionError(err: unknown): boolean {
  return /timed out|max retries per request|Connection is closed|Stream isn't writeable|ECONN|EPIPE|ETIMEDOUT|EHOSTUNREACH/i.test(describeError(err));
}

/**
 * A Redis that stopped answering midway, as a {@link ConfigError} naming REDIS_URL (the URL with its
 * user and password masked); any other error is returned as is.
 */
function redisLost(settings: QueueSettings, err: unknown): unknown {
  if (err instanceof ConfigError || !isConnectionError(err)) return err; // ours already, or not Redis's
  return new ConfigError('REDIS_URL', `Redis at ${redisShown(settings.redisUrl)} stopped answering: ${redisProblem(err, ANSWER_MS)}; check that it runs, or set REDIS_URL`, redisCause(err));
}

/**
 * Closes a queue or its events: politely, disconnected after {@link ANSWER_MS} at most, or at once
 * when Redis stopped answering (`lost`). Closing is asked for in both cases: it stops their loops.
 */
async function closeQueue(queue: Pick<Queue, 'close' | 'disconnect'>, lost: boolean): Promise<void> {
  const closed = queue.close().then(
    () => true,
    () => false,
  );
  if (!(await Promise.race([closed, sleep(lost ? 0 : ANSWER_MS, false, { ref: false })]))) await queue.disconnect().catch(() => {});
}

/**
 * The queue's job counts, its schedulers with their next run, the last 10 failed jobs (the dead
 * letter list), the daemons serving the prefix (their workers' Redis connections: `CLIENT LIST`)
 * and the jobs running now with the worker running each. Read-only: writes nothing to Redis (not even BullMQ's queue metadata), so a
 * prefix never used stays without a key. Never throws for an unreachable Redis (1.5 s probe) or
 * one that stops answering: returns why instead.
 *
 * @param now - the time active jobs' running times are measured to, epoch ms @defaultValue `Date.now`
 */
export async function queueStatus(settings: QueueSettings, now: () => number = Date.now): Promise<QueueStatus> {
  const redis = redisShown(settings.redisUrl);
  try {
    await assertRedisReachable(settings.redisUrl, 1500);
  } catch (err) {
    return { redis, error: describeError(err) };
  }
  const queue = openQueue(settings, { readOnly: true, answerWithinMs: ANSWER_MS });
  let lost = false;
  try {
    return { redis, prefix: settings.prefix, ...(await readQueue(queue, settings.prefix, now)) };
  } catch (err) {
    lost = isConnectionError(err);
    if (!lost) throw err;
    return { redis, error: describeError(redisLost(settings, err)) };
  } finally {
    await closeQueue(queue, lost);
  }
}

/** The figures of {@link queueStatus}, read (only read) from `queue`; `now` in epoch ms. */
async function readQueue(queue: Queue, prefix: string, now: () => number): Promise<Omit<Extract<QueueStatus, { counts: unknown }>, 'redis' | 'prefix'>> {
  const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed', 'waiting-children', 'prioritized');
  const schedulers = (await queue.getJobSchedulers()).map((j) => ({
    id: j.key,
    pattern: j.pattern,
    tz: j.tz,
    next: j.next ? new Date(j.next).toISOString() : undefined,
  }));
  const failed = (await queue.getFailed(0, 9)).map((j) => ({
    id: j.id,
    name: j.name,
    conversation_id: (j.data as { conversationId?: string } | undefined)?.conversationId,
    attempts: j.attemptsMade,
    reason: j.failedReason,
    failed_at: j.finishedOn ? new Date(j.finishedOn).toISOString() : undefined,
  }));
  const workers = workersOf(prefix, await queue.getWorkers());
  const at = now();
  const active = (await queue.getActive(0, MAX_ACTIVE_SHOWN - 1))
    .map((j): ActiveJob => {
      const data = j.data as (Partial<WorkspaceJobData> & Partial<ConversationJobData>) | undefined;
      return {
        id: j.id,
        name: j.name,
        worker: j.processedBy,
        account_id: data?.accountId,
        conversation_id: data?.conversationId,
        started_at: j.processedOn ? new Date(j.processedOn).toISOString() : undefined,
        running_ms: j.processedOn ? Math.max(0, at - j.processedOn) : undefined,
        attempt: j.attemptsMade + 1,
      };
    })
    .sort((a, b) => (b.running_ms ?? 0) - (a.running_ms ?? 0));
  return { counts, schedulers, failed, workers, active };
}

/**
 * The workers of `getWorkers()` (one Redis connection each, named `<prefix>:<queue>:w:<name>`, or
 * `<prefix>:<queue>` for a worker without a name), by name.
 */
function workersOf(prefix: string, clients: Record<string, string>[]): DaemonWorker[] {
  const named = `${prefix}:${Buffer.from(QUEUE_NAME).toString('base64')}:w:`;
  return clients
    .map((c) => {
      const raw = c.rawname ?? '';
      const age = Number(c.age);
      return { name: raw.startsWith(named) ? raw.slice(named.length) : 'unnamed', addr: c.addr, connected_s: Number.isFinite(age) ? age : undefined };
    })
    .sort((a, b) => a.name.localeCompare(b.name));
}

/** How one awaited job ended. */
export interface JobOutcome {
  id: string;
  /** Completed, and (for a workspace job) its run succeeded. */
  ok: boolean;
  /** One line: `completed`, `completed, run partial`, or the failure. */
  message: string;
}

/** A job `enqueue --wait` stopped following before it finished, and its BullMQ state then. */
export interface UnfinishedJob {
  id: string;
  /** `waiting`, `active`, `delayed`, `prioritized`, `waiting-children`. */
  state: string;
}

/** What {@link enqueueJobs} saw. */
export interface EnqueueResult {
  /** Every awaited job that finished completed with a successful run (always true without `wait`). */
  ok: boolean;
  /**
   * Set when the wait ended before every job finished: no worker serves the queue (none at the
   * start, or it went away), or `timeoutMs` passed. The jobs stay queued.
   */
  unfinished?: { reason: 'no-worker' | 'timeout'; jobs: UnfinishedJob[] };
}

/** Options of {@link enqueueJobs}. */
export interface EnqueueOptions {
  /** The workspace (account id; `default` without `X-Account-Id`) the jobs are for. */
  accountId: string;
  /** Conversations to sync; none or empty = one workspace sync (unless `erase`). */
  conversationIds?: string[] | undefined;
  /**
   * An erasure instead of syncs (one `erase` job, removed from Redis once it completes): its kind,
   * subject and reason. Its outcome says the erasure's id and counts, never the subject.
   */
  erase?: { kind: 'sender' | 'conversation'; subject: string; reason: string } | undefined;
  full: boolean;
  policy: JobPolicy;
  /** Called with the ids of the jobs queued, before any wait. */
  onQueued: (ids: string[]) => void;
  /** Wait for the jobs, calling `onOutcome` as each ends; give up after `timeoutMs` (ms) in all. */
  wait?: { timeoutMs: number; onOutcome: (o: JobOutcome) => void };
}

/** A job followed by the wait; `dedupKey` for a conversation job, whose follow-up run is followed too. */
interface Followed {
  id: string;
  dedupKey?: string;
}

/**
 * Queues on-demand jobs (named conversations, deduplicated per conversation, or a workspace sync)
 * and, with `wait`, follows each to its outcome. A conversation asked for while its job runs is
 * answered by deduplication with the running job; the run asked for starts when that one ends,
 * under another id, so the deduplication key is followed until no newer run is pending.
 *
 * The wait reads the followed job's state when its end event comes, else every {@link POLL_MS}. It
 * stops early, the jobs left queued, when no worker serves the queue (checked at once, then every
 * {@link WORKER_CHECK_MS}) or when `timeoutMs` passes; the result says which, with each unfinished
 * job's state.
 *
 * @throws {@link ConfigError} naming REDIS_URL when Redis is unreachable or stops answering
 */
export async function enqueueJobs(settings: QueueSettings, o: EnqueueOptions): Promise<EnqueueResult> {
  await assertRedisReachable(settings.redisUrl);
  const queue = openQueue(settings, { answerWithinMs: ANSWER_MS });
  const events = o.wait ? new QueueEvents(QUEUE_NAME, { connection: redisConnection(settings.redisUrl), prefix: settings.prefix }) : undefined;
  events?.on('error', () => {}); // its commands are bounded by the queue's: a lost Redis fails those
  let lost = false;
  try {
    const wake = events ? await FinishWake.listen(events) : undefined; // before adding: no event missed
    const jobs = await addJobs(queue, o);
    o.onQueued(jobs.map((j) => j.id));
    return o.wait && wake ? await followJobs(queue, jobs, o.wait, wake) : { ok: true };
  } catch (err) {
    lost = isConnectionError(err);
    throw redisLost(settings, err);
  } finally {
    if (events) await closeQueue(events, lost);
    await closeQueue(queue, lost);
  }
}

/**
 * Wakes the wait early when the job it watches ends (its `completed` or `failed` event), so the
 * conversation's follow-up run is read from the deduplication key at once: a quick follow-up run
 * could otherwise end, and take the key with it, between two polls.
 */
class FinishWake {
  private watched: string | undefined;
  private ended = false;
  private wakeUp: (() => void) | undefined;
  /** What the jobs completed since the wait began returned, by id: a job removed on completion (`erase`) is read from here. */
  private readonly values = new Map<string, unknown>();

  private constructor(events: QueueEvents) {
    const onEnd = ({ jobId }: { jobId: string }) => {
      if (jobId !== this.watched) return;
      this.ended = true;
      this.wakeUp?.();
    };
    events.on('completed', (e: { jobId: string; returnvalue: unknown }) => {
      // Every job's (the last 1,000): the followed job may complete before the wait watches it.
      this.values.set(e.jobId, e.returnvalue);
      if (this.values.size > 1000) this.values.delete(this.values.keys().next().value!);
      onEnd(e);
    });
    events.on('failed', onEnd);
  }

  /**
   * What job `id` returned, from its `completed` event, waiting for that event up to `ms`: a job
   * removed on completion is gone from the queue before the event is read. Undefined when no such
   * event came.
   */
  async completedValue(id: string, ms: number): Promise<unknown> {
    const until = Date.now() + ms;
    while (!this.values.has(id) && Date.now() < until) {
      this.watch(id);
      await this.sleep(Math.min(POLL_MS, Math.max(1, until - Date.now())));
    }
    return this.values.get(id);
  }

  /** Listens to `events` once they are ready (bounded by {@link ANSWER_MS}). */
  static async listen(events: QueueEvents): Promise<FinishWake> {
    const ready = await Promise.race([events.waitUntilReady().then(() => true), sleep(ANSWER_MS, false, { ref: false })]);
    if (!ready) throw new Error('the queue events timed out');
    return new FinishWake(events);
  }

  /** Watches job `id` from now on (an event of it before this is not seen). */
  watch(id: string): void {
    if (id !== this.watched) this.ended = false;
    this.watched = id;
  }

  /** Sleeps `ms`, or less when the watched job ended meanwhile (or already had, since {@link watch}). */
  async sleep(ms: number): Promise<void> {
    if (!this.ended) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, ms);
        this.wakeUp = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    this.wakeUp = undefined;
    this.ended = false;
  }
}

/** Adds the jobs {@link enqueueJobs} asks for. */
async function addJobs(queue: Queue, o: EnqueueOptions): Promise<Followed[]> {
  const jobs: Followed[] = [];
  if (o.erase) {
    jobs.push({ id: await enqueueErase(queue, { accountId: o.accountId, kind: o.erase.kind, subject: o.erase.subject, reason: o.erase.reason }, o.policy) });
  } else if (o.conversationIds?.length) {
    for (const id of new Set(o.conversationIds)) {
      jobs.push({ id: await enqueueConversation(queue, id, { accountId: o.accountId, full: o.full, policy: o.policy }), dedupKey: conversationDedupId(o.accountId, id) });
    }
  } else {
    jobs.push({ id: await enqueueWorkspace(queue, { accountId: o.accountId, full: o.full, policy: o.policy }) });
  }
  return jobs;
}

/** A state a job leaves no more: `unknown` is a job no longer in the queue (removed). */
const isFinished = (state: JobState | 'unknown'): boolean => state === 'completed' || state === 'failed' || state === 'unknown';

/**
 * Follows `jobs` in order (and each conversation's follow-up run) until all finished, no worker
 * serves the queue, or `w.timeoutMs` passed.
 */
async function followJobs(queue: Queue, jobs: Followed[], w: NonNullable<EnqueueOptions['wait']>, wake: FinishWake): Promise<EnqueueResult> {
  const deadline = Date.now() + w.timeoutMs;
  const pending = [...jobs];
  let ok = true;
  let checkWorkersAt = 0; // at once
  while (pending.length > 0) {
    const head = pending[0]!;
    wake.watch(head.id);
    const state = await queue.getJobState(head.id);
    if (isFinished(state)) {
      ok = (await reportOutcome(queue, head.id, state, w.onOutcome, wake)) && ok;
      pending.splice(0, 1, ...(await followUp(queue, head)));
      continue;
    }
    const now = Date.now();
    let stop: 'no-worker' | 'timeout' | undefined = now >= deadline ? 'timeout' : undefined;
    if (!stop && now >= checkWorkersAt) {
      if (!(await workerServes(queue))) stop = 'no-worker';
      checkWorkersAt = now + WORKER_CHECK_MS;
    }
    if (stop) {
      const rest = await settleRest(queue, pending, w.onOutcome, wake);
      return { ok: ok && rest.ok, ...(rest.unfinished.length > 0 ? { unfinished: { reason: stop, jobs: rest.unfinished } } : {}) };
    }
    await wake.sleep(Math.max(1, Math.min(POLL_MS, deadline - now)));
  }
  return { ok };
}

/**
 * When the wait stops: reports the jobs of `pending` that finished meanwhile (and follows their
 * follow-up runs), and returns the others with their state.
 */
async function settleRest(queue: Queue, pending: Followed[], onOutcome: (o: JobOutcome) => void, wake: FinishWake): Promise<{ ok: boolean; unfinished: UnfinishedJob[] }> {
  const unfinished: UnfinishedJob[] = [];
  let ok = true;
  for (let i = 0; i < pending.length; i++) {
    const job = pending[i]!;
    const state = await queue.getJobState(job.id);
    if (!isFinished(state)) {
      unfinished.push({ id: job.id, state });
      continue;
    }
    ok = (await reportOutcome(queue, job.id, state, onOutcome, wake)) && ok;
    pending.splice(i + 1, 0, ...(await followUp(queue, job)));
  }
  return { ok, unfinished };
}

/** Reports a finished job's outcome; returns whether it is a success. */
async function reportOutcome(queue: Queue, id: string, state: JobState | 'unknown', onOutcome: (o: JobOutcome) => void, wake: FinishWake): Promise<boolean> {
  const outcome = await outcomeOf(queue, id, state, wake);
  onOutcome(outcome);
  return outcome.ok;
}

/**
 * A finished job's outcome. A workspace job completes with its run's status; an `erase` job, removed
 * once it completes, with what its `completed` event returned.
 */
async function outcomeOf(queue: Queue, id: string, state: JobState | 'unknown', wake: FinishWake): Promise<JobOutcome> {
  const job = state === 'unknown' ? undefined : await Job.fromId(queue, id);
  if (!job) {
    const value = await wake.completedValue(id, ANSWER_MS);
    if ((value as Partial<EraseJobResult> | undefined)?.outcome === 'erased') return { id, ok: true, message: `completed: ${erasedText(value as EraseJobResult)}` };
    return { id, ok: false, message: 'no longer in the queue: removed before it was seen finishing' };
  }
  if (state === 'failed') return { id, ok: false, message: job.failedReason || 'failed' };
  const value = job.returnvalue as { status?: string; outcome?: string } | undefined;
  if (value?.outcome === 'not_found') return { id, ok: false, message: 'completed: not found (the API answers 404 and the mirror never had it); no run recorded' };
  if (value?.status !== undefined && value.status !== 'succeeded') return { id, ok: false, message: `completed, run ${value.status}` };
  return { id, ok: true, message: 'completed' };
}

/** `1 line`, `2 lines`. */
const n = (count: number, word: string): string => `${count} ${word}${count === 1 ? '' : 's'}`;

/**
 * What an `erase` job did, in one line (its result names no subject): `erasure 3: a sender of account
 * A, 16 messages, 0 history versions, 0 unpublished changes redacted; archive: 1 file rewritten, 16
 * lines replaced by stubs, erasure record 5`.
 */
export function erasedText(e: EraseJobResult): string {
  const counts = `${n(e.messages, 'message')}, ${n(e.history, 'history version')}, ${n(e.pendingChanges, 'unpublished change')}${e.kind === 'conversation' || e.conversations > 0 ? `, ${n(e.conversations, 'conversation object')}` : ''} redacted`;
  const a = e.archive;
  const archive =
    'pending' in a
      ? `archive pending: another process ${a.pending === 'busy' ? 'holds the publisher lock' : 'recorded first'}; its next publication (or the next convo-mirror erase or sync) rewrites the published lines`
      : a.recordBatchId === null
        ? 'archive: no published line to rewrite: no erasure record needed'
        : `archive: ${n(a.files, 'file')} rewritten, ${n(a.lines, 'line')} replaced by stubs, erasure record ${a.recordBatchId}`;
  return `erasure ${e.erasureId}: a ${e.kind} of account ${e.accountId}, ${counts}; ${archive}`;
}

/** The follow-up run of a finished conversation job (asked for while it ran), if one is pending. */
async function followUp(queue: Queue, job: Followed): Promise<Followed[]> {
  if (!job.dedupKey) return [];
  const next = await queue.getDeduplicationJobId(job.dedupKey);
  return next && next !== job.id ? [{ id: next, dedupKey: job.dedupKey }] : [];
}

/**
 * Whether a worker serves the queue (BullMQ `getWorkersCount`: the clients named after the queue).
 * A Redis that refuses `CLIENT LIST` to this user cannot tell: then true (the wait goes on to its
 * timeout).
 */
async function workerServes(queue: Queue): Promise<boolean> {
  try {
    return (await queue.getWorkersCount()) > 0;
  } catch (err) {
    if (/NOPERM/i.test(describeError(err))) return true;
    throw err;
  }
}

/**
 * Re-queues every failed job (the dead letter list).
 *
 * @returns the ids re-queued
 * @throws {@link ConfigError} naming REDIS_URL when Redis is unreachable or stops answering
 */
export async function retryFailed(settings: QueueSettings): Promise<string[]> {
  await assertRedisReachable(settings.redisUrl);
  const queue = openQueue(settings, { answerWithinMs: ANSWER_MS });
  let lost = false;
  try {
    const failed = await queue.getFailed(0, -1);
    for (const job of failed) await job.retry('failed');
    return failed.map((j) => j.id ?? '');
  } catch (err) {
    lost = isConnectionError(err);
    throw redisLost(settings, err);
  } finally {
    await closeQueue(queue, lost);
  }
}
