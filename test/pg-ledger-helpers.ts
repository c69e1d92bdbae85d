/**
 * Real PostgreSQL for the ledger group's tests (B2's own helpers until the core engine's test/pg.ts
 * and migrations land): one random schema per test file (`cmtest_<random>`), dropped at the end,
 * holding the ledger group's tables (from their DDL constants; `erasures` too, which `status`
 * counts) and stand-ins for the core engine's
 * tables they read (conversations, messages, message_history, change_log, change_payloads,
 * checkpoints), with the columns of the core engine's schema (i25-pgcore) those reads use.
 *
 * Server: `CONVO_MIRROR_TEST_PG` (default `postgres://postgres@127.0.0.1:5432/test`).
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { qualify } from '../src/store/postgres/db.js';
import { RUNS_DDL } from '../src/store/postgres/runs.js';
import { LEDGER_DDL, RETENTION_DDL } from '../src/store/postgres/export-ledger.js';
import { STATUS_DDL } from '../src/store/postgres/status.js';
import { ERASURES_DDL } from '../src/store/postgres/erasures.js';

/** The test server's URL. */
export const PG_URL = process.env.CONVO_MIRROR_TEST_PG ?? 'postgres://postgres@127.0.0.1:5432/test';

/** A fresh schema name, `cmtest_<16 hex digits>`. */
export function randomSchema(): string {
  return `cmtest_${randomBytes(8).toString('hex')}`;
}

/** A pool on the test server. */
export function testPool(max = 10): pg.Pool {
  return new pg.Pool({ connectionString: PG_URL, max, application_name: 'convo-mirror-test' });
}

/** Stand-ins of the core engine's tables, as far as the ledger group reads them. */
const CORE_STANDINS = (schema: string): string[] => {
  const t = (table: string) => qualify(schema, table);
  return [
    `CREATE TABLE ${t('conversations')} (account_id text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL, raw jsonb, raw_text text, deleted_at text,
       PRIMARY KEY (account_id, id))`,
    `CREATE TABLE ${t('messages')} (account_id text COLLATE "C" NOT NULL, conversation_id text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL,
       raw jsonb, raw_text text NOT NULL, deleted_at text, PRIMARY KEY (account_id, conversation_id, id))`,
    `CREATE TABLE ${t('message_history')} (account_id text COLLATE "C" NOT NULL, conversation_id text COLLATE "C" NOT NULL, id text COLLATE "C" NOT NULL,
       raw jsonb, raw_text text NOT NULL, replaced_by_seq bigint NOT NULL)`,
    `CREATE TABLE ${t('change_log')} (seq bigint PRIMARY KEY, stream text COLLATE "C" NOT NULL, op text COLLATE "C" NOT NULL, account_id text COLLATE "C" NOT NULL,
       conversation_id text COLLATE "C" NOT NULL, record_id text COLLATE "C" NOT NULL, synced_at text NOT NULL, run_id bigint)`,
    `CREATE TABLE ${t('change_payloads')} (seq bigint PRIMARY KEY, record text, line text)`,
    `CREATE TABLE ${t('checkpoints')} (account_id text COLLATE "C" NOT NULL, conversation_id text COLLATE "C" NOT NULL, PRIMARY KEY (account_id, conversation_id))`,
  ];
};

/** Creates `schema` with the ledger group's tables and the core stand-ins, in one transaction. */
export async function createSchema(pool: pg.Pool, schema: string): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(`CREATE SCHEMA "${schema}"`);
    for (const sql of [...CORE_STANDINS(schema), ...RUNS_DDL(schema), ...LEDGER_DDL(schema), ...RETENTION_DDL(schema), ...STATUS_DDL(schema), ...ERASURES_DDL(schema)]) await client.query(sql);
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

/** Drops `schema` and everything in it. */
export async function dropSchema(pool: pg.Pool, schema: string): Promise<void> {
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/** A change to append (a change-log row and its payload). */
export interface TestChange {
  stream: 'messages' | 'conversations' | 'runs';
  op?: 'insert' | 'update' | 'delete';
  account_id: string;
  conversation_id: string;
  record_id: string;
  synced_at: string;
  record: string;
}

/**
 * Appends changes with the next seqs (above every seq there is, plus `gap`), as one transaction;
 * returns their seqs. The ledger group only reads the change log: how the core engine hands out
 * seqs is not under test here.
 */
export async function appendChanges(q: pg.Pool | pg.PoolClient, schema: string, changes: TestChange[], gap = 0): Promise<number[]> {
  const top = Number((await q.query(`SELECT coalesce(max(seq), 0) AS m FROM ${qualify(schema, 'change_log')}`)).rows[0].m);
  const seqs = changes.map((_, i) => top + gap + i + 1);
  await q.query({
    text: `WITH c AS (
             INSERT INTO ${qualify(schema, 'change_log')} (seq, stream, op, account_id, conversation_id, record_id, synced_at)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) RETURNING seq)
           INSERT INTO ${qualify(schema, 'change_payloads')} (seq, record) SELECT * FROM unnest($1::bigint[], $8::text[])`,
    values: [
      seqs,
      changes.map((c) => c.stream),
      changes.map((c) => c.op ?? 'insert'),
      changes.map((c) => c.account_id),
      changes.map((c) => c.conversation_id),
      changes.map((c) => c.record_id),
      changes.map((c) => c.synced_at),
      changes.map((c) => c.record),
    ],
  });
  return seqs;
}

/** Runs `f` in one transaction on one client of `pool`: committed when it resolves, rolled back when it throws. */
export async function inTransaction<T>(pool: pg.Pool, f: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const out = await f(client);
    await client.query('COMMIT');
    return out;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  } finally {
    client.release();
  }
}

/**
 * Resolves once the backend `pid` waits for a lock (pg_stat_activity `wait_event_type = 'Lock'`):
 * the other side of a test can then go on, knowing this one is queued. Polls; no timing asserted.
 */
export async function waitUntilBlocked(pool: pg.Pool, pid: number): Promise<void> {
  for (;;) {
    const r = await pool.query(`SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, [pid]);
    if (r.rows[0]?.wait_event_type === 'Lock') return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
