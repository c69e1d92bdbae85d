/**
 * What `verify --deep` reads of a PostgreSQL mirror: every row of the record tables, as the facts
 * an export line is built from (the SQLite group: src/store/audit.ts). Read-only; the record
 * tables are streamed through pg-cursor on a client checked out for the stream.
 */
import type pg from 'pg';
import Cursor from 'pg-cursor';
import { checkout } from './connect.js';
import type { Queryable } from './db.js';
import { qualify } from './db.js';
import { NUMBERS } from './int8.js';
import type { HistoryRow, RecordRow } from '../types.js';

/** Rows read from the server in one step of a stream. */
const STREAM_ROWS = 1000;

/**
 * Streams the rows of one query through pg-cursor: a client is checked out of `pool` for the
 * stream (with an `'error'` listener: see `checkout`, so a lost connection fails the read rather
 * than the process) and released in `finally` (also when the reader stops early; destroyed if the
 * read failed or the connection was lost). One statement, so one snapshot.
 *
 * @throws the driver's error when the connection is lost mid-stream (the mirror translates it)
 */
export async function* streamRows<T>(pool: Pick<pg.Pool, 'connect'>, text: string, values: unknown[] = []): AsyncGenerator<T> {
  const client = await checkout(pool);
  // pg-cursor's close waits for the server's answer, which a lost connection never gives: it is
  // raced with the connection's end (a promise rejected from then on).
  let onEnd!: () => void;
  const ended = new Promise<never>((_, reject) => {
    onEnd = () => reject(new Error('Connection terminated before the cursor was closed'));
  });
  ended.catch(() => {});
  client.once('end', onEnd);
  const cursor = client.query(new Cursor<T>(text, values, { types: NUMBERS }));
  let failed: Error | undefined;
  try {
    for (;;) {
      const rows = await cursor.read(STREAM_ROWS);
      yield* rows;
      if (rows.length < STREAM_ROWS) break;
    }
  } catch (err) {
    failed = err instanceof Error ? err : new Error(String(err));
    throw err;
  } finally {
    // After a failure the connection is destroyed with the client: no portal to close.
    if (failed === undefined) {
      try {
        await Promise.race([cursor.close(), ended]);
      } catch (err) {
        failed = err instanceof Error ? err : new Error(String(err));
      }
    }
    client.removeListener('end', onEnd);
    client.release(failed);
  }
}

/** The deep check's reads in one schema. */
export class AuditReads {
  private readonly t: (table: string) => string;

  /** @param schema - the mirror's schema (a validated identifier) */
  constructor(schema: string) {
    this.t = (table) => qualify(schema, table);
  }

  /**
   * Every message or conversation row (tombstoned ones too), by primary key, with its record byte
   * for byte as served (`raw_text`, never `raw::text`: jsonb reorders keys and rewrites numbers, and
   * the deep check compares the served bytes with the exports) and `deleted` 1 or 0, as SQLite
   * gives it.
   */
  records(pool: Pick<pg.Pool, 'connect'>, table: 'messages' | 'conversations'): AsyncGenerator<RecordRow> {
    const text =
      table === 'messages'
        ? `SELECT account_id, conversation_id, id, raw_text AS raw, (deleted_at IS NOT NULL)::int AS deleted FROM ${this.t('messages')} ORDER BY account_id, conversation_id, id`
        : `SELECT account_id, id AS conversation_id, id, raw_text AS raw, (deleted_at IS NOT NULL)::int AS deleted FROM ${this.t('conversations')} ORDER BY account_id, id`;
    return streamRows<RecordRow>(pool, text);
  }

  /** Every `message_history` row (its `raw_text`), by the seq of the update that replaced it. */
  history(pool: Pick<pg.Pool, 'connect'>): AsyncGenerator<HistoryRow> {
    return streamRows<HistoryRow>(
      pool,
      `SELECT replaced_by_seq AS seq, account_id, conversation_id, id, raw_text AS raw FROM ${this.t('message_history')} ORDER BY replaced_by_seq`,
    );
  }

  /** Every run's id and status, by id. */
  async runs(q: Queryable): Promise<{ id: number; status: string }[]> {
    return (await q.query<{ id: number; status: string }>({ text: `SELECT id, status FROM ${this.t('runs')} ORDER BY id`, types: NUMBERS })).rows;
  }
}
