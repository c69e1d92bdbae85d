/**
 * What the job processors share: their dependencies ({@link JobDeps}, built once by the daemon),
 * the per-conversation mutex, and putting a job back after a shutdown cut it short.
 */
import { DelayedError, type Job, type Queue } from 'bullmq';
import type { RequestTally } from '../src/api/client.js';
import type { FileModes } from '../src/private-fs.js';
import type { RunTarget } from '../src/run/index.js';
import type { SyncDeps } from '../src/sync/types.js';
import type { JobPolicy } from './queue.js';

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

/** Where a job's run is published. */
export function runTarget(d: JobDeps): RunTarget {
  return { exportDir: d.exportDir, modes: d.modes };
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
