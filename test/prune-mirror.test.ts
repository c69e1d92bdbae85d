/**
 * `--prune-mirror` (issue 26, item 3), on each engine of the store (test/engines.ts): with a
 * retention policy limiting `messages`, a publication erases from the mirror every message created
 * before the cutoff by a retention erasure (rows, history, unpublished payloads; keys, positions and
 * `created_at` kept), replaces their published lines by stubs under an erasure record that names
 * the cutoff, and every later sync redacts them as they are served again. The next cutoff erases
 * the next messages under a record of its own; `verify --deep` replays the archive against the
 * mirror exactly throughout. Real fake over HTTP, real files, real SQLite and PostgreSQL.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../config/index.js';
import { parseRetention, type RetentionPolicy } from '../config/retention.js';
import { ConfigError } from '../src/errors.js';
import { publishChanges } from '../src/export/exporter.js';
import { isErasureRecord, parseRecord, type ErasureRecord } from '../src/export/ledger.js';
import { publishSettingsFromConfig } from '../src/export/publisher.js';
import { verifyArchive } from '../src/export/verify.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { createdBefore, cutoffStartMs, pageRetentionFloor, redactionOf } from '../src/store/redaction.js';
import type { Message, Page } from '../src/api/schemas.js';
import { engines } from './engines.js';
import { ACCOUNT_ID as ACCOUNT, harnessPool, tempDir, testClock } from './helpers.js';
import { changeRows, records } from './mirror-reads.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const DAY = 86_400_000;
/** 2025-06-01T12:00:00Z: `messages=200d` cuts at 2024-11-13. */
const START = Date.UTC(2025, 5, 1, 12);
const policy = (text: string): RetentionPolicy => ({ ...parseRetention(text)!, pruneMirror: true });

/** Every line of every data file under `root`, parsed, with its file. */
function exportLines(root: string): { file: string; line: Record<string, unknown> }[] {
  const out: { file: string; line: Record<string, unknown> }[] = [];
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) {
        if (e.name !== '_ledger' && e.name !== '.tmp') walk(p);
      } else if (e.name.endsWith('.jsonl')) {
        for (const l of fs.readFileSync(p, 'utf8').split('\n')) if (l !== '') out.push({ file: path.relative(root, p), line: JSON.parse(l) as Record<string, unknown> });
      }
    }
  };
  walk(root);
  return out;
}

/** The erasure records of the ledger under `root`, in order. */
function erasureRecords(root: string): ErasureRecord[] {
  return fs
    .readdirSync(path.join(root, '_ledger'))
    .sort()
    .map((n) => parseRecord(fs.readFileSync(path.join(root, '_ledger', n))))
    .flatMap((p) => (p.ok && isErasureRecord(p.record) ? [p.record as ErasureRecord] : []));
}

describe('CONVO_MIRROR_PRUNE_MIRROR: the setting', () => {
  it('needs a retention policy that limits messages, and says so naming the setting', () => {
    const env = { CONVO_MIRROR_BASE_URL: 'http://127.0.0.1:9', CONVO_MIRROR_API_KEY: 'k' };
    expect(() => loadConfig({ ...env, CONVO_MIRROR_PRUNE_MIRROR: 'true' })).toThrow(ConfigError);
    expect(() => loadConfig({ ...env, CONVO_MIRROR_PRUNE_MIRROR: 'true' })).toThrow(/CONVO_MIRROR_PRUNE_MIRROR.*needs a retention policy that limits messages/);
    expect(() => loadConfig({ ...env, CONVO_MIRROR_PRUNE_MIRROR: 'true', CONVO_MIRROR_RETENTION: 'runs=7y' })).toThrow(/limits messages/);
    expect(() => loadConfig({ ...env, CONVO_MIRROR_RETENTION: 'messages=400d' }, { pruneMirror: true })).not.toThrow();
    expect(() => loadConfig(env, { pruneMirror: true })).toThrow(/--prune-mirror/);

    const on = loadConfig({ ...env, CONVO_MIRROR_RETENTION: '400d', CONVO_MIRROR_PRUNE_MIRROR: 'true' });
    expect(on.pruneMirror).toBe(true);
    expect(publishSettingsFromConfig({ ...on, exportDir: tempDir('convo-mirror-prune-cfg-') }).retention).toMatchObject({ text: '400d', pruneMirror: true });
    const off = loadConfig({ ...env, CONVO_MIRROR_RETENTION: '400d' });
    expect(off.pruneMirror).toBe(false);
    expect(publishSettingsFromConfig({ ...off, exportDir: tempDir('convo-mirror-prune-cfg-') }).retention?.pruneMirror).toBeUndefined();
  });
});

describe('a message expires by its created_at, as an instant', () => {
  it('compares instants, whatever the UTC offset; what does not parse never expires', () => {
    expect(createdBefore('2024-11-12T23:59:59.999Z', '2024-11-13')).toBe(true);
    expect(createdBefore('2024-11-13T00:00:00.000Z', '2024-11-13')).toBe(false);
    expect(createdBefore('2024-11-13T05:00:00+09:00', '2024-11-13')).toBe(true); // 2024-11-12T20:00Z
    expect(createdBefore('2024-11-12T20:00:00-05:00', '2024-11-13')).toBe(false); // 2024-11-13T01:00Z
    expect(createdBefore('not a time', '2024-11-13')).toBe(false);
    expect(createdBefore(undefined, '2024-11-13')).toBe(false);
    expect(cutoffStartMs('2024-02-30')).toBeUndefined();
    expect(cutoffStartMs('2024-2-3')).toBeUndefined();
    expect(cutoffStartMs('2024-02-29')).toBe(Date.UTC(2024, 1, 29));
  });

  it("a page's floor is the day before its earliest created_at: a cutoff after it may cover a message of the page", () => {
    const page = (createdAt: unknown[]): Page<Message> => {
      const raw = createdAt.map((c, i) => ({ id: `m${i}`, created_at: c }));
      return { page: 1, data: raw as unknown as Message[], raw, meta: { current_page: 1, total_pages: 1, total_count: raw.length } };
    };
    expect(pageRetentionFloor(page(['2025-01-02T10:00:00Z', '2024-12-31T23:00:00-05:00', 'junk']))).toBe('2024-12-31');
    expect(pageRetentionFloor(page(['junk', 7]))).toBeUndefined();
  });
});

describe.each(engines)('--prune-mirror on $name', (engine) => {
  afterEach(() => engine.cleanup());

  it('erases the messages created before the cutoff from the mirror and the archive, keeps the rest, and keeps them erased when served again', async () => {
    const clock = testClock({ start: START });
    const ws = FakeWorkspace.fromCounts([4, 3]);
    const [old, recent] = ws.list() as [ReturnType<FakeWorkspace['list']>[number], ReturnType<FakeWorkspace['list']>[number]];
    // The first conversation's messages were written in June 2024; the second's stay in January 2025.
    old.messages.forEach((m, i) => (m.created_at = new Date(Date.UTC(2024, 5, 1 + i, 8)).toISOString()));
    const oldIds = new Set(old.messages.map((m) => m.id));
    const oldContents = old.messages.map((m) => JSON.stringify(m.content));
    const h = await pool.start({ workspace: ws, clock, engine });
    expect((await h.sync()).status).toBe('succeeded');
    // An edit of an old message, synced: a message_history version that must go too.
    ws.editMessage(old.id, old.messages[0]!.id, 'an edit of June 2024, still personal');
    expect((await h.sync({ full: true })).status).toBe('succeeded');
    expect((await publishChanges(h.mirror, { exportDir: h.exportDir, clock })).pruned).toBeUndefined();

    const r = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: policy('messages=200d') });
    expect(r.pruned).toEqual([{ accountId: ACCOUNT, erasureId: 1, cutoff: '2024-11-13', messages: 4, history: 1, pendingChanges: 0, publishedLines: 5 }]);
    expect(r.erasures?.map((e) => ({ erasure: e.erasureId, lines: e.lines }))).toEqual([{ erasure: 1, lines: 5 }]);

    // The mirror: the old conversation's messages are markers of erasure 1 (created_at kept), the
    // recent ones untouched, no history version holds the edit any more.
    const rows = await records(h.mirror, 'messages');
    for (const row of rows) {
      if (oldIds.has(row.id)) {
        expect(redactionOf(row.raw)).toBe(1);
        expect(JSON.parse(row.raw!)).toEqual({ id: row.id, created_at: old.messages.find((m) => m.id === row.id)!.created_at, redacted: { erasure: 1 } });
      } else expect(redactionOf(row.raw)).toBeUndefined();
    }
    expect(rows.filter((row) => !oldIds.has(row.id))).toHaveLength(3);
    const [erasure] = await h.mirror.erasures();
    expect(erasure).toMatchObject({ id: 1, kind: 'retention', subject: '2024-11-13', reason: 'retention messages=200d: messages created before 2024-11-13', messages: 4, history: 1 });
    expect(erasure!.archiveDoneAt).not.toBeNull();

    // The archive: every line of an old message is a stub; the others are as published; no old content is left.
    const lines = exportLines(h.exportDir);
    const ofOld = lines.filter((l) => l.line.stream === undefined && oldIds.has(l.line.id as string) && l.file.startsWith('messages/'));
    expect(ofOld).toHaveLength(5);
    for (const l of ofOld) expect(Object.keys(l.line)).toEqual(['seq', 'op', 'account_id', 'conversation_id', 'id', 'redacted']);
    const text = lines.map((l) => JSON.stringify(l.line)).join('\n');
    for (const c of oldContents) expect(text).not.toContain(c);
    expect(text).not.toContain('an edit of June 2024');
    expect(lines.filter((l) => l.file.startsWith('messages/') && !oldIds.has(l.line.id as string)).every((l) => typeof l.line.content === 'string')).toBe(true);
    const [record] = erasureRecords(h.exportDir);
    expect(record!.erasure).toMatchObject({ id: 1, kind: 'retention', cutoff: '2024-11-13', reason: 'retention messages=200d: messages created before 2024-11-13' });
    expect(JSON.stringify(record)).not.toContain(old.id); // the record names files and seqs, not conversations

    let report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
    expect(report.problems).toEqual([]);
    expect(report.erasures.map((e) => [e.erasure.kind, e.erasure.cutoff, e.lines])).toEqual([['retention', '2024-11-13', 5]]);

    // Served again by a full refresh (the source still has them): they arrive redacted, no change line.
    const seqBefore = (await changeRows(h.mirror)).length;
    expect((await h.sync({ full: true, retention: policy('messages=200d') })).status).toBe('succeeded');
    const after = await changeRows(h.mirror);
    expect(after.slice(seqBefore).filter((c) => c.stream === 'messages')).toEqual([]);
    for (const row of await records(h.mirror, 'messages')) if (oldIds.has(row.id)) expect(redactionOf(row.raw)).toBe(1);
    // The same day again: no second retention erasure; status counts it apart from the erasures of erase.
    expect((await h.mirror.erasures()).length).toBe(1);
    expect(await h.mirror.counts()).toMatchObject({ erasures: 0, erasures_pending: 0, retention_erasures: 1 });

    // Sixty days on, the cutoff (2025-01-12) passes the recent conversation too: erasure 2, a record of its own.
    clock.advance(60 * DAY);
    const later = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: policy('messages=200d') });
    expect(later.pruned?.map((p) => [p.erasureId, p.cutoff, p.messages])).toEqual([[2, '2025-01-12', 3]]);
    for (const row of await records(h.mirror, 'messages')) expect(redactionOf(row.raw)).toBe(oldIds.has(row.id) ? 1 : 2);
    expect(erasureRecords(h.exportDir).map((x) => [x.erasure.id, x.erasure.cutoff])).toEqual([
      [1, '2024-11-13'],
      [2, '2025-01-12'],
    ]);
    const all = exportLines(h.exportDir).filter((l) => l.file.startsWith('messages/'));
    expect(all.every((l) => l.line.redacted !== undefined)).toBe(true);
    report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
    expect(report.problems).toEqual([]);
    expect((await verifyArchive({ exportDir: h.exportDir })).problems).toEqual([]);
  });

  it('a publication interrupted in the archive step of its retention erasure is finished by the next one, with no second erasure', async () => {
    const clock = testClock({ start: START });
    const ws = FakeWorkspace.fromCounts([3, 2]);
    ws.list()[0]!.messages.forEach((m, i) => (m.created_at = new Date(Date.UTC(2024, 5, 1 + i)).toISOString()));
    const h = await pool.start({ workspace: ws, clock, engine });
    expect((await h.sync()).status).toBe('succeeded');
    class Crash extends Error {}
    let day = 0;
    for (const point of ['erasure-after-file', 'erasure-before-mirror', 'erasure-after-record'] as const) {
      const crash = (p: string) => {
        if (p === point) throw new Crash(p);
      };
      if (point !== 'erasure-after-file') {
        // A new day, a new cutoff past one more message: another retention erasure to interrupt.
        clock.advance(DAY);
        day++;
        // Created an hour before the new cutoff's day (2024-11-13 plus the days gone by).
        ws.list()[1]!.messages[day - 1]!.created_at = new Date(Date.UTC(2024, 10, 13 + day) - 3_600_000).toISOString();
        expect((await h.sync({ full: true })).status).toBe('succeeded');
      }
      await expect(publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: policy('messages=200d'), failpoint: crash })).rejects.toBeInstanceOf(Crash);
      const pending = (await h.mirror.erasures()).filter((e) => e.archiveDoneAt === null);
      expect(pending.map((e) => e.kind)).toEqual(['retention']);
      const done = await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: policy('messages=200d') });
      expect(done.pruned).toBeUndefined();
      expect(done.erasures?.map((e) => e.erasureId)).toEqual([pending[0]!.id]);
      expect((await h.mirror.erasures()).every((e) => e.archiveDoneAt !== null)).toBe(true);
      expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
    }
    expect((await h.mirror.erasures()).map((e) => e.kind)).toEqual(['retention', 'retention', 'retention']);
  });

  it('a new message created before the cutoff arrives redacted by the retention erasure; nothing expires without the setting', async () => {
    const clock = testClock({ start: START });
    const ws = FakeWorkspace.fromCounts([2, 2]);
    const [old] = ws.list();
    old!.messages.forEach((m, i) => (m.created_at = new Date(Date.UTC(2024, 5, 1 + i)).toISOString()));
    const h = await pool.start({ workspace: ws, clock, engine });
    expect((await h.sync({ retention: parseRetention('messages=200d') })).status).toBe('succeeded');
    expect(await h.mirror.erasures()).toEqual([]); // the policy without --prune-mirror leaves the mirror
    expect((await h.sync({ retention: policy('messages=200d') })).status).toBe('succeeded');
    expect((await h.mirror.erasures()).map((e) => [e.kind, e.subject, e.messages])).toEqual([['retention', '2024-11-13', 2]]);

    // A message the source back-dates (an import): created before the cutoff, it arrives redacted.
    const [added] = ws.appendMessages(old!.id, 1);
    added!.created_at = '2024-07-01T00:00:00.000Z';
    expect((await h.sync({ retention: policy('messages=200d') })).status).toBe('succeeded');
    const row = (await records(h.mirror, 'messages')).find((r) => r.id === added!.id)!;
    expect(JSON.parse(row.raw!)).toEqual({ id: added!.id, created_at: '2024-07-01T00:00:00.000Z', redacted: { erasure: 1 } });
    const lines = exportLines(h.exportDir).filter((l) => l.line.id === added!.id);
    expect(lines.map((l) => l.line.redacted)).toEqual([{ erasure: 1 }]);
    expect(JSON.stringify(lines)).not.toContain(JSON.stringify(added!.content));
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });
});
