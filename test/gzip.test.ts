/**
 * Gzipped exports (`CONVO_MIRROR_EXPORT_GZIP`): the encoder's bytes (one standard member, no time
 * or name in its header, the same bytes for the same lines), exports read back with zlib, the
 * system's gzip and DuckDB, verification (deep included), and a crash mid-publication re-publishing
 * byte-identical files. Real files, real SQLite, the real fake over HTTP.
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { publishChanges } from '../src/export/exporter.js';
import { GzipEncoder, gzipBytes } from '../src/export/gzip.js';
import { verifyArchive } from '../src/export/verify.js';
import { syncWorkspace } from '../src/sync/workspace.js';
import { ACCOUNT_ID, harnessPool, ledgerFiles, snapshotFiles, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import { sqlAll } from './sql.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());
const start = (opts: HarnessOptions): Promise<Harness> => pool.start(opts);

const hasGzip = (() => {
  try {
    execFileSync('gzip', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

/** Lines like export lines, `n` of them, with non-ASCII content. */
function sampleLines(n: number): Buffer {
  const out: string[] = [];
  for (let i = 1; i <= n; i++) out.push(JSON.stringify({ seq: i, op: 'insert', content: `héllo\u2028 ${'x'.repeat(i % 97)} 🙂`, n: i }));
  return Buffer.from(out.join('\n') + '\n', 'utf8');
}

describe('GzipEncoder', () => {
  it('writes one member with a fixed header (no name, MTIME 0, OS unknown) that zlib reads back, for empty, small and multi-chunk input', () => {
    for (const data of [Buffer.alloc(0), sampleLines(1), sampleLines(40_000)]) {
      const gz = gzipBytes(data, 1 << 20);
      expect([...gz.subarray(0, 10)]).toEqual([0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0xff]);
      expect(zlib.gunzipSync(gz).equals(data)).toBe(true);
      expect(gz.readUInt32LE(gz.length - 4)).toBe(data.length);
      expect(gz.readUInt32LE(gz.length - 8)).toBe(zlib.crc32(data));
    }
    expect(sampleLines(40_000).length).toBeGreaterThan(2 << 20); // several chunks above
  });

  it('gives the same bytes for the same lines and chunking, and any chunking decompresses to the same lines', () => {
    const data = sampleLines(20_000);
    expect(gzipBytes(data).equals(gzipBytes(Buffer.from(data)))).toBe(true);
    for (const size of [4096, 65_536, 1 << 20, data.length]) expect(zlib.gunzipSync(gzipBytes(data, size)).equals(data), `chunks of ${size}`).toBe(true);
    const small = sampleLines(3);
    expect(zlib.gunzipSync(gzipBytes(small, 1)).equals(small), 'chunks of 1 byte').toBe(true);
  });

  it('refuses to be used after finish', () => {
    const enc = new GzipEncoder();
    enc.finish();
    expect(() => enc.push(Buffer.from('x'))).toThrow(/after finish/);
    expect(() => enc.finish()).toThrow(/twice/);
  });

  it.skipIf(!hasGzip)('passes `gzip -t` and `gzip -dc` (skipped where the gzip program is absent)', () => {
    const dir = tempDir();
    const file = path.join(dir, 'x.jsonl.gz');
    const data = sampleLines(30_000);
    fs.writeFileSync(file, gzipBytes(data));
    execFileSync('gzip', ['-t', file]);
    expect(execFileSync('gzip', ['-dc', file], { maxBuffer: 1 << 26 }).equals(data)).toBe(true);
    fs.rmSync(dir, { recursive: true, force: true });
  });
});

describe('gzipped exports', () => {
  async function gzipped(): Promise<Harness> {
    const ws = FakeWorkspace.fromCounts([30, 260, 4]);
    const h = await start({ workspace: ws });
    await h.sync({ gzip: true });
    const c = ws.list()[1]!;
    ws.editMessage(c.id, c.messages[3]!.id, 'edited');
    ws.appendMessages(c.id, 5);
    await h.sync({ gzip: true });
    return h;
  }

  it('are .jsonl.gz files whose lines zlib reads back, recorded by their stored bytes, and verify (deep too)', async () => {
    const h = await gzipped();
    const files = ledgerFiles(h.exportDir);
    expect(files.length).toBeGreaterThan(4);
    for (const f of files) {
      expect(f.path.endsWith('.jsonl.gz'), f.path).toBe(true);
      const stored = fs.readFileSync(path.join(h.exportDir, f.path));
      expect(stored.length).toBe(f.bytes);
      expect(crypto.createHash('sha256').update(stored).digest('hex')).toBe(f.sha256);
      const lines = zlib.gunzipSync(stored).toString('utf8').split('\n');
      expect(lines.pop()).toBe('');
      expect(lines.length).toBe(f.lines);
      const seqs = lines.map((l) => (JSON.parse(l) as { seq: number }).seq);
      expect(seqs[0]).toBe(f.first_seq);
      expect(seqs.at(-1)).toBe(f.last_seq);
      expect(seqs.every((q, i) => i === 0 || q > seqs[i - 1]!)).toBe(true);
    }
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('DuckDB reads them with read_json: every message line, and the replay gives the live messages', async () => {
    const h = await gzipped();
    const glob = path.join(h.exportDir, 'messages', '*', '*', '*.jsonl.gz');
    const db = await DuckDBInstance.create(':memory:');
    const con = await db.connect();
    try {
      const all = await con.runAndReadAll(`SELECT count(*)::INTEGER AS n, max(seq)::INTEGER AS m FROM read_json('${glob}', format = 'newline_delimited')`);
      const lines = ledgerFiles(h.exportDir).filter((f) => f.stream === 'messages').reduce((n, f) => n + f.lines, 0);
      expect(all.getRowObjects()).toEqual([{ n: lines, m: Math.max(...ledgerFiles(h.exportDir).filter((f) => f.stream === 'messages').map((f) => f.last_seq)) }]);
      const live = await con.runAndReadAll(
        `SELECT account_id, conversation_id, id, content FROM (
           SELECT *, row_number() OVER (PARTITION BY account_id, conversation_id, id ORDER BY seq DESC) AS rn
           FROM read_json('${glob}', format = 'newline_delimited')) WHERE rn = 1 AND op <> 'delete' ORDER BY account_id, conversation_id, id`,
      );
      const mirrored = sqlAll<{ account_id: string; conversation_id: string; id: string; content: string }>(
        h.mirror,
        `SELECT account_id, conversation_id, id, content FROM messages WHERE deleted_at IS NULL ORDER BY account_id, conversation_id, id`,
      );
      const key = (r: Record<string, unknown>) => `${String(r.account_id)}/${String(r.conversation_id)}/${String(r.id)}`;
      const byKey = (rows: Record<string, unknown>[]) => new Map(rows.map((r) => [key(r), r.content]));
      expect(byKey(live.getRowObjects())).toEqual(byKey(mirrored as unknown as Record<string, unknown>[]));
      expect(mirrored.length).toBeGreaterThan(250);
    } finally {
      con.closeSync();
      db.closeSync();
    }
  });

  it('lines longer than the write buffer and multibyte text cross the 1 MiB segments whole; the .gz holds one deflate segment per 1 MiB of characters, as before', async () => {
    const ws = FakeWorkspace.fromCounts([8]);
    const c = ws.list()[0]!;
    // 2-byte characters: each of these lines is 1.4 MB of UTF-8, more than the 1 MiB + 64 KiB buffer.
    for (const i of [1, 2, 5]) ws.editMessage(c.id, c.messages[i]!.id, `é${'é'.repeat(699_999)}`);
    ws.editMessage(c.id, c.messages[3]!.id, `mixed ✓ 𝄞 ${'ü'.repeat(300_000)}`);
    const plain = await start({ workspace: ws });
    await plain.sync();
    const gz = await start({ workspace: ws });
    await gz.sync({ gzip: true });
    const plainFile = ledgerFiles(plain.exportDir).find((f) => f.stream === 'messages')!;
    const gzFile = ledgerFiles(gz.exportDir).find((f) => f.stream === 'messages')!;
    const stored = fs.readFileSync(path.join(gz.exportDir, gzFile.path));
    // Whole lines: each file's lines carry every message's content exactly as served.
    const served = c.messages.map((m) => m.content);
    const contents = (buf: Buffer): { lines: string[]; contents: string[] } => {
      const lines = buf.toString('utf8').split('\n');
      expect(lines.pop()).toBe('');
      return { lines, contents: lines.map((l) => (JSON.parse(l) as { content: string }).content) };
    };
    expect(contents(fs.readFileSync(path.join(plain.exportDir, plainFile.path))).contents).toEqual(served);
    const { lines, contents: gzContents } = contents(zlib.gunzipSync(stored));
    expect(gzContents).toEqual(served);
    expect(served.filter((t) => t.length >= 700_000)).toHaveLength(3);
    // The segments: a new deflate segment after the line that brings the characters to 1 MiB.
    const enc = new GzipEncoder();
    const parts = [enc.header()];
    let segment: string[] = [];
    let chars = 0;
    for (const l of lines) {
      segment.push(`${l}\n`);
      chars += l.length + 1;
      if (chars >= 1 << 20) {
        parts.push(enc.push(Buffer.from(segment.join(''), 'utf8')));
        segment = [];
        chars = 0;
      }
    }
    parts.push(enc.push(Buffer.from(segment.join(''), 'utf8')), enc.finish());
    expect(stored.equals(Buffer.concat(parts))).toBe(true);
  });

  it('a crash between the data files and the record re-publishes byte-identical .gz files and one record', async () => {
    const ws = FakeWorkspace.fromCounts([12, 150]);
    const h = await start({ workspace: ws });
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    class Crash extends Error {}
    await expect(publishChanges(h.mirror, {
        exportDir: h.exportDir,
        gzip: true,
        failpoint: (p) => {
          if (p === 'before-ledger') throw new Crash();
        },
      })).rejects.toThrow(Crash);
    const before = new Map([...snapshotFiles(h.exportDir)].filter(([p]) => p.endsWith('.jsonl.gz')));
    expect(before.size).toBe(2);
    expect(fs.existsSync(path.join(h.exportDir, '_ledger'))).toBe(false);
    // A retry without gzip keeps the batch's planned form: the same names, the same bytes.
    const res = await publishChanges(h.mirror, { exportDir: h.exportDir });
    expect(res.resumed).toBe(true);
    for (const [p, bytes] of before) expect(fs.readFileSync(path.join(h.exportDir, p)).equals(bytes), p).toBe(true);
    expect(fs.readdirSync(path.join(h.exportDir, '_ledger'))).toEqual(['000000000001.json']);
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('a .gz left by another zlib build (other bytes, the same lines) is kept on re-publication and recorded as it is', async () => {
    const ws = FakeWorkspace.fromCounts([3, 20]);
    const h = await start({ workspace: ws });
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    class Crash extends Error {}
    await expect(publishChanges(h.mirror, { exportDir: h.exportDir, gzip: true, failpoint: (p) => { if (p === 'before-ledger') throw new Crash(); } })).rejects.toThrow(Crash);
    const rel = [...snapshotFiles(h.exportDir).keys()].find((p) => p.startsWith('messages/'))!;
    const abs = path.join(h.exportDir, rel);
    const other = zlib.gzipSync(zlib.gunzipSync(fs.readFileSync(abs)), { level: 9 });
    fs.chmodSync(abs, 0o600);
    fs.writeFileSync(abs, other);
    await publishChanges(h.mirror, { exportDir: h.exportDir, gzip: true });
    expect(fs.readFileSync(abs).equals(other)).toBe(true);
    const recorded = ledgerFiles(h.exportDir).find((f) => f.path === rel)!;
    expect(recorded.sha256).toBe(crypto.createHash('sha256').update(other).digest('hex'));
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });
});
