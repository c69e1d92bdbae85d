/**
 * The head witness, after Certificate Transparency's gossip (RFC 6962 §5.3–5.4, RFC 9162 §8.1.4):
 * with `CONVO_MIRROR_WITNESS_DIR` set (a directory on another disk or mount, which whoever could
 * rewrite the archive cannot), every publication that adds a ledger record appends the signed head
 * it leaves (src/export/head.ts) to an append-only file there, `<mirror id>.heads.jsonl`, one
 * compact JSON line per head. A publication with nothing new appends only when the last line is
 * not the current head (a witness set up on an existing archive is given its head at once); the
 * mere re-signing of an unchanged head is not witnessed. `verify --witness DIR` then proves the archive still holds, unbroken
 * and unchanged, everything every witnessed head covered: deleting the newest records and
 * rewriting (or restoring) `manifest.json` no longer goes unseen.
 *
 * The publisher's side: the directory must exist (it is never created); the file is created
 * private (the publication's file mode, 0600 or 0640) when missing, never rewritten nor
 * truncated; a line is appended with `O_APPEND` in one `write` and the file fsynced; a head equal
 * to the last line's (same batch and hash: a batch re-published after a crash between the append
 * and the mirror's record) is not appended again, found by reading back at most 64 KiB from the end.
 *
 * The reader's side ({@link readWitnessLines}): streamed, lines capped at 64 KiB and the file at
 * 10,000,000 lines; each line parsed on its own, a malformed one named by its line number.
 */
import fs from 'node:fs';
import path from 'node:path';
import { ConfigError, ExportError } from '../errors.js';
import { fsyncDir, type FileModes } from '../private-fs.js';
import { osReason } from '../writable.js';
import { parseSignedHead, renderHeadLine, type SignedHead } from './head.js';

/** The setting naming the witness directory, named by every error about it. */
export const WITNESS_VARIABLE = 'CONVO_MIRROR_WITNESS_DIR';

/** Longest witness line read (a line is about 450 bytes). */
export const MAX_WITNESS_LINE_BYTES = 64 * 1024;

/** Most witness lines read (a head per publication with changes: years of a daemon's publications). */
export const MAX_WITNESS_LINES = 10_000_000;

/** A mirror id as convo-mirror makes one (32 hex digits); anything else never becomes a file name. */
const MIRROR_ID_RE = /^[0-9a-zA-Z_-]{1,64}$/;

/**
 * The witness file of mirror `mirrorId` in `dir`: `<dir>/<mirror id>.heads.jsonl`.
 *
 * @throws Error when `mirrorId` could not be a file name (not 1-64 letters, digits, `-` or `_`)
 */
export function witnessFile(dir: string, mirrorId: string): string {
  if (!MIRROR_ID_RE.test(mirrorId)) throw new Error(`mirror id ${JSON.stringify(mirrorId)} cannot name a witness file`);
  return path.join(path.resolve(dir), `${mirrorId}.heads.jsonl`);
}

/**
 * Why the witness directory cannot be used, or undefined when it can: it must exist (convo-mirror
 * never creates it: it is meant to be another disk or mount), be a directory (a symlink to one is
 * the operator's choice), and be writable by this user; with `mirrorId`, that mirror's witness
 * file, if it exists, must be a regular file this user can read and append to. Writes nothing: for
 * `check`, and for publication before it writes anything. With `exportDir`, a witness directory
 * inside the export directory (or equal to it) is refused too: it would witness nothing.
 *
 * @returns one line naming the setting and the path, e.g.
 *   `CONVO_MIRROR_WITNESS_DIR: the witness directory /mnt/w does not exist (it must be another disk or mount, made beforehand: convo-mirror never creates it)`
 */
export function witnessDirProblem(dir: string, mirrorId?: string, exportDir?: string): string | undefined {
  const abs = path.resolve(dir);
  if (exportDir !== undefined && isWithin(abs, path.resolve(exportDir))) {
    return `${WITNESS_VARIABLE}: the witness directory ${abs} is inside the export directory ${path.resolve(exportDir)}: whoever can change the archive could change the witness too; use another disk or mount`;
  }
  let st: fs.Stats;
  try {
    st = fs.statSync(abs);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return `${WITNESS_VARIABLE}: the witness directory ${abs} does not exist (it must be another disk or mount, made beforehand: convo-mirror never creates it)`;
    return `${WITNESS_VARIABLE}: cannot use the witness directory ${abs}: ${osReason(err)}`;
  }
  if (!st.isDirectory()) return `${WITNESS_VARIABLE}: the witness directory ${abs} is not a directory`;
  try {
    fs.accessSync(abs, fs.constants.W_OK | fs.constants.X_OK);
  } catch (err) {
    return `${WITNESS_VARIABLE}: cannot write in the witness directory ${abs}: ${osReason(err)}`;
  }
  if (mirrorId === undefined) return undefined;
  const file = witnessFile(abs, mirrorId);
  let fst: fs.Stats;
  try {
    fst = fs.lstatSync(file);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ENOENT' ? undefined : `${WITNESS_VARIABLE}: cannot use the witness file ${file}: ${osReason(err)}`;
  }
  if (!fst.isFile()) return `${WITNESS_VARIABLE}: the witness file ${file} is not a regular file`;
  try {
    fs.accessSync(file, fs.constants.R_OK | fs.constants.W_OK);
  } catch (err) {
    return `${WITNESS_VARIABLE}: cannot append to the witness file ${file}: ${osReason(err)}`;
  }
  return undefined;
}

/**
 * Throws when the witness directory or the mirror's witness file cannot be used
 * ({@link witnessDirProblem}); publication calls it before it writes anything.
 *
 * @throws {@link ExportError} naming `CONVO_MIRROR_WITNESS_DIR` and the path
 */
export function assertWitnessUsable(dir: string, mirrorId: string, exportDir?: string): void {
  const why = witnessDirProblem(dir, mirrorId, exportDir);
  if (why !== undefined) throw new ExportError(why, { dir: path.resolve(dir), setting: WITNESS_VARIABLE });
}

/**
 * The start-up check of `sync` and the daemon, before any request or file: the witness directory
 * is usable ({@link witnessDirProblem}) and outside the export directory.
 *
 * @throws {@link ConfigError} naming `CONVO_MIRROR_WITNESS_DIR` and the path
 */
export function assertWitnessDirSetting(dir: string, exportDir: string): void {
  const why = witnessDirProblem(dir, undefined, exportDir);
  if (why !== undefined) throw new ConfigError(WITNESS_VARIABLE, why.slice(`${WITNESS_VARIABLE}: `.length));
}

/** Whether `inner` is `outer` or lies under it, by path and, where both exist, by real path (a symlink does not hide it). */
function isWithin(inner: string, outer: string): boolean {
  const under = (a: string, b: string) => a === b || a.startsWith(b.endsWith(path.sep) ? b : b + path.sep);
  if (under(inner, outer)) return true;
  try {
    return under(fs.realpathSync(inner), fs.realpathSync(outer));
  } catch {
    return false;
  }
}

/** Opens the witness file for reading and appending, creating it with `mode` exactly when missing. */
function openForAppend(file: string, mode: number): { fd: number; created: boolean } {
  const flags = fs.constants.O_RDWR | fs.constants.O_APPEND | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK;
  try {
    const fd = fs.openSync(file, flags | fs.constants.O_CREAT | fs.constants.O_EXCL, mode);
    try {
      fs.fchmodSync(fd, mode); // exactly, whatever the umask
    } catch (err) {
      fs.closeSync(fd);
      throw err;
    }
    return { fd, created: true };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  return { fd: fs.openSync(file, flags), created: false };
}

/** The file's last bytes: whether it ends with LF, and its last complete line (without the LF), if it fits in 64 KiB. */
function lastLine(fd: number, size: number): { endsWithLf: boolean; line: string | undefined } {
  if (size === 0) return { endsWithLf: true, line: undefined };
  const n = Math.min(size, MAX_WITNESS_LINE_BYTES + 1);
  const buf = Buffer.alloc(n);
  let got = 0;
  while (got < n) {
    const r = fs.readSync(fd, buf, got, n - got, size - n + got);
    if (r === 0) break;
    got += r;
  }
  const tail = buf.subarray(0, got);
  const endsWithLf = tail.at(-1) === 10;
  if (!endsWithLf) return { endsWithLf, line: undefined };
  const start = tail.lastIndexOf(10, tail.length - 2);
  if (start === -1 && size > tail.length) return { endsWithLf, line: undefined }; // longer than the window
  return { endsWithLf, line: tail.toString('utf8', start + 1, tail.length - 1) };
}

/** What {@link appendWitness} did. */
export type WitnessAppend = 'appended' | 'already-witnessed';

/**
 * Appends `head` to the mirror's witness file in `dir` (see the module comment), unless its last
 * line already holds the same head (same batch and hash). The file is created with `modes.file`
 * when missing (and the directory fsynced); the line is written whole in one `write` with
 * `O_APPEND`, preceded by a LF when the file does not end with one (a write cut short by a crash
 * stays a line of its own), then the file is fsynced. Nothing is ever rewritten or truncated.
 *
 * @param head - a signed head with a non-null `head`
 * @throws {@link ExportError} naming `CONVO_MIRROR_WITNESS_DIR` and the path when the directory is
 *   unusable or the file cannot be opened, read, written or fsynced
 */
export function appendWitness(dir: string, head: SignedHead, modes: FileModes): WitnessAppend {
  assertWitnessUsable(dir, head.mirror_id);
  const file = witnessFile(dir, head.mirror_id);
  const fail = (what: string, err: unknown) =>
    new ExportError(`${WITNESS_VARIABLE}: cannot ${what} the witness file ${file}: ${osReason(err)}`, { file, setting: WITNESS_VARIABLE }, err);
  let opened: { fd: number; created: boolean };
  try {
    opened = openForAppend(file, modes.file);
  } catch (err) {
    throw fail('open', err);
  }
  const { fd, created } = opened;
  try {
    let last: ReturnType<typeof lastLine>;
    try {
      const st = fs.fstatSync(fd);
      if (!st.isFile()) throw Object.assign(new Error('not a regular file'), { code: 'EINVAL' });
      last = lastLine(fd, st.size);
    } catch (err) {
      throw fail('read', err);
    }
    if (last.line !== undefined && head.head) {
      let json: unknown;
      try {
        json = JSON.parse(last.line);
      } catch {
        json = undefined;
      }
      const parsed = parseSignedHead(json);
      if (parsed.ok && parsed.head.mirror_id === head.mirror_id && parsed.head.head?.batch_id === head.head.batch_id && parsed.head.head.hash === head.head.hash) {
        return 'already-witnessed';
      }
    }
    const line = renderHeadLine(head);
    const data = last.endsWithLf ? line : Buffer.concat([Buffer.from('\n'), line]);
    try {
      const written = fs.writeSync(fd, data);
      if (written !== data.length) throw Object.assign(new Error(`short write (${written} of ${data.length} bytes)`), { code: 'EIO' });
      fs.fsyncSync(fd);
    } catch (err) {
      throw fail('append to', err);
    }
  } finally {
    fs.closeSync(fd);
  }
  if (created) {
    try {
      fsyncDir(path.dirname(file));
    } catch (err) {
      throw fail('make durable', err);
    }
  }
  return 'appended';
}

/** One line of a witness file as {@link readWitnessLines} read it. */
export type WitnessLine = { line: number; head: SignedHead } | { line: number; why: string };

/**
 * Reads a witness file line by line, streamed in 1 MiB chunks, never through a symlink: each line
 * parsed as a signed head, or why it is not one (not JSON, another shape, longer than 64 KiB, the
 * last line cut short without its LF). Stops after {@link MAX_WITNESS_LINES} lines with a line
 * saying so.
 *
 * @param o.upTo - read only the file's first `upTo` bytes: its size when a verification began,
 *   before it read the archive (a publisher writes a record, then its witness line, so a witness
 *   read first never holds a head the archive read after it lacks); a line still being appended at
 *   that size is left out, not called cut short. @defaultValue the whole file
 * @throws what `fs` throws opening it (ENOENT when it is missing, ELOOP for a symlink); an Error
 *   when it is not a regular file
 */
export function* readWitnessLines(file: string, o: { upTo?: number } = {}): Generator<WitnessLine> {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new Error(`${file} is not a regular file`);
    let left = Math.min(o.upTo ?? st.size, st.size);
    const buf = Buffer.allocUnsafe(1 << 20);
    let parts: Buffer[] = [];
    let partBytes = 0;
    let tooLong = false;
    let n = 0;
    const parse = (text: string): WitnessLine => {
      n++;
      if (tooLong) return { line: n, why: `longer than ${MAX_WITNESS_LINE_BYTES} bytes: not a signed head` };
      let json: unknown;
      try {
        json = JSON.parse(text);
      } catch {
        return { line: n, why: 'not JSON' };
      }
      const parsed = parseSignedHead(json);
      return parsed.ok ? { line: n, head: parsed.head } : { line: n, why: parsed.why };
    };
    const read = (): number => {
      const got = left > 0 ? fs.readSync(fd, buf, 0, Math.min(buf.length, left), null) : 0;
      left -= got;
      return got;
    };
    for (let got = read(); got > 0; got = read()) {
      let start = 0;
      for (let i = buf.indexOf(10, 0); i !== -1 && i < got; i = buf.indexOf(10, start)) {
        if (!tooLong) parts.push(Buffer.from(buf.subarray(start, i)));
        partBytes += i - start;
        tooLong ||= partBytes > MAX_WITNESS_LINE_BYTES;
        yield parse(tooLong ? '' : Buffer.concat(parts).toString('utf8'));
        if (n >= MAX_WITNESS_LINES) {
          yield { line: n + 1, why: `the file has more than ${MAX_WITNESS_LINES} lines: the rest was not read` };
          return;
        }
        parts = [];
        partBytes = 0;
        tooLong = false;
        start = i + 1;
      }
      if (start < got) {
        partBytes += got - start;
        if (partBytes > MAX_WITNESS_LINE_BYTES) tooLong = true;
        else parts.push(Buffer.from(buf.subarray(start, got)));
      }
    }
    // A last line without its LF that the file has since grown past was being appended: left out.
    if (partBytes > 0 && !(o.upTo !== undefined && fs.fstatSync(fd).size > o.upTo)) {
      const last = parse(tooLong ? '' : Buffer.concat(parts).toString('utf8'));
      yield 'why' in last ? last : { line: last.line, why: 'cut short: no LF at its end (a write interrupted by a crash?)' };
    }
  } finally {
    fs.closeSync(fd);
  }
}
