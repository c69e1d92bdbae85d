/**
 * One writer per mirror file: `<db>.lock` holds the owner's pid and host. A lock whose owner
 * process is gone (crash, SIGKILL) is stale and taken over at once; a live owner means refusal
 * with a clear message. SQLite in WAL mode needs one host anyway, so a pid check is exact.
 */
import fs from 'node:fs';
import os from 'node:os';
import { StoreError } from '../errors.js';

interface LockInfo {
  pid: number;
  host: string;
  since: string;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Takes the writer lock of `dbFile`.
 *
 * @returns a function that releases it (idempotent)
 * @throws {@link StoreError} naming the file and the owning pid when another live process holds it
 */
export function acquireWriterLock(dbFile: string): () => void {
  const lockFile = `${dbFile}.lock`;
  const mine: LockInfo = { pid: process.pid, host: os.hostname(), since: new Date().toISOString() };
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      fs.writeFileSync(lockFile, JSON.stringify(mine), { flag: 'wx' });
      let released = false;
      return () => {
        if (released) return;
        released = true;
        try {
          const now = JSON.parse(fs.readFileSync(lockFile, 'utf8')) as LockInfo;
          if (now.pid === mine.pid && now.host === mine.host) fs.rmSync(lockFile, { force: true });
        } catch {
          /* already gone */
        }
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
        throw new StoreError(`cannot create the lock ${lockFile}: ${(err as Error).message}`, { file: lockFile }, err);
      }
    }
    let owner: LockInfo | undefined;
    try {
      owner = JSON.parse(fs.readFileSync(lockFile, 'utf8')) as LockInfo;
    } catch {
      owner = undefined; // half-written or vanished: treat as stale
    }
    if (owner && (owner.host !== mine.host || alive(owner.pid)) && owner.pid !== process.pid) {
      throw new StoreError(
        `the mirror ${dbFile} is in use by process ${owner.pid} on ${owner.host} since ${owner.since}; ` +
          `wait for it to finish or stop it (a lock left by a dead process is taken over automatically)`,
        { file: dbFile, pid: owner.pid, host: owner.host },
      );
    }
    fs.rmSync(lockFile, { force: true }); // stale: its owner is gone
  }
  throw new StoreError(`cannot take the lock ${lockFile}: it keeps reappearing`, { file: lockFile });
}
