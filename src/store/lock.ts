/**
 * One writer per mirror file. The lock is an exclusive SQLite lock on `<db>.lock`, held for the
 * life of the process: the operating system releases it however the process ends (crash, SIGKILL,
 * OOM), so a stale lock never blocks a restart, even from another container on the same volume.
 * `<db>.lock.json` names the holder (pid, host, since) for the refusal message; it is information
 * only, never the lock itself.
 */
import fs from 'node:fs';
import os from 'node:os';
import Database from 'better-sqlite3';
import { StoreError } from '../errors.js';

interface Owner {
  pid: number;
  host: string;
  since: string;
}

/**
 * Takes the writer lock of `dbFile`.
 *
 * @returns a function that releases it (idempotent)
 * @throws {@link StoreError} naming the file and, when known, the holder, if another process holds it
 */
export function acquireWriterLock(dbFile: string): () => void {
  const lockFile = `${dbFile}.lock`;
  const ownerFile = `${lockFile}.json`;
  let lockDb: Database.Database;
  try {
    lockDb = new Database(lockFile);
    lockDb.pragma('busy_timeout = 0');
    lockDb.pragma('locking_mode = EXCLUSIVE');
  } catch (err) {
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
    fs.writeFileSync(ownerFile, JSON.stringify(owner));
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
