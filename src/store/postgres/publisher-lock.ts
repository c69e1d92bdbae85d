/**
 * One publisher at a time per PostgreSQL mirror (issue 25, item 4): a session-level advisory lock
 * on the mirror's schema, held by a dedicated client for as long as the publisher publishes.
 *
 * What it guarantees: while a session holds the lock no other session gets it; the lock goes with
 * the session (the holder releases it, its connection closes, or the server ends the backend, e.g.
 * `pg_terminate_backend` or a crash), and then the next `tryPublisherLock` can take it.
 *
 * What it does not guarantee: that the holder knows when it lost the lock. `lost` turns true only
 * when the client sees its connection fail (an error or the end of the socket); a process that
 * stalls (a GC pause, a frozen VM, a partitioned network) can run on for a while after the server
 * ended its session and another publisher took the lock. That is why the ledger head moves only by
 * compare-and-set (`ExportLedger.record`, `LedgerFencedError`): a stale publisher that wakes up
 * records nothing. The lock keeps publishers from working at once; the compare-and-set keeps a late
 * one from doing harm.
 */
import { createHash } from 'node:crypto';
import type pg from 'pg';

/** A held publisher lock; see the module comment. */
export interface PublisherLock {
  /**
   * True once the lock's connection failed or ended (the lock is gone with the session): stop
   * publishing. False does not prove the lock is still held (see the module comment; {@link held}
   * asks the server).
   */
  readonly lost: boolean;
  /** Settles (never rejects) when {@link lost} turns true. */
  readonly whenLost: Promise<void>;
  /** The backend pid of the session holding the lock (for logs and `status`). */
  readonly pid: number;
  /** The advisory lock key (a signed 64-bit integer, decimal): see {@link publisherLockKey}. */
  readonly key: string;
  /**
   * Asks the server whether this session still holds the lock (one round trip on the lock's
   * client); false, and {@link lost} true, when the connection has failed.
   */
  held(): Promise<boolean>;
  /**
   * Releases the lock (`pg_advisory_unlock`) and gives the client back to the pool; a client whose
   * connection failed, or whose unlock failed, is destroyed instead (closing the session releases
   * the lock). Idempotent; never throws.
   */
  release(): Promise<void>;
}

/**
 * The advisory lock key of the publisher of the mirror in `schema`: the first 8 bytes of
 * SHA-256(`convo-mirror:publisher:<schema>`) as a signed 64-bit integer, in decimal (the
 * `pg_advisory_lock(bigint)` key space; other convo-mirror locks hash other prefixes).
 */
export function publisherLockKey(schema: string): string {
  return createHash('sha256').update(`convo-mirror:publisher:${schema}`).digest().readBigInt64BE(0).toString();
}

/**
 * Tries to take the publisher lock of the mirror in `schema`: checks a client out of `pool` and
 * runs `pg_try_advisory_lock` (no waiting). The client stays checked out (one connection of the
 * pool) until {@link PublisherLock.release}.
 *
 * @returns the lock, or undefined when another session holds it (the client goes back to the pool)
 * @throws what `pool.connect()` or the query throws (the client is destroyed)
 */
export async function tryPublisherLock(pool: Pick<pg.Pool, 'connect'>, schema: string): Promise<PublisherLock | undefined> {
  const key = publisherLockKey(schema);
  const client = await pool.connect();
  let lost = false;
  let settle!: () => void;
  const whenLost = new Promise<void>((resolve) => (settle = resolve));
  const onLoss = () => {
    lost = true;
    settle();
  };
  // A checked-out client with no 'error' listener would crash the process when its backend ends.
  client.on('error', onLoss);
  client.on('end', onLoss);
  const detach = () => {
    client.off('error', onLoss);
    client.off('end', onLoss);
  };
  let r: pg.QueryResult<{ ok: boolean; pid: number }>;
  try {
    r = await client.query<{ ok: boolean; pid: number }>({ text: `SELECT pg_try_advisory_lock($1::bigint) AS ok, pg_backend_pid() AS pid`, values: [key] });
  } catch (err) {
    detach();
    client.on('error', () => {});
    client.release(err instanceof Error ? err : true);
    throw err;
  }
  const { ok, pid } = r.rows[0]!;
  if (!ok) {
    detach();
    client.release();
    return undefined;
  }
  // How pg_locks shows a bigint advisory key: classid = high 32 bits, objid = low 32 bits, objsubid = 1.
  const k = BigInt.asUintN(64, BigInt(key));
  const classid = Number(k >> 32n);
  const objid = Number(k & 0xffffffffn);
  let released = false;
  return {
    get lost() {
      return lost;
    },
    whenLost,
    pid,
    key,
    async held() {
      if (lost || released) return false;
      try {
        const h = await client.query<{ held: boolean }>({
          text: `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                                  AND classid = $1::oid AND objid = $2::oid AND objsubid = 1) AS held`,
          values: [classid, objid],
        });
        return h.rows[0]!.held;
      } catch {
        onLoss();
        return false;
      }
    },
    async release() {
      if (released) return;
      released = true;
      let destroy: Error | boolean = lost;
      if (!lost) {
        try {
          const u = await client.query<{ unlocked: boolean }>({ text: `SELECT pg_advisory_unlock($1::bigint) AS unlocked`, values: [key] });
          if (!u.rows[0]!.unlocked) destroy = true;
        } catch (err) {
          destroy = err instanceof Error ? err : true;
        }
      }
      detach();
      // A destroyed client may still report its socket's end: keep it from crashing the process.
      if (destroy) client.on('error', () => {});
      client.release(destroy || undefined);
    },
  };
}
