/**
 * The change log (transactional outbox): one `change_log` row per insert, update or delete of a
 * message or conversation, appended in the same transaction as the row change, and one per end of a
 * run (stream `runs`). Since schema
 * version 6 a change carries the record as served (`record`); the export line is the exporter's
 * business (src/export/lines.ts). Since version 8 the record is kept in `change_payloads` (same
 * seq) only until its batch is published and recorded (`ExportLedger.record` prunes it); the
 * `change_log` row itself (seq, keys, op, times) stays.
 */
import type { Db, Statement } from './sqlite.js';
import { MultiRowStatements, valuesList } from './multi-row.js';
import type { ChangeOp, ChangeStream, ExportChange, RunChanges } from '../types.js';

/** A change to append: a change-log row's facts (its seq, day and legacy line come later). */
export type NewChange = Pick<ExportChange, 'stream' | 'op' | 'account_id' | 'conversation_id' | 'record_id' | 'synced_at'> & {
  run_id: number | null;
  /** The record as served (JSON); see `ExportChange.record`. */
  record: string;
};


/** Appends change-log rows (call inside the transaction that changes the record); counts a run's. */
export class ChangeLog {
  private readonly insertMany: MultiRowStatements;
  private readonly insertPayloads: MultiRowStatements;
  private readonly nextSeq: Statement<[], { seq: number }>;
  private readonly ofRun: Statement<[number], { stream: Exclude<ChangeStream, 'runs'>; op: ChangeOp; n: number }>;
  private readonly runLogged: Statement<[number], { n: number }>;

  constructor(db: Db) {
    this.runLogged = db.prepare(`SELECT count(*) AS n FROM change_log WHERE run_id = ? AND stream = 'runs'`);
    this.ofRun = db.prepare<[number], { stream: Exclude<ChangeStream, 'runs'>; op: ChangeOp; n: number }>(
      `SELECT stream, op, count(*) AS n FROM change_log WHERE run_id = ? AND stream IN ('messages', 'conversations') GROUP BY stream, op`,
    );
    this.insertMany = new MultiRowStatements(
      db,
      (n) => `INSERT INTO change_log (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id) VALUES ${valuesList(n, 8)}`,
    );
    this.insertPayloads = new MultiRowStatements(db, (n) => `INSERT INTO change_payloads (seq, record) VALUES ${valuesList(n, 2)}`);
    // What AUTOINCREMENT would hand out next: above every seq ever given (sqlite_sequence) and
    // every seq present, so a seq is never given twice.
    this.nextSeq = db.prepare(`SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'change_log'), 0),
                                           coalesce((SELECT max(seq) FROM change_log), 0)) + 1 AS seq`);
  }

  /**
   * What run `runId` changed, counted from its change-log rows: every page it committed, in every
   * process and attempt (a crashed daemon's run resumed, a failed crawl's committed pages).
   */
  changesOfRun(runId: number): RunChanges {
    const out: RunChanges = { messages: { inserted: 0, updated: 0, deleted: 0 }, conversations: { inserted: 0, updated: 0, deleted: 0 } };
    const key = { insert: 'inserted', update: 'updated', delete: 'deleted' } as const;
    for (const r of this.ofRun.all(runId)) out[r.stream][key[r.op]] = r.n;
    return out;
  }

  /**
   * Appends the `runs` row of a run that just ended: `insert` the first time, `update` when the run
   * ended before (it was taken up again, or its finish step retried). Call inside the transaction
   * that records the end.
   *
   * @param record - the run's record (JSON), see `Runs.lineRecord`
   * @param endedAt - when it ended: the row's `synced_at` (and so its export partition's day)
   */
  appendRun(runId: number, accountId: string, record: string, endedAt: string): number {
    const op = (this.runLogged.get(runId)?.n ?? 0) > 0 ? 'update' : 'insert';
    return this.append({ stream: 'runs', op, account_id: accountId, conversation_id: '', record_id: String(runId), synced_at: endedAt, run_id: runId, record });
  }

  /**
   * Appends `changes` and their payloads in their order, with consecutive seqs, a few statements
   * for them all (see `STATEMENT_ROWS` in multi-row.ts); returns their seqs. The seqs are those
   * AUTOINCREMENT would give them one by one: above every seq ever handed out, never reused.
   * Call inside the transaction that changes the records.
   */
  appendAll(changes: readonly NewChange[]): number[] {
    const seqs: number[] = [];
    if (changes.length === 0) return seqs;
    let seq = this.nextSeq.get()!.seq;
    const rows: unknown[][] = [];
    const payloads: unknown[][] = [];
    for (const c of changes) {
      rows.push([seq, c.stream, c.op, c.account_id, c.conversation_id, c.record_id, c.synced_at, c.run_id]);
      payloads.push([seq, c.record]);
      seqs.push(seq++);
    }
    this.insertMany.run(rows);
    this.insertPayloads.run(payloads);
    return seqs;
  }

  /** Appends `change` and its payload (see {@link appendAll}); returns its seq. */
  append(change: NewChange): number {
    return this.appendAll([change])[0]!;
  }
}
