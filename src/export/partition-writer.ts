/**
 * One data file of one partition (stream, account, UTC day), streamed: each row's export line and a
 * newline go to a temp file as they come (bounded memory: about 1 MiB buffered), optionally
 * gzipped ({@link GzipEncoder}: deterministic bytes), hashed as stored, and its lines (as written,
 * before compression) hashed into their Merkle tree ({@link LineTreeHasher}); `publish()` puts it
 * in place.
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { ExportError } from '../errors.js';
import type { ExportChange, PublishedFile } from '../store/mirror.js';
import { exportLine } from './lines.js';
import { GzipEncoder } from './gzip.js';
import { LineTreeHasher } from './merkle.js';
import { partitionTempName } from './paths.js';
import { createTemp, discardTemp, existingDataFile, makeDir, renameIntoPlace, writeAll, type Target } from './publish-fs.js';

/**
 * Characters of lines buffered before a write (and, gzipped, one deflate segment: the boundaries
 * decide the compressed bytes, so this stays as it was).
 */
const CHUNK_CHARS = 1 << 20;

/** A data file as one publication wrote it: its row in `export_files`, and the root its batch record commits to. */
export interface WrittenFile extends PublishedFile {
  /**
   * The Merkle tree hash (RFC 6962 §2.1, lowercase hex) of the file's lines, each without its LF,
   * uncompressed (src/export/merkle.ts); only in the batch record, not in `export_files`.
   */
  merkle_root: string;
}

/** `<stream>/account=<id>/date=<day>`: the partition directory of a file, relative to the export directory. */
export function partitionDir(stream: string, accountId: string, day: string): string {
  return `${stream}/account=${encodeURIComponent(accountId)}/date=${day}`;
}

/** A data file's name from the seq range it holds. */
export function seqName(first: number, last: number, gzip: boolean): string {
  return `${String(first).padStart(12, '0')}-${String(last).padStart(12, '0')}.jsonl${gzip ? '.gz' : ''}`;
}

/** Streams one data file of one partition; see the module comment. */
export class PartitionWriter {
  private readonly fd: number;
  private readonly tmp: string;
  private readonly hash = crypto.createHash('sha256');
  /** SHA-256 of the uncompressed lines (gzip only: recognises an equivalent file from another zlib build). */
  private readonly linesHash: crypto.Hash | undefined;
  /** The Merkle tree of the lines written, fed the same uncompressed chunks as the file. */
  private readonly tree = new LineTreeHasher();
  private readonly gzip: GzipEncoder | undefined;
  /** Where this file's partition is and its first seq. */
  private readonly head: Pick<ExportChange, 'stream' | 'account_id' | 'day' | 'seq'>;
  /**
   * The lines buffered, as UTF-8, in one reused buffer (64 KiB at first, doubled as a chunk needs
   * it, so a one-line file holds little): a line's string dies as soon as it is
   * copied here. (An array of strings kept every line of a chunk alive across young-generation
   * collections, so they were promoted and a publication of 80,000 lines grew the heap by 30 MB.)
   */
  private chunk = Buffer.allocUnsafe(64 << 10);
  private chunkBytes = 0;
  private bufferedChars = 0;
  private lastSeq = 0;
  private lines = 0;
  private bytes = 0;

  /**
   * @throws {@link ExportError} naming the partition directory or the temp file when it cannot be created
   */
  constructor(
    private readonly target: Target,
    first: ExportChange,
    private readonly batchId: number,
    gzip: boolean,
  ) {
    this.head = { stream: first.stream, account_id: first.account_id, day: first.day, seq: first.seq };
    makeDir(target, path.join(target.root, partitionDir(first.stream, first.account_id, first.day)));
    ({ fd: this.fd, tmp: this.tmp } = createTemp(target, partitionTempName(first.stream, batchId, first.seq)));
    if (gzip) {
      this.gzip = new GzipEncoder();
      this.linesHash = crypto.createHash('sha256');
      this.store(this.gzip.header());
    }
  }

  /** Whether `row` belongs in this file: same partition, and fewer than `maxLines` lines so far. */
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
      discardTemp(this.fd, this.tmp);
      throw err;
    }
    const need = Buffer.byteLength(text, 'utf8');
    if (this.chunkBytes + need > this.chunk.length) {
      const bigger = Buffer.allocUnsafe(Math.max(2 * this.chunk.length, this.chunkBytes + need));
      this.chunk.copy(bigger, 0, 0, this.chunkBytes);
      this.chunk = bigger;
    }
    this.chunkBytes += this.chunk.write(text, this.chunkBytes, 'utf8');
    this.bufferedChars += text.length;
    this.lastSeq = row.seq;
    this.lines++;
    if (this.bufferedChars >= CHUNK_CHARS) this.drain(false);
  }

  /**
   * Writes what is buffered (compressed when gzipped; `last` ends the gzip stream). Everything that
   * reads the chunk (hashes, deflate, the write) is done with it before it is reused.
   */
  private drain(last: boolean): void {
    const buf = this.chunk.subarray(0, this.chunkBytes);
    this.chunkBytes = 0;
    this.bufferedChars = 0;
    this.tree.update(buf);
    if (!this.gzip) {
      if (buf.length > 0) this.store(buf);
      return;
    }
    this.linesHash!.update(buf);
    this.store(last ? Buffer.concat([this.gzip.push(buf), this.gzip.finish()]) : this.gzip.push(buf));
  }

  /** Hashes and writes bytes as stored. */
  private store(buf: Buffer): void {
    this.hash.update(buf);
    this.bytes += buf.length;
    try {
      writeAll(this.fd, buf);
    } catch (err) {
      discardTemp(this.fd, this.tmp);
      throw new ExportError(`cannot write the temp file ${this.tmp}: ${(err as Error).message}`, { file: this.tmp }, err);
    }
  }

  /**
   * Puts the file in place under its seq-range name, unless that name already holds the same
   * lines (a batch re-published after a crash), and returns its record, with the root of its lines
   * (the same for an equivalent `.jsonl.gz` kept in place: same lines).
   *
   * @throws {@link ExportError} naming the file when it cannot be published, or when its name holds
   *   other content
   */
  publish(): WrittenFile {
    this.drain(true);
    const rel = `${partitionDir(this.head.stream, this.head.account_id, this.head.day)}/${seqName(this.head.seq, this.lastSeq, this.gzip !== undefined)}`;
    const final = path.join(this.target.root, rel);
    let sha256 = this.hash.digest('hex');
    let bytes = this.bytes;
    let existing;
    try {
      existing = existingDataFile(final, sha256, this.linesHash?.digest('hex'));
    } catch (err) {
      discardTemp(this.fd, this.tmp);
      throw err;
    }
    if (existing.kind === 'absent') renameIntoPlace(this.target, this.fd, this.tmp, final);
    else discardTemp(this.fd, this.tmp);
    if (existing.kind === 'equivalent') ({ sha256, bytes } = existing);
    const { stream, account_id, day, seq } = this.head;
    const merkle_root = this.tree.rootHex();
    return { path: rel, stream, account_id, date: day, first_seq: seq, last_seq: this.lastSeq, lines: this.lines, bytes, sha256, batch_id: this.batchId, merkle_root };
  }
}
