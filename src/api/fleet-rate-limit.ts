/**
 * Rate limits shared by a fleet of daemons through Redis (issue 25 item 5): every daemon of one
 * queue prefix that talks to one base URL with one API key shares, per base URL + key,
 * (a) the configured cap (`--max-rps`), (b) pauses (a 429's `Retry-After`, `RateLimit-Remaining: 0`)
 * and (c) the cap learned from 429s and from `RateLimit-*` headers, so N daemons on one key stay
 * under the rate one daemon would keep.
 *
 * How, in Redis (keys under `<queue prefix>:ratelimit:<h>:`, `h` = the first 32 hex digits of the
 * SHA-256 of {@link limiterKey}: the API key never appears in clear):
 * - **Slots** (`slot:<interval µs>:<n>`): the cap in force, `rps`, cuts time (Redis' clock) into a
 *   grid of slots `interval = 1e6 / rps` µs apart; a request sends only in a slot it won, and each
 *   slot is won once, fleet-wide: `rate-limiter-flexible`'s `RateLimiterRedis` with 1 point per
 *   slot key (its atomic increment-with-expiry Lua script), so there is no lock protocol of ours. A
 *   request sent more than {@link SLOT_LATE_MS} after its slot's time (a late timer, a busy event
 *   loop) gives the slot up and takes a later one. Hence, on actual send times, any window of
 *   `w` ms holds at most `⌈(w + SLOT_LATE_MS) / interval⌉` requests of the whole fleet: for a
 *   20 requests/s server, 20 in any second under the header-learned cap (95 % of 20: ⌈1.025 × 19⌉)
 *   as under a cap learned from a 429 (97.5 % of what drew it), as {@link RateLimiter}'s window
 *   guard gives one process.
 * - **Pause** (`pause`): the end of the longest pause in force (epoch ms, Redis' clock), with a
 *   matching expiry; written only when later than what is there (one small Lua max).
 * - **Header cap** (`header-cap`): the cap learned from `RateLimit-Limit` and the policy window,
 *   requests/s; refreshed each minute while served, expires after 10 min.
 * - **Learned cap** (`learned`): `{"rps","at","ceiling"}`, the cap learned from 429s (requests/s),
 *   when it was set (epoch ms, Redis' clock) and the fleet rate that drew it; every limiter derives
 *   the recovery from it ({@link recoveredCap}); last writer wins. Expires after an hour.
 * - **Successes** (`ok:<epoch second>`): the fleet's non-429 responses per second (expire after
 *   3 s), read on a 429 for the rate achieved.
 * - **Free sends** (`free:<epoch second>`, `free-last`): requests sent while no cap was in force
 *   (a fleet's first requests, before the first response shows a limit): how many per second, and
 *   when the last one left (expire after 3 s and 2 s). The first slots after them are skipped, one
 *   per such request (at most a second's worth), so they count against the cap too.
 *
 * Round trips per request: one (the slot and the state read together, pipelined; the state read
 * also tells which of the next {@link LOOKAHEAD_SLOTS} slots are taken), a second one when the
 * request waited for its slot (a pause set meanwhile), one more per slot found taken (the bench
 * measured 1.24 slot claims per request with 2 daemons, 1.33 with 3), plus an unawaited success
 * count. Without any cap in force, one state read per request.
 *
 * Times are mapped to Redis' clock (`TIME`, measured at first use and each minute), so daemons on
 * machines whose clocks differ still share one grid.
 *
 * When Redis cannot be used (not connected, a command fails or times out), each limiter paces
 * alone as {@link RateLimiter} does, at the caps it knew, until Redis answers again: N daemons
 * may then together exceed a cap by up to N times, and a 429 then teaches each daemon alone.
 */
import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { Clock } from '../clock.js';
import { RECOVERY_SHARE, RateLimiter, WINDOW_MARGIN_MS, limiterKey, type AdaptiveOptions, type LimiterPool, type RateLimitInfo } from './rate-limit.js';

/** A request that would leave more than this many ms after its slot's time gives the slot up (the fleet's window guard), ms. */
export const SLOT_LATE_MS = WINDOW_MARGIN_MS;
/** A slot key outlives its slot by this many seconds (then Redis drops it). */
const SLOT_TTL_EXTRA_S = 2;
/** The header cap is written again after this long while it is served, ms. */
export const HEADER_CAP_REFRESH_MS = 60_000;
/** The header cap's expiry, ms. */
export const HEADER_CAP_TTL_MS = 600_000;
/** The learned cap's expiry, ms (renewed by every 429 that lowers or confirms it). */
export const LEARNED_TTL_MS = 3_600_000;
/** A success or free-send counter's expiry, ms. */
const SUCCESS_TTL_MS = 3000;
/** The expiry of the time of the last request sent without a cap, ms. */
const FREE_LAST_TTL_MS = 2000;
/** How often the offset to Redis' clock is measured again, ms. */
export const CLOCK_SYNC_EVERY_MS = 60_000;
/** Slots tried for one request before it is let through by the local limiter instead. */
const MAX_CLAIM_TRIES = 256;
/**
 * Slots after the one claimed whose keys are read with the claim: when it was taken, the next try
 * is the first of them seen free, not the next one (daemons claim ahead of each other).
 */
const LOOKAHEAD_SLOTS = 16;
/** Send times kept, by sequence number, to tell which 429s answer requests sent before a lowering. */
const SEND_TIMES_KEPT = 1024;

/** Sets `KEYS[1]` to `ARGV[1]` (expiring in `ARGV[2]` ms) only when that is more than what it holds: the longest pause wins. */
const PAUSE_MAX_LUA = `local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`;

/** A cap learned from 429s, as the fleet shares it. */
export interface LearnedCap {
  /** The cap when it was set, requests/s. */
  rps: number;
  /** When it was set, epoch ms (Redis' clock): recovery counts from here, and 429s of requests sent before it do not lower it again. */
  at: number;
  /** The fleet's rate (successes in the second before the 429) that drew it, requests/s. */
  ceiling: number;
}

/**
 * The cap learned from 429s after recovery, as {@link RateLimiter} recovers it: +5 % per quiet
 * `recoverAfterMs` up to {@link RECOVERY_SHARE} of `ceiling`, then +5 % per quiet 6 × `recoverAfterMs`;
 * undefined once it reaches `configuredRps` (when one is configured: the configured cap rules again).
 * Pure: every daemon derives the same cap from the same record.
 *
 * @param nowMs - epoch ms on the record's clock
 */
export function recoveredCap(rec: LearnedCap, nowMs: number, recoverAfterMs: number, configuredRps: number): number | undefined {
  let rps = rec.rps;
  let at = rec.at;
  // An hour's record recovers in at most 360 steps; the bound only guards a nonsense record.
  for (let step = 0; step < 10_000; step++) {
    const quiet = nowMs - at;
    if (quiet < recoverAfterMs) break;
    const next = rps * 1.05;
    if (next > RECOVERY_SHARE * rec.ceiling) {
      if (quiet < 6 * recoverAfterMs) break;
      at += 6 * recoverAfterMs;
    } else {
      at += recoverAfterMs;
    }
    rps = next;
    if (configuredRps > 0 && rps >= configuredRps) return undefined;
  }
  return rps;
}

/**
 * The Redis key prefix of one base URL + key's shared limits: `<prefix>:ratelimit:<32 hex digits>`,
 * a hash of {@link limiterKey} (the API key is never written).
 *
 * @param prefix - the queue prefix (`CONVO_MIRROR_QUEUE_PREFIX`)
 * @throws TypeError when `baseUrl` is not an absolute URL
 */
export function fleetKeyBase(prefix: string, baseUrl: string, apiKey: string): string {
  const h = createHash('sha256').update(limiterKey(baseUrl, apiKey)).digest('hex').slice(0, 32);
  return `${prefix}:ratelimit:${h}`;
}

/** Redis could not be used for this step; the limiter paces alone. */
class FleetUnavailable extends Error {
  constructor(cause: unknown) {
    super(`rate limits cannot be shared through Redis: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}

/** Options of {@link FleetRateLimiterPool}. */
export interface FleetLimiterOptions extends AdaptiveOptions {
  /**
   * Called with the error when Redis cannot be used (each limiter then paces alone), once per
   * outage. A hook that throws is ignored. @defaultValue none
   */
  onUnavailable?: (err: Error) => void;
  /** Called when Redis answers again after {@link onUnavailable}. @defaultValue none */
  onRestored?: () => void;
  /**
   * Map times to Redis' clock (`TIME`), so daemons whose clocks differ share one grid. Off, the
   * limiters' clock is used as it is: for tests on a virtual clock, whose time Redis does not share.
   * @defaultValue true
   */
  redisClock?: boolean;
}

/** What the limiters of one pool share: the Redis connection, the offset to its clock, its health. */
class FleetLink {
  /** Redis' clock minus the local clock, ms. */
  private offsetMs = 0;
  private syncedAt = -Infinity;
  private syncing: Promise<void> | undefined;
  private down = false;

  constructor(
    readonly redis: Redis,
    readonly clock: Clock,
    private readonly opts: FleetLimiterOptions,
  ) {}

  /** Redis' time of a local time, epoch ms. */
  toFleet(localMs: number): number {
    return localMs + this.offsetMs;
  }

  /** The local time of a Redis time, epoch ms. */
  toLocal(fleetMs: number): number {
    return fleetMs - this.offsetMs;
  }

  /** @throws {@link FleetUnavailable} unless the connection is ready (commands are never queued for later). */
  assertReady(): void {
    if (this.redis.status !== 'ready') throw new FleetUnavailable(new Error(`the connection is ${this.redis.status}`));
  }

  /**
   * Measures the offset to Redis' clock (`TIME`, half the round trip) before the first use, and
   * again each {@link CLOCK_SYNC_EVERY_MS} without waiting for it.
   * @throws {@link FleetUnavailable} when the first measure fails
   */
  async ensureClock(): Promise<void> {
    if (this.opts.redisClock === false || this.clock.now() - this.syncedAt < CLOCK_SYNC_EVERY_MS) return;
    const first = this.syncedAt === -Infinity;
    this.syncing ??= this.syncClock().finally(() => (this.syncing = undefined));
    if (first) await this.syncing;
    else this.syncing.catch(() => undefined);
  }

  private async syncClock(): Promise<void> {
    const t0 = this.clock.now();
    const [s, us] = await this.call(() => this.redis.time());
    const t1 = this.clock.now();
    this.offsetMs = Number(s) * 1000 + Number(us) / 1000 - (t0 + t1) / 2;
    this.syncedAt = t1;
  }

  /** Runs a Redis command; a failure is reported once per outage and thrown as {@link FleetUnavailable}. */
  async call<T>(command: () => Promise<T>): Promise<T> {
    try {
      this.assertReady();
      const out = await command();
      this.restored();
      return out;
    } catch (err) {
      throw this.failed(err);
    }
  }

  /** A command nobody waits for (a count, a publication): a failure is only reported. */
  fireAndForget(command: () => Promise<unknown>): void {
    this.call(command).catch(() => undefined);
  }

  /** Reports the first failure of an outage; returns it as a {@link FleetUnavailable}. */
  failed(err: unknown): FleetUnavailable {
    const e = err instanceof FleetUnavailable ? err : new FleetUnavailable(err);
    if (!this.down) {
      this.down = true;
      try {
        this.opts.onUnavailable?.(e);
      } catch {
        /* an observer never fails a request */
      }
    }
    return e;
  }

  private restored(): void {
    if (!this.down) return;
    this.down = false;
    try {
      this.opts.onRestored?.();
    } catch {
      /* an observer never fails a request */
    }
  }
}

/** The fleet's shared state of one base URL + key, as read from Redis. */
interface FleetState {
  /** End of the pause in force, epoch ms (Redis' clock). */
  pause: number | undefined;
  /** Cap learned from headers, requests/s. */
  headerCap: number | undefined;
  learned: LearnedCap | undefined;
  /** Requests sent without a cap in force in this second and the one before. */
  freeSends: number;
  /** When the last of them was sent, epoch ms (Redis' clock); undefined when none in the last 2 s. */
  freeLast: number | undefined;
  /** Whether each slot key asked for exists (taken), in the order asked. */
  taken: boolean[];
}

const num = (v: string | null | undefined): number | undefined => {
  if (v === null || v === undefined) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
};

function parseLearned(v: string | null | undefined): LearnedCap | undefined {
  if (!v) return undefined;
  try {
    const o = JSON.parse(v) as Partial<LearnedCap>;
    if ([o.rps, o.at, o.ceiling].every((x) => typeof x === 'number' && Number.isFinite(x)) && o.rps! > 0) return { rps: o.rps!, at: o.at!, ceiling: o.ceiling! };
  } catch {
    /* not ours: ignored */
  }
  return undefined;
}

/**
 * A {@link RateLimiter} whose caps, pauses and learned caps are shared with every limiter of the same
 * base URL + key and queue prefix, in any process, through Redis (see the module doc for the keys
 * and the bound). Slow start and `RateLimit-Remaining` pacing stay per process; a cap known to the
 * fleet ends slow start.
 *
 * Made by a {@link FleetRateLimiterPool}; used by {@link ApiClient} through {@link RequestLimiter}.
 */
export class FleetRateLimiter extends RateLimiter {
  private readonly slots: RateLimiterRedis;
  private readonly keys: { base: string; pause: string; headerCap: string; learned: string; freeLast: string };
  /** The cap learned from headers as the fleet last showed it (or as this limiter wrote it), requests/s. */
  private fleetHeaderCap: number | undefined;
  /** When this limiter last wrote the header cap (local epoch ms). */
  private headerWrittenAt = -Infinity;
  /** The fleet's cap learned from 429s, as last read or written. */
  private fleet429: LearnedCap | undefined;
  /** The latest pause end this limiter wrote or read (local epoch ms): not written again. */
  private knownPause = 0;
  /** The grid this limiter last claimed on and the last slot it saw taken there (its own included). */
  private grid: { intervalUs: number; last: number } | undefined;
  /** Claims of this limiter run one at a time (each continues after the slot the previous one saw). */
  private claims: Promise<unknown> = Promise.resolve();
  /** 429s are learned from one at a time, each reading what the previous one wrote. */
  private learning: Promise<void> = Promise.resolve();
  /** Requests the fleet sent without a cap in this second and the one before, as last read. */
  private freeSends = 0;
  /** When the last of them left, epoch ms (Redis' clock), as last read. */
  private freeLast: number | undefined;
  /**
   * What the limiter did, for metrics and the bench: slots tried and found taken, slots won then
   * given up (`late`: its time had passed by more than {@link SLOT_LATE_MS}; `changed`: a pause, a
   * lower cap or requests sent without a cap showed up), requests sent without any cap, and
   * acquires paced alone because Redis could not be used.
   */
  readonly fleetStats = { claims: 0, taken: 0, late: 0, changed: 0, free: 0, alone: 0 };
  /** Send time (local epoch ms) of the last {@link SEND_TIMES_KEPT} requests, by sequence number. */
  private readonly sendTimes = new Map<number, number>();

  /**
   * @param link - the pool's connection to Redis and clock offset
   * @param keyBase - {@link fleetKeyBase} of this base URL + key
   * @param rps - configured cap, requests/s; 0 = none (learned caps and pauses still apply)
   */
  constructor(
    private readonly link: FleetLink,
    keyBase: string,
    rps: number,
    opts: AdaptiveOptions = {},
  ) {
    super(rps, link.clock, opts);
    this.keys = { base: keyBase, pause: `${keyBase}:pause`, headerCap: `${keyBase}:header-cap`, learned: `${keyBase}:learned`, freeLast: `${keyBase}:free-last` };
    this.slots = new RateLimiterRedis({
      storeClient: link.redis,
      keyPrefix: `${keyBase}:slot`,
      points: 1,
      duration: SLOT_TTL_EXTRA_S,
      rejectIfRedisNotReady: true,
    });
  }

  /** The cap in force, requests/s: the lowest of the configured cap, the fleet's learned caps (recovered) and this limiter's; 0 = none. */
  override get currentRps(): number {
    this.recover();
    const now = this.link.toFleet(this.clock.now());
    const fleet429 = this.fleet429 ? recoveredCap(this.fleet429, now, this.opts.recoverAfterMs, this.configuredRps) : undefined;
    const header = this.learnedHeader ?? this.fleetHeaderCap;
    const caps = [this.configuredRps, this.learned429 ?? 0, fleet429 ?? 0, header ?? 0].filter((c) => c > 0);
    return caps.length === 0 ? 0 : Math.min(...caps);
  }

  /**
   * Waits until this request may be sent: after every pause of the fleet, in a slot of the fleet's
   * grid it won (when a cap is in force), spaced by `RateLimit-Remaining` pacing. When Redis
   * cannot be used, as {@link RateLimiter.acquire}. Resolves with the ms waited.
   *
   * @throws the signal's reason when `signal` aborts while waiting
   */
  override async acquire(signal?: AbortSignal): Promise<number> {
    const start = this.clock.now();
    try {
      return await this.acquireShared(start, signal);
    } catch (err) {
      if (!(err instanceof FleetUnavailable)) throw err;
      this.fleetStats.alone++;
      const waited = Math.max(0, this.clock.now() - start);
      return waited + (await super.acquire(signal));
    }
  }

  private async acquireShared(start: number, signal?: AbortSignal): Promise<number> {
    await this.link.ensureClock();
    // A sleep until `at` means it is at least `at` (a timer may fire a little early on the clock).
    let awake = 0;
    for (;;) {
      signal?.throwIfAborted();
      const now = Math.max(this.clock.now(), awake);
      if (this.currentRps === 0) {
        // No cap known here: a fresh look at the fleet's pause and caps, then go (or wait).
        this.applyState(await this.readState());
        if (this.currentRps > 0) continue;
        const at = this.notBefore(now);
        if (at <= now) {
          this.fleetStats.free++;
          this.noteFreeSend(now);
          return this.countSend(start, now);
        }
        await this.clock.sleep(at - now, signal);
        awake = at;
        continue;
      }
      const rps = this.currentRps;
      const slot = await this.claim(this.notBefore(now));
      if (slot === undefined) {
        this.fleetStats.changed++;
        continue;
      }
      let t = Math.max(this.clock.now(), awake);
      if (slot > t) {
        await this.clock.sleep(slot - t, signal);
        awake = slot;
        // What the fleet learned while this request waited: a pause, a lower cap.
        this.applyState(await this.readState());
        t = Math.max(this.clock.now(), awake);
        if (this.pausedUntil > slot || this.currentRps < rps) {
          this.fleetStats.changed++;
          continue;
        }
      }
      // Too late for its slot (a busy event loop): sending now could crowd the next slots' second.
      if (t > slot + SLOT_LATE_MS) {
        this.fleetStats.late++;
        continue;
      }
      return this.countSend(start, t);
    }
  }

  /** Counts a send at `t` (local epoch ms); returns the ms waited since `start`. */
  private countSend(start: number, t: number): number {
    this.sent++;
    this.recordSend(t);
    this.sendTimes.set(this.sent, t);
    this.sendTimes.delete(this.sent - SEND_TIMES_KEPT);
    return Math.max(0, t - start);
  }

  /** The earliest this request may leave by what this limiter knows: pauses, and `Remaining` spread over `Reset`. */
  private notBefore(now: number): number {
    let at = Math.max(now, this.pausedUntil);
    const last = this.sends[this.sends.length - 1];
    if (now < this.headerIntervalUntil && last !== undefined) at = Math.max(at, last + this.headerIntervalMs);
    return at;
  }

  /**
   * Wins the first free slot at or after `notBefore` on the grid of the cap in force (one at a time
   * per limiter). Resolves with its time (local epoch ms), or undefined when the state read with it
   * shows a pause past it or another cap (the slot is given up; claim again).
   *
   * @throws {@link FleetUnavailable}
   */
  private claim(notBefore: number): Promise<number | undefined> {
    const run = this.claims.then(() => this.claimNow(notBefore));
    this.claims = run.catch(() => undefined);
    return run;
  }

  private async claimNow(notBefore: number): Promise<number | undefined> {
    for (let tries = 0; tries < MAX_CLAIM_TRIES; tries++) {
      const rps = this.currentRps;
      if (rps === 0) return undefined;
      const intervalUs = Math.ceil(1e6 / rps);
      const from = Math.max(this.link.toFleet(Math.max(notBefore, this.clock.now())), this.freeNotBefore(intervalUs / 1000));
      let index = Math.ceil((from * 1000) / intervalUs);
      if (this.grid?.intervalUs === intervalUs) index = Math.max(index, this.grid.last + 1);
      const slotAt = (index * intervalUs) / 1000;
      // The slot's key outlives the slot (never expiring before it: it would be won twice).
      const ttlS = Math.max(0, Math.ceil((slotAt - this.link.toFleet(this.clock.now())) / 1000)) + SLOT_TTL_EXTRA_S;
      this.fleetStats.claims++;
      const ahead = Array.from({ length: LOOKAHEAD_SLOTS }, (_, j) => this.slots.getKey(`${intervalUs}:${index + 1 + j}`));
      const [state, won] = await Promise.all([this.readState(ahead), this.takeSlot(`${intervalUs}:${index}`, ttlS)]);
      this.grid = { intervalUs, last: index };
      this.applyState(state);
      if (!won) {
        this.fleetStats.taken++;
        // Try next the first slot seen free after it (others claim ahead too).
        const free = state.taken.indexOf(false);
        this.grid.last = index + (free < 0 ? LOOKAHEAD_SLOTS : free);
        continue;
      }
      const slot = this.link.toLocal(slotAt);
      // What was read with the slot rules it out: a pause past it, another cap, requests sent without a cap it must leave room for.
      if (this.pausedUntil > slot || this.currentRps !== rps || slotAt < this.freeNotBefore(intervalUs / 1000)) return undefined;
      return slot;
    }
    throw this.link.failed(new Error(`no free slot after ${MAX_CLAIM_TRIES} tries`));
  }

  /** True when this limiter won the slot `key`; false when it was taken. @throws {@link FleetUnavailable} */
  private takeSlot(key: string, ttlS: number): Promise<boolean> {
    // The library rejects with a RateLimiterRes when the slot's point is spent, with an Error when Redis fails.
    return this.link.call(() =>
      this.slots.consume(key, 1, { customDuration: ttlS }).then(
        () => true,
        (err: unknown) => {
          if (err instanceof RateLimiterRes) return false;
          throw err;
        },
      ),
    );
  }

  /**
   * The fleet's pause, caps and recent sends without a cap, and whether the slot keys `slotKeys`
   * (full names) are taken: one MGET. @throws {@link FleetUnavailable}
   */
  private async readState(slotKeys: string[] = []): Promise<FleetState> {
    const second = Math.floor(this.link.toFleet(this.clock.now()) / 1000);
    const k = this.keys;
    const [pause, headerCap, learned, free, freePrev, freeLast, ...slots] = await this.link.call(() =>
      this.link.redis.mget(k.pause, k.headerCap, k.learned, `${k.base}:free:${second}`, `${k.base}:free:${second - 1}`, k.freeLast, ...slotKeys),
    );
    return {
      pause: num(pause),
      headerCap: num(headerCap),
      learned: parseLearned(learned),
      freeSends: (num(free) ?? 0) + (num(freePrev) ?? 0),
      freeLast: num(freeLast),
      taken: slots.map((v) => v !== null),
    };
  }

  /**
   * The earliest slot time (Redis' clock) on a grid of `intervalMs` that leaves room for the
   * requests sent without a cap just before: one slot skipped per such request, at most
   * `⌈(1000 + SLOT_LATE_MS) / interval⌉` (past those, the grid starts a whole window after them).
   */
  private freeNotBefore(intervalMs: number): number {
    if (this.freeLast === undefined || this.freeSends === 0) return 0;
    const skip = Math.min(this.freeSends, Math.ceil((1000 + SLOT_LATE_MS) / intervalMs));
    return this.freeLast + skip * intervalMs;
  }

  /** A request leaves while no cap is in force: counted, so the first slots of a cap learned later leave room for it. */
  private noteFreeSend(now: number): void {
    const t = this.link.toFleet(now);
    const key = `${this.keys.base}:free:${Math.floor(t / 1000)}`;
    this.link.fireAndForget(() => this.link.redis.multi().incr(key).pexpire(key, SUCCESS_TTL_MS).set(this.keys.freeLast, String(Math.ceil(t)), 'PX', FREE_LAST_TTL_MS).exec());
  }

  /** Takes in what the fleet shows: a later pause, its caps; a cap known to the fleet ends slow start. */
  private applyState(s: FleetState): void {
    if (s.pause !== undefined) {
      const until = this.link.toLocal(s.pause);
      if (until > this.knownPause) this.knownPause = until;
      if (until > this.pausedUntil) super.pauseUntil(until);
    }
    this.fleetHeaderCap = s.headerCap;
    this.fleet429 = s.learned;
    this.freeSends = s.freeSends;
    this.freeLast = s.freeLast;
    if (s.headerCap !== undefined || s.learned !== undefined) this.endSlowStart();
  }

  /** Holds every request of the fleet on this base URL + key until `untilMs` (local epoch ms). */
  override pauseUntil(untilMs: number): void {
    super.pauseUntil(untilMs);
    const now = this.clock.now();
    if (untilMs <= this.knownPause || untilMs <= now) return;
    this.knownPause = untilMs;
    const until = String(Math.ceil(this.link.toFleet(untilMs)));
    const ttl = String(Math.ceil(untilMs - now));
    this.link.fireAndForget(() => this.link.redis.eval(PAUSE_MAX_LUA, 1, this.keys.pause, until, ttl));
  }

  /**
   * Records a response as {@link RateLimiter.observe} does; counts a non-429 in the fleet's
   * successes and shares a cap learned from headers.
   */
  override observe(status: number, info: RateLimitInfo = {}, sentSeq: number = this.sent): void {
    super.observe(status, info, sentSeq);
    const now = this.clock.now();
    if (status !== 429) {
      const key = `${this.keys.base}:ok:${Math.floor(this.link.toFleet(now) / 1000)}`;
      this.link.fireAndForget(() => this.link.redis.multi().incr(key).pexpire(key, SUCCESS_TTL_MS).exec());
    }
    const cap = this.learnedHeader;
    if (cap !== undefined && (cap !== this.fleetHeaderCap || now - this.headerWrittenAt >= HEADER_CAP_REFRESH_MS)) {
      this.fleetHeaderCap = cap;
      this.headerWrittenAt = now;
      this.link.fireAndForget(() => this.link.redis.set(this.keys.headerCap, String(cap), 'PX', HEADER_CAP_TTL_MS));
    }
  }

  /**
   * A response answered 429: as {@link RateLimiter.onRateLimited}, but on the fleet's figures: the
   * cap becomes {@link AdaptiveOptions.backoffFactor} (97.5 % for slow start's first 429) of the
   * fleet's successes in the second before it, unless the request was sent before the fleet's last
   * lowering; shared with every daemon. Learned in the background (one round trip); the 429's
   * pause is already in force. When Redis cannot be used, learned from this process's own rate.
   */
  override onRateLimited(sentSeq: number = this.sent): void {
    if (!this.opts.adaptive) return this.endSlowStart();
    const now = this.clock.now();
    const discovering = this.inSlowStart && this.fleet429 === undefined && this.learned429 === undefined;
    this.restartQuietTime(now);
    const sentAt = this.sendTimes.get(sentSeq);
    // Never rejects (a failure to learn leaves the caps as they were), so the next 429 is learned from too.
    this.learning = this.learning.then(() => this.learnFrom429(now, sentAt, discovering, sentSeq)).catch(() => undefined);
  }

  /** Resolves once every 429 seen so far has been learned from (tests, and a clean shutdown). */
  settled(): Promise<void> {
    return this.learning;
  }

  private async learnFrom429(now: number, sentAt: number | undefined, discovering: boolean, sentSeq: number): Promise<void> {
    try {
      const fleetNow = this.link.toFleet(now);
      const second = Math.floor(fleetNow / 1000);
      const [cur, prev, learned] = await this.link.call(() => this.link.redis.mget(`${this.keys.base}:ok:${second}`, `${this.keys.base}:ok:${second - 1}`, this.keys.learned));
      // Successes in the last 1000 ms, the previous second's counted pro rata.
      const achieved = (num(cur) ?? 0) + (num(prev) ?? 0) * (1 - (fleetNow - second * 1000) / 1000);
      const last = parseLearned(learned);
      this.fleet429 = last;
      // Sent before the last lowering: a burst already in flight says nothing new.
      if (last && sentAt !== undefined && this.link.toFleet(sentAt) <= last.at) return;
      if (achieved < 2) return;
      const share = discovering ? RECOVERY_SHARE : this.opts.backoffFactor;
      const target = Math.max(this.opts.minRps, achieved * share);
      const current = last ? recoveredCap(last, fleetNow, this.opts.recoverAfterMs, this.configuredRps) : undefined;
      const rec: LearnedCap = { rps: current === undefined ? target : Math.min(current, target), at: this.link.toFleet(this.clock.now()), ceiling: achieved };
      this.fleet429 = rec;
      this.endSlowStart();
      await this.link.call(() => this.link.redis.set(this.keys.learned, JSON.stringify(rec), 'PX', LEARNED_TTL_MS));
    } catch (err) {
      if (!(err instanceof FleetUnavailable)) throw err;
      // Alone, as one process learns.
      if (this.fleet429 === undefined) super.onRateLimited(sentSeq);
    }
  }
}

/**
 * One {@link FleetRateLimiter} per base URL and key, over one Redis connection: the clients of every
 * daemon with the same queue prefix share, per base URL + key, the configured cap, pauses and
 * learned caps. The connection is the caller's (opened with a command timeout and without an
 * offline queue, so a Redis that is away is seen at once); the pool never closes it.
 */
export class FleetRateLimiterPool implements LimiterPool {
  private readonly limiters = new Map<string, FleetRateLimiter>();
  private readonly link: FleetLink;

  /**
   * @param redis - an ioredis connection to the fleet's Redis
   * @param prefix - the queue prefix (`CONVO_MIRROR_QUEUE_PREFIX`): the keys live under `<prefix>:ratelimit:`
   * @param rps - configured cap of each base URL + key, requests/s, fleet-wide; 0 = none
   * @param clock - time source (injected for tests)
   * @param opts - how each limiter adapts (see {@link RateLimiter}), and outage hooks
   */
  constructor(
    redis: Redis,
    private readonly prefix: string,
    private readonly rps: number,
    clock: Clock,
    private readonly opts: FleetLimiterOptions = {},
  ) {
    this.link = new FleetLink(redis, clock, opts);
  }

  /** The limiter of `baseUrl` + `apiKey`, made on first use. @throws TypeError when `baseUrl` is not an absolute URL */
  limiterFor(baseUrl: string, apiKey: string): FleetRateLimiter {
    const key = limiterKey(baseUrl, apiKey);
    let limiter = this.limiters.get(key);
    if (!limiter) {
      const { onUnavailable: _u, onRestored: _r, redisClock: _c, ...adaptive } = this.opts;
      limiter = new FleetRateLimiter(this.link, fleetKeyBase(this.prefix, baseUrl, apiKey), this.rps, adaptive);
      this.limiters.set(key, limiter);
    }
    return limiter;
  }

  /** Limiters made so far (one per distinct base URL + key). */
  get size(): number {
    return this.limiters.size;
  }
}
