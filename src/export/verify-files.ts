/**
 * The file checks of `verify`: each listed data file against its record (never through a symlink,
 * streamed: memory bounded by a read chunk whatever the file's size), what lies in the partition
 * trees that no record lists, and the temp directory.
 */
import fs from 'node:fs';
import path from 'node:path';
import { recordPath } from './ledger.js';
import type { FileState } from './file-states.js';
import { LineSplitter, LineTooLong, MAX_GUNZIP_BYTES, readDataFile } from './line-stream.js';
import { LineTreeHasher, MerkleTreeBuilder, leafHash } from './merkle.js';
import { parseStub, seqOfLine } from './stub.js';
import { TEMP_DIR, isTempName, kindOf } from './paths.js';
import type { VerifyProblem } from './verify-types.js';

/** A listed file as its record says it is. */
export interface Listed {
  path: string;
  lines: number;
  bytes: number;
  sha256: string;
  /** The Merkle tree hash of its lines (records of version 2); absent: not checked. */
  merkle_root?: string | undefined;
}

/** Most bytes a `.jsonl.gz` may decompress to when its lines are counted and hashed: the line reader's cap. */
export { MAX_GUNZIP_BYTES };

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
 * SHA-256, line count and, when the record has one, the Merkle tree hash of its lines. A difference
 * carries both values: `found` (on disk) and `expected` (the record's): bytes for `size`, the hex
 * digest for `sha256`, lines for `lines`, the hex root for `merkle_root` (whose detail names the
 * record). A `.jsonl.gz` is decompressed as it is read (whatever its size: at most
 * {@link MAX_GUNZIP_BYTES} come out), so its lines are counted and hashed even when its bytes
 * differ: a `sha256` problem then says whether the lines still hash to the recorded root.
 *
 * @param batchId - the batch whose record lists the file (named by a `merkle_root` problem)
 */
export async function checkListed(root: string, dirs: DirCheck, f: Listed, batchId: number): Promise<VerifyProblem[]> {
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
  let digest: Digest;
  try {
    digest = await digestFile(abs, f.path.endsWith('.gz'));
  } catch (err) {
    return [{ path: f.path, problem: 'missing', detail: `cannot read it: ${(err as Error).message}` }];
  }
  const out: VerifyProblem[] = [];
  const rootChecked = f.merkle_root !== undefined && digest.merkleRoot !== undefined;
  if (digest.bytes !== f.bytes) out.push({ path: f.path, problem: 'size', found: digest.bytes, expected: f.bytes });
  if (digest.sha256 !== f.sha256) {
    const linesIntact = rootChecked && digest.merkleRoot === f.merkle_root;
    out.push({
      path: f.path,
      problem: 'sha256',
      found: digest.sha256,
      expected: f.sha256,
      ...(linesIntact ? { detail: 'its lines hash to the merkle_root of its record: the lines are as recorded; the bytes around them (compression, a line end) or the recorded SHA-256 are not' } : {}),
    });
  }
  if (digest.unreadable) out.push({ path: f.path, problem: 'lines', detail: digest.unreadable });
  else if (digest.lines !== f.lines) out.push({ path: f.path, problem: 'lines', found: digest.lines, expected: f.lines });
  if (rootChecked && digest.merkleRoot !== f.merkle_root) {
    out.push({
      path: f.path,
      problem: 'merkle_root',
      found: digest.merkleRoot,
      expected: f.merkle_root,
      detail: `the Merkle tree hash of its ${digest.leaves} lines is not the one the record of batch ${batchId} (${recordPath(batchId)}) commits to: a line was changed, added, removed or moved`,
    });
  }
  return out;
}

/** Problems named one by one in a rewritten file, at most; the rest are counted in one more. */
const ERASED_SHOWN = 20;

/**
 * A file an erasure record rewrote (see src/export/file-states.ts) against what the records say
 * of it now, streamed: a regular file reached without a symlink, with the latest SHA-256 and the
 * original line count; each stub (src/export/stub.ts) one of a seq an erasure record lists, with
 * the leaf it recorded; no line the records list as erased other than a stub, none missing; and,
 * when its original record is of version 2, the Merkle tree hash of its lines, each stub counted
 * as the leaf it carries, the root that record commits to: every line not erased is proven
 * unchanged. Without a root (version 1) the file is erased without line proof
 * (`withoutLineProof`), proven by the erasure record's SHA-256 alone.
 *
 * Problems: `missing`, `not-regular`, `sha256` (found, expected: the erasure record's),
 * `lines`, `merkle_root` (found, expected: the original record's root), `erasure` (detail names
 * the seq and the record).
 */
export async function checkErased(root: string, dirs: DirCheck, f: FileState): Promise<{ problems: VerifyProblem[]; withoutLineProof: boolean }> {
  const withoutLineProof = f.original.merkle_root === undefined;
  const viaDir = dirs.problemFor(f.path);
  if (viaDir) return { problems: [viaDir], withoutLineProof };
  const abs = path.join(root, f.path);
  let st: fs.Stats;
  try {
    st = fs.lstatSync(abs);
  } catch {
    return { problems: [{ path: f.path, problem: 'missing' }], withoutLineProof };
  }
  if (!st.isFile()) return { problems: [{ path: f.path, problem: 'not-regular', detail: `${kindOf(st)}, expected a regular file` }], withoutLineProof };
  const out: VerifyProblem[] = [];
  let more = 0;
  const say = (p: VerifyProblem) => (out.length < ERASED_SHOWN ? out.push(p) : more++);
  const tree = new MerkleTreeBuilder();
  const stubs = new Set<number>();
  let leafProblems = 0;
  const record = (id: number) => `erasure record ${id} (${recordPath(id)})`;
  const splitter = new LineSplitter((line, index) => {
    const stub = parseStub(line);
    if (stub) {
      tree.pushHex(stub.leaf);
      stubs.add(stub.seq);
      const listed = f.erased.get(stub.seq);
      if (!listed) say({ path: f.path, problem: 'erasure', detail: `line ${index + 1}: a stub of seq ${stub.seq} that no erasure record lists: an erased line is listed by the erasure record that replaced it` });
      else if (listed.leaf !== stub.leaf) {
        leafProblems++;
        say({ path: f.path, problem: 'erasure', found: stub.leaf, expected: listed.leaf, detail: `seq ${stub.seq} (line ${index + 1}): its stub carries this leaf, ${record(listed.record)} the expected one` });
      }
      return;
    }
    tree.push(leafHash(line));
    const seq = seqOfLine(line);
    const listed = seq === undefined ? undefined : f.erased.get(seq);
    if (listed) say({ path: f.path, problem: 'erasure', detail: `seq ${seq!} (line ${index + 1}): ${record(listed.record)} lists it as erased, yet the line is not a stub` });
  });
  let digest;
  try {
    digest = await readDataFile(abs, f.path.endsWith('.gz'), (chunk) => splitter.update(chunk));
    splitter.end();
  } catch (err) {
    if (err instanceof LineTooLong) return { problems: [{ path: f.path, problem: 'lines', detail: err.message }], withoutLineProof };
    return { problems: [{ path: f.path, problem: 'missing', detail: `cannot read it: ${(err as Error).message}` }], withoutLineProof };
  }
  const problems: VerifyProblem[] = [];
  if (digest.sha256 !== f.sha256) problems.push({ path: f.path, problem: 'sha256', found: digest.sha256, expected: f.sha256 });
  if (digest.unreadable) {
    problems.push({ path: f.path, problem: 'lines', detail: digest.unreadable });
    return { problems, withoutLineProof };
  }
  if (splitter.lines !== f.original.lines) problems.push({ path: f.path, problem: 'lines', found: splitter.lines, expected: f.original.lines });
  for (const [seq, e] of f.erased) if (!stubs.has(seq)) say({ path: f.path, problem: 'erasure', detail: `seq ${seq}: ${record(e.record)} lists it as erased, but no stub of it is in the file` });
  problems.push(...out);
  if (more > 0) problems.push({ path: f.path, problem: 'erasure', detail: `and ${more} more problems of its erased lines` });
  if (!withoutLineProof && tree.rootHex() !== f.original.merkle_root) {
    problems.push({
      path: f.path,
      problem: 'merkle_root',
      found: tree.rootHex(),
      expected: f.original.merkle_root,
      detail:
        `the Merkle tree hash of its ${tree.size} lines, each stub counted as the leaf it carries, is not the one the record of batch ${f.batch} (${recordPath(f.batch)}) commits to: ` +
        (leafProblems > 0 ? 'a stub carries another leaf than recorded (above), or another line was changed' : 'a line that was not erased was changed, added, removed or moved'),
    });
  }
  return { problems, withoutLineProof };
}

/** What {@link digestFile} found. */
interface Digest {
  /** Size as stored. */
  bytes: number;
  /** SHA-256 (hex) of the bytes as stored. */
  sha256: string;
  /** LF bytes of the content (decompressed for a `.gz`, as far as it could be). */
  lines: number;
  /** The Merkle tree hash (hex) of the content's lines; undefined when the content could not be read (`unreadable`). */
  merkleRoot?: string | undefined;
  /** Lines hashed into {@link Digest.merkleRoot} (an unterminated last line counts). */
  leaves?: number | undefined;
  /** Why the lines of a `.gz` could not be read (not gzip, cut short, or more than {@link MAX_GUNZIP_BYTES}). */
  unreadable?: string | undefined;
}

/**
 * Size and SHA-256 of a regular file as stored ({@link readDataFile}: in 1 MiB chunks, never through a symlink), and
 * its content's LF count and Merkle tree hash of lines ({@link LineTreeHasher}): of the bytes, or
 * with `gzip` of the decompressed bytes, streamed, at most {@link MAX_GUNZIP_BYTES} of them.
 * Memory: a read chunk and what zlib buffers, whatever the file's size.
 *
 * @throws what `fs` throws
 */
async function digestFile(abs: string, gzip: boolean): Promise<Digest> {
  const tree = new LineTreeHasher();
  let lines = 0;
  const d = await readDataFile(abs, gzip, (chunk) => {
    lines += countLf(chunk);
    tree.update(chunk);
  });
  if (d.unreadable !== undefined) return { bytes: d.bytes, sha256: d.sha256, lines, unreadable: d.unreadable };
  return { bytes: d.bytes, sha256: d.sha256, lines, merkleRoot: tree.rootHex(), leaves: tree.lines };
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
