/**
 * Mirror: the local SQLite copy of the workspace (design: src/store/). This file is the typed
 * facade; the SQL lives with its table group:
 *
 * - `schema.ts` / `migrations.ts`: the schema version and its migrations;
 * - `open.ts` / `files.ts`: the writer's open and the read-only strategies, file fingerprints and
 *   private copies;
 * - `conversations.ts`, `messages.ts` (message pages, checkpoints, crawl pages, tombstones),
 *   `runs.ts`, `export-ledger.ts` (batches, files, watermark), `change-log.ts`, `status.ts`.
 *
 * better-sqlite3 in WAL mode. Pages commit with `synchronous=NORMAL` (group commit: a power cut may
 * take the last few commits back, each whole, and the crawl re-reads them); every export batch plan
 * commits with `synchronous=FULL`, the durable sync point that makes every change before it durable,
 * so a published seq is never lost and handed out again. Every write path commits in one transaction
 * together with its change-log rows and, for message pages, the conversation's checkpoint (design
 * habit 7); the transactions are opened here, the table groups run inside them.
 *
 * Trust no disk: every file and directory it creates is private (`FileModes`) whatever the umask;
 * read-only opens create and change nothing beside the file, and notice a writer that comes along
 * (see {@link MirrorOptions.readonly}, {@link Mirror.snapshotChanged}); SQLite errors that make the
 * file unusable (corruption, full disk, I/O errors) surface as `MirrorUnusableError`, and after
 * corruption nothing more is written.
 */
import type { Db } from './sqlite.js';
import { asMirrorError, isCorruptionCode, MirrorUnusableError, StoreError } from '../errors.js';
import type { Clock } from '../clock.js';
import { isoNow, systemClock } from '../clock.js';
import type { Conversation, Message, Page } from '../api/schemas.js';
import { writerIsLive } from './lock.js';
import { fileState, sameState, type FileState } from './files.js';
import { openConnection, type Connection } from './open.js';
import { ChangeLog, type RunChanges } from './change-log.js';
import { Conversations, type ConversationFilter, type ConversationListing, type CrawlState } from './conversations.js';
export type { ConversationFilter, ConversationListing, ConversationSummary, CrawlState } from './conversations.js';
import { Messages } from './messages.js';
import { Runs } from './runs.js';
import { ExportLedger, type LedgerGenesis } from './export-ledger.js';
import { MirrorStatus } from './status.js';
import { AuditReads, type HistoryRow, type RecordRow } from './audit.js';
import type {
  Checkpoint,
  ExportBatch,
  ExportChange,
  LedgerEntry,
  LedgerHead,
  ListOrder,
  MirrorAccess,
  MirrorOptions,
  PendingExport,
  PublishedFile,
  RunFailureRecord,
  RunFigures,
  RunStart,
  WriteCounts,
} from './types.js';

export { DEFAULT_ACCOUNT } from './types.js';
export type {
  ChangeOp,
  ChangeStream,
  Checkpoint,
  ExportBatch,
  ExportChange,
  LedgerEntry,
  LedgerHead,
  ListOrder,
  MirrorAccess,
  MirrorOptions,
  PendingExport,
  PublishedFile,
  RunFailureRecord,
  RunFigures,
  RunRefresh,
  RunScope,
  RunStart,
  RunTrigger,
  WriteCounts,
} from './types.js';
export { signalOf } from './conversations.js';
export type { RunChanges } from './change-log.js';
export type { LedgerGenesis } from './export-ledger.js';
export type { HistoryRow, RecordRow } from './audit.js';

/**
 * The SQLite mirror. One instance per process and file; better-sqlite3 is synchronous, so every
 * method runs to completion without interleaving.
 *
 * Every public method throws {@link MirrorUnusableError} (naming {@link Mirror.file}) for SQLite
 * errors that make the mirror unusable: `MIRROR_CORRUPT` for a damaged file, `MIRROR_UNWRITABLE`
 * for a full disk, an I/O error or a read-only file. Once corruption was seen, every later write
 * of this instance throws that same error without touching the file. Write methods of a mirror
 * opened `readonly` throw {@link StoreError}. The connection is private: every statement is one of
 * the table groups'.
 */
export class Mirror {
  private readonly db: Db;
  /** Absolute path of the SQLite file (`:memory:` for an in-memory mirror). */
  readonly file: string;
  /** How this instance reads its file; see {@link MirrorOptions.readonly}. */
  readonly access: MirrorAccess;
  private readonly clock: Clock;
  private readonly readOnly: boolean;
  private readonly release: () => void;
  /** For an `'immutable'` open: the file and its `-wal` as they were just before the open. */
  private readonly openedState: FileState | undefined;
  /** Set at the first corruption seen: from then on this instance writes nothing. */
  private damaged: MirrorUnusableError | undefined;

  private readonly changes: ChangeLog;
  private readonly conversations: Conversations;
  private readonly messages: Messages;
  private readonly runs: Runs;
  private readonly ledger: ExportLedger;
  private readonly status: MirrorStatus;
  private readonly audit: AuditReads;

  /** See {@link MirrorOptions.onPlanCommit}. */
  private readonly onPlanCommit: ((synchronous: number) => void) | undefined;

  private constructor(c: Connection, clock: Clock, onPlanCommit?: (synchronous: number) => void) {
    this.onPlanCommit = onPlanCommit;
    this.db = c.db;
    this.file = c.file;
    this.access = c.access;
    this.release = c.release;
    this.openedState = c.openedState;
    this.clock = clock;
    this.readOnly = c.access !== 'read-write';
    const changes = new ChangeLog(c.db);
    this.changes = changes;
    this.conversations = new Conversations(c.db, changes);
    this.messages = new Messages(c.db, changes);
    this.runs = new Runs(c.db);
    this.ledger = new ExportLedger(c.db);
    this.status = new MirrorStatus(c.db);
    this.audit = new AuditReads(c.db);
  }

  /**
   * Opens the mirror at `file`. A writer (the default) creates what is missing (parent directories
   * and the file, with `opts.modes`), takes the writer lock, switches to WAL and applies pending
   * migrations. With `readonly`, see {@link MirrorOptions.readonly}.
   *
   * @param file - path of the SQLite file (made absolute: a name starting with `file:` is a plain
   *   path, never a URI), or `:memory:`
   * @param opts - see {@link MirrorOptions}
   * @throws {@link MirrorUnusableError} naming the file (code `MIRROR_CORRUPT`) when it is not a
   *   database or is damaged; for a writer also (`MIRROR_UNWRITABLE`) when SQLite cannot open or
   *   write it (full disk, I/O error, read-only or unopenable file)
   * @throws {@link StoreError} naming the file when its directory cannot be created, it is not a
   *   convo-mirror database, it was written by a newer version, another live process holds its
   *   writer lock; with `readonly`, when it does not exist, its schema is older than this code
   *   (read-only opens never migrate), or its `-wal` must be read from a private copy that cannot
   *   be made (no room or no temp directory)
   */
  static open(file: string, opts: MirrorOptions = {}): Mirror {
    const clock = opts.clock ?? systemClock;
    return openConnection(file, opts, (c) => new Mirror(c, clock, opts.onPlanCommit));
  }

  /** Runs `f`, turning SQLite errors that make the mirror unusable into {@link MirrorUnusableError}. */
  private guard<T>(f: () => T): T {
    try {
      return f();
    } catch (err) {
      const e = asMirrorError(err, this.file);
      if (e instanceof MirrorUnusableError && e.code === 'MIRROR_CORRUPT') this.damaged ??= e;
      throw e;
    }
  }

  /**
   * {@link guard} for methods that write: refused on a read-only mirror, and on one found damaged
   * (nothing more is written to a corrupt file).
   */
  private write<T>(f: () => T): T {
    if (this.readOnly) throw new StoreError(`the mirror ${this.file} was opened read-only: nothing can be written to it`, { file: this.file });
    if (this.damaged) throw this.damaged;
    return this.guard(f);
  }

  /** {@link write} of `f` in one immediate transaction. */
  private writeTx<T>(f: () => T): T {
    return this.write(() => this.db.transaction(f).immediate());
  }

  private now(): string {
    return isoNow(this.clock);
  }

  // ---------------------------------------------------------------- runs

  /**
   * Records the start of a run (status `running`) with its scope, refresh and trigger (the legacy
   * `mode` column gets the scope).
   *
   * @returns the new run id
   */
  startRun(run: RunStart): number {
    return this.write(() => this.runs.start(run, this.now()));
  }

  /**
   * Marks runs still `running` as `interrupted`: their process died. Each gets its `runs`
   * change-log row, like any run that ends ({@link finishRun}). Call once at start-up while holding
   * the writer lock (then no other process can have a live run), never while runs of this process
   * are in flight.
   *
   * @returns how many runs were marked
   */
  markInterruptedRuns(): number {
    return this.writeTx(() => {
      const ids = this.runs.runningIds();
      for (const id of ids) this.endRun(id, { status: 'interrupted' }, this.now());
      return ids.length;
    });
  }

  /** Records a run's end and appends its `runs` change-log row; call inside a transaction. */
  private endRun(runId: number, figures: RunFigures, now: string): void {
    const head = this.ledger.head() ?? null;
    this.runs.finish(runId, figures, now, head);
    const line = this.runs.lineRecord(runId, head);
    if (line) this.changes.appendRun(runId, line.accountId, line.record, line.endedAt);
  }

  /**
   * Resumes a run whose process died, so its work continues under the same run id: a run
   * `interrupted` goes back to `running` (`ended_at` and `error` cleared, `resumes` + 1).
   *
   * @returns `'running'` when the run is still running (nothing changed), `'resumed'` when it was
   *   `interrupted` and is running again, `'ended'` when it finished (`succeeded`, `partial`,
   *   `failed`) or there is no such run (nothing changed)
   */
  resumeRun(runId: number): 'running' | 'resumed' | 'ended' {
    return this.writeTx(() => this.runs.resume(runId));
  }

  /**
   * What a run changed, counted from its change-log rows (messages and conversations inserted,
   * updated, tombstoned), whichever process or job attempt committed them.
   */
  runChanges(runId: number): RunChanges {
    return this.guard(() => this.changes.changesOfRun(runId));
  }

  /** A run's status (`running`, `succeeded`, `partial`, `failed`, `interrupted`); undefined for an unknown id. */
  runStatus(runId: number): string | undefined {
    return this.guard(() => this.runs.status(runId));
  }

  /** Whether a run has ended (any final status). */
  runEnded(runId: number): boolean {
    return this.guard(() => {
      const status = this.runs.status(runId);
      return status !== undefined && status !== 'running';
    });
  }

  /**
   * Records a run's end in one transaction: `ended_at` now, the figures given, the chain head as
   * it stands (`ledger_batch_id`, `ledger_hash`), and the run's `runs` change-log row (its record:
   * see `Runs.lineRecord`; `insert` the first time the run ends, `update` after that), which the
   * next publication exports. Record the run's failures first: the row lists them.
   */
  finishRun(runId: number, figures: RunFigures): void {
    this.writeTx(() => this.endRun(runId, figures, this.now()));
  }

  /**
   * Sets the chain head a run left (`runs.ledger_batch_id`, `runs.ledger_hash`): after its own
   * `runs` row was published, the head is later than the one {@link finishRun} recorded.
   */
  setRunLedgerHead(runId: number, head: LedgerHead | undefined): void {
    this.write(() => this.runs.setLedgerHead(runId, head ?? null));
  }

  /**
   * Records the conversations that failed in a run (by id, with each error's code, status, attempts
   * and message), replacing what was recorded for that run before: recording twice (a retried
   * finish step) keeps one row per failure.
   */
  recordFailures(runId: number, failures: RunFailureRecord[]): void {
    this.write(() => {
      const at = this.now();
      this.db.transaction(() => this.runs.recordFailures(runId, failures, at)).immediate();
    });
  }

  /** The last `limit` runs, newest first (every column of `runs`). */
  lastRuns(limit: number): Record<string, unknown>[] {
    return this.guard(() => this.runs.last(limit));
  }

  /** Failures recorded for the newest finished run. */
  lastRunFailures(): Record<string, unknown>[] {
    return this.guard(() => this.runs.lastFailures());
  }

  /** Live (not tombstoned) conversations and messages of one account. */
  liveCounts(accountId: string): { conversations: number; messages: number } {
    return this.guard(() => ({ conversations: this.conversations.countLive(accountId), messages: this.messages.countLive(accountId) }));
  }

  // ---------------------------------------------------------------- conversations

  /**
   * Upserts one page of the conversation list in one transaction, appending a change-log row for
   * each insert or update; unchanged rows are not written. A tombstoned conversation listed again
   * is revived (an `insert`) with no completed crawl (`message_count` and `crawled_signal` NULL), so
   * the next sync crawls all of it.
   */
  upsertConversations(accountId: string, page: Page<Conversation>, runId: number | null): WriteCounts {
    return this.write(() => {
      const now = this.now();
      return this.db.transaction(() => this.conversations.upsertPage(accountId, page, runId, now)).immediate();
    });
  }

  /**
   * Forgets the change signal a conversation was last crawled at (`crawled_signal = NULL`), so the
   * next incremental sync asks the API about it whatever its signal says (e.g. after it failed in
   * a run). Its message count and messages are kept: that sync may still crawl incrementally.
   * Nothing happens for an unknown conversation.
   */
  forgetCrawlBaseline(accountId: string, conversationId: string): void {
    this.write(() => this.conversations.forgetSignal(accountId, conversationId));
  }

  /** Whether the mirror has a row (live or tombstoned) for this conversation. */
  hasConversation(accountId: string, conversationId: string): boolean {
    return this.guard(() => this.conversations.has(accountId, conversationId));
  }

  /** Ids of conversations mirrored and not tombstoned. */
  liveConversationIds(accountId: string): string[] {
    return this.guard(() => this.conversations.liveIds(accountId));
  }

  /**
   * The mirrored conversations `filter` matches (see {@link ConversationFilter}; by default every
   * live one of every account), newest served update first, each with its live message count,
   * served status and update time, and the end of its last complete crawl (`last_synced_at`); and
   * how many match in all, `filter.limit` aside. Read in one read transaction (a consistent pair
   * on any open, read-only included); writes nothing.
   *
   * @throws RangeError when `filter.limit` is not a whole number >= 0
   */
  listConversations(filter: ConversationFilter = {}): ConversationListing {
    return this.guard(() => this.db.transaction(() => this.conversations.list(filter)).deferred());
  }

  /**
   * Ids of conversations mirrored and not tombstoned that `shown` does not hold (e.g. what a
   * complete listing no longer shows), sorted. Memory: what it returns, not every live id.
   */
  liveConversationIdsNotIn(accountId: string, shown: ReadonlySet<string>): string[] {
    return this.guard(() => this.conversations.liveIdsNotIn(accountId, shown));
  }

  /**
   * Ids of live conversations whose last crawl did not complete at a known change signal (never
   * crawled to the end, or failed: see {@link forgetCrawlBaseline}): an incremental listing that
   * stops early crawls them even though it did not list them.
   */
  unsettledConversationIds(accountId: string): string[] {
    return this.guard(() => this.conversations.unsettledIds(accountId));
  }

  /**
   * Tombstones a conversation the API answered 404 for, and its live messages, in one transaction,
   * with `delete` change-log rows (the messages' first). Nothing is hard-deleted.
   */
  tombstoneConversation(accountId: string, conversationId: string, runId: number | null): { conversation: boolean; messages: number } {
    return this.write(() => {
      const now = this.now();
      return this.db
        .transaction(() => {
          const messages = this.messages.tombstoneLive(accountId, conversationId, now, runId);
          const conversation = this.conversations.tombstone(accountId, conversationId, now, runId);
          this.messages.clearCrawl(accountId, conversationId);
          return { conversation, messages };
        })
        .immediate();
    });
  }

  // ---------------------------------------------------------------- message crawls

  /** The committed checkpoint of an unfinished crawl, if any. */
  loadCheckpoint(accountId: string, conversationId: string): Checkpoint | undefined {
    return this.guard(() => this.messages.loadCheckpoint(accountId, conversationId));
  }

  /** Forgets a crawl's checkpoint and seen ids (the crawl restarts from page 1). */
  resetCrawl(accountId: string, conversationId: string): void {
    this.writeTx(() => this.messages.clearCrawl(accountId, conversationId));
  }

  /**
   * Commits one page of a conversation's messages in one transaction: the conversation's row if
   * missing or tombstoned (see the stand-in and revival rules of {@link upsertConversations}),
   * upserts (unchanged rows are skipped), a change-log row per insert or update, the superseded
   * version of each edited message in `message_history`, the page's ids and the checkpoint
   * (`next_page = page + 1`).
   *
   * Positions are `(page - 1) * 100 + index` (spec 4.1: chronological order, per_page=100).
   */
  commitMessagesPage(accountId: string, conversationId: string, page: Page<Message>, runId: number | null): WriteCounts {
    return this.write(() => {
      const now = this.now();
      return this.db
        .transaction(() => {
          this.conversations.ensure(accountId, conversationId, now, runId);
          return this.messages.commitPage(accountId, conversationId, page, runId, now);
        })
        .immediate();
    });
  }

  /**
   * Completes a crawl in one transaction: tombstones live messages not served by any page of this
   * crawl (with `delete` change-log rows), sets the conversation's `message_count` and
   * `last_synced_at`, records the conversation's `changeField` signal (when given) as the baseline
   * of the next incremental sync, and clears the checkpoint. Call only after the last page was committed.
   *
   * @returns messages tombstoned and the number served in this crawl
   */
  completeCrawl(accountId: string, conversationId: string, runId: number | null, changeField?: string): { deleted: number; messageCount: number } {
    return this.write(() => {
      const now = this.now();
      return this.db
        .transaction(() => {
          const deleted = this.messages.tombstoneUnseen(accountId, conversationId, now, runId);
          const messageCount = this.messages.seenCount(accountId, conversationId);
          this.conversations.ensure(accountId, conversationId, now, runId);
          this.conversations.finishCrawl(accountId, conversationId, messageCount, now, changeField);
          this.messages.clearCrawl(accountId, conversationId);
          return { deleted, messageCount };
        })
        .immediate();
    });
  }

  // ---------------------------------------------------------------- incremental sync

  /**
   * What the last complete listing of `accountId` found of the list's order (see `ListOrder`);
   * undefined before any (or when the record cannot be read back).
   */
  listOrder(accountId: string): ListOrder | undefined {
    const text = this.guard(() => this.status.meta(`list_order:${accountId}`));
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text) as ListOrder;
    } catch {
      return undefined;
    }
  }

  /** Records what a listing of `accountId` found of the list's order (replacing the previous record). */
  recordListOrder(accountId: string, order: ListOrder): void {
    this.write(() => this.status.setMeta(`list_order:${accountId}`, JSON.stringify(order)));
  }

  /**
   * What the last complete crawl of a conversation left: its message count and the change signal
   * it was crawled at. `messageCount` is null when no crawl ever completed.
   */
  crawlState(accountId: string, conversationId: string): CrawlState {
    return this.guard(() => this.conversations.crawlState(accountId, conversationId));
  }

  /** Id of the live message at `position` (0-based, chronological), if any. */
  messageIdAt(accountId: string, conversationId: string, position: number): string | undefined {
    return this.guard(() => this.messages.idAt(accountId, conversationId, position));
  }

  /**
   * Starts an incremental crawl: the live messages before `beforePosition` count as seen (as a
   * pseudo page 0 of the crawl), so completing the crawl tombstones only what the fetched pages no
   * longer serve. Clears any previous crawl state first.
   *
   * @returns the seeded ids
   */
  seedIncrementalCrawl(accountId: string, conversationId: string, beforePosition: number): string[] {
    return this.writeTx(() => this.messages.seedIncremental(accountId, conversationId, beforePosition));
  }

  // ---------------------------------------------------------------- export ledger

  /** The exported watermark: the last `change_log.seq` published. */
  exportWatermark(): number {
    return this.guard(() => this.ledger.watermark());
  }

  /**
   * Change-log rows not yet published (above the exported watermark): the export lag. Cheap (a
   * range of the primary key), for a metrics scrape.
   */
  unexportedChanges(): number {
    return this.guard(() => this.ledger.unexported());
  }

  /**
   * What waits above the exported watermark: changes of messages and conversations, and run lines
   * with the time of the oldest. Costs what lies above the watermark (a range of the primary key).
   */
  pendingExport(): PendingExport {
    return this.guard(() => this.ledger.waiting());
  }

  /**
   * The batch to publish, in one transaction: the planned, unpublished one left by an interrupted
   * publication (`resumed`), else a new batch over `(watermark, max(seq)]`, its range fixed before
   * any file is written. Undefined when nothing waits.
   *
   * @param plannedAt - ISO 8601 UTC time recorded on a new batch
   * @param gzip - whether a new batch's files are gzipped (a resumed batch keeps its own choice)
   */
  planExportBatch(runId: number | null, plannedAt: string, gzip = false): ExportBatch | undefined {
    // The durable sync point: pages commit with synchronous=NORMAL (a power cut may take the last
    // commits back), so the plan commits with FULL, whose fsync of the WAL makes every change
    // before it durable too. No seq in a published file can be lost and handed out again.
    return this.write(() => {
      this.db.pragma('synchronous = FULL');
      try {
        return this.db
          .transaction(() => {
            const batch = this.ledger.plan(runId, plannedAt, gzip);
            this.onPlanCommit?.(this.db.pragma('synchronous', { simple: true }) as number);
            return batch;
          })
          .immediate();
      } finally {
        this.db.pragma('synchronous = NORMAL');
      }
    });
  }

  /**
   * The change-log rows of a batch, in file order: by stream, account, UTC day of `synced_at`, seq.
   * Streamed (bounded memory). Each row carries the record (`record`), or on a row written before
   * schema version 6 its finished line (`line`); `exportLine` (src/export/lines.ts) makes the
   * export line of either.
   */
  *changesOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): Generator<ExportChange> {
    for (const chunk of this.changeChunksOf(batch)) yield* chunk;
  }

  /**
   * {@link changesOf} in chunks of up to 1,000 rows, for the exporter (one step per chunk instead
   * of one per row). Each chunk is read whole, so a reader that stops early holds no statement.
   */
  *changeChunksOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): Generator<ExportChange[]> {
    const chunks = this.guard(() => this.ledger.chunksBetween(batch.first_seq, batch.last_seq));
    // Each step reads pages too: a damaged one surfaces here, converted like any other read.
    for (let r = this.guard(() => chunks.next()); !r.done; r = this.guard(() => chunks.next())) yield r.value;
  }

  /**
   * Records a published batch in one transaction: its files, its ledger entry (the new chain
   * head), the batch marked published, and the watermark moved to its last seq. Call only once
   * every file, the batch record and the manifest are in place.
   *
   * The same transaction prunes the payloads of the changes published (see `change_payloads`);
   * then the pages that freed go back to the file system (`PRAGMA incremental_vacuum`, on a file
   * with incremental auto-vacuum), so the file stays near the size of what it mirrors.
   *
   * @param publishedAt - ISO 8601 UTC time recorded on the files, the entry and the batch
   */
  recordPublication(batch: Pick<ExportBatch, 'id' | 'last_seq'>, files: PublishedFile[], entry: LedgerEntry, publishedAt: string): void {
    this.writeTx(() => this.ledger.record(batch, files, entry, publishedAt));
    this.write(() => this.db.pragma('incremental_vacuum'));
  }

  /**
   * What the genesis record of an export directory published before the ledger existed must
   * cover (every recorded file); undefined when the ledger has records or nothing was published.
   */
  ledgerGenesis(): LedgerGenesis | undefined {
    return this.guard(() => this.ledger.genesis());
  }

  /** Records the genesis record of a migrated export directory (the first chain head). */
  recordLedgerGenesis(entry: LedgerEntry, publishedAt: string): void {
    this.writeTx(() => this.ledger.recordGenesis(entry, publishedAt));
  }

  /** The chain head: the last batch record published; undefined before the first. */
  ledgerHead(): LedgerHead | undefined {
    return this.guard(() => this.ledger.head());
  }

  /** Id of the export batch planned and not yet published (left by an interrupted publication), if any. */
  pendingExportBatch(): number | undefined {
    return this.guard(() => this.ledger.pendingBatch());
  }

  /** Every ledger entry as recorded, genesis first. */
  ledgerEntries(): LedgerEntry[] {
    return this.guard(() => this.ledger.ledgerEntries());
  }

  /** Every published export file as recorded, by first seq then path. */
  publishedFiles(): PublishedFile[] {
    return this.guard(() => this.ledger.publishedFiles());
  }

  /** Published files and lines in all, and whether any batch was ever published. */
  exportTotals(): { files: number; lines: number; everPublished: boolean } {
    return this.guard(() => this.ledger.totals());
  }

  // ---------------------------------------------------------------- audit (verify --deep)

  /** Streams a statement's rows, each step guarded; a reader that stops early releases it. */
  private *stream<T>(rows: IterableIterator<T>): Generator<T> {
    try {
      for (let r = this.guard(() => rows.next()); !r.done; r = this.guard(() => rows.next())) yield r.value;
    } finally {
      rows.return?.();
    }
  }

  /** Every message or conversation row (tombstoned ones too), by key, with its record as served. */
  auditRecords(table: 'messages' | 'conversations'): Generator<RecordRow> {
    return this.stream(this.guard(() => this.audit[table].iterate()));
  }

  /** Every `message_history` row, by the seq of the update that replaced it. */
  auditHistory(): Generator<HistoryRow> {
    return this.stream(this.guard(() => this.audit.history.iterate()));
  }

  /**
   * Every run with its status and the record its `runs` change-log row would carry now (without a
   * chain head: see `Runs.lineRecord`).
   */
  auditRuns(): { id: number; status: string; accountId: string; record: string }[] {
    return this.guard(() =>
      this.audit.runs.all().map((r) => {
        const line = this.runs.lineRecord(r.id, null)!;
        return { id: r.id, status: r.status, accountId: line.accountId, record: line.record };
      }),
    );
  }

  // ---------------------------------------------------------------- reading

  /** This mirror's random id (32 hex digits), fixed at creation. */
  mirrorId(): string {
    return this.guard(() => this.status.mirrorId());
  }

  /** Row counts for `status`. */
  counts(): Record<string, number> {
    return this.guard(() => this.status.counts());
  }

  /**
   * SQLite's `PRAGMA quick_check` of the whole file (every page and b-tree, not index contents).
   *
   * @returns the problems found; `[]` when the file is sound. A corruption error raised while
   *   checking is reported as one problem.
   * @throws {@link MirrorUnusableError} for an I/O error while reading
   */
  quickCheck(): string[] {
    try {
      const rows = this.db.pragma('quick_check') as { quick_check: string }[];
      const problems = rows.map((r) => r.quick_check);
      return problems.length === 1 && problems[0] === 'ok' ? [] : problems;
    } catch (err) {
      const code = (err as { code?: unknown } | null)?.code;
      if (typeof code === 'string' && isCorruptionCode(code)) return [`${code}: ${(err as Error).message}`];
      throw asMirrorError(err, this.file);
    }
  }

  /**
   * Whether what this instance reads may no longer be the file: true for an `'immutable'` open
   * when, since it was opened, the file changed (inode, size or times), a `-wal` appeared or
   * changed, or a writer holds the lock. SQLite assumes an immutable file never changes, so results
   * read from it after a writer came along may be wrong (even reported as corruption): reopen and
   * read again (the next open sees the writer or its `-wal`). Always false for a writer, a
   * `'shared'` connection (SQLite sees the writer's commits) and a `'private-copy'` (nobody else
   * writes it), and after the instance was closed.
   *
   * Checks the file system (a few `stat` calls and one read of `<file>.lock`); call it once a
   * result is complete, before trusting it.
   */
  snapshotChanged(): boolean {
    const opened = this.openedState;
    if (!opened || !this.db.open) return false;
    return !sameState(opened, fileState(this.file)) || writerIsLive(this.file);
  }

  /**
   * Opens `file` read-only, runs `compute` on it and returns its result once it was computed on a
   * snapshot no writer changed under it ({@link Mirror.snapshotChanged} false): otherwise closes,
   * reopens and computes again, at most `attempts` times in all (the result of the last attempt
   * is returned). An error thrown by `compute` on a changed snapshot is retried the same way;
   * otherwise it is thrown. The mirror is always closed before this returns.
   *
   * @param file - see {@link Mirror.open}
   * @param compute - reads what it needs from the mirror; must not keep it
   * @param opts - `attempts` (default 3), `clock`, and `onSnapshot`, called after each computation
   *   and before the check (a failpoint for tests: e.g. a writer commits there)
   * @throws what {@link Mirror.open} throws for a read-only open; what `compute` throws
   */
  static readConsistent<R>(
    file: string,
    compute: (mirror: Mirror) => R,
    opts: { attempts?: number; clock?: Clock; onSnapshot?: (attempt: number, mirror: Mirror) => void } = {},
  ): R {
    const attempts = Math.max(1, opts.attempts ?? 3);
    for (let attempt = 1; ; attempt++) {
      const mirror = Mirror.open(file, { readonly: true, ...(opts.clock ? { clock: opts.clock } : {}) });
      try {
        let result: R;
        try {
          result = compute(mirror);
        } catch (err) {
          opts.onSnapshot?.(attempt, mirror);
          if (attempt < attempts && mirror.snapshotChanged()) continue;
          throw err;
        }
        opts.onSnapshot?.(attempt, mirror);
        if (attempt < attempts && mirror.snapshotChanged()) continue;
        return result;
      } finally {
        mirror.close();
      }
    }
  }

  /**
   * Closes the database (checkpointing the WAL unless read-only) and releases the writer lock; for
   * a `'private-copy'` read-only open, removes the private copy.
   */
  close(): void {
    try {
      if (this.db.open) this.guard(() => this.db.close());
    } finally {
      this.release();
    }
  }
}
