/**
 * The PostgreSQL schema of one mirror and its migrations. One PostgreSQL schema per mirror (the
 * `schema` of `CONVO_MIRROR_DB`); `schema_version` holds how many of {@link PG_MIGRATIONS} have run
 * (the twin of SQLite's `PRAGMA user_version`).
 *
 * The tables, columns and meanings are SQLite's latest schema (src/store/sqlite/migrations.ts,
 * version 9: version 1 here is SQLite's 8, version 2 SQLite's 9), with these differences, each for
 * a reason:
 *
 * - `raw` is `jsonb` (the served object, for SQL and BI tools: `raw->>'status'`), and `raw_text`
 *   keeps it byte for byte as served (`JSON.stringify` of the API's object): the engine compares,
 *   exports (a delete carries the last version) and verifies that text, since jsonb reorders keys
 *   and rewrites numbers. `raw` is NULL where jsonb cannot hold the text (a `\u0000` or a lone
 *   surrogate escape in a string), never otherwise (see `jsonbSafe` in conversations.ts).
 * - The message columns derived from `raw` (content, visibility, sender_*, attachments,
 *   created_at) are STORED generated columns (PostgreSQL 15 has no virtual ones); `attachments`
 *   is `jsonb` (NULL when not served).
 * - Seqs come from `change_seq`, a one-row counter each writing transaction moves at its end
 *   (see change-log.ts: seqs in commit order, no gap), not from a sequence.
 * - A crawl's page ids are a `text[]`, not a JSON array.
 * - Text keys are `COLLATE "C"`: ordered by code point as SQLite's BINARY orders them, so every
 *   `ORDER BY` (and so every export) comes out in the same order on both engines.
 * - Times stay ISO 8601 UTC text, as written by the engine (exports carry them byte for byte).
 *
 * Byte-exact JSON (change payloads, ledger entries, run records) is `text`, never `jsonb`; so a
 * reader that hands a record on as served (verify --deep's audit reads, a delete's payload) reads
 * `raw_text`, never `raw::text` (jsonb's text is not what was served).
 */
import type pg from 'pg';
import { StoreError } from '../../errors.js';
import { qualify, type Queryable } from './db.js';
import { checkout } from './connect.js';
import { migrateLockKey } from './locks.js';
import { RUNS_DDL } from './runs.js';
import { LEDGER_DDL, RETENTION_DDL } from './export-ledger.js';
import { STATUS_DDL } from './status.js';
import { ERASURES_ARCHIVE_DDL, ERASURES_DDL, ERASURES_RETENTION_DDL } from './erasures.js';

/** One migration: its statements for the mirror in `schema` (one simple query, several statements). */
export type PgMigration = (schema: string) => string;

/**
 * The core tables (conversations, messages, change log, crawls): this module's own. The tables of
 * runs, the export ledger and the mirror's metadata are their table groups' (`RUNS_DDL`,
 * `LEDGER_DDL`, `STATUS_DDL`).
 */
export function coreTablesDdl(schema: string): string {
  const t = (name: string) => qualify(schema, name);
  return `
  CREATE TABLE ${t('conversations')} (
    account_id     text COLLATE "C" NOT NULL,
    id             text COLLATE "C" NOT NULL,
    raw            jsonb,             -- the object as served by GET /v1/conversations; NULL until listed
    raw_text       text,              -- the same, byte for byte as served (JSON text); NULL until listed
    message_count  integer,           -- messages served at the last complete crawl
    last_synced_at text,              -- end of the last complete crawl (ISO 8601 UTC)
    deleted_at     text,              -- tombstone: the API answered 404
    first_seen_at  text NOT NULL,
    updated_at     text NOT NULL,     -- last time raw changed
    crawled_signal text,              -- the change signal the conversation showed at its last complete crawl
    PRIMARY KEY (account_id, id)
  );

  CREATE TABLE ${t('messages')} (
    account_id      text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    id              text COLLATE "C" NOT NULL,
    position        integer NOT NULL,  -- 0-based chronological index at the last crawl
    raw             jsonb,             -- the object as served: the source of truth (see raw_text)
    raw_text        text NOT NULL,     -- the same, byte for byte as served (JSON text)
    first_seen_at   text NOT NULL,
    updated_at      text NOT NULL,     -- last time raw changed
    deleted_at      text,              -- tombstone: no longer served after a complete crawl
    content         text GENERATED ALWAYS AS (raw->>'content') STORED,
    visibility      text GENERATED ALWAYS AS (raw->>'visibility') STORED,
    sender_id       text GENERATED ALWAYS AS (raw->'sender'->>'id') STORED,
    sender_name     text GENERATED ALWAYS AS (raw->'sender'->>'name') STORED,
    sender_type     text GENERATED ALWAYS AS (raw->'sender'->>'type') STORED,
    attachments     jsonb GENERATED ALWAYS AS (nullif(raw->'attachments', 'null'::jsonb)) STORED, -- NULL when not served
    created_at      text GENERATED ALWAYS AS (raw->>'created_at') STORED,
    PRIMARY KEY (account_id, conversation_id, id)
  );

  -- Earlier versions of edited messages: an edit never erases what an archive saw.
  CREATE TABLE ${t('message_history')} (
    account_id      text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    id              text COLLATE "C" NOT NULL,
    raw             jsonb,             -- the superseded version (see messages.raw)
    raw_text        text NOT NULL,     -- the same, byte for byte
    valid_from      text NOT NULL,     -- when that version was first mirrored
    valid_to        text NOT NULL,     -- when it was replaced
    replaced_by_seq bigint NOT NULL    -- change_log.seq of the update that replaced it
  );
  CREATE INDEX message_history_by_id ON ${t('message_history')} (account_id, conversation_id, id);
  CREATE INDEX message_history_by_seq ON ${t('message_history')} (replaced_by_seq);

  -- The change-log counter: the last seq handed out. A writing transaction moves it once, at its
  -- end, and holds the row lock until it commits, so seqs are handed out in commit order with no gap.
  CREATE TABLE ${t('change_seq')} (
    id   integer PRIMARY KEY CHECK (id = 1),
    last bigint NOT NULL
  );
  INSERT INTO ${t('change_seq')} (id, last) VALUES (1, 0);

  -- Transactional outbox: one row per insert, update or delete, written in the same transaction as
  -- the row change. Exports are produced from here, never from the API.
  CREATE TABLE ${t('change_log')} (
    seq             bigint PRIMARY KEY,
    stream          text COLLATE "C" NOT NULL CHECK (stream IN ('messages', 'conversations', 'runs')),
    op              text COLLATE "C" NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
    account_id      text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,  -- '' on a runs row
    record_id       text COLLATE "C" NOT NULL,  -- a runs row: the run id
    synced_at       text NOT NULL,              -- a runs row: when the run ended
    run_id          bigint
  );
  CREATE INDEX change_log_by_run ON ${t('change_log')} (run_id);

  -- A change's payload until its batch is published and recorded (the exports are then the copy).
  CREATE TABLE ${t('change_payloads')} (
    seq    bigint PRIMARY KEY,        -- change_log.seq
    record text,                      -- the record as served (JSON text, byte-exact)
    line   text,                      -- legacy: the export line without seq (never written by this engine)
    CHECK (line IS NOT NULL OR record IS NOT NULL)
  );

  -- Per-conversation crawl checkpoint: the next page to fetch and the ids seen so far in this crawl.
  CREATE TABLE ${t('checkpoints')} (
    account_id       text COLLATE "C" NOT NULL,
    conversation_id  text COLLATE "C" NOT NULL,
    next_page        integer NOT NULL,
    total_count      integer NOT NULL,
    crawl_started_at text NOT NULL,
    run_id           bigint,
    updated_at       text NOT NULL,
    PRIMARY KEY (account_id, conversation_id)
  );
  CREATE TABLE ${t('crawl_pages')} (
    account_id      text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    page            integer NOT NULL,
    ids             text[] COLLATE "C" NOT NULL, -- the message ids served on that page, in served order
    PRIMARY KEY (account_id, conversation_id, page)
  );

  -- An ISO 8601 time (as the API serves it, e.g. a conversation's updated_at) in seconds since the
  -- epoch, fractions kept; NULL when the text does not start with a date or is no time PostgreSQL
  -- reads (never an error), as SQLite's unixepoch(t, 'subsec'). A time without an offset is UTC.
  CREATE FUNCTION ${t('iso_epoch')}(t text) RETURNS numeric
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SET timezone TO 'UTC' AS $fn$
  BEGIN
    IF t !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}' THEN RETURN NULL; END IF;
    BEGIN
      RETURN extract(epoch FROM t::timestamptz);
    EXCEPTION WHEN others THEN
      RETURN NULL;
    END;
  END
  $fn$;
  `;
}

/**
 * The migrations, applied in order; `schema_version.version` holds how many have run. Append new
 * ones; never edit a released one. Version 1 is SQLite's schema version 8 as a whole (a PostgreSQL
 * mirror never had the earlier ones); version 2 is SQLite's 9 (erasures), 3 SQLite's 10 (the erasure record's batch id), 4 SQLite's 11 (retention), 5 SQLite's 12 (retention erasures).
 */
export const PG_MIGRATIONS: readonly PgMigration[] = [
  (schema) => [coreTablesDdl(schema), ...RUNS_DDL(schema), ...LEDGER_DDL(schema), ...STATUS_DDL(schema)].join(';\n'),
  // 2: erasures (issue 26, the mirror side; SQLite's version 9). A redacted record is a marker
  // (src/store/redaction.ts); the STORED generated message columns read NULL for it, and none of
  // them (nor messages.raw, conversations.raw_text) is NOT NULL, so no constraint changes.
  (schema) => ERASURES_DDL(schema).join(';\n'),
  // 3: the batch id reserved for an erasure's record in the ledger (issue 26, the archive step;
  // SQLite's version 10).
  (schema) => ERASURES_ARCHIVE_DDL(schema).join(';\n'),
  // 4: the retention record that expired a published file (issue 26, item 3; SQLite's version 11).
  (schema) => RETENTION_DDL(schema).join(';\n'),
  // 5: retention erasures (issue 26, item 3, --prune-mirror; SQLite's version 12): kind 'retention'.
  (schema) => ERASURES_RETENTION_DDL(schema).join(';\n'),
];

/** The schema version this code writes and reads. */
export const PG_SCHEMA_VERSION = PG_MIGRATIONS.length;

/** Hooks of {@link migrate}, for tests. */
export interface MigrateHooks {
  /** Called inside the migration's transaction once the migration lock is held, before anything is read or changed. */
  onLocked?: () => Promise<void> | void;
}

/** What {@link readSchemaVersion} finds. */
export interface SchemaState {
  /** The schema exists. */
  schemaExists: boolean;
  /** `schema_version.version`; 0 when the schema or the table is missing. */
  version: number;
  /** Tables in the schema other than `schema_version`. */
  tables: number;
}

/** Reads the state of the mirror's schema (nothing is locked or changed). */
export async function readSchemaVersion(q: Queryable, schema: string): Promise<SchemaState> {
  const r = await q.query<{ schema_exists: boolean; has_version: boolean; tables: number }>(
    `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1) AS schema_exists,
            EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_version') AS has_version,
            (SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_version')::int AS tables`,
    [schema],
  );
  const row = r.rows[0]!;
  let version = 0;
  if (row.has_version) {
    const v = await q.query<{ version: number }>(`SELECT version FROM ${qualify(schema, 'schema_version')} WHERE id = 1`);
    version = v.rows[0]?.version ?? 0;
  }
  return { schemaExists: row.schema_exists, version, tables: row.tables };
}

/**
 * Refuses a schema this code cannot use: newer than it, or (version 0) holding tables that are not
 * a convo-mirror's; for `readOnly` also a missing or older one (read-only opens never migrate).
 *
 * @param shown - the target as messages show it
 * @throws {@link StoreError} naming the schema and the target
 */
export function checkSchemaState(state: SchemaState, schema: string, shown: string, readOnly: boolean): void {
  const where = `schema "${schema}" of ${shown}`;
  if (state.version > PG_SCHEMA_VERSION) {
    throw new StoreError(
      `the mirror in ${where} has schema version ${state.version}, newer than this convo-mirror knows (${PG_SCHEMA_VERSION}); upgrade convo-mirror`,
      { schema, target: shown, version: state.version },
    );
  }
  if (state.version === 0 && state.tables > 0) {
    throw new StoreError(`${where} holds tables but no convo-mirror mirror: point CONVO_MIRROR_DB at another schema (?schema=NAME)`, { schema, target: shown });
  }
  if (readOnly && state.version === 0) {
    throw new StoreError(`no mirror in ${where} (a read-only open creates nothing): run convo-mirror sync first`, { schema, target: shown });
  }
  if (readOnly && state.version < PG_SCHEMA_VERSION) {
    throw new StoreError(
      `the mirror in ${where} has schema version ${state.version}, older than this convo-mirror's (${PG_SCHEMA_VERSION}); ` +
        'read-only commands never migrate: run convo-mirror sync (which migrates it) first',
      { schema, target: shown, version: state.version },
    );
  }
}

/** Marks an error raised by `CREATE SCHEMA`, so the caller can name the missing right. */
export class CreateSchemaFailed extends Error {
  constructor(readonly original: unknown) {
    super((original as Error)?.message ?? String(original));
  }
}

/**
 * Brings the mirror in `schema` to {@link PG_SCHEMA_VERSION}: when it is older, in ONE transaction
 * under the transaction-scoped advisory lock of the schema ({@link migrateLockKey}), creates the
 * schema when missing and `schema_version`, re-reads the version (another process may have
 * migrated meanwhile) and applies the pending migrations. Processes starting together migrate
 * once: the others wait for the lock, then find nothing to do.
 *
 * @returns how many migrations this call applied
 * @throws {@link StoreError} as {@link checkSchemaState} (nothing is changed then)
 * @throws {@link CreateSchemaFailed} wrapping the error of `CREATE SCHEMA` (e.g. SQLSTATE 42501)
 * @throws what PostgreSQL raises for a migration (its transaction is rolled back)
 */
export async function migrate(pool: pg.Pool, schema: string, shown: string, hooks: MigrateHooks = {}): Promise<number> {
  const before = await readSchemaVersion(pool, schema);
  checkSchemaState(before, schema, shown, false);
  if (before.version === PG_SCHEMA_VERSION) return 0;
  const client = await checkout(pool);
  let ok = false;
  let broken: Error | undefined;
  try {
    await client.query('BEGIN');
    await client.query('SELECT pg_advisory_xact_lock($1::bigint)', [migrateLockKey(schema)]);
    await hooks.onLocked?.();
    // Checked before CREATE SCHEMA, which needs CREATE on the database even when the schema exists.
    const state = await readSchemaVersion(client, schema);
    checkSchemaState(state, schema, shown, false);
    if (!state.schemaExists) {
      try {
        await client.query(`CREATE SCHEMA "${schema}"`);
      } catch (err) {
        throw new CreateSchemaFailed(err);
      }
    }
    await client.query(`CREATE TABLE IF NOT EXISTS ${qualify(schema, 'schema_version')} (
      id          integer PRIMARY KEY CHECK (id = 1),
      version     integer NOT NULL,
      migrated_at timestamptz NOT NULL DEFAULT now()
    )`);
    for (let v = state.version; v < PG_SCHEMA_VERSION; v++) await client.query(PG_MIGRATIONS[v]!(schema));
    await client.query(
      `INSERT INTO ${qualify(schema, 'schema_version')} (id, version) VALUES (1, $1)
       ON CONFLICT (id) DO UPDATE SET version = excluded.version, migrated_at = now()`,
      [PG_SCHEMA_VERSION],
    );
    await client.query('COMMIT');
    ok = true;
    return PG_SCHEMA_VERSION - state.version;
  } finally {
    if (!ok) {
      await client.query('ROLLBACK').catch((err: unknown) => {
        broken = err instanceof Error ? err : new Error(String(err));
      });
    }
    client.release(broken);
  }
}
