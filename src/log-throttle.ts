/**
 * A log throttle for events an outsider can cause at will (a refused webhook, a failed login): at
 * most one line per window per reason, and a count of the lines left out, so a flood of requests
 * cannot flood the log (2,000 unsigned POSTs wrote 2,000 lines in 3.2 s) while the log still says
 * how many there were.
 *
 * Per reason, the first event opens a window of {@link LogThrottleOptions.windowMs} and is logged;
 * the events of that reason until the window ends are suppressed and counted. When a window with
 * suppressed events ends, its count is reported once: by a summary line
 * ({@link LogThrottleOptions.onSuppressed}) when the window closes, or carried by the next logged
 * event of that reason if that comes first; {@link LogThrottle.flush} reports every pending count
 * at once (on shutdown). Time is an input (design habit 8).
 */

/** Default of {@link LogThrottleOptions.windowMs}: 10 s. */
export const DEFAULT_LOG_WINDOW_MS = 10_000;

/** Options of {@link LogThrottle}. */
export interface LogThrottleOptions {
  /** Length of a window, ms: at most one line per reason in it. @defaultValue 10000 */
  windowMs?: number;
  /** The clock, epoch ms. @defaultValue Date.now */
  now?: () => number;
  /**
   * Runs `fn` after about `ms` ms; returns a function cancelling it. The timer must not keep the
   * process alive. @defaultValue an unref'd `setTimeout`
   */
  setTimer?: (fn: () => void, ms: number) => () => void;
  /**
   * Writes the summary line of a window of `reason` that ended with `suppressed` (>= 1) events left
   * out and no later event to carry the count.
   */
  onSuppressed: (reason: string, suppressed: number) => void;
}

/** What {@link LogThrottle.admit} answers for an event to log. */
export interface Admitted {
  /**
   * Events of the same reason suppressed before this one and not yet reported (0 when none): put
   * it in the line (as `suppressed`) when above 0.
   */
  suppressed: number;
}

/** One reason's current window. */
interface Window {
  /** First instant (epoch ms) after the window. */
  endsAt: number;
  /** Events suppressed in it. */
  suppressed: number;
  /** Cancels the summary timer, armed at the first suppressed event. */
  cancel?: () => void;
}

const unrefTimer = (fn: () => void, ms: number): (() => void) => {
  const t = setTimeout(fn, ms);
  t.unref();
  return () => clearTimeout(t);
};

/**
 * The throttle; see the module comment. Reasons are the callers' fixed classes (`bad_signature`,
 * `replay`...), never text from a request, so the state is bounded by their number.
 */
export class LogThrottle<R extends string = string> {
  private readonly windows = new Map<R, Window>();
  private readonly windowMs: number;
  private readonly now: () => number;
  private readonly setTimer: (fn: () => void, ms: number) => () => void;

  constructor(private readonly o: LogThrottleOptions) {
    this.windowMs = o.windowMs ?? DEFAULT_LOG_WINDOW_MS;
    this.now = o.now ?? Date.now;
    this.setTimer = o.setTimer ?? unrefTimer;
  }

  /**
   * Counts an event of `reason`.
   *
   * @returns undefined when its line is to be suppressed (counted); else {@link Admitted}: log it,
   *   with the count of the previous window when that was not yet reported
   */
  admit(reason: R): Admitted | undefined {
    const now = this.now();
    const w = this.windows.get(reason);
    if (w !== undefined && now < w.endsAt) {
      if (++w.suppressed === 1) this.arm(reason, w);
      return undefined;
    }
    w?.cancel?.();
    this.windows.set(reason, { endsAt: now + this.windowMs, suppressed: 0 });
    return { suppressed: w?.suppressed ?? 0 };
  }

  /** Reports every pending count now ({@link LogThrottleOptions.onSuppressed}) and forgets every window. */
  flush(): void {
    const pending = [...this.windows];
    this.windows.clear();
    for (const [reason, w] of pending) {
      w.cancel?.();
      if (w.suppressed > 0) this.o.onSuppressed(reason, w.suppressed);
    }
  }

  /** Reasons with an open window (bounded by the callers' classes). */
  get size(): number {
    return this.windows.size;
  }

  /**
   * Arms the summary of `w` for when it ends. A timer that fires before the clock says the window
   * ended (an injected clock, a clock stepped back) re-arms for the rest.
   */
  private arm(reason: R, w: Window): void {
    w.cancel = this.setTimer(() => {
      if (this.windows.get(reason) !== w) return;
      const left = w.endsAt - this.now();
      if (left > 0) return this.arm(reason, w);
      this.windows.delete(reason);
      this.o.onSuppressed(reason, w.suppressed);
    }, Math.max(1, w.endsAt - this.now()));
  }
}
