/**
 * The store's public types: what callers pass to and get from {@link Mirror} (re-exported by
 * `mirror.ts`; import them from there). No code here, so every table-group module can use them
 * without importing the facade.
 */
import type { Clock } from '../clock.js';
import type { FileModes } from '../private-fs.js';

/** Account id used in the mirror when no `X-Account-Id` is configured. */
export const DEFAULT_ACCOUNT = 'default';

/** Row counts written by one page or one step. */
export interface WriteCounts {
  inserted: number;
  updated: number;
  unchanged: number;
  deleted: number;
}

/** A resumable crawl of one conversation. */
export interface Checkpoint {
  /** Next page to fetch (1-based). */
  nextPage: number;
  /** `meta.total_count` at the last committed page. */
  totalCount: number;
  /** Message ids served on the committed pages of this crawl. */
  seenIds: Set<string>;
  /** Ids of the last committed page (`nextPage - 1`), in served order, to verify on resume. */
  lastPageIds: string[];
  /** When the last page was committed, epoch ms. */
  updatedAt: number;
  /** Run that committed the last page (null outside a recorded run). */
  runId: number | null;
}

/** What a run covers: every conversation of the workspace, or conversations named by the caller. */
export type RunScope = 'workspace' | 'conversations';
/** How deep a run reads: new messages only (change signal, incremental crawls), or every page. */
export type RunRefresh = 'incremental' | 'full';
/** Who asked for a run: the `sync` command, a job scheduler, an `enqueue`d job, or a webhook. */
export type RunTrigger = 'cli' | 'schedule' | 'on-demand' | 'webhook';

/** How a run starts, recorded in `runs` ({@link Mirror.startRun}). */
export interface RunStart {
  scope: RunScope;
  refresh: RunRefresh;
  trigger: RunTrigger;
  /** Account the run mirrors (`default` without `X-Account-Id`). */
  accountId: string;
}

/** One conversation that failed in a run, as stored in `run_failures`. */
export interface RunFailureRecord {
  /** Conversation id, or `(conversation list)` for the listing itself. */
  id: string;
  /** The error's code, e.g. `HTTP_ERROR`, `SCHEMA_ERROR`, `LISTED_BUT_NOT_FOUND`. */
  code: string;
  /** HTTP status of the last attempt, when the failure was an HTTP answer. */
  status: number | null;
  /** Requests made for it (the first and the retries), when known. */
  attempts: number | null;
  message: string;
}

/** Outcome figures of a run, stored in `runs`. */
export interface RunFigures {
  status: 'succeeded' | 'partial' | 'failed' | 'interrupted';
  list_passes?: number;
  conversations_listed?: number;
  conversations_synced?: number;
  conversations_failed?: number;
  conversations_deleted?: number;
  conversations_inserted?: number;
  conversations_updated?: number;
  messages_served?: number;
  messages_inserted?: number;
  messages_updated?: number;
  messages_deleted?: number;
  requests?: number;
  retries?: number;
  rate_limited?: number;
  export_lines?: number;
  export_files?: number;
  error?: string | null;
}

/** One published export file, as recorded in `export_files` and listed by the manifest. */
export interface PublishedFile {
  /** Relative to the export directory, `/`-separated. */
  path: string;
  stream: string;
  account_id: string;
  /** UTC day of the lines' `synced_at`, `YYYY-MM-DD`. */
  date: string;
  first_seq: number;
  last_seq: number;
  lines: number;
  bytes: number;
  /** SHA-256 of the file's bytes, hex. */
  sha256: string;
  batch_id: number;
}

/** A published file a retention record expired (src/export/retention.ts): its row as published, and the record's batch id. */
export interface ExpiredFile extends PublishedFile {
  /** The batch id of the retention record that expired it. */
  expired_by: number;
}

/**
 * The publisher lock of a mirror, held (see `Mirror.tryPublisherLock`). While held, no other
 * process publishes this mirror's changes.
 */
export interface PublisherLease {
  /**
   * True once the lock is known to be gone (PostgreSQL: its session ended or failed). False does
   * not prove it is still held: a process that stalled may not have heard yet, which is why the
   * ledger head moves only by compare-and-set (`Mirror.recordPublication`).
   */
  readonly lost: boolean;
  /** Releases the lock; idempotent, never rejects. */
  release(): Promise<void>;
}

/** What waits above the exported watermark, by kind. */
export interface PendingExport {
  /** Change-log rows of messages and conversations. */
  data: number;
  /** Lines of the `runs` stream (a run's record as it ended). */
  runLines: number;
  /** `synced_at` (ISO 8601 UTC) of the oldest run line waiting; undefined when none waits. */
  oldestRunLineAt: string | undefined;
}

/** An export batch: a seq range fixed in SQLite before any of its files is written. */
export interface ExportBatch {
  id: number;
  first_seq: number;
  last_seq: number;
  /** Planned by an earlier, interrupted publication. */
  resumed: boolean;
  /** When the batch was planned (its seq range fixed), ISO 8601 UTC: the time its record carries. */
  planned_at: string;
  /** The run that planned it, if any. */
  run_id: number | null;
  /** Its files are gzipped (`.jsonl.gz`), fixed when it was planned. */
  gzip: boolean;
}

/**
 * A change-log stream: one export file tree per stream. `runs` holds one row per finished run
 * (its record: figures, failures, the chain head it left), so the archive alone tells what each
 * run did.
 */
export type ChangeStream = 'messages' | 'conversations' | 'runs';

/**
 * What the mirror remembers of the list's order, per account (`Mirror.listOrder`, in `mirror_meta`): the change
 * field, whether the last complete listing was ordered by it (newest first), the newest signal that
 * listing saw, and why it was not ordered.
 */
export interface ListOrder {
  field: string;
  ordered: boolean;
  /** The newest (largest) signal the last complete listing saw; the early-stop threshold. */
  newest: string | number | null;
  /** When it was recorded, ISO 8601 UTC. */
  at: string;
  /** Why the list is not ordered (the first disorder seen). */
  why?: string;
}

/** The head of the ledger's hash chain: the last batch record published. */
export interface LedgerHead {
  /** The batch the record covers (its file is `_ledger/<batch_id padded to 12 digits>.json`). */
  batch_id: number;
  /** SHA-256 (hex) of the record's canonical body. */
  hash: string;
}

/** One published batch record, as `ledger` stores it (see `Mirror.recordPublication`). */
export interface LedgerEntry extends LedgerHead {
  /** The previous record's hash; null for the genesis record. */
  prev_hash: string | null;
  /** The record's file, relative to the export directory, `/`-separated. */
  path: string;
  /** Files and lines the record lists. */
  files: number;
  lines: number;
  /** The signing key's id (`sha256:<hex>`) when the record is signed. */
  key_id: string | null;
}
/** What a change-log row records happened to its record. */
export type ChangeOp = 'insert' | 'update' | 'delete';

/**
 * One change-log row as the exporter reads it ({@link Mirror.changesOf}). The exporter builds the
 * export line from it (`exportLine` in src/export/lines.ts); the store keeps only the facts.
 */
export interface ExportChange {
  /** The row's change-log sequence number (never reused). */
  seq: number;
  stream: ChangeStream;
  op: ChangeOp;
  account_id: string;
  /** The conversation the record belongs to (for a conversation: its own id). */
  conversation_id: string;
  /** The message's or conversation's id. */
  record_id: string;
  /** When the change was committed, ISO 8601 UTC. */
  synced_at: string;
  /** UTC day of `synced_at`, `YYYY-MM-DD`. */
  day: string;
  /**
   * The record as served (JSON), written from schema version 6 on: a message's object (for a
   * `delete`: its last version), a conversation's object (`{"id": ...}` for one only known by id).
   * Null on rows written by older versions, which carry `line` instead.
   */
  record: string | null;
  /**
   * Legacy: the finished export line without `seq` (a JSON object), on rows written before schema
   * version 6; null on newer rows.
   */
  line: string | null;
}

/** Options of `openMirror` (`lock`, `modes`, `onPlanCommit` and `onLockAttempt` concern the SQLite engine only). */
export interface MirrorOptions {
  /** Time source for `*_at` columns. @defaultValue the system clock */
  clock?: Clock;
  /**
   * Take the single-writer lock (`<file>.lock`). Ignored (no lock) when `readonly` is true.
   * @defaultValue true
   */
  lock?: boolean;
  /**
   * Permission bits of every file and directory the mirror creates: missing parent directories,
   * the database file (SQLite gives its `-wal`, `-shm` and `-journal` the same mode), `<file>.lock`
   * and `<file>.lock.json`. Set exactly, whatever the umask; existing files and directories are
   * never chmodded.
   * @defaultValue {@link PRIVATE_MODES} (files 0600, directories 0700)
   */
  modes?: FileModes;
  /**
   * Open an existing mirror for reading only (`status`, `verify`, an auditor's copy, a backup):
   * no lock taken, no migration, no `journal_mode` change, and every write method throws
   * {@link StoreError}. How it is read depends on what is beside it ({@link Mirror.access}):
   *
   * - a live writer holds its lock (`writerIsLive`): a normal read-only connection (`'shared'`),
   *   which reads every committed page through the writer's own `-wal` and `-shm`, as any SQLite
   *   reader of a live database does;
   * - no live writer and no `-wal` (or an empty one): the file is opened `immutable`
   *   (`'immutable'`): SQLite reads it alone, creates nothing and changes no byte, even on a
   *   read-only mount. Its state at open is recorded, so {@link Mirror.snapshotChanged} says when a
   *   writer came along afterwards;
   * - no live writer and a non-empty `-wal` (a copy or snapshot of a crashed or running mirror): the
   *   file and its `-wal` (never the `-shm`) are copied into a new private directory under
   *   `os.tmpdir()` (0700, files 0600) and that copy is opened (`'private-copy'`), so SQLite
   *   recovers the WAL there; nothing is created or changed beside the original, and the directory
   *   is removed by {@link Mirror.close} (or at process exit). This needs room for the file and its
   *   `-wal` in the temp directory (`TMPDIR`).
   *
   * A file that changes while it is being copied is copied again (at most 3 times), then read
   * through a normal read-only connection like a live one.
   * @defaultValue false
   */
  readonly?: boolean;
  /**
   * Test hook: called inside every export batch plan's transaction, just before it commits, with
   * the connection's `PRAGMA synchronous` (2 = FULL: the commit that makes every earlier change
   * durable). Never set in production.
   */
  onPlanCommit?: (synchronous: number) => void;
  /**
   * Test hook: called when the writer lock is about to be taken (the lock file open, just before
   * `BEGIN EXCLUSIVE` waits for it). Never set in production.
   */
  onLockAttempt?: () => void;
  /**
   * Called once a writer's open applied migrations, with how many (`applied`) and the schema
   * version reached (`version`); not called when the schema was current, nor when another process
   * migrated it meanwhile (a fleet's daemons starting together migrate once: one of them is told).
   * PostgreSQL only for now (a SQLite file has one writer, which migrates under its lock).
   */
  onMigrated?: (m: { applied: number; version: number }) => void;
}

/**
 * How a {@link Mirror} reads its file: `'read-write'` (a writer), or for a read-only open
 * `'immutable'`, `'shared'` or `'private-copy'` (see {@link MirrorOptions.readonly}).
 */
export type MirrorAccess = 'read-write' | 'immutable' | 'shared' | 'private-copy';

/** What the last complete crawl of a conversation left; see `Mirror.crawlState`. */
export interface CrawlState {
  messageCount: number | null;
  crawledSignal: string | null;
  raw: string | null;
}

/**
 * Which conversations {@link Conversations.list} (`Mirror.listConversations`) returns. Every field
 * is optional; an empty filter lists every live conversation of every account.
 */
export interface ConversationFilter {
  /** Only these accounts (compared case-insensitively); undefined or empty = every account. */
  accountIds?: readonly string[] | undefined;
  /** Only conversations whose served `status` (as text) is one of these; undefined or empty = any. */
  statuses?: readonly string[] | undefined;
  /**
   * Only conversations whose served update time ({@link ConversationSummary.updatedAt}) is at or
   * after this instant, ms since the epoch; conversations without a readable time are left out.
   * Undefined = no bound.
   */
  sinceMs?: number | undefined;
  /** Tombstoned (deleted upstream) conversations too. @defaultValue false */
  includeDeleted?: boolean | undefined;
  /** At most this many rows (a whole number >= 0); undefined = all of them. */
  limit?: number | undefined;
}

/** One conversation as `convo-mirror conversations` lists it. */
export interface ConversationSummary {
  accountId: string;
  id: string;
  /** The served object's `status` as text (JSON text when not a string); null when absent. */
  status: string | null;
  /**
   * When the API last updated the conversation, as served: its `updated_at`, else
   * `last_activity_at`, else `last_message_at` (the timestamp fields the change signal knows), as
   * text; null when it has none (e.g. a conversation synced by id and not listed yet).
   */
  updatedAt: string | null;
  /** Live (not tombstoned) messages the mirror holds for it. */
  messages: number;
  /** Of {@link messages}, those an erasure redacted (their record is a redaction marker: src/store/redaction.ts). */
  erasedMessages: number;
  /** Whether an erasure of the conversation redacted its own object (then `status` and `updatedAt` are null). */
  erased: boolean;
  /** End of its last complete crawl (`last_synced_at`, ISO 8601 UTC); null when none completed. */
  lastSyncedAt: string | null;
  /** When it was tombstoned (deleted upstream); null while live. */
  deletedAt: string | null;
}

/** What {@link Conversations.list} returns: the rows, and how many match the filter in all. */
export interface ConversationListing {
  rows: ConversationSummary[];
  /** Conversations matching the filter, `limit` aside (`total - rows.length` were cut). */
  total: number;
}

/** Rows a run wrote to the change log, by stream and op. */
export interface RunChanges {
  messages: { inserted: number; updated: number; deleted: number };
  conversations: { inserted: number; updated: number; deleted: number };
}

/** What a genesis record of a migrated export directory covers: everything published before the ledger. */
export interface LedgerGenesis {
  /** The last batch published (the genesis record's id). */
  batch_id: number;
  /** When it was published (the genesis record's time). */
  published_at: string;
  /** The exported watermark. */
  last_seq: number;
}

/** A message or conversation row: its key, the record as served (JSON), tombstoned or not. */
export interface RecordRow {
  account_id: string;
  conversation_id: string;
  id: string;
  raw: string | null;
  deleted: number;
}

/** A `message_history` row: the version replaced by the update `seq`. */
export interface HistoryRow {
  seq: number;
  account_id: string;
  conversation_id: string;
  id: string;
  raw: string;
}

/**
 * Whose data an erasure removes (issue 26): every message of a sender (`sender`: a customer's or a
 * user's `sender.id`, spec 2.2), a whole conversation (`conversation`: its messages and its own
 * object), or every message of an account created before a day (`retention`: what
 * `--prune-mirror` asks of each publication under a retention policy limiting `messages`).
 */
export type ErasureKind = 'sender' | 'conversation' | 'retention';

/** The erasure kinds, in the order of {@link ErasureKind}. */
export const ERASURE_KINDS: readonly ErasureKind[] = ['sender', 'conversation', 'retention'];

/** An erasure asked of the mirror ({@link Mirror.eraseSubject}). */
export interface ErasureRequest {
  kind: ErasureKind;
  /** The account (workspace) the subject belongs to (`default` without `X-Account-Id`). */
  accountId: string;
  /**
   * The sender id (`kind: 'sender'`), the conversation id (`kind: 'conversation'`), or the cutoff
   * day `YYYY-MM-DD` (`kind: 'retention'`: every message whose `created_at` is before that day's
   * start, UTC).
   */
  subject: string;
  /** Why: e.g. the ticket reference of the request. Required, not blank. */
  reason: string;
  /** Count only: nothing is written (no `erasures` row either). @defaultValue false */
  dryRun?: boolean;
}

/** What an erasure redacted (or, for a dry run, would redact), in rows. */
export interface ErasureCounts {
  /** `messages` rows redacted (live and tombstoned). */
  messages: number;
  /** `message_history` rows (superseded versions) redacted. */
  history: number;
  /** Unpublished change payloads (change-log rows above {@link ErasureResult.publishedThroughSeq}) redacted. */
  pendingChanges: number;
  /**
   * `conversations` rows redacted (live and tombstoned): for `kind: 'conversation'`, 0 or 1 (its
   * own); for `kind: 'sender'`, the conversations naming the sender (see `Mirror.eraseSubject`).
   */
  conversations: number;
  /**
   * Change-log lines at or below {@link ErasureResult.publishedThroughSeq} that concern the subject:
   * lines that may be in published export files, which the mirror cannot change (the archive
   * step's work). Counted from the change log's keys, not from the files.
   */
  publishedLines: number;
}

/** What {@link Mirror.eraseSubject} did. */
export interface ErasureResult extends ErasureCounts {
  /** The new `erasures.id`; undefined for a dry run. */
  erasureId: number | undefined;
  dryRun: boolean;
  /**
   * The export watermark when the erasure ran, or the last seq of the export batch planned and not
   * yet published when there is one (its files may already be in the export directory, and a
   * re-publication must write the same bytes): every change line with a seq at or below it may be
   * published and is left to the archive step; every one above it was redacted in the mirror.
   */
  publishedThroughSeq: number;
}

/** One row of `erasures` ({@link Mirror.erasures}). */
export interface ErasureRow extends ErasureCounts {
  /** Ascending from 1. */
  id: number;
  kind: ErasureKind;
  accountId: string;
  subject: string;
  reason: string;
  /** When it was requested (the mirror's clock), ISO 8601 UTC. */
  requestedAt: string;
  /** See {@link ErasureResult.publishedThroughSeq}. */
  publishedThroughSeq: number;
  /**
   * The batch id of the erasure record the archive step published in the ledger (its
   * `_ledger/<batch id>.json`), once the mirror recorded it; null before, and for an erasure
   * whose published lines were already erased (no record needed).
   */
  archiveBatchId: number | null;
  /** When the archive step finished rewriting the published files; null until then. */
  archiveDoneAt: string | null;
}

/** Whose data an erasure concerns: an {@link ErasureRequest} without its reason. */
export type ErasureSubject = Pick<ErasureRequest, 'kind' | 'accountId' | 'subject'>;

/**
 * A change-log line of an erased subject at or below an erasure's published-through seq: a line
 * that may be in a published export file ({@link Mirror.subjectLines}).
 */
export interface SubjectLine {
  seq: number;
  stream: ChangeStream;
}

/**
 * A published data file an erasure record replaced by a rewritten one
 * ({@link Mirror.recordErasureRecord}): the path it had, and the file now recorded in its place
 * (its `batch_id` stays the batch that first published its lines).
 */
export interface ReplacedFile {
  /** The path replaced (relative to the export directory, `/`-separated). */
  from: string;
  /** The rewritten file, as `export_files` records it from now on. */
  file: PublishedFile;
}
