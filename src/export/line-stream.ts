/**
 * Reading a published data file line by line, streamed, trusting nothing: its bytes as stored in
 * 1 MiB chunks (never through a symlink), hashed; for `.jsonl.gz` decompressed as they come (at
 * most {@link MAX_GUNZIP_BYTES} out); its lines split at each LF, each held whole only up to a cap.
 * For the erasure step, which rewrites a file line by line (src/export/erasure.ts), and `verify`,
 * which checks a rewritten file line by line (src/export/verify-files.ts).
 */
import fs from 'node:fs';
import crypto from 'node:crypto';
import zlib from 'node:zlib';
import { pipeline } from 'node:stream/promises';

/**
 * Most bytes a `.jsonl.gz` may decompress to when its lines are read, 1 GiB (a gzip bomb is a
 * problem, not an hour of work).
 */
export const MAX_GUNZIP_BYTES = 1 << 30;

/**
 * Longest line held whole, bytes: 256 MiB. convo-mirror writes one message or conversation object
 * per line, within the API's response cap; a longer line is no line it wrote.
 */
export const MAX_LINE_BYTES = 256 << 20;

/** Bytes read from a data file at a time. */
const READ_CHUNK = 1 << 20;

/** A line too long to be held ({@link MAX_LINE_BYTES}). */
export class LineTooLong extends Error {
  constructor(readonly index: number) {
    super(`line ${index + 1} is longer than ${MAX_LINE_BYTES} bytes`);
  }
}

/**
 * Splits content (uncompressed) into lines, each passed whole to `onLine` (its bytes without the
 * LF, a copy the callee may keep; `terminated` false for bytes after the last LF). Memory: the
 * line being read.
 */
export class LineSplitter {
  private parts: Buffer[] = [];
  private size = 0;
  private index = 0;

  constructor(
    private readonly onLine: (line: Buffer, index: number, terminated: boolean) => void,
    private readonly cap = MAX_LINE_BYTES,
  ) {}

  /**
   * Appends content bytes; the chunk may be reused by the caller afterwards.
   *
   * @throws {@link LineTooLong} for a line longer than the cap; what `onLine` throws
   */
  update(chunk: Buffer): void {
    let from = 0;
    for (let lf = chunk.indexOf(10, from); lf !== -1; lf = chunk.indexOf(10, from)) {
      this.add(chunk.subarray(from, lf));
      this.flush(true);
      from = lf + 1;
    }
    if (from < chunk.length) this.add(chunk.subarray(from));
  }

  /** Ends the content: bytes after the last LF are a last line. @throws what `onLine` throws */
  end(): void {
    if (this.size > 0) this.flush(false);
  }

  /** Lines passed so far. */
  get lines(): number {
    return this.index;
  }

  private add(piece: Buffer): void {
    if (piece.length === 0) return;
    if (this.size + piece.length > this.cap) throw new LineTooLong(this.index);
    this.parts.push(Buffer.from(piece));
    this.size += piece.length;
  }

  private flush(terminated: boolean): void {
    const line = this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts, this.size);
    this.parts = [];
    this.size = 0;
    this.onLine(line, this.index++, terminated);
  }
}

/** What {@link readDataFile} found of the bytes as stored. */
export interface StoredDigest {
  /** Size as stored. */
  bytes: number;
  /** SHA-256 (hex) of the bytes as stored. */
  sha256: string;
  /** Why the content could not be read whole (a `.gz` not gzip, cut short, or too large); the size and SHA-256 are still of every byte. */
  unreadable?: string | undefined;
}

/**
 * Reads a data file (a regular file, never through a symlink): its stored bytes hashed, its content
 * (decompressed for `gzip`) passed to `onContent` chunk by chunk, in order. A failure to decompress
 * is reported (`unreadable`), the rest of the bytes still hashed; an error of `onContent` is
 * thrown as it is. A chunk is valid only during the call (a plain file's buffer is reused): copy
 * what you keep. Memory: a read chunk and what zlib buffers, whatever the file's size.
 *
 * @throws what `fs` throws (ENOENT, ELOOP for a symlink...); what `onContent` throws
 */
export async function readDataFile(abs: string, gzip: boolean, onContent: (chunk: Buffer) => void): Promise<StoredDigest> {
  const fd = fs.openSync(abs, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  try {
    if (!fs.fstatSync(fd).isFile()) throw Object.assign(new Error(`${abs} is not a regular file`), { code: 'EISDIR' });
    const hash = crypto.createHash('sha256');
    let bytes = 0;
    // A plain file's chunks are done with before the next read: one buffer. zlib may still hold a
    // chunk when the next is read: a buffer each.
    const reused = gzip ? undefined : Buffer.allocUnsafe(READ_CHUNK);
    const next = (): Buffer | undefined => {
      const buf = reused ?? Buffer.allocUnsafe(READ_CHUNK);
      const n = fs.readSync(fd, buf, 0, buf.length, null);
      if (n === 0) return undefined;
      const chunk = buf.subarray(0, n);
      hash.update(chunk);
      bytes += n;
      return chunk;
    };
    if (!gzip) {
      for (let chunk = next(); chunk !== undefined; chunk = next()) onContent(chunk);
      return { bytes, sha256: hash.digest('hex') };
    }
    let plain = 0;
    /** An error of `onContent`, thrown as it is (not as a decompression failure). */
    let own: { err: unknown } | undefined;
    let unreadable: string | undefined;
    try {
      await pipeline(
        function* stored() {
          for (let chunk = next(); chunk !== undefined; chunk = next()) yield chunk;
        },
        zlib.createGunzip(),
        async (decompressed: AsyncIterable<Buffer>) => {
          for await (const chunk of decompressed) {
            plain += chunk.length;
            if (plain > MAX_GUNZIP_BYTES) throw new Error(`it decompresses to more than ${MAX_GUNZIP_BYTES} bytes`);
            try {
              onContent(chunk);
            } catch (err) {
              own = { err };
              throw err;
            }
          }
        },
      );
    } catch (err) {
      if (own) throw own.err;
      unreadable = `cannot decompress it: ${(err as Error).message}`;
      while (next() !== undefined);
    }
    return { bytes, sha256: hash.digest('hex'), ...(unreadable !== undefined ? { unreadable } : {}) };
  } finally {
    fs.closeSync(fd);
  }
}
