/**
 * Line-level commitments in the ledger: batch records of version 2 carry, per file, the Merkle tree
 * hash of its lines (src/export/merkle.ts) beside its SHA-256; version 1 records, written before,
 * keep what they have and verify as before. The record formats (version 1 byte for byte as it was
 * written before version 2 existed), an archive begun by an older convo-mirror and continued by
 * this one, gzipped files (roots over the decompressed lines, verified as a stream), on each engine
 * of the store (test/engines.ts). Real files, the real fake over HTTP; roots are recomputed here
 * apart from src/export/merkle.ts ({@link linesMerkleRoot}).
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { pipeline } from 'node:stream/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { publishChanges } from '../src/export/exporter.js';
import { asVersion1, parseRecord, recordPath, renderRecord, sealRecord, type LedgerRecord, type RecordBody } from '../src/export/ledger.js';
import { LineTreeHasher } from '../src/export/merkle.js';
import { MAX_GUNZIP_BYTES } from '../src/export/verify-files.js';
import { verifyArchive, type VerifyProblem } from '../src/export/verify.js';
import { docBlocks } from './doc-blocks.js';
import { engines } from './engines.js';
import { harnessPool, ledgerFiles, linesMerkleRoot, syncThenCrashPublication, tempDir, type Harness, type HarnessOptions } from './helpers.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const sha256 = (b: Buffer | string) => crypto.createHash('sha256').update(b).digest('hex');

/** A version 1 body: the shape of every record before line commitments. */
const V1_BODY: RecordBody = {
  format: 'convo-mirror-ledger',
  version: 1,
  kind: 'batch',
  mirror_id: '0123456789abcdef0123456789abcdef',
  batch_id: 7,
  run_id: 3,
  planned_at: '2026-11-25T10:00:00.000Z',
  first_seq: 101,
  last_seq: 250,
  files: [
    { path: 'messages/account=acme/date=2026-11-25/000000000101-000000000250.jsonl', stream: 'messages', account_id: 'acme', date: '2026-11-25', first_seq: 101, last_seq: 250, lines: 150, bytes: 45678, sha256: 'ab'.repeat(32) },
  ],
  prev: { batch_id: 6, hash: 'cd'.repeat(32) },
};

const V2_BODY: RecordBody = { ...V1_BODY, version: 2, files: V1_BODY.files.map((f) => ({ ...f, merkle_root: 'ef'.repeat(32) })) };

/** `json` (a record's fields) as a record file's bytes, for what parseRecord refuses before any hash is checked. */
const bytesOf = (json: unknown) => Buffer.from(JSON.stringify(json, null, 2) + '\n');

describe('the record formats', () => {
  it('version 1 is byte for byte what convo-mirror wrote before version 2 existed (hash and file pinned with src/export/ledger.ts of main at 67d3bea)', () => {
    const r = sealRecord(V1_BODY);
    expect(r.hash).toBe('95ba13f51d881d95739567ccd22f366ec60d2517f7a3d133c90247be58c11f9a');
    expect(sha256(renderRecord(r))).toBe('fddd20013ba426b1f91c3acb21879297f09ec1a226d56c66900d77a112267498');
    const back = parseRecord(renderRecord(r));
    expect(back).toEqual({ ok: true, record: r, formatting: false });
    // the version 1 form of the same batch with roots is that very record
    expect(sealRecord(asVersion1(V2_BODY)).hash).toBe(r.hash);
  });

  it('version 2: merkle_root follows sha256 in each file, is in the hashed body, and reads back', () => {
    const r = sealRecord(V2_BODY);
    const body = JSON.parse(renderRecord(r).toString('utf8')) as { files: Record<string, unknown>[] };
    expect(Object.keys(body.files[0]!)).toEqual(['path', 'stream', 'account_id', 'date', 'first_seq', 'last_seq', 'lines', 'bytes', 'sha256', 'merkle_root']);
    expect(parseRecord(renderRecord(r))).toEqual({ ok: true, record: r, formatting: false });
    expect(r.hash).not.toBe(sealRecord(V1_BODY).hash);
    // another root is another record
    expect(sealRecord({ ...V2_BODY, files: V2_BODY.files.map((f) => ({ ...f, merkle_root: '0'.repeat(64) })) }).hash).not.toBe(r.hash);
    // the root is covered by the hash: edited without re-hashing, the record no longer reads back
    const edited = renderRecord(r).toString('utf8').replace('ef'.repeat(32), 'ee'.repeat(32));
    expect(parseRecord(Buffer.from(edited))).toEqual({ ok: false, why: expect.stringMatching(/^hash [0-9a-f]{64} does not match its content/) });
  });

  it('a root must go with its version: refused on reading, and never sealed', () => {
    const v2 = { ...sealRecord(V2_BODY) } as unknown as Record<string, unknown>;
    const v1 = { ...sealRecord(V1_BODY) } as unknown as Record<string, unknown>;
    const files = (r: Record<string, unknown>) => r.files as Record<string, unknown>[];
    expect(parseRecord(bytesOf({ ...v2, files: files(v2).map(({ merkle_root: _r, ...f }) => f) }))).toEqual({ ok: false, why: 'files.0.merkle_root: Invalid input: expected string, received undefined' });
    expect(parseRecord(bytesOf({ ...v1, files: files(v1).map((f) => ({ ...f, merkle_root: 'ef'.repeat(32) })) }))).toEqual({ ok: false, why: 'files.0: Unrecognized key: "merkle_root"' });
    expect(parseRecord(bytesOf({ ...v2, files: files(v2).map((f) => ({ ...f, merkle_root: 'EF'.repeat(32) })) }))).toEqual({ ok: false, why: 'files.0.merkle_root: a Merkle tree hash in lowercase hex (64 digits)' });
    expect(parseRecord(bytesOf({ ...v2, version: 3 }))).toEqual({ ok: false, why: 'version 3, which this convo-mirror does not know (it writes 2)' });
    expect(parseRecord(bytesOf({ ...v2, version: 'constructor' }))).toEqual({ ok: false, why: 'version "constructor", which this convo-mirror does not know (it writes 2)' });
    const { version: _v, ...unversioned } = v2;
    expect(parseRecord(bytesOf(unversioned))).toEqual({ ok: false, why: 'version absent, which this convo-mirror does not know (it writes 2)' });
    expect(() => sealRecord({ ...V2_BODY, files: V1_BODY.files })).toThrow(/batch record 7 of version 2: messages\/.* has no merkle_root/);
    expect(() => sealRecord({ ...V1_BODY, files: V2_BODY.files })).toThrow(/batch record 7 of version 1: messages\/.* has a merkle_root/);
  });
});

/** Writes over a published (read-only) file. */
function overwrite(file: string, data: Buffer | string): void {
  fs.chmodSync(file, 0o600);
  fs.writeFileSync(file, data);
}

const readRecord = (h: Harness, id: number): LedgerRecord => {
  const parsed = parseRecord(fs.readFileSync(path.join(h.exportDir, recordPath(id))));
  if (!parsed.ok) throw new Error(parsed.why);
  if (parsed.record.kind === 'erasure' || parsed.record.kind === 'retention') throw new Error(`record ${id} is an ${parsed.record.kind} record`);
  return parsed.record;
};

const recordIds = (h: Harness) => fs.readdirSync(path.join(h.exportDir, '_ledger')).map((n) => Number(n.slice(0, 12)));

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  /**
   * What a convo-mirror older than line commitments leaves when it crashes between a batch's record
   * and the mirror's: the batch published up to its record (here by this convo-mirror, whose data
   * files are the same bytes), the record being that batch's version 1 record, byte for byte what
   * the older one wrote (its format pinned above).
   */
  async function olderPublicationCrashed(h: Harness): Promise<LedgerRecord> {
    const batch = await syncThenCrashPublication(h);
    const file = path.join(h.exportDir, recordPath(batch.id));
    const older = sealRecord(asVersion1(readRecord(h, batch.id)));
    overwrite(file, renderRecord(older));
    fs.chmodSync(file, 0o400);
    return older;
  }

  it('an archive begun by an older convo-mirror: its version 1 records are kept as they are, the version 2 records chain on them, and it verifies clean', async () => {
    const ws = FakeWorkspace.fromCounts([5, 40, 3]);
    const h = await start({ workspace: ws });
    const c = ws.list()[1]!;
    // Batches 1 and 2: published by the older convo-mirror, which crashed before recording each; this one takes them up.
    const older: LedgerRecord[] = [];
    for (const change of [() => undefined, () => ws.appendMessages(c.id, 3)]) {
      change();
      older.push(await olderPublicationCrashed(h));
      const res = await publishChanges(h.mirror, { exportDir: h.exportDir });
      expect(res.resumed).toBe(true);
      expect(fs.readFileSync(path.join(h.exportDir, recordPath(older.at(-1)!.batch_id))).equals(renderRecord(older.at(-1)!))).toBe(true);
    }
    // Then this convo-mirror publishes on its own.
    ws.editMessage(c.id, c.messages[2]!.id, 'edited');
    await h.sync();
    ws.appendMessages(c.id, 2);
    await h.sync();

    const records = recordIds(h).map((id) => readRecord(h, id));
    expect(records.map((r) => r.version)).toEqual([1, 1, ...records.slice(2).map(() => 2)]);
    expect(records.length).toBeGreaterThan(3);
    expect(records.slice(0, 2)).toEqual(older);
    for (const r of records.slice(0, 2)) for (const f of r.files) expect(f.merkle_root, f.path).toBeUndefined();
    for (const r of records.slice(2)) {
      for (const f of r.files) expect(f.merkle_root, f.path).toBe(linesMerkleRoot(fs.readFileSync(path.join(h.exportDir, f.path))));
    }
    expect(records[2]!.prev).toEqual({ batch_id: older[1]!.batch_id, hash: older[1]!.hash });
    expect((await h.mirror.ledgerEntries()).map((e) => e.hash)).toEqual(records.map((r) => r.hash));

    const full = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
    expect(full.problems).toEqual([]);
    const v1Files = older.reduce((n, r) => n + r.files.length, 0);
    const v2Files = records.slice(2).reduce((n, r) => n + r.files.length, 0);
    expect(full.checks.find((x) => x.name === 'files')).toEqual({
      name: 'files',
      status: 'ok',
      detail: `${v1Files + v2Files} files, ${full.lines} lines: sizes, line counts and SHA-256 as recorded; the Merkle roots of the lines of the ${v2Files} files listed by records of version 2 too`,
    });
    expect((await verifyArchive({ exportDir: h.exportDir })).problems).toEqual([]);

    // A byte changed in a file of each: the version 1 record can only tell its SHA-256, the version 2 record its root too.
    const flip = (rel: string) => {
      const bytes = fs.readFileSync(path.join(h.exportDir, rel));
      const at = bytes.indexOf('"content":"') + 11;
      bytes[at] = bytes[at] === 0x58 ? 0x59 : 0x58;
      overwrite(path.join(h.exportDir, rel), bytes);
    };
    const oldFile = older[0]!.files.find((f) => f.stream === 'messages')!;
    const newRecord = records.slice(2).find((r) => r.files.some((f) => f.stream === 'messages'))!;
    const newFile = newRecord.files.find((f) => f.stream === 'messages')!;
    flip(oldFile.path);
    flip(newFile.path);
    const found = (await verifyArchive({ exportDir: h.exportDir })).problems.filter((p) => p.problem !== 'manifest');
    expect(found.map((p: VerifyProblem) => `${p.problem} ${p.path}`)).toEqual([`sha256 ${oldFile.path}`, `sha256 ${newFile.path}`, `merkle_root ${newFile.path}`]);
    expect(found[2]).toEqual({
      path: newFile.path,
      problem: 'merkle_root',
      found: linesMerkleRoot(fs.readFileSync(path.join(h.exportDir, newFile.path))),
      expected: newFile.merkle_root,
      detail: `the Merkle tree hash of its ${newFile.lines} lines is not the one the record of batch ${newRecord.batch_id} (${recordPath(newRecord.batch_id)}) commits to: a line was changed, added, removed or moved`,
    });
  });

  it("a version 1 record of another batch's content is still refused on re-publication", async () => {
    const ws = FakeWorkspace.fromCounts([5, 40]);
    const h = await start({ workspace: ws });
    const older = await olderPublicationCrashed(h);
    const other = sealRecord({ ...older, files: older.files.map((f, i) => (i === 0 ? { ...f, sha256: '0'.repeat(64) } : f)) });
    const file = path.join(h.exportDir, recordPath(older.batch_id));
    overwrite(file, renderRecord(other));
    await expect(publishChanges(h.mirror, { exportDir: h.exportDir })).rejects.toThrow(`refusing to replace the batch record ${file}: it records another batch (hash ${other.hash})`);
    expect(await h.mirror.ledgerEntries()).toEqual([]);
  });

  it('gzipped files: each root is over the decompressed lines; a file recompressed keeps its root, a line changed does not', async () => {
    const ws = FakeWorkspace.fromCounts([30, 260, 4]);
    const h = await start({ workspace: ws });
    await h.sync({ gzip: true });
    const c = ws.list()[1]!;
    ws.editMessage(c.id, c.messages[3]!.id, 'edited');
    await h.sync({ gzip: true });
    const files = ledgerFiles(h.exportDir);
    for (const f of files) {
      const stored = fs.readFileSync(path.join(h.exportDir, f.path));
      expect(f.path.endsWith('.jsonl.gz'), f.path).toBe(true);
      expect(f.merkle_root, f.path).toBe(linesMerkleRoot(zlib.gunzipSync(stored)));
      expect(f.merkle_root).not.toBe(linesMerkleRoot(stored));
    }
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);

    const big = files.filter((f) => f.stream === 'messages').sort((a, b) => b.bytes - a.bytes)[0]!;
    expect(zlib.gunzipSync(fs.readFileSync(path.join(h.exportDir, big.path))).length).toBeGreaterThan(64 << 10); // many zlib output chunks: lines span them
    const abs = path.join(h.exportDir, big.path);
    const lines = zlib.gunzipSync(fs.readFileSync(abs));
    // Recompressed: other bytes, the same lines.
    const recompressed = zlib.gzipSync(lines, { level: 1 });
    overwrite(abs, recompressed);
    expect(await verifyArchive({ exportDir: h.exportDir }).then((r) => r.problems.filter((p) => p.path === big.path))).toEqual([
      { path: big.path, problem: 'size', found: recompressed.length, expected: big.bytes },
      {
        path: big.path,
        problem: 'sha256',
        found: sha256(recompressed),
        expected: big.sha256,
        detail: 'its lines hash to the merkle_root of its record: the lines are as recorded; the bytes around them (compression, a line end) or the recorded SHA-256 are not',
      },
    ]);
    // One line changed, recompressed.
    const text = lines.toString('utf8').replace('"content":"', '"content":"X');
    const changed = zlib.gzipSync(text);
    overwrite(abs, changed);
    const batch = recordIds(h).find((id) => readRecord(h, id).files.some((f) => f.path === big.path))!;
    expect(await verifyArchive({ exportDir: h.exportDir }).then((r) => r.problems.filter((p) => p.path === big.path))).toEqual([
      { path: big.path, problem: 'size', found: changed.length, expected: big.bytes },
      { path: big.path, problem: 'sha256', found: sha256(changed), expected: big.sha256 },
      {
        path: big.path,
        problem: 'merkle_root',
        found: linesMerkleRoot(Buffer.from(text)),
        expected: big.merkle_root,
        detail: `the Merkle tree hash of its ${big.lines} lines is not the one the record of batch ${batch} (${recordPath(batch)}) commits to: a line was changed, added, removed or moved`,
      },
    ]);
    // Cut short: the lines cannot be read, nor their root checked.
    const cut = changed.subarray(0, changed.length - 100);
    overwrite(abs, cut);
    const cutFound = (await verifyArchive({ exportDir: h.exportDir })).problems.filter((p) => p.path === big.path);
    expect(cutFound.map((p) => p.problem)).toEqual(['size', 'sha256', 'lines']);
    expect(cutFound[2]).toEqual({ path: big.path, problem: 'lines', detail: 'cannot decompress it: unexpected end of file' });
  });
});

const hasPython = (() => {
  try {
    execFileSync('python3', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

describe('docs/export-format.md', () => {
  it.skipIf(!hasPython)("its Python recipe recomputes every file's merkle_root, plain and gzipped", async () => {
    const [recipe, ...more] = docBlocks('docs/export-format.md').filter((b) => b.marker?.startsWith('python on published files'));
    expect(more).toEqual([]);
    expect(recipe!.lang).toBe('python');
    const script = path.join(tempDir(), 'root.py');
    fs.writeFileSync(script, recipe!.body);
    const ws = FakeWorkspace.fromCounts([3, 120]);
    const h = await pool.start({ workspace: ws });
    await h.sync();
    ws.appendMessages(ws.list()[1]!.id, 4);
    await h.sync({ gzip: true });
    const files = ledgerFiles(h.exportDir);
    expect(files.some((f) => f.path.endsWith('.gz'))).toBe(true);
    expect(files.some((f) => f.path.endsWith('.jsonl'))).toBe(true);
    for (const f of files) expect(execFileSync('python3', [script, path.join(h.exportDir, f.path)], { encoding: 'utf8' }), f.path).toBe(`${f.merkle_root}\n`);
  });
});

describe('verify reads a file as a stream', () => {
  it(`a .jsonl.gz of more than ${MAX_GUNZIP_BYTES} bytes decompressed is named, without holding them`, async () => {
    // An archive of one record listing one gzip bomb: 1 GiB and 1 MiB of zeros, about 1 MiB compressed.
    const dir = tempDir();
    const rel = 'messages/account=acme/date=2026-11-25/000000000001-000000000001.jsonl.gz';
    fs.mkdirSync(path.join(dir, path.dirname(rel)), { recursive: true });
    const zeros = Buffer.alloc(1 << 20);
    await pipeline(
      function* () {
        for (let i = 0; i <= MAX_GUNZIP_BYTES / zeros.length; i++) yield zeros;
      },
      zlib.createGzip({ level: 1 }),
      fs.createWriteStream(path.join(dir, rel)),
    );
    const bomb = fs.readFileSync(path.join(dir, rel));
    const body: RecordBody = {
      ...V2_BODY,
      batch_id: 1,
      first_seq: 1,
      last_seq: 1,
      prev: null,
      files: [{ path: rel, stream: 'messages', account_id: 'acme', date: '2026-11-25', first_seq: 1, last_seq: 1, lines: 1, bytes: bomb.length, sha256: sha256(bomb), merkle_root: new LineTreeHasher().rootHex() }],
    };
    fs.mkdirSync(path.join(dir, '_ledger'));
    fs.writeFileSync(path.join(dir, recordPath(1)), renderRecord(sealRecord(body)));
    const before = process.memoryUsage().rss;
    let peak = before;
    const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5);
    let found: VerifyProblem[];
    try {
      found = (await verifyArchive({ exportDir: dir })).problems;
    } finally {
      clearInterval(sampler);
    }
    peak = Math.max(peak, process.memoryUsage().rss);
    expect(found.filter((p) => p.path === rel)).toEqual([{ path: rel, problem: 'lines', detail: `cannot decompress it: it decompresses to more than ${MAX_GUNZIP_BYTES} bytes` }]);
    // gunzipping it whole would hold a GiB
    expect(peak - before).toBeLessThan(200 * 1024 * 1024);
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
