/**
 * The SQLite mirror: migrations, opening foreign or newer files, edits with history, skipping
 * unchanged rows, and the runs table. Real SQLite files in temp dirs; syncs go over real HTTP to the fake.
 */
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { Mirror } from '../src/store/mirror.js';
import { MIGRATIONS } from '../src/store/migrations.js';
import { StoreError } from '../src/errors.js';
import { systemClock, type Clock } from '../src/clock.js';
import { ACCOUNT_ID, harness, quietLogger, mirrorEqualsFake, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import { sweepInterruptedRuns } from '../src/run/index.js';
import { sqlAll } from './sql.js';

const open: Harness[] = [];
const dirs: string[] = [];
const mirrors: Mirror[] = [];
afterEach(async () => {
  for (const m of mirrors.splice(0)) m.close();
  await Promise.all(open.splice(0).map((h) => h.close()));
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

async function start(opts: HarnessOptions): Promise<Harness> {
  const h = await harness(opts);
  open.push(h);
  return h;
}

function dbFile(): string {
  const d = tempDir();
  dirs.push(d);
  return path.join(d, 'mirror.sqlite');
}

function openMirror(file: string, clock?: Clock): Mirror {
  const m = Mirror.open(file, clock ? { clock } : {});
  mirrors.push(m);
  return m;
}

/** A clock whose time the test can push forward (so a rewritten timestamp cannot go unnoticed). */
function shiftableClock(): Clock & { shift(ms: number): void } {
  let offset = 0;
  return { now: () => Date.now() + offset, sleep: systemClock.sleep, shift: (ms) => (offset += ms) };
}

const HOUR = 3_600_000;

describe('migrations', () => {
  it('a new mirror gets every migration and user_version = number of migrations', () => {
    const file = dbFile();
    const m = openMirror(file);
    expect(MIGRATIONS.length).toBeGreaterThan(0);
    expect(m.db.pragma('user_version', { simple: true })).toBe(MIGRATIONS.length);
    const tables = (m.db.prepare(`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`).all() as { name: string }[]).map((r) => r.name);
    for (const t of ['conversations', 'messages', 'message_history', 'change_log', 'checkpoints', 'crawl_pages', 'runs', 'run_failures', 'export_state', 'export_batches', 'export_files']) {
      expect(tables).toContain(t);
    }
    expect(m.db.prepare(`SELECT id, watermark FROM export_state`).all()).toEqual([{ id: 1, watermark: 0 }]);
    expect(String(m.db.pragma('journal_mode', { simple: true })).toLowerCase()).toBe('wal');
  });

  it('reopening is idempotent and keeps the data', () => {
    const file = dbFile();
    const m1 = Mirror.open(file);
    const runId = m1.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    m1.finishRun(runId, { status: 'succeeded', requests: 7 });
    const schema1 = m1.db.prepare(`SELECT type, name, sql FROM sqlite_master ORDER BY name`).all();
    m1.close();
    for (let i = 0; i < 2; i++) {
      const m = Mirror.open(file);
      expect(m.db.pragma('user_version', { simple: true })).toBe(MIGRATIONS.length);
      expect(m.db.prepare(`SELECT type, name, sql FROM sqlite_master ORDER BY name`).all()).toEqual(schema1);
      expect(m.db.prepare(`SELECT id, status, requests FROM runs`).all()).toEqual([{ id: runId, status: 'succeeded', requests: 7 }]);
      expect(m.db.prepare(`SELECT count(*) AS n FROM export_state`).get()).toEqual({ n: 1 });
      m.close();
    }
  });

  it('opening a SQLite file that is not a convo-mirror mirror throws StoreError naming the file, and leaves it alone', () => {
    const file = dbFile();
    const db = new Database(file);
    db.exec(`CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); INSERT INTO invoices (total) VALUES (12.5);`);
    db.close();
    let err: unknown;
    try {
      openMirror(file);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StoreError);
    expect((err as StoreError).code).toBe('STORE_ERROR');
    expect((err as StoreError).message).toContain(file);
    expect((err as StoreError).context['file']).toBe(file);
    const after = new Database(file, { readonly: true });
    try {
      expect(after.pragma('user_version', { simple: true })).toBe(0);
      expect((after.prepare(`SELECT name FROM sqlite_master WHERE type = 'table'`).all() as { name: string }[]).map((r) => r.name)).toEqual(['invoices']);
    } finally {
      after.close();
    }
  });

  it('opening a mirror written by a newer version throws StoreError naming the file', () => {
    const file = dbFile();
    Mirror.open(file).close();
    const db = new Database(file);
    db.pragma(`user_version = ${MIGRATIONS.length + 1}`);
    db.close();
    expect(() => openMirror(file)).toThrow(StoreError);
    expect(() => openMirror(file)).toThrow(file);
  });

  it('opening a file that is not SQLite at all throws MirrorUnusableError (a StoreError, MIRROR_CORRUPT) naming the file', () => {
    const file = dbFile();
    fs.writeFileSync(file, 'this is not a database, just text '.repeat(200));
    expect(() => openMirror(file)).toThrow(StoreError);
    expect(() => openMirror(file)).toThrow(file);
    expect(() => openMirror(file)).toThrow(expect.objectContaining({ name: 'MirrorUnusableError', code: 'MIRROR_CORRUPT', sqliteCode: 'SQLITE_NOTADB' }));
  });
});

describe('edits and unchanged rows', () => {
  it('an edited message gives one update change-log row, its old version in message_history, and a new updated_at', async () => {
    const clock = shiftableClock();
    const ws = FakeWorkspace.fromCounts([40, 130]);
    const h = await start({ workspace: ws, clock });
    await h.sync();
    const conv = ws.list()[1]!;
    const msg = conv.messages[117]!;
    const oldRaw = JSON.stringify(msg);
    const get = h.mirror.db.prepare(`SELECT raw, content, updated_at, first_seen_at, deleted_at, position FROM messages WHERE account_id = ? AND conversation_id = ? AND id = ?`);
    const before = get.get(ACCOUNT_ID, conv.id, msg.id) as { raw: string; updated_at: string; first_seen_at: string; position: number };
    expect(before.raw).toBe(oldRaw);
    const others = h.mirror.db.prepare(`SELECT id, updated_at FROM messages WHERE id != ? ORDER BY id`).all(msg.id);

    clock.shift(HOUR);
    ws.editMessage(conv.id, msg.id, 'Edited: the refund went through ✅\nsecond line');
    const s2 = await h.sync();
    expect(s2.messages.updated).toBe(1);
    expect(s2.messages.inserted).toBe(0);
    expect(mirrorEqualsFake(h.mirror, ws).ok).toBe(true);

    const after = get.get(ACCOUNT_ID, conv.id, msg.id) as { raw: string; content: string; updated_at: string; first_seen_at: string; deleted_at: string | null; position: number };
    expect(after.raw).toBe(JSON.stringify(msg));
    expect(after.content).toBe('Edited: the refund went through ✅\nsecond line');
    expect(after.updated_at).not.toBe(before.updated_at);
    expect(after.updated_at > before.updated_at).toBe(true);
    expect(after.first_seen_at).toBe(before.first_seen_at);
    expect(after.position).toBe(117);
    expect(after.deleted_at).toBeNull();

    const updates = h.mirror.db.prepare(`SELECT seq, record_id, conversation_id, line FROM change_log WHERE stream = 'messages' AND op = 'update'`).all() as {
      seq: number;
      record_id: string;
      conversation_id: string;
      line: string;
    }[];
    expect(updates.length).toBe(1);
    expect(updates[0]!.record_id).toBe(msg.id);
    expect(updates[0]!.conversation_id).toBe(conv.id);
    expect(JSON.parse(updates[0]!.line).content).toBe(msg.content);

    const hist = h.mirror.db.prepare(`SELECT account_id, conversation_id, id, raw, valid_from, valid_to, replaced_by_seq FROM message_history`).all();
    expect(hist).toEqual([
      { account_id: ACCOUNT_ID, conversation_id: conv.id, id: msg.id, raw: oldRaw, valid_from: before.updated_at, valid_to: after.updated_at, replaced_by_seq: updates[0]!.seq },
    ]);
    // nothing else was rewritten
    expect(h.mirror.db.prepare(`SELECT id, updated_at FROM messages WHERE id != ? ORDER BY id`).all(msg.id)).toEqual(others);
    // the conversation's last_activity_at moved: one conversation update
    const convUpdates = h.mirror.db.prepare(`SELECT record_id FROM change_log WHERE stream = 'conversations' AND op = 'update'`).all();
    expect(convUpdates).toEqual([{ record_id: conv.id }]);

    // editing it again keeps both earlier versions
    const secondRaw = JSON.stringify(msg);
    ws.editMessage(conv.id, msg.id, 'Edited twice');
    clock.shift(HOUR);
    await h.sync();
    const hist2 = h.mirror.db.prepare(`SELECT raw FROM message_history WHERE id = ? ORDER BY replaced_by_seq`).all(msg.id) as { raw: string }[];
    expect(hist2.map((r) => r.raw)).toEqual([oldRaw, secondRaw]);
  });

  it('a re-sync of unchanged data writes nothing: change_log does not grow, updated_at stays', async () => {
    const clock = shiftableClock();
    const ws = FakeWorkspace.fromCounts([0, 5, 101, 230]);
    const h = await start({ workspace: ws, clock });
    await h.sync({ full: true });
    const snap = () => ({
      messages: h.mirror.db.prepare(`SELECT conversation_id, id, updated_at, first_seen_at, raw, position FROM messages ORDER BY conversation_id, id`).all(),
      conversations: h.mirror.db.prepare(`SELECT id, raw, updated_at, first_seen_at, message_count FROM conversations ORDER BY id`).all(),
      changes: (h.mirror.db.prepare(`SELECT count(*) AS n FROM change_log`).get() as { n: number }).n,
      history: (h.mirror.db.prepare(`SELECT count(*) AS n FROM message_history`).get() as { n: number }).n,
    });
    const s1 = snap();
    expect(s1.changes).toBe(4 + 336);
    clock.shift(HOUR);
    const s = await h.sync({ full: true });
    expect(s.messages).toMatchObject({ inserted: 0, updated: 0, deleted: 0, served: 336 });
    expect(s.conversations).toMatchObject({ inserted: 0, updated: 0 });
    expect(snap()).toEqual(s1);
  });
  it('a message whose position shifted (an earlier one was deleted) keeps its updated_at and logs no change', async () => {
    const clock = shiftableClock();
    const ws = FakeWorkspace.fromCounts([150]);
    const h = await start({ workspace: ws, clock });
    await h.sync();
    const conv = ws.list()[0]!;
    const read = () =>
      new Map(
        (h.mirror.db.prepare(`SELECT id, position, updated_at, deleted_at FROM messages`).all() as { id: string; position: number; updated_at: string; deleted_at: string | null }[]).map(
          (r) => [r.id, r],
        ),
      );
    const before = read();
    const victim = conv.messages[0]!.id;
    ws.deleteMessage(conv.id, victim);
    clock.shift(HOUR);
    await h.sync();
    const after = read();
    for (const [i, m] of conv.messages.entries()) {
      expect(after.get(m.id)!.position).toBe(i);
      expect(before.get(m.id)!.position).toBe(i + 1);
      expect(after.get(m.id)!.updated_at).toBe(before.get(m.id)!.updated_at);
    }
    expect(after.get(victim)!.deleted_at).not.toBeNull();
    const msgChanges = h.mirror.db.prepare(`SELECT op, count(*) AS n FROM change_log WHERE stream = 'messages' GROUP BY op ORDER BY op`).all();
    expect(msgChanges).toEqual([
      { op: 'delete', n: 1 },
      { op: 'insert', n: 150 },
    ]);
  });
});

describe('runs', () => {
  it('records status, counts and requests of each run', async () => {
    const ws = FakeWorkspace.fromCounts([3, 120, 0]);
    // noon UTC of a fixed day: one date partition per stream, whatever the time of the test
    const start0 = Date.now();
    const clock: Clock = { now: () => Date.UTC(2026, 0, 15, 12) + (Date.now() - start0), sleep: systemClock.sleep };
    const h = await start({ workspace: ws, clock });
    const s1 = await h.sync({ full: true });
    const row = (id: number) => h.mirror.db.prepare(`SELECT * FROM runs WHERE id = ?`).get(id) as Record<string, unknown>;
    const r1 = row(s1.runId);
    expect(r1).toMatchObject({
      scope: 'workspace',
      refresh: 'full',
      trigger: 'cli',
      account_id: ACCOUNT_ID,
      status: 'succeeded',
      list_passes: 2,
      conversations_listed: 3,
      conversations_synced: 3,
      conversations_failed: 0,
      conversations_deleted: 0,
      conversations_inserted: 3,
      conversations_updated: 0,
      messages_served: 123,
      messages_inserted: 123,
      messages_updated: 0,
      messages_deleted: 0,
      requests: 6, // 2 list passes of 1 page + 4 message pages
      retries: 0,
      rate_limited: 0,
      export_lines: 126,
      export_files: s1.export.files,
      error: null,
    });
    expect(h.fake.requests.length).toBe(6);
    expect(r1['started_at']).toMatch(/^\d{4}-\d{2}-\d{2}T/);
    expect(r1['ended_at']).toMatch(/^\d{4}-\d{2}-\d{2}T/);
    expect(String(r1['ended_at']) >= String(r1['started_at'])).toBe(true);
    expect(s1.export.files).toBe(2);

    // a 429 then success: counted as a retry and a rate-limited response
    const conv = ws.list()[1]!;
    ws.deleteMessage(conv.id, conv.messages[0]!.id);
    h.fake.injectFault({ kind: 'status', status: 429, retryAfter: '0', match: { path: `/v1/conversations/${conv.id}/messages` }, times: 1 });
    const before = h.fake.requests.length;
    const s2 = await h.sync({ full: true });
    const r2 = row(s2.runId);
    expect(s2.runId).toBeGreaterThan(s1.runId);
    expect(r2).toMatchObject({
      status: 'succeeded',
      messages_inserted: 0,
      messages_deleted: 1,
      messages_served: 122,
      conversations_updated: 1,
      retries: 1,
      rate_limited: 1,
      requests: h.fake.requests.length - before,
    });
    expect(r2['export_lines']).toBe(2);
    expect(h.mirror.db.prepare(`SELECT count(*) AS n FROM runs`).get()).toEqual({ n: 2 });
  });

  it("a run left 'running' becomes 'interrupted' at the start-up sweep, not when another run starts", async () => {
    const file = dbFile();
    const m1 = Mirror.open(file);
    const dead = m1.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    m1.close(); // the process "died" without finishRun
    const m2 = openMirror(file);
    expect((m2.db.prepare(`SELECT status, ended_at FROM runs WHERE id = ?`).get(dead) as { status: string }).status).toBe('running');
    // Runs overlap in the daemon: starting one never touches another.
    const concurrent = m2.startRun({ scope: 'conversations', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    expect((m2.db.prepare(`SELECT status FROM runs WHERE id = ?`).get(dead) as { status: string }).status).toBe('running');
    m2.db.prepare(`DELETE FROM runs WHERE id = ?`).run(concurrent);
    expect(m2.markInterruptedRuns()).toBe(1);
    const next = m2.startRun({ scope: 'conversations', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    expect(next).toBeGreaterThan(dead);
    const rows = m2.db.prepare(`SELECT id, status, ended_at FROM runs ORDER BY id`).all() as { id: number; status: string; ended_at: string | null }[];
    expect(rows.map((r) => [r.id, r.status])).toEqual([
      [dead, 'interrupted'],
      [next, 'running'],
    ]);
    expect(rows[0]!.ended_at).not.toBeNull();
    m2.finishRun(next, { status: 'succeeded' });
    expect((m2.db.prepare(`SELECT status FROM runs WHERE id = ?`).get(dead) as { status: string }).status).toBe('interrupted');
  });

  it("a run left 'running' is marked interrupted by the start-up sweep; a sync itself never touches another run", async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const h = await start({ workspace: ws });
    const other = h.mirror.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    const s1 = await h.sync();
    expect(h.mirror.runStatus(other)).toBe('running');
    expect(sweepInterruptedRuns(h.mirror, quietLogger())).toBe(1);
    const s2 = await h.sync();
    const rows = sqlAll(h.mirror, `SELECT id, status FROM runs ORDER BY id`);
    expect(rows).toEqual([
      { id: other, status: 'interrupted' },
      { id: s1.runId, status: 'succeeded' },
      { id: s2.runId, status: 'succeeded' },
    ]);
  });
});

describe('writer lock', () => {
  it('refuses a second writer on the same file while the first holds it, and releases on close', () => {
    const file = path.join(tempDir(), 'locked.sqlite');
    const first = Mirror.open(file);
    try {
      expect(() => Mirror.open(file)).toThrowError(new RegExp(`the mirror ${file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} is in use by process ${process.pid}`));
      // Readers take no lock.
      const reader = Mirror.open(file, { lock: false });
      reader.close();
    } finally {
      first.close();
    }
    const again = Mirror.open(file);
    again.close();
  });
});
