/**
 * The Redis-free daemon's machinery (jobs/local-queue.ts): the in-process queue's deduplication,
 * concurrency, retries, dead letters and close, on injected clocks (no real waiting except the
 * close test that runs on the system clock with a short grace); the node-cron scheduler on a real
 * every-second cron, polled (bounded).
 *
 * Every processor records `start:<label>` / `end:<label>` in one event list, so orders ("the
 * follow-up started after the running job ended", "no job started after close") are asserted on
 * what happened, never on a sleep.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { pino, type Logger } from 'pino';
import cron from 'node-cron';
import { UnrecoverableError } from 'bullmq';
import { LocalQueue, LocalScheduler, QueueClosedError, type LocalJob, type LocalQueueOptions } from '../jobs/local-queue.js';
import { ConfigError, ConvoMirrorError } from '../src/errors.js';
import type { Clock } from '../src/clock.js';
import { testClock } from './clock.js';
import { waitFor, within } from './children.js';

interface Data {
  label: string;
  v?: number;
}

interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * A queue whose processor records its starts and ends in `events`, holds a job while `gates` has
 * a gate for its label, and otherwise returns `<label>:<v>`.
 */
function harness(o: Partial<LocalQueueOptions<Data>> & { run?: (job: LocalJob<Data>, signal: AbortSignal) => Promise<unknown> } = {}) {
  const events: string[] = [];
  const gates = new Map<string, Deferred>();
  const gate = (label: string) => {
    const d = deferred();
    gates.set(label, d);
    return d;
  };
  const queue = new LocalQueue<Data>({
    concurrency: 1,
    attempts: 1,
    clock: testClock(),
    ...o,
    process: async (job, signal) => {
      events.push(`start:${job.data.label}`);
      try {
        const g = gates.get(job.data.label);
        if (g) await g.promise;
        return o.run ? await o.run(job, signal) : `${job.data.label}:${job.data.v ?? 0}`;
      } finally {
        events.push(`end:${job.data.label}`);
      }
    },
  });
  const started = (label: string, n = 1) => waitFor(() => events.filter((e) => e === `start:${label}`).length >= n, 2000, `${label} to start`);
  return { queue, events, gate, started };
}

/** A clock whose sleeps wait until the test releases them. */
function manualClock(): Clock & { sleeps: { ms: number; release: () => void }[] } {
  const sleeps: { ms: number; release: () => void }[] = [];
  return {
    sleeps,
    now: () => 5_000_000,
    sleep: (ms, signal) =>
      new Promise<void>((resolve, reject) => {
        if (signal?.aborted) return reject(signal.reason);
        signal?.addEventListener('abort', () => reject(signal.reason), { once: true });
        sleeps.push({ ms, release: resolve });
      }),
  };
}

/** A pino logger whose lines land in `lines`. */
function capturingLogger(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  return { lines, logger: pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) }) };
}

describe('LocalQueue deduplication (BullMQ keepLastIfActive)', () => {
  it('while a job of the key waits, adding again returns its id and it runs once', async () => {
    const { queue, events, gate, started } = harness();
    const blocker = gate('blocker');
    queue.add('other', { label: 'blocker' });
    await started('blocker');
    const id = queue.add('conv', { label: 'a', v: 1 }, { dedupId: 'conversation-a' });
    expect(queue.add('conv', { label: 'a', v: 2 }, { dedupId: 'conversation-a' })).toBe(id);
    expect(queue.add('conv', { label: 'a', v: 3 }, { dedupId: 'conversation-a' })).toBe(id);
    expect(queue.get(id)).toMatchObject({ state: 'waiting', data: { v: 1 } });
    expect(queue.counts()).toEqual({ waiting: 1, active: 1, delayed: 0, failed: 0, completed: 0 });
    blocker.resolve();
    expect(await queue.waitFor(id)).toBe('a:1');
    expect(events.filter((e) => e === 'start:a')).toHaveLength(1);
    expect(queue.counts()).toEqual({ waiting: 0, active: 0, delayed: 0, failed: 0, completed: 2 });
  });

  it('while one runs, adding queues exactly one follow-up that starts after it ends; then a new add makes a new job', async () => {
    const { queue, events, gate, started } = harness({ concurrency: 2 });
    const key = { dedupId: 'conversation-a' };
    const a1Gate = gate('a');
    const first = queue.add('conv', { label: 'a', v: 1 }, key);
    await started('a');
    const bGate = gate('b');
    queue.add('other', { label: 'b' });
    await started('b');
    // Both slots busy. The follow-up: a new job, pending behind the running one.
    const follow = queue.add('conv', { label: 'a', v: 2 }, key);
    expect(follow).not.toBe(first);
    expect(queue.get(follow)).toMatchObject({ state: 'waiting', after: first, dedupId: 'conversation-a' });
    // Further adds while it is pending: its id, the last data wins (as in BullMQ).
    expect(queue.add('conv', { label: 'a', v: 3 }, key)).toBe(follow);
    expect(queue.get(follow)!.data.v).toBe(3);
    expect(queue.counts()).toMatchObject({ waiting: 1, active: 2 });
    // c queued before the follow-up is released: it takes the slot a1 frees, so the follow-up waits queued.
    const cGate = gate('c');
    queue.add('other', { label: 'c' });
    const followGate = gate('a'); // holds the follow-up once it runs
    a1Gate.resolve();
    expect(await queue.waitFor(first)).toBe('a:1');
    await started('c');
    expect(queue.get(follow)).toMatchObject({ state: 'waiting', after: undefined });
    // A third add while the follow-up waits (its holder ended): the follow-up's id, nothing changed.
    expect(queue.add('conv', { label: 'a', v: 4 }, key)).toBe(follow);
    expect(queue.get(follow)!.data.v).toBe(3);
    expect(queue.counts()).toEqual({ waiting: 1, active: 2, delayed: 0, failed: 0, completed: 1 });
    bGate.resolve();
    await started('a', 2);
    // Running now: one more add queues one more follow-up.
    const second = queue.add('conv', { label: 'a', v: 5 }, key);
    expect(second).not.toBe(follow);
    expect(queue.get(second)).toMatchObject({ state: 'waiting', after: follow });
    cGate.resolve();
    followGate.resolve(); // the remaining runs of a pass it
    expect(await queue.waitFor(follow)).toBe('a:3');
    expect(await queue.waitFor(second)).toBe('a:5');
    // Everything ended: a new add is a new job.
    const fresh = queue.add('conv', { label: 'a', v: 6 }, key);
    expect([first, follow, second]).not.toContain(fresh);
    expect(await queue.waitFor(fresh)).toBe('a:6');
    // Never two runs of the key at once: every start of a follows the end of the one before.
    const ofA = events.filter((e) => e.endsWith(':a'));
    expect(ofA).toEqual(['start:a', 'end:a', 'start:a', 'end:a', 'start:a', 'end:a', 'start:a', 'end:a']);
    expect(new Set([first, follow, second, fresh]).size).toBe(4);
    expect([first, follow, second, fresh].every((id) => /^local-\d+$/.test(id))).toBe(true);
  });

  it('a follow-up also runs after the running job fails for good', async () => {
    const { queue, gate, started } = harness({
      concurrency: 2,
      run: async (job) => {
        if (job.data.v === 1) throw new ConvoMirrorError('BROKEN', 'no good');
        return job.data.v;
      },
    });
    const g = gate('a');
    const first = queue.add('conv', { label: 'a', v: 1 }, { dedupId: 'k' });
    await started('a');
    const follow = queue.add('conv', { label: 'a', v: 2 }, { dedupId: 'k' });
    g.resolve();
    await expect(queue.waitFor(first)).rejects.toThrow('no good');
    expect(await queue.waitFor(follow)).toBe(2);
  });
});

describe('LocalQueue running jobs', () => {
  it('never runs more than `concurrency` jobs at a time, and reaches it', async () => {
    let running = 0;
    let most = 0;
    let mostCounted = 0;
    const queue = new LocalQueue<number>({
      concurrency: 3,
      attempts: 1,
      process: async (job) => {
        running += 1;
        most = Math.max(most, running);
        mostCounted = Math.max(mostCounted, queue.counts().active);
        for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
        running -= 1;
        return job.data * 2;
      },
    });
    const ids = Array.from({ length: 12 }, (_, i) => queue.add('n', i));
    expect(queue.counts()).toMatchObject({ waiting: 12, active: 0 }); // nothing starts inside add()
    expect(await Promise.all(ids.map((id) => queue.waitFor(id)))).toEqual(Array.from({ length: 12 }, (_, i) => i * 2));
    expect(most).toBe(3);
    expect(mostCounted).toBe(3);
    expect(queue.counts()).toEqual({ waiting: 0, active: 0, delayed: 0, failed: 0, completed: 12 });
  });

  it('retries with exponential backoff through the clock, and the next attempt sees changed data', async () => {
    const clock = testClock();
    const seen: (number | undefined)[] = [];
    const { queue } = harness({
      clock,
      attempts: 4,
      backoffMs: 100,
      run: async (job) => {
        seen.push(job.data.v);
        job.data = { ...job.data, v: (job.data.v ?? 0) + 1 };
        if (job.attemptsMade < 3) throw new Error(`flaky ${job.attemptsMade + 1}`);
        return 'ok';
      },
    });
    const id = queue.add('j', { label: 'r', v: 0 });
    expect(await queue.waitFor(id)).toBe('ok');
    expect(clock.sleeps).toEqual([100, 200, 400]);
    expect(seen).toEqual([0, 1, 2, 3]);
    expect(queue.get(id)).toMatchObject({ state: 'completed', attemptsMade: 4, returnvalue: 'ok' });
  });

  it('a retry waits in the delayed state until its backoff ends', async () => {
    const clock = manualClock();
    const { queue, events } = harness({
      clock,
      attempts: 2,
      backoffMs: 250,
      run: async (job) => {
        if (job.attemptsMade === 0) throw new Error('first attempt fails');
        return 'second';
      },
    });
    const id = queue.add('j', { label: 'd' });
    await waitFor(() => queue.get(id)?.state === 'delayed', 2000, 'the job to be delayed');
    expect(clock.sleeps.map((s) => s.ms)).toEqual([250]);
    expect(queue.get(id)).toMatchObject({ attemptsMade: 1, delayUntil: 5_000_250 });
    expect(queue.counts()).toMatchObject({ delayed: 1, waiting: 0, active: 0 });
    expect(events).toEqual(['start:d', 'end:d']);
    clock.sleeps[0]!.release();
    expect(await queue.waitFor(id)).toBe('second');
    expect(queue.counts()).toMatchObject({ delayed: 0, completed: 1 });
  });

  it('an error that cannot succeed is not retried (retryable false, ConvoMirrorError, UnrecoverableError)', async () => {
    const clock = testClock();
    const errors: Record<string, unknown> = {
      plain: Object.assign(new Error('told not to retry'), { retryable: false }),
      typed: new ConvoMirrorError('SCHEMA_ERROR', 'page breaks the shape'),
      bullmq: new UnrecoverableError('unrecoverable'),
    };
    let attempts = 0;
    const { queue } = harness({
      clock,
      attempts: 5,
      run: async (job) => {
        attempts += 1;
        throw errors[job.data.label];
      },
    });
    for (const label of Object.keys(errors)) {
      const id = queue.add('j', { label });
      await expect(queue.waitFor(id)).rejects.toBe(errors[label]);
      expect(queue.get(id)).toMatchObject({ state: 'failed', attemptsMade: 1 });
    }
    expect(attempts).toBe(3);
    expect(clock.sleeps).toEqual([]);
  });

  it('keeps failed jobs with their final error, newest first, bounded; completed ones bounded too', async () => {
    const clock = testClock();
    const { queue } = harness({
      clock,
      attempts: 3,
      backoffMs: 10,
      keepFailed: 2,
      keepCompleted: 1,
      run: async (job) => {
        if (job.data.label.startsWith('ok')) return 'fine';
        throw new Error(`${job.data.label} failed at attempt ${job.attemptsMade + 1}`);
      },
    });
    const ids = ['f1', 'f2', 'f3'].map((label) => queue.add('j', { label }));
    for (const id of ids) await expect(queue.waitFor(id)).rejects.toThrow();
    const failed = queue.failed();
    expect(failed.map((j) => j.id)).toEqual([ids[2], ids[1]]);
    expect(failed[0]).toMatchObject({ state: 'failed', attemptsMade: 3, failedReason: 'f3 failed at attempt 3' });
    expect((failed[0]!.error as Error).message).toBe('f3 failed at attempt 3');
    expect(failed[0]!.finishedOn).toBe(clock.now());
    expect(queue.get(ids[0]!)).toBeUndefined();
    await expect(queue.waitFor(ids[0]!)).rejects.toThrow(`no job ${ids[0]}`);
    expect([...clock.sleeps].sort((a, b) => a - b)).toEqual([10, 10, 10, 20, 20, 20]); // each job: 10, then 20
    const ok1 = queue.add('j', { label: 'ok1' });
    await queue.waitFor(ok1);
    const ok2 = queue.add('j', { label: 'ok2' });
    await queue.waitFor(ok2);
    expect(queue.get(ok1)).toBeUndefined();
    expect(queue.get(ok2)).toMatchObject({ state: 'completed', returnvalue: 'fine' });
    expect(queue.counts()).toEqual({ waiting: 0, active: 0, delayed: 0, failed: 2, completed: 1 });
  });

  it('logs job started, failed (with the retry delay) and completed lines with the extra fields', async () => {
    const { logger, lines } = capturingLogger();
    const { queue } = harness({
      clock: testClock(),
      attempts: 2,
      backoffMs: 30,
      logger,
      logFields: (job, value) => ({ label: job.data.label, ...(value === undefined ? {} : { value }) }),
      run: async (job) => {
        if (job.attemptsMade === 0) throw new Error('once');
        return 7;
      },
    });
    const id = queue.add('j', { label: 'l' });
    await queue.waitFor(id);
    expect(lines.map((l) => [l.msg, l.job, l.label, l.attempt ?? l.attempts, l.retry_in_ms, l.value])).toEqual([
      ['job started', id, 'l', 1, undefined, undefined],
      ['job failed', id, 'l', 1, 30, undefined],
      ['job started', id, 'l', 2, undefined, undefined],
      ['job completed', id, 'l', undefined, undefined, 7],
    ]);
  });

  it('refuses a concurrency or attempts below 1', () => {
    const process = async () => undefined;
    expect(() => new LocalQueue({ process, concurrency: 0, attempts: 1 })).toThrow(RangeError);
    expect(() => new LocalQueue({ process, concurrency: 1, attempts: 0 })).toThrow(/attempts/);
  });
});

describe('LocalQueue close', () => {
  it('waits for running jobs, drops waiting and delayed ones, starts nothing after, refuses adds', async () => {
    const { queue, events, gate, started } = harness({
      concurrency: 2,
      attempts: 3,
      clock: manualClock(),
      run: async (job) => {
        if (job.data.label === 'flaky') throw new Error('retry me');
        return 'done';
      },
    });
    const g = gate('slow');
    const slow = queue.add('j', { label: 'slow' });
    const flaky = queue.add('j', { label: 'flaky' });
    await waitFor(() => queue.get(flaky)?.state === 'delayed', 2000, 'flaky to be delayed');
    await started('slow');
    const otherGate = gate('other');
    queue.add('j', { label: 'other' }, { dedupId: 'x' }); // takes the slot flaky left
    await started('other');
    const waiting = queue.add('j', { label: 'waiting' });
    const follow = queue.add('j', { label: 'other-again' }, { dedupId: 'x' });
    expect(queue.get(follow)!.after).toBeDefined();
    expect(queue.counts()).toMatchObject({ active: 2, waiting: 2, delayed: 1 });

    let closedAt = -1;
    const first = queue.close(60_000);
    const closing = first.then((r) => {
      closedAt = events.length;
      return r;
    });
    expect(queue.close(1)).toBe(first); // idempotent
    expect(queue.counts()).toMatchObject({ active: 2, waiting: 0, delayed: 0 });
    await expect(queue.waitFor(waiting)).rejects.toBeInstanceOf(QueueClosedError);
    await expect(queue.waitFor(follow)).rejects.toBeInstanceOf(QueueClosedError);
    await expect(queue.waitFor(flaky)).rejects.toBeInstanceOf(QueueClosedError);
    expect(() => queue.add('j', { label: 'late' })).toThrow(QueueClosedError);

    g.resolve();
    otherGate.resolve();
    expect(await within(closing, 5000, 'close')).toEqual({ forced: false, abandoned: 0 });
    expect(await queue.waitFor(slow)).toBe('done');
    // close resolved only after both running jobs ended; nothing started after it began.
    expect(events.slice(0, closedAt)).toEqual(expect.arrayContaining(['end:other', 'end:slow']));
    expect(events.filter((e) => e.startsWith('start:'))).toEqual(['start:slow', 'start:flaky', 'start:other']);
    expect(queue.get(waiting)).toMatchObject({ state: 'dropped', failedReason: 'the queue closed before the job ran' });
    expect(queue.get(flaky)).toMatchObject({ state: 'dropped', attemptsMade: 1 });
    expect(queue.failed()).toEqual([]);
  });

  it('aborts running jobs at the end of the grace period, and gives up on one that ignores the abort', async () => {
    const clock = manualClock();
    const stubborn = deferred();
    const signals: AbortSignal[] = [];
    const { queue, started } = harness({
      concurrency: 2,
      attempts: 5,
      clock,
      run: async (job, signal) => {
        signals.push(signal);
        if (job.data.label === 'stubborn') {
          await stubborn.promise;
          return 'late';
        }
        await new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true }));
      },
    });
    const polite = queue.add('j', { label: 'polite' });
    const late = queue.add('j', { label: 'stubborn' });
    await started('polite');
    await started('stubborn');
    const closing = queue.close(250, { abortWaitMs: 1000 });
    await waitFor(() => clock.sleeps.length === 1, 2000, 'the grace wait');
    expect(clock.sleeps[0]!.ms).toBe(250);
    expect(signals.map((s) => s.aborted)).toEqual([false, false]); // not before the grace ends
    clock.sleeps[0]!.release();
    await waitFor(() => clock.sleeps.length === 2, 2000, 'the wait after the abort');
    expect(clock.sleeps[1]!.ms).toBe(1000);
    expect(signals.map((s) => s.aborted)).toEqual([true, true]);
    await expect(queue.waitFor(polite)).rejects.toBeInstanceOf(QueueClosedError);
    expect(queue.get(polite)).toMatchObject({ state: 'dropped', attemptsMade: 1 }); // interrupted: not retried, not a dead letter
    expect(queue.failed()).toEqual([]);
    clock.sleeps[1]!.release();
    expect(await within(closing, 5000, 'close')).toEqual({ forced: true, abandoned: 1 });
    stubborn.resolve();
    expect(await queue.waitFor(late)).toBe('late');
  });

  it('on the system clock: a job that waits on its signal is aborted after the grace and close reports forced', async () => {
    const { queue, started } = harness({
      clock: undefined,
      run: (_job, signal) => new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true })),
    });
    const id = queue.add('j', { label: 'waits' });
    await started('waits');
    const result = await within(queue.close(50), 5000, 'close');
    expect(result).toEqual({ forced: true, abandoned: 0 });
    await expect(queue.waitFor(id)).rejects.toThrow(/grace period over/);
  });
});

describe('LocalScheduler', () => {
  let scheduler: LocalScheduler | undefined;
  afterEach(() => scheduler?.stop());

  it('fires an every-second cron, survives a throwing tick, and has nothing scheduled after stop()', async () => {
    const { logger, lines } = capturingLogger();
    scheduler = new LocalScheduler({ tz: 'Europe/Paris', logger });
    let ticks = 0;
    scheduler.add('every-second', '* * * * * *', () => {
      ticks += 1;
      if (ticks === 1) throw new Error('first tick fails');
    });
    const [before] = scheduler.schedules();
    expect(before).toMatchObject({ id: 'every-second', pattern: '* * * * * *', status: 'idle' });
    expect(before!.nextRun!.getTime() - Date.now()).toBeLessThanOrEqual(1000);
    await waitFor(() => ticks >= 1, 3000, 'the first tick');
    await waitFor(() => ticks >= 2, 3000, 'the second tick');
    expect(lines.find((l) => l.msg === 'schedule tick failed')).toMatchObject({ schedule: 'every-second', err: 'first tick fails' });
    scheduler.stop();
    expect(scheduler.schedules()).toEqual([{ id: 'every-second', pattern: '* * * * * *', status: 'destroyed', nextRun: undefined }]);
    expect([...cron.getTasks().values()].some((t) => t.name === 'every-second')).toBe(false);
    expect(() => scheduler!.add('again', '* * * * *', () => {})).toThrow(/stopped/);
  });

  it('refuses an invalid pattern naming the schedule (and its setting), a taken id and an unknown time zone', () => {
    scheduler = new LocalScheduler({ tz: 'UTC' });
    expect(() => scheduler!.add('workspace-regular', '61 * * * *', () => {})).toThrow(/schedule "workspace-regular": "61 \* \* \* \*" is not a valid cron pattern \(minute/);
    let err: unknown;
    try {
      scheduler.add('workspace-full', 'every day', () => {}, { setting: 'CONVO_MIRROR_FULL_SCHEDULE' });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).variable).toBe('CONVO_MIRROR_FULL_SCHEDULE');
    expect((err as Error).message).toMatch(/workspace-full/);
    scheduler.add('workspace-regular', '*/15 * * * *', () => {});
    expect(() => scheduler!.add('workspace-regular', '0 3 * * *', () => {})).toThrow(/already scheduled/);
    expect(scheduler.schedules().map((s) => s.id)).toEqual(['workspace-regular']);
    expect(() => new LocalScheduler({ tz: 'Mars/Olympus_Mons' })).toThrow(ConfigError);
  });
});
