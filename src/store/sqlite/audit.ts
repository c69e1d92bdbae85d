/**
 * What `verify --deep` reads of the mirror: every row of the record tables, in key order, as the
 * facts an export line is built from. Read-only.
 */
import type { Db, Statement } from './sqlite.js';
import type { HistoryRow, RecordRow } from '../types.js';



/** Typed statements of the deep check's reads. */
export class AuditReads {
  readonly messages: Statement<[], RecordRow>;
  readonly conversations: Statement<[], RecordRow>;
  readonly history: Statement<[], HistoryRow>;
  readonly runs: Statement<[], { id: number; status: string }>;

  constructor(db: Db) {
    this.messages = db.prepare(
      `SELECT account_id, conversation_id, id, raw, deleted_at IS NOT NULL AS deleted FROM messages ORDER BY account_id, conversation_id, id`,
    );
    this.conversations = db.prepare(
      `SELECT account_id, id AS conversation_id, id, raw, deleted_at IS NOT NULL AS deleted FROM conversations ORDER BY account_id, id`,
    );
    this.history = db.prepare(`SELECT replaced_by_seq AS seq, account_id, conversation_id, id, raw FROM message_history ORDER BY replaced_by_seq`);
    this.runs = db.prepare(`SELECT id, status FROM runs ORDER BY id`);
  }
}
