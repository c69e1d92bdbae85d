/**
 * Exporter: change log → JSONL change files (design: src/export/).
 *
 * Exactly-once by construction:
 * 1. A batch is *planned* in SQLite first: its seq range `(watermark, max(seq)]` is fixed before any
 *    file is written, so a re-run after a crash re-publishes the very same lines.
 * 2. Each file is written to a temp name, fsynced, renamed into place, and its directory fsynced.
 *    File names derive from the seq range they hold, so re-publishing yields the same names and bytes.
 * 3. The manifest (every file, its line count, bytes and SHA-256) is published the same way.
 * 4. Only then, in one transaction, the files are recorded, the batch marked published and the
 *    exported watermark advanced.
 *
 * Layout: `<dir>/<stream>/account=<account_id>/date=<YYYY-MM-DD>/<first_seq>-<last_seq>.jsonl`,
 * stream `messages` or `conversations`, date from the line's `synced_at` (UTC).
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import type { Logger } from 'pino';
import type { Mirror } from '../store/mirror.js';
import { ExportError, type ConfigError } from '../errors.js';
import { isoNow, systemClock, type Clock } from '../clock.js';
import { MANIFEST, assertSafeExportDir } from './paths.js';

export { MANIFEST, TEMP_DIR, assertSafeExportDir } from './paths.js';

/** Options of {@link publishChanges}. */
export interface ExportOptions {
  /** Root directory of the exports; created if missing. */
  exportDir: string;
  /** Most lines in one file; a larger partition is split. @defaultValue 100000 */
  maxLinesPerFile?: number;
  /** Run to record on the batch. */
  runId?: number | null;
  clock?: Clock;
  logger?: Logger | undefined;
}

/** One published file, as recorded in `export_files` and the manifest. */
export interface ExportFile {
  /** Relative to the export directory, `/`-separated. */
  path: string;
  stream: string;
  account_id: string;
  date: string;
  first_seq: number;
  last_seq: number;
  lines: number;
  bytes: number;
  sha256: string;
  batch_id: number;
}

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

interface ChangeRow {
  seq: number;
  stream: string;
  account_id: string;
  day: string;
  line: string;
}

/**
 * Publishes every change-log row above the exported watermark. Idempotent: with nothing pending it
 * writes no data file (it only repairs a missing or stale manifest).
 *
 * @throws {@link ConfigError} (`CONVO_MIRROR_EXPORT_DIR`) when the export directory is unsafe for
 *   the mirror's database file (`mirror.db.name`), see {@link assertSafeExportDir}; nothing is written
 * @throws {@link ExportError} naming the file when a write, fsync or rename fails; the watermark is
 *   then unchanged and the next call re-publishes the same batch
 */
export function publishChanges(mirror: Mirror, opts: ExportOptions): ExportResult {
  assertSafeExportDir(opts.exportDir, mirror.db.name);
  const db = mirror.db;
  const clock = opts.clock ?? systemClock;
  const maxLines = opts.maxLinesPerFile ?? 100_000;
  const dir = path.resolve(opts.exportDir);
  try {
    mkdirDurable(path.dirname(dir), path.basename(dir));
  } catch (err) {
    throw new ExportError(`cannot create the export directory ${dir}: ${(err as Error).message}`, { dir }, err);
  }
  const mirrorId = mirror.mirrorId();
  assertOwnedBy(dir, mirrorId);
  removeTempFiles(dir);

  // 1. Plan (or find the planned, unpublished) batch.
  const plan = db.transaction(() => {
    const pending = db.prepare(`SELECT id, first_seq, last_seq FROM export_batches WHERE published_at IS NULL ORDER BY id LIMIT 1`).get() as
      | { id: number; first_seq: number; last_seq: number }
      | undefined;
    if (pending) return { ...pending, resumed: true };
    const wm = (db.prepare(`SELECT watermark FROM export_state WHERE id = 1`).get() as { watermark: number }).watermark;
    const max = (db.prepare(`SELECT coalesce(max(seq), 0) AS m FROM change_log`).get() as { m: number }).m;
    if (max <= wm) return undefined;
    const r = db
      .prepare(`INSERT INTO export_batches (first_seq, last_seq, planned_at, run_id) VALUES (?, ?, ?, ?)`)
      .run(wm + 1, max, isoNow(clock), opts.runId ?? null);
    return { id: Number(r.lastInsertRowid), first_seq: wm + 1, last_seq: max, resumed: false };
  }).immediate();

  if (!plan) {
    const watermark = (db.prepare(`SELECT watermark FROM export_state WHERE id = 1`).get() as { watermark: number }).watermark;
    writeManifestIfChanged(dir, manifestOf(mirror, mirrorId, [], watermark));
    return { files: [], lines: 0, watermark, resumed: false };
  }
  if (plan.resumed) opts.logger?.warn({ batch: plan.id, first_seq: plan.first_seq, last_seq: plan.last_seq }, 're-publishing an export batch interrupted earlier');

  // 2. Write the batch's files, one partition (stream, account, day) at a time, in seq order.
  const rows = db
    .prepare(
      `SELECT seq, stream, account_id, substr(synced_at, 1, 10) AS day, line FROM change_log
       WHERE seq BETWEEN ? AND ? ORDER BY stream, account_id, day, seq`,
    )
    .iterate(plan.first_seq, plan.last_seq) as IterableIterator<ChangeRow>;
  const files: ExportFile[] = [];
  let open: PartitionWriter | undefined;
  for (const row of rows) {
    if (open && !open.accepts(row, maxLines)) {
      files.push(open.publish());
      open = undefined;
    }
    open ??= new PartitionWriter(dir, row, plan.id);
    open.write(row);
  }
  if (open) files.push(open.publish());

  // 3. Publish the manifest, 4. then record and advance the watermark.
  writeManifestIfChanged(dir, manifestOf(mirror, mirrorId, files, plan.last_seq));
  const now = isoNow(clock);
  db.transaction(() => {
    const ins = db.prepare(`INSERT OR REPLACE INTO export_files (path, batch_id, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, published_at)
                            VALUES (@path, @batch_id, @stream, @account_id, @date, @first_seq, @last_seq, @lines, @bytes, @sha256, @now)`);
    for (const f of files) ins.run({ ...f, now });
    db.prepare(`UPDATE export_batches SET published_at = ? WHERE id = ?`).run(now, plan.id);
    db.prepare(`UPDATE export_state SET watermark = ? WHERE id = 1`).run(plan.last_seq);
  }).immediate();
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

/**
 * Streams one file of one partition: lines go to a temp file as they come (bounded memory), hashed
 * on the way; `publish()` fsyncs it and renames it to its seq-range name, then fsyncs the directory.
 */
class PartitionWriter {
  private readonly fd: number;
  private readonly tmp: string;
  private readonly dirAbs: string;
  private readonly hash = crypto.createHash('sha256');
  private readonly head: ChangeRow;
  private buffered: string[] = [];
  private bufferedBytes = 0;
  private lastSeq = 0;
  private lines = 0;
  private bytes = 0;

  constructor(
    private readonly root: string,
    first: ChangeRow,
    private readonly batchId: number,
  ) {
    this.head = { ...first, line: '' };
    this.dirAbs = path.join(root, partitionDir(first.stream, first.account_id, first.day));
    this.tmp = path.join(this.dirAbs, `.batch-${batchId}-${first.seq}.${process.pid}.tmp`);
    try {
      mkdirDurable(root, partitionDir(first.stream, first.account_id, first.day));
      this.fd = fs.openSync(this.tmp, 'w', 0o644);
    } catch (err) {
      throw new ExportError(`cannot write export file in ${this.dirAbs}: ${(err as Error).message}`, { dir: this.dirAbs }, err);
    }
  }

  accepts(row: ChangeRow, maxLines: number): boolean {
    const h = this.head;
    return h.stream === row.stream && h.account_id === row.account_id && h.day === row.day && this.lines < maxLines;
  }

  write(row: ChangeRow): void {
    // Each stored line is a JSON object without seq; the exported line puts seq first.
    const text = `{"seq":${row.seq},${row.line.slice(1)}\n`;
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
      let off = 0;
      while (off < buf.length) off += fs.writeSync(this.fd, buf, off, buf.length - off);
    } catch (err) {
      fs.closeSync(this.fd);
      fs.rmSync(this.tmp, { force: true });
      throw new ExportError(`cannot write export file ${this.tmp}: ${(err as Error).message}`, { file: this.tmp }, err);
    }
  }

  publish(): ExportFile {
    this.drain();
    const rel = `${partitionDir(this.head.stream, this.head.account_id, this.head.day)}/${seqName(this.head.seq, this.lastSeq)}`;
    const final = path.join(this.root, rel);
    const sha256 = this.hash.digest('hex');
    try {
      fs.fsyncSync(this.fd);
      fs.closeSync(this.fd);
      if (!publishedIdentically(final, sha256)) {
        fs.renameSync(this.tmp, final);
        fsyncDir(this.dirAbs);
      } else fs.rmSync(this.tmp, { force: true });
    } catch (err) {
      fs.rmSync(this.tmp, { force: true });
      if (err instanceof ExportError) throw err;
      throw new ExportError(`cannot publish export file ${final}: ${(err as Error).message}`, { file: final }, err);
    }
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

/**
 * True when `file` already holds exactly these bytes (a batch re-published after a crash); false
 * when it does not exist.
 *
 * @throws {@link ExportError} when it exists with other content: a published file never changes
 */
function publishedIdentically(file: string, sha256: string): boolean {
  let existing: Buffer;
  try {
    existing = fs.readFileSync(file);
  } catch {
    return false;
  }
  if (crypto.createHash('sha256').update(existing).digest('hex') === sha256) return true;
  throw new ExportError(
    `refusing to replace the published export file ${file} with different content (was the mirror recreated? use a fresh CONVO_MIRROR_EXPORT_DIR)`,
    { file },
  );
}

/**
 * Refuses an export directory whose manifest belongs to another mirror: the two change logs' seq
 * numbers would collide.
 *
 * @throws {@link ExportError} naming both ids and the directory
 */
function assertOwnedBy(dir: string, mirrorId: string): void {
  let manifest: Partial<Manifest>;
  try {
    manifest = JSON.parse(fs.readFileSync(path.join(dir, MANIFEST), 'utf8')) as Partial<Manifest>;
  } catch {
    return; // no manifest yet: a fresh directory
  }
  if (manifest.mirror_id !== mirrorId) {
    throw new ExportError(
      `the export directory ${dir} holds the exports of another mirror (mirror id ${manifest.mirror_id ?? 'unknown'}, this mirror is ${mirrorId}): ` +
        'point CONVO_MIRROR_EXPORT_DIR at a fresh directory, or CONVO_MIRROR_DB at the mirror that wrote it',
      { dir, mirror_id: mirrorId, manifest_mirror_id: manifest.mirror_id },
    );
  }
}

/**
 * Creates `rel` (a `/`-separated path) below `root`, fsyncing the parent of every directory it
 * creates, so a new partition directory survives a power cut as surely as the files in it.
 */
function mkdirDurable(root: string, rel: string): void {
  let current = root;
  if (!fs.existsSync(root)) {
    mkdirDurable(path.dirname(root), path.basename(root));
  }
  for (const part of rel.split('/').filter(Boolean)) {
    const next = path.join(current, part);
    if (!fs.existsSync(next)) {
      try {
        fs.mkdirSync(next);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      fsyncDir(current);
    }
    current = next;
  }
}

function fsyncDir(dir: string): void {
  const dfd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(dfd);
  } finally {
    fs.closeSync(dfd);
  }
}

/**
 * Writes `data` to `<root>/<rel>` atomically: temp file in the same directory, fsync, rename over
 * the final name, fsync the directory.
 *
 * @throws {@link ExportError} naming the file
 */
export function publishAtomically(root: string, rel: string, data: Buffer): void {
  const final = path.join(root, rel);
  const dir = path.dirname(final);
  const tmp = path.join(dir, `.${path.basename(final)}.${process.pid}.tmp`);
  try {
    fs.mkdirSync(dir, { recursive: true });
    const fd = fs.openSync(tmp, 'w', 0o644);
    try {
      let off = 0;
      while (off < data.length) off += fs.writeSync(fd, data, off, data.length - off);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, final);
    fsyncDir(dir);
  } catch (err) {
    try {
      fs.rmSync(tmp, { force: true });
    } catch {
      /* best effort */
    }
    throw new ExportError(`cannot publish export file ${final}: ${(err as Error).message}`, { file: final }, err);
  }
}

/** Every file below `root` (depth first), with its path relative to `root`, `/`-separated. */
function* walkFiles(root: string, rel = ''): Generator<{ abs: string; rel: string; name: string }> {
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(path.join(root, rel), { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) yield* walkFiles(root, r);
    else yield { abs: path.join(root, r), rel: r, name: e.name };
  }
}

const isTempFile = (name: string) => name.startsWith('.') && name.endsWith('.tmp');

/** Removes temp files an interrupted publication left behind (never a published file). */
function removeTempFiles(root: string): void {
  for (const f of walkFiles(root)) if (isTempFile(f.name)) fs.rmSync(f.abs, { force: true });
}

/** The manifest document. */
export interface Manifest {
  format: 'convo-mirror-exports';
  version: 1;
  /** Id of the mirror whose change log these files hold (`mirror_meta.mirror_id`). */
  mirror_id: string;
  /** Last change_log.seq contained in the listed files. */
  watermark: number;
  /** Every published file, in seq order of first line. */
  files: ExportFile[];
}

function manifestOf(mirror: Mirror, mirrorId: string, extra: ExportFile[], watermark: number): Manifest {
  const known = mirror.db
    .prepare(`SELECT path, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, batch_id FROM export_files`)
    .all() as ExportFile[];
  const byPath = new Map<string, ExportFile>();
  for (const f of known) byPath.set(f.path, f);
  for (const f of extra) byPath.set(f.path, f);
  const files = [...byPath.values()].sort((a, b) => a.first_seq - b.first_seq || a.path.localeCompare(b.path));
  return { format: 'convo-mirror-exports', version: 1, mirror_id: mirrorId, watermark, files };
}

function writeManifestIfChanged(root: string, manifest: Manifest): void {
  const data = Buffer.from(JSON.stringify(manifest, null, 2) + '\n', 'utf8');
  try {
    const current = fs.readFileSync(path.join(root, MANIFEST));
    if (current.equals(data)) return;
  } catch {
    /* missing: write it */
  }
  publishAtomically(root, MANIFEST, data);
}

/** A problem found by {@link verifyExports}. */
export interface VerifyProblem {
  path: string;
  problem: 'missing' | 'size' | 'sha256' | 'lines' | 'unlisted' | 'temp';
  detail?: string;
}

/**
 * Checks the export directory against the mirror's record: every recorded file exists with its
 * size, line count and SHA-256; no `.jsonl` file is unlisted; no temp file lingers.
 *
 * @returns the problems found (empty when the exports are intact)
 */
export function verifyExports(mirror: Mirror, exportDir: string): VerifyProblem[] {
  const root = path.resolve(exportDir);
  const problems: VerifyProblem[] = [];
  const recorded = mirror.db.prepare(`SELECT path, lines, bytes, sha256 FROM export_files`).all() as ExportFile[];
  const listed = new Set(recorded.map((f) => f.path));
  for (const f of recorded) {
    let buf: Buffer;
    try {
      buf = fs.readFileSync(path.join(root, f.path));
    } catch {
      problems.push({ path: f.path, problem: 'missing' });
      continue;
    }
    if (buf.length !== f.bytes) problems.push({ path: f.path, problem: 'size', detail: `${buf.length} bytes, expected ${f.bytes}` });
    const sha = crypto.createHash('sha256').update(buf).digest('hex');
    if (sha !== f.sha256) problems.push({ path: f.path, problem: 'sha256' });
    let n = 0;
    for (let i = buf.indexOf(10); i !== -1; i = buf.indexOf(10, i + 1)) n++;
    if (n !== f.lines) problems.push({ path: f.path, problem: 'lines', detail: `${n} lines, expected ${f.lines}` });
  }
  for (const f of walkFiles(root)) {
    if (isTempFile(f.name)) problems.push({ path: f.rel, problem: 'temp' });
    else if (f.name.endsWith('.jsonl') && !listed.has(f.rel)) problems.push({ path: f.rel, problem: 'unlisted' });
  }
  return problems;
}
