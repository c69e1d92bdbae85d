/**
 * The signed head and its witness (src/export/head.ts, src/export/witness.ts): every publication
 * re-signs `manifest.json` with the time; every publication that moves the head appends it, signed,
 * to `<witness dir>/<mirror id>.heads.jsonl`, once (a batch re-published after a crash between the
 * append and the mirror's record is not witnessed twice); a missing witness directory fails
 * publication and loses nothing; `verifyArchive` reads the witness (order, mirror, signatures,
 * malformed lines by number) and measures the newest signed head's age with an injected clock.
 * Real files, real SQLite, the real fake over HTTP.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { ExportError, RunError } from '../src/errors.js';
import { publishChanges } from '../src/export/exporter.js';
import { checkHeadSignature, parseSignedHead, renderHeadLine, sealHead, type SignedHead } from '../src/export/head.js';
import { generateKeyPair, loadPublicKey, loadSigningKey, type PublicKey, type SigningKey } from '../src/export/signing.js';
import { verifyArchive, type VerifyOptions } from '../src/export/verify.js';
import { appendWitness, readWitnessLines, witnessDirProblem, witnessFile } from '../src/export/witness.js';
import { PRIVATE_MODES, GROUP_READABLE_MODES } from '../src/private-fs.js';
import { syncWorkspace } from '../src/sync/workspace.js';
import { ACCOUNT_ID, harnessPool, snapshotFiles, tempDir, testClock, type Harness } from './helpers.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

/** A key pair in a temp dir. */
function keys(): { signing: SigningKey; pub: PublicKey; pubFile: string } {
  const dir = tempDir();
  generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'));
  return { signing: loadSigningKey(path.join(dir, 'k.key')), pub: loadPublicKey(path.join(dir, 'k.pub')), pubFile: path.join(dir, 'k.pub') };
}

/** The witness file's lines, parsed (throws on a malformed one). */
async function witnessed(dir: string, h: Harness): Promise<SignedHead[]> {
  return fs
    .readFileSync(witnessFile(dir, await h.mirror.mirrorId()), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => {
      const p = parseSignedHead(JSON.parse(l));
      if (!p.ok) throw new Error(p.why);
      return p.head;
    });
}

const manifestOf = (h: Harness): SignedHead => JSON.parse(fs.readFileSync(path.join(h.exportDir, 'manifest.json'), 'utf8')) as SignedHead;
const check = (h: Harness, o: Omit<VerifyOptions, 'exportDir'> = {}) => verifyArchive({ exportDir: h.exportDir, ...o });
const statusOf = (r: Awaited<ReturnType<typeof check>>, name: string) => r.checks.find((c) => c.name === name)!;

describe('the witness, as publication writes it', () => {
  it('every publication that moves the head appends it once, signed, to a private file; re-signing an unchanged head appends nothing; verify --witness passes', async () => {
    const { signing, pub } = keys();
    const wdir = tempDir();
    const clock = testClock({ start: Date.UTC(2026, 10, 25, 9), sleep: 'advance' });
    const ws = FakeWorkspace.fromCounts([5, 40]);
    const h = await pool.start({ workspace: ws, clock });
    for (let i = 0; i < 3; i++) {
      await h.sync({ signingKey: signing, witnessDir: wdir });
      ws.appendMessages(ws.list()[1]!.id, 2);
      clock.advance(15 * 60_000);
    }
    const file = witnessFile(wdir, await h.mirror.mirrorId());
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(fs.readdirSync(wdir)).toEqual([path.basename(file)]);
    const entries = await h.mirror.ledgerEntries();
    expect(entries).toHaveLength(6); // each run: its changes, then its own run line
    const heads = await witnessed(wdir, h);
    // One line per record, in order, each this mirror's head as it was, signed by the key.
    expect(heads.map((x) => `${x.head!.batch_id}:${x.head!.hash}`)).toEqual(entries.map((e) => `${e.batch_id}:${e.hash}`));
    for (const x of heads) expect(checkHeadSignature(x, pub)).toBe('valid');
    // The line is the manifest's signed head, byte for byte as a compact line.
    const manifest = manifestOf(h);
    expect(renderHeadLine(manifest).equals(renderHeadLine(heads.at(-1)!))).toBe(true);
    expect(fs.readFileSync(file, 'utf8').endsWith(renderHeadLine(manifest).toString('utf8'))).toBe(true);

    // Nothing new: the manifest is re-signed with the new time, the witness gets no line.
    clock.advance(60 * 60_000);
    const bytes = fs.readFileSync(file);
    await publishChanges(h.mirror, { exportDir: h.exportDir, clock, signingKey: signing, witnessDir: wdir });
    expect(fs.readFileSync(file).equals(bytes)).toBe(true);
    expect(manifestOf(h)).toMatchObject({ head: manifest.head, signed_at: new Date(clock.now()).toISOString() });
    expect(checkHeadSignature(manifestOf(h), pub)).toBe('valid');

    const report = await check(h, { mirror: h.mirror, publicKey: pub, witnessDir: wdir, clock });
    expect(report.problems).toEqual([]);
    expect(statusOf(report, 'witness')).toEqual({
      name: 'witness',
      status: 'ok',
      detail: `6 heads witnessed in ${file}, signed by ${pub.keyId}; the newest, ${entries.at(-1)!.batch_id}:${entries.at(-1)!.hash} (signed ${heads.at(-1)!.signed_at}), and everything before it are in this archive, unbroken and unchanged`,
    });
    expect(report.verdict).toMatch(/^archive intact: 6 records, /);
  });

  it('group-readable publication creates it 0640; an existing file keeps its mode; a witness set on an existing archive is given the current head at the next publication', async () => {
    const wdir = tempDir();
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([3]) });
    await h.sync();
    expect(fs.readdirSync(wdir)).toEqual([]);
    await publishChanges(h.mirror, { exportDir: h.exportDir, witnessDir: wdir, modes: GROUP_READABLE_MODES });
    const file = witnessFile(wdir, await h.mirror.mirrorId());
    expect(fs.statSync(file).mode & 0o777).toBe(0o640);
    expect((await witnessed(wdir, h)).map((x) => x.head)).toEqual([{ ...(await h.mirror.ledgerHead()), record: manifestOf(h).head!.record }]);
    fs.chmodSync(file, 0o600);
    await publishChanges(h.mirror, { exportDir: h.exportDir, witnessDir: wdir, modes: GROUP_READABLE_MODES });
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(await witnessed(wdir, h)).toHaveLength(1);
  });

  it('a crash between the mirror\'s record and the witness append: the witness and the manifest never show a head the mirror has not recorded, and the next publication witnesses it once', async () => {
    const { signing, pub } = keys();
    const wdir = tempDir();
    const ws = FakeWorkspace.fromCounts([6, 30]);
    const h = await pool.start({ workspace: ws });
    await h.sync({ signingKey: signing, witnessDir: wdir });
    const before = (await witnessed(wdir, h)).length;
    ws.appendMessages(ws.list()[1]!.id, 3);
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    class Crash extends Error {}
    const manifestBefore = fs.readFileSync(path.join(h.exportDir, 'manifest.json'));
    // A crash before the mirror records the batch: nothing witnessed, the batch still planned.
    await expect(publishChanges(h.mirror, {
        exportDir: h.exportDir,
        signingKey: signing,
        witnessDir: wdir,
        failpoint: (p) => {
          if (p === 'before-record') throw new Crash();
        },
      })).rejects.toThrow(Crash);
    const pending = (await h.mirror.pendingExportBatch())!;
    expect(pending).toBeDefined();
    expect(await witnessed(wdir, h)).toHaveLength(before);
    // Re-published, then a crash once the mirror recorded it, before the witness line and manifest.
    await expect(publishChanges(h.mirror, {
        exportDir: h.exportDir,
        signingKey: signing,
        witnessDir: wdir,
        failpoint: (p) => {
          if (p === 'before-head') throw new Crash();
        },
      })).rejects.toThrow(Crash);
    expect(await h.mirror.pendingExportBatch()).toBeUndefined();
    expect((await h.mirror.ledgerHead())!.batch_id).toBe(pending);
    expect(await witnessed(wdir, h)).toHaveLength(before);
    expect(fs.readFileSync(path.join(h.exportDir, 'manifest.json')).equals(manifestBefore)).toBe(true);
    // The next publication (nothing new to publish) witnesses the recorded head and publishes it.
    const res = await publishChanges(h.mirror, { exportDir: h.exportDir, signingKey: signing, witnessDir: wdir });
    expect(res.files).toEqual([]);
    const afterCrash = await witnessed(wdir, h);
    expect(afterCrash).toHaveLength(before + 1);
    expect(await h.mirror.ledgerHead()).toEqual({ batch_id: pending, hash: afterCrash.at(-1)!.head!.hash });
    // The same head (same batch and hash) is not appended again: one line per head.
    const heads = await witnessed(wdir, h);
    expect(heads).toHaveLength(before + 1);
    expect(heads.map((x) => x.head!.batch_id)).toEqual((await h.mirror.ledgerEntries()).map((e) => e.batch_id));
    expect((await check(h, { mirror: h.mirror, publicKey: pub, witnessDir: wdir, deep: true })).problems).toEqual([]);
  });

  it('a missing witness directory fails publication naming CONVO_MIRROR_WITNESS_DIR and the path, writing nothing; one removed mid-publication fails it before the manifest shows the new head; the next publication with it present witnesses that head', async () => {
    const ws = FakeWorkspace.fromCounts([6, 30]);
    const h = await pool.start({ workspace: ws });
    await h.sync();
    const wdir = path.join(tempDir(), 'witness');
    ws.appendMessages(ws.list()[1]!.id, 3);
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    const before = snapshotFiles(h.exportDir);
    let err: unknown;
    try {
      await publishChanges(h.mirror, { exportDir: h.exportDir, witnessDir: wdir });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ExportError);
    expect((err as Error).message).toBe(`CONVO_MIRROR_WITNESS_DIR: the witness directory ${wdir} does not exist (it must be another disk or mount, made beforehand: convo-mirror never creates it)`);
    expect(snapshotFiles(h.exportDir)).toEqual(before);
    expect(fs.existsSync(wdir)).toBe(false);
    expect(await h.mirror.pendingExportBatch()).toBeUndefined();

    // Present at the start, gone before the head is witnessed (the disk unmounted): the batch is
    // published and recorded, the publication fails before the manifest shows its head; the next
    // publication with the directory present witnesses that head.
    fs.mkdirSync(wdir);
    const manifestBefore = fs.readFileSync(path.join(h.exportDir, 'manifest.json'));
    await expect(publishChanges(h.mirror, {
        exportDir: h.exportDir,
        witnessDir: wdir,
        failpoint: (p) => {
          if (p === 'before-ledger') fs.rmSync(wdir, { recursive: true });
        },
      })).rejects.toThrow(/^CONVO_MIRROR_WITNESS_DIR: the witness directory .* does not exist/);
    expect(await h.mirror.pendingExportBatch()).toBeUndefined();
    const planned = (await h.mirror.ledgerHead())!.batch_id;
    expect(fs.readFileSync(path.join(h.exportDir, 'manifest.json')).equals(manifestBefore)).toBe(true);
    const record = fs.readFileSync(path.join(h.exportDir, '_ledger', `${String(planned).padStart(12, '0')}.json`));
    fs.mkdirSync(wdir);
    const res = await publishChanges(h.mirror, { exportDir: h.exportDir, witnessDir: wdir });
    expect(res.files).toEqual([]);
    expect((await h.mirror.ledgerHead())!.batch_id).toBe(planned);
    expect(fs.readFileSync(path.join(h.exportDir, '_ledger', `${String(planned).padStart(12, '0')}.json`)).equals(record)).toBe(true);
    expect((await witnessed(wdir, h)).map((x) => x.head!.batch_id)).toEqual([planned]);
    expect((await check(h, { mirror: h.mirror, witnessDir: wdir, deep: true })).problems).toEqual([]);

    // Through a run: the run fails on that error, and nothing it mirrored is lost.
    ws.appendMessages(ws.list()[0]!.id, 1);
    fs.rmSync(wdir, { recursive: true });
    const failed = await h.sync({ witnessDir: wdir }).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(RunError);
    expect((failed as Error).message).toMatch(/CONVO_MIRROR_WITNESS_DIR: the witness directory .* does not exist/);
    fs.mkdirSync(wdir);
    await h.sync({ witnessDir: wdir });
    expect((await check(h, { mirror: h.mirror, witnessDir: wdir, deep: true })).problems).toEqual([]);
  });

  it('witnessDirProblem, for check: missing, a file, unwritable (as another user: skipped as root), a witness file that is not a regular file', () => {
    const d = tempDir();
    expect(witnessDirProblem(d)).toBeUndefined();
    expect(witnessDirProblem(path.join(d, 'nope'))).toMatch(/^CONVO_MIRROR_WITNESS_DIR: the witness directory .*nope does not exist/);
    fs.writeFileSync(path.join(d, 'f'), '');
    expect(witnessDirProblem(path.join(d, 'f'))).toBe(`CONVO_MIRROR_WITNESS_DIR: the witness directory ${path.join(d, 'f')} is not a directory`);
    fs.mkdirSync(path.join(d, 'abc.heads.jsonl'));
    expect(witnessDirProblem(d, 'abc')).toBe(`CONVO_MIRROR_WITNESS_DIR: the witness file ${path.join(d, 'abc.heads.jsonl')} is not a regular file`);
    expect(() => witnessFile(d, '../x')).toThrow(/cannot name a witness file/);
  });

  it('a line cut short by a crash stays a line of its own: the next head starts a new line, and verify names the cut line by number', async () => {
    const wdir = tempDir();
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([3]) });
    await h.sync({ witnessDir: wdir });
    const file = witnessFile(wdir, await h.mirror.mirrorId());
    const n = (await witnessed(wdir, h)).length;
    fs.appendFileSync(file, '{"format":"convo-mirror-exp');
    h.fake.workspace.appendMessages(h.fake.workspace.list()[0]!.id, 1);
    await h.sync({ witnessDir: wdir });
    const lines = fs.readFileSync(file, 'utf8').split('\n');
    expect(lines[n]).toBe('{"format":"convo-mirror-exp');
    expect(parseSignedHead(JSON.parse(lines[n + 1]!)).ok).toBe(true);
    expect((await check(h, { mirror: h.mirror, witnessDir: wdir })).problems).toEqual([{ path: `${file}:${n + 1}`, problem: 'witness', detail: 'malformed line: not JSON' }]);
  });

  it('reading is bounded: a line over 64 KiB is named, not parsed, and the lines after it are still read', async () => {
    const wdir = tempDir();
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([3]) });
    await h.sync({ witnessDir: wdir });
    const file = witnessFile(wdir, await h.mirror.mirrorId());
    const good = fs.readFileSync(file, 'utf8').trimEnd().split('\n').at(-1)!;
    fs.appendFileSync(file, `${'x'.repeat(70 * 1024)}\n${good}\n`);
    const n = fs.readFileSync(file, 'utf8').trimEnd().split('\n').length;
    const report = await check(h, { mirror: h.mirror, witnessDir: wdir });
    expect(report.problems).toEqual([{ path: `${file}:${n - 1}`, problem: 'witness', detail: 'malformed line: longer than 65536 bytes: not a signed head' }]);
    expect(report.newestSignedHead?.source).toBe('manifest.json');
  });
});

describe('verify --witness: what it proves', () => {
  /** Four runs (eight records) witnessed and signed; the key, the witness directory and file. */
  async function witnessedArchive() {
    const k = keys();
    const wdir = tempDir();
    const ws = FakeWorkspace.fromCounts([5, 40, 3]);
    const h = await pool.start({ workspace: ws });
    for (let i = 0; i < 4; i++) {
      await h.sync({ signingKey: k.signing, witnessDir: wdir });
      ws.appendMessages(ws.list()[i % 3]!.id, 2);
    }
    return { ...k, wdir, h, file: witnessFile(wdir, await h.mirror.mirrorId()) };
  }
  it('the newest records removed and the manifest restored: the witness names the witnessed head, the chain end and the records removed', async () => {
    const { h, wdir, file, pub } = await witnessedArchive();
    const entries = await h.mirror.ledgerEntries();
    const keep = entries[3]!;
    for (const e of entries.slice(4)) {
      const r = JSON.parse(fs.readFileSync(path.join(h.exportDir, e.path), 'utf8')) as { files: { path: string }[] };
      for (const f of r.files) fs.rmSync(path.join(h.exportDir, f.path));
      fs.rmSync(path.join(h.exportDir, e.path));
    }
    const early = (await witnessed(wdir, h))[3]!;
    fs.chmodSync(path.join(h.exportDir, 'manifest.json'), 0o600);
    fs.writeFileSync(path.join(h.exportDir, 'manifest.json'), JSON.stringify(early, null, 2) + '\n');
    // The archive alone, and its signatures, say nothing is wrong.
    expect((await check(h, { publicKey: pub })).problems).toEqual([]);
    const newest = (await witnessed(wdir, h)).at(-1)!;
    const found = await check(h, { publicKey: pub, witnessDir: wdir });
    expect(found.problems).toEqual([
      {
        path: `${file}:8`,
        problem: 'witness',
        detail: `the witness saw head 8:${newest.head!.hash} (signed ${newest.signed_at}), but this archive's chain ends at 4:${keep.hash}: records 5–8 were removed`,
      },
    ]);
    expect(found.verdict).toBe('NOT intact: witness FAILED (1 problem); everything else ok or skipped');
  });

  it('a publication while verify runs raises no witness alarm: the witness is sized before the archive is read', async () => {
    const { h, wdir, signing, pub } = await witnessedArchive();
    h.fake.workspace.appendMessages(h.fake.workspace.list()[0]!.id, 2);
    // Commit the changes now; publish them (a new record, then its witness line) after verify has
    // read the archive's chain and before it reads the witness.
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    const report = await check(h, {
      publicKey: pub,
      witnessDir: wdir,
      failpoint: async () => {
        await publishChanges(h.mirror, { exportDir: h.exportDir, signingKey: signing, witnessDir: wdir });
      },
    });
    // The witness says nothing is missing (its ninth head came after the chain was read). The
    // batch landing mid-verification shows elsewhere, as on any live archive: its files are not
    // yet listed by a record this verification read, and the manifest points past it.
    expect(report.problems.filter((p) => p.problem === 'witness')).toEqual([]);
    expect(report.problems.map((p) => p.problem).sort()).toEqual(['manifest', 'unlisted', 'unlisted']);
    expect(report.records).toBe(8);
    expect(await witnessed(wdir, h)).toHaveLength(9);
  });

  it('a line being appended when the witness was sized is left out, not called cut short', () => {
    const dir = tempDir();
    const file = path.join(dir, 'w.heads.jsonl');
    const head = sealHead({ format: 'convo-mirror-exports', version: 3, mirror_id: 'a'.repeat(32), watermark: 10, ledger: '_ledger', head: { batch_id: 2, hash: 'b'.repeat(64), record: '_ledger/000000000002.json' }, signed_at: '2026-11-25T10:00:00.000Z' });
    const line = renderHeadLine(head);
    fs.writeFileSync(file, Buffer.concat([line, line]));
    // Sized in the middle of the second line: one head; the whole file: two.
    expect([...readWitnessLines(file, { upTo: line.length + 10 })]).toEqual([{ line: 1, head }]);
    expect([...readWitnessLines(file)].map((l) => ('head' in l ? l.line : l.why))).toEqual([1, 2]);
  });

  it('a byte changed in a file a witnessed head covers: the witness says which batch broke', async () => {
    const { h, wdir, file } = await witnessedArchive();
    const r2 = JSON.parse(fs.readFileSync(path.join(h.exportDir, '_ledger', '000000000002.json'), 'utf8')) as { files: { path: string }[] };
    const target = path.join(h.exportDir, r2.files[0]!.path);
    const bytes = fs.readFileSync(target);
    bytes[0] = bytes[0]! ^ 0x20;
    fs.chmodSync(target, 0o600);
    fs.writeFileSync(target, bytes);
    const newest = (await witnessed(wdir, h)).at(-1)!;
    const found = (await check(h, { witnessDir: wdir })).problems.filter((p) => p.problem === 'witness');
    expect(found).toEqual([
      { path: `${file}:8`, problem: 'witness', detail: `the witness saw head 8:${newest.head!.hash} (signed ${newest.signed_at}); it is in this archive's chain, but batch 2 before it is broken or its files changed` },
    ]);
  });

  it('a record replaced, heads out of order, a fork, a line of another mirror, a forged or missing signature, a malformed line: each named by line', async () => {
    const { h, wdir, file, pub, signing } = await witnessedArchive();
    const lines = fs.readFileSync(file, 'utf8').split('\n').filter(Boolean);
    const heads = lines.map((l) => JSON.parse(l) as SignedHead);
    const other = keys();
    const forged = { ...heads[2]!, signature: sealHead(heads[2]!, other.signing).signature! };
    const add = [
      JSON.stringify(heads[2]), // 9: heads went backwards
      JSON.stringify(sealHead({ ...heads[7]!, head: { ...heads[7]!.head!, hash: 'a'.repeat(64) } }, signing)), // 10: a fork of batch 8, and not the archive's record
      JSON.stringify(sealHead({ ...heads[7]!, mirror_id: 'f'.repeat(32) }, signing)), // 11: another mirror
      JSON.stringify(forged), // 12: another key
      JSON.stringify({ ...heads[7], signature: undefined }), // 13: unsigned
      '{"not": "a head"}', // 14
    ];
    fs.appendFileSync(file, add.join('\n') + '\n');
    const problems = (await check(h, { mirror: h.mirror, publicKey: pub, witnessDir: wdir })).problems;
    expect(problems.map((p) => `${p.path.slice(file.length)} ${p.problem}`)).toEqual([
      ':9 witness',
      ':10 witness',
      ':10 witness',
      ':11 witness',
      ':12 signature',
      ':12 witness',
      ':13 unsigned',
      ':14 witness',
    ]);
    expect(problems[0]!.detail).toMatch(/^head 3:[0-9a-f]{64} \(signed .*\) comes after head 8:[0-9a-f]{64}: the witnessed heads went backwards/);
    expect(problems[1]!.detail).toBe(`a second head for batch 8: ${'a'.repeat(64)}, after ${heads[7]!.head!.hash} (line 8): the chain forked`);
    expect(problems[2]).toMatchObject({ found: `record 8 hashes to ${heads[7]!.head!.hash}`, detail: 'the record was replaced since the witness saw it' });
    expect(problems[3]!.detail).toBe(`a head of mirror ${'f'.repeat(32)}, not ${(await h.mirror.mirrorId())}`);
    expect(problems[4]!.detail).toMatch(new RegExp(`^witnessed head 3:[0-9a-f]{64}: signed by key ${other.pub.keyId}, not ${pub.keyId}$`));
    expect(problems[7]!.detail).toBe('malformed line: format: Invalid input: expected "convo-mirror-exports"');
  });

  it('a witness file of another mirror only, or none: named, not passed', async () => {
    const { h, wdir, file } = await witnessedArchive();
    fs.renameSync(file, path.join(wdir, `${'0'.repeat(32)}.heads.jsonl`));
    expect((await check(h, { witnessDir: wdir })).problems).toEqual([
      { path: file, problem: 'witness', detail: `no witness file for mirror ${(await h.mirror.mirrorId())}: the witness never saw this mirror (another --witness directory, or the publisher runs without CONVO_MIRROR_WITNESS_DIR)` },
    ]);
  });
});

describe("the signed head's age", () => {
  it('is measured with the injected clock, authenticated with the public key, only claimed without; --max-age fails an older head', async () => {
    const { signing, pub } = keys();
    const clock = testClock({ start: Date.UTC(2026, 10, 25, 10), sleep: 'advance' });
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([4, 12]), clock });
    await h.sync({ signingKey: signing });
    const signedAt = manifestOf(h).signed_at;
    const head = (await h.mirror.ledgerHead())!;
    const later = testClock({ start: Date.parse(signedAt) + 2 * 3_600_000 + 5 * 60_000 });
    const claimed = await check(h, { clock: later });
    expect(statusOf(claimed, 'age')).toEqual({
      name: 'age',
      status: 'ok',
      detail: `the newest signed head, ${head.batch_id}:${head.hash} (manifest.json), was signed 2 h 5 min ago, at ${signedAt}; that time is only claimed: not authenticated without --public-key`,
    });
    expect(claimed.newestSignedHead).toEqual({ head, signed_at: signedAt, age_ms: 2 * 3_600_000 + 5 * 60_000, authenticated: false, source: 'manifest.json' });
    const auth = await check(h, { clock: later, publicKey: pub, maxAgeMs: 3 * 3_600_000 });
    expect(statusOf(auth, 'age').detail).toBe(
      `the newest signed head, ${head.batch_id}:${head.hash} (manifest.json), was signed 2 h 5 min ago, at ${signedAt}; that time is authenticated: signed by ${pub.keyId}; within --max-age 3 h`,
    );
    expect(auth.problems).toEqual([]);
    const stale = await check(h, { clock: later, publicKey: pub, maxAgeMs: 2 * 3_600_000 });
    expect(stale.problems).toEqual([
      {
        path: 'manifest.json',
        problem: 'age',
        detail: `the newest signed head, ${head.batch_id}:${head.hash} (manifest.json), was signed 2 h 5 min ago, at ${signedAt}; that time is authenticated: signed by ${pub.keyId}: older than --max-age 2 h; the publisher has not vouched for this archive since (stopped publishing, or the archive was rolled back to an older signed head)`,
      },
    ]);
    expect(stale.verdict).toBe('NOT intact: age FAILED (1 problem); everything else ok or skipped');
    // Another key: no head is authenticated, so no age can be vouched for.
    const other = keys();
    expect((await check(h, { clock: later, publicKey: other.pub, maxAgeMs: 3 * 3_600_000 })).problems.filter((p) => p.problem === 'age')).toEqual([
      { path: 'manifest.json', problem: 'age', detail: `no signed head verified with ${other.pub.keyId}: how old this archive's head is cannot be told; --max-age 3 h cannot be met` },
    ]);
    // A head signed well in the future fails --max-age; without it, the age line says so.
    const past = testClock({ start: Date.parse(signedAt) - 3_600_000 });
    expect(statusOf(await check(h, { clock: past }), 'age').detail).toMatch(/was signed 1 h in the future, at /);
    expect((await check(h, { clock: past, maxAgeMs: 60_000 })).problems).toEqual([{ path: 'manifest.json', problem: 'age', detail: expect.stringMatching(/a time in the future; the publisher's clock, or this one, is wrong$/) }]);
  });

  it('the newest of the manifest and the witness counts; a daemon re-signing an unchanged head keeps it fresh', async () => {
    const wdir = tempDir();
    const clock = testClock({ start: Date.UTC(2026, 10, 25, 10), sleep: 'advance' });
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([4]), clock });
    await h.sync({ witnessDir: wdir });
    clock.advance(24 * 3_600_000);
    const day = await check(h, { clock, witnessDir: wdir, maxAgeMs: 3_600_000 });
    expect(day.problems.map((p) => p.problem)).toEqual(['age']);
    await publishChanges(h.mirror, { exportDir: h.exportDir, clock, witnessDir: wdir });
    const fresh = await check(h, { clock, witnessDir: wdir, maxAgeMs: 3_600_000 });
    expect(fresh.problems).toEqual([]);
    expect(fresh.newestSignedHead).toMatchObject({ age_ms: 0, source: 'manifest.json' });
    // The manifest rolled back to a copy signed long ago: the witness's newest line is the newest signed head.
    const lines = await witnessed(wdir, h);
    const old = { ...manifestOf(h), signed_at: '2026-01-01T00:00:00.000Z' };
    fs.chmodSync(path.join(h.exportDir, 'manifest.json'), 0o600);
    fs.writeFileSync(path.join(h.exportDir, 'manifest.json'), JSON.stringify(old, null, 2) + '\n');
    expect((await check(h, { clock, witnessDir: wdir })).newestSignedHead).toMatchObject({ signed_at: lines.at(-1)!.signed_at, source: `${witnessFile(wdir, await h.mirror.mirrorId())}:${lines.length}` });
  });
});

describe('--signed-from', () => {
  it('an archive signed from batch N on: without it, one problem suggesting --signed-from N; with it, the unsigned prefix accepted and reported; a later unsigned record still fails', async () => {
    const { signing, pub } = keys();
    const ws = FakeWorkspace.fromCounts([5, 20]);
    const h = await pool.start({ workspace: ws });
    await h.sync();
    ws.appendMessages(ws.list()[0]!.id, 1);
    await h.sync();
    ws.appendMessages(ws.list()[1]!.id, 1);
    await h.sync({ signingKey: signing });
    ws.appendMessages(ws.list()[1]!.id, 1);
    await h.sync({ signingKey: signing });
    expect((await h.mirror.ledgerEntries()).map((e) => e.key_id === null)).toEqual([true, true, true, true, false, false, false, false]);
    expect((await check(h, { publicKey: pub })).problems).toEqual([
      {
        path: '_ledger',
        problem: 'unsigned',
        detail: 'records 1–4 were published without a signing key, and every record from batch 5 on is signed: if signing began at batch 5, accept the unsigned ones with --signed-from 5',
      },
    ]);
    const from5 = await check(h, { publicKey: pub, signedFrom: 5 });
    expect(from5.problems).toEqual([]);
    expect(statusOf(from5, 'signatures').detail).toBe(`records 1–4 unsigned (accepted by --signed-from 5), records 5–8 signed by ${pub.keyId}; the head pointer signed by it`);
    // Claiming signing began earlier than it did: the unsigned records from there on are named.
    expect((await check(h, { publicKey: pub, signedFrom: 3 })).problems).toEqual([3, 4].map((id) => ({ path: rec(id), problem: 'unsigned', detail: 'published without a signing key (from --signed-from 3 on, every record must be signed)' })));
    // A record published unsigned after signing began is never part of an accepted prefix.
    ws.appendMessages(ws.list()[0]!.id, 1);
    await h.sync();
    expect((await check(h, { publicKey: pub, signedFrom: 5 })).problems.map((p) => `${p.problem} ${p.path}`)).toEqual(['unsigned _ledger/000000000009.json', 'unsigned _ledger/000000000010.json', 'unsigned manifest.json']);
  });
  const rec = (id: number) => `_ledger/${String(id).padStart(12, '0')}.json`;
});

describe('appendWitness on its own', () => {
  it('appends whole lines with O_APPEND and never rewrites: a line edited by hand stays, the same head after it is appended again', () => {
    const d = tempDir();
    const head = sealHead({ format: 'convo-mirror-exports', version: 3, mirror_id: 'a'.repeat(32), watermark: 10, ledger: '_ledger', head: { batch_id: 2, hash: 'b'.repeat(64), record: '_ledger/000000000002.json' }, signed_at: '2026-11-25T10:00:00.000Z' });
    expect(appendWitness(d, head, PRIVATE_MODES)).toBe('appended');
    expect(appendWitness(d, { ...head, signed_at: '2026-11-25T11:00:00.000Z' }, PRIVATE_MODES)).toBe('already-witnessed');
    const file = witnessFile(d, head.mirror_id);
    fs.appendFileSync(file, 'edited by hand\n');
    expect(appendWitness(d, head, PRIVATE_MODES)).toBe('appended');
    expect(fs.readFileSync(file, 'utf8').split('\n')).toEqual([renderHeadLine(head).toString().trimEnd(), 'edited by hand', renderHeadLine(head).toString().trimEnd(), '']);
  });
});
