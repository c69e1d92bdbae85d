/**
 * Deterministic, streaming, synchronous gzip for export files (`CONVO_MIRROR_EXPORT_GZIP`): one
 * standard gzip member (RFC 1952) written chunk by chunk in bounded memory, whose bytes depend only
 * on the data and its chunking, so a batch re-published after a crash is byte-identical.
 *
 * - Header: `1f 8b 08 00 00000000 00 ff`: no name, no comment, MTIME 0, XFL 0, OS 255 (unknown), so
 *   neither a time nor the platform leaks in.
 * - Body: one raw deflate stream at level {@link GZIP_LEVEL}, made one chunk at a time: every chunk
 *   but the last is compressed on its own and ends with a sync flush (an empty stored block that
 *   byte-aligns it and does not end the stream); the last ends the stream. Concatenated, they are
 *   one valid deflate stream. Each chunk starts with an empty history (a chunk of about 1 MiB costs
 *   well under 1 % of ratio against one long stream).
 * - Trailer: CRC-32 and size (mod 2^32) of the uncompressed data, little-endian.
 *
 * The same data in the same chunks gives the same bytes with the same zlib build (Node bundles its
 * own); the exporter chunks by line content only. A different zlib build may compress differently:
 * the exporter then recognises an existing file by its decompressed lines.
 */
import zlib from 'node:zlib';

/** The compression level of export files (zlib's default trade-off). */
export const GZIP_LEVEL = 6;

const HEADER = Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff]);

/** Encodes one gzip member, chunk by chunk; see the module comment. */
export class GzipEncoder {
  private crc = 0;
  private size = 0;
  private finished = false;

  /** The 10 header bytes (write them first). */
  header(): Buffer {
    return Buffer.from(HEADER);
  }

  /** The compressed bytes of `chunk`, not ending the stream (empty for an empty chunk). */
  push(chunk: Buffer): Buffer {
    if (this.finished) throw new Error('GzipEncoder: push after finish');
    if (chunk.length === 0) return Buffer.alloc(0);
    this.account(chunk);
    return zlib.deflateRawSync(chunk, { level: GZIP_LEVEL, finishFlush: zlib.constants.Z_SYNC_FLUSH });
  }

  /** Ends the stream: a final (empty) deflate block and the trailer. Call once, after the last push. */
  finish(): Buffer {
    if (this.finished) throw new Error('GzipEncoder: finish called twice');
    this.finished = true;
    const end = zlib.deflateRawSync(Buffer.alloc(0), { level: GZIP_LEVEL });
    const trailer = Buffer.alloc(8);
    trailer.writeUInt32LE(this.crc >>> 0, 0);
    trailer.writeUInt32LE(this.size >>> 0, 4);
    return Buffer.concat([end, trailer]);
  }

  /** Uncompressed bytes pushed so far. */
  get uncompressedBytes(): number {
    return this.size;
  }

  private account(chunk: Buffer): void {
    this.crc = zlib.crc32(chunk, this.crc);
    this.size = (this.size + chunk.length) % 2 ** 32;
  }
}

/** `data` gzipped by {@link GzipEncoder} in chunks of `chunkSize` bytes (default 1 MiB). */
export function gzipBytes(data: Buffer, chunkSize = 1 << 20): Buffer {
  const enc = new GzipEncoder();
  const parts = [enc.header()];
  for (let off = 0; off < data.length; off += chunkSize) parts.push(enc.push(data.subarray(off, off + chunkSize)));
  parts.push(enc.finish());
  return Buffer.concat(parts);
}
