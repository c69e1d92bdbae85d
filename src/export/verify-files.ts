/**
 * The file checks of `verify`: each listed data file against its record (never through a symlink,
 * streamed), what lies in the partition trees that no record lists, and the temp directory.
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import zlib from 'node:zlib';
import { TEMP_DIR, isTempName, kindOf } from './paths.js';
import type { VerifyProblem } from './verify-types.js';

/** A listed file as its record says it is. */
export interface Listed {
  path: string;
  lines: number;
  bytes: number;
  sha256: string;
}

/** Most bytes a `.jsonl.gz` may decompress to when its lines are counted (a gzip bomb is a problem, not an outage). */
export const MAX_GUNZIP_BYTES = 1 << 30;

/**
 * Checks the directories on the way to a recorded file, component by component with lstat, and
 * remembers each answer: a symlinked directory is never followed.
 */
export class DirCheck {
  private readonly known = new Map<string, VerifyProblem | null>();
  constructor(private readonly root: string) {}

  /** The problem of the file `rel` caused by one of its directories, or null when they are all plain directories. */
  problemFor(rel: string): VerifyProblem | null {
    const parts = rel.split('/');
    for (let k = 1; k < parts.length; k++) {
      const dir = parts.slice(0, k).join('/');
      let p = this.known.get(dir);
      if (p === undefined) {
        p = this.check(dir);
        this.known.set(dir, p);
      }
      if (p) return { ...p, path: rel };
    }
    return null;
  }

  private check(dir: string): VerifyProblem | null {
    let st: fs.Stats;
    try {
      st = fs.lstatSync(path.join(this.root, dir));
    } catch {
      return { path: '', problem: 'missing', detail: `${dir} does not exist` };
    }
    if (st.isSymbolicLink()) return { path: '', problem: 'not-regular', detail: `reached through the symbolic link ${dir}, not followed` };
    if (!st.isDirectory()) return { path: '', problem: 'missing', detail: `${dir} is not a directory (${kindOf(st)})` };
    return null;
  }
}

/**
 * One listed file against its record: a regular file reached without a symlink, with its size,
 * SHA-256 and line count. A difference carries both values: `found` (on disk) and `expected` (the
 * record's): bytes for `size`, the hex digest for `sha256`, lines for `lines`.
 */
export function checkListed(root: string, dirs: DirCheck, f: Listed): VerifyProblem[] {
  const viaDir = dirs.problemFor(f.path);
  if (viaDir) return [viaDir];
  const abs = path.join(root, f.path);
  let st: fs.Stats;
  try {
    st = fs.lstatSync(abs);
  } catch {
    return [{ path: f.path, problem: 'missing' }];
  }
  if (!st.isFile()) return [{ path: f.path, problem: 'not-regular', detail: `${kindOf(st)}, expected a regular file` }];
  let digest: ReturnType<typeof digestFile>;
  try {
    // A gzipped file is decompressed (to count its lines) only when its size is the recorded one.
    digest = digestFile(abs, f.path.endsWith('.gz') ? (st.size === f.bytes && st.size <= MAX_GUNZIP_BYTES ? 'gunzip' : 'skip') : 'count');
  } catch (err) {
    return [{ path: f.path, problem: 'missing', detail: `cannot read it: ${(err as Error).message}` }];
  }
  const out: VerifyProblem[] = [];
  if (digest.bytes !== f.bytes) out.push({ path: f.path, problem: 'size', found: digest.bytes, expected: f.bytes });
  if (digest.sha256 !== f.sha256) out.push({ path: f.path, problem: 'sha256', found: digest.sha256, expected: f.sha256 });
  if (digest.unreadable) out.push({ path: f.path, problem: 'lines', detail: digest.unreadable });
  else if (digest.lines !== -1 && digest.lines !== f.lines) out.push({ path: f.path, problem: 'lines', found: digest.lines, expected: f.lines });
  return out;
}

/**
 * Size and SHA-256 of a regular file as stored, read in 1 MiB chunks, never through a symlink, and
 * its LF count: of the bytes (`count`), after decompression (`gunzip`, output capped at
 * {@link MAX_GUNZIP_BYTES}), or not at all (`skip`: -1, for a `.gz` whose size already differs).
 *
 * @returns also, for `gzip`, why its lines could not be counted (not gzip, or more than the cap)
 * @throws what `fs` throws
 */
function digestFile(abs: string, lineMode: 'count' | 'gunzip' | 'skip'): { bytes: number; sha256: string; lines: number; unreadable?: string } {
  const gzip = lineMode === 'gunzip';
  const fd = fs.openSync(abs, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  try {
    const hash = crypto.createHash('sha256');
    const buf = Buffer.allocUnsafe(1 << 20);
    const chunks: Buffer[] = [];
    let bytes = 0;
    let lines = 0;
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      const chunk = buf.subarray(0, n);
      hash.update(chunk);
      bytes += n;
      if (gzip) chunks.push(Buffer.from(chunk));
      else if (lineMode === 'count') lines += countLf(chunk);
    }
    let unreadable: string | undefined;
    if (gzip) {
      try {
        lines = countLf(zlib.gunzipSync(Buffer.concat(chunks), { maxOutputLength: MAX_GUNZIP_BYTES }));
      } catch (err) {
        unreadable = `cannot decompress it: ${(err as Error).message}`;
      }
    }
    return { bytes, sha256: hash.digest('hex'), lines: lineMode === 'skip' ? -1 : lines, ...(unreadable ? { unreadable } : {}) };
  } finally {
    fs.closeSync(fd);
  }
}

/** LF bytes in `chunk`. */
export function countLf(chunk: Buffer): number {
  let lines = 0;
  for (let i = chunk.indexOf(10); i !== -1; i = chunk.indexOf(10, i + 1)) lines++;
  return lines;
}

/**
 * Every entry that is not a directory in the tree `<root>/<rel>` (the tree's top included: a
 * `messages` that is a symlink or a file is one entry), with its kind; symlinks are listed, never
 * followed. In name order.
 */
export function* walkTree(root: string, rel: string): Generator<{ rel: string; kind: string }> {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(path.join(root, rel));
  } catch {
    return;
  }
  if (!st.isDirectory()) {
    yield { rel, kind: kindOf(st) };
    return;
  }
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(path.join(root, rel), { withFileTypes: true });
  } catch {
    return;
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const r = `${rel}/${e.name}`;
    if (e.isDirectory()) yield* walkTree(root, r);
    else yield { rel: r, kind: kindOf(e) };
  }
}

/** Every entry of `.convo-mirror-tmp/` (or the name itself when it is not a directory). */
export function checkTemp(root: string): VerifyProblem[] {
  const temp = path.join(root, TEMP_DIR);
  let st: fs.Stats;
  try {
    st = fs.lstatSync(temp);
  } catch {
    return [];
  }
  if (!st.isDirectory()) return [{ path: TEMP_DIR, problem: 'temp', detail: `${kindOf(st)}, not a directory: publication refuses to run until it is moved away` }];
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(temp, { withFileTypes: true });
  } catch (err) {
    return [{ path: TEMP_DIR, problem: 'temp', detail: `cannot list it: ${(err as Error).message}` }];
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return entries.map((e) => ({
    path: `${TEMP_DIR}/${e.name}`,
    problem: 'temp' as const,
    detail:
      e.isFile() && isTempName(e.name)
        ? 'left by an interrupted publication; the next sync removes it'
        : `${kindOf(e)} convo-mirror did not write; publication leaves it: remove it by hand`,
  }));
}
