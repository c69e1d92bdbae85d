/**
 * The Redis-free daemon's machinery (`--scheduler local`): an in-process job queue with BullMQ's
 * per-key deduplication, bounded concurrency, attempts with exponential backoff and a dead letter
 * list, and a cron scheduler (node-cron). Generic: it knows nothing of sync, SQLite or the API
 * (jobs/local-engine.ts gives it the processors).
 */
import cron, { type ScheduledTask } from 'node-cron';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../src/clock.js';

/** States of a local job, as BullMQ names them. */
export type LocalJobState = 'waiting' | 'active' | 'delayed' | 'completed' | 'failed';

/** One job of a {@link LocalQueue}. */
export interface LocalJob<T> {
  /** `local-<n>`, unique within the process. */
  id: string;
  name: string;
  data: T;
  state: LocalJobState;
  /** Attempts made so far (finished ones). */
  attemptsMade: number;
  /** When it was added, epoch ms. */
  addedAt: number;
  /** When it ended (completed or failed for good), epoch ms. */
  finishedOn?: number;
  /** The last attempt's error message. */
  failedReason?: string;
  /** The deduplication key it holds, if any. */
  dedupId?: string;
}

/** Options of {@link LocalQueue}. */
export interface LocalQueueOptions<T> {
  /**
   * Runs one attempt of a job; throwing fails the attempt. An error with `retryable === false` (or
   * named `UnrecoverableError`) fails the job at once; others are retried until `attempts`.
   * `signal` is aborted when {@link LocalQueue.close}'s grace period is over.
   */
  process: (job: LocalJob<T>, signal: AbortSignal) => Promise<unknown>;
  /** Jobs running at once (at least 1). */
  concurrency: number;
  /** Attempts before a job is kept as failed (dead letter), as BullMQ's `attempts`. */
  attempts: number;
  /** First retry delay; attempt n waits `backoffMs * 2^(n-1)` ms. @defaultValue 1000 */
  backoffMs?: number;
  /** Failed jobs kept (the newest), the dead letter list. @defaultValue 1000 */
  keepFailed?: number;
  /** Completed jobs kept (the newest). @defaultValue 100 */
  keepCompleted?: number;
  /** Time source and the backoff's sleep. @defaultValue systemClock */
  clock?: Clock;
  /** Where job events are logged (started, completed, failed). */
  logger?: Logger | undefined;
}

/**
 * An in-process queue. Deduplication follows BullMQ's `deduplication: { id, keepLastIfActive: true }`:
 * while a job holding a key waits (or waits for a retry), adding with that key adds nothing and
 * returns its id; while it runs, the first add queues exactly one follow-up (which then holds the
 * key: further adds return its id), run after the active one ends.
 *
 * Jobs live in memory only: {@link LocalQueue.close} drops those still waiting.
 */
export class LocalQueue<T> {
  private seq = 0;
  private readonly jobs = new Map<string, LocalJob<T>>();
  private readonly waiting: LocalJob<T>[] = [];
  private readonly active = new Map<string, Promise<void>>();
  private readonly delayed = new Set<string>();
  /** Deduplication key → the job holding it (waiting, delayed or active). */
  private readonly keys = new Map<string, string>();
  /** Active jobs whose key already has a follow-up queued. */
  private readonly followed = new Set<string>();
  private readonly completed: LocalJob<T>[] = [];
  private readonly failedJobs: LocalJob<T>[] = [];
  private readonly waiters = new Map<string, { resolve: (v: unknown) => void; reject: (e: unknown) => void }[]>();
  private readonly abort = new AbortController();
  private closing = false;
  private readonly clock: Clock;

  constructor(private readonly o: LocalQueueOptions<T>) {
    if (!(o.concurrency >= 1) || !(o.attempts >= 1)) throw new Error('LocalQueue: concurrency and attempts must be at least 1');
    this.clock = o.clock ?? systemClock;
  }

  /**
   * Adds a job, or with `dedupId` returns the id of the job already holding that key (see the
   * class). After {@link LocalQueue.close} began, nothing is added.
   *
   * @returns the job id
   * @throws Error when the queue is closing
   */
  add(name: string, data: T, opts: { dedupId?: string } = {}): string {
    if (this.closing) throw new Error('the local queue is shutting down: no new jobs');
    const key = opts.dedupId;
    if (key !== undefined) {
      const holder = this.keys.get(key);
      const holderJob = holder !== undefined ? this.jobs.get(holder) : undefined;
      if (holderJob && holderJob.state !== 'active') return holderJob.id;
      if (holderJob && this.followed.has(holderJob.id)) return this.keys.get(`${key}\u0000next`)!;
    }
    const job: LocalJob<T> = { id: `local-${++this.seq}`, name, data, state: 'waiting', attemptsMade: 0, addedAt: this.clock.now(), ...(key !== undefined ? { dedupId: key } : {}) };
    this.jobs.set(job.id, job);
    if (key !== undefined) {
      const holder = this.keys.get(key);
      if (holder !== undefined && this.jobs.get(holder)?.state === 'active') {
        // The follow-up of a running job: it takes the key when the running one ends.
        this.followed.add(holder);
        this.keys.set(`${key}\u0000next`, job.id);
      } else {
        this.keys.set(key, job.id);
      }
    }
    this.waiting.push(job);
    this.pump();
    return job.id;
  }

  /** Job counts by state, e.g. for `convo_mirror_queue_jobs{state}` (completed and failed: those kept). */
  counts(): Record<LocalJobState, number> {
    return { waiting: this.waiting.length, active: this.active.size, delayed: this.delayed.size, completed: this.completed.length, failed: this.failedJobs.length };
  }

  /** The failed jobs kept (dead letters), newest last. */
  failed(): LocalJob<T>[] {
    return [...this.failedJobs];
  }

  /** A job by id, while it is known (waiting, running, or among those kept). */
  get(id: string): LocalJob<T> | undefined {
    return this.jobs.get(id);
  }

  /**
   * Resolves with job `id`'s return value when it completes; rejects with its last error when it
   * fails for good, or at once when no such job is known.
   */
  waitFor(id: string): Promise<unknown> {
    const job = this.jobs.get(id);
    if (!job) return Promise.reject(new Error(`no job ${id}`));
    return new Promise((resolve, reject) => {
      if (job.state === 'completed') return resolve(undefined);
      if (job.state === 'failed') return reject(new Error(job.failedReason));
      this.waiters.set(id, [...(this.waiters.get(id) ?? []), { resolve, reject }]);
    });
  }

  /**
   * Stops taking jobs: waiting and delayed ones are dropped; running ones get `graceMs` (ms), then
   * their signal is aborted and they are waited for (a processor must honour its signal).
   *
   * @returns whether running jobs had to be aborted
   */
  async close(graceMs: number): Promise<{ forced: boolean }> {
    this.closing = true;
    for (const j of this.waiting.splice(0)) this.jobs.delete(j.id);
    this.delayed.clear();
    const running = Promise.all(this.active.values());
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), graceMs)));
    const forced = (await Promise.race([running.then(() => 'done' as const), graceOver])) === 'timeout';
    clearTimeout(timer);
    if (forced) {
      this.abort.abort(new Error('daemon shutting down'));
      await running;
    }
    return { forced };
  }

  /** Starts waiting jobs while there is room. */
  private pump(): void {
    while (!this.closing && this.active.size < this.o.concurrency && this.waiting.length > 0) {
      const job = this.waiting.shift()!;
      job.state = 'active';
      const done = this.runAttempt(job).finally(() => {
        this.active.delete(job.id);
        this.pump();
      });
      this.active.set(job.id, done);
    }
  }

  /** Runs one attempt of `job`, then completes it, schedules its retry, or fails it. */
  private async runAttempt(job: LocalJob<T>): Promise<void> {
    const log = this.o.logger;
    log?.info({ job: job.id, name: job.name, attempt: job.attemptsMade + 1 }, 'job started');
    try {
      const value = await this.o.process(job, this.abort.signal);
      job.attemptsMade += 1;
      this.finish(job, 'completed', value);
      log?.info({ job: job.id, name: job.name }, 'job completed');
    } catch (err) {
      job.attemptsMade += 1;
      job.failedReason = err instanceof Error ? err.message : String(err);
      const final = (err as { retryable?: boolean }).retryable === false || (err as Error)?.name === 'UnrecoverableError' || job.attemptsMade >= this.o.attempts;
      log?.warn({ job: job.id, name: job.name, attempts: job.attemptsMade, err: job.failedReason }, final ? 'job failed' : 'job failed; retrying');
      if (final || this.closing) return this.finish(job, 'failed', err);
      this.retryLater(job);
    }
  }

  /** Puts `job` back after its backoff (delayed state), unless the queue closes meanwhile. */
  private retryLater(job: LocalJob<T>): void {
    job.state = 'delayed';
    this.delayed.add(job.id);
    const ms = (this.o.backoffMs ?? 1000) * 2 ** (job.attemptsMade - 1);
    this.clock
      .sleep(ms, this.abort.signal)
      .catch(() => undefined)
      .then(() => {
        if (!this.delayed.delete(job.id) || this.closing) return;
        job.state = 'waiting';
        this.waiting.push(job);
        this.pump();
      });
  }

  /** Ends `job` for good: keeps it (bounded), releases its key to its follow-up, tells the waiters. */
  private finish(job: LocalJob<T>, state: 'completed' | 'failed', outcome: unknown): void {
    job.state = state;
    job.finishedOn = this.clock.now();
    const list = state === 'completed' ? this.completed : this.failedJobs;
    list.push(job);
    const keep = state === 'completed' ? (this.o.keepCompleted ?? 100) : (this.o.keepFailed ?? 1000);
    while (list.length > keep) this.jobs.delete(list.shift()!.id);
    const key = job.dedupId;
    if (key !== undefined && this.keys.get(key) === job.id) {
      const next = this.keys.get(`${key}\u0000next`);
      this.keys.delete(`${key}\u0000next`);
      this.followed.delete(job.id);
      if (next !== undefined && this.jobs.get(next)?.state !== undefined) this.keys.set(key, next);
      else this.keys.delete(key);
    }
    for (const w of this.waiters.get(job.id) ?? []) {
      if (state === 'completed') w.resolve(outcome);
      else w.reject(outcome);
    }
    this.waiters.delete(job.id);
  }
}

/** Options of {@link LocalScheduler}. */
export interface LocalSchedulerOptions {
  /** IANA time zone of every cron. */
  tz: string;
  logger?: Logger | undefined;
}

/** Cron schedules in this process (node-cron), one task per id. */
export class LocalScheduler {
  private readonly tasks = new Map<string, ScheduledTask>();

  constructor(private readonly o: LocalSchedulerOptions) {}

  /**
   * Fires `onTick` on `pattern` (5 fields, or 6 with seconds first) in the scheduler's time zone.
   * A tick that throws is logged, never fatal.
   *
   * @throws Error naming `id` when the pattern is invalid or the id is taken
   */
  add(id: string, pattern: string, onTick: () => void): void {
    if (this.tasks.has(id)) throw new Error(`schedule ${id} is already registered`);
    if (!cron.validate(pattern)) throw new Error(`schedule ${id}: ${JSON.stringify(pattern)} is not a valid cron expression`);
    const task = cron.schedule(
      pattern,
      () => {
        try {
          onTick();
        } catch (err) {
          this.o.logger?.warn({ schedule: id, err: err instanceof Error ? err.message : String(err) }, 'scheduled tick failed');
        }
      },
      { timezone: this.o.tz, name: id },
    );
    this.tasks.set(id, task);
  }

  /** Ids of the schedules registered. */
  ids(): string[] {
    return [...this.tasks.keys()];
  }

  /** Stops every schedule (idempotent). */
  stop(): void {
    for (const t of this.tasks.values()) void t.stop();
    this.tasks.clear();
  }
}
