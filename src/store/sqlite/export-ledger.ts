/**
 * The export ledger: the exported watermark (`export_state`), planned and published batches
 * (`export_batches`), the published files (`export_files`), the hash chain of batch records
 * (`ledger`), and the change-log rows of a batch in file order. The exporter (src/export/) owns
 * the files and the records' format; this owns what was published.
 */
import { StoreError } from '../../errors.js';
import type { Db, Statement } from './sqlite.js';
import type { ExpiredFile, ExportBatch, ExportChange, LedgerEntry, LedgerGenesis, LedgerHead, PendingExport, PublishedFile, ReplacedFile } from '../types.js';



/** Change-log rows read in one call when a batch is exported, at most. */
const READ_CHUNK = 1000;
/**
 * Payload bytes read in one call when a batch is exported, at most (a single larger payload is
 * read alone): a chunk's memory is bounded whatever the records' size (a page may be 32 MiB).
 */
const READ_CHUNK_BYTES = 8 * 1024 * 1024;

/** Compares strings by code unit, as SQLite's BINARY collation orders these ASCII keys. */
const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** Reads a batch's change-log rows back in file order, for its export files. */
class BatchReader {
  private readonly runStarts: Statement<{ first: number; after: number; last: number }, [seq: number, stream: string, account_id: string, day: string]>;
  private readonly sizes: Statement<{ after: number; last: number; stream: string; account_id: string; day: string }, [seq: number, bytes: number]>;
  private readonly changes: Statement<
    { after: number; last: number; stream: string; account_id: string; day: string },
    [seq: number, op: ExportChange['op'], conversation_id: string, record_id: string, synced_at: string, record: string | null, line: string | null]
  >;

  constructor(db: Db) {
    // Where a run of rows of one partition starts: the first row of the range, and each row whose
    // predecessor (seq - 1) is absent or of another partition. A pass over the range's keys in
    // SQLite, no sort, returning only the starts; read in chunks (keyset: after the last seq read).
    this.runStarts = db
      .prepare<{ first: number; after: number; last: number }, [seq: number, stream: string, account_id: string, day: string]>(
        `SELECT c.seq, c.stream, c.account_id, substr(c.synced_at, 1, 10)
         FROM change_log c LEFT JOIN change_log p ON p.seq = c.seq - 1
         WHERE c.seq > @after AND c.seq <= @last
           AND (c.seq = @first OR p.seq IS NULL OR p.stream IS NOT c.stream OR p.account_id IS NOT c.account_id
                OR substr(p.synced_at, 1, 10) IS NOT substr(c.synced_at, 1, 10))
         ORDER BY c.seq LIMIT ${READ_CHUNK}`,
      )
      .raw(true);
    // One partition, in seq order: a range of the primary key, no sort.
    // Rows as arrays, without the partition's own keys: building a JS object per row in the native
    // binding cost more than SQLite's whole read.
    this.changes = db
      .prepare<
        { after: number; last: number; stream: string; account_id: string; day: string },
        [seq: number, op: ExportChange['op'], conversation_id: string, record_id: string, synced_at: string, record: string | null, line: string | null]
      >(
        `SELECT c.seq, c.op, c.conversation_id, c.record_id, c.synced_at, p.record, p.line
         FROM change_log c LEFT JOIN change_payloads p ON p.seq = c.seq
         WHERE c.seq > @after AND c.seq <= @last AND c.stream = @stream AND c.account_id = @account_id AND substr(c.synced_at, 1, 10) = @day
         ORDER BY c.seq LIMIT ${READ_CHUNK}`,
      )
      .raw(true);
    // The payload sizes of the next chunk's rows, from the records' headers (no payload is copied).
    this.sizes = db
      .prepare<{ after: number; last: number; stream: string; account_id: string; day: string }, [seq: number, bytes: number]>(
        `SELECT c.seq, coalesce(octet_length(p.record), 0) + coalesce(octet_length(p.line), 0)
         FROM change_log c LEFT JOIN change_payloads p ON p.seq = c.seq
         WHERE c.seq > @after AND c.seq <= @last AND c.stream = @stream AND c.account_id = @account_id AND substr(c.synced_at, 1, 10) = @day
         ORDER BY c.seq LIMIT ${READ_CHUNK}`,
      )
      .raw(true);
  }

  /** The last seq of the next chunk of a partition after `after`: up to {@link READ_CHUNK} rows and {@link READ_CHUNK_BYTES} of payload (one row at least); undefined when none is left. */
  private chunkEnd(p: { stream: string; account_id: string; day: string; last: number }, after: number): number | undefined {
    const sizes = this.sizes.all({ after, last: p.last, stream: p.stream, account_id: p.account_id, day: p.day });
    if (sizes.length === 0) return undefined;
    let end = sizes[0]![0];
    let bytes = sizes[0]![1];
    for (let i = 1; i < sizes.length && bytes + sizes[i]![1] <= READ_CHUNK_BYTES; i++) {
      bytes += sizes[i]![1];
      end = sizes[i]![0];
    }
    return end;
  }

  /**
   * The change-log rows of `[first, last]` in file order (stream, account, UTC day, seq), in chunks
   * of at most {@link READ_CHUNK} rows and {@link READ_CHUNK_BYTES} of payload. `last` must not
   * exceed the highest seq there is (see `ExportLedger.chunksBetween`). No SQL sort over the batch (SQLite would hold the sorted
   * rows, payloads included, in memory up to its cache size): one pass in SQLite finds where each
   * run of rows of one partition starts, then each partition is read in seq order from its own
   * range of the primary key. Memory: one entry per partition, one chunk of rows.
   */
  *chunks(first: number, last: number): Generator<ExportChange[]> {
    const partitions = new Map<string, { stream: string; account_id: string; day: string; first: number; last: number }>();
    let open: { last: number } | undefined;
    for (let after = first - 1; after < last; ) {
      const starts = this.runStarts.all({ first, after, last });
      if (starts.length === 0) break;
      for (const [seq, stream, account_id, day] of starts) {
        // The run before ends where this one starts.
        if (open) open.last = Math.max(open.last, seq - 1);
        // stream and day hold no NUL and the account id comes last: the key is unambiguous.
        const key = `${stream}\0${day}\0${account_id}`;
        let p = partitions.get(key);
        if (!p) {
          p = { stream, account_id, day, first: seq, last: seq };
          partitions.set(key, p);
        }
        open = p;
      }
      after = starts[starts.length - 1]![0];
    }
    if (open) open.last = last;
    const ordered = [...partitions.values()].sort((a, b) => cmp(a.stream, b.stream) || cmp(a.account_id, b.account_id) || cmp(a.day, b.day));
    for (const p of ordered) {
      for (let after = p.first - 1; after < p.last; ) {
        const end = this.chunkEnd(p, after);
        if (end === undefined) break;
        const rows = this.changes.all({ after, last: end, stream: p.stream, account_id: p.account_id, day: p.day });
        if (rows.length === 0) break;
        const { stream, account_id, day } = p as { stream: ExportChange['stream']; account_id: string; day: string };
        yield rows.map(([seq, op, conversation_id, record_id, synced_at, record, line]) => ({ seq, stream, op, account_id, conversation_id, record_id, synced_at, day, record, line }));
        after = rows[rows.length - 1]![0];
      }
    }
  }
}

/** Typed statements of the export ledger. */
export class ExportLedger {
  private readonly watermarkOf: Statement<[], { watermark: number }>;
  private readonly pending: Statement<[], { id: number; first_seq: number; last_seq: number; planned_at: string; run_id: number | null; gzip: number }>;
  private readonly maxSeq: Statement<[], { m: number }>;
  private readonly insertBatch: Statement<[firstSeq: number, lastSeq: number, plannedAt: string, runId: number | null, gzip: number]>;
  private readonly reader: BatchReader;
  private readonly insertFile: Statement<PublishedFile & { now: string }>;
  private readonly markPublished: Statement<[publishedAt: string, batchId: number]>;
  private readonly prune: Statement<[lastSeq: number]>;
  private readonly pruneAll: Statement<[]>;
  private readonly payloadAbove: Statement<[lastSeq: number], { n: number }>;
  private readonly setWatermark: Statement<[watermark: number]>;
  private readonly files: Statement<[], PublishedFile>;
  private readonly fileTotals: Statement<[], { files: number; lines: number }>;
  private readonly publishedBatches: Statement<[], { n: number }>;
  private readonly lag: Statement<[], { n: number }>;
  private readonly pendingOf: Statement<[], { data: number; run_lines: number; oldest_run_line: string | null }>;
  private readonly headOf: Statement<[], LedgerHead>;
  private readonly insertEntry: Statement<LedgerEntry & { published_at: string }>;
  private readonly entries: Statement<[], LedgerEntry>;
  private readonly genesisOf: Statement<[], { batch_id: number | null; published_at: string | null; n: number }>;
  private readonly nextId: Statement<[], { id: number }>;
  private readonly reserveId: Statement<[id: number]>;
  private readonly seedId: Statement<[id: number]>;
  private readonly deleteFile: Statement<[path: string]>;
  private readonly entryOf: Statement<[batchId: number], { batch_id: number }>;
  private readonly expire: Statement<[batchId: number, path: string]>;
  private readonly expiredRows: Statement<[], ExpiredFile>;

  constructor(db: Db) {
    this.watermarkOf = db.prepare(`SELECT watermark FROM export_state WHERE id = 1`);
    this.pending = db.prepare(
      `SELECT id, first_seq, last_seq, planned_at, run_id, gzip FROM export_batches WHERE published_at IS NULL ORDER BY id LIMIT 1`,
    );
    this.maxSeq = db.prepare(`SELECT coalesce(max(seq), 0) AS m FROM change_log`);
    this.insertBatch = db.prepare(`INSERT INTO export_batches (first_seq, last_seq, planned_at, run_id, gzip) VALUES (?, ?, ?, ?, ?)`);
    this.reader = new BatchReader(db);
    this.prune = db.prepare(`DELETE FROM change_payloads WHERE seq <= ?`);
    // No WHERE: SQLite frees the table's pages whole instead of deleting row by row.
    this.pruneAll = db.prepare(`DELETE FROM change_payloads`);
    this.payloadAbove = db.prepare(`SELECT count(*) AS n FROM (SELECT 1 FROM change_payloads WHERE seq > ? LIMIT 1)`);
    this.insertFile = db.prepare(`INSERT OR REPLACE INTO export_files (path, batch_id, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, published_at)
                                  VALUES (@path, @batch_id, @stream, @account_id, @date, @first_seq, @last_seq, @lines, @bytes, @sha256, @now)`);
    this.markPublished = db.prepare(`UPDATE export_batches SET published_at = ? WHERE id = ?`);
    this.setWatermark = db.prepare(`UPDATE export_state SET watermark = ? WHERE id = 1`);
    this.files = db.prepare(`SELECT path, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, batch_id FROM export_files WHERE expired_by IS NULL ORDER BY first_seq, path`);
    this.expire = db.prepare(`UPDATE export_files SET expired_by = ? WHERE path = ? AND expired_by IS NULL`);
    this.expiredRows = db.prepare(
      `SELECT path, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, batch_id, expired_by FROM export_files WHERE expired_by IS NOT NULL ORDER BY expired_by, first_seq, path`,
    );
    this.fileTotals = db.prepare(`SELECT count(*) AS files, coalesce(sum(lines), 0) AS lines FROM export_files`);
    this.publishedBatches = db.prepare(`SELECT count(*) AS n FROM export_batches WHERE published_at IS NOT NULL`);
    // A range of the primary key: costs what lies above the watermark, not the whole log.
    this.lag = db.prepare(`SELECT count(*) AS n FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1)`);
    // The same range, split: changes of the mirror's records, and run lines (with the oldest's time).
    this.pendingOf = db.prepare(
      `SELECT coalesce(sum(stream <> 'runs'), 0) AS data, coalesce(sum(stream = 'runs'), 0) AS run_lines,
              min(CASE WHEN stream = 'runs' THEN synced_at END) AS oldest_run_line
       FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1)`,
    );
    this.headOf = db.prepare(`SELECT batch_id, hash FROM ledger ORDER BY batch_id DESC LIMIT 1`);
    this.insertEntry = db.prepare(`INSERT INTO ledger (batch_id, hash, prev_hash, path, files, lines, key_id, published_at)
                                   VALUES (@batch_id, @hash, @prev_hash, @path, @files, @lines, @key_id, @published_at)`);
    this.entries = db.prepare(`SELECT batch_id, hash, prev_hash, path, files, lines, key_id FROM ledger ORDER BY batch_id`);
    this.genesisOf = db.prepare(
      `SELECT max(batch_id) AS batch_id, max(published_at) AS published_at, (SELECT count(*) FROM ledger) AS n FROM export_files`,
    );
    // AUTOINCREMENT hands out max(sqlite_sequence, max(id)) + 1: an id a record of the ledger took
    // outside export_batches (an erasure record) is reserved there, so no batch is planned under it.
    this.nextId = db.prepare(
      `SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'export_batches'), 0),
                  coalesce((SELECT max(id) FROM export_batches), 0),
                  coalesce((SELECT max(batch_id) FROM ledger), 0)) + 1 AS id`,
    );
    this.reserveId = db.prepare(`UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'export_batches'`);
    this.seedId = db.prepare(`INSERT INTO sqlite_sequence (name, seq) SELECT 'export_batches', ? WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'export_batches')`);
    this.deleteFile = db.prepare(`DELETE FROM export_files WHERE path = ?`);
    this.entryOf = db.prepare(`SELECT batch_id FROM ledger WHERE batch_id = ?`);
  }

  /**
   * The batch id the next record of the ledger takes: above every batch planned (published or
   * not, and every id handed out before) and every record recorded.
   */
  nextBatchId(): number {
    return this.nextId.get()!.id;
  }

  /** Reserves batch id `id` (an erasure record's): no batch is ever planned under it. Call inside a transaction. */
  reserveBatchId(id: number): void {
    if (this.reserveId.run(id).changes === 0) this.seedId.run(id);
  }

  /** Whether the ledger records a record of batch `id`. */
  recorded(id: number): boolean {
    return this.entryOf.get(id) !== undefined;
  }

  /**
   * Records an erasure record (see `Mirror.recordErasureRecord`): its ledger entry, and in
   * `export_files` each replaced path replaced by the rewritten file. Call inside a transaction,
   * after the compare-and-set of the head.
   */
  recordErasure(entry: LedgerEntry, files: readonly ReplacedFile[], publishedAt: string): void {
    this.insertEntry.run({ ...entry, published_at: publishedAt });
    for (const { from, file } of files) {
      this.deleteFile.run(from);
      this.insertFile.run({ ...file, now: publishedAt });
    }
  }

  /**
   * Records a retention record (see `Mirror.recordRetentionRecord`): its ledger entry, and each of
   * `paths` marked expired by it. Call inside a transaction, after the compare-and-set of the head.
   *
   * @throws {@link StoreError} when a path is not a file the archive holds (roll back)
   */
  recordRetention(entry: LedgerEntry, paths: readonly string[], publishedAt: string): void {
    this.insertEntry.run({ ...entry, published_at: publishedAt });
    for (const p of paths) {
      if (this.expire.run(entry.batch_id, p).changes !== 1) throw new StoreError(`retention record ${entry.batch_id}: ${p} is not a published file the archive holds`, { batch_id: entry.batch_id, file: p });
    }
  }

  /** Every file a retention record expired. */
  expired(): ExpiredFile[] {
    return this.expiredRows.all();
  }

  /** Change-log rows above the exported watermark (not yet published). */
  unexported(): number {
    return this.lag.get()!.n;
  }

  /** What waits above the exported watermark: see `Mirror.pendingExport`. */
  waiting(): PendingExport {
    const r = this.pendingOf.get()!;
    return { data: r.data, runLines: r.run_lines, oldestRunLineAt: r.oldest_run_line ?? undefined };
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
   * See {@link BatchReader.chunks}. An open-ended `last` stops at the highest seq there is when the
   * read starts, so rows committed meanwhile are left out of every partition alike.
   */
  chunksBetween(first: number, last: number): Generator<ExportChange[]> {
    return this.reader.chunks(first, Math.min(last, this.maxSeq.get()?.m ?? 0));
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
    // Usually nothing was committed after the batch was planned: then every payload goes at once.
    if (this.payloadAbove.get(batch.last_seq)!.n === 0) this.pruneAll.run();
    else this.prune.run(batch.last_seq);
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
