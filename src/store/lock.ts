/**
 * One writer per mirror file. The lock is an exclusive SQLite lock on `<db>.lock`, held for the
 * life of the process: the operating system releases it however the process ends (crash, SIGKILL,
 * OOM), so a stale lock never blocks a restart, even from another container on the same volume.
 * `<db>.lock.json` names the holder (pid, host, since) for the refusal message; it is information
 * only, never the lock itself.
 *
 * Both files are created with the mirror's file mode whatever the umask (SQLite gives the lock's
 * `-journal` the same mode as the lock file).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Database, type Db } from './sqlite.js';
import { StoreError } from '../errors.js';
import { createPrivateFile, PRIVATE_MODES, writeNewPrivateFile, type FileModes } from '../private-fs.js';

interface Owner {
  pid: number;
  host: string;
  since: string;
}

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
 * @returns a function that releases it (idempotent) and removes `<dbFile>.lock.json`
 * @throws {@link StoreError} naming the file and, when known, the holder, if another process
 *   holds it; {@link StoreError} naming the lock file when it cannot be created or opened
 */
export function acquireWriterLock(dbFile: string, modes: FileModes = PRIVATE_MODES): () => void {
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
    lockDb.pragma('busy_timeout = 0');
    lockDb.pragma('locking_mode = EXCLUSIVE');
  } catch (err) {
    lockDb.close();
    throw new StoreError(`cannot open the lock ${lockFile}: ${(err as Error).message}`, { file: lockFile }, err);
  }
  try {
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
