/**
 * The archive step of an erasure (issue 26, item 2): every published line of the erased subject is
 * replaced by its stub (src/export/stub.ts) in a new file written beside the old one, an erasure
 * record (src/export/ledger.ts) listing each file's old and new SHA-256 and the seqs erased is
 * published in the ledger (the same chain: nothing in it is rewritten), and only then are the old
 * files removed. Runs with the publisher lock held, from a publication (`publishChanges`), before
 * any new batch is planned: `erase` and every `sync` or daemon publication finish what an erasure
 * left pending.
 *
 * Which lines: every line at or below the erasure's published-through seq that the mirror says
 * concerns the subject (`Mirror.subjectLines`: for a sender, every `messages` line of the messages
 * it redacted and every `conversations` line of the conversations it redacted, those naming the
 * sender; for a conversation, every line of it in `messages` and `conversations`), found in
 * the files the mirror lists of that account and stream whose seq range holds one. A line that is
 * already a stub stays as it is. `runs` lines are never touched.
 *
 * The steps, each safe to interrupt (the plan is deterministic: the same stubs, the same bytes,
 * the same names):
 * 1. each file holding a line to erase is read (streamed; its SHA-256 must be the one recorded, and
 *    the root of its lines, each stub counted as the leaf it carries, the one its record commits
 *    to) and written again, private, fsynced, renamed into place as `<name>.e<N>.jsonl[.gz]`
 *    (deterministic gzip for a `.gz`); a re-run finds the same bytes there and keeps them;
 * 2. the mirror reserves the record's batch id (the next one; no batch is planned under it), the
 *    record is sealed (signed with the key) and written as `_ledger/<id>.json` (a re-run finds the
 *    same record and keeps it);
 * 3. the mirror records it: the head moves by compare-and-set, `export_files` lists the new files
 *    in place of the old; then the witness line and `manifest.json`;
 * 4. the old files are removed (each only if it still holds what was published: a file someone
 *    changed is left, and named in a warning), and the erasure is marked archived.
 * A crash before 3 leaves the old files listed and complete (the new ones are found again); after
 * 3, the record says which files to remove. An erasure whose lines are all stubs already (erased
 * before) writes no record.
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import type { Logger } from 'pino';
import { isoNow, type Clock } from '../clock.js';
import { ExportError } from '../errors.js';
import { fsyncDir } from '../private-fs.js';
import type { ErasureRow, ErasureSubject, LedgerEntry, LedgerHead, Mirror, PublishedFile, ReplacedFile } from '../store/mirror.js';
import { GzipEncoder } from './gzip.js';
import { LEDGER_DIR, erasedPath, isBatchRecord, isErasureRecord, originalPath, parseRecord, recordPath, type AnyBody, type ErasureBody, type ErasureRecord, type ErasureRecordFile } from './ledger.js';
import { LineSplitter, LineTooLong, readDataFile } from './line-stream.js';
import { MerkleTreeBuilder, leafHash } from './merkle.js';
import { erasureTempName } from './paths.js';
import { MAX_RECORD_BYTES, createTemp, discardTemp, existingDataFile, makeDir, readIfPresent, removeIfPublished, renameIntoPlace, writeAll, type ExportFailpoint, type Target } from './publish-fs.js';
import { parseStub, renderStub, seqOfLine, stubOf } from './stub.js';
import { conversationNamesSender, senderNeedle } from '../store/redaction.js';

/** What the archive step (and the retention step, src/export/retention.ts) needs of the publication it runs in. */
export interface ErasureStepContext {
  mirror: Mirror;
  target: Target;
  mirrorId: string;
  clock: Clock;
  logger?: Logger | undefined;
  failpoint?: ((point: ExportFailpoint, file: string) => void | Promise<void>) | undefined;
  /** Seals (and signs) a record and publishes it as `_ledger/<batch id>.json`, keeping an identical one; its ledger entry. */
  publishRecord(body: AnyBody): LedgerEntry;
  /** Publishes the signed head (witness line, `manifest.json`). */
  publishHead(head: LedgerHead | undefined, watermark: number): void;
  /** Throws when the publisher lock is known lost. */
  assertLeaseHeld(): void;
}

/** What the archive step did for one erasure. */
export interface ErasureArchived {
  /** The mirror's erasure id. */
  erasureId: number;
  /** Its record in the ledger; undefined when none was needed (no published line, or all already stubs). */
  record: LedgerHead | undefined;
  /** The files rewritten: the path replaced, the new one, and the lines stubbed in it. */
  files: { path: string; new_path: string; lines: number }[];
  /** Lines replaced by stubs, in all. */
  lines: number;
  /** Replaced files removed by this call (a re-run after a crash may find them gone already). */
  removed: number;
  /** Replaced files left because they no longer hold what was published (named in a warning). */
  kept: string[];
}

/**
 * Finishes every erasure the mirror has not marked archived, oldest first (see the module
 * comment). Call with the publisher lock held and no export batch pending (its record must come
 * first: `publishChanges` publishes it before).
 *
 * @returns what was done, one entry per erasure finished
 * @throws {@link ExportError} naming the file when a published file is not what the mirror recorded
 *   (its SHA-256, a line the mirror says is the subject's, the root of its lines), a record cannot be
 *   read or written; {@link StoreError} `LEDGER_FENCED` when another publisher moved the head
 */
export async function finishErasures(ctx: ErasureStepContext): Promise<ErasureArchived[]> {
  const pending = (await ctx.mirror.erasures()).filter((e) => e.archiveDoneAt === null);
  const out: ErasureArchived[] = [];
  for (const e of pending) out.push(await finishOne(ctx, e));
  return out;
}

/** Finishes one erasure; see the module comment. */
async function finishOne(ctx: ErasureStepContext, e: ErasureRow): Promise<ErasureArchived> {
  const { mirror, target } = ctx;
  const log = ctx.logger?.child({ erasure: e.id });
  const done: ErasureArchived = { erasureId: e.id, record: undefined, files: [], lines: 0, removed: 0, kept: [] };
  const entries = await mirror.ledgerEntries();
  const recorded = e.archiveBatchId === null ? undefined : entries.find((x) => x.batch_id === e.archiveBatchId);
  let record: ErasureRecord;
  if (recorded) {
    // Interrupted after the mirror recorded the record: the record says what it replaced.
    record = readOwnRecord(target.root, recorded);
    ctx.assertLeaseHeld();
    ctx.publishHead(await mirror.ledgerHead(), await mirror.exportWatermark());
  } else {
    const watermark = await mirror.exportWatermark();
    if (e.publishedThroughSeq > watermark) {
      throw new ExportError(`erasure ${e.id}: lines up to seq ${e.publishedThroughSeq} may be published, but the watermark is ${watermark}: publish the planned batch first`, { erasure_id: e.id });
    }
    const plan = await rewriteAll(ctx, e);
    if (plan.length === 0) {
      await mirror.recordErasureArchived(e.id, isoNow(ctx.clock));
      log?.info('erasure: no published line left to rewrite; no erasure record needed');
      return done;
    }
    const id = await mirror.planErasureRecord(e.id);
    if (e.archiveBatchId !== null && e.archiveBatchId !== id) removeOrphanRecord(ctx, e.archiveBatchId, e.id, entries);
    await ctx.failpoint?.('erasure-before-record', path.join(target.root, recordPath(id)));
    const head = await mirror.ledgerHead();
    if (!head) throw new ExportError(`erasure ${e.id}: files were published, yet the ledger has no record to chain on`, { erasure_id: e.id });
    const body: ErasureBody = {
      format: 'convo-mirror-ledger',
      version: 2,
      kind: 'erasure',
      mirror_id: ctx.mirrorId,
      batch_id: id,
      erasure: { id: e.id, kind: e.kind, account_id: e.accountId, reason: e.reason, requested_at: e.requestedAt, ...(e.kind === 'retention' ? { cutoff: e.subject } : {}) },
      files: plan.map((p) => p.entry),
      prev: head,
    };
    ctx.assertLeaseHeld();
    const entry = ctx.publishRecord(body);
    await ctx.failpoint?.('erasure-before-mirror', path.join(target.root, entry.path));
    const replaced: ReplacedFile[] = plan.map((p) => ({ from: p.entry.path, file: p.file }));
    await mirror.recordErasureRecord(e.id, entry, replaced, isoNow(ctx.clock));
    await ctx.failpoint?.('erasure-after-record', path.join(target.root, entry.path));
    ctx.assertLeaseHeld();
    ctx.publishHead({ batch_id: entry.batch_id, hash: entry.hash }, watermark);
    record = readOwnRecord(target.root, entry);
  }
  done.record = { batch_id: record.batch_id, hash: record.hash };
  done.files = record.files.map((f) => ({ path: f.path, new_path: f.new_path, lines: f.redacted_seqs.length }));
  done.lines = done.files.reduce((n, f) => n + f.lines, 0);
  for (const f of record.files) {
    const r = removeIfPublished(target.root, f.path, f.sha256, 'remove the replaced file');
    if (r === 'removed') done.removed++;
    else if (r === 'changed') {
      done.kept.push(f.path);
      log?.warn({ file: f.path }, 'erasure: a replaced file no longer holds what was published: left as it is (verify names it); remove it by hand');
    }
  }
  await ctx.failpoint?.('erasure-after-delete', path.join(target.root, recordPath(record.batch_id)));
  await mirror.recordErasureArchived(e.id, isoNow(ctx.clock));
  log?.info({ record: `${record.batch_id}:${record.hash}`, files: done.files.length, lines: done.lines }, 'erasure: published lines replaced by stubs, erasure record published');
  return done;
}

/** One file rewritten: its entry in the erasure record, and its row in `export_files`. */
interface Rewritten {
  entry: ErasureRecordFile;
  file: PublishedFile;
}

/**
 * The published files of `e`'s account and streams whose seq range holds a line of the subject at
 * or below its published-through seq, in the mirror's order, with those seqs.
 */
async function filesToRewrite(mirror: Mirror, root: string, e: ErasureSubject, through: number): Promise<{ file: PublishedFile; seqs: Set<number>; fromMirror: number }[]> {
  const lines = await mirror.subjectLines(e, through);
  // A sender's published conversation lines are found in the files too: a conversation that named
  // the sender when it was published and no longer does is in no row the mirror keeps (conversations
  // keep no history, published payloads are pruned).
  const scanConversations = e.kind === 'sender';
  if (lines.length === 0 && !scanConversations) return [];
  const byStream = new Map<string, number[]>();
  for (const l of lines) (byStream.get(l.stream) ?? byStream.set(l.stream, []).get(l.stream)!).push(l.seq);
  const out: { file: PublishedFile; seqs: Set<number>; fromMirror: number }[] = [];
  for (const f of await mirror.publishedFiles()) {
    if (f.account_id !== e.accountId) continue;
    const inFile = seqsBetween(byStream.get(f.stream) ?? [], f.first_seq, f.last_seq);
    const seqs = new Set(inFile);
    if (scanConversations && f.stream === 'conversations' && f.first_seq <= through) for (const seq of await linesNamingSender(root, f, e.subject, through)) seqs.add(seq);
    if (seqs.size > 0) out.push({ file: f, seqs, fromMirror: inFile.length });
  }
  return out;
}

/**
 * The seqs (at or below `through`) of the lines of published `conversations` file `f` that are not
 * stubs and name sender `senderId` (`conversationNamesSender`: its id as a JSON string value at any
 * depth of the line). Streamed.
 *
 * @throws {@link ExportError} naming the file when it cannot be read
 */
async function linesNamingSender(root: string, f: PublishedFile, senderId: string, through: number): Promise<number[]> {
  const out: number[] = [];
  const needle = Buffer.from(senderNeedle(senderId), 'utf8');
  const splitter = new LineSplitter((line) => {
    if (!line.includes(needle) || parseStub(line)) return;
    const seq = seqOfLine(line);
    if (seq !== undefined && seq <= through && conversationNamesSender(line.toString('utf8'), senderId)) out.push(seq);
  });
  try {
    await readDataFile(path.join(root, f.path), f.path.endsWith('.gz'), (chunk) => splitter.update(chunk));
    splitter.end();
  } catch (err) {
    throw new ExportError(`cannot read the published file ${f.path}: ${(err as Error).message}`, { file: f.path }, err);
  }
  return out;
}

/** The values of the ascending `seqs` within `[from, to]`. */
function seqsBetween(seqs: readonly number[], from: number, to: number): number[] {
  let lo = 0;
  let hi = seqs.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (seqs[mid]! < from) lo = mid + 1;
    else hi = mid;
  }
  const out: number[] = [];
  for (let i = lo; i < seqs.length && seqs[i]! <= to; i++) out.push(seqs[i]!);
  return out;
}

/** Rewrites every file holding a line of `e` not yet a stub; the files rewritten, in order. */
async function rewriteAll(ctx: ErasureStepContext, e: ErasureRow): Promise<Rewritten[]> {
  const roots = new RootsOfRecords(ctx.target.root, await ctx.mirror.ledgerEntries());
  const out: Rewritten[] = [];
  for (const { file, seqs } of await filesToRewrite(ctx.mirror, ctx.target.root, e, e.publishedThroughSeq)) {
    const r = await rewriteFile(ctx.target, file, seqs, e.id, roots.rootOf(file));
    if (!r) continue;
    out.push(r);
    await ctx.failpoint?.('erasure-after-file', path.join(ctx.target.root, r.entry.new_path));
  }
  return out;
}

/**
 * What a file's original record commits to of its lines (also what a retention record repeats of
 * each file it expires: src/export/retention.ts): the Merkle root (a record of version 2),
 * or none (version 1, and the genesis record of an export directory older than the ledger).
 */
export class RootsOfRecords {
  private readonly cache = new Map<number, Map<string, string | undefined>>();
  constructor(
    private readonly root: string,
    private readonly entries: readonly LedgerEntry[],
  ) {}

  /**
   * The root `file`'s record commits to: the record of its batch, or for a file published before
   * the ledger the genesis record (the first). Undefined for a version 1 record.
   *
   * @throws {@link ExportError} when that record cannot be read back sound, or does not list the file
   */
  rootOf(file: PublishedFile): { root: string | undefined } {
    const entry = this.entries.find((x) => x.batch_id === file.batch_id) ?? (this.entries[0] && this.entries[0].batch_id > file.batch_id ? this.entries[0] : undefined);
    const original = originalPath(file.path);
    if (!entry) throw new ExportError(`${original}: no record of the ledger lists it (batch ${file.batch_id}): run convo-mirror verify`, { file: original });
    let files = this.cache.get(entry.batch_id);
    if (!files) {
      const r = readRecordAs(this.root, entry);
      if (!isBatchRecord(r)) throw new ExportError(`${entry.path} is an ${r.kind} record, not the record of batch ${file.batch_id}`, { file: entry.path });
      files = new Map(r.files.map((f) => [f.path, f.merkle_root]));
      this.cache.set(entry.batch_id, files);
    }
    if (!files.has(original)) throw new ExportError(`${original}: the record ${entry.path} does not list it: run convo-mirror verify`, { file: original });
    return { root: files.get(original) };
  }
}

/**
 * Reads record `entry` back from the archive and checks it is the one the mirror recorded (its hash).
 *
 * @throws {@link ExportError} naming it otherwise
 */
function readRecordAs(root: string, entry: LedgerEntry): ReturnType<typeof parseOk> {
  const file = path.join(root, entry.path);
  let bytes: Buffer | undefined;
  try {
    bytes = readIfPresent(file, MAX_RECORD_BYTES);
  } catch (err) {
    throw new ExportError(`cannot read the record ${file}: ${(err as Error).message}`, { file }, err);
  }
  if (bytes === undefined) throw new ExportError(`the record ${file} is missing: run convo-mirror verify`, { file });
  const r = parseOk(bytes, file);
  if (r.hash !== entry.hash || r.batch_id !== entry.batch_id) throw new ExportError(`the record ${file} is not the one the mirror recorded (hash ${r.hash}, recorded ${entry.hash}): run convo-mirror verify`, { file });
  return r;
}

/** A record file's record. @throws {@link ExportError} naming `file` when it does not read back sound */
function parseOk(bytes: Buffer, file: string) {
  const parsed = parseRecord(bytes);
  if (!parsed.ok) throw new ExportError(`the record ${file} does not read back: ${parsed.why}`, { file });
  return parsed.record;
}

/** The erasure record the mirror recorded as `entry`, read back. @throws {@link ExportError} */
function readOwnRecord(root: string, entry: LedgerEntry): ErasureRecord {
  const r = readRecordAs(root, entry);
  if (!isErasureRecord(r)) throw new ExportError(`${entry.path} is not an erasure record`, { file: entry.path });
  return r;
}

/**
 * Removes `_ledger/<id>.json` when it is an erasure record of erasure `erasureId` that the mirror
 * never recorded: one written under a reservation another publisher's record went past (it lost
 * the publisher lock meanwhile). Anything else there is left.
 */
function removeOrphanRecord(ctx: ErasureStepContext, id: number, erasureId: number, entries: readonly LedgerEntry[]): void {
  if (entries.some((x) => x.batch_id === id)) return;
  const file = path.join(ctx.target.root, recordPath(id));
  try {
    const bytes = readIfPresent(file, MAX_RECORD_BYTES);
    if (bytes === undefined) return;
    const parsed = parseRecord(bytes);
    if (!parsed.ok || !isErasureRecord(parsed.record) || parsed.record.erasure.id !== erasureId || parsed.record.mirror_id !== ctx.mirrorId) return;
    fs.unlinkSync(file);
    fsyncDir(path.join(ctx.target.root, LEDGER_DIR));
    ctx.logger?.warn({ file: recordPath(id), erasure: erasureId }, 'erasure: removed the erasure record another publisher went past; it is published again under the next batch id');
  } catch (err) {
    ctx.logger?.warn({ file: recordPath(id), err: (err as Error).message }, 'erasure: could not remove an erasure record another publisher went past');
  }
}

/** The bytes of a rewritten file as written: hashed as stored, and (gzip) its lines too. */
class RewriteWriter {
  private readonly fd: number;
  private readonly tmp: string;
  private readonly hash = crypto.createHash('sha256');
  private readonly linesHash: crypto.Hash | undefined;
  private readonly gzip: GzipEncoder | undefined;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  bytes = 0;

  constructor(target: Target, tempName: string, gzip: boolean) {
    ({ fd: this.fd, tmp: this.tmp } = createTemp(target, tempName));
    if (gzip) {
      this.gzip = new GzipEncoder();
      this.linesHash = crypto.createHash('sha256');
      this.store(this.gzip.header());
    }
  }

  /** Appends content bytes (uncompressed); gzipped in segments of about 1 MiB (deterministic). */
  write(buf: Buffer): void {
    this.pending.push(buf);
    this.pendingBytes += buf.length;
    if (this.pendingBytes >= 1 << 20) this.drain(false);
  }

  private drain(last: boolean): void {
    const buf = Buffer.concat(this.pending, this.pendingBytes);
    this.pending = [];
    this.pendingBytes = 0;
    if (!this.gzip) {
      if (buf.length > 0) this.store(buf);
      return;
    }
    this.linesHash!.update(buf);
    this.store(last ? Buffer.concat([this.gzip.push(buf), this.gzip.finish()]) : this.gzip.push(buf));
  }

  private store(buf: Buffer): void {
    this.hash.update(buf);
    this.bytes += buf.length;
    writeAll(this.fd, buf);
  }

  /** Ends the content; the SHA-256 of the bytes as stored and (gzip) of the lines. */
  finish(): { sha256: string; linesSha256: string | undefined } {
    this.drain(true);
    return { sha256: this.hash.digest('hex'), linesSha256: this.linesHash?.digest('hex') };
  }

  /** Puts the file in place as `final` (see `renameIntoPlace`). */
  place(target: Target, final: string): void {
    renameIntoPlace(target, this.fd, this.tmp, final);
  }

  /** Drops the temp file. */
  discard(): void {
    discardTemp(this.fd, this.tmp);
  }
}

/**
 * Rewrites `file` with the lines of `seqs` replaced by their stubs for erasure `erasureId` (see the
 * module comment), as {@link erasedPath}; undefined when each of them is a stub already.
 *
 * @param original - the root the file's original record commits to (undefined: version 1)
 * @throws {@link ExportError} naming the file when it is not what the mirror recorded: another
 *   SHA-256, a line the mirror says holds a seq of the subject missing or not an export line of
 *   the account, the root of its lines not the record's; when it cannot be read or written
 */
async function rewriteFile(target: Target, file: PublishedFile, seqs: ReadonlySet<number>, erasureId: number, original: { root: string | undefined }): Promise<Rewritten | undefined> {
  const abs = path.join(target.root, file.path);
  const gzip = file.path.endsWith('.gz');
  const stream = file.stream as 'messages' | 'conversations';
  const newRel = erasedPath(file.path, erasureId);
  const final = path.join(target.root, newRel);
  const refuse = (why: string, cause?: unknown) =>
    new ExportError(`cannot erase in the published file ${file.path}: ${why}; the erasure stays pending (run convo-mirror verify)`, { file: file.path }, cause);
  makeDir(target, path.dirname(final));
  const out = new RewriteWriter(target, erasureTempName(erasureId, file.first_seq), gzip);
  const redacted: { seq: number; leaf: string }[] = [];
  const seen = new Set<number>();
  /** The root of the original lines: a stub counts as the leaf it carries. */
  const tree = new MerkleTreeBuilder();
  const splitter = new LineSplitter((line, index, terminated) => {
    const stub = parseStub(line);
    const seq = stub?.seq ?? seqOfLine(line);
    let written = line;
    if (stub) tree.pushHex(stub.leaf);
    else tree.push(leafHash(line));
    if (seq !== undefined && seqs.has(seq)) {
      seen.add(seq);
      if (!stub) {
        let s;
        try {
          s = stubOf(line, stream, erasureId);
        } catch (err) {
          throw refuse(`line ${index + 1} (seq ${seq}): ${(err as Error).message}`);
        }
        if (s.seq !== seq || s.account_id !== file.account_id) throw refuse(`line ${index + 1} (seq ${seq}) is not a line of account ${file.account_id}`);
        redacted.push({ seq, leaf: s.leaf });
        written = renderStub(s);
      }
    }
    out.write(terminated ? Buffer.concat([written, LF]) : written);
  });
  let sha256: string;
  let linesSha256: string | undefined;
  try {
    let digest;
    try {
      digest = await readDataFile(abs, gzip, (chunk) => splitter.update(chunk));
      splitter.end();
    } catch (err) {
      if (err instanceof ExportError) throw err;
      if (err instanceof LineTooLong) throw refuse(err.message, err);
      throw refuse(`cannot read it: ${(err as Error).message}`, err);
    }
    if (digest.unreadable) throw refuse(digest.unreadable);
    if (digest.sha256 !== file.sha256) throw refuse(`its SHA-256 is ${digest.sha256}, not the ${file.sha256} the mirror recorded`);
    const missing = [...seqs].filter((s) => !seen.has(s));
    if (missing.length > 0) throw refuse(`the mirror says it holds seq ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? '…' : ''}, which no line of it has`);
    if (original.root !== undefined && tree.rootHex() !== original.root) throw refuse(`the root of its lines is ${tree.rootHex()}, not the ${original.root} its record commits to`);
    ({ sha256, linesSha256 } = out.finish());
  } catch (err) {
    out.discard();
    throw err;
  }
  if (redacted.length === 0) {
    out.discard();
    return undefined;
  }
  let bytes = out.bytes;
  const existing = (() => {
    try {
      return existingDataFile(final, sha256, linesSha256);
    } catch (err) {
      out.discard();
      throw err;
    }
  })();
  if (existing.kind === 'absent') out.place(target, final);
  else out.discard();
  if (existing.kind === 'equivalent') ({ sha256, bytes } = existing);
  redacted.sort((a, b) => a.seq - b.seq);
  const entry: ErasureRecordFile = {
    path: file.path,
    new_path: newRel,
    stream: file.stream,
    sha256: file.sha256,
    new_sha256: sha256,
    ...(original.root !== undefined ? { merkle_root: original.root } : {}),
    redacted_seqs: redacted.map((r) => r.seq),
    redacted_leaves: redacted.map((r) => r.leaf),
  };
  return { entry, file: { ...file, path: newRel, sha256, bytes } };
}

const LF = Buffer.from([10]);

/** What the archive step would rewrite for a subject now ({@link archiveDryRun}). */
export interface ArchiveDryRun {
  /** Published files holding a line of the subject not yet a stub. */
  files: number;
  /** Such lines in them. */
  lines: number;
  /** Lines at or below the seq given that no published file holds yet (in a batch planned and not published). */
  unpublished: number;
}

/**
 * Counts, writing nothing, what the archive step would rewrite for `subject` now: the published
 * files and lines at or below `throughSeq` of it that are not stubs yet. Reads each file that can
 * hold one (streamed).
 *
 * @throws {@link ExportError} naming a file that cannot be read
 */
export async function archiveDryRun(mirror: Mirror, exportDir: string, subject: ErasureSubject, throughSeq: number): Promise<ArchiveDryRun> {
  const root = path.resolve(exportDir);
  const candidates = await filesToRewrite(mirror, root, subject, throughSeq);
  const inFiles = candidates.reduce((n, c) => n + c.fromMirror, 0);
  const total = (await mirror.subjectLines(subject, throughSeq)).length;
  let files = 0;
  let lines = 0;
  for (const { file, seqs } of candidates) {
    let n = 0;
    const splitter = new LineSplitter((line) => {
      const seq = seqOfLine(line);
      if (seq !== undefined && seqs.has(seq) && !parseStub(line)) n++;
    });
    try {
      await readDataFile(path.join(root, file.path), file.path.endsWith('.gz'), (chunk) => splitter.update(chunk));
      splitter.end();
    } catch (err) {
      throw new ExportError(`cannot read the published file ${file.path}: ${(err as Error).message}`, { file: file.path }, err);
    }
    if (n > 0) {
      files++;
      lines += n;
    }
  }
  return { files, lines, unpublished: total - inFiles };
}
