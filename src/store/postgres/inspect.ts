/**
 * What `convo-mirror check` reads of a PostgreSQL target without opening a mirror: the server
 * answers and takes the credentials, the state of the mirror's schema (missing, at which version),
 * and the rights the role has for what a writer (`sync`, `daemon`) will do there. One connection
 * of its own, only reads: nothing is created, locked or migrated.
 */
import pg from 'pg';
import { parsePostgresTarget, type PostgresTarget } from '../../../config/db-url.js';
import { APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT_MS, translateError } from './connect.js';
import { PG_SCHEMA_VERSION, readSchemaVersion, type SchemaState } from './migrations.js';

import { WRITER_TABLE_PRIVILEGES } from './rights.js';

export { WRITER_TABLE_PRIVILEGES };

/** The role's rights that matter to a writer of the mirror. */
export interface PostgresRights {
  /** CREATE on the database: may create the mirror's schema when it is missing. */
  createOnDatabase: boolean;
  /** USAGE on the schema; undefined when the schema does not exist. */
  usageOnSchema: boolean | undefined;
  /** CREATE on the schema (needed to migrate it); undefined when the schema does not exist. */
  createOnSchema: boolean | undefined;
  /** The schema's owner; undefined when it does not exist. */
  schemaOwner: string | undefined;
  /**
   * Tables of the schema on which the role lacks one of {@link WRITER_TABLE_PRIVILEGES}, sorted;
   * empty when it has them all (or the schema has no table).
   */
  tablesLacking: string[];
  /** The privileges of {@link WRITER_TABLE_PRIVILEGES} missing on one table of the schema or more. */
  privilegesLacking: string[];
  /** Tables in the schema. */
  tables: number;
}

/** What {@link inspectPostgres} found. */
export interface PostgresInspection {
  /** The target as outputs show it (password masked). */
  shown: string;
  schema: string;
  /** The role connected as (`current_user`). */
  user: string;
  database: string;
  /** The server's version, e.g. `16.4 (Debian 16.4-1)`. */
  serverVersion: string;
  /**
   * The mirror's schema: whether it exists, its version (0 when none), its tables other than
   * `schema_version`.
   */
  state: SchemaState;
  /**
   * Whether `state.version` was read: false when the schema exists but the role may not read its
   * `schema_version` (no USAGE on the schema, or no SELECT on the table); `state.version` is 0 then.
   */
  versionRead: boolean;
  /** The schema version this code writes. */
  currentVersion: number;
  rights: PostgresRights;
}

/** Options of {@link inspectPostgres}. */
export interface InspectOptions {
  /** Connect timeout, ms. @defaultValue 5000 */
  connectTimeoutMs?: number;
}

/**
 * Connects to `target` (one connection, closed before this returns) and reads what
 * {@link PostgresInspection} holds. Reads only the catalogs, and `schema_version` when the role
 * may read it.
 *
 * @throws {@link ConfigError} naming `CONVO_MIRROR_DB` for a malformed URL
 * @throws `MirrorDatabaseError` naming `CONVO_MIRROR_DB` with the masked URL, as an open would:
 *   `DB_UNREACHABLE`, `DB_AUTH`, `DB_MISSING`, `DB_PRIVILEGE`
 */
export async function inspectPostgres(target: string | PostgresTarget, opts: InspectOptions = {}): Promise<PostgresInspection> {
  const t = typeof target === 'string' ? parsePostgresTarget(target) : target;
  const client = new pg.Client({
    connectionString: t.url,
    application_name: APPLICATION_NAME,
    connectionTimeoutMillis: opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
  });
  client.on('error', () => {}); // a lost connection fails the query under way instead
  try {
    await client.connect();
  } catch (err) {
    await client.end().catch(() => {});
    throw translateError(err, t, 'connect');
  }
  try {
    const who = (
      await client.query<{ user: string; database: string; version: string; create_db: boolean }>(
        `SELECT current_user AS user, current_database() AS database, current_setting('server_version') AS version,
                has_database_privilege(current_database(), 'CREATE') AS create_db`,
      )
    ).rows[0]!;
    const ns = (
      await client.query<{ owner: string; usage: boolean; create: boolean }>(
        `SELECT pg_get_userbyid(nspowner) AS owner, has_schema_privilege(oid, 'USAGE') AS usage, has_schema_privilege(oid, 'CREATE') AS create
           FROM pg_namespace WHERE nspname = $1`,
        [t.schema],
      )
    ).rows[0];
    // Per table, each writer privilege the role has (p0, p1... in WRITER_TABLE_PRIVILEGES order).
    const tables = (
      await client.query<{ relname: string } & Record<string, boolean>>(
        `SELECT c.relname, ${WRITER_TABLE_PRIVILEGES.map((p, i) => `has_table_privilege(c.oid, '${p}') AS p${i}`).join(', ')}
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
          ORDER BY c.relname COLLATE "C"`,
        [t.schema],
      )
    ).rows.map((r) => ({ name: r.relname, has: WRITER_TABLE_PRIVILEGES.filter((_, i) => r[`p${i}`] === true) }));
    const lacking = tables.filter((r) => r.has.length < WRITER_TABLE_PRIVILEGES.length);
    const versionTable = tables.find((r) => r.name === 'schema_version');
    const versionRead = ns === undefined || (ns.usage && (versionTable === undefined || versionTable.has.includes('SELECT')));
    const state = versionRead ? await readSchemaVersion(client, t.schema) : await schemaWithoutVersion(client, t.schema);
    return {
      shown: t.shown,
      schema: t.schema,
      user: who.user,
      database: who.database,
      serverVersion: who.version,
      state,
      versionRead,
      currentVersion: PG_SCHEMA_VERSION,
      rights: {
        createOnDatabase: who.create_db,
        usageOnSchema: ns?.usage,
        createOnSchema: ns?.create,
        schemaOwner: ns?.owner,
        tablesLacking: lacking.map((r) => r.name),
        privilegesLacking: WRITER_TABLE_PRIVILEGES.filter((p) => lacking.some((r) => !r.has.includes(p))),
        tables: tables.length,
      },
    };
  } catch (err) {
    throw translateError(err, t, 'query');
  } finally {
    await client.end().catch(() => {});
  }
}

/** The schema's state from the catalogs alone: its version is not read (reported as 0). */
async function schemaWithoutVersion(q: pg.Client, schema: string): Promise<SchemaState> {
  const r = await q.query<{ schema_exists: boolean; tables: number }>(
    `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1) AS schema_exists,
            (SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_version')::int AS tables`,
    [schema],
  );
  return { schemaExists: r.rows[0]!.schema_exists, version: 0, tables: r.rows[0]!.tables };
}
