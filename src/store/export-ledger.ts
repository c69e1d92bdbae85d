/**
 * The export ledger: the exported watermark (`export_state`), planned and published batches
 * (`export_batches`), the published files (`export_files`), the hash chain of batch records
 * (`ledger`), and the change-log rows of a batch in file order. The exporter (src/export/) owns
 * the files and the records' format; this owns what was published.
 */
import type { Db, Statement } from './sqlite.js';
import type { ExportBatch, ExportChange, LedgerEntry, LedgerHead, PublishedFile } from './types.js';

type SeqRange = [firstSeq: number, lastSeq: number];

/** What a genesis record of a migrated export directory covers: everything published before the ledger. */
export interface LedgerGenesis {
  /** The last batch published (the genesis record's id). */
  batch_id: number;
  /** When it was published (the genesis record's time). */
  published_at: string;
  /** The exported watermark. */
  last_seq: number;
}

/** Compares strings by code unit, as SQLite's BINARY collation orders these ASCII keys. */
const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** Typed statements of the export ledger. */
export class ExportLedger {
  private readonly watermarkOf: Statement<[], { watermark: number }>;
  private readonly pending: Statement<[], { id: number; first_seq: number; last_seq: number; planned_at: string; run_id: number | null; gzip: number }>;
  private readonly maxSeq: Statement<[], { m: number }>;
  private readonly insertBatch: Statement<[firstSeq: number, lastSeq: number, plannedAt: string, runId: number | null, gzip: number]>;
  private readonly partitionKeys: Statement<SeqRange, { seq: number; stream: string; account_id: string; day: string }>;
  private readonly changes: Statement<{ first: number; last: number; stream: string; account_id: string; day: string }, ExportChange>;
  private readonly insertFile: Statement<PublishedFile & { now: string }>;
  private readonly markPublished: Statement<[publishedAt: string, batchId: number]>;
  private readonly prune: Statement<[lastSeq: number]>;
  private readonly setWatermark: Statement<[watermark: number]>;
  private readonly files: Statement<[], PublishedFile>;
  private readonly fileTotals: Statement<[], { files: number; lines: number }>;
  private readonly publishedBatches: Statement<[], { n: number }>;
  private readonly lag: Statement<[], { n: number }>;
  private readonly headOf: Statement<[], LedgerHead>;
  private readonly insertEntry: Statement<LedgerEntry & { published_at: string }>;
  private readonly entries: Statement<[], LedgerEntry>;
  private readonly genesisOf: Statement<[], { batch_id: number | null; published_at: string | null; n: number }>;

  constructor(db: Db) {
    this.watermarkOf = db.prepare(`SELECT watermark FROM export_state WHERE id = 1`);
    this.pending = db.prepare(
      `SELECT id, first_seq, last_seq, planned_at, run_id, gzip FROM export_batches WHERE published_at IS NULL ORDER BY id LIMIT 1`,
    );
    this.maxSeq = db.prepare(`SELECT coalesce(max(seq), 0) AS m FROM change_log`);
    this.insertBatch = db.prepare(`INSERT INTO export_batches (first_seq, last_seq, planned_at, run_id, gzip) VALUES (?, ?, ?, ?, ?)`);
    this.partitionKeys = db.prepare(`SELECT seq, stream, account_id, substr(synced_at, 1, 10) AS day FROM change_log WHERE seq BETWEEN ? AND ? ORDER BY seq`);
    // One partition, in seq order: a range of the primary key, no sort.
    this.changes = db.prepare(
      `SELECT c.seq, c.stream, c.op, c.account_id, c.conversation_id, c.record_id, c.synced_at, substr(c.synced_at, 1, 10) AS day, p.record, p.line
       FROM change_log c LEFT JOIN change_payloads p ON p.seq = c.seq
       WHERE c.seq BETWEEN @first AND @last AND c.stream = @stream AND c.account_id = @account_id AND substr(c.synced_at, 1, 10) = @day
       ORDER BY c.seq`,
    );
    this.prune = db.prepare(`DELETE FROM change_payloads WHERE seq <= ?`);
    this.insertFile = db.prepare(`INSERT OR REPLACE INTO export_files (path, batch_id, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, published_at)
                                  VALUES (@path, @batch_id, @stream, @account_id, @date, @first_seq, @last_seq, @lines, @bytes, @sha256, @now)`);
    this.markPublished = db.prepare(`UPDATE export_batches SET published_at = ? WHERE id = ?`);
    this.setWatermark = db.prepare(`UPDATE export_state SET watermark = ? WHERE id = 1`);
    this.files = db.prepare(`SELECT path, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, batch_id FROM export_files ORDER BY first_seq, path`);
    this.fileTotals = db.prepare(`SELECT count(*) AS files, coalesce(sum(lines), 0) AS lines FROM export_files`);
    this.publishedBatches = db.prepare(`SELECT count(*) AS n FROM export_batches WHERE published_at IS NOT NULL`);
    // A range of the primary key: costs what lies above the watermark, not the whole log.
    this.lag = db.prepare(`SELECT count(*) AS n FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1)`);
    this.headOf = db.prepare(`SELECT batch_id, hash FROM ledger ORDER BY batch_id DESC LIMIT 1`);
    this.insertEntry = db.prepare(`INSERT INTO ledger (batch_id, hash, prev_hash, path, files, lines, key_id, published_at)
                                   VALUES (@batch_id, @hash, @prev_hash, @path, @files, @lines, @key_id, @published_at)`);
    this.entries = db.prepare(`SELECT batch_id, hash, prev_hash, path, files, lines, key_id FROM ledger ORDER BY batch_id`);
    this.genesisOf = db.prepare(
      `SELECT max(batch_id) AS batch_id, max(published_at) AS published_at, (SELECT count(*) FROM ledger) AS n FROM export_files`,
    );
  }

  /** Change-log rows above the exported watermark (not yet published). */
  unexported(): number {
    return this.lag.get()!.n;
  }

  /** The last `change_log.seq` published. */
  watermark(): number {
    return this.watermarkOf.get()?.watermark ?? 0;
  }

  /** See `Mirror.planExportBatch`; call inside an immediate transaction. */
  plan(runId: number | null, plannedAt: string, gzip: boolean): ExportBatch | undefined {
    const pending = this.pending.get();
    if (pending) return { ...pending, gzip: pending.gzip !== 0, resumed: true };
    const wm = this.watermark();
    const max = this.maxSeq.get()?.m ?? 0;
    if (max <= wm) return undefined;
    const r = this.insertBatch.run(wm + 1, max, plannedAt, runId, gzip ? 1 : 0);
    return { id: Number(r.lastInsertRowid), first_seq: wm + 1, last_seq: max, planned_at: plannedAt, run_id: runId, gzip, resumed: false };
  }

  /**
   * The change-log rows of `[first, last]` in file order (stream, account, UTC day, seq), as a lazy
   * iterator. No SQL sort over the batch (SQLite would hold the sorted rows, payloads included, in
   * memory up to its cache size): one pass over the range's keys finds each partition's seq range,
   * then each partition is read in seq order from its own range. Memory: one entry per partition.
   */
  *changesBetween(first: number, last: number): Generator<ExportChange> {
    const partitions = new Map<string, { stream: string; account_id: string; day: string; first: number; last: number }>();
    for (const k of this.partitionKeys.iterate(first, last)) {
      const key = JSON.stringify([k.stream, k.account_id, k.day]);
      const p = partitions.get(key);
      if (p) p.last = k.seq;
      else partitions.set(key, { stream: k.stream, account_id: k.account_id, day: k.day, first: k.seq, last: k.seq });
    }
    const ordered = [...partitions.values()].sort((a, b) => cmp(a.stream, b.stream) || cmp(a.account_id, b.account_id) || cmp(a.day, b.day));
    for (const p of ordered) yield* this.changes.iterate(p);
  }

  /**
   * Records the files of a published batch and its ledger entry, marks it published, moves the
   * watermark, and prunes the payloads of every change up to it (published and recorded: the
   * exports are their copy; an unpublished batch keeps its payloads for a re-publication). Call
   * inside a transaction.
   */
  record(batch: Pick<ExportBatch, 'id' | 'last_seq'>, files: PublishedFile[], entry: LedgerEntry, publishedAt: string): void {
    for (const f of files) this.insertFile.run({ ...f, now: publishedAt });
    this.insertEntry.run({ ...entry, published_at: publishedAt });
    this.markPublished.run(publishedAt, batch.id);
    this.setWatermark.run(batch.last_seq);
    this.prune.run(batch.last_seq);
  }

  /**
   * What a genesis record must cover when files were published before the ledger existed (an
   * export directory of schema version 6 or older); undefined when the ledger has records or
   * nothing was published.
   */
  genesis(): LedgerGenesis | undefined {
    const g = this.genesisOf.get();
    if (!g || g.n > 0 || g.batch_id === null || g.published_at === null) return undefined;
    return { batch_id: g.batch_id, published_at: g.published_at, last_seq: this.watermark() };
  }

  /** Records the genesis record of a migrated export directory; call inside a transaction. */
  recordGenesis(entry: LedgerEntry, publishedAt: string): void {
    this.insertEntry.run({ ...entry, published_at: publishedAt });
  }

  /** Id of the batch planned and not yet published (an interrupted publication), if any. */
  pendingBatch(): number | undefined {
    return this.pending.get()?.id;
  }

  /** The chain head (the last record published), or undefined before the first record. */
  head(): LedgerHead | undefined {
    return this.headOf.get();
  }

  /** Every ledger entry, genesis first. */
  ledgerEntries(): LedgerEntry[] {
    return this.entries.all();
  }

  /** Every published file as recorded, by first seq then path. */
  publishedFiles(): PublishedFile[] {
    return this.files.all();
  }

  /** Published files and lines in all, and whether any batch was ever published. */
  totals(): { files: number; lines: number; everPublished: boolean } {
    const t = this.fileTotals.get() ?? { files: 0, lines: 0 };
    const published = this.publishedBatches.get()?.n ?? 0;
    return { ...t, everPublished: t.files > 0 || published > 0 };
  }
}
