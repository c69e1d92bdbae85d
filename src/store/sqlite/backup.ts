/**
 * An online backup of a mirror: a consistent copy of the SQLite file made with SQLite's backup API
 * (better-sqlite3's `db.backup()`), safe while a writer (a `sync` or the daemon) runs, and taken
 * without the writer lock, the way the read-only commands read ({@link openConnection} with
 * `readonly`: nothing is created or changed beside the mirror).
 *
 * Consistency. With a live writer the source is read through the writer's `-wal` (`'shared'`), and
 * a read transaction is held on the source for the whole copy: every step then copies pages of the
 * same snapshot, and the writer goes on committing (in WAL mode a reader never blocks a writer; the
 * `-wal` only grows until the copy ends). Without that transaction SQLite restarts the copy at each
 * commit of the writer, and a busy sync would keep it from ever finishing. An `'immutable'` open
 * (no writer, no `-wal`) cannot see a writer that starts meanwhile, so that copy is checked
 * afterwards ({@link fileState}) and made again when the file changed (at most
 * {@link BACKUP_ATTEMPTS} times; the next open sees the writer). A `'private-copy'` open (a `-wal`
 * and no writer) copies from its own private copy.
 *
 * The new file. It is created by us, exclusively (never over an existing file or a symbolic link),
 * with the mirror's modes whatever the umask; SQLite's `-journal` for it (only while copying) gets
 * the same mode. A failure or an interruption removes both. The copy is fsynced by SQLite's commit,
 * its directory entry by us, and then read back: `PRAGMA quick_check` and the ledger head.
 */
import fs from 'node:fs';
import path from 'node:path';
import { StoreError, describeError } from '../../errors.js';
import { createPrivateFile, fsyncDir, PRIVATE_MODES, type FileModes } from '../../private-fs.js';
import { fileState, sameState } from './files.js';
import { writerIsLive } from './lock.js';
import { readConsistent } from '../open-mirror.js';
import { openConnection, type Connection } from './open.js';
import type { MirrorAccess } from '../types.js';

/** Copies of an `'immutable'` open made before giving up on a file that keeps changing. */
export const BACKUP_ATTEMPTS = 3;

/** Pages copied per step of the backup (4 MiB at SQLite's default 4 KiB pages) between progress reports. */
export const BACKUP_PAGES_PER_STEP = 1024;

/** Progress of a backup, after each step. */
export interface BackupProgress {
  /** Pages of the snapshot being copied. */
  totalPages: number;
  /** Pages still to copy. */
  remainingPages: number;
}

/** Options of {@link backupMirror}. */
export interface BackupOptions {
  /** Mode of the new file (`file`); `dir` is unused (the directory must exist). @defaultValue PRIVATE_MODES (0600) */
  modes?: FileModes;
  /** Called after each step with the progress of the copy. */
  onProgress?: (p: BackupProgress) => void;
  /**
   * Asked before each step: a reason (e.g. `SIGINT`) stops the backup with a {@link BackupInterrupted}
   * error, and the new file is removed.
   */
  interrupted?: () => string | undefined;
  /** Pages per step. @defaultValue {@link BACKUP_PAGES_PER_STEP} */
  pagesPerStep?: number;
  /**
   * Test hook: called once the source is open and its snapshot pinned, before the first page is
   * copied, with the attempt number (1-based). Never set in production.
   */
  onSourceOpen?: (attempt: number, access: MirrorAccess) => void | Promise<void>;
}

/** What {@link backupMirror} wrote. */
export interface BackupResult {
  /** Absolute path of the new file. */
  file: string;
  /** Its size, bytes. */
  bytes: number;
  /** Pages copied. */
  pages: number;
  /** How the mirror was read (`shared`: through a live writer's `-wal`). */
  access: MirrorAccess;
  /** Copies made (more than 1 when a writer started during an `immutable` copy). */
  attempts: number;
  /** The ledger's chain head in the copy; undefined when nothing was ever published. */
  head: { batch_id: number; hash: string } | undefined;
  /** The exported watermark in the copy. */
  watermark: number;
}

/** A backup stopped by {@link BackupOptions.interrupted}; the new file was removed. */
export class BackupInterrupted extends Error {
  constructor(readonly reason: string) {
    super(`backup interrupted by ${reason}; the partial copy was removed`);
    this.name = 'BackupInterrupted';
  }
}

/**
 * A backup that was made but cannot be trusted (its check failed, or the mirror kept changing under
 * an immutable read); the copy was removed. Not a setting to fix: the CLI exits 1.
 */
export class BackupFailed extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BackupFailed';
  }
}

/** Throws a {@link StoreError} naming `dest` when it is not a name a new backup may take. */
function assertNewDestination(dest: string, source: string): void {
  const dir = path.dirname(dest);
  let st: fs.Stats;
  try {
    st = fs.statSync(dir);
  } catch {
    throw new StoreError(`cannot back up to ${dest}: its directory ${dir} does not exist (create it first)`, { file: dest });
  }
  if (!st.isDirectory()) throw new StoreError(`cannot back up to ${dest}: ${dir} is not a directory`, { file: dest });
  if (dest === source) throw new StoreError(`cannot back up the mirror ${source} onto itself: name a new file`, { file: dest });
  // A stale journal or WAL beside the new name would be read by SQLite as part of the new file.
  for (const f of [dest, `${dest}-journal`, `${dest}-wal`]) {
    if (fs.existsSync(f) || isSymlink(f)) {
      throw new StoreError(`cannot back up to ${dest}: ${f} already exists; a backup never writes over a file, name a new one`, { file: dest });
    }
  }
}

const isSymlink = (f: string): boolean => {
  try {
    return fs.lstatSync(f).isSymbolicLink();
  } catch {
    return false;
  }
};

/** Removes `f` if it exists (best effort: a file we created). */
function removeIfPresent(f: string): void {
  try {
    fs.rmSync(f, { force: true });
  } catch {
    /* best effort */
  }
}

/**
 * Copies the pages of `c`'s snapshot into `dest` (which exists, empty, created by us). Holds a read
 * transaction on a `'shared'` source for the whole copy, so the writer's commits cannot restart it.
 *
 * @returns the pages copied
 */
async function copyPages(c: Connection, dest: string, o: BackupOptions): Promise<number> {
  const pin = c.access === 'shared';
  if (pin) {
    c.db.exec('BEGIN');
    c.db.prepare('SELECT count(*) FROM sqlite_master').get(); // the read transaction starts at the first read
  }
  try {
    const step = Math.max(1, Math.floor(o.pagesPerStep ?? BACKUP_PAGES_PER_STEP));
    const done = await c.db.backup(dest, {
      progress: (p) => {
        o.onProgress?.({ totalPages: p.totalPages, remainingPages: p.remainingPages });
        const reason = o.interrupted?.();
        if (reason !== undefined) throw new BackupInterrupted(reason);
        return step;
      },
    });
    o.onProgress?.({ totalPages: done.totalPages, remainingPages: 0 });
    return done.totalPages;
  } finally {
    if (pin && c.db.inTransaction) c.db.exec('COMMIT');
  }
}

/**
 * Writes a consistent copy of the mirror `source` to the new file `dest` (see the module comment),
 * while a writer may run, without taking the writer lock, and checks the copy (`PRAGMA
 * quick_check`, and that it opens as a mirror).
 *
 * @param source - the mirror file (`CONVO_MIRROR_DB`)
 * @param dest - the new file; its directory must exist, and neither it nor `<dest>-journal` nor
 *   `<dest>-wal` may exist
 * @throws {@link StoreError} naming `dest` when it exists, its directory is missing, or it cannot be
 *   created or written (no room: the partial file is removed); what a read-only open of `source`
 *   throws (no mirror there, an older schema, a damaged file)
 * @throws {@link BackupFailed} when the copy fails its check, or an immutable read saw the file
 *   change during every attempt (the copy is removed)
 * @throws {@link BackupInterrupted} when `o.interrupted` gave a reason (the copy is removed)
 */
export async function backupMirror(source: string, dest: string, o: BackupOptions = {}): Promise<BackupResult> {
  const src = path.resolve(source);
  const out = path.resolve(dest);
  assertNewDestination(out, src);
  if (!fs.existsSync(src)) throw new StoreError(`no mirror at ${src}: nothing to back up`, { file: src });
  const modes = o.modes ?? PRIVATE_MODES;
  let created = false;
  const removeCopy = () => {
    if (!created) return;
    removeIfPresent(out);
    removeIfPresent(`${out}-journal`);
    created = false;
  };
  try {
    for (let attempt = 1; ; attempt++) {
      try {
        fs.closeSync(createPrivateFile(out, modes));
      } catch (err) {
        throw new StoreError(`cannot create the backup ${out}: ${describeError(err)}`, { file: out }, err);
      }
      created = true;
      const c = openConnection(src, { readonly: true }, (conn) => conn);
      let pages: number;
      try {
        await o.onSourceOpen?.(attempt, c.access);
        try {
          pages = await copyPages(c, out, o);
        } catch (err) {
          if (err instanceof BackupInterrupted) throw err;
          throw new StoreError(`cannot back up the mirror ${src} to ${out}: ${describeError(err)}`, { file: out }, err);
        }
      } finally {
        c.db.close();
        c.release();
      }
      // An immutable read cannot see a writer that came along: the copy may mix two states.
      const changed = c.openedState !== undefined && (!sameState(c.openedState, fileState(src)) || writerIsLive(src));
      if (changed && attempt < BACKUP_ATTEMPTS) {
        removeCopy();
        continue;
      }
      if (changed) throw new BackupFailed(`cannot back up the mirror ${src}: it changed during each of ${BACKUP_ATTEMPTS} copies (a writer kept starting); try again`);
      fsyncDir(path.dirname(out));
      const check = await readConsistent(out, async (m) => ({ problems: await m.quickCheck(), head: await m.ledgerHead(), watermark: await m.exportWatermark() }));
      if (check.problems.length > 0) {
        throw new BackupFailed(`the backup ${out} failed its check (PRAGMA quick_check: ${check.problems.slice(0, 3).join('; ')}); it was removed`);
      }
      return { file: out, bytes: fs.statSync(out).size, pages, access: c.access, attempts: attempt, head: check.head, watermark: check.watermark };
    }
  } catch (err) {
    removeCopy();
    throw err;
  }
}
