/**
 * Opening a mirror file: the writer (directories, file, lock, WAL, migrations) and the three
 * read-only strategies (`'immutable'`, `'shared'`, `'private-copy'`, see
 * {@link MirrorOptions.readonly}). What is opened is handed to a `wrap` callback (the facade's
 * constructor) inside the same error handling, so a failure there closes the connection and
 * releases the lock like any other failed open.
 */
import fs from 'node:fs';
import path from 'node:path';
import { Database, sqliteUri, type Db } from './sqlite.js';
import { asMirrorError, isCorruptionCode, MirrorUnusableError, StoreError } from '../../errors.js';
import { createPrivateFile, mkdirPrivate, PRIVATE_MODES } from '../../private-fs.js';
import { checkSchema, migrate } from './schema.js';
import { acquireWriterLock, writerIsLive } from './lock.js';
import { fileState, privateCopy, removePrivateCopy, sameState, type FileState } from './files.js';
import type { MirrorAccess, MirrorOptions } from '../types.js';

/** An open connection to a mirror file, before the facade wraps it. */
export interface Connection {
  db: Db;
  /** Absolute path of the mirror file, or `:memory:`. */
  file: string;
  access: MirrorAccess;
  /** Releases what the open holds besides the connection: the writer lock, or a private copy. */
  release: () => void;
  /** For an `'immutable'` open: the file and its `-wal` as they were just before the open. */
  openedState?: FileState;
}

/** Builds the caller's object from an open {@link Connection}; may throw (the open then fails). */
export type Wrap<M> = (connection: Connection) => M;

/**
 * Page cache of the writer's connection, KiB (better-sqlite3 defaults to 16,000). Part of the flat
 * memory budget (a sync stays under 150 MB whatever the workspace's size): the operating system's
 * file cache holds the rest of the hot pages.
 */
export const WRITER_CACHE_KIB = 8192;

/** Attempts of a read-only open when the file changes under it (copy or immutable open). */
const OPEN_ATTEMPTS = 3;

/**
 * Opens the mirror at `file` (see `SqliteMirror.open` for what a writer and a read-only open do,
 * and what they throw) and returns `wrap`'s result for the connection.
 */
export function openConnection<M>(file: string, opts: MirrorOptions, wrap: Wrap<M>): M {
  if (file === ':memory:') {
    if (opts.readonly) throw new StoreError('an in-memory mirror cannot be opened read-only: there is nothing to read', { file });
    const db = new Database(file);
    try {
      db.pragma('foreign_keys = ON');
      migrate(db, file);
      return wrap({ db, file, access: 'read-write', release: () => {} });
    } catch (err) {
      db.close();
      throw err;
    }
  }
  const abs = path.resolve(file);
  return opts.readonly ? openReadonly(abs, wrap) : openWriter(abs, opts, wrap);
}

/** Creates `abs` with the mirror's modes unless it exists (or was created meanwhile by another process). */
function createMirrorFile(abs: string, opts: MirrorOptions): void {
  if (fs.existsSync(abs)) return;
  try {
    fs.closeSync(createPrivateFile(abs, opts.modes ?? PRIVATE_MODES));
  } catch (err) {
    // Created meanwhile by another process: not ours, opened as it is.
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
      throw new StoreError(`cannot create the mirror ${abs}: ${(err as Error).message}`, { file: abs }, err);
    }
  }
}

function openWriter<M>(abs: string, opts: MirrorOptions, wrap: Wrap<M>): M {
  const modes = opts.modes ?? PRIVATE_MODES;
  try {
    mkdirPrivate(path.dirname(abs), modes);
  } catch (err) {
    throw new StoreError(`cannot create the directory of the mirror ${abs}: ${(err as Error).message}`, { file: abs }, err);
  }
  const release = opts.lock !== false ? acquireWriterLock(abs, modes, opts.onLockAttempt) : () => {};
  let db: Db | undefined;
  try {
    createMirrorFile(abs, opts);
    db = new Database(abs);
    db.pragma('busy_timeout = 10000');
    db.pragma(`cache_size = -${WRITER_CACHE_KIB}`);
    // Before anything is changed: a database that is not ours (or is newer) is left as it is.
    const version = checkSchema(db, abs, false);
    // A new file gets incremental auto-vacuum, so pages freed by pruning go back to the file
    // system (Mirror.recordPublication); it must be set before WAL mode and the first table.
    if (version === 0) db.pragma('auto_vacuum = INCREMENTAL');
    db.pragma('journal_mode = WAL');
    // Group commit: see Mirror.planExportBatch for the durable sync point before every publication.
    db.pragma('synchronous = NORMAL');
    db.pragma('foreign_keys = ON');
    migrate(db, abs);
    return wrap({ db, file: abs, access: 'read-write', release });
  } catch (err) {
    if (db?.open) db.close();
    release();
    throw openError(err, abs, 'open');
  }
}

function openReadonly<M>(abs: string, wrap: Wrap<M>): M {
  if (!fs.existsSync(abs)) throw new StoreError(`no mirror at ${abs}: the file does not exist (a read-only open creates nothing)`, { file: abs });
  for (let attempt = 1; attempt <= OPEN_ATTEMPTS; attempt++) {
    if (writerIsLive(abs)) break; // read as the writer's readers do
    const state = fileState(abs);
    if (state.walBytes === 0) {
      try {
        return openImmutable(abs, state, wrap);
      } catch (err) {
        // A writer came along between the look and the read: what was read is not the file.
        if (attempt < OPEN_ATTEMPTS && !sameState(state, fileState(abs))) continue;
        throw err;
      }
    }
    const copy = privateCopy(abs);
    if (copy) return openPrivateCopy(abs, copy, wrap);
  }
  return openShared(abs, wrap);
}

/** Opens `abs` `immutable` (creates nothing, reads the file alone); `state` is what it was just before. */
function openImmutable<M>(abs: string, state: FileState, wrap: Wrap<M>): M {
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
    throw openError(err, abs, 'open read-only', true);
  }
  return readonlyConnection({ db, file: abs, access: 'immutable', release: () => {}, openedState: state }, wrap);
}

/** A normal read-only connection: shares the live writer's `-wal` and `-shm`. */
function openShared<M>(abs: string, wrap: Wrap<M>): M {
  let db: Db;
  try {
    db = new Database(abs, { readonly: true, fileMustExist: true });
  } catch (err) {
    throw openError(err, abs, 'open read-only', true);
  }
  return readonlyConnection({ db, file: abs, access: 'shared', release: () => {} }, wrap);
}

/** Opens the private copy of `abs` (SQLite recovers its WAL there); releasing removes the copy. */
function openPrivateCopy<M>(abs: string, copy: { dir: string; file: string }, wrap: Wrap<M>): M {
  const remove = () => removePrivateCopy(copy.dir);
  let db: Db;
  try {
    db = new Database(copy.file, { fileMustExist: true });
  } catch (err) {
    remove();
    throw openError(err, abs, 'open read-only', true);
  }
  return readonlyConnection({ db, file: abs, access: 'private-copy', release: remove }, wrap);
}

/** Checks the schema of a read-only connection and wraps it; closes it (and releases) on failure. */
function readonlyConnection<M>(c: Connection, wrap: Wrap<M>): M {
  try {
    c.db.pragma('busy_timeout = 10000');
    if (c.access === 'private-copy') c.db.pragma('query_only = ON');
    checkSchema(c.db, c.file, true);
    return wrap(c);
  } catch (err) {
    c.db.close();
    c.release();
    throw openError(err, c.file, 'open read-only', true);
  }
}

/**
 * The error to throw for a failed open: a {@link MirrorUnusableError} for SQLite codes that
 * make the file unusable (for a read-only open, corruption only), a {@link StoreError} naming the
 * file otherwise.
 */
function openError(err: unknown, abs: string, what: string, readOnly = false): unknown {
  if (err instanceof StoreError) return err;
  const code = (err as { code?: unknown } | null)?.code;
  if (!readOnly || (typeof code === 'string' && isCorruptionCode(code))) {
    const e = asMirrorError(err, abs);
    if (e instanceof MirrorUnusableError) return e;
  }
  return new StoreError(`cannot ${what} the mirror ${abs}: ${(err as Error).message}`, { file: abs }, err);
}
