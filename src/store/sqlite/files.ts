/**
 * The mirror's file on disk as read-only opens see it: fingerprints of the file and its `-wal`
 * (to notice a writer that came along), and the private copy a read-only open reads a `-wal`
 * from (nothing is created or changed beside the original).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { StoreError } from '../../errors.js';
import { writerIsLive } from './lock.js';


/**
 * What identifies the state of a file on disk: device, inode, size, modification and change
 * times (ns); null when the file does not exist. Two equal fingerprints mean nobody wrote it in
 * between (to the resolution of the filesystem's timestamps).
 */
export type Fingerprint = string | null;

export function fingerprint(file: string): Fingerprint {
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
export interface FileState {
  db: Fingerprint;
  wal: Fingerprint;
  walBytes: number;
}

/** The state of `abs` and its `-wal` now. */
export function fileState(abs: string): FileState {
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

/** Whether two looks at a mirror file saw the same file and `-wal` (nobody wrote in between). */
export const sameState = (a: FileState, b: FileState): boolean => a.db === b.db && a.wal === b.wal;

/** Private copies of read-only opens not yet closed: removed at process exit whatever happens to the instance. */
const privateCopies = new Set<string>();
let exitHookInstalled = false;

/** Removes the private copy directory `dir` (best effort) and forgets it. */
export function removePrivateCopy(dir: string): void {
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
export function privateCopy(abs: string): { dir: string; file: string } | null {
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
