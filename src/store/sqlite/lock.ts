/**
 * One writer per mirror file. The lock is an exclusive SQLite lock on `<db>.lock`, held for the
 * life of the process: the operating system releases it however the process ends (crash, SIGKILL,
 * OOM), so a stale lock never blocks a restart, even from another container on the same volume.
 * `<db>.lock.json` names the holder (pid, host, since) for the refusal message; it is information
 * only, never the lock itself.
 *
 * Both files are created with the mirror's file mode whatever the umask (SQLite gives the lock's
 * `-journal` the same mode as the lock file).
 *
 * Readers ({@link writerIsLive}) test the lock without creating or writing anything: a read-only
 * SQLite read of `<db>.lock`, which fails with `SQLITE_BUSY` while a writer holds it.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Database, type Db } from './sqlite.js';
import { StoreError } from '../../errors.js';
import { createPrivateFile, PRIVATE_MODES, writeNewPrivateFile, type FileModes } from '../../private-fs.js';

interface Owner {
  pid: number;
  host: string;
  since: string;
}

/**
 * How long (ms) {@link acquireWriterLock} waits for the lock before it refuses: long enough to ride
 * out a reader's {@link writerIsLive} probe, short enough that "in use" still answers at once.
 */
const LOCK_WAIT_MS = 250;

/** Creates `file` empty with `modes.file` unless it exists (created meanwhile by another process: left alone). */
function createIfMissing(file: string, modes: FileModes): void {
  if (fs.existsSync(file)) return;
  try {
    fs.closeSync(createPrivateFile(file, modes));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
}

/**
 * Takes the writer lock of `dbFile`. Creates `<dbFile>.lock` (an empty SQLite file) when missing
 * and (re)writes `<dbFile>.lock.json`, both with `modes.file`; the directory must exist.
 *
 * @param dbFile - the mirror's path (made absolute here)
 * @param modes - permission bits of the files created. @defaultValue {@link PRIVATE_MODES}
 * @param onAttempt - test hook, see `MirrorOptions.onLockAttempt`
 * @returns a function that releases it (idempotent) and removes `<dbFile>.lock.json`
 * @throws {@link StoreError} naming the file and, when known, the holder, if another process
 *   holds it; {@link StoreError} naming the lock file when it cannot be created or opened
 */
export function acquireWriterLock(dbFile: string, modes: FileModes = PRIVATE_MODES, onAttempt?: () => void): () => void {
  const abs = path.resolve(dbFile);
  const lockFile = `${abs}.lock`;
  const ownerFile = `${lockFile}.json`;
  let lockDb: Db;
  try {
    createIfMissing(lockFile, modes);
    lockDb = new Database(lockFile);
  } catch (err) {
    throw new StoreError(`cannot open the lock ${lockFile}: ${(err as Error).message}`, { file: lockFile }, err);
  }
  try {
    // Not 0: a reader probing the lock ({@link writerIsLive}) holds a SHARED lock on it for a few
    // microseconds, which must delay a starting writer, not refuse it. A writer that really holds
    // the lock is still reported within this bound.
    lockDb.pragma(`busy_timeout = ${LOCK_WAIT_MS}`);
    lockDb.pragma('locking_mode = EXCLUSIVE');
  } catch (err) {
    lockDb.close();
    throw new StoreError(`cannot open the lock ${lockFile}: ${(err as Error).message}`, { file: lockFile }, err);
  }
  try {
    onAttempt?.();
    lockDb.exec('BEGIN EXCLUSIVE');
  } catch (err) {
    lockDb.close();
    let holder = '';
    try {
      const o = JSON.parse(fs.readFileSync(ownerFile, 'utf8')) as Owner;
      holder = ` by process ${o.pid} on ${o.host} since ${o.since}`;
    } catch {
      /* no owner information */
    }
    throw new StoreError(`the mirror ${dbFile} is in use${holder}; wait for it to finish or stop it`, { file: dbFile, cause: (err as Error).message });
  }
  const owner: Owner = { pid: process.pid, host: os.hostname(), since: new Date().toISOString() };
  try {
    // Ours (only the lock holder writes it), so a leftover of a dead holder is replaced.
    fs.rmSync(ownerFile, { force: true });
    writeNewPrivateFile(ownerFile, JSON.stringify(owner), modes);
  } catch {
    /* information only */
  }
  let released = false;
  return () => {
    if (released) return;
    released = true;
    try {
      fs.rmSync(ownerFile, { force: true });
    } catch {
      /* information only */
    }
    try {
      lockDb.exec('ROLLBACK');
    } catch {
      /* nothing to roll back */
    }
    lockDb.close();
  };
}


/**
 * Whether a live process holds the writer lock of `dbFile` (a running `sync` or daemon), found
 * without creating, changing or locking anything for longer than one read: when `<dbFile>.lock`
 * exists it is opened read-only (`fileMustExist`, so nothing is created, not even in a writable
 * directory; a `-journal` left by a killed holder is neither read as hot nor removed) and read with
 * `busy_timeout = 0`. `SQLITE_BUSY` means a holder has it. Works in a read-only directory, on a
 * read-only mount and as a user who may only read the lock file.
 *
 * Writers opened with `lock: false` (tests, benchmarks) are not seen.
 *
 * @param dbFile - the mirror's path (made absolute here)
 * @returns true while another connection (in this process or another) holds the lock; false when
 *   the lock file is missing, free, unreadable or not a SQLite file (then nothing can be said, and
 *   callers must not rely on a writer being absent: see `Mirror.snapshotChanged`)
 */
export function writerIsLive(dbFile: string): boolean {
  const lockFile = `${path.resolve(dbFile)}.lock`;
  if (!fs.existsSync(lockFile)) return false;
  let probe: Db;
  try {
    probe = new Database(lockFile, { readonly: true, fileMustExist: true });
  } catch {
    return false;
  }
  try {
    probe.pragma('busy_timeout = 0');
    probe.prepare('SELECT count(*) FROM sqlite_master').get();
    return false;
  } catch (err) {
    const code = (err as { code?: unknown } | null)?.code;
    return typeof code === 'string' && code.startsWith('SQLITE_BUSY');
  } finally {
    probe.close();
  }
}
