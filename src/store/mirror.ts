/**
 * The store's interface (design: src/store/): what sync, run, export, verify, the jobs, the CLI and
 * the server read and write of a mirror, whichever engine holds it. Two engines implement it:
 * SQLite (`sqlite/`, the embedded default: one file, one writer process) and PostgreSQL
 * (`postgres/`, shared by a fleet of daemons). Open one with `openMirror` (`open-mirror.ts`), which
 * picks the engine from the target.
 *
 * Every method returns a promise; each call is atomic on its own: a write commits in one
 * transaction together with its change-log rows and, for message pages, the conversation's
 * checkpoint (design habit 7), or not at all. Nothing is atomic across two calls: a caller that
 * needs two writers kept apart uses {@link Mirror.withConversationLock} or
 * {@link Mirror.withListingLock}.
 *
 * Errors: every method rejects with {@link MirrorUnusableError} (naming {@link Mirror.location})
 * when the store is unusable: `MIRROR_CORRUPT` for damaged storage, `MIRROR_UNWRITABLE` for a full
 * disk, an I/O error or a read-only file (after corruption an engine writes nothing more); write
 * methods of a mirror opened `readonly` reject with {@link StoreError}.
 */
import type { MirrorUnusableError, StoreError } from '../errors.js';
import type { Conversation, Message, Page } from '../api/schemas.js';
import type {
  Checkpoint,
  ConversationFilter,
  ConversationListing,
  CrawlState,
  ErasureRequest,
  ErasureResult,
  ErasureRow,
  ErasureSubject,
  ExportBatch,
  ExportChange,
  HistoryRow,
  LedgerEntry,
  LedgerGenesis,
  LedgerHead,
  ListOrder,
  MirrorAccess,
  PendingExport,
  PublisherLease,
  PublishedFile,
  ExpiredFile,
  RecordRow,
  ReplacedFile,
  RunChanges,
  RunFailureRecord,
  RunFigures,
  RunStart,
  SubjectLine,
  WriteCounts,
} from './types.js';

export { DEFAULT_ACCOUNT } from './types.js';
export type {
  ChangeOp,
  ChangeStream,
  Checkpoint,
  ConversationFilter,
  ConversationListing,
  ConversationSummary,
  CrawlState,
  ErasureCounts,
  ErasureKind,
  ErasureRequest,
  ErasureResult,
  ErasureRow,
  ErasureSubject,
  ExportBatch,
  ExportChange,
  HistoryRow,
  LedgerEntry,
  LedgerGenesis,
  LedgerHead,
  ListOrder,
  MirrorAccess,
  MirrorOptions,
  PendingExport,
  PublisherLease,
  PublishedFile,
  ExpiredFile,
  RecordRow,
  ReplacedFile,
  RunChanges,
  RunFailureRecord,
  RunFigures,
  RunRefresh,
  RunScope,
  RunStart,
  RunTrigger,
  SubjectLine,
  WriteCounts,
} from './types.js';
export { signalOf } from './values.js';

/** One connection pool of an engine ({@link Mirror.poolStats}), counted now. */
export interface PoolStats {
  /**
   * Which pool: `queries` (every read and write) or `locks` (the sessions holding advisory locks:
   * the owner lock, conversation and listing locks) for PostgreSQL.
   */
  pool: string;
  /** Connections open (idle or checked out). */
  total: number;
  /** Open connections not checked out. */
  idle: number;
  /** Callers waiting for a connection (all checked out and `max` reached). */
  waiting: number;
  /** Connections at most. */
  max: number;
}

/** The engines a mirror can live in. */
export type MirrorEngine = 'sqlite' | 'postgres';

/**
 * A mirror of one or more workspaces, in one of the {@link MirrorEngine}s. See the module comment
 * for atomicity and errors.
 */
export interface Mirror {
  /** The engine holding this mirror. */
  readonly engine: MirrorEngine;
  /**
   * Where the mirror is, printable (safe for logs and errors): the absolute file path for SQLite
   * (`:memory:` for an in-memory mirror), the connection URL with its password masked for
   * PostgreSQL.
   */
  readonly location: string;
  /**
   * The local file the mirror lives in, when it is one (SQLite: the database file, or `:memory:`);
   * undefined for a server database (PostgreSQL). For callers that must keep clear of the file
   * (an export directory never holds it) or copy it (a backup).
   */
  readonly localFile: string | undefined;
  /** How this instance reads the mirror: `'read-write'` for a writer; see {@link MirrorOptions.readonly}. */
  readonly access: MirrorAccess;

  // ---------------------------------------------------------------- writers kept apart

  /**
   * Runs `fn` while no other writer, in this process or any other, crawls the conversation
   * `conversationId` of `accountId` (its messages: checkpoint, pages, completion), and returns
   * its result. Wrap one conversation's whole crawl in it. Waits for a writer that holds it.
   * SQLite: the process-wide writer lock already excludes every other writer, so `fn` just runs.
   */
  withConversationLock<T>(accountId: string, conversationId: string, fn: () => Promise<T>): Promise<T>;

  /**
   * Runs `fn` while no other writer, in this process or any other, lists the workspace
   * `accountId` (the pass over the conversation list: upserts, list order, tombstones of what the
   * list no longer shows), and returns its result. Waits for a writer that holds it. SQLite: the
   * process-wide writer lock already excludes every other writer, so `fn` just runs.
   */
  withListingLock<T>(accountId: string, fn: () => Promise<T>): Promise<T>;

  /**
   * Takes the mirror's publisher lock when it is free: one publisher at a time per mirror,
   * whichever process it runs in. Resolves `undefined` when another process holds it.
   *
   * PostgreSQL: a session advisory lock on the mirror's schema (`pg_try_advisory_lock`) on a
   * connection of its own; the lease is {@link PublisherLease.lost} when that session ends.
   * SQLite: the process-wide writer lock already makes this process the only publisher, so the
   * lease is always granted and never lost.
   */
  tryPublisherLock(): Promise<PublisherLease | undefined>;

  // ---------------------------------------------------------------- runs

  /**
   * Records the start of a run (status `running`) with its scope, refresh and trigger (the legacy
   * `mode` column gets the scope).
   *
   * @returns the new run id
   */
  startRun(run: RunStart): Promise<number>;

  /**
   * Marks runs still `running` as `interrupted`: their process died. Each gets its `runs`
   * change-log row, like any run that ends ({@link finishRun}). Call once at start-up when no other
   * process can have a live run (SQLite: while holding the writer lock), never while runs of this
   * process are in flight.
   *
   * @returns how many runs were marked
   */
  markInterruptedRuns(): Promise<number>;

  /**
   * Resumes a run whose process died, so its work continues under the same run id: a run
   * `interrupted` goes back to `running` (`ended_at` and `error` cleared, `resumes` + 1).
   *
   * @returns `'running'` when the run is still running (nothing changed), `'resumed'` when it was
   *   `interrupted` and is running again, `'ended'` when it finished (`succeeded`, `partial`,
   *   `failed`) or there is no such run (nothing changed)
   */
  resumeRun(runId: number): Promise<'running' | 'resumed' | 'ended'>;

  /**
   * What a run changed, counted from its change-log rows (messages and conversations inserted,
   * updated, tombstoned), whichever process or job attempt committed them.
   */
  runChanges(runId: number): Promise<RunChanges>;

  /** A run's status (`running`, `succeeded`, `partial`, `failed`, `interrupted`); undefined for an unknown id. */
  runStatus(runId: number): Promise<string | undefined>;

  /** Whether a run has ended (any final status). */
  runEnded(runId: number): Promise<boolean>;

  /**
   * Records a run's end in one transaction: `ended_at` now, the figures given, the chain head as
   * it stands (`ledger_batch_id`, `ledger_hash`), and the run's `runs` change-log row (its record:
   * see `Runs.lineRecord` in the SQLite engine; `insert` the first time the run ends, `update` after that), which the
   * next publication exports. Record the run's failures first: the row lists them.
   */
  finishRun(runId: number, figures: RunFigures): Promise<void>;

  /**
   * Sets the chain head a run left (`runs.ledger_batch_id`, `runs.ledger_hash`): after its own
   * `runs` row was published, the head is later than the one {@link finishRun} recorded.
   */
  setRunLedgerHead(runId: number, head: LedgerHead | undefined): Promise<void>;

  /**
   * Records the conversations that failed in a run (by id, with each error's code, status, attempts
   * and message), replacing what was recorded for that run before: recording twice (a retried
   * finish step) keeps one row per failure.
   */
  recordFailures(runId: number, failures: RunFailureRecord[]): Promise<void>;

  /** The last `limit` runs, newest first (every column of `runs`). */
  lastRuns(limit: number): Promise<Record<string, unknown>[]>;

  /** Failures recorded for the newest finished run. */
  lastRunFailures(): Promise<Record<string, unknown>[]>;

  /** Live (not tombstoned) conversations and messages of one account. */
  liveCounts(accountId: string): Promise<{ conversations: number; messages: number }>;

  // ---------------------------------------------------------------- conversations

  /**
   * Upserts one page of the conversation list in one transaction, appending a change-log row for
   * each insert or update; unchanged rows are not written. A tombstoned conversation listed again
   * is revived (an `insert`) with no completed crawl (`message_count` and `crawled_signal` NULL), so
   * the next sync crawls all of it. A conversation an erasure covers is stored as its redaction
   * marker (see {@link eraseSubject}): served again, it is unchanged.
   */
  upsertConversations(accountId: string, page: Page<Conversation>, runId: number | null): Promise<WriteCounts>;

  /**
   * Forgets the change signal a conversation was last crawled at (`crawled_signal = NULL`), so the
   * next incremental sync asks the API about it whatever its signal says (e.g. after it failed in
   * a run). Its message count and messages are kept: that sync may still crawl incrementally.
   * Nothing happens for an unknown conversation.
   */
  forgetCrawlBaseline(accountId: string, conversationId: string): Promise<void>;

  /** Whether the mirror has a row (live or tombstoned) for this conversation. */
  hasConversation(accountId: string, conversationId: string): Promise<boolean>;

  /** Ids of conversations mirrored and not tombstoned. */
  liveConversationIds(accountId: string): Promise<string[]>;

  /**
   * The mirrored conversations `filter` matches (see {@link ConversationFilter}; by default every
   * live one of every account), newest served update first, each with its live message count,
   * served status and update time, and the end of its last complete crawl (`last_synced_at`); and
   * how many match in all, `filter.limit` aside. Read in one read transaction (a consistent pair
   * on any open, read-only included); writes nothing.
   *
   * @throws RangeError when `filter.limit` is not a whole number >= 0
   */
  listConversations(filter?: ConversationFilter): Promise<ConversationListing>;

  /**
   * Ids of conversations mirrored and not tombstoned that `shown` does not hold (e.g. what a
   * complete listing no longer shows), sorted. Memory: what it returns, not every live id.
   */
  liveConversationIdsNotIn(accountId: string, shown: ReadonlySet<string>): Promise<string[]>;

  /**
   * Ids of live conversations whose last crawl did not complete at a known change signal (never
   * crawled to the end, or failed: see {@link forgetCrawlBaseline}): an incremental listing that
   * stops early crawls them even though it did not list them.
   */
  unsettledConversationIds(accountId: string): Promise<string[]>;

  /**
   * Tombstones a conversation the API answered 404 for, and its live messages, in one transaction,
   * with `delete` change-log rows (the messages' first). Nothing is hard-deleted.
   */
  tombstoneConversation(accountId: string, conversationId: string, runId: number | null): Promise<{ conversation: boolean; messages: number }>;

  // ---------------------------------------------------------------- message crawls

  /** The committed checkpoint of an unfinished crawl, if any. */
  loadCheckpoint(accountId: string, conversationId: string): Promise<Checkpoint | undefined>;

  /** Forgets a crawl's checkpoint and seen ids (the crawl restarts from page 1). */
  resetCrawl(accountId: string, conversationId: string): Promise<void>;

  /**
   * Commits one page of a conversation's messages in one transaction: the conversation's row if
   * missing or tombstoned (see the stand-in and revival rules of {@link upsertConversations}),
   * upserts (unchanged rows are skipped), a change-log row per insert or update, the superseded
   * version of each edited message in `message_history`, the page's ids and the checkpoint
   * (`next_page = page + 1`).
   *
   * Positions are `(page - 1) * 100 + index` (spec 4.1: chronological order, per_page=100).
   *
   * Erasures in force ({@link eraseSubject}) apply before anything is compared: a served message
   * of an erased sender or conversation is replaced by its redaction marker (the lowest erasure id
   * covering it), so one already redacted is unchanged (no change-log row, no history row) and a
   * new one is inserted redacted. One indexed read of `erasures` per page (the page's senders and
   * its conversation).
   */
  commitMessagesPage(accountId: string, conversationId: string, page: Page<Message>, runId: number | null): Promise<WriteCounts>;

  /**
   * Completes a crawl in one transaction: tombstones live messages not served by any page of this
   * crawl (with `delete` change-log rows), sets the conversation's `message_count` and
   * `last_synced_at`, records the conversation's `changeField` signal (when given) as the baseline
   * of the next incremental sync, and clears the checkpoint. Call only after the last page was committed.
   *
   * @returns messages tombstoned and the number served in this crawl
   */
  completeCrawl(accountId: string, conversationId: string, runId: number | null, changeField?: string): Promise<{ deleted: number; messageCount: number }>;

  // ---------------------------------------------------------------- incremental sync

  /**
   * What the last complete listing of `accountId` found of the list's order (see `ListOrder`);
   * undefined before any (or when the record cannot be read back).
   */
  listOrder(accountId: string): Promise<ListOrder | undefined>;

  /** Records what a listing of `accountId` found of the list's order (replacing the previous record). */
  recordListOrder(accountId: string, order: ListOrder): Promise<void>;

  /**
   * What the last complete crawl of a conversation left: its message count and the change signal
   * it was crawled at. `messageCount` is null when no crawl ever completed.
   */
  crawlState(accountId: string, conversationId: string): Promise<CrawlState>;

  /** Id of the live message at `position` (0-based, chronological), if any. */
  messageIdAt(accountId: string, conversationId: string, position: number): Promise<string | undefined>;

  /**
   * Starts an incremental crawl: the live messages before `beforePosition` count as seen (as a
   * pseudo page 0 of the crawl), so completing the crawl tombstones only what the fetched pages no
   * longer serve. Clears any previous crawl state first.
   *
   * @returns the seeded ids
   */
  seedIncrementalCrawl(accountId: string, conversationId: string, beforePosition: number): Promise<string[]>;

  // ---------------------------------------------------------------- export ledger

  /** The exported watermark: the last `change_log.seq` published. */
  exportWatermark(): Promise<number>;

  /**
   * Change-log rows not yet published (above the exported watermark): the export lag. Cheap (a
   * range of the primary key), for a metrics scrape.
   */
  unexportedChanges(): Promise<number>;

  /**
   * What waits above the exported watermark: changes of messages and conversations, and run lines
   * with the time of the oldest. Costs what lies above the watermark (a range of the primary key).
   */
  pendingExport(): Promise<PendingExport>;

  /**
   * The batch to publish, in one transaction: the planned, unpublished one left by an interrupted
   * publication (`resumed`), else a new batch over `(watermark, max(seq)]`, its range fixed before
   * any file is written. Undefined when nothing waits.
   *
   * @param plannedAt - ISO 8601 UTC time recorded on a new batch
   * @param gzip - whether a new batch's files are gzipped (a resumed batch keeps its own choice).
   *   @defaultValue false
   */
  planExportBatch(runId: number | null, plannedAt: string, gzip?: boolean): Promise<ExportBatch | undefined>;

  /**
   * The change-log rows of a batch, in file order: by stream, account, UTC day of `synced_at`, seq.
   * Streamed (bounded memory). Each row carries the record (`record`), or on a row written before
   * schema version 6 its finished line (`line`); `exportLine` (src/export/lines.ts) makes the
   * export line of either.
   */
  changesOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): AsyncIterable<ExportChange>;

  /**
   * {@link changesOf} in chunks of up to 1,000 rows, for the exporter (one step per chunk instead
   * of one per row). Each chunk is read whole, so a reader that stops early holds no statement.
   */
  changeChunksOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): AsyncIterable<ExportChange[]>;

  /**
   * Records a published batch in one transaction: its files, its ledger entry (the new chain
   * head), the batch marked published, and the watermark moved to its last seq. Call only once
   * every file, the batch record and the manifest are in place.
   *
   * The same transaction prunes the payloads of the changes published (see `change_payloads`), so
   * the store stays near the size of what it mirrors.
   *
   * Fenced: the ledger head moves only by compare-and-set from the head `entry` chains on
   * (`entry.prev_hash`), so a publisher that stalled past losing its lock while another recorded
   * a batch records nothing.
   *
   * @param publishedAt - ISO 8601 UTC time recorded on the files, the entry and the batch
   * @throws {@link StoreError} with code `LEDGER_FENCED` when the head is not the one `entry`
   *   chains on, or the batch is no longer pending; nothing was changed
   */
  recordPublication(batch: Pick<ExportBatch, 'id' | 'last_seq'>, files: PublishedFile[], entry: LedgerEntry, publishedAt: string): Promise<void>;

  /**
   * What the genesis record of an export directory published before the ledger existed must
   * cover (every recorded file); undefined when the ledger has records or nothing was published.
   */
  ledgerGenesis(): Promise<LedgerGenesis | undefined>;

  /** Records the genesis record of a migrated export directory (the first chain head). */
  recordLedgerGenesis(entry: LedgerEntry, publishedAt: string): Promise<void>;

  /** The chain head: the last batch record published; undefined before the first. */
  ledgerHead(): Promise<LedgerHead | undefined>;

  /** Id of the export batch planned and not yet published (left by an interrupted publication), if any. */
  pendingExportBatch(): Promise<number | undefined>;

  /** Every ledger entry as recorded, genesis first. */
  ledgerEntries(): Promise<LedgerEntry[]>;

  /**
   * Every published export file the archive holds, as recorded, by first seq then path: files a
   * retention record expired are left out ({@link expiredFiles}).
   */
  publishedFiles(): Promise<PublishedFile[]>;

  // ---------------------------------------------------------------- retention (issue 26, item 3)

  /**
   * The batch id the next record of the ledger takes: above every batch planned (published or
   * not) and every record recorded. What a retention record is published under; the same on every
   * call until a batch is planned or a record recorded.
   */
  nextLedgerBatchId(): Promise<number>;

  /**
   * Records a retention record published in the ledger (src/export/retention.ts), in one
   * transaction: no batch may be planned and unpublished, `entry.batch_id` must be
   * {@link nextLedgerBatchId} (it is reserved: no batch is ever planned under it), the chain head
   * moves to `entry` by compare-and-set from the head it chains on (`entry.prev_hash`, never
   * null), the entry is recorded, and each of `paths` (each a file {@link publishedFiles} lists)
   * is marked expired by it. The watermark does not move.
   *
   * @param publishedAt - ISO 8601 UTC, recorded on the entry
   * @throws {@link StoreError} `LEDGER_FENCED` when a batch is pending, the head is not the one
   *   `entry` chains on, or `entry.batch_id` is not the next id; a plain {@link StoreError} when a
   *   path is not a file the archive holds; nothing was changed
   */
  recordRetentionRecord(entry: LedgerEntry, paths: readonly string[], publishedAt: string): Promise<void>;

  /** Every file a retention record expired, by the record's batch id, then first seq and path. */
  expiredFiles(): Promise<ExpiredFile[]>;

  /**
   * Published files and lines in all (every file ever published: files a retention record expired
   * are counted too), and whether any batch was ever published.
   */
  exportTotals(): Promise<{ files: number; lines: number; everPublished: boolean }>;

  // ---------------------------------------------------------------- erasure (issue 26, the mirror side)

  /**
   * Erases a data subject from the mirror (GDPR Art. 17, CCPA deletion), in one transaction: every
   * message of `request.subject` in `request.accountId` (kind `sender`: every message a version of
   * which names it as `sender.id`, in any conversation of the account, and those an earlier erasure
   * of the same sender redacted; kind `conversation`: every message of the conversation; kind
   * `retention`, subject a cutoff day `YYYY-MM-DD`: every message of the account created before
   * that day, UTC, that no other erasure redacted, which is what `--prune-mirror` asks:
   * src/export/retention.ts) keeps its key, position and times, and its record becomes the
   * redaction marker (src/store/redaction.ts) in `messages`, in `message_history` and in every
   * change payload not yet published (seq above {@link ErasureResult.publishedThroughSeq}). So does
   * every conversation object of the subject (kind `conversation`: the conversation's own; kind
   * `sender`: every conversation of the account a version of which, its row or an unpublished
   * `conversations` payload, names the sender as a JSON string value at any depth,
   * `conversationNamesSender`, such as the fake API's `contact.id`, and those an earlier erasure of
   * the same sender redacted; kind `retention`: none), in `conversations` (counted in
   * `conversations`) and in its unpublished payloads (counted in `pendingChanges`).
   * Records already redacted are left as they are. An `erasures` row records what, when (the
   * mirror's clock), why and how many; from then on every page committed redacts what the erasure
   * covers as it arrives ({@link commitMessagesPage}, {@link upsertConversations}).
   *
   * Appends no change-log row: nothing personal is published again, and exports already published
   * are the archive step's (it rewrites every line at or below `publishedThroughSeq`, then
   * {@link recordErasureArchived}). Erasing a subject again adds an `erasures` row that redacted
   * nothing (all zero but `publishedLines`).
   *
   * With `request.dryRun` it only counts, in one read snapshot, what the erasure would redact now,
   * and writes nothing (no `erasures` row; `erasureId` undefined).
   *
   * Cost: kind `sender` reads every message and conversation of the account, its `message_history`
   * and the change log's keys (a scan, once per erasure); kind `conversation` the conversation's own
   * rows.
   * SQLite: SQLite's `secure_delete` is on for the transaction (freed bytes are zeroed) and the WAL
   * is checkpointed after it (best effort). PostgreSQL: excludes every page commit, listing page,
   * tombstone and crawl completion of the account for its duration (an advisory lock they take
   * shared), and export planning (the export state's row).
   *
   * @returns the rows redacted (or to redact), the new erasure's id and the published-through seq
   * @throws {@link StoreError} with code `ERASURE_INVALID` for an unknown kind or an empty account,
   *   subject or reason, or a retention subject that is not a day (nothing read); {@link StoreError}
   *   on a read-only mirror (unless `dryRun`)
   */
  eraseSubject(request: ErasureRequest): Promise<ErasureResult>;

  /** Every `erasures` row, by id (oldest first). */
  erasures(): Promise<ErasureRow[]>;

  /**
   * The accounts (workspaces) the mirror holds messages of, in code-point order: whose messages a
   * retention erasure (`--prune-mirror`) may expire. Cost: one pass over the messages' primary key.
   */
  messageAccounts(): Promise<string[]>;

  /**
   * Records that the archive step finished rewriting the published files of erasure `erasureId`
   * (`archive_done_at`, ISO 8601 UTC), when it is not recorded yet.
   *
   * @returns true when it was set now, false when it was set before (kept)
   * @throws {@link StoreError} with code `ERASURE_UNKNOWN` when there is no such erasure
   */
  recordErasureArchived(erasureId: number, doneAt: string): Promise<boolean>;

  /**
   * The change-log lines at or below `throughSeq` that concern `subject`, by seq (streamed from
   * the change log's keys: the payloads of published lines are pruned, but their keys stay): kind
   * `conversation`, every line of the conversation in the `messages` and `conversations` streams;
   * kind `sender`, every `messages` line of a message of the sender (one a version of which names
   * it, or the redaction marker of an erasure of the same sender: after an erasure, its markers
   * are how the mirror still knows them), and every `conversations` line of a conversation of the
   * sender (one whose row, or an unpublished payload, names it, or whose row is the marker of an
   * erasure of the same sender: see {@link eraseSubject}); kind `retention`, every `messages` line
   * of a message created before the cutoff day that is not redacted, or redacted by a retention
   * erasure of the same cutoff (what another erasure redacted is that erasure's). What the archive
   * step rewrites in the published files (with `throughSeq` the erasure's
   * {@link ErasureResult.publishedThroughSeq}), and what a dry run counts there. `runs` lines are
   * never the subject's. Read in one snapshot; writes nothing.
   *
   * Cost: kind `sender`, the account's messages and conversations naming the sender or redacted,
   * and the account's `messages` and `conversations` lines up to `throughSeq` (their keys); kind
   * `conversation`, the conversation's lines.
   */
  subjectLines(subject: ErasureSubject, throughSeq: number): Promise<SubjectLine[]>;

  /**
   * Reserves, for erasure `erasureId`'s record in the ledger, the batch id it takes: the next one
   * (above every batch planned and every record), recorded as the erasure's `archiveBatchId`, so
   * no batch is ever planned under it and a re-run after a crash writes the same record under the
   * same name. Returns the id reserved earlier when there is one still usable (recorded, or above
   * the chain head); a reservation a head moved past (another publisher recorded meanwhile) is
   * replaced. Call with the publisher lock held.
   *
   * @throws {@link StoreError} `ERASURE_UNKNOWN` for no such erasure; `LEDGER_FENCED` when an
   *   export batch is planned and not published (publish it first: its record must come before)
   */
  planErasureRecord(erasureId: number): Promise<number>;

  /**
   * Records erasure `erasureId`'s record, published in the ledger (src/export/erasure.ts), in one
   * transaction: the chain head moves to `entry` by compare-and-set from the head it chains on
   * (`entry.prev_hash`, never null: an erasure record is never a genesis record), its ledger
   * entry, and in `export_files` each replaced path replaced by its rewritten file. The watermark
   * does not move (an erasure record covers no new seq).
   *
   * @param publishedAt - ISO 8601 UTC, recorded on the entry and the rewritten files
   * @throws {@link StoreError} with code `LEDGER_FENCED` when the head is not the one `entry`
   *   chains on, or `entry.batch_id` is not the id {@link planErasureRecord} reserved; nothing was changed
   */
  recordErasureRecord(erasureId: number, entry: LedgerEntry, files: readonly ReplacedFile[], publishedAt: string): Promise<void>;

  // ---------------------------------------------------------------- audit (verify --deep)

  /**
   * Every message or conversation row (tombstoned ones too), by key, with its record as served,
   * or its redaction marker once an erasure redacted it (`redactionOf` in src/store/redaction.ts
   * tells which erasure). Streamed: make no other call on this mirror until the iteration ends (an engine may hold its
   * connection for the stream); a reader that stops early releases it.
   */
  auditRecords(table: 'messages' | 'conversations'): AsyncIterable<RecordRow>;

  /**
   * Every `message_history` row, by the seq of the update that replaced it (a redacted message's
   * versions are its redaction marker); streamed as {@link auditRecords}.
   */
  auditHistory(): AsyncIterable<HistoryRow>;

  /**
   * Every run with its status and the record its `runs` change-log row would carry now (without a
   * chain head: see `Runs.lineRecord` in the SQLite engine).
   */
  auditRuns(): Promise<{ id: number; status: string; accountId: string; record: string }[]>;

  // ---------------------------------------------------------------- reading

  /** This mirror's random id (32 hex digits), fixed at creation. */
  mirrorId(): Promise<string>;

  /**
   * Row counts for `status`, by name: live and tombstoned conversations and messages, history,
   * change log, export state, checkpoints, runs, and of erasures: `erasures` (rows of
   * `erasures`), `erasures_pending` (those whose archive step has not finished: `archive_done_at`
   * NULL), `messages_erased` and `conversations_erased` (rows whose record is a redaction marker,
   * tombstoned ones too).
   */
  counts(): Promise<Record<string, number>>;

  /**
   * A cheap round trip to the storage, for readiness probes (`/readyz`): PostgreSQL a `SELECT 1` on
   * a pooled connection (waiting for one when all are busy), SQLite a read of the mirror's id.
   *
   * @throws `MirrorDatabaseError` (PostgreSQL: the database cannot be reached or used, naming
   *   `CONVO_MIRROR_DB` with its password masked), {@link MirrorUnusableError} (SQLite), or
   *   {@link StoreError} once the mirror is closed
   */
  ping(): Promise<void>;

  /**
   * The engine's connection pools now, for metrics; undefined for an engine without one (SQLite).
   * Reads counters in memory: no query.
   */
  poolStats(): PoolStats[] | undefined;

  /**
   * The engine's check of its storage (SQLite: `PRAGMA quick_check` of the whole file, every page
   * and b-tree, not index contents).
   *
   * @returns the problems found; `[]` when the storage is sound. A corruption error raised while
   *   checking is reported as one problem.
   * @throws {@link MirrorUnusableError} for an I/O error while reading
   */
  quickCheck(): Promise<string[]>;

  /**
   * Whether what this instance reads may no longer be the mirror: true when it reads a snapshot a
   * writer changed since it was opened, so results read from it may be wrong (even reported as
   * corruption): reopen and read again ({@link readConsistent} does). Always false for a writer,
   * for an engine whose reads see every commit, and after the instance was closed. SQLite: true
   * only for an `'immutable'` read-only open whose file changed, whose `-wal` appeared or changed,
   * or whose writer lock is held (a few `stat` calls and one read of `<file>.lock`).
   *
   * Call it once a result is complete, before trusting it.
   */
  snapshotChanged(): Promise<boolean>;

  /**
   * Closes the mirror and releases what it holds (connections, locks, temporary copies). Nothing
   * may be called on it afterwards, except `close` again (a no-op).
   */
  close(): Promise<void>;
}
