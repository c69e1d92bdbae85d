/**
 * The owner lock of a writer (issue 25: a fleet of daemons on one mirror). Every writable
 * `PostgresMirror` is an instance with a random 64-bit id and holds, for its whole life, a session
 * advisory lock whose key comes from the schema and that id (`ownerLockKey`), on a dedicated client
 * of its lock pool. Its runs carry the id (`runs.owner`); a process that starts up and sweeps the
 * runs left `running` marks only those whose owner's lock no session holds: PostgreSQL itself
 * releases a session's advisory locks when the session ends (the process died, was killed, or
 * lost its connection), so a lock not held is a process gone. Nothing of our own beyond that.
 *
 * If the lock's session is lost while the process lives (the server restarted, the backend was
 * terminated, the network dropped), the lock is taken again on a new client, with the same key (the
 * id does not change), as soon as the server answers and no session holds it any more. **Between
 * the loss and the retake, another process sweeping runs judges this one's runs dead and marks
 * them `interrupted`**; the next `resumeRun` of such a run takes it up again (`resumed`).
 */
import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import type { Clock } from '../../clock.js';
import { StoreError } from '../../errors.js';
import { checkout } from './connect.js';
import { ownerLockKey } from './locks.js';

/** Waits before the n-th retry of a lost owner lock (n = 1, 2, ...), ms: 100, 200, 400 ... up to {@link OWNER_RETRY_MAX_MS}. */
export const OWNER_RETRY_FIRST_MS = 100;
/** The longest wait between two tries to take a lost owner lock again, ms. */
export const OWNER_RETRY_MAX_MS = 5000;

/** What happened to a writer's owner lock, as {@link OwnerLockOptions.onEvent} hears it. */
export type OwnerLockEvent =
  /** The session holding it was lost (`error`: why); the lock is being taken again. */
  | { event: 'lost'; error: OwnerLockError }
  /** A try to take it again failed (`error`: why; `attempt` from 1); another follows after `retryInMs`. */
  | { event: 'retry-failed'; error: OwnerLockError; attempt: number; retryInMs: number }
  /** It is held again, on a new session, after `attempts` tries. */
  | { event: 'retaken'; attempts: number };

/**
 * The owner lock of a writer was lost, or could not be taken again yet (code `OWNER_LOCK_LOST`,
 * retryable: the lock is being taken again). Until it is, other processes may judge this
 * process's runs dead. `cause` is the connection's error, if any.
 */
export class OwnerLockError extends StoreError {
  constructor(message: string, context: Record<string, unknown>, cause?: unknown) {
    super(message, context, cause, 'OWNER_LOCK_LOST');
    (this as { retryable: boolean }).retryable = true;
  }
}

/** Options of {@link OwnerLock.take}. */
export interface OwnerLockOptions {
  /** Time source of the waits between tries to take a lost lock again. */
  clock: Clock;
  /** Told of a loss, each failed retry and the retake (see {@link OwnerLockEvent}). @defaultValue ignore them */
  onEvent?: (event: OwnerLockEvent) => void;
  /** Where the errors shown name: the mirror's masked location. */
  location: string;
  /** Test failpoint: awaited before each try to take a lost lock again (`attempt` from 1); never set in production. */
  beforeRetake?: (attempt: number) => Promise<void> | void;
}

/** A random signed 64-bit integer as decimal text (a `bigint` as PostgreSQL prints it). */
export function randomInstanceId(): string {
  return randomBytes(8).readBigInt64BE(0).toString();
}

/** Ids tried at most when taking a first owner lock (a taken key means a 2^-64 collision). */
const TAKE_TRIES = 3;

/** A writer's owner lock: see the module comment. */
export class OwnerLock {
  /** The instance id: a signed 64-bit integer as decimal text. */
  readonly id: string;
  /** The lock's 64-bit key, decimal text (see `ownerLockKey`). */
  readonly key: string;

  private readonly pool: pg.Pool;
  private readonly opts: OwnerLockOptions;
  /** The client whose session holds the lock; undefined while it is lost. */
  private holder: pg.PoolClient | undefined;
  /** Removes the holder's listeners. */
  private unwatch: () => void = () => {};
  /** The retake under way, if any. */
  private retaking: Promise<void> | undefined;
  private closed = false;
  /** Aborts a retry's wait on {@link close}. */
  private readonly abort = new AbortController();

  private constructor(pool: pg.Pool, id: string, key: string, client: pg.PoolClient, opts: OwnerLockOptions) {
    this.pool = pool;
    this.id = id;
    this.key = key;
    this.opts = opts;
    this.hold(client);
  }

  /**
   * Takes an owner lock for a new instance of the mirror in `schema`: a random id, and
   * `pg_try_advisory_lock` of its key on a client checked out of `pool` (kept until
   * {@link close}). A key already held (odds 2^-64) is given up for another id.
   *
   * @throws the driver's error when no client can be checked out or the query fails (the caller
   *   translates it); {@link StoreError} when {@link TAKE_TRIES} ids were all held
   */
  static async take(pool: pg.Pool, schema: string, opts: OwnerLockOptions): Promise<OwnerLock> {
    for (let i = 0; i < TAKE_TRIES; i++) {
      const id = randomInstanceId();
      const key = ownerLockKey(schema, id);
      const client = await checkout(pool);
      let ok: boolean;
      try {
        ok = (await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1::bigint) AS ok', [key])).rows[0]!.ok;
      } catch (err) {
        client.release(err instanceof Error ? err : true);
        throw err;
      }
      if (ok) return new OwnerLock(pool, id, key, client, opts);
      client.release();
    }
    throw new StoreError(`the mirror ${opts.location}: ${TAKE_TRIES} random instance ids had their owner locks held already`, { target: opts.location });
  }

  /** Whether the lock is held now (false between a loss and its retake, and after {@link close}). */
  get held(): boolean {
    return this.holder !== undefined;
  }

  /** Makes `client` the holder, watching its connection: on its loss, the lock is taken again. */
  private hold(client: pg.PoolClient): void {
    this.holder = client;
    const lost = (err?: Error) => {
      if (this.holder !== client) return;
      this.holder = undefined;
      this.unwatch();
      // Destroyed, not pooled again.
      client.release(err ?? true);
      if (this.closed) return;
      const error = new OwnerLockError(
        `the mirror ${this.opts.location}: the session holding this writer's owner lock was lost (${err?.message ?? 'connection ended'}); ` +
          'taking it again, until then other processes may judge its runs dead',
        { target: this.opts.location, instance: this.id },
        err,
      );
      this.opts.onEvent?.({ event: 'lost', error });
      this.retaking = this.retake();
    };
    const ended = () => lost(undefined);
    client.on('error', lost);
    client.on('end', ended);
    this.unwatch = () => {
      client.removeListener('error', lost);
      client.removeListener('end', ended);
    };
  }

  /**
   * Takes the lock again until it holds it or {@link close} is called: a new client, then
   * `pg_try_advisory_lock` of the same key (false while the lost session's backend still lives,
   * e.g. the server has not yet noticed a dropped connection: that session still holds it, so no
   * process judges this one dead meanwhile). Waits {@link OWNER_RETRY_FIRST_MS}, doubling up to
   * {@link OWNER_RETRY_MAX_MS}, between tries.
   */
  private async retake(): Promise<void> {
    for (let attempt = 1; !this.closed; attempt++) {
      let client: pg.PoolClient | undefined;
      let reason: unknown;
      try {
        await this.opts.beforeRetake?.(attempt);
        if (this.closed) return;
        client = await checkout(this.pool);
        const ok = (await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1::bigint) AS ok', [this.key])).rows[0]!.ok;
        if (ok && !this.closed) {
          this.hold(client);
          this.opts.onEvent?.({ event: 'retaken', attempts: attempt });
          return;
        }
        if (ok) await client.query('SELECT pg_advisory_unlock($1::bigint)', [this.key]);
        client.release();
        client = undefined;
        if (this.closed) return;
        reason = new Error('another session still holds it (the lost one, until the server ends it)');
      } catch (err) {
        client?.release(err instanceof Error ? err : true);
        if (this.closed) return;
        reason = err;
      }
      const retryInMs = Math.min(OWNER_RETRY_MAX_MS, OWNER_RETRY_FIRST_MS * 2 ** (attempt - 1));
      const message = reason instanceof Error ? reason.message : String(reason);
      const error = new OwnerLockError(`the mirror ${this.opts.location}: cannot take this writer's owner lock again yet (${message})`, { target: this.opts.location, instance: this.id, attempt }, reason);
      this.opts.onEvent?.({ event: 'retry-failed', error, attempt, retryInMs });
      try {
        await this.opts.clock.sleep(retryInMs, this.abort.signal);
      } catch {
        return; // closed
      }
    }
  }

  /**
   * Stops a retake under way, then releases the lock (`pg_advisory_unlock`) and its client (a
   * client whose unlock failed is destroyed, which ends the session and the lock with it).
   * Idempotent.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.abort.abort();
    await this.retaking;
    const client = this.holder;
    this.holder = undefined;
    if (!client) return;
    this.unwatch();
    let broken: Error | undefined;
    try {
      await client.query('SELECT pg_advisory_unlock($1::bigint)', [this.key]);
    } catch (err) {
      broken = err instanceof Error ? err : new Error(String(err));
    }
    client.release(broken);
  }
}
