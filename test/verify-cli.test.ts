/**
 * `convo-mirror verify` as an auditor runs it: the built CLI in a child process, against export
 * directories a real sync wrote (the in-process fake over HTTP, or `convo-mirror sync` itself):
 * problem lines that name what was expected and what was found, one verdict per check, a last line
 * that never says intact when a check failed; what `--public-key`, `--witness` and `--max-age` each
 * catch when the newest records are removed and the manifest rewritten or restored; `--signed-from`;
 * a private key given as public; `CONVO_MIRROR_WITNESS_DIR` through `sync`.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { generateKeyPair, loadPublicKey, loadSigningKey } from '../src/export/signing.js';
import { witnessFile } from '../src/export/witness.js';
import type { LedgerRecord } from '../src/export/ledger.js';
import { assertBuilt, killLeftovers, run, type Ran } from './children.js';
import { cliEnv, harnessPool, ledgerFiles, linesMerkleRoot, tempDir, testClock, withMirror, type Harness } from './helpers.js';

const pool = harnessPool();
afterEach(async () => {
  await killLeftovers();
  await pool.closeAll();
});
beforeAll(assertBuilt);

const HOUR = 3_600_000;

/** A key pair's files in a temp dir. */
function keyFiles(): { key: string; pub: string } {
  const dir = tempDir();
  generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'));
  return { key: path.join(dir, 'k.key'), pub: path.join(dir, 'k.pub') };
}

/** `verify` on `exportDir`, with the mirror at `db` (absent: verified without the database). */
function verify(args: string[], exportDir: string, db?: string): Promise<Ran> {
  return run(['verify', ...args], { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', CONVO_MIRROR_DB: db ?? path.join(tempDir(), 'absent.sqlite'), CONVO_MIRROR_EXPORT_DIR: exportDir });
}

const lastLine = (out: string): string => out.trimEnd().split('\n').at(-1)!;
const record = (dir: string, id: number): LedgerRecord => JSON.parse(fs.readFileSync(path.join(dir, '_ledger', `${String(id).padStart(12, '0')}.json`), 'utf8')) as LedgerRecord;
/** Writes over a published (read-only) file, as someone with the owner's rights would. */
function overwrite(file: string, data: Buffer | string): void {
  fs.chmodSync(file, 0o600);
  fs.writeFileSync(file, data);
}

/** Runs `n` syncs of `h`, changing the workspace between them. */
async function syncs(h: Harness, n: number, o: Parameters<Harness['sync']>[0] = {}): Promise<void> {
  const ws = h.fake.workspace;
  for (let i = 0; i < n; i++) {
    await h.sync(o);
    ws.appendMessages(ws.list()[i % ws.list().length]!.id, 2);
  }
}

describe('a one-byte change', () => {
  it('names the file with the SHA-256 and the Merkle root of its lines found and the ones expected, in full; every check has its verdict; the last line says NOT intact', async () => {
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([5, 40]) });
    await syncs(h, 2);
    const head = (await h.mirror.ledgerHead())!;
    const target = ledgerFiles(h.exportDir).find((f) => f.stream === 'messages')!;
    const file = path.join(h.exportDir, target.path);
    const bytes = fs.readFileSync(file);
    const at = Math.floor(bytes.length / 2);
    bytes[at] = bytes[at]! ^ 0x01;
    overwrite(file, bytes);
    const found = crypto.createHash('sha256').update(bytes).digest('hex');
    const foundRoot = linesMerkleRoot(bytes);
    const batch = (JSON.parse(fs.readFileSync(path.join(h.exportDir, '_ledger', fs.readdirSync(path.join(h.exportDir, '_ledger')).find((n) => fs.readFileSync(path.join(h.exportDir, '_ledger', n), 'utf8').includes(target.path))!), 'utf8')) as { batch_id: number }).batch_id;
    const rootDetail = `the Merkle tree hash of its ${target.lines} lines is not the one the record of batch ${batch} (_ledger/${String(batch).padStart(12, '0')}.json) commits to: a line was changed, added, removed or moved`;

    const r = await verify(['--head', `${head.batch_id}:${head.hash}`], h.exportDir, h.dbPath);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr.split('\n')).toContain(`problem: ${target.path}: sha256 found ${found}, expected ${target.sha256}`);
    expect(r.stderr.split('\n')).toContain(`problem: ${target.path}: merkle_root found ${foundRoot}, expected ${target.merkle_root} (${rootDetail})`);
    expect(r.stderr).toMatch(new RegExp(`^problem: _ledger/\\d{12}\\.json: head \\(head ${head.batch_id}:${head.hash} is in the chain, but batch 1 before it is broken or its files changed\\)$`, 'm'));
    expect(r.stdout).toMatch(/^FAIL files: 2 problems$/m);
    expect(r.stdout).toMatch(/^ok   chain: 4 records, chained from genesis to head /m);
    expect(lastLine(r.stdout)).toBe('NOT intact: files FAILED (2 problems), head FAILED (1 problem); everything else ok or skipped');
    expect(r.stdout).not.toMatch(/archive intact|intact up to/);

    const j = await verify(['--json'], h.exportDir, h.dbPath);
    expect(j.code).toBe(1);
    const report = JSON.parse(j.stdout) as { ok: boolean; verdict: string; checks: { name: string; status: string }[]; problems: unknown[] };
    expect(report.ok).toBe(false);
    expect(report.verdict).toBe('NOT intact: files FAILED (2 problems); everything else ok or skipped');
    expect(report.checks.map((c) => `${c.name}:${c.status}`)).toEqual([
      'database:ok', 'chain:ok', 'files:failed', 'unlisted:ok', 'manifest:ok', 'signatures:skipped', 'head:skipped', 'witness:skipped', 'age:ok', 'mirror:ok', 'deep:skipped', 'temp:ok',
    ]);
    expect(report.problems).toEqual([
      { path: target.path, problem: 'sha256', found, expected: target.sha256 },
      { path: target.path, problem: 'merkle_root', found: foundRoot, expected: target.merkle_root, detail: rootDetail },
    ]);
  });
});

describe('the newest records removed and manifest.json rewritten or restored', () => {
  /**
   * A signed, witnessed archive: two runs (records 1–4) signed 3 h ago, two more (5–8) an hour
   * ago; the manifest as it was after the first two runs (signed then, its signature valid); a copy
   * truncated to record 4, its files and records after that removed.
   */
  async function truncated() {
    const keys = keyFiles();
    const signingKey = loadSigningKey(keys.key);
    const wdir = tempDir();
    const clock = testClock({ start: Date.now() - 3 * HOUR, sleep: 'advance' });
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([5, 40, 3]), clock });
    await syncs(h, 2, { signingKey, witnessDir: wdir });
    const early = fs.readFileSync(path.join(h.exportDir, 'manifest.json'));
    const earlyHead = (await h.mirror.ledgerHead())!;
    clock.advance(2 * HOUR);
    await syncs(h, 2, { signingKey, witnessDir: wdir });
    const lateHead = (await h.mirror.ledgerHead())!;
    expect([earlyHead.batch_id, lateHead.batch_id]).toEqual([4, 8]);
    const copy = path.join(tempDir(), 'exports');
    fs.cpSync(h.exportDir, copy, { recursive: true });
    for (let id = 5; id <= 8; id++) {
      for (const f of record(copy, id).files) fs.rmSync(path.join(copy, f.path));
      fs.rmSync(path.join(copy, '_ledger', `${String(id).padStart(12, '0')}.json`));
    }
    return { h, keys, wdir, copy, early, earlyHead, lateHead };
  }

  it('restored from an earlier signed one: --public-key alone passes; --witness and --max-age catch it', async () => {
    const { h, keys, wdir, copy, early, earlyHead, lateHead } = await truncated();
    overwrite(path.join(copy, 'manifest.json'), early);

    const signed = await verify(['--public-key', keys.pub], copy);
    expect(signed.code, signed.stderr).toBe(0);
    expect(signed.stderr).toBe('');
    expect(lastLine(signed.stdout)).toMatch(/^archive intact: 4 records, \d+ files, \d+ lines; head 4:[0-9a-f]{64}; not checked: database, head, witness, mirror, deep \(verified without the database\)$/);
    expect(signed.stdout).toMatch(new RegExp(`^ok   signatures: all 4 records signed by ${loadPublicKey(keys.pub).keyId}; the head pointer signed by it$`, 'm'));

    const witnessed = await verify(['--public-key', keys.pub, '--witness', wdir], copy);
    expect(witnessed.code).toBe(1);
    const file = witnessFile(wdir, await h.mirror.mirrorId());
    const lines = fs.readFileSync(file, 'utf8').trimEnd().split('\n');
    const newest = JSON.parse(lines.at(-1)!) as { signed_at: string };
    expect(witnessed.stderr).toBe(
      `problem: ${file}:8: witness (the witness saw head 8:${lateHead.hash} (signed ${newest.signed_at}), but this archive's chain ends at 4:${earlyHead.hash}: records 5–8 were removed)\n`,
    );
    expect(lastLine(witnessed.stdout)).toBe('NOT intact: witness FAILED (1 problem); everything else ok or skipped (verified without the database)');

    const aged = await verify(['--public-key', keys.pub, '--max-age', '2h'], copy);
    expect(aged.code).toBe(1);
    expect(aged.stderr).toMatch(/^problem: manifest\.json: age \(the newest signed head, 4:[0-9a-f]{64} \(manifest\.json\), was signed 3 h( \d+ min)? ago, at .*; that time is authenticated: signed by sha256:[0-9a-f]{64}: older than --max-age 2 h; the publisher has not vouched for this archive since/);
    expect(lastLine(aged.stdout)).toBe('NOT intact: age FAILED (1 problem); everything else ok or skipped (verified without the database)');
    // --max-age sees only what is older than it: the same copy passes a 4 h limit.
    const window = await verify(['--public-key', keys.pub, '--max-age', '4h'], copy);
    expect(window.code, window.stderr).toBe(0);

    // The original passes all three.
    const whole = await verify(['--public-key', keys.pub, '--witness', wdir, '--max-age', '2h'], h.exportDir, h.dbPath);
    expect(whole.code, whole.stderr).toBe(0);
    expect(whole.stdout).toMatch(/^ok   age: the newest signed head, 8:[0-9a-f]{64} \(manifest\.json\), was signed 1 h( \d+ min)? ago, .*; that time is authenticated: signed by sha256:[0-9a-f]{64}; within --max-age 2 h$/m);
  });

  it('rewritten by someone without the key: --public-key catches the unsigned head pointer, --witness the removed records; --max-age without the key is fooled by the claimed time', async () => {
    const { keys, wdir, copy, early } = await truncated();
    const forged: Record<string, unknown> = { ...(JSON.parse(early.toString('utf8')) as Record<string, unknown>), signed_at: new Date().toISOString() };
    delete forged.signature;
    overwrite(path.join(copy, 'manifest.json'), JSON.stringify(forged, null, 2) + '\n');

    const signed = await verify(['--public-key', keys.pub], copy);
    expect(signed.code).toBe(1);
    expect(signed.stderr).toBe('problem: manifest.json: unsigned (the head pointer carries no signature: written without the signing key (by the publisher without one, or by someone else))\n');
    expect(lastLine(signed.stdout)).toBe('NOT intact: signatures FAILED (1 problem); everything else ok or skipped (verified without the database)');
    const witnessed = await verify(['--witness', wdir], copy);
    expect(witnessed.code).toBe(1);
    expect(witnessed.stderr).toMatch(/: witness \(the witness saw head 8:[0-9a-f]{64} \(signed .*\), but this archive's chain ends at 4:[0-9a-f]{64}: records 5–8 were removed\)\n$/);

    const claimed = await verify(['--max-age', '2h'], copy);
    expect(claimed.code, claimed.stderr).toBe(0);
    expect(claimed.stdout).toMatch(/^ok   age: .*that time is only claimed: not authenticated without --public-key; within --max-age 2 h$/m);
    // With the key, no authenticated head remains: --max-age cannot be met.
    const both = await verify(['--public-key', keys.pub, '--max-age', '2h'], copy);
    expect(both.code).toBe(1);
    expect(both.stderr).toMatch(/^problem: manifest\.json: age \(no signed head verified with sha256:[0-9a-f]{64}: how old this archive's head is cannot be told; --max-age 2 h cannot be met\)$/m);
  });
});

describe('--signed-from', () => {
  it('an archive signed from batch 5 on: refused without it (the line suggests it), accepted and reported with it; without --public-key, exit 2 in one line', async () => {
    const keys = keyFiles();
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([5, 20]) });
    await syncs(h, 2);
    await syncs(h, 2, { signingKey: loadSigningKey(keys.key) });
    const keyId = loadPublicKey(keys.pub).keyId;

    const plain = await verify(['--public-key', keys.pub], h.exportDir, h.dbPath);
    expect(plain.code).toBe(1);
    expect(plain.stderr).toBe(
      'problem: _ledger: unsigned (records 1–4 were published without a signing key, and every record from batch 5 on is signed: if signing began at batch 5, accept the unsigned ones with --signed-from 5)\n',
    );
    const from = await verify(['--public-key', keys.pub, '--signed-from', '5'], h.exportDir, h.dbPath);
    expect(from.code, from.stderr).toBe(0);
    expect(from.stdout).toContain(`ok   signatures: records 1–4 unsigned (accepted by --signed-from 5), records 5–8 signed by ${keyId}; the head pointer signed by it\n`);
    expect(lastLine(from.stdout)).toMatch(/^archive intact: 8 records, /);

    const alone = await verify(['--signed-from', '5'], h.exportDir, h.dbPath);
    expect(alone.code).toBe(2);
    expect(alone.stdout).toBe('');
    expect(alone.stderr).toBe('convo-mirror: configuration error: --signed-from: needs --public-key: it says from which batch on every record must be signed by that key\n');
    const bad = await verify(['--public-key', keys.pub, '--signed-from', 'five'], h.exportDir, h.dbPath);
    expect(bad.code).toBe(2);
    expect(bad.stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(bad.stderr).toMatch(/^convo-mirror: configuration error: --signed-from: expected a batch id/);
  });
});

describe('usage errors, each one line, exit 2', () => {
  it('a private key given to --public-key is refused naming the flag, the file and the mistake, printing no key material; a bad --max-age; a missing --witness directory', async () => {
    const keys = keyFiles();
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([3]) });
    await h.sync({ signingKey: loadSigningKey(keys.key) });
    const r = await verify(['--public-key', keys.key], h.exportDir, h.dbPath);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      `convo-mirror: configuration error: --public-key: ${keys.key} holds a private key, not a public key: give the public key (the .pub file convo-mirror keygen wrote); verifying never needs the private key, keep it with the publisher\n`,
    );
    for (const l of fs.readFileSync(keys.key, 'utf8').split('\n').filter((x) => x && !x.startsWith('-----'))) expect(r.stderr).not.toContain(l);

    const age = await verify(['--max-age', '30'], h.exportDir, h.dbPath);
    expect(age.code).toBe(2);
    expect(age.stderr).toBe('convo-mirror: configuration error: --max-age: expected a duration such as 90s, 15m, 24h, 7d or 1h30m (units ms, s, m, h, d, w), got "30" (a bare number: say which unit, e.g. 30s or 30m)\n');
    const missing = path.join(tempDir(), 'nowhere');
    const w = await verify(['--witness', missing], h.exportDir, h.dbPath);
    expect(w.code).toBe(2);
    expect(w.stderr).toBe(`convo-mirror: configuration error: --witness: ${missing} does not exist: give the witness directory (the publisher's CONVO_MIRROR_WITNESS_DIR, or a copy of it)\n`);
  });
});

describe('CONVO_MIRROR_WITNESS_DIR through convo-mirror sync', () => {
  it('sync appends each new head; verify --witness passes; a missing directory stops the sync at start-up naming the setting, and the next sync with it present mirrors and publishes', async () => {
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([4, 30]) });
    const dir = tempDir();
    const wdir = tempDir();
    const env = cliEnv(h.fake, dir, { CONVO_MIRROR_WITNESS_DIR: wdir });
    const first = await run(['sync'], env);
    expect(first.code, first.stderr).toBe(0);
    const db = path.join(dir, 'mirror.sqlite');
    const exportDir = path.join(dir, 'exports');
    const mirrorId = await withMirror(db, (m) => m.mirrorId());
    const lines = () => fs.readFileSync(witnessFile(wdir, mirrorId), 'utf8').trimEnd().split('\n');
    expect(lines()).toHaveLength(await withMirror(db, async (m) => (await m.ledgerEntries()).length));
    const ok = await verify(['--witness', wdir, '--deep'], exportDir, db);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/^ok   witness: 2 heads witnessed in /m);

    h.fake.workspace.appendMessages(h.fake.workspace.list()[1]!.id, 3);
    const gone = path.join(tempDir(), 'unmounted');
    const asked = h.fake.requests.length;
    const failed = await run(['sync'], { ...env, CONVO_MIRROR_WITNESS_DIR: gone });
    // Refused before any request or file (a witness that vanishes mid-run fails the publication
    // instead, and loses nothing: test/witness.test.ts).
    expect(failed.code).toBe(2);
    expect(failed.stderr).toContain(`CONVO_MIRROR_WITNESS_DIR: the witness directory ${gone} does not exist (it must be another disk or mount, made beforehand: convo-mirror never creates it)`);
    expect(h.fake.requests.length).toBe(asked);
    const again = await run(['sync'], env);
    expect(again.code, again.stderr).toBe(0);
    const after = await verify(['--witness', wdir, '--deep'], exportDir, db);
    expect(after.code, after.stderr).toBe(0);
    expect(lines().length).toBeGreaterThan(2);
  });
});
