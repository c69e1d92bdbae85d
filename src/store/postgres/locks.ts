/**
 * Advisory lock keys of the PostgreSQL engine, derived from names so every process of a fleet
 * computes the same key for the same thing: SHA-256 of the name, its first 8 bytes as a signed
 * 64-bit key (`pg_advisory_lock(bigint)`), or as two signed 32-bit keys
 * (`pg_advisory_lock(int4, int4)`; PostgreSQL keeps the two key spaces apart, so a pair never
 * meets a single key). Names hold the schema, so two mirrors in one database never share a lock.
 * A collision of two names (odds 2^-64) only makes one wait for the other; it never breaks anything.
 */
import { createHash } from 'node:crypto';

/** The first 8 bytes of SHA-256 of `name` (UTF-8). */
function digest8(name: string): Buffer {
  return createHash('sha256').update(name, 'utf8').digest().subarray(0, 8);
}

/** A signed 64-bit advisory key for `name`, as decimal text (bind it as `$1::bigint`). */
export function advisoryKey64(name: string): string {
  return digest8(name).readBigInt64BE(0).toString();
}

/** Two signed 32-bit advisory keys for `name`, for `pg_advisory_lock(int4, int4)`. */
export function advisoryKeyPair(name: string): [number, number] {
  const d = digest8(name);
  return [d.readInt32BE(0), d.readInt32BE(4)];
}

/** Key of the migration lock of the mirror in `schema` (transaction-scoped, 64-bit). */
export const migrateLockKey = (schema: string): string => advisoryKey64(`convo-mirror:migrate:${schema}`);

/**
 * Key of the lock one writer holds while it crawls a conversation (session-scoped, int4 pair). The
 * parts are joined with NUL, which no schema name holds, so `a` + `b:c` never meets `a:b` + `c`.
 */
export const conversationLockKey = (schema: string, accountId: string, conversationId: string): [number, number] =>
  advisoryKeyPair(`convo-mirror:conversation\0${schema}\0${accountId}\0${conversationId}`);

/** Key of the lock one writer holds while it lists a workspace (session-scoped, int4 pair). */
export const listingLockKey = (schema: string, accountId: string): [number, number] => advisoryKeyPair(`convo-mirror:listing\0${schema}\0${accountId}`);
