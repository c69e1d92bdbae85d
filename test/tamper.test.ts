/**
 * The archive proves itself: every kind of tampering the README's "For auditors" promises to catch
 * is caught by `verify` and named (path and kind), with and without the database; signatures; a
 * noted head after truncation; `--deep` against a mirror changed by hand; crashes between a batch's
 * data files and its record; the migration of an export directory written before the ledger; the
 * CLI's exit codes and JSON. Real files, real SQLite, the real fake over HTTP.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { publishChanges } from '../src/export/exporter.js';
import { parseRecord, recordPath, renderRecord, sealRecord, type LedgerRecord } from '../src/export/ledger.js';
import { manifestOf, renderManifest } from '../src/export/manifest.js';
import { sealHead } from '../src/export/head.js';
import { generateKeyPair, loadPublicKey, loadSigningKey, sign, type SigningKey } from '../src/export/signing.js';
import { verifyArchive, type VerifyOptions, type VerifyProblem } from '../src/export/verify.js';
import type { LedgerHead } from '../src/store/mirror.js';
import { syncWorkspace } from '../src/sync/workspace.js';
import { run } from './children.js';
import { ACCOUNT_ID, harnessPool, ledgerFiles, linesMerkleRoot, snapshotFiles, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import { sqlAll, sqlRun, sqlValue } from './sql.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());
const start = (opts: HarnessOptions): Promise<Harness> => pool.start(opts);

/** A mirror with four runs (eight batch records): appends, an edit, a deletion between them; the head after each run. */
async function archive(o: { signWith?: string; witnessDir?: string } = {}): Promise<{ h: Harness; heads: LedgerHead[]; ws: FakeWorkspace }> {
  const ws = FakeWorkspace.fromCounts([5, 40, 3]);
  const h = await start({ workspace: ws });
  const signingKey = o.signWith ? loadSigningKey(o.signWith) : undefined;
  const heads: LedgerHead[] = [];
  const c = ws.list()[1]!;
  const changes = [() => ws.appendMessages(c.id, 3), () => ws.editMessage(c.id, c.messages[2]!.id, 'edited'), () => ws.deleteMessage(c.id, c.messages[4]!.id), () => undefined];
  for (const change of changes) {
    const s = await h.sync({ full: true, ...(signingKey ? { signingKey } : {}), ...(o.witnessDir ? { witnessDir: o.witnessDir } : {}) });
    heads.push(s.export.head!);
    change();
  }
  expect(await h.mirror.ledgerEntries()).toHaveLength(8);
  expect(await check(h)).toEqual([]);
  return { h, heads, ws };
}

/** verify's problems, with the mirror (default) or from the archive alone. */
async function check(h: Harness, o: { mirror?: boolean; head?: LedgerHead; deep?: boolean } = {}): Promise<VerifyProblem[]> {
  return (await verifyArchive({ exportDir: h.exportDir, ...(o.mirror === false ? {} : { mirror: h.mirror }), ...(o.head ? { head: o.head } : {}), ...(o.deep ? { deep: true } : {}) })).problems;
}

const rec = (id: number) => recordPath(id);
const abs = (h: Harness, rel: string) => path.join(h.exportDir, rel);
const readRecord = (h: Harness, id: number): LedgerRecord => {
  const parsed = parseRecord(fs.readFileSync(abs(h, rec(id))));
  if (!parsed.ok) throw new Error(parsed.why);
  if (parsed.record.kind === 'erasure' || parsed.record.kind === 'retention') throw new Error(`record ${id} is an ${parsed.record.kind} record`);
  return parsed.record;
};
/** Writes over a published (read-only) file, as a careless tool running as its owner could after chmod. */
function overwrite(file: string, data: Buffer | string): void {
  fs.chmodSync(file, 0o600);
  fs.writeFileSync(file, data);
}
const kinds = (ps: VerifyProblem[]) => ps.map((p) => `${p.problem} ${p.path}`);

describe('tampering, each caught by verify and named', () => {
  it('a byte flipped in a data file: sha256 and merkle_root at that file, naming its record; a head noted before that batch still proves, a later one does not', async () => {
    const { h, heads } = await archive();
    const [target] = sqlAll<{ path: string; batch_id: number }>(h.mirror, `SELECT path, batch_id FROM export_files WHERE stream = 'messages' AND batch_id > ? ORDER BY batch_id LIMIT 1`, heads[1]!.batch_id);
    const batch = target!.batch_id;
    const bytes = fs.readFileSync(abs(h, target!.path));
    const at = Math.floor(bytes.length / 2);
    bytes[at] = bytes[at]! ^ 0x01;
    overwrite(abs(h, target!.path), bytes);
    const listed = ledgerFiles(h.exportDir).find((f) => f.path === target!.path)!;
    const sha256 = { path: target!.path, problem: 'sha256', found: crypto.createHash('sha256').update(bytes).digest('hex'), expected: listed.sha256 };
    const merkle = {
      path: target!.path,
      problem: 'merkle_root',
      found: linesMerkleRoot(bytes),
      expected: listed.merkle_root,
      detail: `the Merkle tree hash of its ${listed.lines} lines is not the one the record of batch ${batch} (${rec(batch)}) commits to: a line was changed, added, removed or moved`,
    };
    expect(merkle.found).not.toBe(merkle.expected);
    expect(await check(h)).toEqual([sha256, merkle]);
    expect(await check(h, { mirror: false })).toEqual([sha256, merkle]);
    const before = heads.filter((x) => x.batch_id < batch).at(-1)!;
    const after = heads.find((x) => x.batch_id >= batch)!;
    expect((await check(h, { head: before })).filter((p) => p.problem === 'head')).toEqual([]);
    expect((await check(h, { head: after })).filter((p) => p.problem === 'head')).toEqual([
      { path: rec(after.batch_id), problem: 'head', detail: `head ${after.batch_id}:${after.hash} is in the chain, but batch ${batch} before it is broken or its files changed` },
    ]);
  });

  it('a data file deleted: missing at that file', async () => {
    const { h } = await archive();
    const target = ledgerFiles(h.exportDir).find((f) => f.stream === 'conversations')!;
    fs.rmSync(abs(h, target.path));
    expect(await check(h)).toEqual([{ path: target.path, problem: 'missing' }]);
  });

  it('a record edited and re-hashed consistently: it reads back sound, but the link to it breaks, named at that record', async () => {
    const { h } = await archive();
    const r = readRecord(h, 3);
    const forged = sealRecord({ ...r, files: r.files.map((f, i) => (i === 0 ? { ...f, sha256: 'f'.repeat(64) } : f)) });
    overwrite(abs(h, rec(3)), renderRecord(forged));
    expect(parseRecord(fs.readFileSync(abs(h, rec(3)))).ok).toBe(true);
    const found = await check(h, { mirror: false });
    expect(found).toContainEqual({ path: rec(3), problem: 'chain', detail: expect.stringMatching(/^batch 4 links to it with hash [0-9a-f]{64}, but it hashes to [0-9a-f]{64}: it was altered/) });
    // the forged listing no longer matches the file either; the file's lines still hash to the root the record kept
    expect(found).toContainEqual({
      path: r.files[0]!.path,
      problem: 'sha256',
      found: r.files[0]!.sha256,
      expected: 'f'.repeat(64),
      detail: 'its lines hash to the merkle_root of its record: the lines are as recorded; the bytes around them (compression, a line end) or the recorded SHA-256 are not',
    });
    expect(found.filter((p) => p.problem === 'merkle_root')).toEqual([]);
    // the mirror's ledger disagrees too
    expect(await check(h)).toContainEqual({ path: rec(3), problem: 'mirror', detail: `the mirror recorded hash ${r.hash}, the archive's record hashes to ${forged.hash}` });
  });

  it('a record edited without re-hashing: record at that path', async () => {
    const { h } = await archive();
    const text = fs.readFileSync(abs(h, rec(5)), 'utf8').replace(/"lines": (\d+)/, (_, n: string) => `"lines": ${Number(n) + 1}`);
    overwrite(abs(h, rec(5)), text);
    expect(kinds(await check(h, { mirror: false }))).toEqual(expect.arrayContaining([`record ${rec(5)}`, `chain ${rec(6)}`]));
  });

  it('a record deleted: the next record names the gap; the last one deleted: the mirror shows the truncation', async () => {
    const { h } = await archive();
    const r4 = readRecord(h, 4);
    fs.rmSync(abs(h, rec(4)));
    const found = await check(h, { mirror: false });
    expect(found).toContainEqual({ path: rec(5), problem: 'chain', detail: 'links to batch 4, but the record before it is batch 3: a record is missing' });
    // its files are now listed by no record
    for (const f of r4.files) expect(found).toContainEqual({ path: f.path, problem: 'unlisted' });
  });

  it('two records swapped: both named', async () => {
    const { h } = await archive();
    const a = fs.readFileSync(abs(h, rec(2)));
    const b = fs.readFileSync(abs(h, rec(3)));
    overwrite(abs(h, rec(2)), b);
    overwrite(abs(h, rec(3)), a);
    const found = await check(h, { mirror: false });
    expect(found).toContainEqual({ path: rec(2), problem: 'record', detail: 'holds the record of batch 3: records were renamed or swapped' });
    expect(found).toContainEqual({ path: rec(3), problem: 'record', detail: 'holds the record of batch 2: records were renamed or swapped' });
  });

  it('an extra file in a partition, and in _ledger/: unlisted at their paths', async () => {
    const { h } = await archive();
    const dir = path.dirname(ledgerFiles(h.exportDir).find((f) => f.stream === 'messages')!.path);
    fs.writeFileSync(abs(h, `${dir}/000000000900-000000000901.jsonl`), '{"seq":900}\n');
    fs.writeFileSync(abs(h, '_ledger/notes.txt'), 'mine');
    expect(await check(h)).toEqual([
      { path: '_ledger/notes.txt', problem: 'unlisted' },
      { path: `${dir}/000000000900-000000000901.jsonl`, problem: 'unlisted' },
    ]);
  });

  it('a record file too large to be one (300 MiB, sparse) is refused without being read', async () => {
    const { h } = await archive();
    const big = abs(h, rec(8));
    fs.chmodSync(big, 0o600);
    fs.truncateSync(big, 300 * 1024 * 1024);
    const rss = process.memoryUsage().rss;
    expect(await check(h, { mirror: false })).toContainEqual({ path: rec(8), problem: 'record', detail: expect.stringMatching(/cannot read it: .* is 314572800 bytes, more than the 268435456 expected of it$/) });
    expect(process.memoryUsage().rss - rss).toBeLessThan(100 * 1024 * 1024);
  });

  it('a record that lists a path outside the partitions is refused, and nothing outside the export directory is read', async () => {
    const { h } = await archive();
    const r = readRecord(h, 8);
    const evil = sealRecord({ ...r, files: [...r.files, { ...r.files[0]!, path: '../../etc/passwd' }] });
    overwrite(abs(h, rec(8)), renderRecord(evil));
    expect(await check(h, { mirror: false })).toContainEqual({ path: rec(8), problem: 'record', detail: 'files[1].path "../../etc/passwd" is not a data file path' });
  });
});

describe('signatures', () => {
  it('verify --public-key passes a signed archive, and names a forged signature, another key, and a record published unsigned', async () => {
    const dir = tempDir();
    generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'));
    generateKeyPair(path.join(dir, 'other.key'), path.join(dir, 'other.pub'));
    const { h } = await archive({ signWith: path.join(dir, 'k.key') });
    const pub = loadPublicKey(path.join(dir, 'k.pub'));
    const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, publicKey: pub });
    expect(report.problems).toEqual([]);
    expect(report.signed).toBe(8);
    expect(report.checks.find((c) => c.name === 'signatures')).toEqual({ name: 'signatures', status: 'ok', detail: `all 8 records signed by ${pub.keyId}; the head pointer signed by it` });
    // without a key the signatures are counted, not checked
    expect((await verifyArchive({ exportDir: h.exportDir })).checks.find((c) => c.name === 'signatures')!.status).toBe('skipped');
    // another key: every record
    const other = (await verifyArchive({ exportDir: h.exportDir, publicKey: loadPublicKey(path.join(dir, 'other.pub')) })).problems;
    expect(other.map((p) => p.path)).toEqual([...[1, 2, 3, 4, 5, 6, 7, 8].map(rec), 'manifest.json']);
    expect(other.every((p) => p.problem === 'signature' && /^signed by key sha256:/.test(p.detail!))).toBe(true);
    // a forged signature: one character of one record's signature changed
    const r = readRecord(h, 6);
    const value = r.signature!.value;
    const forged = { ...r, signature: { ...r.signature!, value: `${value[0] === 'A' ? 'B' : 'A'}${value.slice(1)}` } };
    overwrite(abs(h, rec(6)), renderRecord(forged));
    expect((await verifyArchive({ exportDir: h.exportDir, publicKey: pub })).problems).toEqual([
      { path: rec(6), problem: 'signature', detail: 'the signature does not verify: the record or its signature was forged' },
    ]);
    // a record published without the key
    h.fake.workspace.appendMessages(h.fake.workspace.list()[0]!.id, 1);
    await h.sync();
    const unsigned = (await verifyArchive({ exportDir: h.exportDir, publicKey: pub })).problems.filter((p) => p.problem === 'unsigned');
    expect(unsigned.map((p) => p.path)).toEqual([rec(9), rec(10), 'manifest.json']);
  });
});

describe('a noted head', () => {
  it('an archive truncated to an earlier head still verifies against that head, not against the later one', async () => {
    const { h, heads } = await archive();
    const copy = path.join(tempDir(), 'copy');
    fs.cpSync(h.exportDir, copy, { recursive: true });
    const early = heads[1]!;
    const late = heads[3]!;
    // Remove every record after the early head, the files they list, and point the manifest back.
    for (let id = early.batch_id + 1; id <= late.batch_id; id++) {
      const r = readRecord(h, id);
      for (const f of r.files) fs.rmSync(path.join(copy, f.path));
      fs.rmSync(path.join(copy, rec(id)));
    }
    const manifest = JSON.parse(fs.readFileSync(path.join(copy, 'manifest.json'), 'utf8')) as Record<string, unknown>;
    overwrite(path.join(copy, 'manifest.json'), JSON.stringify({ ...manifest, watermark: readRecord(h, early.batch_id).last_seq, head: { ...early, record: rec(early.batch_id) } }, null, 2) + '\n');
    const truncated = async (head: LedgerHead) => (await verifyArchive({ exportDir: copy, head })).problems;
    expect(await truncated(early)).toEqual([]);
    expect(await truncated(late)).toEqual([
      { path: '_ledger', problem: 'head', detail: `no record of this archive is ${late.batch_id}:${late.hash} (its chain ends at ${early.batch_id}:${early.hash}): records ${early.batch_id + 1}–${late.batch_id} were removed` },
    ]);
    // with the mirror's database, the truncation shows without a noted head
    const withDb = (await verifyArchive({ exportDir: copy, mirror: h.mirror })).problems;
    expect(withDb.filter((p) => p.problem === 'mirror').map((p) => p.path)).toEqual([...Array(late.batch_id - early.batch_id).keys()].map((i) => rec(early.batch_id + 1 + i)));
    // the original proves both
    expect(await check(h, { head: early })).toEqual([]);
    expect(await check(h, { head: late })).toEqual([]);
  });
});

describe('verify --deep', () => {
  it('catches a message changed by hand, a tombstone removed, a message_history row altered, and a run rewritten, each by key', async () => {
    const { h } = await archive();
    expect(await check(h, { deep: true })).toEqual([]);
    const [m] = sqlAll<{ conversation_id: string; id: string }>(h.mirror, `SELECT conversation_id, id FROM messages WHERE deleted_at IS NULL ORDER BY conversation_id, id LIMIT 1`);
    sqlRun(h.mirror, `UPDATE messages SET raw = json_set(raw, '$.content', 'rewritten') WHERE conversation_id = ? AND id = ?`, m!.conversation_id, m!.id);
    const deep = (await check(h, { deep: true })).filter((p) => p.problem === 'deep');
    // Named by the file that holds the line, and the line's seq.
    expect(deep).toEqual([{ path: expect.stringMatching(new RegExp(`^messages/account=${ACCOUNT_ID}/date=[0-9-]+/\\d+-\\d+\\.jsonl$`)), problem: 'deep', detail: expect.stringMatching(new RegExp(`^messages ${ACCOUNT_ID}/${m!.conversation_id}/${m!.id} \\(seq \\d+\\): the exports say one thing, the mirror another$`)) }]);
    const seq = Number(/\(seq (\d+)\)/.exec(deep[0]!.detail!)![1]);
    const [first, last] = path.basename(deep[0]!.path).replace('.jsonl', '').split('-').map(Number);
    expect(seq).toBeGreaterThanOrEqual(first!);
    expect(seq).toBeLessThanOrEqual(last!);
    // the archive alone is intact: only the mirror changed
    expect(await check(h)).toEqual([]);
    sqlRun(h.mirror, `UPDATE message_history SET raw = json_set(raw, '$.content', 'not what it was')`);
    sqlRun(h.mirror, `UPDATE messages SET deleted_at = NULL WHERE deleted_at IS NOT NULL`);
    sqlRun(h.mirror, `UPDATE runs SET requests = requests + 1 WHERE id = 1`);
    const details = (await check(h, { deep: true })).map((p) => p.detail ?? '');
    expect(details.some((d) => /message_history holds another version/.test(d))).toBe(true);
    expect(details.some((d) => /deleted in the exports, live in the mirror/.test(d))).toBe(true);
    expect(details.some((d) => /^runs .*\/1 \(seq \d+\): the exports say one thing/.test(d))).toBe(true);
  });
});

describe('a crash between a batch data files and its record', () => {
  it('before the record: the next publication re-publishes byte-identical files and writes one record; after it, before SQLite: the record is kept as it is', async () => {
    for (const point of ['before-ledger', 'before-record'] as const) {
      const ws = FakeWorkspace.fromCounts([8, 130]);
      const h = await start({ workspace: ws });
      await h.sync();
      ws.appendMessages(ws.list()[1]!.id, 4);
      await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
      class Crash extends Error {}
      await expect(publishChanges(h.mirror, { exportDir: h.exportDir, failpoint: (p) => { if (p === point) throw new Crash(); } })).rejects.toThrow(Crash);
      const pending = (await h.mirror.pendingExportBatch())!;
      const written = snapshotFiles(h.exportDir);
      expect(written.has(rec(pending)), point).toBe(point === 'before-record');
      const res = await publishChanges(h.mirror, { exportDir: h.exportDir });
      expect(res.resumed, point).toBe(true);
      const after = snapshotFiles(h.exportDir);
      for (const [p, bytes] of written) if (p !== 'manifest.json') expect(after.get(p)?.equals(bytes), `${point}: ${p}`).toBe(true);
      expect([...after.keys()].filter((p) => p.startsWith('_ledger/')), point).toEqual([...Array(pending).keys()].map((i) => rec(i + 1)));
      expect(await check(h, { deep: true }), point).toEqual([]);
    }
  });
});

describe('an export directory written before the ledger', () => {
  it('is migrated by the next publication: a genesis record lists every file published so far, made read-only; verify passes', async () => {
    const ws = FakeWorkspace.fromCounts([6, 120]);
    const h = await start({ workspace: ws });
    await h.sync();
    // Back to what convo-mirror wrote before the ledger: no records, a manifest of version 1 listing the files, files 0600.
    const files = await h.mirror.publishedFiles();
    sqlRun(h.mirror, `DELETE FROM ledger`);
    fs.rmSync(abs(h, '_ledger'), { recursive: true });
    for (const f of files) fs.chmodSync(abs(h, f.path), 0o600);
    overwrite(abs(h, 'manifest.json'), JSON.stringify({ format: 'convo-mirror-exports', version: 1, mirror_id: await h.mirror.mirrorId(), watermark: await h.mirror.exportWatermark(), files }, null, 2) + '\n');
    const last = Math.max(...files.map((f) => f.batch_id));
    // Before the next sync, verify says what is missing and what will fix it.
    expect(await check(h)).toContainEqual({ path: '_ledger', problem: 'missing', detail: 'no batch record: these exports were published before the ledger existed; the next sync writes their genesis record' });
    ws.appendMessages(ws.list()[1]!.id, 2);
    await h.sync();
    const genesis = readRecord(h, last);
    expect(genesis).toMatchObject({ kind: 'migration', prev: null, run_id: null, first_seq: 1, last_seq: files.reduce((m, f) => Math.max(m, f.last_seq), 0) });
    expect(genesis.files.map((f) => f.path)).toEqual(files.map((f) => f.path));
    // the mirror knows those files by their SHA-256 only: the genesis record is of version 1, the batches after it of version 2
    expect(genesis.version).toBe(1);
    expect(genesis.files.filter((f) => f.merkle_root !== undefined)).toEqual([]);
    expect(readRecord(h, last + 1).version).toBe(2);
    for (const f of files) expect(fs.statSync(abs(h, f.path)).mode & 0o777, f.path).toBe(0o400);
    expect(readRecord(h, last + 1).prev).toEqual({ batch_id: last, hash: genesis.hash });
    expect(JSON.parse(fs.readFileSync(abs(h, 'manifest.json'), 'utf8'))).toMatchObject({ version: 3 });
    expect(await check(h, { deep: true })).toEqual([]);
  });
});

describe('convo-mirror verify (CLI)', () => {
  it('exit 0 with --json on an intact archive; without the database it still verifies and says so; --deep there and a bad --head exit 2; a problem exits 1', async () => {
    const { h, heads } = await archive();
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', CONVO_MIRROR_DB: h.dbPath, CONVO_MIRROR_EXPORT_DIR: h.exportDir };
    const ok = await run(['verify', '--json', '--deep', '--head', `${heads[2]!.batch_id}:${heads[2]!.hash}`], env);
    expect(ok.code, ok.stderr).toBe(0);
    const report = JSON.parse(ok.stdout) as { ok: boolean; records: number; checks: { name: string; status: string }[] };
    expect(report.ok).toBe(true);
    expect(report.records).toBe(8);
    expect(report.checks.map((c) => `${c.name}:${c.status}`)).toEqual(['database:ok', 'chain:ok', 'files:ok', 'unlisted:ok', 'manifest:ok', 'signatures:skipped', 'head:ok', 'witness:skipped', 'age:ok', 'mirror:ok', 'deep:ok', 'temp:ok']);
    const noDb = { ...env, CONVO_MIRROR_DB: path.join(h.dir, 'absent.sqlite') };
    const alone = await run(['verify'], noDb);
    expect(alone.code, alone.stderr).toBe(0);
    expect(alone.stdout).toMatch(/^skip database: no database/m);
    expect(alone.stdout).toMatch(/\narchive intact: 8 records, .*; not checked: database, signatures, head, witness, mirror, deep \(verified without the database\)\n$/);
    expect((await run(['verify', '--deep'], noDb)).code).toBe(2);
    const bad = await run(['verify', '--head', 'xyz'], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--head/);
    fs.rmSync(abs(h, ledgerFiles(h.exportDir)[0]!.path));
    const broken = await run(['verify'], env);
    expect(broken.code).toBe(1);
    expect(broken.stderr).toMatch(/^problem: .*: missing$/m);
    expect(broken.stdout).toMatch(/\nNOT intact: files FAILED \(1 problem\), mirror FAILED \(1 problem\)|\nNOT intact: files FAILED \(1 problem\); everything else ok or skipped\n$/);
    expect(broken.stdout).not.toMatch(/\bintact up to\b|archive intact/);
  });
});

describe('what each check catches when the chain is rebuilt (the table of docs/auditors)', () => {
  /**
   * A signed, witnessed archive (eight records), then one message line of batch 3 rewritten and
   * every record from 3 on re-hashed and re-linked, so the archive is consistent again; the
   * manifest rewritten to the new head, signed now. `key`: the attacker has the signing key and
   * re-signs everything; without it, records keep their old signatures and the manifest has none.
   * `alsoMirror`: the mirror's rows and ledger are altered to match.
   */
  async function rebuilt(o: { withKey: boolean; alsoMirror: boolean }) {
    const dir = tempDir();
    generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'));
    const key = loadSigningKey(path.join(dir, 'k.key'));
    const pub = loadPublicKey(path.join(dir, 'k.pub'));
    const witnessDir = tempDir();
    const { h, heads } = await archive({ signWith: path.join(dir, 'k.key'), witnessDir });
    const r3 = readRecord(h, 3);
    const f = r3.files.find((x) => x.stream === 'messages')!;
    const lines = fs.readFileSync(abs(h, f.path), 'utf8').split('\n');
    const line = JSON.parse(lines[0]!) as { conversation_id: string; id: string; content: string };
    const rewritten = 'rewritten by someone who had write access';
    lines[0] = JSON.stringify({ ...line, content: rewritten });
    const data = Buffer.from(lines.join('\n'));
    overwrite(abs(h, f.path), data);
    // consistently: the size, the SHA-256 and the root of the lines of the rewritten file
    const file = { ...f, bytes: data.length, sha256: crypto.createHash('sha256').update(data).digest('hex'), merkle_root: linesMerkleRoot(data) };
    const attacker: SigningKey | undefined = o.withKey ? key : undefined;
    const hashes = new Map<number, string>([[2, readRecord(h, 2).hash]]);
    for (let id = 3; id <= 8; id++) {
      const r = readRecord(h, id);
      const body = { ...r, files: id === 3 ? r.files.map((x) => (x.path === f.path ? file : x)) : r.files, prev: { batch_id: id - 1, hash: hashes.get(id - 1)! } };
      const sealed = sealRecord(body, attacker ? (b) => sign(b, attacker) : undefined);
      overwrite(abs(h, rec(id)), renderRecord(attacker ? sealed : { ...sealed, signature: r.signature! }));
      hashes.set(id, sealed.hash);
    }
    const head = { batch_id: 8, hash: hashes.get(8)! };
    const manifest = sealHead(manifestOf(await h.mirror.mirrorId(), head, readRecord(h, 8).last_seq, new Date().toISOString()), attacker);
    overwrite(abs(h, 'manifest.json'), renderManifest(manifest));
    if (o.alsoMirror) {
      for (let id = 3; id <= 8; id++) sqlRun(h.mirror, `UPDATE ledger SET hash = ?, prev_hash = ? WHERE batch_id = ?`, hashes.get(id), hashes.get(id - 1), id);
      sqlRun(h.mirror, `UPDATE messages SET raw = json_set(raw, '$.content', ?) WHERE conversation_id = ? AND id = ?`, rewritten, line.conversation_id, line.id);
      sqlRun(h.mirror, `UPDATE export_files SET bytes = ?, sha256 = ? WHERE path = ?`, file.bytes, file.sha256, f.path);
    }
    /** The checks that failed, with `o`. */
    const failed = async (v: Omit<VerifyOptions, 'exportDir'>) =>
      (await verifyArchive({ exportDir: h.exportDir, ...v }))
        .checks.filter((c) => c.status === 'failed')
        .map((c) => c.name);
    return { h, heads, pub, witnessDir, failed };
  }

  it('by someone without the key: the archive alone sees nothing; the signatures, a head noted after the change, the witness, the mirror and max-age (with the key) each catch it', async () => {
    const { h, heads, pub, witnessDir, failed } = await rebuilt({ withKey: false, alsoMirror: false });
    expect(await failed({})).toEqual([]);
    expect(await failed({ publicKey: pub })).toEqual(['signatures']);
    expect(await failed({ head: heads[1] })).toEqual(['head']); // noted after batch 3 (it is batch 4)
    expect(await failed({ head: heads[0] })).toEqual([]); // noted before the change: still proven
    expect(await failed({ witnessDir })).toEqual(['witness']);
    expect(await failed({ mirror: h.mirror })).toEqual(['manifest', 'mirror']);
    expect(await failed({ publicKey: pub, maxAgeMs: 3_600_000 })).toEqual(['signatures', 'age']); // no head signed by the key is left
    expect(await failed({ maxAgeMs: 3_600_000 })).toEqual([]); // its fresh time is only claimed
  });

  it('by someone with the key: the signatures and max-age pass; a head noted after the change, the witness and the mirror catch it', async () => {
    const { h, heads, pub, witnessDir, failed } = await rebuilt({ withKey: true, alsoMirror: false });
    expect(await failed({ publicKey: pub, maxAgeMs: 3_600_000 })).toEqual([]);
    expect(await failed({ head: heads[1] })).toEqual(['head']);
    expect(await failed({ publicKey: pub, witnessDir })).toEqual(['witness']);
    expect(await failed({ mirror: h.mirror, deep: true })).toEqual(['manifest', 'mirror', 'deep']);
  });

  it('with the key, the mirror altered to match: the mirror and --deep pass too; only a noted head and the witness catch it', async () => {
    const { h, heads, pub, witnessDir, failed } = await rebuilt({ withKey: true, alsoMirror: true });
    expect(await failed({ mirror: h.mirror, deep: true, publicKey: pub, maxAgeMs: 3_600_000 })).toEqual([]);
    expect(await failed({ mirror: h.mirror, head: heads[1] })).toEqual(['head']);
    expect(await failed({ mirror: h.mirror, witnessDir, publicKey: pub })).toEqual(['witness']);
  });

  it('a record appended by someone without the key (a forged newest record, the manifest moved to it): the archive alone, a noted head and the witness pass; the signatures and the mirror catch it', async () => {
    const dir = tempDir();
    generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'));
    const pub = loadPublicKey(path.join(dir, 'k.pub'));
    const witnessDir = tempDir();
    const { h, heads } = await archive({ signWith: path.join(dir, 'k.key'), witnessDir });
    const r8 = readRecord(h, 8);
    const forged = sealRecord({ ...r8, batch_id: 9, first_seq: r8.last_seq + 1, last_seq: r8.last_seq + 1, files: [], prev: { batch_id: 8, hash: r8.hash } });
    fs.writeFileSync(abs(h, rec(9)), renderRecord(forged));
    overwrite(abs(h, 'manifest.json'), renderManifest(sealHead(manifestOf(await h.mirror.mirrorId(), forged, forged.last_seq, new Date().toISOString()))));
    const failed = async (v: Omit<VerifyOptions, 'exportDir'>) =>
      (await verifyArchive({ exportDir: h.exportDir, ...v }))
        .checks.filter((c) => c.status === 'failed')
        .map((c) => c.name);
    expect(await failed({ head: heads[3], witnessDir })).toEqual([]);
    expect(await failed({ publicKey: pub })).toEqual(['signatures']);
    expect(await failed({ mirror: h.mirror })).toEqual(['manifest', 'mirror']);
  });
});
