/**
 * What `status` and the manifest ask of a PostgreSQL mirror as a whole: its id, its `mirror_meta`
 * values and its row counts (the SQLite group: src/store/status.ts).
 */
import { StoreError } from '../../errors.js';
import type { Queryable } from './db.js';
import { qualify } from './db.js';
import { NUMBERS } from './int8.js';
import { REDACTED_MARK } from '../redaction.js';

/** A row count `status` shows (the SQLite engine's names, in its order). */
export const COUNT_NAMES = [
  'conversations',
  'conversations_tombstoned',
  'messages',
  'messages_tombstoned',
  'message_history',
  'change_log',
  'export_watermark',
  'unexported_changes',
  'unexported_run_lines',
  'export_files',
  'ledger_records',
  'checkpoints',
  'runs',
  'erasures',
  'erasures_pending',
  'retention_erasures',
  'messages_erased',
  'conversations_erased',
] as const;
/** A row count `status` shows. */
export type CountName = (typeof COUNT_NAMES)[number];

/**
 * The DDL of `mirror_meta` in `schema`, with the mirror's random id (32 lowercase hex digits,
 * drawn once when the schema is created: an MD5 of two `gen_random_uuid()`s, as SQLite's
 * `lower(hex(randomblob(16)))`).
 */
export const STATUS_DDL = (schema: string): string[] => [
  `CREATE TABLE ${qualify(schema, 'mirror_meta')} (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
  )`,
  `INSERT INTO ${qualify(schema, 'mirror_meta')} (key, value) VALUES ('mirror_id', md5(gen_random_uuid()::text || gen_random_uuid()::text))`,
];

/** The row counts `status` shows, by name, in SQLite's order; each a scalar subquery of one statement. */
const COUNTS = (t: (table: string) => string): Record<CountName, string> => {
  const above = `seq > (SELECT watermark FROM ${t('export_state')} WHERE id = 1)`;
  return {
    conversations: `SELECT count(*) FROM ${t('conversations')} WHERE deleted_at IS NULL`,
    conversations_tombstoned: `SELECT count(*) FROM ${t('conversations')} WHERE deleted_at IS NOT NULL`,
    messages: `SELECT count(*) FROM ${t('messages')} WHERE deleted_at IS NULL`,
    messages_tombstoned: `SELECT count(*) FROM ${t('messages')} WHERE deleted_at IS NOT NULL`,
    message_history: `SELECT count(*) FROM ${t('message_history')}`,
    change_log: `SELECT count(*) FROM ${t('change_log')}`,
    export_watermark: `SELECT watermark FROM ${t('export_state')} WHERE id = 1`,
    unexported_changes: `SELECT count(*) FROM ${t('change_log')} WHERE ${above}`,
    unexported_run_lines: `SELECT count(*) FROM ${t('change_log')} WHERE ${above} AND stream = 'runs'`,
    export_files: `SELECT count(*) FROM ${t('export_files')}`,
    ledger_records: `SELECT count(*) FROM ${t('ledger')}`,
    checkpoints: `SELECT count(*) FROM ${t('checkpoints')}`,
    runs: `SELECT count(*) FROM ${t('runs')}`,
    // Erasures of a sender or a conversation (erase, the erase job).
    erasures: `SELECT count(*) FROM ${t('erasures')} WHERE kind <> 'retention'`,
    // Erasures recorded in the mirror whose archive step has not finished (the next publication finishes them), of any kind.
    erasures_pending: `SELECT count(*) FROM ${t('erasures')} WHERE archive_done_at IS NULL`,
    // Retention erasures (--prune-mirror): one per account and cutoff day.
    retention_erasures: `SELECT count(*) FROM ${t('erasures')} WHERE kind = 'retention'`,
    // Rows whose record is a redaction marker (src/store/redaction.ts), tombstoned ones too.
    messages_erased: `SELECT count(*) FROM ${t('messages')} WHERE strpos(raw_text, '${REDACTED_MARK}') > 0`,
    conversations_erased: `SELECT count(*) FROM ${t('conversations')} WHERE strpos(raw_text, '${REDACTED_MARK}') > 0`,
  };
};

/** The mirror-wide reads in one schema. */
export class MirrorStatus {
  private readonly meta_: string;
  private readonly countsText: string;
  private readonly schema: string;

  /** @param schema - the mirror's schema (a validated identifier) */
  constructor(schema: string) {
    this.schema = schema;
    this.meta_ = qualify(schema, 'mirror_meta');
    const counts = COUNTS((table) => qualify(schema, table));
    // One statement: one round trip and one snapshot for every count.
    this.countsText = `SELECT ${COUNT_NAMES.map((name) => `(${counts[name]})::bigint AS ${name}`)
      .join(',\n       ')}`;
  }

  /** A `mirror_meta` value, or undefined. */
  async meta(q: Queryable, key: string): Promise<string | undefined> {
    return (await q.query<{ value: string }>({ text: `SELECT value FROM ${this.meta_} WHERE key = $1`, values: [key] })).rows[0]?.value;
  }

  /** Sets a `mirror_meta` value (one upsert). */
  async setMeta(q: Queryable, key: string, value: string): Promise<void> {
    await q.query({ text: `INSERT INTO ${this.meta_} (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, values: [key, value] });
  }

  /**
   * The mirror's random id (32 hex digits), fixed when its schema was created.
   *
   * @throws {@link StoreError} naming the schema when it has no id (not migrated)
   */
  async mirrorId(q: Queryable): Promise<string> {
    const id = await this.meta(q, 'mirror_id');
    if (id === undefined) throw new StoreError(`mirror_meta of schema ${this.schema} has no mirror_id: the schema was not migrated`, { schema: this.schema });
    return id;
  }

  /** Every count `status` shows, by name, in SQLite's order (0 for an export watermark not there). */
  async counts(q: Queryable): Promise<Record<CountName, number>> {
    const row = (await q.query<Record<CountName, number | null>>({ text: this.countsText, types: NUMBERS })).rows[0]!;
    const out = {} as Record<CountName, number>;
    for (const name of COUNT_NAMES) out[name] = row[name] ?? 0;
    return out;
  }
}
