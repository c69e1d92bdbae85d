/**
 * What the job processors share: their dependencies ({@link JobDeps}, built once by the daemon),
 * the per-conversation mutex, and putting a job back after a shutdown cut it short.
 */
import { DelayedError, type Job, type Queue } from 'bullmq';
import type { RequestTally } from '../src/api/client.js';
import { RunError } from '../src/errors.js';
import { completeRun, type RunOutcome, type RunSummary, type RunTarget } from '../src/run/index.js';
import type { SyncDeps } from '../src/sync/types.js';
import type { JobPolicy } from './queue.js';

/** What the processors need beyond {@link SyncDeps}. */
export interface JobDeps extends SyncDeps {
  queue: Queue;
  accountId: string;
  /** Where and how its runs publish. */
  target: RunTarget;
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
  /**
   * Called with the summary of every run a job completes (succeeded, partial or failed: right after
   * `completeRun` returns, or throws the {@link RunError} carrying the summary) and the account it
   * mirrors, e.g. the daemon's metrics. Not called for a run a shutdown interrupted. A hook that
   * throws is ignored. A `finish` step retried after recording its run reports it again.
   */
  onRunFinished?: (summary: RunSummary, accountId: string) => void;
  /**
   * Called when an on-demand job's conversation does not exist (the API answers 404 and the mirror
   * never had it; no run was recorded), with the account, e.g. the daemon's metrics. A hook that
   * throws is ignored.
   */
  onNotFound?: (accountId: string) => void;
  /**
   * Called when an `erase` job's erasure is recorded in the mirror, with its kind and account (never
   * its subject), e.g. the daemon's metrics. A hook that throws is ignored.
   */
  onErasure?: (kind: 'sender' | 'conversation', accountId: string) => void;
}

/** What recording a job's run needs: {@link JobDeps} without the BullMQ queue and its policy. */
export type RunJobDeps = Omit<JobDeps, 'queue' | 'policy' | 'locks'>;

/**
 * `completeRun` for the job kinds: completes the run, then tells {@link JobDeps.onRunFinished}.
 *
 * @returns the run's summary
 * @throws what `completeRun` throws (a {@link RunError} carrying the summary), after reporting it
 */
export async function completeJobRun(d: RunJobDeps, o: RunOutcome): Promise<RunSummary> {
  let summary: RunSummary;
  try {
    summary = await completeRun(d, o);
  } catch (err) {
    if (err instanceof RunError) reportRun(d, err.summary as RunSummary);
    throw err;
  }
  reportRun(d, summary);
  return summary;
}

/** Tells {@link JobDeps.onRunFinished}; an observer never fails a job. */
function reportRun(d: RunJobDeps, summary: RunSummary): void {
  try {
    d.onRunFinished?.(summary, d.accountId);
  } catch (err) {
    d.logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'run-finished hook failed');
  }
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

/** Where a job's run is published. */
export function runTarget(d: Pick<JobDeps, 'target'>): RunTarget {
  return d.target;
}

/**
 * Shutdown cut the job short: put it back (delayed by `ms`) without spending one of its attempts;
 * it resumes from its checkpoint. `tally` (what its attempts cost so far) is kept in its data.
 *
 * @throws `DelayedError` always (BullMQ's signal that the job was moved)
 */
export async function requeueAfterShutdown(job: Job, token: string | undefined, tally?: RequestTally, ms = 1000): Promise<never> {
  if (tally) await job.updateData({ ...job.data, tally });
  await job.moveToDelayed(Date.now() + ms, token);
  throw new DelayedError();
}
