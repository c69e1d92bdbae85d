import { createHash } from 'node:crypto';
import type { Clock } from '../clock.js';

/**
 * Rate-limit information served with a response (IETF draft `RateLimit-*` headers), parsed by
 * {@link parseRateLimitHeaders}. Every field is optional: servers serve any subset.
 */
export interface RateLimitInfo {
  /** `RateLimit-Limit`: requests allowed per window. */
  limit?: number;
  /** `RateLimit-Remaining`: requests left in the current window, after this one. */
  remaining?: number;
  /** `RateLimit-Reset`: ms until the quota frees (served in seconds; fractions accepted). */
  resetMs?: number;
  /** The window, ms: `w=` of `RateLimit-Policy` (or of a `RateLimit-Limit` such as `20, 20;w=1`). */
  windowMs?: number;
}

/** Options of {@link RateLimiter}. */
export interface AdaptiveOptions {
  /** Learn a cap from 429s and `RateLimit-*` headers. @defaultValue true */
  adaptive?: boolean;
  /** The learned cap never goes below this, requests/s. @defaultValue 1 */
  minRps?: number;
  /** After a 429, the cap becomes this share of the rate achieved in the last second. @defaultValue 0.9 */
  backoffFactor?: number;
  /** Share of the server's advertised rate (`Limit / window`) we aim for. @defaultValue 0.95 */
  headroom?: number;
  /**
   * Without a 429 for this long, a cap learned from 429s (not from headers) grows by 5 %, so a
   * cap lowered by a spurious or transient 429 recovers. ms. @defaultValue 10000
   */
  recoverAfterMs?: number;
  /**
   * Slow start: until the server has shown a limit (a 429, or `RateLimit-*` headers), bound the
   * requests in flight, starting at one and widening by one per {@link SLOW_START_STEP} responses
   * that were not 429, and doubling per second without a 429 (see {@link RateLimiter.enter}).
   * A limit found during slow start is therefore overrun by few requests, however fast the server
   * answers. @defaultValue the value of `adaptive`
   */
  slowStart?: boolean;
}

/**
 * Slow start widens the window of requests in flight by one per this many responses without a 429:
 * a limit first met after n requests is overrun by at most 1 + n / 25 requests in flight.
 */
export const SLOW_START_STEP = 25;
/**
 * A cap learned from 429s recovers to this share of the rate that drew the 429 (then probes more
 * slowly); the first 429 of slow start sets the cap there at once.
 */
export const RECOVERY_SHARE = 0.975;
/**
 * The window guard's margin, ms: under a cap learned from 429s, at most ⌈cap⌉ requests leave in any
 * window of 1000 ms + this margin, measured on the actual send times. A timer that fires late then
 * delays the requests after it instead of squeezing more than the server's count into its 1 s
 * window; the margin covers how much the arrival times at the server may differ from the send times.
 */
export const WINDOW_MARGIN_MS = 25;
/** The most send times the window guard keeps: a learned cap above this many requests/s is paced by its grid alone. */
export const GUARD_MAX_SENDS = 1024;
/** A slow-start window this wide ends slow start: callers' concurrency is far below it. */
export const SLOW_START_MAX_WINDOW = 64;

/**
 * What an {@link ApiClient} asks of its limiter, in this order for each attempt: {@link enter} (room
 * in the slow-start window), {@link acquire} (the request's slot), then, once the status is known,
 * {@link observe} (and {@link onRateLimited} for a 429) and {@link leave}. Two implementations:
 * {@link RateLimiter} (one process) and `FleetRateLimiter` (src/api/fleet-rate-limit.ts: the
 * daemons of a fleet share caps, pauses and what they learned through Redis).
 */
export interface RequestLimiter {
  /** The cap in force, requests/s: the lowest of the configured and learned caps; 0 = none. */
  readonly currentRps: number;
  /** Requests let through by {@link acquire} so far; pass the value read right after acquiring to {@link observe} / {@link onRateLimited}. */
  readonly sentCount: number;
  /**
   * Waits for room in the slow-start window. Call {@link leave} exactly once afterwards.
   * @throws the signal's reason when `signal` aborts while waiting (nothing to leave then)
   */
  enter(signal?: AbortSignal): Promise<void>;
  /** A request let in by {@link enter} is answered (or failed). */
  leave(): void;
  /**
   * Waits until this request may be sent. Resolves with the ms waited.
   * @throws the signal's reason when `signal` aborts while waiting
   */
  acquire(signal?: AbortSignal): Promise<number>;
  /** Holds every request until `untilMs` (epoch ms of the limiter's clock), e.g. after a 429 with `Retry-After`. */
  pauseUntil(untilMs: number): void;
  /** A response answered 429 (see {@link RateLimiter.onRateLimited}). @param sentSeq - {@link sentCount} read right after the request was let through */
  onRateLimited(sentSeq?: number): void;
  /** Records a response's status and its `RateLimit-*` headers (see {@link RateLimiter.observe}). */
  observe(status: number, info?: RateLimitInfo, sentSeq?: number): void;
}

/** Hands out one {@link RequestLimiter} per base URL and API key (see {@link limiterKey}). */
export interface LimiterPool {
  /** The limiter of `baseUrl` + `apiKey`, made on first use and kept for the pool's life. @throws TypeError when `baseUrl` is not an absolute URL */
  limiterFor(baseUrl: string, apiKey: string): RequestLimiter;
}

/**
 * A request-rate limiter shared by every request of one {@link ApiClient}, or of every client that
 * talks to one base URL with one key (taken from a {@link RateLimiterPool}).
 *
 * - **Configured cap** (`--max-rps`, 0 = none): requests are spaced evenly, `1000 / rps` ms apart,
 *   in the order they ask; there is no burst. It is an upper bound: nothing learned raises it.
 * - **Pauses**: a server-imposed wait (a 429 with `Retry-After`) holds every request, not just the one
 *   that got it ({@link pauseUntil}).
 * - **Learned cap** (adaptive, on by default): on a 429 ({@link onRateLimited}) the cap drops to 90 %
 *   of the rate actually achieved (non-429 responses) in the last second, never below 1 request/s;
 *   when the server serves `RateLimit-Limit` with a window (`RateLimit-Policy: 20;w=1`), the cap is
 *   95 % of `Limit / window`. The spacing used is that of the lower of the two caps.
 * - **Window guard**: under a cap learned from 429s, at most ⌈cap⌉ requests leave in any window of
 *   1000 + {@link WINDOW_MARGIN_MS} ms of actual send times, so a timer that fires late (a busy event
 *   loop) delays the requests after it rather than putting one too many in the server's second.
 * - **Header pacing**: a response's `RateLimit-Remaining` (minus the requests sent since it was sent)
 *   is spread over its `RateLimit-Reset`; none remaining holds every request until the reset.
 * - **Slow start** (adaptive): until the server shows a limit (a 429 or `RateLimit-*` headers), one
 *   request in flight, widening by one per 25 answered and doubling per second without a 429
 *   ({@link enter} / {@link leave}). A server without headers that answers 429 above 20 requests/s
 *   thus refuses one request, not a whole burst in flight; an unlimited fast server reaches 8 in
 *   flight after 175 responses.
 *
 * Time comes from the injected {@link Clock} (design habit 8).
 */
export class RateLimiter implements RequestLimiter {
  protected nextSlot = 0;
  protected pausedUntil = 0;
  protected readonly configuredRps: number;
  protected readonly opts: Required<AdaptiveOptions>;
  /** Cap learned from 429s, requests/s; undefined until the first 429. */
  protected learned429?: number;
  /** When the 429-learned cap was last lowered or raised (epoch ms). */
  private learned429At = 0;
  /** The rate achieved when the last 429 came (requests in the second before it): what the server bore. */
  private ceiling429 = 0;
  /** Requests sent before the last lowering are answered at the old rate: their 429s don't lower again. */
  private lowerSeq = -1;
  /** Cap learned from `RateLimit-Limit` and the window, requests/s. */
  protected learnedHeader?: number;
  /** Largest `RateLimit-Reset` seen, ms: the window when no policy names it. */
  private maxResetMs = 0;
  /** Spacing from `Remaining` spread over `Reset`, and until when it applies. */
  protected headerIntervalMs = 0;
  protected headerIntervalUntil = 0;
  /** Requests let through so far (sequence numbers for {@link sentSince}). */
  protected sent = 0;
  /** Arrival times (epoch ms) of non-429 responses in about the last second. */
  protected readonly successes: number[] = [];
  /** Send times (epoch ms) of the requests let through in the last 1000 + {@link WINDOW_MARGIN_MS} ms, oldest first. */
  protected readonly sends: number[] = [];
  /** Slow start: true until the server shows a limit (a 429 with a rate, or rate-limit headers). */
  private slowStarting: boolean;
  /**
   * Where slow start's quiet time counts from, epoch ms: the first {@link enter}; moved on by the
   * length of every pause, and to the time of a 429 (or the end of its pause): a 429 starts the
   * doubling over.
   */
  private slowStartAt: number | undefined;
  /** Responses other than 429 seen during slow start. */
  private slowStartOk = 0;
  /** Requests between {@link enter} and {@link leave}. */
  private inFlight = 0;
  /**
   * Requests waiting in {@link enter} for room in the slow-start window, oldest first. Waking one
   * hands it its slot ({@link inFlight} is counted for it), so a newcomer cannot take it first.
   */
  private readonly gate: Array<() => void> = [];
  /** Wakes the gate when the window next doubles by time (a plain timer: not a wait the limiter asks for). */
  private gateTimer: NodeJS.Timeout | undefined;

  /**
   * @param rps - configured cap, requests per second; 0 means no configured cap (learned caps and
   *   pauses still apply)
   * @param clock - time source (injected for tests)
   */
  constructor(
    rps: number,
    protected readonly clock: Clock,
    opts: AdaptiveOptions = {},
  ) {
    this.configuredRps = rps > 0 ? rps : 0;
    const adaptive = opts.adaptive ?? true;
    this.opts = {
      adaptive,
      slowStart: opts.slowStart ?? adaptive,
      minRps: opts.minRps ?? 1,
      backoffFactor: opts.backoffFactor ?? 0.9,
      headroom: opts.headroom ?? 0.95,
      recoverAfterMs: opts.recoverAfterMs ?? 10_000,
    };
    this.slowStarting = this.opts.slowStart;
  }

  /**
   * Requests allowed in flight now: during slow start `max(1 + ⌊ok / SLOW_START_STEP⌋, 2^⌊s⌋)`
   * where `ok` counts responses other than 429 and `s` the quiet seconds (see
   * {@link slowStartAt}); unbounded after it, and once that reaches {@link SLOW_START_MAX_WINDOW}.
   */
  get window(): number {
    if (!this.slowStarting) return Infinity;
    const bySuccesses = 1 + Math.floor(this.slowStartOk / SLOW_START_STEP);
    const window = Math.max(bySuccesses, 2 ** Math.min(this.quietSeconds(), 30));
    return window >= SLOW_START_MAX_WINDOW ? Infinity : window;
  }

  /** True until the server has shown a limit, or the window grew to {@link SLOW_START_MAX_WINDOW}. */
  get inSlowStart(): boolean {
    return this.window !== Infinity;
  }

  private quietSeconds(): number {
    if (this.slowStartAt === undefined) return 0;
    return Math.max(0, Math.floor((this.clock.now() - this.slowStartAt) / 1000));
  }

  /**
   * Waits for room in the slow-start window (at once after slow start); call {@link leave} exactly
   * once when the response's status is known or the request failed. Then {@link acquire} spaces it.
   * Waiters are let in oldest first, as requests leave or as the window widens with time.
   *
   * @throws the signal's reason when `signal` aborts while waiting (nothing to {@link leave} then)
   */
  async enter(signal?: AbortSignal): Promise<void> {
    this.slowStartAt ??= this.clock.now();
    signal?.throwIfAborted();
    if (this.gate.length === 0 && this.inFlight < this.window) {
      this.inFlight++;
      return;
    }
    await new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        const i = this.gate.indexOf(wake);
        if (i >= 0) this.gate.splice(i, 1);
        if (this.gate.length === 0) this.clearGateTimer();
        reject(signal!.reason);
      };
      const wake = (): void => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      this.gate.push(wake);
      signal?.addEventListener('abort', onAbort, { once: true });
      this.armGateTimer();
    });
  }

  /** A request let in by {@link enter} is answered (or failed): room for the next one. */
  leave(): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    this.wakeGate();
  }

  /** Lets in as many waiters as the window has room for, oldest first, counting each one's slot. */
  private wakeGate(): void {
    const window = this.window;
    // Wide enough not to matter: slow start is over for good (a later pause does not restart it).
    if (window === Infinity) this.slowStarting = false;
    while (this.gate.length > 0 && this.inFlight < window) {
      this.inFlight++;
      this.gate.shift()!();
    }
    if (this.gate.length === 0) this.clearGateTimer();
  }

  private clearGateTimer(): void {
    if (!this.gateTimer) return;
    clearTimeout(this.gateTimer);
    this.gateTimer = undefined;
  }

  /**
   * While requests wait, wakes the gate when the window next doubles by time, so a first request
   * that takes long to answer does not hold every other one for its whole timeout.
   */
  private armGateTimer(): void {
    if (this.gateTimer || this.gate.length === 0 || this.window === Infinity || this.slowStartAt === undefined) return;
    const wait = this.slowStartAt + (this.quietSeconds() + 1) * 1000 - this.clock.now();
    this.gateTimer = setTimeout(() => {
      this.gateTimer = undefined;
      this.wakeGate();
      this.armGateTimer();
    }, Math.max(1, wait));
    this.gateTimer.unref();
  }

  /** A limit is shown: the gate opens for good. */
  protected endSlowStart(): void {
    if (!this.slowStarting) return;
    this.slowStarting = false;
    this.wakeGate();
  }

  /** A 429 during slow start: the time-doubling starts over, from the end of any pause in force. */
  protected restartQuietTime(now: number): void {
    if (this.inSlowStart) this.slowStartAt = Math.max(now, this.pausedUntil);
  }

  /** The cap in force, requests/s: the lowest of the configured and learned caps; 0 = none. */
  get currentRps(): number {
    this.recover();
    const caps = [this.configuredRps, this.learned429 ?? 0, this.learnedHeader ?? 0].filter((c) => c > 0);
    return caps.length === 0 ? 0 : Math.min(...caps);
  }

  /** Requests let through by {@link acquire} so far; pass the value read right after acquiring to {@link observe}. */
  get sentCount(): number {
    return this.sent;
  }

  /**
   * Waits until this request may be sent: its slot on the evenly spaced grid of the cap in force,
   * after any pause, and within the window guard ({@link WINDOW_MARGIN_MS}). Resolves with the ms
   * waited; rejects with the signal's reason if `signal` aborts.
   */
  async acquire(signal?: AbortSignal): Promise<number> {
    let waited = 0;
    let slot: number | undefined;
    // A sleep until `at` means it is at least `at` (a timer may fire a little early on the clock).
    let awake = 0;
    for (;;) {
      const now = Math.max(this.clock.now(), awake);
      // A pause that arrived while we waited (another request's 429): queue again behind it.
      if (slot === undefined || this.pausedUntil > slot) {
        const rps = this.currentRps;
        let interval = rps > 0 ? 1000 / rps : 0;
        if (now < this.headerIntervalUntil) interval = Math.max(interval, this.headerIntervalMs);
        slot = Math.max(now, this.nextSlot, this.pausedUntil);
        this.nextSlot = slot + interval;
      }
      // Checked again on waking: requests ahead of this one may have left later than their slots.
      const at = Math.max(slot, this.guardedUntil());
      if (at <= now) break;
      waited += at - now;
      await this.clock.sleep(at - now, signal);
      awake = at;
    }
    this.sent++;
    this.recordSend(Math.max(this.clock.now(), awake));
    return waited;
  }

  /**
   * The window guard: under a cap learned from 429s, the time before which one more send would put
   * more than ⌈cap⌉ actual sends in a window of 1000 + {@link WINDOW_MARGIN_MS} ms; 0 otherwise.
   */
  private guardedUntil(): number {
    if (this.learned429 === undefined) return 0;
    const n = Math.ceil(this.learned429);
    return this.sends.length < n ? 0 : this.sends[this.sends.length - n]! + 1000 + WINDOW_MARGIN_MS;
  }

  /** Records a send; keeps the sends of the guard's window, at most {@link GUARD_MAX_SENDS} (a cap above that is not guarded). */
  protected recordSend(now: number): void {
    this.sends.push(now);
    while (this.sends.length > 0 && (this.sends[0]! <= now - 1000 - WINDOW_MARGIN_MS || this.sends.length > GUARD_MAX_SENDS)) this.sends.shift();
  }

  /** Holds every request until `untilMs` (epoch ms), e.g. after a 429 with `Retry-After`. */
  pauseUntil(untilMs: number): void {
    // During slow start, paused time is not quiet time: the doubling clock is moved on by it.
    const added = untilMs - Math.max(this.clock.now(), this.pausedUntil);
    if (added > 0 && this.inSlowStart && this.slowStartAt !== undefined) this.slowStartAt += added;
    this.pausedUntil = Math.max(this.pausedUntil, untilMs);
  }

  /**
   * A response answered 429: lowers the learned cap to {@link AdaptiveOptions.backoffFactor} of the
   * rate achieved (non-429 responses) in the last second ({@link RECOVERY_SHARE} of it for the
   * first 429 of slow start, which then ends), never below `minRps`, unless the request was sent
   * before the previous lowering (a burst already in flight says nothing new). Fewer than 2
   * successes in the last second is no evidence of a rate: only the pause applies then (and slow
   * start goes on).
   *
   * @param sentSeq - {@link sentCount} read right after the request was let through
   */
  onRateLimited(sentSeq: number = this.sent): void {
    if (!this.opts.adaptive) return this.endSlowStart();
    const now = this.clock.now();
    const discovering = this.inSlowStart && this.learned429 === undefined;
    this.restartQuietTime(now);
    this.prune(now);
    const achieved = this.successes.length;
    if (sentSeq <= this.lowerSeq || achieved < 2) return;
    // Slow start ramps up with few requests in flight, so the rate at its first 429 is the limit
    // itself, not an overshoot: aim at the share the recovery climbs back to.
    const share = discovering ? RECOVERY_SHARE : this.opts.backoffFactor;
    const target = Math.max(this.opts.minRps, achieved * share);
    if (this.learned429 === undefined || target < this.learned429) this.learned429 = target;
    this.learned429At = now;
    this.ceiling429 = achieved;
    this.lowerSeq = this.sent;
    this.endSlowStart();
  }

  /**
   * Records a response: a non-429 counts towards the achieved rate; served `RateLimit-*` headers set
   * the header cap and the pacing of `Remaining` over `Reset`.
   *
   * @param status - HTTP status of the response
   * @param info - parsed `RateLimit-*` headers ({@link parseRateLimitHeaders})
   * @param sentSeq - {@link sentCount} read right after the request was let through
   */
  observe(status: number, info: RateLimitInfo = {}, sentSeq: number = this.sent): void {
    const now = this.clock.now();
    if (status !== 429) {
      this.successes.push(now);
      this.prune(now);
      if (this.slowStarting) this.slowStartOk++;
    }
    // Served rate-limit headers show the limit: they pace from here, not the slow-start window.
    if (info.limit !== undefined || info.remaining !== undefined) this.endSlowStart();
    if (!this.opts.adaptive) return;
    if (info.resetMs !== undefined) this.maxResetMs = Math.max(this.maxResetMs, info.resetMs);
    if (info.limit !== undefined && info.limit > 0) {
      const windowMs = info.windowMs ?? Math.max(1000, this.maxResetMs);
      this.learnedHeader = Math.max(this.opts.minRps, ((info.limit * 1000) / windowMs) * this.opts.headroom);
    }
    if (info.remaining !== undefined && info.resetMs !== undefined) {
      // Requests sent after this one may not have been counted in its Remaining yet.
      const left = info.remaining - (this.sent - sentSeq);
      if (left <= 0) {
        this.pauseUntil(now + info.resetMs);
      } else {
        this.headerIntervalMs = info.resetMs / left;
        this.headerIntervalUntil = now + info.resetMs;
      }
    }
  }

  protected prune(now: number): void {
    while (this.successes.length > 0 && this.successes[0]! <= now - 1000) this.successes.shift();
  }

  /**
   * A cap learned from 429s grows by 5 % per quiet `recoverAfterMs`, up to {@link RECOVERY_SHARE} (97.5 %) of the rate that
   * drew the 429; beyond that (probing whether the server's limit rose) only per quiet 6 ×
   * `recoverAfterMs`.
   */
  protected recover(): void {
    if (this.learned429 === undefined) return;
    const now = this.clock.now();
    const quiet = now - this.learned429At;
    if (quiet < this.opts.recoverAfterMs) return;
    const next = this.learned429 * 1.05;
    if (next > RECOVERY_SHARE * this.ceiling429 && quiet < 6 * this.opts.recoverAfterMs) return;
    this.learned429 = next;
    this.learned429At = now;
    if (this.configuredRps > 0 && this.learned429 >= this.configuredRps) this.learned429 = undefined;
  }
}

/**
 * The pool key of a base URL and key: the URL's origin and path (no trailing slash) and the
 * SHA-256 of the key, in hex. The key itself is never kept.
 *
 * @throws TypeError when `baseUrl` is not an absolute URL
 */
export function limiterKey(baseUrl: string, apiKey: string): string {
  const url = new URL(baseUrl);
  return `${url.origin}${url.pathname.replace(/\/+$/, '')} key-sha256:${createHash('sha256').update(apiKey).digest('hex')}`;
}

/**
 * One {@link RateLimiter} per base URL and key: the clients of workspaces that share both share
 * one limiter (configured cap, pauses and learned cap), so a 429 for one workspace slows every
 * workspace of that key, and only them. Limiters are made on first use with the pool's settings
 * and kept for the pool's life.
 */
export class RateLimiterPool implements LimiterPool {
  private readonly limiters = new Map<string, RateLimiter>();

  /**
   * @param rps - configured cap of each limiter, requests per second; 0 = none
   * @param clock - time source of each limiter
   * @param opts - how each limiter adapts (see {@link RateLimiter})
   */
  constructor(
    private readonly rps: number,
    private readonly clock: Clock,
    private readonly opts: AdaptiveOptions = {},
  ) {}

  /** The limiter of `baseUrl` + `apiKey` (see {@link limiterKey}), made on first use. */
  limiterFor(baseUrl: string, apiKey: string): RateLimiter {
    const key = limiterKey(baseUrl, apiKey);
    let limiter = this.limiters.get(key);
    if (!limiter) {
      limiter = new RateLimiter(this.rps, this.clock, this.opts);
      this.limiters.set(key, limiter);
    }
    return limiter;
  }

  /** Limiters made so far (one per distinct base URL + key). */
  get size(): number {
    return this.limiters.size;
  }
}

const num = (v: string | undefined): number | undefined => {
  if (v === undefined) return undefined;
  const t = v.trim();
  if (!/^\d+(\.\d+)?$/.test(t)) return undefined;
  return Number(t);
};

/**
 * Parses the IETF draft rate-limit headers (`RateLimit-Limit`, `RateLimit-Remaining`,
 * `RateLimit-Reset` in seconds, `RateLimit-Policy: 20;w=1`); the older `X-RateLimit-*` names are
 * read too when the standard ones are absent. Malformed values are ignored.
 *
 * A reset above 10^9 is read as epoch seconds (as some `X-RateLimit-Reset` headers serve it).
 *
 * @param headers - response headers, names lower-case (as undici gives them)
 * @param nowMs - current epoch ms, for an epoch-seconds reset
 */
export function parseRateLimitHeaders(headers: Record<string, string | string[] | undefined>, nowMs: number = Date.now()): RateLimitInfo {
  const get = (name: string): string | undefined => {
    const v = headers[name] ?? headers[`x-${name}`];
    return Array.isArray(v) ? v[0] : v;
  };
  const info: RateLimitInfo = {};
  const limitRaw = get('ratelimit-limit');
  // `RateLimit-Limit: 20, 20;w=1` (draft 03+): the first number is the quota.
  const limit = num(limitRaw?.split(/[,;]/)[0]);
  if (limit !== undefined) info.limit = limit;
  const remaining = num(get('ratelimit-remaining'));
  if (remaining !== undefined) info.remaining = remaining;
  const reset = num(get('ratelimit-reset'));
  if (reset !== undefined) info.resetMs = reset > 1e9 ? Math.max(0, reset * 1000 - nowMs) : reset * 1000;
  const w = (get('ratelimit-policy') ?? limitRaw ?? '').match(/(?:^|;)\s*w\s*=\s*(\d+(?:\.\d+)?)/);
  if (w && Number(w[1]) > 0) info.windowMs = Number(w[1]) * 1000;
  return info;
}
