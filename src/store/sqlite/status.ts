/**
 * What `status` and the manifest ask of the mirror as a whole: its id and its row counts.
 */
import type { Db, Statement } from './sqlite.js';
import { REDACTED_MARK } from '../redaction.js';

/** The row counts `status` shows, each one query. */
const COUNTS = {
  conversations: `SELECT count(*) AS n FROM conversations WHERE deleted_at IS NULL`,
  conversations_tombstoned: `SELECT count(*) AS n FROM conversations WHERE deleted_at IS NOT NULL`,
  messages: `SELECT count(*) AS n FROM messages WHERE deleted_at IS NULL`,
  messages_tombstoned: `SELECT count(*) AS n FROM messages WHERE deleted_at IS NOT NULL`,
  message_history: `SELECT count(*) AS n FROM message_history`,
  change_log: `SELECT count(*) AS n FROM change_log`,
  export_watermark: `SELECT watermark AS n FROM export_state WHERE id = 1`,
  unexported_changes: `SELECT count(*) AS n FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1)`,
  // Of those, the run lines: a run that changed nothing publishes its line later (the heartbeat).
  unexported_run_lines: `SELECT count(*) AS n FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1) AND stream = 'runs'`,
  export_files: `SELECT count(*) AS n FROM export_files`,
  ledger_records: `SELECT count(*) AS n FROM ledger`,
  checkpoints: `SELECT count(*) AS n FROM checkpoints`,
  runs: `SELECT count(*) AS n FROM runs`,
  // Erasures of a sender or a conversation (erase, the erase job).
  erasures: `SELECT count(*) AS n FROM erasures WHERE kind <> 'retention'`,
  // Erasures recorded in the mirror whose archive step has not finished (the next publication finishes them), of any kind.
  erasures_pending: `SELECT count(*) AS n FROM erasures WHERE archive_done_at IS NULL`,
  // Retention erasures (--prune-mirror): one per account and cutoff day.
  retention_erasures: `SELECT count(*) AS n FROM erasures WHERE kind = 'retention'`,
  // Rows whose record is a redaction marker (src/store/redaction.ts), tombstoned ones too.
  messages_erased: `SELECT count(*) AS n FROM messages WHERE instr(raw, '${REDACTED_MARK}') > 0`,
  conversations_erased: `SELECT count(*) AS n FROM conversations WHERE instr(raw, '${REDACTED_MARK}') > 0`,
} as const;

/** A row count `status` shows. */
export type CountName = keyof typeof COUNTS;

/** Typed statements of the mirror-wide reads. */
export class MirrorStatus {
  private readonly id: Statement<[], { value: string }>;
  private readonly getMeta: Statement<[key: string], { value: string }>;
  private readonly putMeta: Statement<[key: string, value: string]>;
  private readonly counters: { [K in CountName]: Statement<[], { n: number }> };

  constructor(db: Db) {
    this.id = db.prepare(`SELECT value FROM mirror_meta WHERE key = 'mirror_id'`);
    this.getMeta = db.prepare(`SELECT value FROM mirror_meta WHERE key = ?`);
    this.putMeta = db.prepare(`INSERT INTO mirror_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`);
    const counters = {} as { [K in CountName]: Statement<[], { n: number }> };
    for (const name of Object.keys(COUNTS) as CountName[]) counters[name] = db.prepare(COUNTS[name]);
    this.counters = counters;
  }

  /** A `mirror_meta` value, or undefined. */
  meta(key: string): string | undefined {
    return this.getMeta.get(key)?.value;
  }

  /** Sets a `mirror_meta` value. */
  setMeta(key: string, value: string): void {
    this.putMeta.run(key, value);
  }

  /** The mirror's random id (32 hex digits), fixed at creation (migration 2). */
  mirrorId(): string {
    const row = this.id.get();
    if (!row) throw new Error('mirror_meta has no mirror_id: the schema was not migrated');
    return row.value;
  }

  /** Every count of {@link COUNTS}, by name, in that order. */
  counts(): Record<CountName, number> {
    const out = {} as Record<CountName, number>;
    for (const name of Object.keys(COUNTS) as CountName[]) out[name] = this.counters[name].get()?.n ?? 0;
    return out;
  }
}
