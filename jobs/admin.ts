/**
 * Queue administration for the CLI (`status`, `enqueue`, `retry-failed`): the only BullMQ the
 * commands need, kept beside the queue it administers so src/ never imports bullmq.
 */
import { Job, QueueEvents } from 'bullmq';
import { describeError } from '../src/errors.js';
import {
  QUEUE_NAME,
  assertRedisReachable,
  conversationDedupId,
  enqueueConversation,
  enqueueWorkspace,
  openQueue,
  redisConnection,
  redisHost,
  type JobPolicy,
  type QueueSettings,
} from './queue.js';

/** Queue figures for `status`, or why they are missing. */
export type QueueStatus =
  | {
      redis: string;
      prefix: string;
      counts: Record<string, number>;
      schedulers: { id: string; pattern?: string | undefined; tz?: string | undefined; next?: string | undefined }[];
      failed: { id?: string | undefined; name: string; conversation_id?: string | undefined; attempts: number; reason: string; failed_at?: string | undefined }[];
    }
  | { redis: string; error: string };

/**
 * The queue's job counts, its schedulers with their next run, and the last 10 failed jobs (the
 * dead letter list). Never throws for an unreachable Redis (1.5 s probe): returns why instead.
 */
export async function queueStatus(settings: QueueSettings): Promise<QueueStatus> {
  const redis = redisHost(settings.redisUrl);
  try {
    await assertRedisReachable(settings.redisUrl, 1500);
  } catch (err) {
    return { redis, error: describeError(err) };
  }
  const queue = openQueue(settings);
  try {
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
    return { redis, prefix: settings.prefix, counts, schedulers, failed };
  } finally {
    await queue.close();
  }
}

/** How one awaited job ended. */
export interface JobOutcome {
  id: string;
  /** Completed, and (for a workspace job) its run succeeded. */
  ok: boolean;
  /** One line: `completed`, `completed, run partial`, or the failure. */
  message: string;
}

/** Options of {@link enqueueJobs}. */
export interface EnqueueOptions {
  /** The workspace (account id; `default` without `X-Account-Id`) the jobs are for. */
  accountId: string;
  /** Conversations to sync; none or empty = one workspace sync. */
  conversationIds?: string[] | undefined;
  full: boolean;
  policy: JobPolicy;
  /** Called with the ids of the jobs queued, before any wait. */
  onQueued: (ids: string[]) => void;
  /** Wait for the jobs, calling `onOutcome` as each ends; give up after `timeoutMs` (ms) in all. */
  wait?: { timeoutMs: number; onOutcome: (o: JobOutcome) => void };
}

/**
 * Queues on-demand jobs (named conversations, deduplicated per conversation, or a workspace sync)
 * and, with `wait`, follows each to its outcome. A conversation asked for while its job runs is
 * answered by deduplication with the running job; the run asked for starts when that one ends,
 * under another id, so the deduplication key is followed until no newer run is pending.
 *
 * @returns true when every awaited job completed with a successful run (always true without `wait`)
 * @throws {@link ConfigError} naming REDIS_URL when Redis is unreachable
 */
export async function enqueueJobs(settings: QueueSettings, o: EnqueueOptions): Promise<boolean> {
  await assertRedisReachable(settings.redisUrl);
  const queue = openQueue(settings);
  const events = o.wait ? new QueueEvents(QUEUE_NAME, { connection: redisConnection(settings.redisUrl), prefix: settings.prefix }) : undefined;
  try {
    if (events) await events.waitUntilReady();
    const jobs: { id: string; dedupKey?: string }[] = [];
    if (o.conversationIds?.length) {
      for (const id of new Set(o.conversationIds)) {
        jobs.push({ id: await enqueueConversation(queue, id, { accountId: o.accountId, full: o.full, policy: o.policy }), dedupKey: conversationDedupId(o.accountId, id) });
      }
    } else {
      jobs.push({ id: await enqueueWorkspace(queue, { accountId: o.accountId, full: o.full, policy: o.policy }) });
    }
    o.onQueued(jobs.map((j) => j.id));
    if (!events || !o.wait) return true;
    const deadline = Date.now() + o.wait.timeoutMs;
    let ok = true;
    for (const j of jobs) {
      for (let id: string | null = j.id; id; ) {
        const job = await Job.fromId(queue, id);
        if (job) {
          const outcome = await waitFor(job, id, events, deadline);
          ok &&= outcome.ok;
          o.wait.onOutcome(outcome);
        }
        const next: string | null = j.dedupKey ? await queue.getDeduplicationJobId(j.dedupKey) : null;
        id = next && next !== id ? next : null;
      }
    }
    return ok;
  } finally {
    await events?.close();
    await queue.close();
  }
}

/** Waits for one job until `deadline` (epoch ms). A workspace job completes with its run's status. */
async function waitFor(job: Job, id: string, events: QueueEvents, deadline: number): Promise<JobOutcome> {
  try {
    const value = (await job.waitUntilFinished(events, Math.max(1, deadline - Date.now()))) as { status?: string } | undefined;
    if (value?.status !== undefined && value.status !== 'succeeded') return { id, ok: false, message: `completed, run ${value.status}` };
    return { id, ok: true, message: 'completed' };
  } catch (err) {
    return { id, ok: false, message: describeError(err) };
  }
}

/**
 * Re-queues every failed job (the dead letter list).
 *
 * @returns the ids re-queued
 * @throws {@link ConfigError} naming REDIS_URL when Redis is unreachable
 */
export async function retryFailed(settings: QueueSettings): Promise<string[]> {
  await assertRedisReachable(settings.redisUrl);
  const queue = openQueue(settings);
  try {
    const failed = await queue.getFailed(0, -1);
    for (const job of failed) await job.retry('failed');
    return failed.map((j) => j.id ?? '');
  } finally {
    await queue.close();
  }
}
