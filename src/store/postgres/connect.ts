/**
 * The PostgreSQL engine's connections: one node-postgres pool per mirror, and the translation of a
 * failure to reach or use the database into one line naming `CONVO_MIRROR_DB` and its masked URL
 * ({@link MirrorDatabaseError}). No password ever reaches a message: the URL is shown masked and
 * any message is scrubbed of the password before it is thrown.
 */
import pg from 'pg';
import { StoreError } from '../../errors.js';
import { DB_SETTING, type PostgresTarget } from '../../../config/db-url.js';

/** Pool size of a mirror's connection pool when none is given. */
export const DEFAULT_POOL_MAX = 10;
/** How long opening one connection may take before it counts as unreachable, ms. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5000;
/** `application_name` of every session (shows in `pg_stat_activity`). */
export const APPLICATION_NAME = 'convo-mirror';

/** What went wrong with the database, as {@link MirrorDatabaseError.code}. */
export type DatabaseErrorCode =
  /** No connection: refused, unknown host, no answer within the connect timeout, or lost. Retryable. */
  | 'DB_UNREACHABLE'
  /** The server refused the credentials (SQLSTATE 28P01, 28000). */
  | 'DB_AUTH'
  /** The database named by the URL does not exist (SQLSTATE 3D000). */
  | 'DB_MISSING'
  /** The role lacks a right it needs, e.g. CREATE on the database for the mirror's schema (SQLSTATE 42501). */
  | 'DB_PRIVILEGE';

/**
 * The mirror's PostgreSQL database cannot be used as configured. The message is one line,
 * `CONVO_MIRROR_DB (<masked URL>): <reason>`, and never holds the password. A `StoreError` (the CLI
 * exits 2); `DB_UNREACHABLE` is retryable (a job may succeed once the database is back), the
 * others are not.
 */
export class MirrorDatabaseError extends StoreError {
  declare readonly code: DatabaseErrorCode;
  constructor(code: DatabaseErrorCode, target: Pick<PostgresTarget, 'shown'>, reason: string, cause?: unknown) {
    super(`${DB_SETTING} (${target.shown}): ${reason}`, { setting: DB_SETTING, target: target.shown }, cause, code);
    if (code === 'DB_UNREACHABLE') (this as { retryable: boolean }).retryable = true;
  }
}

/** Options of {@link createPool}. */
export interface PoolOptions {
  /** Connections at most. @defaultValue {@link DEFAULT_POOL_MAX} */
  max?: number;
  /** Connect timeout of one connection, ms. @defaultValue {@link DEFAULT_CONNECT_TIMEOUT_MS} */
  connectTimeoutMs?: number;
  /**
   * Called with an error of an idle pooled connection (e.g. the server restarted); the pool drops
   * that connection and opens a new one when needed. @defaultValue ignore it
   */
  onIdleError?: (err: Error) => void;
}

/** int8 (`bigint`, `count(*)`) as a JavaScript number: seqs and counts stay far below 2^53. */
const INT8_OID = 20;
const parseInt8 = (v: string): number => Number(v);
/** The type parsers of the engine's pools: node-postgres's, with int8 read as a number. */
const TYPES = {
  getTypeParser(oid: number, format?: 'text' | 'binary') {
    if (oid === INT8_OID && (format ?? 'text') === 'text') return parseInt8;
    return pg.types.getTypeParser(oid, format);
  },
} as pg.CustomTypesConfig;

/**
 * A pool for `target`: at most `opts.max` connections, each with `application_name`
 * {@link APPLICATION_NAME}, a connect timeout, TCP keep-alive and no statement timeout; `bigint`
 * values come back as numbers. Opens no connection yet (see {@link checkConnection}).
 */
export function createPool(target: PostgresTarget, opts: PoolOptions = {}): pg.Pool {
  const pool = new pg.Pool({
    connectionString: target.url,
    max: opts.max ?? DEFAULT_POOL_MAX,
    connectionTimeoutMillis: opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
    application_name: APPLICATION_NAME,
    keepAlive: true,
    types: TYPES,
  });
  // An idle connection's error would otherwise be an unhandled 'error' event (a crash).
  pool.on('error', (err) => opts.onIdleError?.(err));
  return pool;
}

/** Clients that already have the listener of {@link checkout} (the pool reuses clients). */
const LISTENING = new WeakSet<pg.PoolClient>();

/**
 * Checks a client out of `pool` with an `'error'` listener: node-postgres emits `'error'` on a
 * checked-out client whose connection fails (the server restarted, the backend was terminated),
 * and with no listener that is an uncaught exception that ends the process. The failure reaches
 * the caller through the query that fails instead.
 */
export async function checkout(pool: Pick<pg.Pool, 'connect'>): Promise<pg.PoolClient> {
  const client = await pool.connect();
  if (!LISTENING.has(client)) {
    LISTENING.add(client);
    client.on('error', () => {});
  }
  return client;
}

/** Who and where a target connects to, as node-postgres reads the URL (with its PG* environment defaults). */
export interface TargetParts {
  user: string;
  host: string;
  port: number;
  database: string;
  password: string | undefined;
}

/** The connection parameters node-postgres takes from `target` (nothing is opened). */
export function targetParts(target: PostgresTarget): TargetParts {
  const c = new pg.Client({ connectionString: target.url });
  const password = typeof c.password === 'string' && c.password !== '' ? c.password : undefined;
  return { user: c.user ?? '', host: c.host, port: c.port, database: c.database ?? '', password };
}

/** Codes of Node's socket errors that mean the server cannot be reached. */
const UNREACHABLE = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET', 'EPIPE', 'ENOENT']);
/** SQLSTATEs after which the session is gone (server shut down or the backend was terminated). */
const SESSION_GONE = new Set(['57P01', '57P02', '57P03', '08000', '08003', '08006', '08001', '08004']);

/** The error's code, or the first code of an AggregateError's errors (a host with several addresses). */
function codeOf(err: unknown): string | undefined {
  const e = err as { code?: unknown; errors?: unknown[] } | null;
  if (typeof e?.code === 'string') return e.code;
  if (Array.isArray(e?.errors)) for (const inner of e.errors) if (typeof (inner as { code?: unknown })?.code === 'string') return (inner as { code: string }).code;
  return undefined;
}

/** `text` with every occurrence of `secret` (when it is one, 3 characters or more) replaced by `***`. */
function scrub(text: string, secret: string | undefined): string {
  return secret !== undefined && secret.length >= 3 ? text.split(secret).join('***') : text;
}

/** An identifier as PostgreSQL would quote it in a message. */
const q = (s: string): string => `"${s.replace(/"/g, '""')}"`;

/**
 * What the failure was doing: opening the first connection, creating the mirror's schema,
 * migrating it, or any later query.
 */
export type DatabaseStep = 'connect' | 'create-schema' | 'migrate' | 'query';

/**
 * The error to throw for `err`, raised while `step` on `target`: a {@link MirrorDatabaseError} for
 * a failure to reach or use the database (unreachable or lost connection, refused credentials,
 * missing database, missing privilege); anything else as it is. Messages never hold the password.
 *
 * @param schema - the mirror's schema, named by a `42501` on `'create-schema'`
 */
export function translateError(err: unknown, target: PostgresTarget, step: DatabaseStep, schema?: string): unknown {
  if (err instanceof MirrorDatabaseError || err instanceof StoreError) return err;
  const parts = targetParts(target);
  const code = codeOf(err);
  const message = err instanceof Error ? err.message : String(err);
  const fail = (c: DatabaseErrorCode, reason: string) => new MirrorDatabaseError(c, target, scrub(reason, parts.password), err);
  const where = parts.host.startsWith('/') ? `the socket in ${parts.host} (port ${parts.port})` : `${parts.host}:${parts.port}`;
  if (code === '28P01') return fail('DB_AUTH', `the server refused the password of user ${q(parts.user)} (SQLSTATE 28P01): check the user and password`);
  if (code === '28000') return fail('DB_AUTH', `the server refused user ${q(parts.user)} (SQLSTATE 28000: ${message})`);
  if (code === '3D000') return fail('DB_MISSING', `database ${q(parts.database)} does not exist (SQLSTATE 3D000): create it or fix the URL's database name`);
  if (code === '42501' && step === 'create-schema') {
    return fail(
      'DB_PRIVILEGE',
      `user ${q(parts.user)} may not create the mirror's schema ${q(schema ?? '?')} in database ${q(parts.database)} (SQLSTATE 42501): ` +
        `GRANT CREATE ON DATABASE ${q(parts.database)} TO ${q(parts.user)}, or create the schema with that user as its owner`,
    );
  }
  if (code === '42501') return fail('DB_PRIVILEGE', `user ${q(parts.user)} lacks a privilege the mirror needs (SQLSTATE 42501: ${message})`);
  if (code !== undefined && SESSION_GONE.has(code)) return fail('DB_UNREACHABLE', `the connection was lost (SQLSTATE ${code}: ${message})`);
  if (code === 'ECONNREFUSED') return fail('DB_UNREACHABLE', `cannot connect to ${where}: connection refused (is PostgreSQL running and listening there?)`);
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return fail('DB_UNREACHABLE', `cannot connect: host ${parts.host} not found (${code})`);
  if (code !== undefined && UNREACHABLE.has(code)) return fail('DB_UNREACHABLE', `cannot connect to ${where} (${code}: ${message})`);
  if (code === undefined && /timeout expired|timeout exceeded when trying to connect|connection timeout/i.test(message)) {
    return fail('DB_UNREACHABLE', `cannot connect to ${where}: no answer within the connect timeout`);
  }
  if (code === undefined && /Connection terminated|not queryable/i.test(message)) return fail('DB_UNREACHABLE', `the connection was lost (${message})`);
  if (step === 'connect' && code === undefined) return fail('DB_UNREACHABLE', `cannot connect to ${where}: ${message}`);
  return err;
}

/**
 * Opens one connection of `pool` and runs `SELECT 1`: the database answers and takes the
 * credentials.
 *
 * @throws {@link MirrorDatabaseError} (see {@link translateError}, step `'connect'`)
 */
export async function checkConnection(pool: pg.Pool, target: PostgresTarget): Promise<void> {
  try {
    await pool.query('SELECT 1');
  } catch (err) {
    throw translateError(err, target, 'connect');
  }
}
