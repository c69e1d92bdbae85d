/**
 * The machinery of the Redis-free daemon (`--scheduler local`): an in-process job queue with
 * BullMQ's retry and per-key deduplication semantics ({@link LocalQueue}), and the cron schedules
 * on node-cron ({@link LocalScheduler}). Generic: it knows nothing of sync, SQLite or the API; the
 * daemon hands it the processors.
 *
 * Everything lives in this process's memory and is bounded there (kept completed and failed jobs);
 * nothing survives a restart. That is by design: the schedules re-derive the workspace runs, the
 * webhooks re-send conversation changes, and every committed page is a checkpoint the next run
 * resumes from.
 */
import cron, { type Logger as CronLogger, type ScheduledTask } from 'node-cron';
import type { Logger } from 'pino';
import { systemClock, type Clock } from '../src/clock.js';
import { ConfigError, ConvoMirrorError, describeError } from '../src/errors.js';

/**
 * Where a job is:
 * - `waiting`: queued, runs when a slot is free (a deduplication follow-up also waits for the
 *   running job of its key, see {@link LocalJob.after});
 * - `active`: its processor is running;
 * - `delayed`: an attempt failed; the retry waits its backoff;
 * - `completed` / `failed`: ended (kept, within {@link LocalQueueOptions.keepCompleted} /
 *   {@link LocalQueueOptions.keepFailed});
 * - `dropped`: the queue closed before the job could end (it never runs again; not a dead letter).
 */
export type LocalJobState = 'waiting' | 'active' | 'delayed' | 'completed' | 'failed' | 'dropped';

/** The states {@link LocalQueue.counts} counts (those of BullMQ's `getJobCounts` the metrics gauge reads). */
export type LocalCountedState = 'waiting' | 'active' | 'delayed' | 'failed' | 'completed';

/** A job of a {@link LocalQueue}: the live record (read it, do not change it, except `data`). */
export interface LocalJob<T> {
  /** Unique in the queue's life: `local-1`, `local-2`... */
  readonly id: string;
  /** The job's name (its kind), as given to {@link LocalQueue.add}. */
  readonly name: string;
  /**
   * The job's data. The processor may change or replace it: the next attempt sees the change
   * (what BullMQ's `job.updateData` does), e.g. a run id to keep across attempts.
   */
  data: T;
  readonly state: LocalJobState;
  /** Attempts that have ended so far (failed or completed); the running attempt is `attemptsMade + 1`. */
  readonly attemptsMade: number;
  /** When it was added, epoch ms (the queue's clock). */
  readonly addedAt: number;
  /** Its deduplication key, when added with one. */
  readonly dedupId?: string | undefined;
  /**
   * Set while the job is a deduplication follow-up: the id of the running job of the same key it
   * waits for (cleared when that one ends and this one is queued).
   */
  readonly after?: string | undefined;
  /** When its latest attempt started, epoch ms. */
  readonly processedOn?: number | undefined;
  /** When the retry of a `delayed` job is due, epoch ms. */
  readonly delayUntil?: number | undefined;
  /** When it ended (completed, failed or dropped), epoch ms. */
  readonly finishedOn?: number | undefined;
  /** What the processor returned (completed jobs). */
  readonly returnvalue?: unknown;
  /** The final error's message (failed and dropped jobs). */
  readonly failedReason?: string | undefined;
  /** The final error itself (failed and dropped jobs). */
  readonly error?: unknown;
}

/** Options of {@link LocalQueue}. */
export interface LocalQueueOptions<T> {
  /**
   * Runs one attempt of a job. Its resolved value is the job's return value; throwing (or
   * rejecting) fails the attempt, which is retried with backoff until `attempts` are spent, unless
   * the error says it cannot succeed: `retryable === false` (every {@link ConvoMirrorError} that is
   * not retryable) or the name `UnrecoverableError` (as in BullMQ). `signal` aborts when the
   * queue's {@link LocalQueue.close} grace period ends.
   */
  process: (job: LocalJob<T>, signal: AbortSignal) => Promise<unknown>;
  /** Jobs run at a time (an integer ≥ 1). */
  concurrency: number;
  /** Attempts of a job before it is kept as failed, the first included (an integer ≥ 1), like BullMQ's `attempts`. */
  attempts: number;
  /**
   * First retry delay, ms; exponential like BullMQ's: the retry after attempt n waits
   * `backoffMs * 2^(n-1)`. @defaultValue 1000
   */
  backoffMs?: number;
  /** Failed jobs kept (the dead letter list), the newest; older ones are forgotten. @defaultValue 1000 */
  keepFailed?: number;
  /** Completed jobs kept, the newest. @defaultValue 100 */
  keepCompleted?: number;
  /**
   * Time: `now` stamps jobs, `sleep` waits the retries' backoff and the close grace period.
   * @defaultValue the system clock
   */
  clock?: Clock;
  /**
   * Where the job lines go: `job started` and `job completed` (info), `job failed` (warn, with
   * `retry_in_ms` when it will be retried), `job interrupted` (warn, at close), and the close's
   * lines. @defaultValue none
   */
  logger?: Logger;
  /**
   * Extra fields of a job's log lines (e.g. its conversation id, or figures of its return value,
   * given as `value` on completion). Must not throw; never put a secret there.
   */
  logFields?: (job: LocalJob<T>, value?: unknown) => Record<string, unknown>;
}

/** How {@link LocalQueue.close} ended. */
export interface LocalQueueClosed {
  /** True when running jobs had to be aborted at the end of the grace period. */
  forced: boolean;
  /** Jobs still running when `close` gave up on them (they ignored the abort for `abortWaitMs`). */
  abandoned: number;
}

/**
 * The queue is closed (or closing): thrown by {@link LocalQueue.add}, the rejection of
 * {@link LocalQueue.waitFor} for jobs dropped by the close, and the reason of the abort signal.
 */
export class QueueClosedError extends ConvoMirrorError {
  constructor(message = 'the queue is closed') {
    super('QUEUE_CLOSED', message);
  }
}

/** A job with what the queue needs around it: the promise {@link LocalQueue.waitFor} hands out. */
interface Entry<T> {
  job: Mutable<LocalJob<T>>;
  done: Promise<unknown>;
  resolve: (value: unknown) => void;
  reject: (err: unknown) => void;
  /** The running attempt's signal (aborted when the close's grace period ends). */
  abort?: AbortController | undefined;
}

type Mutable<X> = { -readonly [K in keyof X]: X[K] };

/** Who holds a deduplication key: the job that waits or runs, and at most one follow-up. */
interface DedupSlot {
  holder: string;
  followUp?: string | undefined;
}

/**
 * An in-process job queue with BullMQ's semantics where the daemon relies on them: attempts with
 * exponential backoff, errors that are not retryable failing at once, a bounded dead letter list,
 * and per-key deduplication like BullMQ's `deduplication: { id, keepLastIfActive: true }` (see
 * {@link LocalQueue.add}). Jobs start in the order they were queued (a retry is queued again when
 * its backoff ends), at most `concurrency` at a time, never in the call that adds them.
 *
 * Nothing is persisted: at {@link LocalQueue.close}, or if the process ends, waiting and delayed
 * jobs are lost. The daemon re-derives them: the schedules make the next workspace runs, webhooks
 * re-send changes, and a run resumes from its committed checkpoints.
 */
export class LocalQueue<T> {
  private readonly entries = new Map<string, Entry<T>>();
  /** Queued jobs, ready to run, in order. */
  private readonly ready: Entry<T>[] = [];
  private readonly active = new Set<Entry<T>>();
  private readonly delayed = new Set<Entry<T>>();
  /** Follow-ups waiting for the running job of their key. */
  private readonly followUps = new Set<Entry<T>>();
  /** Ended jobs kept, oldest first. */
  private readonly completedList: Entry<T>[] = [];
  private readonly failedList: Entry<T>[] = [];
  private readonly dedup = new Map<string, DedupSlot>();
  /** Aborted when close() begins: cuts the backoff waits short. */
  private readonly stopping = new AbortController();
  private readonly clock: Clock;
  private readonly backoffMs: number;
  private readonly keepFailed: number;
  private readonly keepCompleted: number;
  private nextId = 1;
  private pumpScheduled = false;
  private closing: Promise<LocalQueueClosed> | undefined;

  /** @throws RangeError when `concurrency` or `attempts` is not an integer ≥ 1, or a delay or count is negative */
  constructor(private readonly o: LocalQueueOptions<T>) {
    if (!Number.isInteger(o.concurrency) || o.concurrency < 1) throw new RangeError(`concurrency must be an integer >= 1, got ${o.concurrency}`);
    if (!Number.isInteger(o.attempts) || o.attempts < 1) throw new RangeError(`attempts must be an integer >= 1, got ${o.attempts}`);
    this.backoffMs = nonNegative('backoffMs', o.backoffMs ?? 1000);
    this.keepFailed = nonNegative('keepFailed', o.keepFailed ?? 1000);
    this.keepCompleted = nonNegative('keepCompleted', o.keepCompleted ?? 100);
    this.clock = o.clock ?? systemClock;
  }

  /**
   * Queues a job. With `dedupId`, at most two jobs of that key exist at a time, as with BullMQ's
   * `deduplication: { id, keepLastIfActive: true }`:
   * - while a job of the key waits (or waits its retry backoff), adding adds nothing and returns
   *   that job's id;
   * - while one runs, adding queues exactly one follow-up, which starts only after the running one
   *   ends (completed or failed), and returns its id; further adds while the follow-up is pending
   *   return its id too and replace its name and data (the last one wins, as in BullMQ);
   * - once the key's jobs have ended, adding makes a new job.
   *
   * @returns the id of the job that will do the work: the new job, or the existing one of the key
   * @throws {@link QueueClosedError} once {@link LocalQueue.close} has been called
   */
  add(name: string, data: T, o: { dedupId?: string } = {}): string {
    if (this.closing) throw new QueueClosedError(`the queue is closed: cannot add a ${name} job`);
    const dedupId = o.dedupId;
    const slot = dedupId === undefined ? undefined : this.dedup.get(dedupId);
    if (slot) {
      if (slot.followUp !== undefined) {
        const f = this.entries.get(slot.followUp)!;
        f.job.name = name;
        f.job.data = data;
        return f.job.id;
      }
      const holder = this.entries.get(slot.holder)!;
      if (holder.job.state !== 'active') return holder.job.id;
      const f = this.newEntry(name, data, dedupId);
      f.job.after = holder.job.id;
      slot.followUp = f.job.id;
      this.followUps.add(f);
      return f.job.id;
    }
    const e = this.newEntry(name, data, dedupId);
    if (dedupId !== undefined) this.dedup.set(dedupId, { holder: e.job.id });
    this.ready.push(e);
    this.schedulePump();
    return e.job.id;
  }

  /** Jobs in each state now, for the `convo_mirror_queue_jobs{state}` gauge (kept ones for completed and failed). */
  counts(): Record<LocalCountedState, number> {
    return {
      waiting: this.ready.length + this.followUps.size,
      active: this.active.size,
      delayed: this.delayed.size,
      failed: this.failedList.length,
      completed: this.completedList.length,
    };
  }

  /** The kept failed jobs (the dead letter list), newest first; each with its final error. */
  failed(): LocalJob<T>[] {
    return this.failedList.map((e) => e.job).reverse();
  }

  /** A job by id: any job not ended, the kept ended ones and those the close dropped; undefined otherwise. */
  get(id: string): LocalJob<T> | undefined {
    return this.entries.get(id)?.job;
  }

  /**
   * Resolves when the job ends: with its return value when it completes; rejects with its final
   * error when it fails, with the error that ended it when the queue's close dropped or interrupted
   * it (a {@link QueueClosedError} for jobs that never got to run again).
   *
   * @throws (rejects) Error when no such job is known: never added, or ended and no longer kept
   */
  waitFor(id: string): Promise<unknown> {
    const e = this.entries.get(id);
    if (!e) return Promise.reject(new Error(`no job ${id} in the queue (never added, or ended and no longer kept)`));
    return e.done;
  }

  /**
   * Stops the queue: no job starts from now on and {@link LocalQueue.add} throws. Waiting jobs
   * (follow-ups included) and delayed ones are dropped at once (their {@link LocalQueue.waitFor}
   * rejects with a {@link QueueClosedError}): nothing is persisted, the schedules re-derive the
   * workspace runs and webhooks re-send changes. Running jobs get `graceMs` to end; then their
   * signal aborts (a job that fails after that is `dropped`, not retried nor kept as failed), and
   * `close` waits at most `abortWaitMs` more before it gives up on them. Idempotent: later calls
   * return the first call's promise.
   *
   * @param graceMs - how long running jobs may take to end by themselves, ms (the queue's clock)
   * @param o.abortWaitMs - how long to wait for aborted jobs to end, ms. @defaultValue 5000
   * @returns whether jobs had to be aborted, and how many were still running when it gave up
   */
  close(graceMs: number, o: { abortWaitMs?: number } = {}): Promise<LocalQueueClosed> {
    this.closing ??= this.shut(graceMs, o.abortWaitMs ?? 5000);
    return this.closing;
  }

  private async shut(graceMs: number, abortWaitMs: number): Promise<LocalQueueClosed> {
    const closed = new QueueClosedError('the queue closed before the job ran');
    this.stopping.abort(closed);
    this.dedup.clear(); // first: a dropped job hands its key to no one
    const pending = [...this.ready, ...this.followUps, ...this.delayed];
    this.ready.length = 0;
    this.followUps.clear();
    this.delayed.clear();
    for (const e of pending) this.drop(e, closed);
    this.o.logger?.info({ active: this.active.size, dropped: pending.length, grace_ms: graceMs }, 'queue closing: no new jobs; waiting for running ones');
    if (await this.activeEnd(graceMs)) return { forced: false, abandoned: 0 };
    this.o.logger?.warn({ active: this.active.size }, 'grace period over: aborting running jobs');
    const reason = new QueueClosedError('the queue closed: grace period over');
    for (const e of this.active) e.abort?.abort(reason);
    if (await this.activeEnd(abortWaitMs)) return { forced: true, abandoned: 0 };
    this.o.logger?.warn({ active: this.active.size }, 'jobs still running after the abort: closing without them');
    return { forced: true, abandoned: this.active.size };
  }

  /** True when every running job has ended within `ms` (the queue's clock). */
  private async activeEnd(ms: number): Promise<boolean> {
    if (this.active.size === 0) return true;
    const allEnded = Promise.all([...this.active].map((e) => e.done.catch(() => undefined))).then(() => true);
    const timer = new AbortController();
    const timeout = this.clock.sleep(ms, timer.signal).then(
      () => false,
      () => false,
    );
    try {
      return await Promise.race([allEnded, timeout]);
    } finally {
      timer.abort();
    }
  }

  private newEntry(name: string, data: T, dedupId: string | undefined): Entry<T> {
    let resolve!: (value: unknown) => void;
    let reject!: (err: unknown) => void;
    const done = new Promise<unknown>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    done.catch(() => {}); // a rejection is for whoever waits; none is never an unhandled rejection
    const job: Mutable<LocalJob<T>> = {
      id: `local-${this.nextId++}`,
      name,
      data,
      state: 'waiting',
      attemptsMade: 0,
      addedAt: this.clock.now(),
      ...(dedupId === undefined ? {} : { dedupId }),
    };
    const e: Entry<T> = { job, done, resolve, reject };
    this.entries.set(job.id, e);
    return e;
  }

  /** Starts ready jobs in a later microtask (never inside `add`), as slots allow. */
  private schedulePump(): void {
    if (this.pumpScheduled) return;
    this.pumpScheduled = true;
    queueMicrotask(() => {
      this.pumpScheduled = false;
      while (!this.closing && this.active.size < this.o.concurrency) {
        const e = this.ready.shift();
        if (!e) break;
        void this.run(e);
      }
    });
  }

  /** One attempt of a job, and what follows it. Never rejects. */
  private async run(e: Entry<T>): Promise<void> {
    const job = e.job;
    job.state = 'active';
    job.processedOn = this.clock.now();
    const abort = new AbortController();
    e.abort = abort;
    this.active.add(e);
    this.log('info', e, 'job started', { attempt: job.attemptsMade + 1 });
    let value: unknown;
    let error: unknown;
    let ok = false;
    try {
      value = await this.o.process(job, abort.signal);
      ok = true;
    } catch (err) {
      error = err;
    }
    this.active.delete(e);
    e.abort = undefined;
    job.attemptsMade += 1;
    if (ok) this.complete(e, value);
    else if (abort.signal.aborted) {
      this.log('warn', e, 'job interrupted', { attempts: job.attemptsMade, err: describeError(error) });
      this.drop(e, error);
    } else if (isRetryable(error) && job.attemptsMade < this.o.attempts) {
      if (this.closing) {
        this.log('warn', e, 'job failed', { attempts: job.attemptsMade, err: describeError(error), dropped: 'queue closing' });
        this.drop(e, error);
      } else this.retryLater(e, error);
    } else this.fail(e, error);
    this.schedulePump();
  }

  private complete(e: Entry<T>, value: unknown): void {
    const job = e.job;
    job.state = 'completed';
    job.returnvalue = value;
    job.finishedOn = this.clock.now();
    this.log('info', e, 'job completed', {}, value);
    this.keep(this.completedList, e, this.keepCompleted);
    this.release(e);
    e.resolve(value);
  }

  private fail(e: Entry<T>, error: unknown): void {
    const job = e.job;
    job.state = 'failed';
    job.error = error;
    job.failedReason = describeError(error);
    job.finishedOn = this.clock.now();
    this.log('warn', e, 'job failed', { attempts: job.attemptsMade, err: job.failedReason });
    this.keep(this.failedList, e, this.keepFailed);
    this.release(e);
    e.reject(error);
  }

  /**
   * The job ends without running again (the queue closed): not a dead letter. It stays readable
   * (`get`, `waitFor`): a close happens once, so what it drops is bounded by what it found.
   */
  private drop(e: Entry<T>, error: unknown): void {
    const job = e.job;
    job.state = 'dropped';
    job.after = undefined;
    job.delayUntil = undefined;
    job.error = error;
    job.failedReason = describeError(error);
    job.finishedOn = this.clock.now();
    this.release(e);
    e.reject(error);
  }

  /** Waits the backoff of the attempt that just failed, then queues the job again. */
  private retryLater(e: Entry<T>, error: unknown): void {
    const job = e.job;
    const ms = this.backoffMs * 2 ** (job.attemptsMade - 1);
    job.state = 'delayed';
    job.delayUntil = this.clock.now() + ms;
    this.delayed.add(e);
    this.log('warn', e, 'job failed', { attempts: job.attemptsMade, err: describeError(error), retry_in_ms: ms });
    this.clock.sleep(ms, this.stopping.signal).then(
      () => {
        if (job.state !== 'delayed' || this.closing) return; // dropped by close
        this.delayed.delete(e);
        job.state = 'waiting';
        job.delayUntil = undefined;
        this.ready.push(e);
        this.schedulePump();
      },
      () => {}, // the close cut the wait short: it dropped the job
    );
  }

  /** Keeps an ended job in `list`, forgetting the oldest beyond `max`. */
  private keep(list: Entry<T>[], e: Entry<T>, max: number): void {
    list.push(e);
    while (list.length > max) this.entries.delete(list.shift()!.job.id);
  }

  /** An ended job lets go of its deduplication key: its follow-up, if any, takes it and is queued. */
  private release(e: Entry<T>): void {
    const key = e.job.dedupId;
    if (key === undefined) return;
    const slot = this.dedup.get(key);
    if (slot?.holder !== e.job.id) return;
    if (slot.followUp === undefined) {
      this.dedup.delete(key);
      return;
    }
    const f = this.entries.get(slot.followUp)!;
    this.dedup.set(key, { holder: f.job.id });
    this.followUps.delete(f);
    f.job.after = undefined;
    this.ready.push(f);
    this.schedulePump();
  }

  private log(level: 'info' | 'warn', e: Entry<T>, msg: string, fields: Record<string, unknown>, value?: unknown): void {
    const logger = this.o.logger;
    if (!logger) return;
    let extra: Record<string, unknown> = {};
    try {
      extra = this.o.logFields?.(e.job, value) ?? {};
    } catch {
      // a log line never stops a job
    }
    logger[level]({ job: e.job.id, name: e.job.name, ...extra, ...fields }, msg);
  }
}

/** Whether a failed attempt may be retried: not when the error says it cannot succeed. */
function isRetryable(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return true;
  if ((err as { retryable?: unknown }).retryable === false) return false;
  return (err as { name?: unknown }).name !== 'UnrecoverableError';
}

function nonNegative(name: string, n: number): number {
  if (!Number.isFinite(n) || n < 0) throw new RangeError(`${name} must be a number >= 0, got ${n}`);
  return n;
}

/** One schedule of a {@link LocalScheduler}, for logs and status. */
export interface LocalScheduleStatus {
  id: string;
  pattern: string;
  /** node-cron's task status: `idle` or `running` while scheduled, `destroyed` after {@link LocalScheduler.stop}. */
  status: string;
  /** Its next fire time; undefined once stopped. */
  nextRun: Date | undefined;
}

/** Options of {@link LocalScheduler}. */
export interface LocalSchedulerOptions {
  /** IANA time zone of every pattern, e.g. `UTC`, `Europe/Paris`. */
  tz: string;
  /** Where ticks (debug), late or missed ticks (warn) and failing tick handlers (error) are logged. @defaultValue none */
  logger?: Logger;
  /**
   * How late a tick may still fire, ms, when the event loop was busy at its time (a long
   * transaction, a big export); a tick later than that, or later than the next one, is skipped and
   * logged. node-cron's default (1 s) would drop a workspace run for a one-second stall.
   * @defaultValue 60000
   */
  missedToleranceMs?: number;
}

/**
 * The schedules of the Redis-free daemon on node-cron: each pattern calls its `onTick` in this
 * process at its times (in `tz`). What BullMQ's job schedulers do for the Redis daemon, for one
 * process: there is no coordination between processes.
 */
export class LocalScheduler {
  private readonly tasks = new Map<string, { pattern: string; task: ScheduledTask }>();
  private stopped = false;

  /** @throws {@link ConfigError} (variable `tz`) when `tz` is not an IANA time zone */
  constructor(private readonly o: LocalSchedulerOptions) {
    try {
      new Intl.DateTimeFormat('en-US', { timeZone: o.tz });
    } catch {
      throw new ConfigError('tz', `"${o.tz}" is not an IANA time zone such as UTC or Europe/Paris`);
    }
  }

  /**
   * Schedules `onTick` at every time `pattern` matches: node-cron's syntax, 5 fields (minute hour
   * day month weekday) or 6 with seconds first. `onTick` should be quick (queue a job); an error it
   * throws is logged, and the schedule goes on.
   *
   * @param id - names the schedule in logs and errors (e.g. `workspace-regular`)
   * @param o.setting - the setting the pattern came from (e.g. `CONVO_MIRROR_SCHEDULE`), for the error
   * @throws {@link ConfigError} naming `o.setting` (else `id`) and `id` when the pattern is not valid
   * @throws Error when `id` is already scheduled, or after {@link LocalScheduler.stop}
   */
  add(id: string, pattern: string, onTick: () => void, o: { setting?: string } = {}): void {
    if (this.stopped) throw new Error(`schedule "${id}": the scheduler is stopped`);
    if (this.tasks.has(id)) throw new Error(`schedule "${id}" is already scheduled`);
    const check = cron.validateDetailed(pattern);
    if (!check.valid) {
      const why = check.errors.map((e) => `${e.field}: ${e.message}`).join('; ');
      throw new ConfigError(o.setting ?? id, `schedule "${id}": "${pattern}" is not a valid cron pattern${why ? ` (${why})` : ''}`);
    }
    const log = this.o.logger?.child({ schedule: id });
    const task = cron.schedule(
      pattern,
      () => {
        log?.debug('schedule tick');
        try {
          onTick();
        } catch (err) {
          log?.error({ err: describeError(err) }, 'schedule tick failed');
        }
      },
      { timezone: this.o.tz, name: id, logger: cronLogger(log), missedExecutionTolerance: this.o.missedToleranceMs ?? 60_000 },
    );
    this.tasks.set(id, { pattern, task });
  }

  /** Every schedule with its next fire time, in the order they were added. */
  schedules(): LocalScheduleStatus[] {
    return [...this.tasks].map(([id, { pattern, task }]) => {
      const status = task.getStatus();
      const next = status === 'idle' || status === 'running' ? task.getNextRun() : null;
      return { id, pattern, status, nextRun: next ?? undefined };
    });
  }

  /** Stops every schedule (no tick fires afterwards; a tick already running finishes). Idempotent. */
  stop(): void {
    this.stopped = true;
    for (const { task } of this.tasks.values()) void Promise.resolve(task.destroy()).catch(() => {});
  }
}

/** node-cron's logger over pino (silent without one). */
function cronLogger(log: Logger | undefined): CronLogger {
  const fields = (err: unknown) => (err === undefined ? {} : { err: describeError(err) });
  return {
    info: (m) => log?.info(m),
    warn: (m) => log?.warn(m),
    error: (m, err) => log?.error(fields(err ?? (typeof m === 'string' ? undefined : m)), typeof m === 'string' ? m : 'node-cron error'),
    debug: (m, err) => log?.debug(fields(err ?? (typeof m === 'string' ? undefined : m)), typeof m === 'string' ? m : 'node-cron debug'),
  };
}
