/**
 * The daemon's view of a Redis connection that BullMQ holds (the queue's, the worker's): whether it
 * is connected now, read without sending anything, and why not. `/readyz`, the webhook route, the
 * metrics and the dashboard ask the queue's connection, the one the webhook path sends its job on,
 * so none of them says "ready" while a delivery would be refused. Also the shutdown's way to end a
 * connection that waits to reconnect (see {@link endParked}).
 */
import type { RedisClient } from 'bullmq';

/** What this module uses of a BullMQ Redis client (ioredis underneath; `status` is ioredis' state). */
export type LinkClient = Pick<RedisClient, 'status' | 'connect' | 'disconnect' | 'on'>;

/** Options of {@link RedisLink}. */
export interface RedisLinkOptions {
  /** Called once when a connection that was ready is lost (not at shutdown), with its last error. */
  onLost?: (reason: string) => void;
  /** Called once when it is ready again, with how long it was away, ms. */
  onBack?: (awayMs: number) => void;
  /** Clock of `onBack`'s duration, epoch ms. @defaultValue Date.now */
  now?: () => number;
}

/**
 * The state of one Redis connection of BullMQ's: `ready` (commands go out now), or why not (its
 * ioredis state and the last connection error, e.g. `reconnecting: connect ECONNREFUSED
 * 127.0.0.1:6379`).
 */
export class RedisLink {
  private client: LinkClient | undefined;
  private lastError: string | undefined;
  private lostAt: number | undefined;
  private readonly now: () => number;
  /** Resolves once BullMQ has made the connection (never rejects). */
  readonly connected: Promise<void>;

  /**
   * @param client - BullMQ's client promise (`queue.getBackend().client`): it resolves once the
   *   connection was first made
   * @param where - the server, for messages: `host:port` (never a password)
   */
  constructor(
    client: Promise<LinkClient>,
    readonly where: string,
    private readonly o: RedisLinkOptions = {},
  ) {
    this.now = o.now ?? Date.now;
    this.connected = client.then(
      (c) => this.watch(c),
      (err: unknown) => void (this.lastError = err instanceof Error ? err.message : String(err)),
    );
  }

  /** Undefined while the connection is ready; else why commands cannot go out now. */
  problem(): string | undefined {
    const status = this.client?.status ?? 'connecting';
    if (status === 'ready') return undefined;
    return `Redis at ${this.where} is not connected (${status}${this.lastError ? `: ${this.lastError}` : ''})`;
  }

  /** @throws Error naming the server and its state (never a password) unless the connection is ready */
  assertConnected(): void {
    const problem = this.problem();
    if (problem !== undefined) throw new Error(problem);
  }

  /**
   * A PING on this very connection (`/readyz`): a connection that is ready but whose Redis does not
   * answer fails by the caller's timeout.
   *
   * @throws Error naming the server when the connection is not ready or the answer is not PONG
   */
  async ping(): Promise<void> {
    this.assertConnected();
    const answer = await (this.client as LinkClient & { ping(): Promise<string> }).ping();
    if (answer !== 'PONG') throw new Error(`Redis at ${this.where} answered PING with ${JSON.stringify(answer)}`);
  }

  /** The client, once connected (for the shutdown). */
  get raw(): LinkClient | undefined {
    return this.client;
  }

  private watch(c: LinkClient): void {
    this.client = c;
    c.on('error', (err: Error) => {
      this.lastError = err.message;
    });
    c.on('reconnecting', () => {
      if (this.lostAt !== undefined) return;
      this.lostAt = this.now();
      this.o.onLost?.(this.lastError ?? 'the connection closed');
    });
    c.on('ready', () => {
      this.lastError = undefined;
      if (this.lostAt === undefined) return;
      const away = this.now() - this.lostAt;
      this.lostAt = undefined;
      this.o.onBack?.(away);
    });
  }
}

/**
 * Ends, at once, every client that waits out its reconnect delay (`reconnecting`), failing its
 * queued commands (`Connection is closed.`). ioredis' `disconnect()` alone on such a client cancels
 * the reconnection but never ends it: no `end` event, and its queued commands never settle. BullMQ's
 * close waits for both (BullMQ issue #4656: a daemon sent SIGTERM a second after Redis came back
 * never exited). A connection attempt begun and cancelled in the same tick ends the client before
 * any socket is opened, and `disconnect()` also cancels the pending reconnection.
 */
export function endParked(clients: readonly (LinkClient | undefined)[]): void {
  for (const c of clients) {
    if (c?.status !== 'reconnecting') continue;
    c.connect().catch(() => undefined);
    c.disconnect();
  }
}
