/**
 * Erasure in the archive (issue 26, item 2), on each engine of the store (test/engines.ts) where the
 * store is involved: a sender or a conversation erased from a synced and published archive has
 * every published line replaced by its stub in rewritten files, an erasure record in the ledger
 * (signed with the key), the old files removed; `verify` and `verify --deep` prove it intact, the
 * lines not erased unchanged, and name tampering by file and seq; files of version 1 records are
 * erased without line proof; a crash at every step of the archive step is finished by the next
 * erase or sync, exactly (no subject line survives, no file is lost, the chain stays linear); the
 * subject served again arrives redacted; a dry run counts and writes nothing. Real files, the real
 * fake over HTTP, real SQLite and PostgreSQL; nothing of ours mocked.
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { archiveDryRun } from '../src/export/erasure.js';
import { publishChanges, type ExportFailpoint, type ExportOptions, type ExportResult } from '../src/export/exporter.js';
import { asVersion1, isErasureRecord, parseRecord, recordPath, renderRecord, sealRecord, type AnyRecord, type ErasureRecord, type LedgerRecord } from '../src/export/ledger.js';
import { leafHash } from '../src/export/merkle.js';
import { generateKeyPair, loadPublicKey, loadSigningKey, type SigningKey } from '../src/export/signing.js';
import { parseStub, renderStub, stubOf } from '../src/export/stub.js';
import { verifyArchive, type VerifyProblem } from '../src/export/verify.js';
import { FakeWorkspace, type FakeMessage } from '../src/fake-api/index.js';
import type { ErasureKind } from '../src/store/mirror.js';
import { engines, type EngineFixture } from './engines.js';
import { ACCOUNT_ID, harnessPool, snapshotFiles, syncThenCrashPublication, tempDir, type Harness } from './helpers.js';
import { docBlocks } from './doc-blocks.js';
import { connectionOf } from './sql.js';
import { pgQuery } from './pg.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

/** Whether python3 runs here (the docs' recipe is Python). */
function hasPython(): boolean {
  try {
    execFileSync('python3', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const A = ACCOUNT_ID;
/** The content planted in one message of the subject: found nowhere once erased. */
const SECRET = 'Quokka-Zebra-7731 card 4111 1111';

/** A published archive (two batches, the second from a full refresh with an edit) and its erasure subject. */
interface Scene {
  h: Harness;
  ws: FakeWorkspace;
  /** The conversation holding the planted message, and its customer (the sender erased). */
  conversation: string;
  sender: string;
  /** The planted message. */
  message: string;
}

/**
 * Syncs a fake workspace twice: the customer of conversation 1 wrote {@link SECRET} before the first
 * sync and edited it before the second (a full refresh: an update line, a history version); more
 * messages come with the second.
 */
async function scene(engine: EngineFixture | undefined, publish: { gzip?: boolean; signingKey?: SigningKey } = {}): Promise<Scene> {
  const ws = FakeWorkspace.fromCounts([5, 40, 3]);
  const c = ws.list()[1]!;
  const mine = c.messages.find((m) => m.sender.type === 'Customer')!;
  ws.editMessage(c.id, mine.id, SECRET);
  const h = await pool.start({ workspace: ws, ...(engine ? { engine } : {}) });
  expect((await h.sync(publish)).status).toBe('succeeded');
  ws.editMessage(c.id, mine.id, `${SECRET} (edited)`);
  ws.appendMessages(c.id, 3);
  expect((await h.sync({ ...publish, full: true })).status).toBe('succeeded');
  return { h, ws, conversation: c.id, sender: mine.sender.id, message: mine.id };
}

/** The erasure in the mirror, then the archive step as `erase` runs it (no new batch). */
async function erase(h: Harness, kind: ErasureKind, subject: string, o: Partial<ExportOptions> = {}): Promise<{ erasureId: number; result: ExportResult }> {
  const r = await h.mirror.eraseSubject({ kind, accountId: A, subject, reason: `DSR-${kind}` });
  const result = await publishChanges(h.mirror, { exportDir: h.exportDir, newBatches: false, ...o });
  return { erasureId: r.erasureId!, result };
}

/** The lines of a data file's content (decompressed for `.gz`), each without its LF. */
function linesOf(file: string, bytes: Buffer = fs.readFileSync(file)): Buffer[] {
  const content = file.endsWith('.gz') ? zlib.gunzipSync(bytes) : bytes;
  const out: Buffer[] = [];
  let from = 0;
  for (let lf = content.indexOf(10); lf !== -1; lf = content.indexOf(10, from)) {
    out.push(content.subarray(from, lf));
    from = lf + 1;
  }
  return out;
}

/** Every record of the ledger on disk, by batch id. */
function records(exportDir: string): AnyRecord[] {
  const dir = path.join(exportDir, '_ledger');
  return fs
    .readdirSync(dir)
    .sort()
    .map((n) => {
      const parsed = parseRecord(fs.readFileSync(path.join(dir, n)));
      if (!parsed.ok) throw new Error(`${n}: ${parsed.why}`);
      return parsed.record;
    });
}

const erasureRecords = (exportDir: string): ErasureRecord[] => records(exportDir).filter((r): r is ErasureRecord => isErasureRecord(r));

/** Each record's `prev` is the record before it (by batch id), and the first is the genesis. */
function expectLinear(exportDir: string): void {
  const rs = records(exportDir);
  expect(rs[0]!.prev).toBeNull();
  for (let i = 1; i < rs.length; i++) expect(rs[i]!.prev, `record ${rs[i]!.batch_id}`).toEqual({ batch_id: rs[i - 1]!.batch_id, hash: rs[i - 1]!.hash });
}

/** Which export files (relative paths) hold `needle`, their content decompressed for `.gz`. */
function filesHolding(exportDir: string, needle: string): string[] {
  return [...snapshotFiles(exportDir)].filter(([p, b]) => (p.endsWith('.gz') ? zlib.gunzipSync(b) : b).includes(Buffer.from(needle))).map(([p]) => p);
}

/** verify, and verify --deep, of the harness's archive: their problems. */
async function verified(h: Harness, deep = true): Promise<VerifyProblem[]> {
  return (await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep })).problems;
}

/**
 * Checks a rewrite against the files as they were before it: every line of `seqs` (and only those)
 * is now the stub of the line it replaced, carrying that line's leaf; every other line is byte for
 * byte what it was; the record lists exactly those seqs and leaves.
 */
function expectStubbed(h: Harness, before: Map<string, Buffer>, record: ErasureRecord, seqs: ReadonlySet<number>, erasureId: number): number {
  let stubbed = 0;
  for (const f of record.files) {
    const old = linesOf(f.path, before.get(f.path)!);
    const now = linesOf(f.new_path, fs.readFileSync(path.join(h.exportDir, f.new_path)));
    expect(now.length).toBe(old.length);
    const listed: number[] = [];
    old.forEach((line, i) => {
      const seq = (JSON.parse(line.toString('utf8')) as { seq: number }).seq;
      if (seqs.has(seq) && !parseStub(line)) {
        const stub = stubOf(line, f.stream as 'messages' | 'conversations', erasureId);
        expect(now[i]!.equals(renderStub(stub)), `${f.new_path} line ${i + 1}`).toBe(true);
        expect(parseStub(now[i]!)).toEqual({ ...stub, leaf: leafHash(line).toString('hex') });
        listed.push(seq);
      } else expect(now[i]!.equals(line), `${f.new_path} line ${i + 1} unchanged`).toBe(true);
    });
    expect(f.redacted_seqs).toEqual(listed);
    expect(f.redacted_leaves).toEqual(listed.map((s) => leafHash(old.find((l) => (JSON.parse(l.toString('utf8')) as { seq: number }).seq === s)!).toString('hex')));
    expect(f.sha256).toBe(crypto.createHash('sha256').update(before.get(f.path)!).digest('hex'));
    expect(f.new_sha256).toBe(crypto.createHash('sha256').update(fs.readFileSync(path.join(h.exportDir, f.new_path))).digest('hex'));
    stubbed += listed.length;
  }
  return stubbed;
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());

  it('by sender: each published line of the sender becomes its stub in a rewritten file, one erasure record lists them, the old files are gone; verify and verify --deep intact', async () => {
    const s = await scene(engine);
    const h = s.h;
    const before = snapshotFiles(h.exportDir);
    expect(filesHolding(h.exportDir, SECRET).length).toBeGreaterThan(0);
    const subject = { kind: 'sender' as const, accountId: A, subject: s.sender };
    const dry = await archiveDryRun(h.mirror, h.exportDir, subject, await h.mirror.exportWatermark());

    const { erasureId, result } = await erase(h, 'sender', s.sender);
    const watermark = await h.mirror.exportWatermark();
    const lines = await h.mirror.subjectLines(subject, watermark);
    expect(lines.length).toBeGreaterThan(3);
    expect(result.erasures).toHaveLength(1);
    const done = result.erasures![0]!;
    expect(done).toMatchObject({ erasureId, lines: lines.length, removed: done.files.length, kept: [] });
    expect(dry).toEqual({ files: done.files.length, lines: lines.length, unpublished: 0 });
    // No new batch: the watermark stayed; the record took the next batch id and is the head.
    expect(result.files).toEqual([]);
    const [record] = erasureRecords(h.exportDir);
    expect(record!.batch_id).toBe(done.record!.batch_id);
    expect(await h.mirror.ledgerHead()).toEqual(done.record);
    expect(record).toMatchObject({ version: 2, kind: 'erasure', erasure: { id: erasureId, kind: 'sender', account_id: A, reason: 'DSR-sender' } });
    // The record is public: it does not name the subject.
    expect(fs.readFileSync(path.join(h.exportDir, recordPath(record!.batch_id)), 'utf8')).not.toContain(s.sender);
    expect(expectStubbed(h, before, record!, new Set(lines.map((l) => l.seq)), erasureId)).toBe(lines.length);
    for (const f of record!.files) {
      expect(fs.existsSync(path.join(h.exportDir, f.path)), f.path).toBe(false);
      expect(f.new_path).toBe(f.path.replace(/\.jsonl$/, `.e${erasureId}.jsonl`));
      expect(f.merkle_root).toBeDefined();
      expect((fs.statSync(path.join(h.exportDir, f.new_path)).mode & 0o777).toString(8)).toBe('400');
    }
    expect((await h.mirror.publishedFiles()).map((f) => f.path).sort()).toEqual(
      [...before.keys()].filter((p) => !p.startsWith('_ledger/') && p !== 'manifest.json').map((p) => record!.files.find((f) => f.path === p)?.new_path ?? p).sort(),
    );
    expect((await h.mirror.erasures())[0]).toMatchObject({ archiveBatchId: record!.batch_id, archiveDoneAt: expect.any(String) });

    expect(await verified(h)).toEqual([]);
    const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror });
    expect(report.erasures).toEqual([{ record: record!.batch_id, path: recordPath(record!.batch_id), erasure: record!.erasure, files: record!.files.length, lines: lines.length }]);
    expect(report.checks.find((c) => c.name === 'files')!.detail).toContain(`${record!.files.length} rewritten by erasure records (${lines.length} lines erased`);
    expectLinear(h.exportDir);

    // The content is nowhere under the export directory; nor, after a VACUUM, in the SQLite file.
    expect(filesHolding(h.exportDir, SECRET)).toEqual([]);
    if (engine.name === 'sqlite') {
      connectionOf(h.mirror).exec('VACUUM');
      connectionOf(h.mirror).pragma('wal_checkpoint(TRUNCATE)');
      const file = h.mirror.localFile!;
      const bytes = Buffer.concat([fs.readFileSync(file), fs.existsSync(`${file}-wal`) ? fs.readFileSync(`${file}-wal`) : Buffer.alloc(0)]);
      expect(bytes.includes(Buffer.from('Quokka-Zebra'))).toBe(false);
    }

    // Erasing the same sender again changes nothing in the archive: no record, no file.
    const snapshot = snapshotFiles(h.exportDir);
    const again = await erase(h, 'sender', s.sender);
    expect(again.result.erasures).toEqual([{ erasureId: again.erasureId, record: undefined, files: [], lines: 0, removed: 0, kept: [] }]);
    const after = snapshotFiles(h.exportDir);
    after.delete('manifest.json');
    snapshot.delete('manifest.json');
    expect(after).toEqual(snapshot);
  });

  it("by sender: the conversation whose contact is the sender is erased too: its conversations lines are stubs; verify and verify --deep intact; the sender's name is in no file of the archive nor in the mirror", async () => {
    const s = await scene(engine);
    const h = s.h;
    const conv = s.ws.list()[1]!;
    const contact = conv.data.contact as { id: string; name: string };
    expect(contact.id).toBe(s.sender);
    // The name is the subject's alone: no other conversation of the fake, nor any other sender, carries it.
    for (const other of s.ws.list()) if (other.id !== conv.id) expect(JSON.stringify(other)).not.toContain(contact.name);
    for (const m of conv.messages) if (m.sender.id !== s.sender) expect(JSON.stringify(m)).not.toContain(contact.name);
    // The test can fail: before the erasure the name is in the conversations files (and the messages files).
    const convSeqs = [...snapshotFiles(h.exportDir)]
      .filter(([p]) => p.startsWith('conversations/'))
      .flatMap(([p, b]) => linesOf(p, b).map((l) => JSON.parse(l.toString('utf8')) as { seq: number; id: string }))
      .filter((l) => l.id === conv.id)
      .map((l) => l.seq)
      .sort((a, b) => a - b);
    expect(convSeqs.length).toBeGreaterThanOrEqual(2); // listed in both batches (its activity moved on)
    expect(filesHolding(h.exportDir, contact.name).some((p) => p.startsWith('conversations/'))).toBe(true);
    const before = snapshotFiles(h.exportDir);

    const { erasureId, result } = await erase(h, 'sender', s.sender);
    const watermark = await h.mirror.exportWatermark();
    const lines = await h.mirror.subjectLines({ kind: 'sender', accountId: A, subject: s.sender }, watermark);
    expect(lines.filter((l) => l.stream === 'conversations').map((l) => l.seq)).toEqual(convSeqs);
    expect((await h.mirror.erasures())[0]).toMatchObject({ conversations: 1, publishedLines: lines.length });
    const record = erasureRecords(h.exportDir)[0]!;
    expect(result.erasures![0]!.lines).toBe(lines.length);
    expect(record.files.some((f) => f.stream === 'conversations')).toBe(true);
    expect(expectStubbed(h, before, record, new Set(lines.map((l) => l.seq)), erasureId)).toBe(lines.length);
    // Each line of the conversation in the conversations files is its stub.
    const stubs = record.files
      .filter((f) => f.stream === 'conversations')
      .flatMap((f) => linesOf(f.new_path, fs.readFileSync(path.join(h.exportDir, f.new_path))))
      .map((l) => parseStub(l))
      .filter((x) => x !== undefined);
    expect(stubs.map((x) => [x.seq, x.id, x.conversation_id, x.erasure])).toEqual(convSeqs.map((seq) => [seq, conv.id, conv.id, erasureId]));

    expect(await verified(h)).toEqual([]);
    expectLinear(h.exportDir);
    expect(filesHolding(h.exportDir, contact.name)).toEqual([]);
    expect(filesHolding(h.exportDir, s.sender)).toEqual([]);
    if (engine.name === 'sqlite') {
      connectionOf(h.mirror).exec('VACUUM');
      connectionOf(h.mirror).pragma('wal_checkpoint(TRUNCATE)');
      const file = h.mirror.localFile!;
      const bytes = Buffer.concat([fs.readFileSync(file), fs.existsSync(`${file}-wal`) ? fs.readFileSync(`${file}-wal`) : Buffer.alloc(0)]);
      expect(bytes.includes(Buffer.from(contact.name, 'utf8'))).toBe(false);
    } else {
      // Every row of every table of the mirror's schema (conversations.raw and raw_text, change_payloads, …) as text.
      const schema = new URL(h.dbPath).searchParams.get('schema')!;
      const tables = (await pgQuery<{ t: string }>(`SELECT tablename AS t FROM pg_tables WHERE schemaname = $1`, [schema])).map((r) => r.t);
      expect(tables).toEqual(expect.arrayContaining(['conversations', 'change_payloads', 'messages']));
      for (const t of tables) expect(await pgQuery(`SELECT 1 FROM "${schema}"."${t}" x WHERE strpos(x::text, $1) > 0 LIMIT 1`, [contact.name]), t).toEqual([]);
    }
  });

  it('by conversation: its message lines and its conversation lines become stubs, runs lines stay; then another erasure rewrites a rewritten file again', async () => {
    const s = await scene(engine);
    const h = s.h;
    const before = snapshotFiles(h.exportDir);
    const { erasureId, result } = await erase(h, 'conversation', s.conversation);
    const lines = await h.mirror.subjectLines({ kind: 'conversation', accountId: A, subject: s.conversation }, await h.mirror.exportWatermark());
    expect(new Set(lines.map((l) => l.stream))).toEqual(new Set(['messages', 'conversations']));
    const [record] = erasureRecords(h.exportDir);
    expect(new Set(record!.files.map((f) => f.stream))).toEqual(new Set(['messages', 'conversations']));
    expect(record!.files.every((f) => !f.path.startsWith('runs/'))).toBe(true);
    expect(expectStubbed(h, before, record!, new Set(lines.map((l) => l.seq)), erasureId)).toBe(lines.length);
    expect(result.erasures![0]!.lines).toBe(lines.length);
    expect(filesHolding(h.exportDir, SECRET)).toEqual([]);
    expect(await verified(h)).toEqual([]);

    // A sender of another conversation, whose lines share a file with the erased ones: .e1 becomes .e2.
    const other = s.ws.list()[0]!.messages.find((m) => m.sender.type === 'Customer')!.sender.id;
    const second = await erase(h, 'sender', other);
    const r2 = erasureRecords(h.exportDir)[1]!;
    const again = r2.files.find((f) => f.path.includes(`.e${erasureId}.`));
    expect(again, 'a file rewritten twice').toBeDefined();
    expect(again!.new_path).toBe(again!.path.replace(`.e${erasureId}.`, `.e${second.erasureId}.`));
    expect(fs.existsSync(path.join(h.exportDir, again!.path))).toBe(false);
    // Its stubs of the first erasure are kept as they are; the root is still the original record's.
    const stubs = linesOf(again!.new_path, fs.readFileSync(path.join(h.exportDir, again!.new_path))).map(parseStub).filter((x) => x !== undefined);
    expect(new Set(stubs.map((x) => x.erasure))).toEqual(new Set([erasureId, second.erasureId]));
    expect(again!.merkle_root).toBe(record!.files.find((f) => f.new_path === again!.path)!.merkle_root);
    expect(await verified(h)).toEqual([]);
    expectLinear(h.exportDir);
  });

  const POINTS: ExportFailpoint[] = ['erasure-after-file', 'erasure-before-record', 'erasure-before-mirror', 'erasure-after-record', 'erasure-after-delete'];
  it.each(POINTS.map((p, i) => [p, i % 2 === 0 ? 'erase' : 'sync'] as const))(
    'interrupted at %s, the next %s finishes the erasure exactly: no subject line survives, no file is lost, one record, the chain linear',
    async (point, by) => {
      const s = await scene(engine);
      const h = s.h;
      const before = snapshotFiles(h.exportDir);
      class Crash extends Error {}
      let calls = 0;
      const crash = (p: ExportFailpoint): void => {
        if (p === point && ++calls === 1) throw new Crash(`crashed at ${p}`);
      };
      await expect(erase(h, 'sender', s.sender, { failpoint: crash })).rejects.toBeInstanceOf(Crash);
      const pending = (await h.mirror.erasures())[0]!;
      expect(pending.archiveDoneAt).toBeNull();
      // What the crash left: every file the mirror lists is there (nothing lost so far).
      for (const f of await h.mirror.publishedFiles()) expect(fs.existsSync(path.join(h.exportDir, f.path)), f.path).toBe(true);
      const head = await h.mirror.ledgerHead();
      if (point === 'erasure-after-record' || point === 'erasure-after-delete') {
        expect(head!.batch_id).toBe(pending.archiveBatchId);
        if (point === 'erasure-after-record') {
          const problems = await verified(h, false);
          expect(problems.length).toBeGreaterThan(0);
          expect(problems.every((p) => p.problem === 'erasure' || p.problem === 'manifest')).toBe(true);
        }
      } else expect(erasureRecords(h.exportDir).length).toBe(point === 'erasure-before-mirror' ? 1 : 0);

      if (by === 'erase') {
        const r = await publishChanges(h.mirror, { exportDir: h.exportDir, newBatches: false });
        expect(r.erasures?.map((e) => e.erasureId)).toEqual([pending.id]);
      } else {
        // A sync with new changes: the erasure is finished first, the new batch's record chains on it.
        s.ws.appendMessages(s.conversation, 2);
        expect((await h.sync()).status).toBe('succeeded');
      }
      const erased = erasureRecords(h.exportDir);
      expect(erased).toHaveLength(1);
      expect((await h.mirror.erasures())[0]).toMatchObject({ archiveBatchId: erased[0]!.batch_id, archiveDoneAt: expect.any(String) });
      const lines = await h.mirror.subjectLines({ kind: 'sender', accountId: A, subject: s.sender }, pending.publishedThroughSeq);
      expect(expectStubbed(h, before, erased[0]!, new Set(lines.map((l) => l.seq)), pending.id)).toBe(lines.length);
      expect(filesHolding(h.exportDir, SECRET)).toEqual([]);
      for (const f of await h.mirror.publishedFiles()) expect(fs.existsSync(path.join(h.exportDir, f.path)), f.path).toBe(true);
      expect(fs.readdirSync(path.join(h.exportDir, '.convo-mirror-tmp'))).toEqual([]);
      expect(await verified(h)).toEqual([]);
      expectLinear(h.exportDir);
      if (by === 'sync') expect(records(h.exportDir).at(-1)!.batch_id).toBeGreaterThan(erased[0]!.batch_id);
    },
  );

  it('an erasure while a batch is planned and not published: that batch is published first, then the erasure record after it', async () => {
    const s = await scene(engine);
    const h = s.h;
    s.ws.appendMessages(s.conversation, 4);
    s.ws.editMessage(s.conversation, s.message, `${SECRET} (edited twice)`);
    const planned = await syncThenCrashPublication(h);
    const r = await h.mirror.eraseSubject({ kind: 'sender', accountId: A, subject: s.sender, reason: 'DSR-1' });
    expect(r.publishedThroughSeq).toBe(planned.last_seq);
    const res = await publishChanges(h.mirror, { exportDir: h.exportDir, newBatches: false });
    expect(res.resumed).toBe(true);
    const [record] = erasureRecords(h.exportDir);
    expect(record!.batch_id).toBeGreaterThan(planned.id);
    expect(record!.prev.batch_id).toBe(planned.id);
    expect(record!.files.some((f) => f.redacted_seqs.some((seq) => seq >= planned.first_seq))).toBe(true);
    expect(filesHolding(h.exportDir, SECRET)).toEqual([]);
    expect(await verified(h)).toEqual([]);
    expectLinear(h.exportDir);
  });
});

describe('sqlite', () => {
  it('the subject served again arrives redacted: the next publication carries only the marker, and the archive still verifies', async () => {
    const s = await scene(undefined);
    const h = s.h;
    const { erasureId } = await erase(h, 'sender', s.sender);
    let added: FakeMessage | undefined;
    for (let i = 0; i < 100 && !added; i++) {
      const [m] = s.ws.appendMessages(s.conversation, 1);
      if (m!.sender.id === s.sender) added = m;
    }
    expect(added).toBeDefined();
    expect((await h.sync()).status).toBe('succeeded');
    const file = (await h.mirror.publishedFiles()).filter((f) => f.stream === 'messages').at(-1)!;
    const line = linesOf(file.path, fs.readFileSync(path.join(h.exportDir, file.path))).map((l) => JSON.parse(l.toString('utf8')) as Record<string, unknown>).find((l) => l.id === added!.id)!;
    expect(Object.keys(line)).toEqual(['seq', 'op', 'synced_at', 'account_id', 'conversation_id', 'id', 'created_at', 'redacted']);
    expect(line).toMatchObject({ op: 'insert', conversation_id: s.conversation, created_at: added!.created_at, redacted: { erasure: erasureId } });
    expect(await verified(h)).toEqual([]);
  });

  it('gzipped files are rewritten gzipped, with the same bytes when written again after a crash; signed records verify with the public key', async () => {
    const dir = tempDir();
    generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'));
    const signingKey = loadSigningKey(path.join(dir, 'k.key'));
    const s = await scene(undefined, { gzip: true, signingKey });
    const h = s.h;
    const before = snapshotFiles(h.exportDir);
    class Crash extends Error {}
    const crash = (p: ExportFailpoint): void => {
      if (p === 'erasure-before-mirror') throw new Crash(p);
    };
    await expect(erase(h, 'sender', s.sender, { signingKey, failpoint: crash })).rejects.toBeInstanceOf(Crash);
    const firstTime = snapshotFiles(h.exportDir);
    const erasureId = (await h.mirror.erasures())[0]!.id;
    // Taken up again: the rewritten files and the record found again, byte for byte (deterministic gzip, deterministic signature).
    await publishChanges(h.mirror, { exportDir: h.exportDir, newBatches: false, signingKey });
    const [record] = erasureRecords(h.exportDir);
    for (const f of record!.files) expect(fs.readFileSync(path.join(h.exportDir, f.new_path)).equals(firstTime.get(f.new_path)!), f.new_path).toBe(true);
    expect(fs.readFileSync(path.join(h.exportDir, recordPath(record!.batch_id))).equals(firstTime.get(recordPath(record!.batch_id))!)).toBe(true);
    expect(record!.signature?.key_id).toBe(signingKey.keyId);
    expect(record!.files.every((f) => f.path.endsWith('.jsonl.gz') && f.new_path.endsWith(`.e${erasureId}.jsonl.gz`))).toBe(true);
    const lines = await h.mirror.subjectLines({ kind: 'sender', accountId: A, subject: s.sender }, await h.mirror.exportWatermark());
    expect(expectStubbed(h, before, record!, new Set(lines.map((l) => l.seq)), erasureId)).toBe(lines.length);
    expect(filesHolding(h.exportDir, SECRET)).toEqual([]);
    const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true, publicKey: loadPublicKey(path.join(dir, 'k.pub')) });
    expect(report.problems).toEqual([]);
    expect(report.checks.find((c) => c.name === 'signatures')!.status).toBe('ok');
  });

  it('tampering is named by file and seq: a stub whose leaf changed, a line not erased changed, a stub no record lists, a replaced file put back', async () => {
    const s = await scene(undefined);
    const h = s.h;
    const before = snapshotFiles(h.exportDir);
    await erase(h, 'sender', s.sender);
    const [record] = erasureRecords(h.exportDir);
    const f = record!.files.find((x) => x.redacted_seqs.length >= 2)!;
    const abs = path.join(h.exportDir, f.new_path);
    const original = fs.readFileSync(abs);
    const edit = (change: (lines: Buffer[]) => void): void => {
      const lines = linesOf(f.new_path, original);
      change(lines);
      fs.chmodSync(abs, 0o600);
      fs.writeFileSync(abs, Buffer.concat(lines.flatMap((l) => [l, Buffer.from('\n')])));
    };
    const seqOf = (l: Buffer) => (JSON.parse(l.toString('utf8')) as { seq: number }).seq;
    const problemsOf = async () => (await verified(h, false)).filter((p) => p.path === f.new_path);

    // A stub whose leaf changed.
    const first = f.redacted_seqs[0]!;
    edit((lines) => {
      const i = lines.findIndex((l) => seqOf(l) === first);
      lines[i] = renderStub({ ...parseStub(lines[i]!)!, leaf: 'ab'.repeat(32) });
    });
    let found = await problemsOf();
    expect(found).toContainEqual({ path: f.new_path, problem: 'erasure', found: 'ab'.repeat(32), expected: f.redacted_leaves[0], detail: expect.stringMatching(new RegExp(`^seq ${first} \\(line \\d+\\): its stub carries this leaf, erasure record ${record!.batch_id}`)) });
    expect(found.map((p) => p.problem).sort()).toEqual(['erasure', 'merkle_root', 'sha256']);

    // A line that was not erased, changed.
    let changed = 0;
    edit((lines) => {
      const i = lines.findIndex((l) => !parseStub(l));
      changed = seqOf(lines[i]!);
      lines[i] = Buffer.from(lines[i]!.toString('utf8').replace('"op":"insert"', '"op":"update"'));
    });
    found = await problemsOf();
    expect(changed).toBeGreaterThan(0);
    expect(found.map((p) => p.problem).sort()).toEqual(['merkle_root', 'sha256']);
    expect(found.find((p) => p.problem === 'merkle_root')!.detail).toMatch(/each stub counted as the leaf it carries, is not the one the record of batch \d+ .*: a line that was not erased was changed, added, removed or moved$/);
    // The root cannot say which line; replayed against the mirror (--deep), the line is named by file and seq.
    expect((await verified(h, true)).filter((p) => p.problem === 'deep')).toContainEqual({ path: f.new_path, problem: 'deep', detail: expect.stringContaining(`(seq ${changed})`) });

    // A stub put in for a line no erasure record lists (its own leaf, so the root still holds).
    let forged = 0;
    edit((lines) => {
      const i = lines.findIndex((l) => !parseStub(l));
      forged = seqOf(lines[i]!);
      lines[i] = renderStub(stubOf(lines[i]!, f.stream as 'messages', 9));
    });
    found = await problemsOf();
    expect(found).toContainEqual({ path: f.new_path, problem: 'erasure', detail: expect.stringMatching(new RegExp(`^line \\d+: a stub of seq ${forged} that no erasure record lists`)) });
    expect(found.map((p) => p.problem)).not.toContain('merkle_root');
    fs.writeFileSync(abs, original);
    expect(await verified(h)).toEqual([]);

    // A replaced file put back: named, it may hold the erased lines.
    fs.writeFileSync(path.join(h.exportDir, f.path), before.get(f.path)!, { mode: 0o400 });
    const back = await verified(h, false);
    expect(back).toEqual([{ path: f.path, problem: 'erasure', detail: expect.stringContaining(`erasure record ${record!.batch_id} (${recordPath(record!.batch_id)}) replaced it by ${f.new_path}, yet it is still here`) }]);
    // The erasure is finished: nothing removes what someone put back but the operator.
    await publishChanges(h.mirror, { exportDir: h.exportDir, newBatches: false });
    expect(fs.existsSync(path.join(h.exportDir, f.path))).toBe(true);
  });

  it('a file published by a version 1 record is rewritten too, and verify reports it erased without line proof', async () => {
    const ws = FakeWorkspace.fromCounts([5, 40, 3]);
    const c = ws.list()[1]!;
    const mine = c.messages.find((m) => m.sender.type === 'Customer')!;
    ws.editMessage(c.id, mine.id, SECRET);
    const h = await pool.start({ workspace: ws });
    // Batch 1 published by an older convo-mirror (version 1 record), which crashed before recording it; this one takes it up.
    const batch = await syncThenCrashPublication(h);
    const file = path.join(h.exportDir, recordPath(batch.id));
    const parsed = parseRecord(fs.readFileSync(file));
    if (!parsed.ok || isErasureRecord(parsed.record)) throw new Error('no batch record');
    const older = sealRecord(asVersion1(parsed.record as LedgerRecord));
    fs.chmodSync(file, 0o600);
    fs.writeFileSync(file, renderRecord(older));
    fs.chmodSync(file, 0o400);
    await publishChanges(h.mirror, { exportDir: h.exportDir });
    const { erasureId } = await erase(h, 'sender', mine.sender.id);
    const [record] = erasureRecords(h.exportDir);
    expect(record!.files.length).toBeGreaterThan(0);
    for (const f of record!.files) expect(f.merkle_root).toBeUndefined();
    expect(filesHolding(h.exportDir, SECRET)).toEqual([]);
    const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
    expect(report.problems).toEqual([]);
    expect(report.erasedWithoutLineProof).toEqual(record!.files.map((f) => f.new_path));
    expect(report.checks.find((c) => c.name === 'files')!.detail).toContain(`; ${record!.files.length} erased without line proof (published by records of version 1, which have no root)`);
    expect(record!.files[0]!.new_path).toContain(`.e${erasureId}.jsonl`);
    // Still proven by the erasure record's SHA-256: a byte changed is named.
    const abs = path.join(h.exportDir, record!.files[0]!.new_path);
    const bytes = fs.readFileSync(abs);
    bytes[bytes.length - 2] = bytes[bytes.length - 2]! ^ 1;
    fs.chmodSync(abs, 0o600);
    fs.writeFileSync(abs, bytes);
    expect((await verified(h, false)).map((p) => [p.path, p.problem])).toEqual([[record!.files[0]!.new_path, 'sha256']]);
  });

  it.skipIf(!hasPython())("docs/export-format.md's Python recipe recomputes a rewritten file's original root, plain and gzipped (each stub counted as its leaf)", async () => {
    const [recipe] = docBlocks('docs/export-format.md').filter((b) => b.marker?.startsWith('python on published files'));
    const script = path.join(tempDir(), 'root.py');
    fs.writeFileSync(script, recipe!.body);
    const s = await scene(undefined);
    s.ws.appendMessages(s.conversation, 6);
    expect((await s.h.sync({ gzip: true })).status).toBe('succeeded');
    await erase(s.h, 'conversation', s.conversation);
    const [record] = erasureRecords(s.h.exportDir);
    expect(record!.files.some((f) => f.new_path.endsWith('.gz'))).toBe(true);
    expect(record!.files.some((f) => f.new_path.endsWith('.jsonl'))).toBe(true);
    for (const f of record!.files) expect(execFileSync('python3', [script, path.join(s.h.exportDir, f.new_path)], { encoding: 'utf8' }), f.new_path).toBe(`${f.merkle_root}\n`);
  });

  it('a dry run counts what the archive step then rewrites, and writes nothing', async () => {
    const s = await scene(undefined);
    const h = s.h;
    const before = snapshotFiles(h.exportDir);
    const subject = { kind: 'conversation' as const, accountId: A, subject: s.conversation };
    const dryMirror = await h.mirror.eraseSubject({ ...subject, reason: 'T', dryRun: true });
    const dry = await archiveDryRun(h.mirror, h.exportDir, subject, dryMirror.publishedThroughSeq);
    expect(snapshotFiles(h.exportDir)).toEqual(before);
    expect(await h.mirror.erasures()).toEqual([]);
    const { result } = await erase(h, 'conversation', s.conversation);
    expect(dry).toEqual({ files: result.erasures![0]!.files.length, lines: result.erasures![0]!.lines, unpublished: 0 });
    expect(dryMirror.publishedLines).toBe(result.erasures![0]!.lines);
  });
});
