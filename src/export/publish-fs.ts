/**
 * The file moves of a publication: a temp file in `.convo-mirror-tmp/`, fsynced, renamed into place
 * (same filesystem), its directory fsynced; what to do when the final name already exists; the
 * temp directory's leftovers. Published files are read-only ({@link publishedModes}).
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import zlib from 'node:zlib';
import { ExportError } from '../errors.js';
import { createPrivateFile, fsyncDir, mkdirPrivate, publishedModes, type FileModes } from '../private-fs.js';
import { TEMP_DIR, isTempName, kindOf } from './paths.js';

/**
 * Where `ExportOptions.failpoint` is called:
 * - `before-rename`: a data file, a batch record or the manifest is written and fsynced in
 *   `.convo-mirror-tmp/`, not yet renamed into place (`file` is its final path);
 * - `before-ledger`: every data file of the batch is in place, its record is not written yet
 *   (`file` is the record's final path);
 * - `before-record`: the data files and the batch record are in place, nothing is recorded in the
 *   mirror yet (`file` is the record's path);
 * - `before-head`: the batch is recorded in the mirror (its head moved), the witness line (with a
 *   witness) and the manifest are not written yet (`file` is the manifest's path).
 *
 * And in the archive step of an erasure (src/export/erasure.ts):
 * - `erasure-after-file`: one more rewritten file is in place (`file` is its path); the files it
 *   replaces are all still there;
 * - `erasure-before-record`: every rewritten file is in place, the erasure record is not written
 *   (`file` is the record's final path);
 * - `erasure-before-mirror`: the erasure record is in `_ledger/`, the mirror has not recorded it
 *   (the head has not moved);
 * - `erasure-after-record`: the mirror recorded it (the head moved); the witness line, the manifest
 *   and the removal of the replaced files are not done (`file` is the record's path);
 * - `erasure-after-delete`: the replaced files are removed, the erasure is not marked archived in
 *   the mirror (`file` is the record's path).
 */
export type ExportFailpoint =
  | 'before-rename'
  | 'before-ledger'
  | 'before-record'
  | 'before-head'
  | 'erasure-after-file'
  | 'erasure-before-record'
  | 'erasure-before-mirror'
  | 'erasure-after-record'
  | 'erasure-after-delete'
  | 'retention-before-mirror'
  | 'retention-after-record'
  | 'retention-after-delete';

/** Where a publication writes: the export root, its temp directory, modes, and the test hook. */
export interface Target {
  /** Absolute export directory. */
  root: string;
  /** Absolute `<root>/.convo-mirror-tmp`. */
  temp: string;
  /** Modes of the directories created, and (write bits removed) of the files published. */
  modes: FileModes;
  failpoint: ((point: ExportFailpoint, file: string) => void) | undefined;
}

/** Writes all of `buf` at the descriptor's position. */
export function writeAll(fd: number, buf: Buffer): void {
  let off = 0;
  while (off < buf.length) off += fs.writeSync(fd, buf, off, buf.length - off);
}

/** Creates `dir` (and missing parents) with the target's directory mode. @throws {@link ExportError} naming it */
export function makeDir(target: Target, dir: string): void {
  try {
    mkdirPrivate(dir, target.modes, { durable: true });
  } catch (err) {
    throw new ExportError(`cannot create the export directory ${dir}: ${(err as Error).message}`, { dir }, err);
  }
}

/**
 * Creates a temp file in `.convo-mirror-tmp/` with the published (read-only) mode; the returned
 * descriptor can write it all the same (the mode applies to later opens).
 *
 * @throws {@link ExportError} naming it
 */
export function createTemp(target: Target, name: string): { fd: number; tmp: string } {
  const tmp = path.join(target.temp, name);
  try {
    return { fd: createPrivateFile(tmp, publishedModes(target.modes)), tmp };
  } catch (err) {
    throw new ExportError(`cannot create the temp file ${tmp}: ${(err as Error).message}`, { file: tmp }, err);
  }
}

/** Closes and removes a temp file after a failure (best effort). */
export function discardTemp(fd: number | undefined, tmp: string): void {
  if (fd !== undefined) {
    try {
      fs.closeSync(fd);
    } catch {
      /* already closed */
    }
  }
  fs.rmSync(tmp, { force: true });
}

/**
 * Makes the temp file open on `fd` the file `final`: fsync, close, rename (both in the export
 * directory, so on one filesystem), fsync of `final`'s directory. On failure the temp file is
 * removed; a throw from the `before-rename` failpoint leaves it, as a crash would.
 *
 * @throws {@link ExportError} naming `final`
 */
export function renameIntoPlace(target: Target, fd: number, tmp: string, final: string): void {
  try {
    fs.fsyncSync(fd);
  } catch (err) {
    discardTemp(fd, tmp);
    throw new ExportError(`cannot publish export file ${final}: fsync of ${tmp} failed: ${(err as Error).message}`, { file: final }, err);
  }
  fs.closeSync(fd);
  target.failpoint?.('before-rename', final);
  try {
    fs.renameSync(tmp, final);
    fsyncDir(path.dirname(final));
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw new ExportError(`cannot publish export file ${final}: ${(err as Error).message}`, { file: final }, err);
  }
}

/** Publishes `data` as `final` through a temp file named `tempName` (see {@link renameIntoPlace}). */
export function publishBytes(target: Target, tempName: string, final: string, data: Buffer): void {
  const { fd, tmp } = createTemp(target, tempName);
  try {
    writeAll(fd, data);
  } catch (err) {
    discardTemp(fd, tmp);
    throw new ExportError(`cannot publish export file ${final}: ${(err as Error).message}`, { file: final }, err);
  }
  renameIntoPlace(target, fd, tmp, final);
}

/** Largest batch record read back (a record lists about 350 bytes per file). */
export const MAX_RECORD_BYTES = 256 * 1024 * 1024;
/** Largest `manifest.json` read back (it is a few hundred bytes). */
export const MAX_MANIFEST_BYTES = 1024 * 1024;

/**
 * Reads a regular file without following a symlink; undefined when it does not exist.
 *
 * @param maxBytes - a larger file is refused before it is read
 * @throws what `fs` throws otherwise; an Error when it is not a regular file or is larger than `maxBytes`
 */
export function readIfPresent(file: string, maxBytes: number): Buffer | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw Object.assign(new Error(`${file} is not a regular file`), { code: 'EISDIR' });
    if (st.size > maxBytes) throw new Error(`${file} is ${st.size} bytes, more than the ${maxBytes} expected of it`);
    return fs.readFileSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** Largest data file read back at re-publication (100,000 lines of at most a few KiB). */
const MAX_DATA_FILE_BYTES = 2 * 1024 * 1024 * 1024;

/** What a data file's final name already holds, see {@link existingDataFile}. */
export type Existing = { kind: 'absent' } | { kind: 'identical' } | { kind: 'equivalent'; bytes: number; sha256: string };

/**
 * What `file` already holds, for a batch re-published after a crash: nothing (`absent`), exactly
 * these bytes (`identical`), or, for a `.jsonl.gz`, other bytes that decompress to exactly these
 * lines (`equivalent`: written by another zlib build; it is kept and recorded as it is).
 *
 * @param sha256 - SHA-256 of the bytes about to be published
 * @param linesSha256 - SHA-256 of the uncompressed lines (for `.jsonl.gz`)
 * @throws {@link ExportError} when it exists with other content, or is not a regular file: a
 *   published file never changes
 */
export function existingDataFile(file: string, sha256: string, linesSha256: string | undefined): Existing {
  let existing: Buffer | undefined;
  try {
    existing = readIfPresent(file, MAX_DATA_FILE_BYTES);
  } catch {
    existing = Buffer.alloc(0); // a directory, a symlink, unreadable: refused below
  }
  if (existing === undefined) return { kind: 'absent' };
  const digest = crypto.createHash('sha256').update(existing).digest('hex');
  if (digest === sha256) return { kind: 'identical' };
  if (linesSha256 !== undefined && existing.length > 0) {
    try {
      const lines = zlib.gunzipSync(existing);
      if (crypto.createHash('sha256').update(lines).digest('hex') === linesSha256) return { kind: 'equivalent', bytes: existing.length, sha256: digest };
    } catch {
      /* not gzip: refused below */
    }
  }
  throw new ExportError(
    `refusing to replace the published export file ${file} with different content (was the mirror recreated? use a fresh CONVO_MIRROR_EXPORT_DIR)`,
    { file },
  );
}

/**
 * Makes sure `<root>/.convo-mirror-tmp/` is a directory, then removes the leftovers of an
 * interrupted publication in it: regular files with a name convo-mirror generates. Nothing else,
 * there or anywhere, is removed.
 *
 * @returns the temp directory's absolute path
 * @throws {@link ExportError} naming it when it is not a directory (a symlink, a file) or cannot be
 *   created or cleaned
 */
export function prepareTempDir(root: string, modes: FileModes): string {
  const temp = path.join(root, TEMP_DIR);
  let st: fs.Stats | undefined;
  try {
    st = fs.lstatSync(temp);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
      throw new ExportError(`cannot use the temp directory ${temp}: ${(err as Error).message}`, { dir: temp }, err);
    }
  }
  if (st && !st.isDirectory()) {
    throw new ExportError(
      `${temp} is not a directory (${kindOf(st)}): that name is reserved for convo-mirror's temp files; move it away`,
      { dir: temp },
    );
  }
  try {
    if (!st) mkdirPrivate(temp, modes, { durable: true });
    for (const e of fs.readdirSync(temp, { withFileTypes: true })) {
      if (e.isFile() && isTempName(e.name)) fs.unlinkSync(path.join(temp, e.name));
    }
  } catch (err) {
    throw new ExportError(`cannot prepare the temp directory ${temp}: ${(err as Error).message}`, { dir: temp }, err);
  }
  return temp;
}

/**
 * Makes a file published before files were read-only read-only: its own mode without the write
 * bits; only a regular file, never through a symlink. Best effort: returns the error's message,
 * if any.
 */
export function makeReadOnly(file: string): string | undefined {
  try {
    const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
    try {
      const st = fs.fstatSync(fd);
      if (st.isFile()) fs.fchmodSync(fd, st.mode & 0o555);
    } finally {
      fs.closeSync(fd);
    }
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * Removes a published file at `rel` under `root` (never through a symlink) when it still holds what
 * was published (its SHA-256 is `sha256`): `removed`; `absent` when it is gone already; `changed`
 * (left in place) when it holds anything else or is not a regular file. For the files an erasure
 * record replaced and those a retention record expired: we delete only what we published.
 *
 * @param action - the words of an error, e.g. `remove the replaced file`
 * @throws {@link ExportError} naming the file when it cannot be read or removed
 */
export function removeIfPublished(root: string, rel: string, sha256: string, action: string): 'removed' | 'absent' | 'changed' {
  const abs = path.join(root, rel);
  let fd: number;
  try {
    fd = fs.openSync(abs, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return 'absent';
    if (code === 'ELOOP') return 'changed';
    throw new ExportError(`cannot ${action} ${abs}: ${(err as Error).message}`, { file: abs }, err);
  }
  let same: boolean;
  try {
    if (!fs.fstatSync(fd).isFile()) return 'changed';
    const hash = crypto.createHash('sha256');
    const buf = Buffer.allocUnsafe(1 << 20);
    for (let n = fs.readSync(fd, buf); n > 0; n = fs.readSync(fd, buf)) hash.update(buf.subarray(0, n));
    same = hash.digest('hex') === sha256;
  } finally {
    fs.closeSync(fd);
  }
  if (!same) return 'changed';
  try {
    fs.unlinkSync(abs);
    fsyncDir(path.dirname(abs));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'absent';
    throw new ExportError(`cannot ${action} ${abs}: ${(err as Error).message}`, { file: abs }, err);
  }
  return 'removed';
}
