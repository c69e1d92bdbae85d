import type { Clock } from '../clock.js';

/**
 * A process-wide request-rate cap shared by every request of one {@link ApiClient} (spec 8 leaves
 * rate limits unspecified, so we cap ourselves: `--max-rps`).
 *
 * Requests are spaced evenly, `1000 / rps` ms apart, in the order they ask; there is no burst. A
 * server-imposed wait (a 429 with `Retry-After`) pauses every request, not just the one that got it.
 */
export class RateLimiter {
  private nextSlot = 0;
  private pausedUntil = 0;
  private readonly intervalMs: number;

  /**
   * @param rps - requests per second; 0 means no cap (only pauses apply)
   * @param clock - time source (injected for tests)
   */
  constructor(
    rps: number,
    private readonly clock: Clock,
  ) {
    this.intervalMs = rps > 0 ? 1000 / rps : 0;
  }

  /** Waits until this request may be sent; resolves with the ms waited; rejects if `signal` aborts. */
  async acquire(signal?: AbortSignal): Promise<number> {
    const now = this.clock.now();
    const slot = Math.max(now, this.nextSlot, this.pausedUntil);
    this.nextSlot = slot + this.intervalMs;
    const wait = slot - now;
    if (wait > 0) await this.clock.sleep(wait, signal);
    return wait;
  }

  /** Holds every request until `untilMs` (epoch ms), e.g. after a 429 with `Retry-After`. */
  pauseUntil(untilMs: number): void {
    this.pausedUntil = Math.max(this.pausedUntil, untilMs);
  }
}
