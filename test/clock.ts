/**
 * The one test clock (design habit 8: time is an input). Production code reads time only through
 * `Clock`; tests hand it a {@link TestClock} and assert on the waits it recorded, never on measured
 * elapsed time.
 */
import { systemClock, type Clock } from '../src/clock.js';

/** A {@link Clock} whose time tests control and whose sleeps they can read. */
export interface TestClock extends Clock {
  /** Virtual time, epoch ms (in `real` mode: the offset-free start; read {@link Clock.now} instead). */
  t: number;
  /** Every `sleep(ms)` asked for, in order (ms). */
  sleeps: number[];
  /** Moves time forward by `ms` (a checkpoint ages, a day passes) without waiting. */
  advance(ms: number): void;
}

/** Options of {@link testClock}. */
export interface TestClockOptions {
  /** Epoch ms at which the clock starts. @defaultValue 1_000_000 */
  start?: number;
  /**
   * How `sleep` behaves:
   * - `'instant'` (default): records the wait and resolves at once; time does not move (so
   *   concurrent waits are all observable from the same instant);
   * - `'advance'`: records the wait, moves time forward by it, resolves at once (virtual time);
   * - `'real'`: records the wait and really waits; `now()` follows the real clock from `start`
   *   (plus whatever {@link TestClock.advance} added). For tests that talk to real servers.
   */
  sleep?: 'instant' | 'advance' | 'real';
}

/** A controllable clock; see {@link TestClockOptions}. */
export function testClock(opts: TestClockOptions = {}): TestClock {
  const mode = opts.sleep ?? 'instant';
  const origin = Date.now();
  const c: TestClock = {
    t: opts.start ?? 1_000_000,
    sleeps: [],
    now: () => (mode === 'real' ? c.t + (Date.now() - origin) : c.t),
    advance: (ms: number) => {
      c.t += ms;
    },
    sleep: (ms: number, signal?: AbortSignal) => {
      c.sleeps.push(ms);
      if (signal?.aborted) return Promise.reject(signal.reason);
      if (mode === 'advance' && ms > 0) c.t += ms;
      return mode === 'real' ? systemClock.sleep(ms, signal) : Promise.resolve();
    },
  };
  return c;
}

/** Virtual time frozen at `start`: `sleep` records the wait and resolves at once. */
export const frozenClock = (start = 1_000_000): TestClock => testClock({ start });
