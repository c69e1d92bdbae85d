/**
 * Exporter: change log → JSONL change files (design: src/export/).
 *
 * Exactly-once by construction:
 * 1. A batch is *planned* in SQLite first: its seq range `(watermark, max(seq)]` is fixed before any
 *    file is written, so a re-run after a crash re-publishes the very same lines.
 * 2. Each file is written to a temp file in `<dir>/.convo-mirror-tmp/`, fsynced, renamed into place
 *    (same filesystem), and its directory fsynced. File names derive from the seq range they hold,
 *    so re-publishing yields the same names and bytes.
 * 3. The manifest (every file, its line count, bytes and SHA-256) is published the same way.
 * 4. Only then, in one transaction, the files are recorded, the batch marked published and the
 *    exported watermark advanced.
 *
 * Layout: `<dir>/<stream>/account=<account_id>/date=<YYYY-MM-DD>/<first_seq>-<last_seq>.jsonl`,
 * stream `messages` or `conversations`, date from the line's `synced_at` (UTC). Each line is
 * {@link exportLine} of its change-log row (src/export/lines.ts) followed by `\n`.
 *
 * Nothing lost, nothing leaked: publication deletes nothing but its own leftovers in
 * `.convo-mirror-tmp/`, never replaces a published file with other bytes, and never writes over a
 * `manifest.json` it did not write.
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import type { Logger } from 'pino';
import type { ExportChange, Mirror } from '../store/mirror.js';
import { ExportError, type ConfigError } from '../errors.js';
import { isoNow, systemClock, type Clock } from '../clock.js';
import { PRIVATE_MODES, createPrivateFile, fsyncDir, mkdirPrivate, type FileModes } from '../private-fs.js';
import { MANIFEST, TEMP_DIR, assertSafeExportDir, isTempName, kindOf, manifestTempName, partitionTempName } from './paths.js';
import { manifestOf, renderManifest, type ExportFile, type Manifest } from './manifest.js';
import { exportLine } from './lines.js';

export { MANIFEST, TEMP_DIR, assertSafeExportDir } from './paths.js';
export { recordedManifest, renderManifest, type ExportFile, type Manifest } from './manifest.js';
export { verifyExports, type VerifyProblem, type VerifyProblemKind } from './verify.js';
export { exportLine } from './lines.js';

/** Options of {@link publishChanges}. */
export interface ExportOptions {
  /**
   * Root directory of the exports; created if missing (with any missing parents). It must pass
   * {@link assertSafeExportDir} for the mirror's database file.
   */
  exportDir: string;
  /** Most lines in one file; a larger partition is split. @defaultValue 100000 */
  maxLinesPerFile?: number;
  /** Run to record on the batch. */
  runId?: number | null;
  clock?: Clock;
  logger?: Logger | undefined;
  /**
   * Modes of every file (data files, manifest) and directory (the export root and its missing
   * parents, partition directories, `.convo-mirror-tmp/`) that publication creates, set exactly
   * whatever the umask. Existing directories are left as they are. The CLI passes
   * `fileModes(config.groupReadable)`.
   * @defaultValue {@link PRIVATE_MODES} (files 0600, directories 0700)
   */
  modes?: FileModes;
  /**
   * Test hook (a failpoint): called at `point` with the absolute path of the file being published.
   * Whatever it throws propagates unchanged and nothing is cleaned up, so the files on disk stay as
   * a crash at that point would leave them. Never set in production.
   */
  failpoint?: (point: ExportFailpoint, file: string) => void;
}

/**
 * Where {@link ExportOptions.failpoint} is called:
 * - `before-rename`: a data file or the manifest is written and fsynced in `.convo-mirror-tmp/`,
 *   not yet renamed into place (`file` is its final path);
 * - `before-record`: every file and the manifest are in place, nothing is recorded in SQLite yet
 *   (`file` is the manifest's path).
 */
export type ExportFailpoint = 'before-rename' | 'before-record';

/** What one {@link publishChanges} call published. */
export interface ExportResult {
  /** Files published by this call (empty when nothing was pending). */
  files: ExportFile[];
  /** Lines in those files. */
  lines: number;
  /** The exported watermark after the call (last published change_log.seq). */
  watermark: number;
  /** True when a batch planned by an earlier, interrupted call was re-published. */
  resumed: boolean;
}

/**
 * Publishes every change-log row above the exported watermark. Idempotent: with nothing pending it
 * writes no data file (it only repairs a missing or stale manifest). First it checks the export
 * directory ({@link assertSafeExportDir}), creates it if missing, checks its manifest is this
 * mirror's, and removes the leftovers of an interrupted publication from `.convo-mirror-tmp/`
 * (regular files with names convo-mirror generates; nothing else anywhere).
 *
 * @throws {@link ConfigError} (`CONVO_MIRROR_EXPORT_DIR`) when the export directory is unsafe for
 *   the mirror's database file (`mirror.file`), see {@link assertSafeExportDir}; nothing is written
 * @throws {@link ExportError} naming the file or directory, before anything is written, when
 *   `manifest.json` is not one this mirror wrote (another program's file, unparsable, another
 *   format, or another mirror's) or `.convo-mirror-tmp` is not a directory
 * @throws {@link ExportError} naming the file when a write, fsync or rename fails; the watermark is
 *   then unchanged and the next call re-publishes the same batch
 */
export function publishChanges(mirror: Mirror, opts: ExportOptions): ExportResult {
  assertSafeExportDir(opts.exportDir, mirror.file);
  const clock = opts.clock ?? systemClock;
  const maxLines = opts.maxLinesPerFile ?? 100_000;
  const dir = path.resolve(opts.exportDir);
  const modes = opts.modes ?? PRIVATE_MODES;
  try {
    mkdirPrivate(dir, modes, { durable: true });
  } catch (err) {
    throw new ExportError(`cannot create the export directory ${dir}: ${(err as Error).message}`, { dir }, err);
  }
  const mirrorId = mirror.mirrorId();
  assertOwnedBy(dir, mirrorId);
  const target: Target = { root: dir, temp: prepareTempDir(dir, modes), modes, failpoint: opts.failpoint };

  // 1. Plan (or find the planned, unpublished) batch.
  const plan = mirror.planExportBatch(opts.runId ?? null, isoNow(clock));
  if (!plan) {
    const watermark = mirror.exportWatermark();
    writeManifestIfChanged(target, manifestOf(mirror, mirrorId, [], watermark));
    return { files: [], lines: 0, watermark, resumed: false };
  }
  if (plan.resumed) opts.logger?.warn({ batch: plan.id, first_seq: plan.first_seq, last_seq: plan.last_seq }, 're-publishing an export batch interrupted earlier');

  // 2. Write the batch's files, one partition (stream, account, day) at a time, in seq order.
  const rows = mirror.changesOf(plan);
  const files: ExportFile[] = [];
  let open: PartitionWriter | undefined;
  for (const row of rows) {
    if (open && !open.accepts(row, maxLines)) {
      files.push(open.publish());
      open = undefined;
    }
    open ??= new PartitionWriter(target, row, plan.id);
    open.write(row);
  }
  if (open) files.push(open.publish());

  // 3. Publish the manifest, 4. then record and advance the watermark.
  writeManifestIfChanged(target, manifestOf(mirror, mirrorId, files, plan.last_seq));
  opts.failpoint?.('before-record', path.join(dir, MANIFEST));
  mirror.recordPublication(plan, files, isoNow(clock));
  const lines = files.reduce((n, f) => n + f.lines, 0);
  opts.logger?.info({ batch: plan.id, files: files.length, lines, watermark: plan.last_seq }, 'exports published');
  if (plan.resumed) {
    // The interrupted batch is out; now publish what was committed since it was planned.
    const rest = publishChanges(mirror, opts);
    return { files: [...files, ...rest.files], lines: lines + rest.lines, watermark: rest.watermark, resumed: true };
  }
  return { files, lines, watermark: plan.last_seq, resumed: false };
}

function partitionDir(stream: string, accountId: string, day: string): string {
  return `${stream}/account=${encodeURIComponent(accountId)}/date=${day}`;
}

function seqName(first: number, last: number): string {
  return `${String(first).padStart(12, '0')}-${String(last).padStart(12, '0')}.jsonl`;
}

/** Where a publication writes: the export root, its temp directory, and the test hook. */
interface Target {
  /** Absolute export directory. */
  root: string;
  /** Absolute `<root>/.convo-mirror-tmp`. */
  temp: string;
  /** Modes of the files and directories created. */
  modes: FileModes;
  failpoint: ExportOptions['failpoint'];
}

/**
 * Streams one file of one partition: each row's {@link exportLine} and a newline go to a temp file
 * in `.convo-mirror-tmp/` as they come (bounded memory), hashed on the way; `publish()` fsyncs it, renames it to its seq-range name in
 * the partition directory, then fsyncs that directory.
 */
class PartitionWriter {
  private readonly fd: number;
  private readonly tmp: string;
  private readonly dirAbs: string;
  private readonly hash = crypto.createHash('sha256');
  /** Where this file's partition is and its first seq. */
  private readonly head: Pick<ExportChange, 'stream' | 'account_id' | 'day' | 'seq'>;
  private buffered: string[] = [];
  private bufferedBytes = 0;
  private lastSeq = 0;
  private lines = 0;
  private bytes = 0;

  constructor(
    private readonly target: Target,
    first: ExportChange,
    private readonly batchId: number,
  ) {
    this.head = { stream: first.stream, account_id: first.account_id, day: first.day, seq: first.seq };
    const rel = partitionDir(first.stream, first.account_id, first.day);
    this.dirAbs = path.join(target.root, rel);
    this.tmp = path.join(target.temp, partitionTempName(first.stream, batchId, first.seq));
    try {
      mkdirPrivate(this.dirAbs, target.modes, { durable: true });
    } catch (err) {
      throw new ExportError(`cannot create the export directory ${this.dirAbs}: ${(err as Error).message}`, { dir: this.dirAbs }, err);
    }
    try {
      this.fd = createPrivateFile(this.tmp, target.modes);
    } catch (err) {
      throw new ExportError(`cannot create the temp file ${this.tmp}: ${(err as Error).message}`, { file: this.tmp }, err);
    }
  }

  accepts(row: ExportChange, maxLines: number): boolean {
    const h = this.head;
    return h.stream === row.stream && h.account_id === row.account_id && h.day === row.day && this.lines < maxLines;
  }

  /**
   * Appends the line of `row`.
   *
   * @throws {@link ExportError} from {@link exportLine} (a row with neither record nor line), or
   *   naming the temp file when it cannot be written; the temp file is then closed and removed
   */
  write(row: ExportChange): void {
    let text: string;
    try {
      text = `${exportLine(row)}\n`;
    } catch (err) {
      fs.closeSync(this.fd);
      fs.rmSync(this.tmp, { force: true });
      throw err;
    }
    this.buffered.push(text);
    this.bufferedBytes += text.length;
    this.lastSeq = row.seq;
    this.lines++;
    if (this.bufferedBytes >= 1 << 20) this.drain();
  }

  private drain(): void {
    if (this.buffered.length === 0) return;
    const buf = Buffer.from(this.buffered.join(''), 'utf8');
    this.buffered = [];
    this.bufferedBytes = 0;
    this.hash.update(buf);
    this.bytes += buf.length;
    try {
      writeAll(this.fd, buf);
    } catch (err) {
      fs.closeSync(this.fd);
      fs.rmSync(this.tmp, { force: true });
      throw new ExportError(`cannot write the temp file ${this.tmp}: ${(err as Error).message}`, { file: this.tmp }, err);
    }
  }

  publish(): ExportFile {
    this.drain();
    const rel = `${partitionDir(this.head.stream, this.head.account_id, this.head.day)}/${seqName(this.head.seq, this.lastSeq)}`;
    const final = path.join(this.target.root, rel);
    const sha256 = this.hash.digest('hex');
    let identical: boolean;
    try {
      identical = publishedIdentically(final, sha256);
    } catch (err) {
      fs.closeSync(this.fd);
      fs.rmSync(this.tmp, { force: true });
      throw err;
    }
    if (identical) {
      fs.closeSync(this.fd);
      fs.rmSync(this.tmp, { force: true });
    } else renameIntoPlace(this.target, this.fd, this.tmp, final);
    return {
      path: rel,
      stream: this.head.stream,
      account_id: this.head.account_id,
      date: this.head.day,
      first_seq: this.head.seq,
      last_seq: this.lastSeq,
      lines: this.lines,
      bytes: this.bytes,
      sha256,
      batch_id: this.batchId,
    };
  }
}

function writeAll(fd: number, buf: Buffer): void {
  let off = 0;
  while (off < buf.length) off += fs.writeSync(fd, buf, off, buf.length - off);
}

/**
 * Makes the temp file open on `fd` the file `final`: fsync, close, rename (both in the export
 * directory, so on one filesystem), fsync of `final`'s directory. On failure the temp file is
 * removed; a throw from the `before-rename` failpoint leaves it, as a crash would.
 *
 * @throws {@link ExportError} naming `final`
 */
function renameIntoPlace(target: Target, fd: number, tmp: string, final: string): void {
  try {
    fs.fsyncSync(fd);
  } catch (err) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
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

/**
 * True when `file` already holds exactly these bytes (a batch re-published after a crash); false
 * when it does not exist.
 *
 * @throws {@link ExportError} when it exists with other content, or is not a regular file: a
 *   published file never changes
 */
function publishedIdentically(file: string, sha256: string): boolean {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(file);
  } catch {
    return false;
  }
  if (st.isFile()) {
    const existing = fs.readFileSync(file);
    if (crypto.createHash('sha256').update(existing).digest('hex') === sha256) return true;
  }
  throw new ExportError(
    `refusing to replace the published export file ${file} with different content (was the mirror recreated? use a fresh CONVO_MIRROR_EXPORT_DIR)`,
    { file },
  );
}

/**
 * Refuses an export directory whose `manifest.json` convo-mirror would have to overwrite without
 * having written it: not a regular file, not JSON, not a convo-mirror manifest (`format`), a newer
 * manifest version, or the manifest of another mirror (the two change logs' seq numbers would
 * collide). A missing manifest is fine: it is (re)written from the mirror's records.
 *
 * @throws {@link ExportError} naming the manifest file (and, for another mirror, both ids)
 */
function assertOwnedBy(dir: string, mirrorId: string): void {
  const file = path.join(dir, MANIFEST);
  const refuse = (why: string) =>
    new ExportError(
      `${file} ${why}; convo-mirror never overwrites a file it did not write: move it away, or choose another CONVO_MIRROR_EXPORT_DIR`,
      { file },
    );
  let text: string;
  try {
    const st = fs.lstatSync(file);
    if (!st.isFile()) throw refuse(`is not a regular file (${kindOf(st)})`);
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if (err instanceof ExportError) throw err;
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return; // no manifest yet, or removed: rewritten
    throw new ExportError(`cannot read ${file}: ${(err as Error).message}`, { file }, err);
  }
  let manifest: unknown;
  try {
    manifest = JSON.parse(text);
  } catch {
    throw refuse('is not a convo-mirror manifest (not JSON)');
  }
  const m = (typeof manifest === 'object' && manifest !== null && !Array.isArray(manifest) ? manifest : {}) as Partial<Manifest>;
  if (m.format !== 'convo-mirror-exports') {
    throw refuse(`is not a convo-mirror manifest (format ${m.format === undefined ? 'absent' : JSON.stringify(m.format)}, expected "convo-mirror-exports")`);
  }
  if (m.version !== 1) throw refuse(`has manifest version ${JSON.stringify(m.version)}, which this convo-mirror does not know (it writes 1)`);
  if (m.mirror_id !== mirrorId) {
    throw new ExportError(
      `the export directory ${dir} holds the exports of another mirror (mirror id ${m.mirror_id ?? 'unknown'} in ${file}, this mirror is ${mirrorId}): ` +
        'point CONVO_MIRROR_EXPORT_DIR at a fresh directory, or CONVO_MIRROR_DB at the mirror that wrote it',
      { dir, file, mirror_id: mirrorId, manifest_mirror_id: m.mirror_id },
    );
  }
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
function prepareTempDir(root: string, modes: FileModes): string {
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
 * Writes `data` as `<root>/manifest.json` atomically: temp file in `.convo-mirror-tmp/`, fsync,
 * rename over the final name, fsync of the export directory.
 *
 * @throws {@link ExportError} naming the file
 */
function publishManifest(target: Target, data: Buffer): void {
  const final = path.join(target.root, MANIFEST);
  const tmp = path.join(target.temp, manifestTempName());
  let fd: number;
  try {
    fd = createPrivateFile(tmp, target.modes);
  } catch (err) {
    throw new ExportError(`cannot create the temp file ${tmp}: ${(err as Error).message}`, { file: tmp }, err);
  }
  try {
    writeAll(fd, data);
  } catch (err) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    throw new ExportError(`cannot publish export file ${final}: ${(err as Error).message}`, { file: final }, err);
  }
  renameIntoPlace(target, fd, tmp, final);
}

/** Publishes `manifest` unless `manifest.json` already holds exactly its bytes. */
function writeManifestIfChanged(target: Target, manifest: Manifest): void {
  const data = renderManifest(manifest);
  try {
    const current = fs.readFileSync(path.join(target.root, MANIFEST));
    if (current.equals(data)) return;
  } catch {
    /* missing: write it */
  }
  publishManifest(target, data);
}
