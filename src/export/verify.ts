/**
 * `verify`: the export directory checked against the mirror's records, trusting nothing on disk.
 * Read-only; symlinks inside the export directory are reported, never followed.
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import type { Mirror } from '../store/mirror.js';
import { MANIFEST, STREAM_DIRS, TEMP_DIR, isTempName, kindOf } from './paths.js';
import { manifestDifference, recordedManifest, renderManifest } from './manifest.js';

/**
 * What is wrong with one path:
 * - `missing`: `manifest.json` or a recorded file is absent (detail: why, when not plain absence,
 *   e.g. `<dir> does not exist`, `messages/account=x is not a directory`);
 * - `not-regular`: `manifest.json` or a recorded file is not a regular file, or is reached through a
 *   symbolic link (detail: `symbolic link, expected a regular file`,
 *   `reached through the symbolic link messages/account=x, not followed`);
 * - `size`, `sha256`, `lines`: a recorded file's bytes differ from its record (detail for `size`:
 *   `N bytes, expected M`; for `lines`: `N lines, expected M`; none for `sha256`);
 * - `unparsable`: `manifest.json` is not JSON (detail: the parser's message);
 * - `altered`: `manifest.json` is not, byte for byte, the manifest the mirror's records imply
 *   (detail: the first difference, e.g. `files[3].sha256 differs for messages/…/x.jsonl: "…", the
 *   mirror says "…"`, `watermark 120, the mirror says 130`; see {@link manifestDifference});
 * - `unlisted`: anything in `messages/` or `conversations/` that is not a recorded file, whatever its
 *   name (detail for what is not a regular file: `symbolic link, not followed`, `FIFO`...);
 * - `temp`: an entry in `.convo-mirror-tmp/`, left by an interrupted publication (detail says
 *   whether the next publication removes it).
 */
export type VerifyProblemKind = 'missing' | 'not-regular' | 'size' | 'sha256' | 'lines' | 'unparsable' | 'altered' | 'unlisted' | 'temp';

/** A problem found by {@link verifyExports}. */
export interface VerifyProblem {
  /** Relative to the export directory, `/`-separated (`manifest.json` for the manifest). */
  path: string;
  problem: VerifyProblemKind;
  /** One line saying more, when there is more to say. */
  detail?: string;
}

interface Recorded {
  path: string;
  lines: number;
  bytes: number;
  sha256: string;
}

/**
 * Checks the export directory against the mirror's records, trusting nothing on disk:
 * 1. `manifest.json` is byte for byte the manifest the records imply (the one publication writes);
 *    it must exist once anything was published or the export directory exists;
 * 2. every recorded file is a regular file (not reached through a symlink) with its recorded size,
 *    SHA-256 and line count;
 * 3. nothing else, whatever its name (dotfiles, `.tmp` files, symlinks included), lies in the
 *    partition trees `messages/` and `conversations/`;
 * 4. `.convo-mirror-tmp/` is empty.
 * Other files at the root of the export directory (a README) are not convo-mirror's and are ignored.
 * Nothing published and no export directory: no problem. Reads only; follows no symlink inside the
 * export directory; files are streamed (bounded memory).
 *
 * Problems come in that order: manifest, recorded files by seq, unlisted, temp.
 *
 * @param exportDir - the export directory (absolute or relative to the current directory)
 * @returns the problems found (empty when the exports are intact)
 * @throws only on a database error
 */
export function verifyExports(mirror: Mirror, exportDir: string): VerifyProblem[] {
  const root = path.resolve(exportDir);
  const recorded: Recorded[] = mirror.publishedFiles();
  const published = recorded.length > 0 || mirror.exportTotals().everPublished;
  let rootStat: fs.Stats | undefined;
  try {
    rootStat = fs.statSync(root); // the export directory itself may be a symlink: the operator's choice
  } catch {
    rootStat = undefined;
  }
  if (!rootStat?.isDirectory()) {
    if (!rootStat && !published) return [];
    const why = rootStat ? `${root} is not a directory` : `${root} does not exist`;
    return [{ path: MANIFEST, problem: 'missing', detail: why }, ...recorded.map((f): VerifyProblem => ({ path: f.path, problem: 'missing', detail: why }))];
  }

  const problems: VerifyProblem[] = [];
  const manifest = checkManifest(mirror, root);
  if (manifest) problems.push(manifest);
  const dirs = new DirCheck(root);
  for (const f of recorded) problems.push(...checkRecorded(root, dirs, f));
  const listed = new Set(recorded.map((f) => f.path));
  for (const stream of STREAM_DIRS) {
    for (const e of walkTree(root, stream)) {
      if (listed.has(e.rel)) continue; // checked above
      problems.push(e.kind === 'regular file' ? { path: e.rel, problem: 'unlisted' } : { path: e.rel, problem: 'unlisted', detail: e.kind === 'symbolic link' ? 'symbolic link, not followed' : e.kind });
    }
  }
  problems.push(...checkTemp(root));
  return problems;
}

/** `manifest.json` against the bytes the mirror's records imply; undefined when identical. */
function checkManifest(mirror: Mirror, root: string): VerifyProblem | undefined {
  const file = path.join(root, MANIFEST);
  let st: fs.Stats;
  try {
    st = fs.lstatSync(file);
  } catch {
    return { path: MANIFEST, problem: 'missing' };
  }
  if (!st.isFile()) return { path: MANIFEST, problem: 'not-regular', detail: `${kindOf(st)}, expected a regular file` };
  let bytes: Buffer;
  try {
    const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
    try {
      bytes = fs.readFileSync(fd);
    } finally {
      fs.closeSync(fd);
    }
  } catch (err) {
    return { path: MANIFEST, problem: 'missing', detail: `cannot read it: ${(err as Error).message}` };
  }
  const expected = recordedManifest(mirror);
  if (bytes.equals(renderManifest(expected))) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    return { path: MANIFEST, problem: 'unparsable', detail: (err as Error).message };
  }
  return { path: MANIFEST, problem: 'altered', detail: manifestDifference(expected, parsed, bytes) };
}

/**
 * Checks the directories on the way to a recorded file, component by component with lstat, and
 * remembers each answer: a symlinked directory is never followed.
 */
class DirCheck {
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

/** One recorded file against its record. */
function checkRecorded(root: string, dirs: DirCheck, f: Recorded): VerifyProblem[] {
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
  let digest: { bytes: number; sha256: string; lines: number };
  try {
    digest = digestFile(abs);
  } catch (err) {
    return [{ path: f.path, problem: 'missing', detail: `cannot read it: ${(err as Error).message}` }];
  }
  const out: VerifyProblem[] = [];
  if (digest.bytes !== f.bytes) out.push({ path: f.path, problem: 'size', detail: `${digest.bytes} bytes, expected ${f.bytes}` });
  if (digest.sha256 !== f.sha256) out.push({ path: f.path, problem: 'sha256' });
  if (digest.lines !== f.lines) out.push({ path: f.path, problem: 'lines', detail: `${digest.lines} lines, expected ${f.lines}` });
  return out;
}

/** Size, SHA-256 and LF count of a regular file, read in 1 MiB chunks, never through a symlink. */
function digestFile(abs: string): { bytes: number; sha256: string; lines: number } {
  const fd = fs.openSync(abs, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  try {
    const hash = crypto.createHash('sha256');
    const buf = Buffer.allocUnsafe(1 << 20);
    let bytes = 0;
    let lines = 0;
    for (;;) {
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      const chunk = buf.subarray(0, n);
      hash.update(chunk);
      bytes += n;
      for (let i = chunk.indexOf(10); i !== -1; i = chunk.indexOf(10, i + 1)) lines++;
    }
    return { bytes, sha256: hash.digest('hex'), lines };
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Every entry that is not a directory in the tree `<root>/<rel>` (the tree's top included: a
 * `messages` that is a symlink or a file is one entry), with its kind; symlinks are listed, never
 * followed. In name order.
 */
function* walkTree(root: string, rel: string): Generator<{ rel: string; kind: string }> {
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
function checkTemp(root: string): VerifyProblem[] {
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
