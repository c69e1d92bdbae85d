/**
 * Mirror: the local SQLite copy of the workspace (design: src/store/).
 *
 * better-sqlite3 in WAL mode with `synchronous=FULL` (a committed page survives a power cut, so the
 * change log's sequence numbers are never reused). Migrations by `PRAGMA user_version`. Every write
 * path commits in one transaction together with its change-log rows and, for message pages, the
 * conversation's checkpoint (design habit 7).
 *
 * Trust no disk: every file and directory it creates is private (`FileModes`) whatever the umask;
 * read-only opens create and change nothing beside the file, and notice a writer that comes along
 * (see {@link MirrorOptions.readonly}, {@link Mirror.snapshotChanged}); SQLite errors that make the
 * file unusable (corruption, full disk, I/O errors) surface as `MirrorUnusableError`, and after
 * corruption nothing more is written.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Database, sqliteUri, type Db, type Statement } from './sqlite.js';
import { asMirrorError, isCorruptionCode, MirrorUnusableError, StoreError } from '../errors.js';
import { createPrivateFile, mkdirPrivate, PRIVATE_MODES, type FileModes } from '../private-fs.js';
import type { Clock } from '../clock.js';
import { isoNow, systemClock } from '../clock.js';
import { PER_PAGE, type Conversation, type Message, type Page } from '../api/schemas.js';
import { MIGRATIONS } from './migrations.js';
import { acquireWriterLock, writerIsLive } from './lock.js';

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

/** An export batch: a seq range fixed in SQLite before any of its files is written. */
export interface ExportBatch {
  id: number;
  first_seq: number;
  last_seq: number;
  /** Planned by an earlier, interrupted publication. */
  resumed: boolean;
}

/** One change-log row as the exporter reads it. */
export interface ExportChange {
  seq: number;
  stream: string;
  account_id: string;
  /** UTC day of `synced_at`, `YYYY-MM-DD`. */
  day: string;
  /** The export line without `seq` (a JSON object). */
  line: string;
}

/** Options of {@link Mirror.open}. */
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
}

/**
 * How a {@link Mirror} reads its file: `'read-write'` (a writer), or for a read-only open
 * `'immutable'`, `'shared'` or `'private-copy'` (see {@link MirrorOptions.readonly}).
 */
export type MirrorAccess = 'read-write' | 'immutable' | 'shared' | 'private-copy';

/**
 * What identifies the state of a file on disk: device, inode, size, modification and change
 * times (ns); null when the file does not exist. Two equal fingerprints mean nobody wrote it in
 * between (to the resolution of the filesystem's timestamps).
 */
type Fingerprint = string | null;

function fingerprint(file: string): Fingerprint {
  let st: fs.BigIntStats;
  try {
    st = fs.statSync(file, { bigint: true });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
}

/** The state of a mirror file and its `-wal` (an empty `-wal` counts as absent for reading). */
interface FileState {
  db: Fingerprint;
  wal: Fingerprint;
  walBytes: number;
}

function fileState(abs: string): FileState {
  const db = fingerprint(abs);
  const wal = fingerprint(`${abs}-wal`);
  let walBytes = 0;
  if (wal !== null) {
    try {
      walBytes = fs.statSync(`${abs}-wal`).size;
    } catch {
      /* gone meanwhile: the fingerprints differ on the next look */
    }
  }
  return { db, wal, walBytes };
}

const sameState = (a: FileState, b: FileState): boolean => a.db === b.db && a.wal === b.wal;

/** Private copies of read-only opens not yet closed: removed at process exit whatever happens to the instance. */
const privateCopies = new Set<string>();
let exitHookInstalled = false;

function removePrivateCopy(dir: string): void {
  privateCopies.delete(dir);
  try {
    fs.rmSync(dir, { recursive: true, force: true });
  } catch {
    /* best effort: a temp directory */
  }
}

/**
 * Copies `abs` and its `-wal` into a new private directory under `os.tmpdir()`. Returns the copy's
 * path and directory, or null (nothing left behind) when either file changed while being copied or
 * a writer took the lock meanwhile.
 *
 * @throws {@link StoreError} naming the file when the copy cannot be made (no room, unreadable)
 */
function privateCopy(abs: string): { dir: string; file: string } | null {
  const before = fileState(abs);
  let dir: string | undefined;
  try {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-read-'));
    fs.chmodSync(dir, 0o700);
    privateCopies.add(dir);
    if (!exitHookInstalled) {
      exitHookInstalled = true;
      process.on('exit', () => {
        for (const d of [...privateCopies]) removePrivateCopy(d);
      });
    }
    const file = path.join(dir, 'mirror.sqlite');
    for (const [from, to] of [
      [abs, file],
      [`${abs}-wal`, `${file}-wal`],
    ] as const) {
      try {
        // FICLONE: a reflink where the filesystem has them (instant, no extra room), else a copy.
        fs.copyFileSync(from, to, fs.constants.COPYFILE_EXCL | fs.constants.COPYFILE_FICLONE);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT' && !fs.existsSync(from)) {
          removePrivateCopy(dir); // the -wal (or the file) went away meanwhile: look again
          return null;
        }
        throw err;
      }
      fs.chmodSync(to, 0o600);
    }
    if (!sameState(before, fileState(abs)) || writerIsLive(abs)) {
      removePrivateCopy(dir);
      return null;
    }
    return { dir, file };
  } catch (err) {
    if (dir !== undefined) removePrivateCopy(dir);
    throw new StoreError(
      `cannot open the mirror ${abs} read-only: its -wal must be read from a private copy (nothing is written beside the original), ` +
        `and copying it and its -wal to ${os.tmpdir()} failed: ${(err as Error).message}`,
      { file: abs },
      err,
    );
  }
}

const zeroCounts = (): WriteCounts => ({ inserted: 0, updated: 0, unchanged: 0, deleted: 0 });

/** Builds a message export line (without `seq`) from a served message object. */
function messageLine(op: string, syncedAt: string, accountId: string, conversationId: string, raw: Record<string, unknown>): string {
  const sender = (raw.sender ?? {}) as Record<string, unknown>;
  const line: Record<string, unknown> = {
    op,
    synced_at: syncedAt,
    account_id: accountId,
    conversation_id: conversationId,
    id: raw.id,
    content: raw.content,
    visibility: raw.visibility,
    sender: { id: sender.id, name: sender.name, type: sender.type },
  };
  if (raw.attachments !== undefined) line.attachments = raw.attachments;
  line.created_at = raw.created_at;
  return JSON.stringify(line);
}

/** Builds a conversation export line (without `seq`). */
function conversationLine(op: string, syncedAt: string, accountId: string, id: string, raw: unknown): string {
  return JSON.stringify({ op, synced_at: syncedAt, account_id: accountId, id, data: raw });
}

/** The change signal `field` of a conversation's served object (JSON), as a string; null when absent. */
export function signalOf(raw: string | null, field: string): string | null {
  if (raw === null) return null;
  try {
    const v = (JSON.parse(raw) as Record<string, unknown>)[field];
    return v === undefined || v === null ? null : typeof v === 'string' ? v : JSON.stringify(v);
  } catch {
    return null;
  }
}

/**
 * The SQLite mirror. One instance per process and file; better-sqlite3 is synchronous, so every
 * method runs to completion without interleaving.
 *
 * Every public method throws {@link MirrorUnusableError} (naming {@link Mirror.file}) for SQLite
 * errors that make the mirror unusable: `MIRROR_CORRUPT` for a damaged file, `MIRROR_UNWRITABLE`
 * for a full disk, an I/O error or a read-only file. Once corruption was seen, every later write
 * of this instance throws that same error without touching the file. Write methods of a mirror
 * opened `readonly` throw {@link StoreError}. Statements run directly on {@link Mirror.db} are not
 * converted: pass their errors to `asMirrorError(err, mirror.file)`.
 */
export class Mirror {
  readonly db: Db;
  /** Absolute path of the SQLite file (`:memory:` for an in-memory mirror). */
  readonly file: string;
  private readonly clock: Clock;
  private readonly st: Record<string, Statement>;
  private readonly readOnly: boolean;
  /** How this instance reads its file; see {@link MirrorOptions.readonly}. */
  readonly access: MirrorAccess;
  /** For an `'immutable'` open: the file and its `-wal` as they were just before the open. */
  private readonly openedState: FileState | undefined;
  /** Set at the first corruption seen: from then on this instance writes nothing. */
  private damaged: MirrorUnusableError | undefined;

  private constructor(
    db: Db,
    file: string,
    clock: Clock,
    access: MirrorAccess,
    private readonly release: () => void,
    openedState?: FileState,
  ) {
    this.db = db;
    this.file = file;
    this.clock = clock;
    this.access = access;
    this.readOnly = access !== 'read-write';
    this.openedState = openedState;
    this.st = this.prepare();
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
    if (file === ':memory:') {
      if (opts.readonly) throw new StoreError('an in-memory mirror cannot be opened read-only: there is nothing to read', { file });
      const db = new Database(file);
      try {
        db.pragma('foreign_keys = ON');
        Mirror.migrate(db, file);
        return new Mirror(db, file, clock, 'read-write', () => {});
      } catch (err) {
        db.close();
        throw err;
      }
    }
    const abs = path.resolve(file);
    return opts.readonly ? Mirror.openReadonly(abs, clock) : Mirror.openWriter(abs, clock, opts);
  }

  private static openWriter(abs: string, clock: Clock, opts: MirrorOptions): Mirror {
    const modes = opts.modes ?? PRIVATE_MODES;
    try {
      mkdirPrivate(path.dirname(abs), modes);
    } catch (err) {
      throw new StoreError(`cannot create the directory of the mirror ${abs}: ${(err as Error).message}`, { file: abs }, err);
    }
    const release = opts.lock !== false ? acquireWriterLock(abs, modes) : () => {};
    let db: Db | undefined;
    try {
      if (!fs.existsSync(abs)) {
        try {
          fs.closeSync(createPrivateFile(abs, modes));
        } catch (err) {
          // Created meanwhile by another process: not ours, opened as it is.
          if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
            throw new StoreError(`cannot create the mirror ${abs}: ${(err as Error).message}`, { file: abs }, err);
          }
        }
      }
      db = new Database(abs);
      db.pragma('busy_timeout = 10000');
      // Before anything is changed: a database that is not ours (or is newer) is left as it is.
      Mirror.checkSchema(db, abs, false);
      db.pragma('journal_mode = WAL');
      db.pragma('synchronous = FULL');
      db.pragma('foreign_keys = ON');
      Mirror.migrate(db, abs);
      return new Mirror(db, abs, clock, 'read-write', release);
    } catch (err) {
      if (db?.open) db.close();
      release();
      throw Mirror.openError(err, abs, 'open');
    }
  }

  /** Attempts of a read-only open when the file changes under it (copy or immutable open). */
  private static readonly OPEN_ATTEMPTS = 3;

  private static openReadonly(abs: string, clock: Clock): Mirror {
    if (!fs.existsSync(abs)) throw new StoreError(`no mirror at ${abs}: the file does not exist (a read-only open creates nothing)`, { file: abs });
    for (let attempt = 1; attempt <= Mirror.OPEN_ATTEMPTS; attempt++) {
      if (writerIsLive(abs)) break; // read as the writer's readers do
      const state = fileState(abs);
      if (state.walBytes === 0) {
        try {
          return Mirror.openImmutable(abs, clock, state);
        } catch (err) {
          // A writer came along between the look and the read: what was read is not the file.
          if (attempt < Mirror.OPEN_ATTEMPTS && !sameState(state, fileState(abs))) continue;
          throw err;
        }
      }
      const copy = privateCopy(abs);
      if (copy) return Mirror.openPrivateCopy(abs, clock, copy);
    }
    return Mirror.openShared(abs, clock);
  }

  /** Opens `abs` `immutable` (creates nothing, reads the file alone); `state` is what it was just before. */
  private static openImmutable(abs: string, clock: Clock, state: FileState): Mirror {
    let db: Db;
    try {
      db = new Database(sqliteUri(abs, { immutable: '1' }), { readonly: true, fileMustExist: true });
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'SQLITE_CANTOPEN' && fs.existsSync(abs)) {
        throw new StoreError(
          `cannot open the mirror ${abs} read-only: SQLite did not take the URI filename; SQLITE_USE_URI must be 1 (or unset) when better-sqlite3 loads`,
          { file: abs },
          err,
        );
      }
      throw Mirror.openError(err, abs, 'open read-only', true);
    }
    return Mirror.readonlyMirror(db, abs, clock, 'immutable', () => {}, state);
  }

  /** A normal read-only connection: shares the live writer's `-wal` and `-shm`. */
  private static openShared(abs: string, clock: Clock): Mirror {
    let db: Db;
    try {
      db = new Database(abs, { readonly: true, fileMustExist: true });
    } catch (err) {
      throw Mirror.openError(err, abs, 'open read-only', true);
    }
    return Mirror.readonlyMirror(db, abs, clock, 'shared', () => {});
  }

  /** Opens the private copy of `abs` (SQLite recovers its WAL there); closing removes the copy. */
  private static openPrivateCopy(abs: string, clock: Clock, copy: { dir: string; file: string }): Mirror {
    const remove = () => removePrivateCopy(copy.dir);
    let db: Db;
    try {
      db = new Database(copy.file, { fileMustExist: true });
    } catch (err) {
      remove();
      throw Mirror.openError(err, abs, 'open read-only', true);
    }
    return Mirror.readonlyMirror(db, abs, clock, 'private-copy', remove);
  }

  /** Checks the schema of a read-only connection and wraps it; closes it (and runs `release`) on failure. */
  private static readonlyMirror(db: Db, abs: string, clock: Clock, access: MirrorAccess, release: () => void, state?: FileState): Mirror {
    try {
      db.pragma('busy_timeout = 10000');
      if (access === 'private-copy') db.pragma('query_only = ON');
      Mirror.checkSchema(db, abs, true);
      return new Mirror(db, abs, clock, access, release, state);
    } catch (err) {
      db.close();
      release();
      throw Mirror.openError(err, abs, 'open read-only', true);
    }
  }

  /**
   * The error to throw for a failed open: a {@link MirrorUnusableError} for SQLite codes that
   * make the file unusable (for a read-only open, corruption only), a {@link StoreError} naming the
   * file otherwise.
   */
  private static openError(err: unknown, abs: string, what: string, readOnly = false): unknown {
    if (err instanceof StoreError) return err;
    const code = (err as { code?: unknown } | null)?.code;
    if (!readOnly || (typeof code === 'string' && isCorruptionCode(code))) {
      const e = asMirrorError(err, abs);
      if (e instanceof MirrorUnusableError) return e;
    }
    return new StoreError(`cannot ${what} the mirror ${abs}: ${(err as Error).message}`, { file: abs }, err);
  }

  /**
   * Checks the schema version; returns it.
   *
   * @throws {@link StoreError} when the file is not a convo-mirror database, is newer than this
   *   code, or (`readOnly`) older than this code
   */
  private static checkSchema(db: Db, file: string, readOnly: boolean): number {
    const version = db.pragma('user_version', { simple: true }) as number;
    if (version > MIGRATIONS.length) {
      throw new StoreError(
        `the mirror ${file} has schema version ${version}, newer than this convo-mirror knows (${MIGRATIONS.length}); upgrade convo-mirror`,
        { file, version },
      );
    }
    if (version === 0) {
      const foreign = db.prepare(`SELECT count(*) AS n FROM sqlite_master WHERE type = 'table'`).get() as { n: number };
      if (foreign.n > 0 || readOnly) throw new StoreError(`${file} is ${foreign.n > 0 ? 'a SQLite database but ' : ''}not a convo-mirror mirror`, { file });
    }
    if (readOnly && version < MIGRATIONS.length) {
      throw new StoreError(
        `the mirror ${file} has schema version ${version}, older than this convo-mirror's (${MIGRATIONS.length}); ` +
          'read-only commands never migrate: run convo-mirror sync (which migrates it) first',
        { file, version },
      );
    }
    return version;
  }

  private static migrate(db: Db, file: string): void {
    const version = Mirror.checkSchema(db, file, false);
    for (let v = version; v < MIGRATIONS.length; v++) {
      db.transaction(() => {
        db.exec(MIGRATIONS[v]!);
        db.pragma(`user_version = ${v + 1}`);
      }).immediate();
    }
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

  private prepare(): Record<string, Statement> {
    const p = (sql: string) => this.db.prepare(sql);
    return {
      getMessage: p(`SELECT raw, position, deleted_at, updated_at FROM messages WHERE account_id = ? AND conversation_id = ? AND id = ?`),
      upsertMessage: p(`
        INSERT INTO messages (account_id, conversation_id, id, position, content, visibility, sender_id, sender_name, sender_type,
                              attachments, created_at, raw, first_seen_at, updated_at, deleted_at)
        VALUES (@account_id, @conversation_id, @id, @position, @content, @visibility, @sender_id, @sender_name, @sender_type,
                @attachments, @created_at, @raw, @now, @now, NULL)
        ON CONFLICT (account_id, conversation_id, id) DO UPDATE SET
          position = excluded.position, content = excluded.content, visibility = excluded.visibility,
          sender_id = excluded.sender_id, sender_name = excluded.sender_name, sender_type = excluded.sender_type,
          attachments = excluded.attachments, created_at = excluded.created_at, raw = excluded.raw,
          updated_at = CASE WHEN messages.raw IS NOT excluded.raw OR messages.deleted_at IS NOT NULL
                            THEN excluded.updated_at ELSE messages.updated_at END,
          deleted_at = NULL
        WHERE messages.raw IS NOT excluded.raw OR messages.position IS NOT excluded.position OR messages.deleted_at IS NOT NULL`),
      insertHistory: p(`INSERT INTO message_history (account_id, conversation_id, id, raw, valid_from, valid_to, replaced_by_seq)
                        VALUES (?, ?, ?, ?, ?, ?, ?)`),
      insertChange: p(`INSERT INTO change_log (stream, op, account_id, conversation_id, record_id, synced_at, run_id, line)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
      getConversation: p(`SELECT raw, deleted_at FROM conversations WHERE account_id = ? AND id = ?`),
      upsertConversation: p(`
        INSERT INTO conversations (account_id, id, raw, first_seen_at, updated_at)
        VALUES (@account_id, @id, @raw, @now, @now)
        ON CONFLICT (account_id, id) DO UPDATE SET raw = excluded.raw, updated_at = excluded.updated_at, deleted_at = NULL,
          -- a conversation back from a tombstone gets a full crawl, whatever its change signal says
          message_count = CASE WHEN conversations.deleted_at IS NULL THEN conversations.message_count END,
          crawled_signal = CASE WHEN conversations.deleted_at IS NULL THEN conversations.crawled_signal END
        WHERE conversations.raw IS NOT excluded.raw OR conversations.deleted_at IS NOT NULL`),
      insertConversation: p(`INSERT INTO conversations (account_id, id, raw, first_seen_at, updated_at) VALUES (?, ?, ?, ?, ?)`),
      getCheckpoint: p(`SELECT next_page, total_count, updated_at, run_id FROM checkpoints WHERE account_id = ? AND conversation_id = ?`),
      crawlIds: p(`SELECT page, ids FROM crawl_pages WHERE account_id = ? AND conversation_id = ? ORDER BY page`),
      saveCheckpoint: p(`
        INSERT INTO checkpoints (account_id, conversation_id, next_page, total_count, crawl_started_at, run_id, updated_at)
        VALUES (?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (account_id, conversation_id) DO UPDATE SET next_page = excluded.next_page,
          total_count = excluded.total_count, run_id = excluded.run_id, updated_at = excluded.updated_at`),
      saveCrawlPage: p(`INSERT OR REPLACE INTO crawl_pages (account_id, conversation_id, page, ids) VALUES (?, ?, ?, ?)`),
      clearCheckpoint: p(`DELETE FROM checkpoints WHERE account_id = ? AND conversation_id = ?`),
      clearCrawlPages: p(`DELETE FROM crawl_pages WHERE account_id = ? AND conversation_id = ?`),
      unseenLive: p(`
        SELECT id, raw FROM messages
        WHERE account_id = @account_id AND conversation_id = @conversation_id AND deleted_at IS NULL
          AND id NOT IN (SELECT j.value FROM crawl_pages c, json_each(c.ids) j
                         WHERE c.account_id = @account_id AND c.conversation_id = @conversation_id)`),
      liveMessages: p(`SELECT id, raw FROM messages WHERE account_id = ? AND conversation_id = ? AND deleted_at IS NULL`),
      tombstoneMessage: p(`UPDATE messages SET deleted_at = ? WHERE account_id = ? AND conversation_id = ? AND id = ?`),
      finishConversation: p(`UPDATE conversations SET message_count = ?, last_synced_at = ? WHERE account_id = ? AND id = ?`),
      tombstoneConversation: p(`UPDATE conversations SET deleted_at = ? WHERE account_id = ? AND id = ? AND deleted_at IS NULL`),
      crawlSeenCount: p(`SELECT count(DISTINCT j.value) AS n FROM crawl_pages c, json_each(c.ids) j WHERE c.account_id = ? AND c.conversation_id = ?`),
      setCrawledSignal: p(`UPDATE conversations SET crawled_signal = ? WHERE account_id = ? AND id = ?`),
      runStatus: p(`SELECT status FROM runs WHERE id = ?`),
      resumeRun: p(`UPDATE runs SET status = 'running', ended_at = NULL, error = NULL, resumes = resumes + 1 WHERE id = ? AND status = 'interrupted'`),
      reviveConversation: p(`UPDATE conversations SET deleted_at = NULL, message_count = NULL, crawled_signal = NULL, updated_at = ? WHERE account_id = ? AND id = ?`),
      deleteRunFailures: p(`DELETE FROM run_failures WHERE run_id = ?`),
      insertRunFailure: p(`INSERT INTO run_failures (run_id, conversation_id, code, status, attempts, message, at) VALUES (?, ?, ?, ?, ?, ?, ?)`),
    };
  }

  // ---------------------------------------------------------------- runs

  /**
   * Records the start of a run (status `running`) with its scope, refresh and trigger (the legacy
   * `mode` column gets the scope).
   *
   * @returns the new run id
   */
  startRun(run: RunStart): number {
    return this.write(() => {
      const r = this.db
        .prepare(`INSERT INTO runs (mode, scope, refresh, trigger, account_id, started_at, status) VALUES (?, ?, ?, ?, ?, ?, 'running')`)
        .run(run.scope, run.scope, run.refresh, run.trigger, run.accountId, isoNow(this.clock));
      return Number(r.lastInsertRowid);
    });
  }

  /**
   * Marks runs still `running` as `interrupted`: their process died. Call once at start-up while
   * holding the writer lock (then no other process can have a live run), never while runs of this
   * process are in flight.
   *
   * @returns how many runs were marked
   */
  markInterruptedRuns(): number {
    return this.write(
      () => this.db.prepare(`UPDATE runs SET status = 'interrupted', ended_at = coalesce(ended_at, ?) WHERE status = 'running'`).run(isoNow(this.clock)).changes,
    );
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
    return this.write(() =>
      this.db
        .transaction((): 'running' | 'resumed' | 'ended' => {
          const r = this.st.runStatus!.get(runId) as { status: string } | undefined;
          if (r?.status === 'running') return 'running';
          if (r?.status !== 'interrupted') return 'ended';
          this.st.resumeRun!.run(runId);
          return 'resumed';
        })
        .immediate(),
    );
  }

  /** A run's status (`running`, `succeeded`, `partial`, `failed`, `interrupted`); undefined for an unknown id. */
  runStatus(runId: number): string | undefined {
    return this.guard(() => (this.st.runStatus!.get(runId) as { status: string } | undefined)?.status);
  }

  /** Whether a run has ended (any final status). */
  runEnded(runId: number): boolean {
    return this.guard(() => {
      const r = this.db.prepare(`SELECT status FROM runs WHERE id = ?`).get(runId) as { status: string } | undefined;
      return r !== undefined && r.status !== 'running';
    });
  }

  /** Records a run's end and figures. */
  finishRun(runId: number, figures: RunFigures): void {
    return this.write(() => {
      const cols = Object.keys(figures);
      const sets = cols.map((c) => `${c} = @${c}`).join(', ');
      this.db.prepare(`UPDATE runs SET ${sets}, ended_at = @ended_at WHERE id = @id`).run({ ...figures, ended_at: isoNow(this.clock), id: runId });
    });
  }

  /**
   * Records the conversations that failed in a run (by id, with each error's code, status, attempts
   * and message), replacing what was recorded for that run before: recording twice (a retried
   * finish step) keeps one row per failure.
   */
  recordFailures(runId: number, failures: RunFailureRecord[]): void {
    return this.write(() => {
      const at = isoNow(this.clock);
      this.db.transaction(() => {
        this.st.deleteRunFailures!.run(runId);
        for (const f of failures) this.st.insertRunFailure!.run(runId, f.id, f.code, f.status, f.attempts, f.message, at);
      }).immediate();
    });
  }

  /** The last `limit` runs, newest first (every column of `runs`). */
  lastRuns(limit: number): Record<string, unknown>[] {
    return this.guard(() => {
      return this.db.prepare(`SELECT * FROM runs ORDER BY id DESC LIMIT ?`).all(limit) as Record<string, unknown>[];
    });
  }

  /** Failures recorded for the newest finished run. */
  lastRunFailures(): Record<string, unknown>[] {
    return this.guard(() => {
      return this.db
        .prepare(
          `SELECT run_id, conversation_id, code, status, attempts, message, at FROM run_failures
           WHERE run_id = (SELECT max(id) FROM runs WHERE status <> 'running') ORDER BY at`,
        )
        .all() as Record<string, unknown>[];
    });
  }

  /** Live (not tombstoned) conversations and messages of one account. */
  liveCounts(accountId: string): { conversations: number; messages: number } {
    return this.guard(() => {
      const n = (sql: string) => (this.db.prepare(sql).get(accountId) as { n: number }).n;
      return {
        conversations: n(`SELECT count(*) AS n FROM conversations WHERE account_id = ? AND deleted_at IS NULL`),
        messages: n(`SELECT count(*) AS n FROM messages WHERE account_id = ? AND deleted_at IS NULL`),
      };
    });
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
      const counts = zeroCounts();
      const now = isoNow(this.clock);
      this.db.transaction(() => {
        page.raw.forEach((obj, i) => {
          const id = page.data[i]!.id;
          const raw = JSON.stringify(obj);
          const prev = this.st.getConversation!.get(accountId, id) as { raw: string | null; deleted_at: string | null } | undefined;
          if (prev && prev.raw === raw && prev.deleted_at === null) {
            counts.unchanged++;
            return;
          }
          this.st.upsertConversation!.run({ account_id: accountId, id, raw, now });
          const op = !prev || prev.raw === null || prev.deleted_at !== null ? 'insert' : 'update';
          if (op === 'insert') counts.inserted++;
          else counts.updated++;
          this.st.insertChange!.run('conversations', op, accountId, id, id, now, runId, conversationLine(op, now, accountId, id, obj));
        });
      }).immediate();
      return counts;
    });
  }

  /**
   * Makes sure a conversation whose messages are being committed has a live row, and that the
   * exports know it. One synced by id (never listed) gets `raw` `{"id": ...}` (the only field we
   * know) with an `insert` change; the next listing replaces it with the object as served (an
   * `update`). A tombstoned one is revived with an `insert` change carrying its last known `raw`,
   * and its crawl baseline (`message_count`, `crawled_signal`) is cleared. Call inside a transaction.
   */
  private ensureConversation(accountId: string, conversationId: string, now: string, runId: number | null): void {
    const prev = this.st.getConversation!.get(accountId, conversationId) as { raw: string | null; deleted_at: string | null } | undefined;
    if (prev && prev.deleted_at === null) return;
    if (prev) {
      this.st.reviveConversation!.run(now, accountId, conversationId);
      const last: unknown = prev.raw === null ? { id: conversationId } : JSON.parse(prev.raw);
      this.st.insertChange!.run('conversations', 'insert', accountId, conversationId, conversationId, now, runId, conversationLine('insert', now, accountId, conversationId, last));
      return;
    }
    const obj = { id: conversationId };
    this.st.insertConversation!.run(accountId, conversationId, JSON.stringify(obj), now, now);
    this.st.insertChange!.run('conversations', 'insert', accountId, conversationId, conversationId, now, runId, conversationLine('insert', now, accountId, conversationId, obj));
  }

  /**
   * Forgets the change signal a conversation was last crawled at (`crawled_signal = NULL`), so the
   * next incremental sync asks the API about it whatever its signal says (e.g. after it failed in
   * a run). Its message count and messages are kept: that sync may still crawl incrementally.
   * Nothing happens for an unknown conversation.
   */
  forgetCrawlBaseline(accountId: string, conversationId: string): void {
    this.write(() => {
      this.st.setCrawledSignal!.run(null, accountId, conversationId);
    });
  }

  /** Whether the mirror has a row (live or tombstoned) for this conversation. */
  hasConversation(accountId: string, conversationId: string): boolean {
    return this.guard(() => {
      return this.st.getConversation!.get(accountId, conversationId) !== undefined;
    });
  }

  /** Ids of conversations mirrored and not tombstoned. */
  liveConversationIds(accountId: string): string[] {
    return this.guard(() => {
      return (
        this.db.prepare(`SELECT id FROM conversations WHERE account_id = ? AND deleted_at IS NULL ORDER BY id`).all(accountId) as { id: string }[]
      ).map((r) => r.id);
    });
  }

  /**
   * Tombstones a conversation the API answered 404 for, and its live messages, in one transaction,
   * with `delete` change-log rows. Nothing is hard-deleted.
   */
  tombstoneConversation(accountId: string, conversationId: string, runId: number | null): { conversation: boolean; messages: number } {
    return this.write(() => {
      const now = isoNow(this.clock);
      return this.db.transaction(() => {
        const msgs = this.st.liveMessages!.all(accountId, conversationId) as { id: string; raw: string }[];
        for (const m of msgs) {
          this.st.tombstoneMessage!.run(now, accountId, conversationId, m.id);
          this.st.insertChange!.run('messages', 'delete', accountId, conversationId, m.id, now, runId, messageLine('delete', now, accountId, conversationId, JSON.parse(m.raw)));
        }
        const prev = this.st.getConversation!.get(accountId, conversationId) as { raw: string | null; deleted_at: string | null } | undefined;
        let conversation = false;
        if (prev && prev.deleted_at === null) {
          this.st.tombstoneConversation!.run(now, accountId, conversationId);
          if (prev.raw !== null) {
            this.st.insertChange!.run('conversations', 'delete', accountId, conversationId, conversationId, now, runId, conversationLine('delete', now, accountId, conversationId, JSON.parse(prev.raw)));
          }
          conversation = true;
        }
        this.st.clearCheckpoint!.run(accountId, conversationId);
        this.st.clearCrawlPages!.run(accountId, conversationId);
        return { conversation, messages: msgs.length };
      }).immediate();
    });
  }

  // ---------------------------------------------------------------- message crawls

  /** The committed checkpoint of an unfinished crawl, if any. */
  loadCheckpoint(accountId: string, conversationId: string): Checkpoint | undefined {
    return this.guard(() => {
      const cp = this.st.getCheckpoint!.get(accountId, conversationId) as
        | { next_page: number; total_count: number; updated_at: string; run_id: number | null }
        | undefined;
      if (!cp) return undefined;
      const seenIds = new Set<string>();
      let lastPageIds: string[] = [];
      for (const row of this.st.crawlIds!.all(accountId, conversationId) as { page: number; ids: string }[]) {
        const ids = JSON.parse(row.ids) as string[];
        for (const id of ids) seenIds.add(id);
        if (row.page === cp.next_page - 1) lastPageIds = ids;
      }
      return { nextPage: cp.next_page, totalCount: cp.total_count, seenIds, lastPageIds, updatedAt: Date.parse(cp.updated_at), runId: cp.run_id };
    });
  }

  /** Forgets a crawl's checkpoint and seen ids (the crawl restarts from page 1). */
  resetCrawl(accountId: string, conversationId: string): void {
    return this.write(() => {
      this.db.transaction(() => {
        this.st.clearCheckpoint!.run(accountId, conversationId);
        this.st.clearCrawlPages!.run(accountId, conversationId);
      }).immediate();
    });
  }

  /**
   * Commits one page of a conversation's messages in one transaction: upserts (unchanged rows are
   * skipped), a change-log row per insert or update, the superseded version of each edited message
   * in `message_history`, the page's ids and the checkpoint (`next_page = page + 1`).
   *
   * Positions are `(page - 1) * 100 + index` (spec 4.1: chronological order, per_page=100).
   */
  commitMessagesPage(accountId: string, conversationId: string, page: Page<Message>, runId: number | null): WriteCounts {
    return this.write(() => {
      const counts = zeroCounts();
      const now = isoNow(this.clock);
      const offset = (page.page - 1) * PER_PAGE;
      this.db.transaction(() => {
        this.ensureConversation(accountId, conversationId, now, runId);
        const ids: string[] = [];
        page.data.forEach((m, i) => {
          const obj = page.raw[i]!;
          const raw = JSON.stringify(obj);
          const position = offset + i;
          ids.push(m.id);
          const prev = this.st.getMessage!.get(accountId, conversationId, m.id) as
            | { raw: string; position: number; deleted_at: string | null; updated_at: string }
            | undefined;
          if (prev && prev.raw === raw && prev.position === position && prev.deleted_at === null) {
            counts.unchanged++;
            return;
          }
          this.st.upsertMessage!.run({
            account_id: accountId,
            conversation_id: conversationId,
            id: m.id,
            position,
            content: m.content,
            visibility: m.visibility,
            sender_id: m.sender.id,
            sender_name: m.sender.name,
            sender_type: m.sender.type,
            attachments: obj.attachments === undefined ? null : JSON.stringify(obj.attachments),
            created_at: m.created_at,
            raw,
            now,
          });
          if (prev && prev.raw === raw && prev.deleted_at === null) {
            counts.unchanged++; // only the position moved (an earlier message was deleted): not a change of the record
            return;
          }
          const op = !prev || prev.deleted_at !== null ? 'insert' : 'update';
          const r = this.st.insertChange!.run('messages', op, accountId, conversationId, m.id, now, runId, messageLine(op, now, accountId, conversationId, obj));
          if (op === 'update') {
            this.st.insertHistory!.run(accountId, conversationId, m.id, prev!.raw, prev!.updated_at, now, Number(r.lastInsertRowid));
            counts.updated++;
          } else counts.inserted++;
        });
        this.st.saveCrawlPage!.run(accountId, conversationId, page.page, JSON.stringify(ids));
        this.st.saveCheckpoint!.run(accountId, conversationId, page.page + 1, page.meta.total_count, now, runId, now);
      }).immediate();
      return counts;
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
      const now = isoNow(this.clock);
      return this.db.transaction(() => {
        const gone = this.st.unseenLive!.all({ account_id: accountId, conversation_id: conversationId }) as { id: string; raw: string }[];
        for (const m of gone) {
          this.st.tombstoneMessage!.run(now, accountId, conversationId, m.id);
          this.st.insertChange!.run('messages', 'delete', accountId, conversationId, m.id, now, runId, messageLine('delete', now, accountId, conversationId, JSON.parse(m.raw)));
        }
        const seen = this.st.crawlSeenCount!.get(accountId, conversationId) as { n: number };
        this.ensureConversation(accountId, conversationId, now, runId);
        this.st.finishConversation!.run(seen.n, now, accountId, conversationId);
        if (changeField) {
          const conv = this.st.getConversation!.get(accountId, conversationId) as { raw: string | null };
          this.st.setCrawledSignal!.run(signalOf(conv.raw, changeField), accountId, conversationId);
        }
        this.st.clearCheckpoint!.run(accountId, conversationId);
        this.st.clearCrawlPages!.run(accountId, conversationId);
        return { deleted: gone.length, messageCount: seen.n };
      }).immediate();
    });
  }

  // ---------------------------------------------------------------- incremental sync

  /**
   * What the last complete crawl of a conversation left: its message count and the change signal
   * it was crawled at. `messageCount` is null when no crawl ever completed.
   */
  crawlState(accountId: string, conversationId: string): { messageCount: number | null; crawledSignal: string | null; raw: string | null } {
    return this.guard(() => {
      const r = this.db
        .prepare(`SELECT message_count, crawled_signal, raw FROM conversations WHERE account_id = ? AND id = ? AND deleted_at IS NULL`)
        .get(accountId, conversationId) as { message_count: number | null; crawled_signal: string | null; raw: string | null } | undefined;
      return { messageCount: r?.message_count ?? null, crawledSignal: r?.crawled_signal ?? null, raw: r?.raw ?? null };
    });
  }

  /** Id of the live message at `position` (0-based, chronological), if any. */
  messageIdAt(accountId: string, conversationId: string, position: number): string | undefined {
    return this.guard(() => {
      const r = this.db
        .prepare(`SELECT id FROM messages WHERE account_id = ? AND conversation_id = ? AND position = ? AND deleted_at IS NULL LIMIT 1`)
        .get(accountId, conversationId, position) as { id: string } | undefined;
      return r?.id;
    });
  }

  /**
   * Starts an incremental crawl: the live messages before `beforePosition` count as seen (as a
   * pseudo page 0 of the crawl), so completing the crawl tombstones only what the fetched pages no
   * longer serve. Clears any previous crawl state first.
   *
   * @returns the seeded ids
   */
  seedIncrementalCrawl(accountId: string, conversationId: string, beforePosition: number): string[] {
    return this.write(() => {
      return this.db.transaction(() => {
        this.st.clearCheckpoint!.run(accountId, conversationId);
        this.st.clearCrawlPages!.run(accountId, conversationId);
        const ids = (
          this.db
            .prepare(`SELECT id FROM messages WHERE account_id = ? AND conversation_id = ? AND position < ? AND deleted_at IS NULL ORDER BY position`)
            .all(accountId, conversationId, beforePosition) as { id: string }[]
        ).map((r) => r.id);
        this.st.saveCrawlPage!.run(accountId, conversationId, 0, JSON.stringify(ids));
        return ids;
      }).immediate();
    });
  }


  // ---------------------------------------------------------------- export ledger

  /** The exported watermark: the last `change_log.seq` published. */
  exportWatermark(): number {
    return this.guard(() => (this.db.prepare(`SELECT watermark FROM export_state WHERE id = 1`).get() as { watermark: number }).watermark);
  }

  /**
   * The batch to publish, in one transaction: the planned, unpublished one left by an interrupted
   * publication (`resumed`), else a new batch over `(watermark, max(seq)]`, its range fixed before
   * any file is written. Undefined when nothing waits.
   *
   * @param plannedAt - ISO 8601 UTC time recorded on a new batch
   */
  planExportBatch(runId: number | null, plannedAt: string): ExportBatch | undefined {
    return this.write(() =>
      this.db.transaction((): ExportBatch | undefined => {
        const pending = this.db.prepare(`SELECT id, first_seq, last_seq FROM export_batches WHERE published_at IS NULL ORDER BY id LIMIT 1`).get() as
          | { id: number; first_seq: number; last_seq: number }
          | undefined;
        if (pending) return { ...pending, resumed: true };
        const wm = (this.db.prepare(`SELECT watermark FROM export_state WHERE id = 1`).get() as { watermark: number }).watermark;
        const max = (this.db.prepare(`SELECT coalesce(max(seq), 0) AS m FROM change_log`).get() as { m: number }).m;
        if (max <= wm) return undefined;
        const r = this.db.prepare(`INSERT INTO export_batches (first_seq, last_seq, planned_at, run_id) VALUES (?, ?, ?, ?)`).run(wm + 1, max, plannedAt, runId);
        return { id: Number(r.lastInsertRowid), first_seq: wm + 1, last_seq: max, resumed: false };
      }).immediate(),
    );
  }

  /**
   * The change-log rows of a batch, in file order: by stream, account, UTC day of `synced_at`, seq.
   * Streamed (bounded memory); each `line` is the export line without `seq`.
   */
  *changesOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): Generator<ExportChange> {
    const rows = this.guard(
      () =>
        this.db
          .prepare(
            `SELECT seq, stream, account_id, substr(synced_at, 1, 10) AS day, line FROM change_log
             WHERE seq BETWEEN ? AND ? ORDER BY stream, account_id, day, seq`,
          )
          .iterate(batch.first_seq, batch.last_seq) as IterableIterator<ExportChange>,
    );
    // Each step reads pages too: a damaged one surfaces here, converted like any other read. A
    // reader that stops early (a failed write) must release the statement, or the connection stays busy.
    try {
      for (let r = this.guard(() => rows.next()); !r.done; r = this.guard(() => rows.next())) yield r.value;
    } finally {
      rows.return?.();
    }
  }

  /**
   * Records a published batch in one transaction: its files, the batch marked published, and the
   * watermark moved to its last seq. Call only once every file and the manifest are in place.
   *
   * @param publishedAt - ISO 8601 UTC time recorded on the files and the batch
   */
  recordPublication(batch: Pick<ExportBatch, 'id' | 'last_seq'>, files: PublishedFile[], publishedAt: string): void {
    this.write(() =>
      this.db.transaction(() => {
        const ins = this.db.prepare(`INSERT OR REPLACE INTO export_files (path, batch_id, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, published_at)
                                     VALUES (@path, @batch_id, @stream, @account_id, @date, @first_seq, @last_seq, @lines, @bytes, @sha256, @now)`);
        for (const f of files) ins.run({ ...f, now: publishedAt });
        this.db.prepare(`UPDATE export_batches SET published_at = ? WHERE id = ?`).run(publishedAt, batch.id);
        this.db.prepare(`UPDATE export_state SET watermark = ? WHERE id = 1`).run(batch.last_seq);
      }).immediate(),
    );
  }

  /** Every published export file as recorded, by first seq then path. */
  publishedFiles(): PublishedFile[] {
    return this.guard(
      () =>
        this.db
          .prepare(`SELECT path, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, batch_id FROM export_files ORDER BY first_seq, path`)
          .all() as PublishedFile[],
    );
  }

  /** Published files and lines in all, and whether any batch was ever published. */
  exportTotals(): { files: number; lines: number; everPublished: boolean } {
    return this.guard(() => {
      const t = this.db.prepare(`SELECT count(*) AS files, coalesce(sum(lines), 0) AS lines FROM export_files`).get() as { files: number; lines: number };
      const b = this.db.prepare(`SELECT count(*) AS n FROM export_batches WHERE published_at IS NOT NULL`).get() as { n: number };
      return { ...t, everPublished: t.files > 0 || b.n > 0 };
    });
  }

  // ---------------------------------------------------------------- reading

  /** This mirror's random id (32 hex digits), fixed at creation. */
  mirrorId(): string {
    return this.guard(() => {
      return (this.db.prepare(`SELECT value FROM mirror_meta WHERE key = 'mirror_id'`).get() as { value: string }).value;
    });
  }

  /** Row counts for `status`. */
  counts(): Record<string, number> {
    return this.guard(() => {
      const one = (sql: string) => (this.db.prepare(sql).get() as { n: number }).n;
      return {
        conversations: one(`SELECT count(*) AS n FROM conversations WHERE deleted_at IS NULL`),
        conversations_tombstoned: one(`SELECT count(*) AS n FROM conversations WHERE deleted_at IS NOT NULL`),
        messages: one(`SELECT count(*) AS n FROM messages WHERE deleted_at IS NULL`),
        messages_tombstoned: one(`SELECT count(*) AS n FROM messages WHERE deleted_at IS NOT NULL`),
        message_history: one(`SELECT count(*) AS n FROM message_history`),
        change_log: one(`SELECT count(*) AS n FROM change_log`),
        export_watermark: one(`SELECT watermark AS n FROM export_state WHERE id = 1`),
        unexported_changes: one(`SELECT count(*) AS n FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1)`),
        export_files: one(`SELECT count(*) AS n FROM export_files`),
        checkpoints: one(`SELECT count(*) AS n FROM checkpoints`),
        runs: one(`SELECT count(*) AS n FROM runs`),
      };
    });
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
