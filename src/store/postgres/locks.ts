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

/**
 * Key of the erasure gate of `accountId` in the mirror in `schema` (transaction-scoped, 64-bit):
 * every transaction writing the account's message or conversation records holds it shared, an
 * erasure exclusive (see src/store/postgres/erasures.ts).
 */
export const erasureGateKey = (schema: string, accountId: string): string => advisoryKey64(`convo-mirror:erasure\0${schema}\0${accountId}`);

/**
 * The name of the owner lock of the writer `instanceId` of the mirror in `schema` (see
 * {@link ownerLockKey}): `convo-mirror:owner`, the schema and the instance id as decimal text,
 * joined with NUL.
 */
function ownerLockName(schema: string, instanceId: string): string {
  return `convo-mirror:owner\0${schema}\0${instanceId}`;
}

/**
 * Key of the owner lock (session-scoped, 64-bit) that the writer `instanceId` (a signed 64-bit
 * integer as decimal text, as PostgreSQL prints a `bigint`) of the mirror in `schema` holds for
 * its whole life: a run whose `owner` is an instance nobody holds the lock of has lost its
 * process. {@link ownerLockKeySql} computes the same key on the server.
 */
export const ownerLockKey = (schema: string, instanceId: string): string => advisoryKey64(ownerLockName(schema, instanceId));

/**
 * The bytes {@link ownerLockKeySql} takes as its prefix parameter for `schema`: the owner lock's
 * name up to the instance id (it holds NUL, which a `text` value cannot, so it is bound as `bytea`).
 */
export const ownerLockPrefix = (schema: string): Buffer => Buffer.from(ownerLockName(schema, ''), 'utf8');

/**
 * SQL computing {@link ownerLockKey} on the server for the `bigint` expression `idExpr`: SHA-256 of
 * the prefix (the parameter `prefixParam`, bound to {@link ownerLockPrefix}) and the id's decimal
 * text, its first 8 bytes as a signed `bigint`, as {@link advisoryKey64} does in JavaScript.
 *
 * @param prefixParam - the placeholder of the prefix, e.g. `$2`
 */
export const ownerLockKeySql = (prefixParam: string, idExpr: string): string =>
  `('x' || encode(substr(sha256(${prefixParam}::bytea || convert_to((${idExpr})::text, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint`;

/**
 * SQL that is true when some session of the current database holds (is granted) the session or
 * transaction advisory lock with the 64-bit key `keyExpr` (a `bigint` expression). `pg_locks` shows
 * a 64-bit key as `classid` (its high 32 bits), `objid` (its low 32 bits) and `objsubid` 1 (2 is an
 * int4 pair); advisory locks belong to one database, so `database` must be this one.
 */
export const advisoryHeld64Sql = (keyExpr: string): string =>
  `EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
             AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
             AND l.classid::bigint = ((${keyExpr}) >> 32) & 4294967295
             AND l.objid::bigint = (${keyExpr}) & 4294967295)`;
