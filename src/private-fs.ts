/**
 * Files and directories convo-mirror creates hold customer data, so they are private whatever the
 * process umask: files 0600 and directories 0700, or 0640 and 0750 when the operator chose to share
 * the mirror with a group (`CONVO_MIRROR_GROUP_READABLE`). Modes are set explicitly after creation
 * (`fchmod`/`chmod`), so neither a permissive umask (0000) nor a strict one (0777) changes them.
 * Only what we create is chmodded: an existing directory is never touched.
 */
import fs from 'node:fs';
import path from 'node:path';

/** Permission bits of created files and directories. */
export interface FileModes {
  /** Mode of every file created (database, lock, export files, manifest). */
  readonly file: number;
  /** Mode of every directory created. */
  readonly dir: number;
}

/** Owner only: files 0600, directories 0700. The default. */
export const PRIVATE_MODES: FileModes = Object.freeze({ file: 0o600, dir: 0o700 });
/** Owner and group may read: files 0640, directories 0750. */
export const GROUP_READABLE_MODES: FileModes = Object.freeze({ file: 0o640, dir: 0o750 });

/** The modes for the `groupReadable` setting. */
export function fileModes(groupReadable: boolean): FileModes {
  return groupReadable ? GROUP_READABLE_MODES : PRIVATE_MODES;
}

/**
 * The modes of published export files (data files, ledger records, the manifest): `modes` without
 * any write bit (0400, or 0440 group-readable), so another tool's accidental overwrite fails
 * loudly; directories keep `modes.dir` (publication adds files to them).
 */
export function publishedModes(modes: FileModes): FileModes {
  return { file: modes.file & 0o444, dir: modes.dir };
}

/** setgid on a directory: kept when set (group inheritance), never added. */
const S_ISGID = 0o2000;

/** fsyncs a directory, so the entries created or renamed in it survive a power cut. */
export function fsyncDir(dir: string): void {
  const dfd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(dfd);
  } finally {
    fs.closeSync(dfd);
  }
}

/**
 * Creates `dir` and any missing parents, each with `modes.dir` exactly (a setgid bit inherited from
 * the parent is kept). With `durable`, the parent of every directory created is fsynced. Existing
 * directories are left as they are.
 *
 * @throws the `fs` error (ENOTDIR, EACCES...) when a component cannot be created
 */
export function mkdirPrivate(dir: string, modes: FileModes, opts: { durable?: boolean } = {}): void {
  const abs = path.resolve(dir);
  const missing: string[] = [];
  for (let p = abs; ; p = path.dirname(p)) {
    if (fs.existsSync(p)) break;
    missing.push(p);
    if (path.dirname(p) === p) break;
  }
  for (const p of missing.reverse()) {
    try {
      fs.mkdirSync(p, { mode: modes.dir });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      continue; // created meanwhile by someone else: not ours to chmod
    }
    const st = fs.statSync(p);
    fs.chmodSync(p, (st.mode & S_ISGID) | modes.dir);
    if (opts.durable) fsyncDir(path.dirname(p));
  }
}

/**
 * Creates a new file (it must not exist: `wx`) with `modes.file` exactly, and returns its open
 * descriptor for writing.
 *
 * @throws the `fs` error, e.g. EEXIST when the file exists
 */
export function createPrivateFile(file: string, modes: FileModes): number {
  const fd = fs.openSync(file, 'wx', modes.file);
  try {
    fs.fchmodSync(fd, modes.file);
  } catch (err) {
    fs.closeSync(fd);
    throw err;
  }
  return fd;
}

/**
 * Writes `data` to a new file with `modes.file` exactly, replacing nothing: the file must not exist.
 *
 * @throws the `fs` error, e.g. EEXIST when the file exists
 */
export function writeNewPrivateFile(file: string, data: string | Buffer, modes: FileModes): void {
  const fd = createPrivateFile(file, modes);
  try {
    fs.writeFileSync(fd, data);
  } finally {
    fs.closeSync(fd);
  }
}
