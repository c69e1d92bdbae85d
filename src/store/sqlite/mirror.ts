/**
 * The SQLite engine of the {@link Mirror} interface (design: src/store/sqlite/). This file is the
 * class; the SQL lives with its table group:
 *
 * - `schema.ts` / `migrations.ts`: the schema version and its migrations;
 * - `open.ts` / `files.ts`: the writer's open and the read-only strategies, file fingerprints and
 *   private copies;
 * - `conversations.ts`, `messages.ts` (message pages, checkpoints, crawl pages, tombstones),
 *   `runs.ts`, `export-ledger.ts` (batches, files, watermark), `change-log.ts`, `status.ts`,
 *   `erasures.ts` (erasures and the redaction of their subjects: src/store/redaction.ts).
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
import { asMirrorError, isCorruptionCode, MirrorUnusableError, StoreError } from '../../errors.js';
import type { Clock } from '../../clock.js';
import { isoNow, systemClock } from '../../clock.js';
import type { Conversation, Message, Page } from '../../api/schemas.js';
import type { Mirror } from '../mirror.js';
import { writerIsLive } from './lock.js';
import { fileState, sameState, type FileState } from './files.js';
import { openConnection, type Connection } from './open.js';
import { ChangeLog } from './change-log.js';
import { Conversations } from './conversations.js';
import { Messages } from './messages.js';
import { Runs } from './runs.js';
import { ExportLedger } from './export-ledger.js';
import { MirrorStatus } from './status.js';
import { AuditReads } from './audit.js';
import { Erasures } from './erasures.js';
import { checkErasureRequest, pageRetentionFloor, pageSenderIds, redactConversationsPage, redactMessagesPage } from '../redaction.js';
import type {
  Checkpoint,
  ConversationFilter,
  ConversationListing,
  CrawlState,
  ErasureRequest,
  ErasureResult,
  ErasureRow,
  ErasureSubject,
  ReplacedFile,
  ExpiredFile,
  SubjectLine,
  ExportBatch,
  ExportChange,
  HistoryRow,
  LedgerEntry,
  LedgerGenesis,
  LedgerHead,
  ListOrder,
  MirrorAccess,
  MirrorOptions,
  PublisherLease,
  PendingExport,
  PublishedFile,
  RecordRow,
  RunChanges,
  RunFailureRecord,
  RunFigures,
  RunStart,
  WriteCounts,
} from '../types.js';

/** The lease of the only publisher a SQLite mirror can have (its writer). */
const SOLE_PUBLISHER: PublisherLease = Object.freeze({ lost: false, release: async () => {} });

/**
 * The SQLite mirror: one file, one writer process (the writer lock, `<file>.lock`). One instance
 * per process and file. better-sqlite3 is synchronous: every method's body runs to completion
 * (one transaction) without interleaving, and its promise is settled when it returns.
 *
 * Errors as {@link Mirror} says, naming {@link SqliteMirror.file}: `MIRROR_CORRUPT` for a damaged
 * file, `MIRROR_UNWRITABLE` for a full disk, an I/O error or a read-only file. Once corruption was
 * seen, every later write of this instance rejects with that same error without touching the file.
 * The connection is private: every statement is one of the table groups'.
 */
export class SqliteMirror implements Mirror {
  readonly engine = 'sqlite' as const;
  private readonly db: Db;
  /** Absolute path of the SQLite file (`:memory:` for an in-memory mirror). */
  readonly file: string;
  /** {@link file}. */
  readonly location: string;
  /** {@link file}. */
  readonly localFile: string;
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
  private readonly erasures_: Erasures;

  /** See {@link MirrorOptions.onPlanCommit}. */
  private readonly onPlanCommit: ((synchronous: number) => void) | undefined;

  private constructor(c: Connection, clock: Clock, onPlanCommit?: (synchronous: number) => void) {
    this.onPlanCommit = onPlanCommit;
    this.db = c.db;
    this.file = c.file;
    this.location = c.file;
    this.localFile = c.file;
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
    this.erasures_ = new Erasures(c.db);
  }

  /**
   * Opens the mirror at `file`, synchronously (callers outside src/store use `openMirror`). A
   * writer (the default) creates what is missing (parent directories and the file, with
   * `opts.modes`), takes the writer lock, switches to WAL and applies pending migrations. With
   * `readonly`, see {@link MirrorOptions.readonly}.
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
  static open(file: string, opts: MirrorOptions = {}): SqliteMirror {
    const clock = opts.clock ?? systemClock;
    return openConnection(file, opts, (c) => new SqliteMirror(c, clock, opts.onPlanCommit));
  }

  // ---------------------------------------------------------------- writers kept apart

  /** The writer lock already keeps every other writer out of this file: runs `fn`. */
  async withConversationLock<T>(_accountId: string, _conversationId: string, fn: () => Promise<T>): Promise<T> {
    return fn();
  }

  /** The writer lock already keeps every other writer out of this file: runs `fn`. */
  async withListingLock<T>(_accountId: string, fn: () => Promise<T>): Promise<T> {
    return fn();
  }

  /** The writer lock makes this process the mirror's only publisher: always granted, never lost. */
  async tryPublisherLock(): Promise<PublisherLease | undefined> {
    return SOLE_PUBLISHER;
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

  async startRun(run: RunStart): Promise<number> {
    return this.write(() => this.runs.start(run, this.now()));
  }

  async markInterruptedRuns(): Promise<number> {
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

  async resumeRun(runId: number): Promise<'running' | 'resumed' | 'ended'> {
    return this.writeTx(() => this.runs.resume(runId));
  }

  async runChanges(runId: number): Promise<RunChanges> {
    return this.guard(() => this.changes.changesOfRun(runId));
  }

  async runStatus(runId: number): Promise<string | undefined> {
    return this.guard(() => this.runs.status(runId));
  }

  async runEnded(runId: number): Promise<boolean> {
    return this.guard(() => {
      const status = this.runs.status(runId);
      return status !== undefined && status !== 'running';
    });
  }

  async finishRun(runId: number, figures: RunFigures): Promise<void> {
    this.writeTx(() => this.endRun(runId, figures, this.now()));
  }

  async setRunLedgerHead(runId: number, head: LedgerHead | undefined): Promise<void> {
    this.write(() => this.runs.setLedgerHead(runId, head ?? null));
  }

  async recordFailures(runId: number, failures: RunFailureRecord[]): Promise<void> {
    this.write(() => {
      const at = this.now();
      this.db.transaction(() => this.runs.recordFailures(runId, failures, at)).immediate();
    });
  }

  async lastRuns(limit: number): Promise<Record<string, unknown>[]> {
    return this.guard(() => this.runs.last(limit));
  }

  async lastRunFailures(): Promise<Record<string, unknown>[]> {
    return this.guard(() => this.runs.lastFailures());
  }

  async liveCounts(accountId: string): Promise<{ conversations: number; messages: number }> {
    return this.guard(() => ({ conversations: this.conversations.countLive(accountId), messages: this.messages.countLive(accountId) }));
  }

  // ---------------------------------------------------------------- conversations

  async upsertConversations(accountId: string, page: Page<Conversation>, runId: number | null): Promise<WriteCounts> {
    return this.write(() => {
      const now = this.now();
      return this.db
        .transaction(() => {
          const erased = this.erasures_.conversationsInForce(accountId, page.data.map((c) => c.id));
          return this.conversations.upsertPage(accountId, redactConversationsPage(page, erased), runId, now);
        })
        .immediate();
    });
  }

  async forgetCrawlBaseline(accountId: string, conversationId: string): Promise<void> {
    this.write(() => this.conversations.forgetSignal(accountId, conversationId));
  }

  async hasConversation(accountId: string, conversationId: string): Promise<boolean> {
    return this.guard(() => this.conversations.has(accountId, conversationId));
  }

  async liveConversationIds(accountId: string): Promise<string[]> {
    return this.guard(() => this.conversations.liveIds(accountId));
  }

  async listConversations(filter: ConversationFilter = {}): Promise<ConversationListing> {
    return this.guard(() => this.db.transaction(() => this.conversations.list(filter)).deferred());
  }

  async liveConversationIdsNotIn(accountId: string, shown: ReadonlySet<string>): Promise<string[]> {
    return this.guard(() => this.conversations.liveIdsNotIn(accountId, shown));
  }

  async unsettledConversationIds(accountId: string): Promise<string[]> {
    return this.guard(() => this.conversations.unsettledIds(accountId));
  }

  async tombstoneConversation(accountId: string, conversationId: string, runId: number | null): Promise<{ conversation: boolean; messages: number }> {
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

  async loadCheckpoint(accountId: string, conversationId: string): Promise<Checkpoint | undefined> {
    return this.guard(() => this.messages.loadCheckpoint(accountId, conversationId));
  }

  async resetCrawl(accountId: string, conversationId: string): Promise<void> {
    this.writeTx(() => this.messages.clearCrawl(accountId, conversationId));
  }

  async commitMessagesPage(accountId: string, conversationId: string, page: Page<Message>, runId: number | null): Promise<WriteCounts> {
    return this.write(() => {
      const now = this.now();
      return this.db
        .transaction(() => {
          // Erasures in force first: an erased message is compared and written as its marker.
          const inForce = this.erasures_.inForce(accountId, conversationId, pageSenderIds(page), pageRetentionFloor(page));
          this.conversations.ensure(accountId, conversationId, now, runId, inForce.conversation);
          return this.messages.commitPage(accountId, conversationId, redactMessagesPage(page, inForce), runId, now);
        })
        .immediate();
    });
  }

  async completeCrawl(accountId: string, conversationId: string, runId: number | null, changeField?: string): Promise<{ deleted: number; messageCount: number }> {
    return this.write(() => {
      const now = this.now();
      return this.db
        .transaction(() => {
          const deleted = this.messages.tombstoneUnseen(accountId, conversationId, now, runId);
          const messageCount = this.messages.seenCount(accountId, conversationId);
          this.conversations.ensure(accountId, conversationId, now, runId, this.erasures_.inForce(accountId, conversationId, []).conversation);
          this.conversations.finishCrawl(accountId, conversationId, messageCount, now, changeField);
          this.messages.clearCrawl(accountId, conversationId);
          return { deleted, messageCount };
        })
        .immediate();
    });
  }

  // ---------------------------------------------------------------- incremental sync

  async listOrder(accountId: string): Promise<ListOrder | undefined> {
    const text = this.guard(() => this.status.meta(`list_order:${accountId}`));
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text) as ListOrder;
    } catch {
      return undefined;
    }
  }

  async recordListOrder(accountId: string, order: ListOrder): Promise<void> {
    this.write(() => this.status.setMeta(`list_order:${accountId}`, JSON.stringify(order)));
  }

  async crawlState(accountId: string, conversationId: string): Promise<CrawlState> {
    return this.guard(() => this.conversations.crawlState(accountId, conversationId));
  }

  async messageIdAt(accountId: string, conversationId: string, position: number): Promise<string | undefined> {
    return this.guard(() => this.messages.idAt(accountId, conversationId, position));
  }

  async seedIncrementalCrawl(accountId: string, conversationId: string, beforePosition: number): Promise<string[]> {
    return this.writeTx(() => this.messages.seedIncremental(accountId, conversationId, beforePosition));
  }

  // ---------------------------------------------------------------- export ledger

  async exportWatermark(): Promise<number> {
    return this.guard(() => this.ledger.watermark());
  }

  async unexportedChanges(): Promise<number> {
    return this.guard(() => this.ledger.unexported());
  }

  async pendingExport(): Promise<PendingExport> {
    return this.guard(() => this.ledger.waiting());
  }

  async planExportBatch(runId: number | null, plannedAt: string, gzip = false): Promise<ExportBatch | undefined> {
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

  async *changesOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): AsyncGenerator<ExportChange> {
    for await (const chunk of this.changeChunksOf(batch)) yield* chunk;
  }

  async *changeChunksOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): AsyncGenerator<ExportChange[]> {
    const chunks = this.guard(() => this.ledger.chunksBetween(batch.first_seq, batch.last_seq));
    // Each step reads pages too: a damaged one surfaces here, converted like any other read.
    for (let r = this.guard(() => chunks.next()); !r.done; r = this.guard(() => chunks.next())) yield r.value;
  }

  // The pages the pruned payloads freed go back to the file system (`PRAGMA incremental_vacuum`,
  // on a file with incremental auto-vacuum).
  async recordPublication(batch: Pick<ExportBatch, 'id' | 'last_seq'>, files: PublishedFile[], entry: LedgerEntry, publishedAt: string): Promise<void> {
    this.writeTx(() => {
      // The compare-and-set both engines make (one writer here, so it only ever catches a bug).
      const head = this.ledger.head();
      if ((head?.hash ?? null) !== entry.prev_hash) {
        throw new StoreError(
          `export batch ${batch.id} not recorded: the ledger head is ${head ? `${head.batch_id}:${head.hash}` : 'none'}, not the head its record chains on (${entry.prev_hash ?? 'none'}). Nothing was changed`,
          { batch_id: batch.id },
          undefined,
          'LEDGER_FENCED',
        );
      }
      this.ledger.record(batch, files, entry, publishedAt);
    });
    this.write(() => this.db.pragma('incremental_vacuum'));
  }

  async ledgerGenesis(): Promise<LedgerGenesis | undefined> {
    return this.guard(() => this.ledger.genesis());
  }

  async recordLedgerGenesis(entry: LedgerEntry, publishedAt: string): Promise<void> {
    this.writeTx(() => this.ledger.recordGenesis(entry, publishedAt));
  }

  async ledgerHead(): Promise<LedgerHead | undefined> {
    return this.guard(() => this.ledger.head());
  }

  async pendingExportBatch(): Promise<number | undefined> {
    return this.guard(() => this.ledger.pendingBatch());
  }

  async ledgerEntries(): Promise<LedgerEntry[]> {
    return this.guard(() => this.ledger.ledgerEntries());
  }

  async publishedFiles(): Promise<PublishedFile[]> {
    return this.guard(() => this.ledger.publishedFiles());
  }

  async nextLedgerBatchId(): Promise<number> {
    return this.guard(() => this.ledger.nextBatchId());
  }

  /**
   * Records a retention record in one immediate transaction (see the interface): no pending batch,
   * the next id (reserved), the compare-and-set of the head, the entry, the expired files.
   */
  async recordRetentionRecord(entry: LedgerEntry, paths: readonly string[], publishedAt: string): Promise<void> {
    this.writeTx(() => {
      const fenced = (why: string) => new StoreError(`retention record ${entry.batch_id} not recorded: ${why}. Nothing was changed`, { batch_id: entry.batch_id }, undefined, 'LEDGER_FENCED');
      const pending = this.ledger.pendingBatch();
      if (pending !== undefined) throw fenced(`export batch ${pending} is planned and not published`);
      const head = this.ledger.head();
      if (entry.prev_hash === null || (head?.hash ?? null) !== entry.prev_hash) {
        throw fenced(`the ledger head is ${head ? `${head.batch_id}:${head.hash}` : 'none'}, not the head it chains on (${entry.prev_hash ?? 'none'})`);
      }
      const next = this.ledger.nextBatchId();
      if (entry.batch_id !== next) throw fenced(`the next batch id is ${next}`);
      this.ledger.reserveBatchId(next);
      this.ledger.recordRetention(entry, paths, publishedAt);
    });
  }

  async expiredFiles(): Promise<ExpiredFile[]> {
    return this.guard(() => this.ledger.expired());
  }

  async exportTotals(): Promise<{ files: number; lines: number; everPublished: boolean }> {
    return this.guard(() => this.ledger.totals());
  }

  // ---------------------------------------------------------------- erasure

  /**
   * Erases a subject (see `Mirror.eraseSubject`): one immediate transaction with SQLite's
   * `secure_delete` on (the bytes of the records replaced are zeroed in their pages, freed pages
   * too), then a `wal_checkpoint(TRUNCATE)` (best effort: readers may keep old frames in the WAL
   * until the next checkpoint). A dry run reads in one deferred transaction and writes nothing
   * (it works on a read-only mirror too).
   */
  async eraseSubject(request: ErasureRequest): Promise<ErasureResult> {
    checkErasureRequest(request);
    const now = this.now();
    if (request.dryRun === true) return this.guard(() => this.db.transaction(() => this.erasures_.erase(request, now, true)).deferred());
    const result = this.write(() => {
      const before = this.db.pragma('secure_delete', { simple: true }) as number;
      this.db.pragma('secure_delete = ON');
      try {
        return this.db.transaction(() => this.erasures_.erase(request, now, false)).immediate();
      } finally {
        this.db.pragma(`secure_delete = ${before === 0 ? 'OFF' : before === 1 ? 'ON' : 'FAST'}`);
      }
    });
    this.write(() => this.db.pragma('wal_checkpoint(TRUNCATE)'));
    return result;
  }

  async erasures(): Promise<ErasureRow[]> {
    return this.guard(() => this.erasures_.all());
  }

  async messageAccounts(): Promise<string[]> {
    return this.guard(() => this.erasures_.messageAccounts());
  }

  async recordErasureArchived(erasureId: number, doneAt: string): Promise<boolean> {
    const set = this.write(() => this.erasures_.setArchived(erasureId, doneAt));
    if (set === undefined) throw new StoreError(`no erasure ${erasureId} in the mirror ${this.file}`, { erasure_id: erasureId, file: this.file }, undefined, 'ERASURE_UNKNOWN');
    return set;
  }

  /** The subject's lines at or below `throughSeq` (see the interface), in one read transaction. */
  async subjectLines(subject: ErasureSubject, throughSeq: number): Promise<SubjectLine[]> {
    return this.guard(() => this.db.transaction(() => this.erasures_.subjectLines(subject, throughSeq)).deferred());
  }

  /**
   * Reserves the batch id of erasure `erasureId`'s record, in one immediate transaction (see the
   * interface).
   */
  async planErasureRecord(erasureId: number): Promise<number> {
    return this.writeTx(() => {
      const e = this.erasures_.get(erasureId);
      if (!e) throw new StoreError(`no erasure ${erasureId} in the mirror ${this.file}`, { erasure_id: erasureId, file: this.file }, undefined, 'ERASURE_UNKNOWN');
      const head = this.ledger.head();
      if (e.archiveBatchId !== null && (this.ledger.recorded(e.archiveBatchId) || head === undefined || e.archiveBatchId > head.batch_id)) return e.archiveBatchId;
      const pending = this.ledger.pendingBatch();
      if (pending !== undefined) {
        throw new StoreError(`erasure ${erasureId}: export batch ${pending} is planned and not published: publish it before the erasure record`, { erasure_id: erasureId, batch_id: pending }, undefined, 'LEDGER_FENCED');
      }
      const id = this.ledger.nextBatchId();
      this.ledger.reserveBatchId(id);
      this.erasures_.setArchiveBatch(erasureId, id);
      return id;
    });
  }

  /**
   * Records an erasure record in one immediate transaction (see the interface): the compare-and-set
   * of the head (one writer here, so it only ever catches a bug), the entry, the replaced files.
   */
  async recordErasureRecord(erasureId: number, entry: LedgerEntry, files: readonly ReplacedFile[], publishedAt: string): Promise<void> {
    this.writeTx(() => {
      const fenced = (why: string) => new StoreError(`erasure record ${entry.batch_id} not recorded: ${why}. Nothing was changed`, { batch_id: entry.batch_id, erasure_id: erasureId }, undefined, 'LEDGER_FENCED');
      const head = this.ledger.head();
      if (entry.prev_hash === null || (head?.hash ?? null) !== entry.prev_hash) {
        throw fenced(`the ledger head is ${head ? `${head.batch_id}:${head.hash}` : 'none'}, not the head it chains on (${entry.prev_hash ?? 'none'})`);
      }
      const reserved = this.erasures_.get(erasureId)?.archiveBatchId ?? null;
      if (reserved !== entry.batch_id) throw fenced(`erasure ${erasureId} reserved batch id ${reserved ?? 'none'} for its record`);
      this.ledger.recordErasure(entry, files, publishedAt);
    });
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

  // The statement stays open between rows: the reader must not use this connection meanwhile
  // (better-sqlite3 refuses another statement while an iterator is open).
  async *auditRecords(table: 'messages' | 'conversations'): AsyncGenerator<RecordRow> {
    yield* this.stream(this.guard(() => this.audit[table].iterate()));
  }

  async *auditHistory(): AsyncGenerator<HistoryRow> {
    yield* this.stream(this.guard(() => this.audit.history.iterate()));
  }

  async auditRuns(): Promise<{ id: number; status: string; accountId: string; record: string }[]> {
    return this.guard(() =>
      this.audit.runs.all().map((r) => {
        const line = this.runs.lineRecord(r.id, null)!;
        return { id: r.id, status: r.status, accountId: line.accountId, record: line.record };
      }),
    );
  }

  // ---------------------------------------------------------------- reading

  async mirrorId(): Promise<string> {
    return this.guard(() => this.status.mirrorId());
  }

  async counts(): Promise<Record<string, number>> {
    return this.guard(() => this.status.counts());
  }

  /** A read of the mirror's id (see `Mirror.ping`). */
  async ping(): Promise<void> {
    await this.mirrorId();
  }

  /** No connection pool: one connection for the process. */
  poolStats(): undefined {
    return undefined;
  }

  async quickCheck(): Promise<string[]> {
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

  async snapshotChanged(): Promise<boolean> {
    const opened = this.openedState;
    if (!opened || !this.db.open) return false;
    return !sameState(opened, fileState(this.file)) || writerIsLive(this.file);
  }

  async close(): Promise<void> {
    try {
      if (this.db.open) this.guard(() => this.db.close());
    } finally {
      this.release();
    }
  }
}
