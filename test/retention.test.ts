/**
 * Retention (issue 26, item 3), on each engine of the store (test/engines.ts): an archive published
 * over several days (an injected clock; a file's date partition is the day its lines were synced)
 * with `CONVO_MIRROR_RETENTION` set loses the files older than the limit, after a retention record
 * (signed with the key) lists them; `verify` (and `--deep`) finds it intact; a file deleted by hand
 * is still flagged; a publication interrupted between the record and the deletions is finished by
 * the next one. The setting's parser and cutoffs too. Real files, the real fake over HTTP, real
 * SQLite and PostgreSQL; nothing of ours mocked.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { cutoffDay, parseRetention } from '../config/retention.js';
import { loadConfig } from '../config/index.js';
import { publishChanges, type ExportFailpoint } from '../src/export/exporter.js';
import { publishSettingsFromConfig } from '../src/export/publisher.js';
import { isRetentionRecord, parseRecord, recordPath, sealRecord, type RetentionRecord } from '../src/export/ledger.js';
import { fileStates } from '../src/export/file-states.js';
import { generateKeyPair, loadPublicKey, loadSigningKey } from '../src/export/signing.js';
import { verifyArchive } from '../src/export/verify.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { engines, type EngineFixture } from './engines.js';
import { assertBuilt, run } from './children.js';
import { ACCOUNT_ID as ACCOUNT, cliEnv, harnessPool, tempDir, testClock, type Harness, type TestClock } from './helpers.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const DAY = 86_400_000;
/** 2026-01-01T12:00:00Z. */
const START = Date.UTC(2026, 0, 1, 12);

/** The data files under the export directory, relative, sorted. */
function dataFiles(root: string): string[] {
  const out: string[] = [];
  for (const stream of ['messages', 'conversations', 'runs']) {
    const walk = (d: string, rel: string) => {
      if (!fs.existsSync(d)) return;
      for (const e of fs.readdirSync(d, { withFileTypes: true })) {
        if (e.isDirectory()) walk(path.join(d, e.name), `${rel}/${e.name}`);
        else out.push(`${rel}/${e.name}`);
      }
    };
    walk(path.join(root, stream), stream);
  }
  return out.sort();
}

/** The records of the ledger, parsed. */
function records(root: string) {
  return fs
    .readdirSync(path.join(root, '_ledger'))
    .sort()
    .map((n) => {
      const p = parseRecord(fs.readFileSync(path.join(root, '_ledger', n)));
      if (!p.ok) throw new Error(p.why);
      return p.record;
    });
}

/** Three syncs a day apart (2026-01-01, -02, -03): messages appended before each, so each day has its files. */
async function threeDays(engine: EngineFixture, clock: TestClock, publish: Parameters<Harness['sync']>[0] = {}): Promise<{ h: Harness; ws: FakeWorkspace }> {
  const ws = FakeWorkspace.fromCounts([4, 6]);
  const h = await pool.start({ workspace: ws, clock, engine });
  expect((await h.sync(publish)).status).toBe('succeeded');
  for (let d = 1; d <= 2; d++) {
    clock.advance(DAY);
    ws.appendMessages(ws.list()[0]!.id, 2);
    expect((await h.sync(publish)).status).toBe('succeeded');
  }
  return { h, ws };
}

describe('CONVO_MIRROR_RETENTION: the setting', () => {
  it('reads one limit for every stream, or limits per stream; none keeps everything', () => {
    expect(parseRetention('')).toBeUndefined();
    expect(parseRetention('none')).toBeUndefined();
    expect(parseRetention('400d')).toEqual({ streams: { messages: { amount: 400, unit: 'd' }, conversations: { amount: 400, unit: 'd' }, runs: { amount: 400, unit: 'd' } }, text: '400d' });
    expect(parseRetention(' runs = 7y , messages=52w ')!.text).toBe('messages=52w,runs=7y');
    expect(parseRetention('messages=2y,conversations=2y,runs=2y')!.text).toBe('2y');
  });

  it('refuses what it cannot read, saying why', () => {
    expect(() => parseRetention('400')).toThrow(/no unit: write 400d/);
    expect(() => parseRetention('18m')).toThrow(/no months: m would read as minutes/);
    expect(() => parseRetention('msgs=1d')).toThrow(/unknown stream "msgs"/);
    expect(() => parseRetention('runs=1d,runs=2d')).toThrow(/runs is given twice/);
    expect(() => parseRetention('101y')).toThrow(/more than 100 years/);
    expect(() => parseRetention('0d')).toThrow(/not a limit/);
  });

  it('cuts at whole UTC days: days and weeks exactly, years by the calendar', () => {
    const now = Date.UTC(2028, 1, 29, 23, 59); // 2028-02-29, late in the UTC day
    expect(cutoffDay({ amount: 1, unit: 'd' }, now)).toBe('2028-02-28');
    expect(cutoffDay({ amount: 2, unit: 'w' }, now)).toBe('2028-02-15');
    expect(cutoffDay({ amount: 1, unit: 'y' }, now)).toBe('2027-03-01');
    expect(cutoffDay({ amount: 4, unit: 'y' }, now)).toBe('2024-02-29');
  });

  it('is a configuration field: CONVO_MIRROR_RETENTION, with what is wrong named', () => {
    const base = { CONVO_MIRROR_BASE_URL: 'https://support.example.com/api', CONVO_MIRROR_API_KEY: 'k'.repeat(32) };
    expect(loadConfig({ ...base }).retention).toBeUndefined();
    expect(loadConfig({ ...base, CONVO_MIRROR_RETENTION: 'messages=400d' }).retention?.text).toBe('messages=400d');
    expect(() => loadConfig({ ...base, CONVO_MIRROR_RETENTION: '30' })).toThrow(/CONVO_MIRROR_RETENTION.*no unit/);
    // What sync, the daemon and erase publish with (src/export/publisher.ts).
    expect(publishSettingsFromConfig(loadConfig({ ...base, CONVO_MIRROR_RETENTION: '7y' })).retention?.text).toBe('7y');
    expect(publishSettingsFromConfig(loadConfig({ ...base })).retention).toBeUndefined();
  });
});

describe.each(engines)('retention on %s', (engine) => {
  afterEach(() => engine.cleanup());

  it('deletes the files older than the limit after a retention record lists them; verify is clean; a file deleted by hand is still flagged', async () => {
    const clock = testClock({ start: START });
    const { h } = await threeDays(engine, clock);
    const before = dataFiles(h.exportDir);
    const day1 = before.filter((p) => p.includes('/date=2026-01-01/'));
    const later = before.filter((p) => !p.includes('/date=2026-01-01/'));
    expect(day1.length).toBeGreaterThan(1);
    expect(later.some((p) => p.includes('/date=2026-01-03/'))).toBe(true);
    const recordsBefore = records(h.exportDir).length;

    // On 2026-01-03 with 1d: the first day kept is 2026-01-02.
    const r = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: parseRetention('1d') });
    expect(r.retention?.files.map((f) => f.path).sort()).toEqual(day1);
    expect(r.retention?.removed).toBe(day1.length);
    expect(dataFiles(h.exportDir)).toEqual(later);

    const all = records(h.exportDir);
    expect(all.length).toBe(recordsBefore + 1);
    const rec = all.at(-1)! as RetentionRecord;
    expect(isRetentionRecord(rec)).toBe(true);
    expect(rec.batch_id).toBe(r.head!.batch_id);
    expect(rec.prev).toEqual({ batch_id: all.at(-2)!.batch_id, hash: all.at(-2)!.hash });
    expect(rec.retention).toEqual({ policy: '1d', cutoff: { messages: '2026-01-02', conversations: '2026-01-02', runs: '2026-01-02' }, decided_at: new Date(clock.now()).toISOString() });
    expect(Object.keys(rec)).toEqual(['format', 'version', 'kind', 'mirror_id', 'batch_id', 'retention', 'files', 'prev', 'hash']);
    expect(rec.files.map((f) => f.path).sort()).toEqual(day1);
    for (const f of rec.files) expect(f.merkle_root).toMatch(/^[0-9a-f]{64}$/);

    // The mirror knows: the expired files are no longer published files, and are listed as expired.
    expect((await h.mirror.publishedFiles()).map((f) => f.path).sort()).toEqual(later);
    expect((await h.mirror.expiredFiles()).map((f) => [f.path, f.expired_by]).sort()).toEqual(day1.map((p) => [p, rec.batch_id]));

    const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
    expect(report.problems).toEqual([]);
    expect(report.retentions).toEqual([{ record: rec.batch_id, path: recordPath(rec.batch_id), retention: rec.retention, files: day1.length, lines: rec.files.reduce((n, f) => n + f.lines, 0) }]);
    expect(report.checks.find((c) => c.name === 'files')!.detail).toMatch(new RegExp(`${day1.length} expired by 1 retention record \\(\\d+ lines\\), all gone`));
    expect((await verifyArchive({ exportDir: h.exportDir })).problems).toEqual([]);

    // Nothing newer expired yet: the next publication writes no retention record.
    const again = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: parseRetention('1d') });
    expect(again.retention).toBeUndefined();
    expect(records(h.exportDir).length).toBe(all.length);

    // A file no retention record expired, deleted by hand, is still missing.
    const victim = later.find((p) => p.startsWith('messages/'))!;
    fs.unlinkSync(path.join(h.exportDir, victim));
    const tampered = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror });
    expect(tampered.problems).toContainEqual({ path: victim, problem: 'missing' });
  });

  it('expires by each stream\'s own limit, and a sync with the setting applies it', async () => {
    const clock = testClock({ start: START });
    const { h } = await threeDays(engine, clock);
    clock.advance(DAY); // 2026-01-04: runs=1d keeps 2026-01-03 on; messages=2d keeps 2026-01-02 on
    const before = dataFiles(h.exportDir);
    const s = await h.sync({ retention: parseRetention('messages=2d,runs=1d') });
    expect(s.status).toBe('succeeded');
    const expected = before.filter((p) => (p.startsWith('messages/') && p.includes('/date=2026-01-01/')) || (p.startsWith('runs/') && /\/date=2026-01-0[12]\//.test(p)));
    expect(expected.length).toBeGreaterThan(2);
    const after = dataFiles(h.exportDir);
    for (const p of expected) expect(after).not.toContain(p);
    for (const p of before.filter((x) => !expected.includes(x))) expect(after).toContain(p);
    const rec = records(h.exportDir).find((x): x is RetentionRecord => isRetentionRecord(x))!;
    expect(rec.retention.cutoff).toEqual({ messages: '2026-01-02', runs: '2026-01-03' });
    expect(rec.files.map((f) => f.path).sort()).toEqual(expected);
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('signs the retention record with the key; verify with the public key is clean', async () => {
    const keys = tempDir();
    generateKeyPair(path.join(keys, 'k.pem'), path.join(keys, 'k.pub'));
    const signingKey = loadSigningKey(path.join(keys, 'k.pem'));
    const clock = testClock({ start: START });
    const { h } = await threeDays(engine, clock, { signingKey });
    await publishChanges(h.mirror, { exportDir: h.exportDir, clock, signingKey, retention: parseRetention('1d') });
    const rec = records(h.exportDir).find((x): x is RetentionRecord => isRetentionRecord(x))!;
    expect(rec.signature?.algorithm).toBe('ed25519');
    const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, publicKey: loadPublicKey(path.join(keys, 'k.pub')) });
    expect(report.problems).toEqual([]);
    expect(report.signed).toBe(report.records);
    fs.rmSync(keys, { recursive: true, force: true });
  });

  it.each<ExportFailpoint>(['retention-before-mirror', 'retention-after-record', 'retention-after-delete'])('a publication interrupted at %s is finished by the next one', async (point) => {
    const clock = testClock({ start: START });
    const { h } = await threeDays(engine, clock);
    const before = dataFiles(h.exportDir);
    const day1 = before.filter((p) => p.includes('/date=2026-01-01/'));
    const crash = new Error(`crash at ${point}`);
    await expect(
      publishChanges(h.mirror, {
        exportDir: h.exportDir,
        clock,
        retention: parseRetention('1d'),
        failpoint: (p) => {
          if (p === point) throw crash;
        },
      }),
    ).rejects.toBe(crash);
    if (point === 'retention-before-mirror') {
      // The record is written, the chain never pointed at it: verify names it, nothing is deleted.
      expect(dataFiles(h.exportDir)).toEqual(before);
      expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror })).problems.some((p) => p.problem === 'mirror')).toBe(true);
    }
    if (point === 'retention-after-record') {
      // Recorded, not deleted yet, the manifest not moved: verify notes the expired files still
      // present (not a problem), and names the manifest behind the mirror's head.
      const mid = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror });
      expect(mid.problems.map((p) => [p.path, p.problem])).toEqual([['manifest.json', 'manifest']]);
      expect(mid.expiredPresent.sort()).toEqual(day1);
    }
    clock.advance(3_600_000); // an hour later: the same day
    const r = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: parseRetention('1d') });
    if (point === 'retention-before-mirror') expect(r.retention?.files.map((f) => f.path).sort()).toEqual(day1);
    expect(dataFiles(h.exportDir)).toEqual(before.filter((p) => !day1.includes(p)));
    const all = records(h.exportDir);
    expect(all.filter(isRetentionRecord)).toHaveLength(1);
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('a retention record written and never recorded does not stand in the way of an erasure record, and is decided again after it', async () => {
    const clock = testClock({ start: START });
    const { h, ws } = await threeDays(engine, clock);
    const next = await h.mirror.nextLedgerBatchId();
    await expect(
      publishChanges(h.mirror, {
        exportDir: h.exportDir,
        clock,
        retention: parseRetention('1d'),
        failpoint: (p) => {
          if (p === 'retention-before-mirror') throw new Error('crash');
        },
      }),
    ).rejects.toThrow('crash');
    const c = ws.list()[0]!;
    await h.mirror.eraseSubject({ kind: 'conversation', accountId: ACCOUNT, subject: c.id, reason: 'DSR-1' });
    const r = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: parseRetention('1d') });
    expect(r.erasures?.[0]?.record?.batch_id).toBe(next);
    expect(r.retention?.record?.batch_id).toBe(next + 1);
    const kinds = records(h.exportDir).slice(-2).map((x) => x.kind);
    expect(kinds).toEqual(['erasure', 'retention']);
    expect(dataFiles(h.exportDir).some((p) => p.includes('/date=2026-01-01/'))).toBe(false);
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('a retention record written and never recorded is removed when the setting is gone, and the next batch takes its id', async () => {
    const clock = testClock({ start: START });
    const { h, ws } = await threeDays(engine, clock);
    const next = await h.mirror.nextLedgerBatchId();
    await expect(
      publishChanges(h.mirror, {
        exportDir: h.exportDir,
        clock,
        retention: parseRetention('1d'),
        failpoint: (p) => {
          if (p === 'retention-before-mirror') throw new Error('crash');
        },
      }),
    ).rejects.toThrow('crash');
    expect(fs.existsSync(path.join(h.exportDir, recordPath(next)))).toBe(true);
    ws.appendMessages(ws.list()[1]!.id, 1);
    expect((await h.sync()).status).toBe('succeeded');
    const rec = records(h.exportDir).find((r) => r.batch_id === next)!;
    expect(rec.kind).toBe('batch');
    expect(records(h.exportDir).some(isRetentionRecord)).toBe(false);
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });
});

describe('convo-mirror verify (the built CLI) on an archive retention shortened', () => {
  const sqlite = engines.find((e) => e.name === 'sqlite')!;
  afterEach(() => sqlite.cleanup());

  it('prints a line per retention record, passes, and exits 1 with the file named when another file is gone', async () => {
    assertBuilt();
    const clock = testClock({ start: START });
    const ws = FakeWorkspace.fromCounts([4, 6]);
    const h = await pool.start({ workspace: ws, clock });
    expect((await h.sync()).status).toBe('succeeded');
    for (let d = 1; d <= 2; d++) {
      clock.advance(DAY);
      ws.appendMessages(ws.list()[0]!.id, 2);
      expect((await h.sync()).status).toBe('succeeded');
    }
    const r = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: parseRetention('1d') });
    const rec = r.retention!.record!;
    const env = cliEnv(h.fake, h.dir);
    const ok = await run(['verify', '--deep'], env);
    expect(ok.code, ok.stderr).toBe(0);
    const expired = ok.stdout.split('\n').filter((l) => l.startsWith('expired: '));
    expect(expired).toEqual([
      `expired: record ${rec.batch_id} (${recordPath(rec.batch_id)}): retention 1d, cutoff 2026-01-02, decided 2026-01-03T12:00:00.000Z: ${r.retention!.files.length} files, ${r.retention!.lines} lines`,
    ]);
    expect(ok.stdout).toMatch(new RegExp(`files: .*; ${r.retention!.files.length} expired by 1 retention record \\(${r.retention!.lines} lines\\), all gone`));
    expect(ok.stdout).toMatch(new RegExp(`archive intact: 7 records, \\d+ files, \\d+ lines \\(${r.retention!.files.length} files, ${r.retention!.lines} lines of them expired by retention\\); head `));
    const victim = dataFiles(h.exportDir).find((p) => p.startsWith('messages/'))!;
    fs.unlinkSync(path.join(h.exportDir, victim));
    const bad = await run(['verify'], env);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain(victim);
  });
});

describe('a retention record that does not follow from the records before it', () => {
  const sqlite = engines.find((e) => e.name === 'sqlite')!;
  afterEach(() => sqlite.cleanup());

  it('is a retention problem: a file after its cutoff, cutoffs its policy does not give, a file no record holds, another SHA-256', async () => {
    const clock = testClock({ start: START });
    const { h } = await threeDays(sqlite, clock);
    await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: parseRetention('1d') });
    const all = records(h.exportDir);
    const genuine = all.at(-1)! as RetentionRecord;
    const before = all.slice(0, -1);
    const { hash: _h, signature: _s, ...body } = genuine;
    const recent = before.flatMap((r) => (isRetentionRecord(r) ? [] : 'run_id' in r ? r.files : [])).find((f) => f.date === '2026-01-03')!;
    const forge = (b: typeof body) => fileStates([...before, sealRecord(b)]).problems;
    expect(fileStates(all).problems).toEqual([]);

    // A file of 2026-01-03 expired under a cutoff of 2026-01-02.
    const newer = forge({ ...body, files: [...body.files, { path: recent.path, stream: recent.stream, date: recent.date, sha256: recent.sha256, lines: recent.lines, merkle_root: recent.merkle_root! }] });
    expect(newer).toContainEqual(expect.objectContaining({ path: recent.path, problem: 'retention', detail: expect.stringContaining('is not before the record\'s cutoff for') }));

    // Cutoffs moved later than the policy gives at decided_at (to expire more).
    const moved = forge({ ...body, retention: { ...body.retention, cutoff: { messages: '2026-01-03', conversations: '2026-01-03', runs: '2026-01-03' } } });
    expect(moved).toContainEqual(expect.objectContaining({ path: recordPath(genuine.batch_id), problem: 'retention', detail: expect.stringContaining('not what its policy gives at its decided_at') }));

    // A file no record holds, and a file with another SHA-256 than its record's.
    const first = body.files[0]!;
    const ghost = first.path.replace(/\d{12}-\d{12}/, '999999999998-999999999999');
    const odd = forge({ ...body, files: [{ ...first, path: ghost }, { ...body.files[1]!, sha256: 'f'.repeat(64) }, ...body.files.slice(2)] });
    expect(odd).toContainEqual(expect.objectContaining({ path: ghost, problem: 'retention', detail: expect.stringContaining('no earlier record lists it') }));
    expect(odd).toContainEqual(expect.objectContaining({ path: body.files[1]!.path, problem: 'retention', found: 'f'.repeat(64), expected: body.files[1]!.sha256 }));
  });
});
