/**
 * The change log (transactional outbox): one `change_log` row per insert, update or delete of a
 * message or conversation, appended in the same transaction as the row change. Since schema
 * version 6 a row carries the record as served (`record`); the export line is the exporter's
 * business (src/export/lines.ts).
 */
import type { Db, Statement } from './sqlite.js';
import type { ChangeOp, ChangeStream } from './types.js';

/** A change to append. */
export interface NewChange {
  stream: ChangeStream;
  op: ChangeOp;
  account_id: string;
  conversation_id: string;
  record_id: string;
  /** ISO 8601 UTC commit time. */
  synced_at: string;
  run_id: number | null;
  /** The record as served (JSON); see `ExportChange.record`. */
  record: string;
}

/** Appends change-log rows; call inside the transaction that changes the record. */
export class ChangeLog {
  private readonly insert: Statement<NewChange>;

  constructor(db: Db) {
    this.insert = db.prepare<NewChange>(
      `INSERT INTO change_log (stream, op, account_id, conversation_id, record_id, synced_at, run_id, line, record)
       VALUES (@stream, @op, @account_id, @conversation_id, @record_id, @synced_at, @run_id, NULL, @record)`,
    );
  }

  /** Appends `change`; returns its seq. */
  append(change: NewChange): number {
    return Number(this.insert.run(change).lastInsertRowid);
  }
}
