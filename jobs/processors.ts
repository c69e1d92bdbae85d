/**
 * Job processors: unpack a BullMQ job, call the src/sync processors, map errors to BullMQ's retry
 * semantics (design habit 2). The error decides: one that is not `retryable` (authentication,
 * configuration, a conversation never mirrored, a response over the byte cap, a page breaking the
 * documented shape, an unusable mirror...) becomes `UnrecoverableError` and is never retried;
 * everything else is retried with backoff, and a retried conversation job resumes from its last
 * committed page.
 *
 * A run outlives the daemon that started it: after a crash, the restarted daemon marks it
 * interrupted, and the first job of it that runs again reopens it (`resumeRun`). The remaining
 * conversation jobs finish inside that same run, and its `finish` step publishes their changes in
 * one batch.
 */
import { DelayedError, UnrecoverableError, WaitingChildrenError, type Job, type Queue } from 'bullmq';
import { ConvoMirrorError, DriftError, PageRunawayError, RunError, describeError } from '../src/errors.js';
import { syncConversation, type ConversationResult } from '../src/sync/conversation.js';
import { LIST_FAILURE_ID, isFatal, listWorkspace, namedConversationsResult, type ConversationFailure, type WorkspaceResult } from '../src/sync/workspace.js';
import { completeRun, type RunSummary } from '../src/run/index.js';
import type { SyncDeps } from '../src/sync/types.js';
import type { FileModes } from '../src/private-fs.js';
import {
  CONVERSATION_JOB,
  WORKSPACE_JOB,
  jobOptions,
  type ConversationJobData,
  type ConversationJobResult,
  type JobPolicy,
  type WorkspaceJobData,
} from './queue.js';

/** What the processors need beyond {@link SyncDeps}. */
export interface JobDeps extends SyncDeps {
  queue: Queue;
  accountId: string;
  exportDir: string;
  /** Modes of the export files and directories created. @defaultValue PRIVATE_MODES */
  modes?: FileModes | undefined;
  policy: JobPolicy;
  /** Aborted at the end of the shutdown grace period. */
  signal?: AbortSignal | undefined;
  /** Serializes crawls of one conversation within this process. */
  locks: KeyedMutex;
  /** Change signal setting of regular workspace runs (`auto`, `none` or a field). */
  changeFieldSetting?: string;
  /**
   * Called with an error after which no job can succeed (an unusable mirror, rejected credentials):
   * the daemon stops instead of failing job after job.
   */
  onFatal?: (err: Error) => void;
}

/** Runs tasks one at a time per key (two jobs for one conversation never crawl at once). */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  async run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(task, task);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}

/**
 * The error decides retry: one that is not `retryable` must not be retried by BullMQ. A fatal one
 * (an unusable mirror, say) is also reported to `onFatal`, so the daemon can stop.
 */
function toJobError(err: unknown, d: JobDeps): Error {
  const cause = err instanceof RunError ? err.cause : err;
  if (isFatal(cause)) d.onFatal?.(cause);
  if (cause instanceof ConvoMirrorError) {
    // BullMQ keeps only the message: `[CODE] message` lets the workspace run record the code.
    const message = `[${cause.code}] ${describeError(cause)}`;
    return cause.retryable ? new Error(message, { cause }) : new UnrecoverableError(message);
  }
  return err instanceof Error ? err : new Error(describeError(err));
}

/**
 * The worker's processor: runs a job of either kind; any error that escapes (including one from
 * recording the run itself, e.g. an unusable mirror) goes through {@link toJobError}, so the error
 * decides retry and a fatal one stops the daemon. BullMQ's control-flow errors pass untouched.
 */
export async function processJob(d: JobDeps, job: Job, token?: string): Promise<unknown> {
  try {
    return job.name === WORKSPACE_JOB
      ? await processWorkspaceJob(d, job as Job<WorkspaceJobData>, token)
      : await processConversationJob(d, job as Job<ConversationJobData>, token);
  } catch (err) {
    if (err instanceof DelayedError || err instanceof WaitingChildrenError || err instanceof UnrecoverableError) throw err;
    throw toJobError(err, d);
  }
}

/**
 * Shutdown cut the job short: put it back (delayed by `ms`) without spending one of its attempts;
 * it resumes from its checkpoint.
 */
async function requeueAfterShutdown(job: Job, token: string | undefined, ms = 1000): Promise<never> {
  await job.moveToDelayed(Date.now() + ms, token);
  throw new DelayedError();
}

/** Child job id of a conversation in a workspace run: deterministic, so a retried step adds nothing twice. */
export const childJobId = (runId: number, conversationId: string) => `run-${runId}-c-${conversationId}`;

/**
 * `sync-conversation`: a child of a workspace run crawls within that run; an on-demand job is a
 * recorded run of its own, and publishes its exports.
 *
 * @throws `UnrecoverableError` for auth/config/not-found errors; the original error otherwise
 */
export async function processConversationJob(d: JobDeps, job: Job<ConversationJobData>, token?: string): Promise<ConversationJobResult> {
  const { conversationId, full, runId } = job.data;
  const log = d.logger.child({ job: job.id, conversation_id: conversationId });
  return d.locks.run(conversationId, async () => {
    const deps = { ...d, logger: log };
    // A child of a workspace run crawls within it, also when a crashed daemon left the run
    // interrupted (the run is reopened: its parent job is still waiting for its children). Only a
    // child whose run has properly ended (e.g. re-queued by retry-failed) would change the mirror
    // with nobody to publish or record it: it runs as an on-demand job instead.
    if (runId !== undefined && d.mirror.resumeRun(runId) !== 'ended') {
      try {
        // A full refresh resumes only checkpoints of its own run (a retried attempt).
        const result = await syncConversation(deps, conversationId, {
          accountId: d.accountId,
          runId,
          resume: full ? 'same-run' : true,
          incremental: !full,
          // A full child never skips (incremental is off) but records the signal as the next baseline.
          changeField: job.data.changeField,
          unlisted: job.data.unlisted === true,
          signal: d.signal,
        });
        return { result };
      } catch (err) {
        if (d.signal?.aborted) return requeueAfterShutdown(job, token);
        forgetBaseline(d, conversationId, err);
        throw err; // processJob lets the error decide retry
      }
    }
    const startedMs = d.clock.now();
    // One run per job, kept across attempts (and across a daemon crash), so a retried or stalled
    // full job resumes its own checkpoint.
    let ownRun = job.data.ownRunId;
    if (ownRun === undefined) {
      ownRun = d.mirror.startRun({ scope: 'conversations', refresh: full ? 'full' : 'incremental', trigger: 'on-demand', accountId: d.accountId });
      await job.updateData({ ...job.data, ownRunId: ownRun });
    } else d.mirror.resumeRun(ownRun); // an attempt after a crash reopens the interrupted run
    let result: ConversationResult | undefined;
    let fatal: unknown;
    const failures: ConversationFailure[] = [];
    try {
      result = await syncConversation(deps, conversationId, { accountId: d.accountId, runId: ownRun, resume: full ? 'same-run' : true, incremental: !full, named: true, signal: d.signal });
    } catch (err) {
      if (d.signal?.aborted) {
        d.mirror.finishRun(ownRun, { status: 'interrupted', error: 'daemon shutting down; the job resumes from its checkpoint' });
        return requeueAfterShutdown(job, token);
      }
      if (isFatal(err)) fatal = err;
      else {
        forgetBaseline(d, conversationId, err);
        failures.push({ id: conversationId, error: err as Error });
      }
    }
    const ws = namedConversationsResult(result ? [result] : [], failures);
    const summary = completeRun(deps, {
      ...runTarget(d),
      runId: ownRun,
      scope: 'conversations',
      trigger: 'on-demand',
      startedMs,
      result: ws,
      fatal,
      interrupted: d.signal?.aborted === true,
      full: full === true,
    });
    if (failures[0]) throw failures[0].error;
    return { result: result!, summary };
  });
}

/** The result of a workspace run whose listing failed: nothing crawled, the listing's failure recorded. */
function listingFailed(listing: Awaited<ReturnType<typeof listWorkspace>>): WorkspaceResult {
  const ws = namedConversationsResult([], [{ id: LIST_FAILURE_ID, error: listing.failure! }]);
  return { ...ws, listPasses: listing.passes, listConfirmed: false, conversationsListed: listing.seen.length, listingTally: listing.tally };
}

/** Where a job's run is recorded and published: the account, the export directory and its modes. */
function runTarget(d: JobDeps): { accountId: string; exportDir: string; modes: FileModes | undefined } {
  return { accountId: d.accountId, exportDir: d.exportDir, modes: d.modes };
}

/**
 * A conversation that failed is asked about again by the next incremental run, whatever its
 * change signal says (a failure of the mirror itself changes nothing).
 */
function forgetBaseline(d: JobDeps, conversationId: string, err: unknown): void {
  if (isFatal(err)) return;
  try {
    d.mirror.forgetCrawlBaseline(d.accountId, conversationId);
  } catch {
    /* the mirror's own failure is reported by the run */
  }
}

/**
 * `sync-workspace`, in steps (BullMQ's step-job pattern): `list` pages the conversation list (two
 * passes at least) and adds one child `sync-conversation` job per conversation; `crawl` waits for
 * the children (`moveToWaitingChildren`); `finish` rolls up the children's results and failures,
 * publishes the exports and records the run. Each step is idempotent, so a retried job continues.
 *
 * @throws `WaitingChildrenError` while children run; `UnrecoverableError` for auth/config errors
 */
export async function processWorkspaceJob(d: JobDeps, job: Job<WorkspaceJobData>, token: string | undefined): Promise<RunSummary | undefined> {
  let data = job.data;
  const log = d.logger.child({ job: job.id, mode: data.mode });
  const deps = { ...d, logger: log };
  // Jobs made by a job scheduler carry its key; the rest were enqueued.
  const run = { scope: 'workspace', trigger: data.trigger ?? (job.repeatJobKey ? 'schedule' : 'on-demand') } as const;
  const refresh = data.mode === 'full' ? 'full' : 'incremental';
  for (;;) {
    switch (data.step ?? 'list') {
      case 'list': {
        // A list step cut short by a crash lists again within the same run (reopened).
        const runId = data.runId !== undefined && d.mirror.resumeRun(data.runId) !== 'ended' ? data.runId : d.mirror.startRun({ ...run, refresh, accountId: d.accountId });
        const startedMs = data.runId === runId ? (data.startedMs ?? d.clock.now()) : d.clock.now();
        if (data.runId !== runId) {
          data = { ...data, runId, startedMs, step: 'list' };
          await job.updateData(data);
        }
        let listing;
        try {
          listing = await listWorkspace(deps, {
            accountId: d.accountId,
            runId,
            signal: d.signal,
            changeFieldSetting: d.changeFieldSetting,
            confirmListing: data.mode === 'full',
          });
        } catch (err) {
          // Auth, config or an unusable mirror: record the run as failed (completeRun throws a
          // RunError carrying it); the error decides that it is never retried.
          completeRun(deps, { ...runTarget(d), runId, ...run, startedMs, fatal: err });
          throw err;
        }
        if (d.signal?.aborted) return requeueAfterShutdown(job, token); // list again after the restart, same run
        if (listing.failure && !(listing.failure instanceof DriftError)) {
          // A failure of the list itself (after the client's retries): never fan out a partial
          // listing. A transient one retries the step, same run; one that will not be retried
          // (not retryable, or the last attempt) records the run as failed first.
          const f = listing.failure as Error & { retryable?: boolean };
          const lastAttempt = job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
          if (f.retryable === true && !lastAttempt) throw f;
          completeRun(deps, { ...runTarget(d), runId, ...run, startedMs, result: listingFailed(listing), fatal: f }); // throws the RunError
        }
        const recheck = new Set(listing.recheck);
        const ids = [...new Set([...listing.seen, ...listing.recheck])];
        const opts = jobOptions(d.policy);
        await d.queue.addBulk(
          ids.map((conversationId) => ({
            name: CONVERSATION_JOB,
            data: {
              conversationId,
              runId,
              ...(data.mode === 'full' ? { full: true } : {}),
              // Re-checks (gone from the complete listing) always ask the API (no change-signal
              // skip), and for them alone a 404 means a deletion.
              ...(listing.changeField && !recheck.has(conversationId) ? { changeField: listing.changeField } : {}),
              ...(recheck.has(conversationId) ? { unlisted: true } : {}),
            } satisfies ConversationJobData,
            opts: {
              ...opts,
              jobId: childJobId(runId, conversationId),
              parent: { id: job.id!, queue: job.queueQualifiedName },
              ignoreDependencyOnFailure: true,
            },
          })),
        );
        data = {
          ...data,
          step: 'crawl',
          listing: {
            passes: listing.passes,
            confirmed: listing.confirmed,
            listed: listing.seen.length,
            inserted: listing.inserted,
            updated: listing.updated,
            tally: listing.tally,
            ...(listing.failure ? { failure: describeError(listing.failure) } : {}),
          },
        };
        await job.updateData(data);
        log.info({ run: runId, conversations: ids.length, passes: listing.passes }, 'workspace listed; conversation jobs added');
        break;
      }
      case 'crawl': {
        const wait = await job.moveToWaitingChildren(token ?? '');
        if (wait) throw new WaitingChildrenError();
        data = { ...data, step: 'finish' };
        await job.updateData(data);
        break;
      }
      case 'finish': {
        const runId = data.runId!;
        d.mirror.resumeRun(runId); // finishing a run a crash left interrupted
        const values = await job.getChildrenValues<ConversationJobResult>();
        const failed = await job.getIgnoredChildrenFailures();
        const results = Object.values(values).map((v) => v.result);
        const failures: ConversationFailure[] = Object.entries(failed).map(([key, reason]) => ({
          id: key.replace(/^.*?run-\d+-c-/, ''),
          error: failureFromReason(reason),
        }));
        if (data.listing?.failure) failures.push({ id: LIST_FAILURE_ID, error: new Error(data.listing.failure) });
        const l = data.listing;
        const ws: WorkspaceResult = {
          listPasses: l?.passes ?? 0,
          listConfirmed: l?.confirmed ?? false,
          conversationsListed: l?.listed ?? 0,
          conversationsInserted: l?.inserted ?? 0,
          conversationsUpdated: l?.updated ?? 0,
          results,
          failures,
          ...(l ? { listingTally: l.tally } : {}),
        };
        return completeRun(deps, { ...runTarget(d), runId, ...run, startedMs: data.startedMs ?? d.clock.now(), result: ws, full: data.mode === 'full' });
      }
    }
  }
}

/**
 * A child's failure as BullMQ kept it (its message only): the `[CODE] message` form written by
 * {@link toJobError} keeps the error code, so `run_failures` records it rather than `ERROR`.
 */
function failureFromReason(reason: string): Error {
  const m = /^\[([A-Z_]+)\] ([\s\S]*)$/.exec(reason);
  const err = new Error(m ? m[2] : reason) as Error & { code?: string };
  if (m) err.code = m[1];
  return err;
}
