/**
 * The mirror: migrations, opening foreign or newer files, edits with history, skipping unchanged
 * rows, set-wise page commits, reading batches for export, and the runs table. What concerns a
 * SQLite file runs on real SQLite files in temp dirs; the rest is the conformance suite at the end,
 * run on every engine (test/engines.ts). Syncs go over real HTTP to the fake.
 */
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import type { ExportChange, Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { MIGRATIONS } from '../src/store/sqlite/migrations.js';
import { StoreError } from '../src/errors.js';
import type { Clock } from '../src/clock.js';
import { exportLine } from '../src/export/lines.js';
import { publishChanges, verifyExports } from '../src/export/exporter.js';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { ACCOUNT_ID, harness, quietLogger, readExportLines, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import { sweepInterruptedRuns } from '../src/run/index.js';
import { sqlAll, sqlGet, sqlRun, sqlValue } from './sql.js';
import { testClock } from './clock.js';
import { engines } from './engines.js';
import { historyRows, maxSeq, messageRows, mirrorMatchesFake, runRow } from './mirror-reads.js';

const open: Harness[] = [];
const dirs: string[] = [];
const mirrors: Mirror[] = [];
afterEach(async () => {
  for (const m of mirrors.splice(0)) await m.close();
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

async function openTracked(file: string, clock?: Clock): Promise<Mirror> {
  const m = await openMirror(file, clock ? { clock } : {});
  mirrors.push(m);
  return m;
}

/** Noon UTC of a fixed day: one date partition per stream, and timestamps a test moves on purpose. */
const NOON = Date.UTC(2026, 0, 15, 12);
/** Virtual time from noon: waits move it (so a rewritten timestamp cannot go unnoticed), nothing really waits. */
const movingClock = () => testClock({ start: NOON, sleep: 'advance' });

const HOUR = 3_600_000;

/** Every change-log row, as the exporter reads them (in file order). */
const allChanges = async (m: Mirror) => {
  const out: ExportChange[] = [];
  for await (const c of m.changesOf({ first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER })) out.push(c);
  return out;
};

// SQLite only: the file's schema and foreign or newer files (PRAGMA user_version, sqlite_master).
describe('migrations', () => {
  it('a new mirror gets every migration and user_version = number of migrations', async () => {
    const file = dbFile();
    const m = await openTracked(file);
    expect(MIGRATIONS.length).toBeGreaterThan(0);
    expect(sqlValue(m, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
    const tables = sqlAll<{ name: string }>(m, `SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`).map((r) => r.name);
    for (const t of ['conversations', 'messages', 'message_history', 'change_log', 'checkpoints', 'crawl_pages', 'runs', 'run_failures', 'export_state', 'export_batches', 'export_files']) {
      expect(tables).toContain(t);
    }
    expect(sqlAll(m, `SELECT id, watermark FROM export_state`)).toEqual([{ id: 1, watermark: 0 }]);
    expect(sqlValue<string>(m, `PRAGMA journal_mode`).toLowerCase()).toBe('wal');
  });

  it('reopening is idempotent and keeps the data', async () => {
    const file = dbFile();
    const m1 = await openTracked(file);
    const runId = await m1.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    await m1.finishRun(runId, { status: 'succeeded', requests: 7 });
    const schema1 = sqlAll(m1, `SELECT type, name, sql FROM sqlite_master ORDER BY name`);
    await m1.close();
    for (let i = 0; i < 2; i++) {
      const m = await openTracked(file);
      expect(sqlValue(m, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
      expect(sqlAll(m, `SELECT type, name, sql FROM sqlite_master ORDER BY name`)).toEqual(schema1);
      expect(sqlAll(m, `SELECT id, status, requests FROM runs`)).toEqual([{ id: runId, status: 'succeeded', requests: 7 }]);
      expect(sqlGet(m, `SELECT count(*) AS n FROM export_state`)).toEqual({ n: 1 });
      await m.close();
    }
  });

  it('opening a SQLite file that is not a convo-mirror mirror throws StoreError naming the file, and leaves it alone', async () => {
    const file = dbFile();
    const db = new Database(file);
    db.exec(`CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); INSERT INTO invoices (total) VALUES (12.5);`);
    db.close();
    let err: unknown;
    try {
      await openMirror(file);
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

  it('opening a mirror written by a newer version throws StoreError naming the file', async () => {
    const file = dbFile();
    await (await openMirror(file)).close();
    const db = new Database(file);
    db.pragma(`user_version = ${MIGRATIONS.length + 1}`);
    db.close();
    await expect(openMirror(file)).rejects.toThrow(StoreError);
    await expect(openMirror(file)).rejects.toThrow(file);
  });

  it('opening a file that is not SQLite at all throws MirrorUnusableError (a StoreError, MIRROR_CORRUPT) naming the file', async () => {
    const file = dbFile();
    fs.writeFileSync(file, 'this is not a database, just text '.repeat(200));
    await expect(openMirror(file)).rejects.toThrow(StoreError);
    await expect(openMirror(file)).rejects.toThrow(file);
    await expect(openMirror(file)).rejects.toThrow(expect.objectContaining({ name: 'MirrorUnusableError', code: 'MIRROR_CORRUPT', sqliteCode: 'SQLITE_NOTADB' }));
  });
});

// SQLite only: migrates files written by older versions.
describe('migration 6: the change log keeps the record, the exporter makes the line', () => {
  /** Rows a version-5 mirror wrote: the finished export line without seq. */
  const LEGACY = [
    {
      seq: 1,
      stream: 'conversations',
      op: 'insert',
      conversation_id: 'c1',
      record_id: 'c1',
      synced_at: '2025-06-01T10:00:00.000Z',
      line: '{"op":"insert","synced_at":"2025-06-01T10:00:00.000Z","account_id":"acct","id":"c1","data":{"id":"c1","subject":"Grüße ✅","n":1.5e+300}}',
    },
    {
      seq: 2,
      stream: 'messages',
      op: 'insert',
      conversation_id: 'c1',
      record_id: 'm1',
      synced_at: '2025-06-01T10:00:00.000Z',
      line: '{"op":"insert","synced_at":"2025-06-01T10:00:00.000Z","account_id":"acct","conversation_id":"c1","id":"m1","content":"hi\\nthere \\u2028","visibility":"global","sender":{"id":"u1","name":"Ann","type":"Customer"},"attachments":[{"url":"x"}],"created_at":"2025-06-01T09:00:00Z"}',
    },
    {
      seq: 3,
      stream: 'messages',
      op: 'delete',
      conversation_id: 'c1',
      record_id: 'm0',
      synced_at: '2025-06-01T11:00:00.000Z',
      line: '{"op":"delete","synced_at":"2025-06-01T11:00:00.000Z","account_id":"acct","conversation_id":"c1","id":"m0","content":"bye","visibility":"personal","sender":{"id":"u2","name":"Bo","type":"User"},"created_at":"2025-06-01T08:00:00Z"}',
    },
  ] as const;

  /** A version-5 mirror file with {@link LEGACY} in its change log and its AUTOINCREMENT counter at `counter`. */
  function v5Mirror(counter: number): string {
    const file = dbFile();
    const db = new Database(file);
    db.pragma('journal_mode = WAL');
    for (const m of MIGRATIONS.slice(0, 5)) db.exec(m);
    db.pragma('user_version = 5');
    const ins = db.prepare(`INSERT INTO change_log (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, line)
                            VALUES (@seq, @stream, @op, 'acct', @conversation_id, @record_id, @synced_at, NULL, @line)`);
    for (const r of LEGACY) ins.run(r);
    // As if later seqs had been handed out (a counter above max(seq)): none may be handed out again.
    db.prepare(`UPDATE sqlite_sequence SET seq = ? WHERE name = 'change_log'`).run(counter);
    db.close();
    return file;
  }

  it('a v5 mirror migrates to 6 keeping every row and seq, never reuses a seq, and publishes its legacy lines byte for byte', async () => {
    const file = v5Mirror(7);
    const m = await openTracked(file, movingClock());
    expect(sqlValue(m, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
    expect(MIGRATIONS.length).toBeGreaterThanOrEqual(6);
    expect(sqlAll(m, `SELECT seq, stream, op, conversation_id, record_id, synced_at, line, record FROM change_log LEFT JOIN change_payloads USING (seq) ORDER BY seq`)).toEqual(
      LEGACY.map((r) => ({ ...r, record: null })),
    );

    // New rows carry the record, no line, and seqs after the old counter.
    const conv = { id: 'c2', subject: 'new' };
    const listed: Page<Conversation> = { page: 1, data: [conv], raw: [conv], meta: { current_page: 1, total_pages: 1, total_count: 1 } };
    await m.upsertConversations('acct', listed, null);
    const msg = { id: 'm9', content: 'new', visibility: 'global', sender: { id: 'u1', name: 'Ann', type: 'Customer' }, created_at: '2026-01-15T11:00:00Z' };
    const served: Page<Message> = { page: 1, data: [msg], raw: [msg], meta: { current_page: 1, total_pages: 1, total_count: 1 } };
    await m.commitMessagesPage('acct', 'c2', served, null);
    expect(sqlAll(m, `SELECT seq, stream, line, record FROM change_log LEFT JOIN change_payloads USING (seq) WHERE seq > 3 ORDER BY seq`)).toEqual([
      { seq: 8, stream: 'conversations', line: null, record: JSON.stringify(conv) },
      { seq: 9, stream: 'messages', line: null, record: JSON.stringify(msg) },
    ]);

    const exportDir = path.join(path.dirname(file), 'exports');
    const res = await publishChanges(m, { exportDir });
    expect(res.lines).toBe(5);
    const read = (rel: string) => fs.readFileSync(path.join(exportDir, rel), 'utf8');
    const legacyLine = (i: number) => `{"seq":${LEGACY[i]!.seq},${LEGACY[i]!.line.slice(1)}\n`;
    expect(read('conversations/account=acct/date=2025-06-01/000000000001-000000000001.jsonl')).toBe(legacyLine(0));
    expect(read('messages/account=acct/date=2025-06-01/000000000002-000000000003.jsonl')).toBe(legacyLine(1) + legacyLine(2));
    expect(read('conversations/account=acct/date=2026-01-15/000000000008-000000000008.jsonl')).toBe(
      `{"seq":8,"op":"insert","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","id":"c2","data":{"id":"c2","subject":"new"}}\n`,
    );
    expect(read('messages/account=acct/date=2026-01-15/000000000009-000000000009.jsonl')).toBe(
      `{"seq":9,"op":"insert","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","conversation_id":"c2","id":"m9","content":"new",` +
        `"visibility":"global","sender":{"id":"u1","name":"Ann","type":"Customer"},"created_at":"2026-01-15T11:00:00Z"}\n`,
    );
    expect(await verifyExports(m, exportDir)).toEqual([]);
    expect(await m.exportWatermark()).toBe(9);
    // Schema 7's change log takes a run's line too, after the same counter.
    const run = await m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: 'acct' });
    await m.finishRun(run, { status: 'succeeded' });
    expect(sqlAll(m, `SELECT seq, stream, op, record_id, conversation_id FROM change_log WHERE seq > 9`)).toEqual([
      { seq: 10, stream: 'runs', op: 'insert', record_id: String(run), conversation_id: '' },
    ]);
  });

  it('a v5 mirror whose change log is empty starts its seqs at 1', async () => {
    const file = dbFile();
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, 5)) db.exec(m);
    db.pragma('user_version = 5');
    db.close();
    const m = await openTracked(file);
    const conv = { id: 'c1' };
    await m.upsertConversations('acct', { page: 1, data: [conv], raw: [conv], meta: { current_page: 1, total_pages: 1, total_count: 1 } }, null);
    expect(sqlAll(m, `SELECT seq, line, record FROM change_log LEFT JOIN change_payloads USING (seq)`)).toEqual([{ seq: 1, line: null, record: '{"id":"c1"}' }]);
  });

  it('a change payload needs a record or a line', async () => {
    const m = await openTracked(dbFile());
    expect(() => sqlRun(m, `INSERT INTO change_payloads (seq) VALUES (1)`)).toThrow(/CHECK constraint failed/);
  });
});

// SQLite only: the file's layout (generated columns, auto-vacuum, free pages).
describe('migration 8: a lean mirror', () => {
  const served = { id: 'm1', content: 'hi\nthere', visibility: 'global', sender: { id: 'u1', name: 'Ann', type: 'Customer' }, attachments: [{ url: 'x' }], created_at: '2025-06-01T09:00:00Z' };

  it('a new mirror stores raw only (the derived columns are computed from it), has no position index, and incremental auto-vacuum', async () => {
    const m = await openTracked(dbFile());
    expect(sqlValue(m, `PRAGMA auto_vacuum`)).toBe(2);
    const page: Page<Message> = { page: 1, data: [served as Message], raw: [served], meta: { current_page: 1, total_pages: 1, total_count: 1 } };
    await m.commitMessagesPage('acct', 'c1', page, null);
    expect(sqlGet(m, `SELECT content, visibility, sender_id, sender_name, sender_type, attachments, created_at FROM messages`)).toEqual({
      content: 'hi\nthere', visibility: 'global', sender_id: 'u1', sender_name: 'Ann', sender_type: 'Customer', attachments: '[{"url":"x"}]', created_at: '2025-06-01T09:00:00Z',
    });
    // hidden = 2: a VIRTUAL generated column, nothing on disk
    const cols = sqlAll<{ name: string; hidden: number }>(m, `SELECT name, hidden FROM pragma_table_xinfo('messages')`);
    expect(cols.filter((c) => c.hidden === 0).map((c) => c.name)).toEqual(['account_id', 'conversation_id', 'id', 'position', 'raw', 'first_seen_at', 'updated_at', 'deleted_at']);
    expect(cols.filter((c) => c.hidden === 2).map((c) => c.name)).toEqual(['content', 'visibility', 'sender_id', 'sender_name', 'sender_type', 'attachments', 'created_at']);
    expect(sqlValue(m, `SELECT count(*) FROM sqlite_master WHERE name = 'messages_by_position'`)).toBe(0);
    expect(await m.messageIdAt('acct', 'c1', 0)).toBe('m1');
  });

  it('a v7 mirror migrates to 8: published payloads dropped, unpublished ones kept byte for byte, every seq and the counter carried over, the file vacuumed once', async () => {
    const file = dbFile();
    const db = new Database(file);
    db.pragma('journal_mode = WAL');
    for (const mig of MIGRATIONS.slice(0, 7)) db.exec(mig);
    db.pragma('user_version = 7');
    db.prepare(`INSERT INTO messages (account_id, conversation_id, id, position, content, visibility, sender_id, sender_name, sender_type, attachments, created_at, raw, first_seen_at, updated_at)
                VALUES ('acct', 'c1', 'm1', 0, 'hi', 'global', 'u1', 'Ann', 'Customer', NULL, '2025-06-01T09:00:00Z', ?, 'x', 'x')`).run(JSON.stringify(served));
    const ins = db.prepare(`INSERT INTO change_log (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, line, record)
                            VALUES (?, 'messages', 'insert', 'acct', 'c1', ?, '2025-06-01T10:00:00.000Z', NULL, NULL, ?)`);
    for (let seq = 1; seq <= 4; seq++) ins.run(seq, `m${seq}`, `{"id":"m${seq}","n":${seq}}`);
    db.prepare(`UPDATE export_state SET watermark = 2`).run();
    db.prepare(`UPDATE sqlite_sequence SET seq = 9 WHERE name = 'change_log'`).run();
    expect(db.pragma('auto_vacuum', { simple: true })).toBe(0);
    db.close();

    const m = await openTracked(file);
    expect(sqlValue(m, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
    expect(sqlValue(m, `PRAGMA auto_vacuum`)).toBe(2);
    expect(sqlAll(m, `SELECT seq, record_id FROM change_log ORDER BY seq`)).toEqual([1, 2, 3, 4].map((seq) => ({ seq, record_id: `m${seq}` })));
    expect(sqlAll(m, `SELECT seq, record, line FROM change_payloads ORDER BY seq`)).toEqual([
      { seq: 3, record: '{"id":"m3","n":3}', line: null },
      { seq: 4, record: '{"id":"m4","n":4}', line: null },
    ]);
    expect(sqlGet(m, `SELECT raw, content, sender_name FROM messages`)).toEqual({ raw: JSON.stringify(served), content: 'hi\nthere', sender_name: 'Ann' });
    // the next change gets a seq after the old counter
    await m.upsertConversations('acct', { page: 1, data: [{ id: 'c1' }], raw: [{ id: 'c1' }], meta: { current_page: 1, total_pages: 1, total_count: 1 } }, null);
    expect(sqlValue(m, `SELECT max(seq) FROM change_log`)).toBe(10);
  });

  it('a recorded publication prunes the payloads it published and gives the freed pages back to the file system', async () => {
    const ws = FakeWorkspace.fromCounts([130, 40]);
    const h = await start({ workspace: ws });
    const s = await h.sync();
    expect(s.export.lines).toBeGreaterThan(170);
    expect(sqlValue(h.mirror, `SELECT count(*) FROM change_payloads`)).toBe(0);
    expect(sqlValue(h.mirror, `SELECT count(*) FROM change_log`)).toBe(sqlValue(h.mirror, `SELECT watermark FROM export_state`));
    expect(sqlValue(h.mirror, `PRAGMA freelist_count`)).toBe(0);
  });
});

// SQLite only: the seq counter of the file (sqlite_sequence); the behaviour of page commits is in the conformance suite below.
describe('set-wise page commits', () => {
  const msg = (conversationId: string, id: string, content: string) => ({
    id,
    conversation_id: conversationId,
    content,
    visibility: 'public',
    sender: { id: 'u1', name: 'Ana', type: 'agent' },
    created_at: '2026-01-01T00:00:00Z',
  });
  const page = (objs: Record<string, unknown>[], n = 1, total = objs.length): Page<Message> => ({
    page: n,
    data: objs as unknown as Message[],
    raw: objs,
    meta: { current_page: n, total_pages: Math.max(1, Math.ceil(total / 100)), total_count: total },
  });
  const rows = (m: Mirror) => new Map(sqlAll<{ id: string; position: number; raw: string }>(m, `SELECT id, position, raw FROM messages`).map((r) => [r.id, r]));
  const changeRows = (m: Mirror) =>
    sqlAll<{ seq: number; op: string; record_id: string; record: string }>(
      m,
      `SELECT l.seq, l.op, l.record_id, p.record FROM change_log l JOIN change_payloads p USING (seq) WHERE l.stream = 'messages' ORDER BY l.seq`,
    );


  it('a page of more than 100 messages is written whole, and its seqs continue above every seq ever handed out', async () => {
    const m = await openTracked(dbFile(), movingClock());
    await m.commitMessagesPage(ACCOUNT_ID, 'c1', page([msg('c1', 'first', 'x')]), null);
    // A seq handed out before and no longer present (as after a rolled-back or pruned tail) is not reused.
    const top = sqlValue(m, `SELECT max(seq) FROM change_log`);
    sqlRun(m, `UPDATE sqlite_sequence SET seq = ? WHERE name = 'change_log'`, top + 500);
    const objs = Array.from({ length: 250 }, (_, i) => msg('c2', `m${String(i).padStart(3, '0')}`, `body ${i} ✅ "quoted" \\ \u0000`));
    expect(await m.commitMessagesPage(ACCOUNT_ID, 'c2', page(objs, 1, 250), null)).toMatchObject({ inserted: 250 });
    const changes = changeRows(m).filter((r) => r.record_id !== 'first');
    // top + 501 went to the new conversation's own change (the page made its row).
    expect(sqlValue(m, `SELECT seq FROM change_log WHERE stream = 'conversations' AND record_id = 'c2'`)).toBe(top + 501);
    expect(changes.map((r) => r.seq)).toEqual(Array.from({ length: 250 }, (_, i) => top + 502 + i));
    expect(changes.map((r) => r.record)).toEqual(objs.map((o) => JSON.stringify(o)));
    const stored = rows(m);
    objs.forEach((o, i) => expect(stored.get(o.id)).toMatchObject({ position: i, raw: JSON.stringify(o) }));
    expect(sqlValue(m, `SELECT seq FROM sqlite_sequence WHERE name = 'change_log'`)).toBe(top + 751);
  });
});

// SQLite only: the single-writer lock file has no twin in a server database.
describe('writer lock', () => {
  it('refuses a second writer on the same file while the first holds it, and releases on close', async () => {
    const file = path.join(tempDir(), 'locked.sqlite');
    const first = await openTracked(file);
    try {
      await expect(openMirror(file)).rejects.toThrowError(new RegExp(`the mirror ${file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} is in use by process ${process.pid}`));
      // Readers take no lock.
      const reader = await openMirror(file, { lock: false });
      await reader.close();
    } finally {
      await first.close();
    }
    const again = await openTracked(file);
    await again.close();
  });
});

// ------------------------------------------------------------------ conformance: every engine

describe.each(engines)('store behaviour ($name)', (engine) => {
  afterEach(() => engine.cleanup());
  const startOn = (opts: HarnessOptions): Promise<Harness> => start({ ...opts, engine });

  const msg = (id: string, content = `text of ${id}`) => ({ id, content, visibility: 'public', sender: { id: 'u1', name: 'Ana', type: 'agent' }, created_at: '2026-01-01T00:00:00Z' });
  const page = (objs: Record<string, unknown>[], n = 1, total = objs.length): Page<Message> => ({
    page: n,
    data: objs as unknown as Message[],
    raw: objs,
    meta: { current_page: n, total_pages: Math.max(1, Math.ceil(total / 100)), total_count: total },
  });
  const conversations = (ids: string[]): Page<Conversation> => {
    const objs = ids.map((id) => ({ id, subject: `about ${id}` }));
    return { page: 1, data: objs as unknown as Conversation[], raw: objs, meta: { current_page: 1, total_pages: 1, total_count: ids.length } };
  };
  /** The message change rows above `after`, as the exporter reads them. */
  const messageChanges = async (m: Mirror, after = 0) => (await allChanges(m)).filter((c) => c.stream === 'messages' && c.seq > after);
  /** `n` messages with ids `<prefix>0000`, `<prefix>0001`, ... */
  const many = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => msg(`${prefix}${String(i).padStart(4, '0')}`));

  /** Runs `f` on another writer of `target` that then goes away (a process that died): SQLite's without the writer lock. */
  async function elsewhere<T>(target: string, f: (m: Mirror) => Promise<T>): Promise<T> {
    const o = await engine.open({ lock: false }, target);
    try {
      return await f(o);
    } finally {
      await o.close();
    }
  }

  /** The results of `steps`, run one after the other (a mirror's streamed reads take no other call meanwhile). */
  async function sequentially<T>(steps: (() => Promise<T>)[]): Promise<T[]> {
    const out: T[] = [];
    for (const step of steps) out.push(await step());
    return out;
  }

  /** SQLite only: a message row's timestamps (no method returns them). */
  const stamps = (m: Mirror, conversationId: string, id: string) =>
    engine.name === 'sqlite'
      ? sqlGet<{ first_seen_at: string; updated_at: string }>(m, `SELECT first_seen_at, updated_at FROM messages WHERE conversation_id = ? AND id = ?`, conversationId, id)
      : undefined;

  // ---------------------------------------------------------------- page commits

  it('pages of any size are written whole and in order, each message once, with consecutive seqs, and the same page again writes nothing', async () => {
    const m = await engine.open({ clock: movingClock() });
    let top = 0;
    for (const n of [1, 2, 3, 7, 46, 63, 64, 65, 99, 100, 101, 163, 250]) {
      const conv = `n${n}`;
      const objs = Array.from({ length: n }, (_, i) => msg(`${conv}-${i}`, `body ${i} ✅ "quoted" \\ \u2028`));
      expect(await m.commitMessagesPage(ACCOUNT_ID, conv, page(objs, 1, n), null)).toEqual({ inserted: n, updated: 0, unchanged: 0, deleted: 0 });
      const changes = await messageChanges(m, top);
      expect(changes.map((c) => [c.op, c.record_id, c.conversation_id])).toEqual(objs.map((o) => ['insert', o.id, conv]));
      expect(changes.map((c) => c.record)).toEqual(objs.map((o) => JSON.stringify(o)));
      // top + 1: the conversation's own row (the page made it); then one seq per message, in page order.
      expect(changes.map((c) => c.seq)).toEqual(objs.map((_, i) => top + 2 + i));
      top = Math.max(top, ...changes.map((c) => c.seq));
      for (const i of [0, n - 1]) expect(await m.messageIdAt(ACCOUNT_ID, conv, i)).toBe(objs[i]!.id);
      expect(await m.messageIdAt(ACCOUNT_ID, conv, n)).toBeUndefined();
      expect(await m.commitMessagesPage(ACCOUNT_ID, conv, page(objs, 1, n), null)).toEqual({ inserted: 0, updated: 0, unchanged: n, deleted: 0 });
      expect(await messageChanges(m, top)).toEqual([]);
    }
    expect(await m.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 13, messages: 1 + 2 + 3 + 7 + 46 + 63 + 64 + 65 + 99 + 100 + 101 + 163 + 250 });
  });

  it('a page that repeats an id is written one message at a time: the second copy updates the first, whose version goes to the history', async () => {
    const m = await engine.open({ clock: movingClock() });
    const x1 = msg('x', 'one');
    const x2 = msg('x', 'two');
    expect(await m.commitMessagesPage(ACCOUNT_ID, 'c1', page([x1, msg('y'), x2]), null)).toEqual({ inserted: 2, updated: 1, unchanged: 0, deleted: 0 });
    const changes = await messageChanges(m);
    expect(changes.map((c) => [c.op, c.record_id])).toEqual([
      ['insert', 'x'],
      ['insert', 'y'],
      ['update', 'x'],
    ]);
    expect(await historyRows(m)).toEqual([{ seq: changes[2]!.seq, account_id: ACCOUNT_ID, conversation_id: 'c1', id: 'x', raw: JSON.stringify(x1) }]);
    expect((await messageRows(m, 'c1')).map((r) => [r.id, r.position, r.raw])).toEqual([
      ['y', 1, JSON.stringify(msg('y'))],
      ['x', 2, JSON.stringify(x2)],
    ]);
  });

  it('one page mixing new, unchanged, moved, edited and re-served tombstoned messages: the counts, rows, changes and history of one-by-one upserts', async () => {
    const clock = movingClock();
    const m = await engine.open({ clock });
    const C = 'c1';
    const [a, b, c, d, e] = ['a', 'b', 'c', 'd', 'e'].map((id) => msg(id)) as Record<string, unknown>[];
    expect(await m.commitMessagesPage(ACCOUNT_ID, C, page([a!, b!, c!, d!]), null)).toEqual({ inserted: 4, updated: 0, unchanged: 0, deleted: 0 });
    await m.completeCrawl(ACCOUNT_ID, C, null);
    const t1 = new Map(['a', 'b', 'c', 'd'].map((id) => [id, stamps(m, C, id)]));
    clock.advance(HOUR);
    // d is no longer served: tombstoned by the complete crawl.
    await m.commitMessagesPage(ACCOUNT_ID, C, page([a!, b!, c!]), null);
    expect((await m.completeCrawl(ACCOUNT_ID, C, null)).deleted).toBe(1);
    clock.advance(HOUR);
    const a2 = { ...a!, content: 'edited a' };
    const before = (await messageChanges(m)).at(-1)!.seq;
    // b moved to 0 (unchanged), a edited (position 1), c unchanged, d served again, e new.
    expect(await m.commitMessagesPage(ACCOUNT_ID, C, page([b!, a2, c!, d!, e!]), null)).toEqual({ inserted: 2, updated: 1, unchanged: 2, deleted: 0 });
    expect((await messageRows(m, C)).map((r) => [r.id, r.position, r.raw, r.deleted])).toEqual([
      ['b', 0, JSON.stringify(b), false],
      ['a', 1, JSON.stringify(a2), false],
      ['c', 2, JSON.stringify(c), false],
      ['d', 3, JSON.stringify(d), false],
      ['e', 4, JSON.stringify(e), false],
    ]);
    if (engine.name === 'sqlite') {
      // SQLite only: the rows' timestamps: moved or unchanged rows keep theirs.
      const now = new Date(clock.now()).toISOString();
      expect(stamps(m, C, 'b')).toEqual(t1.get('b'));
      expect(stamps(m, C, 'c')).toEqual(t1.get('c'));
      expect(stamps(m, C, 'a')).toEqual({ ...t1.get('a'), updated_at: now });
      expect(stamps(m, C, 'd')).toEqual({ ...t1.get('d'), updated_at: now });
      expect(stamps(m, C, 'e')).toEqual({ first_seen_at: now, updated_at: now });
      expect(sqlAll(m, `SELECT id, valid_from, valid_to FROM message_history`)).toEqual([{ id: 'a', valid_from: t1.get('a')!.updated_at, valid_to: now }]);
    }
    // Changes in page order with consecutive seqs, each with its record.
    expect((await messageChanges(m, before)).map((r) => ({ seq: r.seq, op: r.op, record_id: r.record_id, record: r.record }))).toEqual([
      { seq: before + 1, op: 'update', record_id: 'a', record: JSON.stringify(a2) },
      { seq: before + 2, op: 'insert', record_id: 'd', record: JSON.stringify(d) },
      { seq: before + 3, op: 'insert', record_id: 'e', record: JSON.stringify(e) },
    ]);
    expect((await historyRows(m)).map((h) => ({ id: h.id, raw: h.raw, seq: h.seq }))).toEqual([{ id: 'a', raw: JSON.stringify(a), seq: before + 1 }]);
  });

  it('an id holding a lone surrogate is found again on the next crawl: no false insert, no rewritten updated_at', async () => {
    const clock = movingClock();
    const m = await engine.open({ clock });
    // SQLite keeps such an id as bytes that read back as U+FFFD: looked up by the text read back, it would never match.
    const objs = [msg('m\ud800', 'lone'), msg('m\udc00x', 'lone too'), msg('ok', 'fine')];
    expect(await m.commitMessagesPage(ACCOUNT_ID, 'c1', page(objs), null)).toMatchObject({ inserted: 3 });
    const first = engine.name === 'sqlite' ? sqlAll(m, `SELECT position, updated_at FROM messages ORDER BY position`) : undefined;
    clock.advance(HOUR);
    expect(await m.commitMessagesPage(ACCOUNT_ID, 'c1', page(objs), null)).toEqual({ inserted: 0, updated: 0, unchanged: 3, deleted: 0 });
    // SQLite only: the rows' timestamps.
    if (engine.name === 'sqlite') expect(sqlAll(m, `SELECT position, updated_at FROM messages ORDER BY position`)).toEqual(first);
    expect(await messageChanges(m)).toHaveLength(3);
    expect(await m.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 1, messages: 3 });
  });

  it('a complete crawl tombstones what its pages no longer serve, with delete rows; the checkpoint goes with it', async () => {
    const m = await engine.open({ clock: movingClock() });
    const served = ['a', 'b', 'c', 'd'].map((id) => msg(id));
    await m.commitMessagesPage(ACCOUNT_ID, 'c1', page(served), null);
    expect(await m.loadCheckpoint(ACCOUNT_ID, 'c1')).toMatchObject({ nextPage: 2, totalCount: 4, lastPageIds: ['a', 'b', 'c', 'd'] });
    expect(await m.completeCrawl(ACCOUNT_ID, 'c1', null)).toEqual({ deleted: 0, messageCount: 4 });
    expect(await m.loadCheckpoint(ACCOUNT_ID, 'c1')).toBeUndefined();
    const top = Math.max(...(await allChanges(m)).map((c) => c.seq));
    await m.commitMessagesPage(ACCOUNT_ID, 'c1', page([served[0]!, served[2]!]), null);
    expect(await m.completeCrawl(ACCOUNT_ID, 'c1', null)).toEqual({ deleted: 2, messageCount: 2 });
    expect((await messageChanges(m, top)).map((c) => [c.op, c.record_id])).toEqual([
      ['delete', 'b'],
      ['delete', 'd'],
    ]);
    expect(await m.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 1, messages: 2 });
    expect(await m.crawlState(ACCOUNT_ID, 'c1')).toMatchObject({ messageCount: 2 });
  });

  // ---------------------------------------------------------------- edits and unchanged rows (syncs)

  it('an edited message gives one update change-log row, its old version in message_history, and a new updated_at', async () => {
    const clock = movingClock();
    const ws = FakeWorkspace.fromCounts([40, 130]);
    const h = await startOn({ workspace: ws, clock });
    await h.sync();
    const conv = ws.list()[1]!;
    const message = conv.messages[117]!;
    const oldRaw = JSON.stringify(message);
    const get = async () => (await messageRows(h.mirror, conv.id)).find((r) => r.id === message.id)!;
    expect((await get()).raw).toBe(oldRaw);
    const before = stamps(h.mirror, conv.id, message.id);
    // SQLite only: every other row's updated_at.
    const othersOf = () => (engine.name === 'sqlite' ? sqlAll(h.mirror, `SELECT id, updated_at FROM messages WHERE id != ? ORDER BY id`, message.id) : undefined);
    const others = othersOf();

    clock.advance(HOUR);
    ws.editMessage(conv.id, message.id, 'Edited: the refund went through ✅\nsecond line');
    const s2 = await h.sync();
    expect(s2.messages.updated).toBe(1);
    expect(s2.messages.inserted).toBe(0);
    expect((await mirrorMatchesFake(h.mirror, ws)).ok).toBe(true);

    const after = await get();
    expect(after.raw).toBe(JSON.stringify(message));
    expect((JSON.parse(after.raw) as { content: string }).content).toBe('Edited: the refund went through ✅\nsecond line');
    expect(after.position).toBe(117);
    expect(after.deleted).toBe(false);
    const afterStamps = stamps(h.mirror, conv.id, message.id);
    if (engine.name === 'sqlite') {
      expect(afterStamps!.updated_at > before!.updated_at).toBe(true);
      expect(afterStamps!.first_seen_at).toBe(before!.first_seen_at);
    }

    const updates = (await allChanges(h.mirror)).filter((c) => c.stream === 'messages' && c.op === 'update');
    expect(updates.length).toBe(1);
    expect(updates[0]!.record_id).toBe(message.id);
    expect(updates[0]!.conversation_id).toBe(conv.id);
    // Published and recorded: the payload is pruned, the export line is the copy.
    expect(updates[0]!.record).toBeNull();
    const exported = readExportLines(h.exportDir, 'messages').filter((l) => l.seq === updates[0]!.seq);
    expect(exported).toEqual([expect.objectContaining({ op: 'update', id: message.id, content: 'Edited: the refund went through ✅\nsecond line' })]);

    expect(await historyRows(h.mirror)).toEqual([{ seq: updates[0]!.seq, account_id: ACCOUNT_ID, conversation_id: conv.id, id: message.id, raw: oldRaw }]);
    if (engine.name === 'sqlite') {
      // SQLite only: the version's validity, and that nothing else was rewritten.
      expect(sqlAll(h.mirror, `SELECT valid_from, valid_to FROM message_history`)).toEqual([{ valid_from: before!.updated_at, valid_to: afterStamps!.updated_at }]);
      expect(othersOf()).toEqual(others);
    }
    // the conversation's last_activity_at moved: one conversation update
    expect((await allChanges(h.mirror)).filter((c) => c.stream === 'conversations' && c.op === 'update').map((c) => c.record_id)).toEqual([conv.id]);

    // editing it again keeps both earlier versions
    const secondRaw = JSON.stringify(message);
    ws.editMessage(conv.id, message.id, 'Edited twice');
    clock.advance(HOUR);
    await h.sync();
    expect((await historyRows(h.mirror)).filter((r) => r.id === message.id).map((r) => r.raw)).toEqual([oldRaw, secondRaw]);
  });

  it('a re-sync of unchanged data writes nothing but its run: change_log grows by its runs line only, updated_at stays', async () => {
    const clock = movingClock();
    const ws = FakeWorkspace.fromCounts([0, 5, 101, 230]);
    const h = await startOn({ workspace: ws, clock });
    await h.sync({ full: true });
    const snap = async () => ({
      messages: await sequentially(ws.list().map((c) => () => messageRows(h.mirror, c.id))),
      conversations: (await h.mirror.listConversations({ includeDeleted: true })).rows.map(({ lastSyncedAt: _, ...row }) => row),
      crawls: await sequentially(ws.list().map((c) => () => h.mirror.crawlState(ACCOUNT_ID, c.id))),
      changes: (await allChanges(h.mirror)).filter((c) => c.stream !== 'runs').length,
      history: (await h.mirror.counts()).message_history,
      // SQLite only: the rows' timestamps.
      stamps:
        engine.name === 'sqlite'
          ? [sqlAll(h.mirror, `SELECT conversation_id, id, updated_at, first_seen_at FROM messages ORDER BY 1, 2`), sqlAll(h.mirror, `SELECT id, updated_at, first_seen_at FROM conversations ORDER BY id`)]
          : undefined,
    });
    const s1 = await snap();
    expect(s1.changes).toBe(4 + 336);
    expect((await h.mirror.counts()).change_log).toBe(4 + 336 + 1);
    clock.advance(HOUR);
    const s = await h.sync({ full: true });
    expect(s.messages).toMatchObject({ inserted: 0, updated: 0, deleted: 0, served: 336 });
    expect(s.conversations).toMatchObject({ inserted: 0, updated: 0 });
    expect(await snap()).toEqual(s1);
    expect((await h.mirror.counts()).change_log).toBe(4 + 336 + 2); // one line per run
  });

  it('a message whose position shifted (an earlier one was deleted) keeps its updated_at and logs no change', async () => {
    const clock = movingClock();
    const ws = FakeWorkspace.fromCounts([150]);
    const h = await startOn({ workspace: ws, clock });
    await h.sync();
    const conv = ws.list()[0]!;
    const read = async () => new Map((await messageRows(h.mirror, conv.id)).map((r) => [r.id, r]));
    // SQLite only: the rows' updated_at.
    const updatedAt = () => (engine.name === 'sqlite' ? sqlAll(h.mirror, `SELECT id, updated_at FROM messages WHERE deleted_at IS NULL ORDER BY id`) : undefined);
    const before = await read();
    const victim = conv.messages[0]!.id;
    const kept = updatedAt()?.filter((r) => r['id'] !== victim);
    ws.deleteMessage(conv.id, victim);
    clock.advance(HOUR);
    await h.sync();
    const after = await read();
    for (const [i, m] of conv.messages.entries()) {
      expect(after.get(m.id)!.position).toBe(i);
      expect(before.get(m.id)!.position).toBe(i + 1);
    }
    expect(updatedAt()).toEqual(kept);
    expect(after.get(victim)!.deleted).toBe(true);
    const ops = new Map<string, number>();
    for (const c of await allChanges(h.mirror)) if (c.stream === 'messages') ops.set(c.op, (ops.get(c.op) ?? 0) + 1);
    expect(Object.fromEntries(ops)).toEqual({ insert: 150, delete: 1 });
  });

  // ---------------------------------------------------------------- reading a batch for export

  it('gives every row of the batch once, in file order (stream, account, day, seq), across interleaved accounts, days and partitions longer than a read', async () => {
    const clock = movingClock();
    const m = await engine.open({ clock });
    // Day 1: accounts A and B interleaved page by page; a partition of 1,500 rows.
    await m.commitMessagesPage('A', 'a1', page(many('x', 60)), null);
    await m.commitMessagesPage('B', 'b1', page(many('y', 40)), null);
    await m.commitMessagesPage('A', 'a1', page(many('z', 30), 2), null);
    // SQLite only: a seq gap (seqs handed out and gone); PostgreSQL hands out seqs with none.
    if (engine.name === 'sqlite') sqlRun(m, `UPDATE sqlite_sequence SET seq = seq + 100 WHERE name = 'change_log'`);
    for (let p = 0; p < 15; p++) await m.commitMessagesPage('A', `a${p + 2}`, page(many(`p${p}-`, 100)), null);
    clock.advance(24 * HOUR);
    // Day 2: both accounts again.
    await m.commitMessagesPage('B', 'b1', page(many('w', 20), 2), null);
    await m.commitMessagesPage('A', 'a1', page(many('v', 10), 3), null);
    const read = async (first: number, last: number) => {
      const out: ExportChange[] = [];
      for await (const c of m.changesOf({ first_seq: first, last_seq: last })) out.push(c);
      return out;
    };
    const everything = await read(1, Number.MAX_SAFE_INTEGER);
    expect(everything).toHaveLength(60 + 40 + 30 + 1500 + 20 + 10 + 2 + 15);
    expect(everything).toHaveLength((await m.counts()).change_log!);
    expect(new Set(everything.map((c) => c.seq)).size).toBe(everything.length);
    for (const c of everything) expect(c.day).toBe(c.synced_at.slice(0, 10));
    expect(new Set(everything.map((c) => c.day)).size).toBe(2);
    /** The rows of `[first, last]` in file order, sorted here (code-unit order, as both engines sort). */
    const key = (c: ExportChange) => [c.stream, c.account_id, c.day];
    const reference = (first: number, last: number) =>
      everything
        .filter((c) => c.seq >= first && c.seq <= last)
        .sort((x, y) => {
          for (const [a, b] of key(x).map((k, i) => [k, key(y)[i]!])) if (a !== b) return a! < b! ? -1 : 1;
          return x.seq - y.seq;
        });
    const top = await maxSeq(m);
    expect(everything).toEqual(reference(1, top));
    // A batch that starts and ends inside runs of rows of one partition.
    expect(await read(75, top - 5)).toEqual(reference(75, top - 5));
    expect(await read(500, 700)).toEqual(reference(500, 700));
    expect(await read(top + 1, top + 10)).toEqual([]);
  });

  it("reads at most 8 MiB of payload at once (one larger record alone), whatever the records' size", async () => {
    const m = await engine.open({ clock: movingClock() });
    const big = (id: string, mib: number) => ({ ...msg(id), content: 'x'.repeat(mib * 1024 * 1024) });
    const objs = [...Array.from({ length: 20 }, (_, i) => big(`b${String(i).padStart(2, '0')}`, 1)), big('huge', 9), msg('small')];
    await m.commitMessagesPage('A', 'a1', { page: 1, data: objs as unknown as Message[], raw: objs, meta: { current_page: 1, total_pages: 1, total_count: objs.length } }, null);
    const top = await maxSeq(m);
    const chunks: ExportChange[][] = [];
    for await (const c of m.changeChunksOf({ first_seq: 1, last_seq: top })) chunks.push(c);
    const bytes = (c: { record: string | null }[]) => c.reduce((n, r) => n + Buffer.byteLength(r.record ?? ''), 0);
    for (const c of chunks) expect(c.length === 1 || bytes(c) <= 8 * 1024 * 1024, `${c.length} rows, ${bytes(c)} bytes`).toBe(true);
    expect(chunks.flat().map((r) => r.record_id)).toEqual(['a1', ...objs.map((o) => o.id)]);
    expect(chunks.map((c) => c.length)).toContain(1); // the 9 MiB record
  });

  it('an open-ended read gives the rows there were when it started, in every partition alike, whatever is committed while it runs', async () => {
    const m = await engine.open({ clock: movingClock() });
    await m.commitMessagesPage('B', 'b1', page(many('y', 10)), null);
    for (let p = 0; p < 15; p++) await m.commitMessagesPage('A', `a${p}`, page(many(`p${p}-`, 100)), null);
    const top = await m.unexportedChanges(); // nothing published: every row is above the watermark
    const seen: number[] = [];
    let committed = false;
    for await (const c of m.changesOf({ first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER })) {
      seen.push(c.seq);
      if (!committed && seen.length === 1500) {
        // Mid-read: rows for both accounts, committed after the read began.
        await m.commitMessagesPage('A', 'a99', page(many('late-a', 5)), null);
        await m.commitMessagesPage('B', 'b2', page(many('late-b', 5)), null);
        committed = true;
      }
    }
    expect(committed).toBe(true);
    expect(seen.sort((a, b) => a - b)).toEqual(Array.from({ length: top }, (_, i) => i + 1));
  });

  it('a publication prunes the payloads of its batch and keeps those committed after the batch was planned', async () => {
    const m = await engine.open({ clock: movingClock() });
    const exportDir = path.join(tempDir(), 'exports');
    dirs.push(path.dirname(exportDir));
    await m.commitMessagesPage('A', 'a1', page(many('x', 30)), null);
    let committedMeanwhile = 0;
    const res = await publishChanges(m, {
      exportDir,
      failpoint: async (point) => {
        // After the batch's files, before its record: a page committed meanwhile (as the daemon does).
        if (point === 'before-record' && committedMeanwhile === 0) committedMeanwhile = (await m.commitMessagesPage('A', 'a1', page(many('y', 5), 2), null)).inserted;
      },
    });
    expect(committedMeanwhile).toBe(5);
    expect(res.lines).toBe(31);
    const kept = async () => (await allChanges(m)).filter((c) => c.record !== null).map((c) => c.record_id);
    expect(await kept()).toEqual(many('y', 5).map((o) => o.id));
    expect((await publishChanges(m, { exportDir })).lines).toBe(5);
    expect(await kept()).toEqual([]);
    expect(await verifyExports(m, exportDir)).toEqual([]);
  });

  it('unexportedChanges counts the change-log rows above the watermark: all before publication, none after, the new ones after that', async () => {
    const m = await engine.open({ clock: movingClock() });
    const exportDir = path.join(tempDir(), 'exports');
    dirs.push(path.dirname(exportDir));
    expect(await m.unexportedChanges()).toBe(0);
    await m.upsertConversations(ACCOUNT_ID, conversations(['c1', 'c2']), null);
    await m.commitMessagesPage(ACCOUNT_ID, 'c1', page([msg('m1'), msg('m2'), msg('m3')]), null);
    expect(await m.unexportedChanges()).toBe(5);
    expect((await publishChanges(m, { exportDir })).lines).toBe(5);
    expect(await m.unexportedChanges()).toBe(0);
    expect(await m.exportWatermark()).toBe(5);
    await m.upsertConversations(ACCOUNT_ID, conversations(['c-new']), null);
    expect(await m.unexportedChanges()).toBe(1);
    expect(await verifyExports(m, exportDir)).toEqual([]);
  });

  // ---------------------------------------------------------------- runs

  it('records status, counts and requests of each run', async () => {
    const ws = FakeWorkspace.fromCounts([3, 120, 0]);
    // noon UTC of a fixed day: one date partition per stream
    const h = await startOn({ workspace: ws, clock: movingClock() });
    const s1 = await h.sync({ full: true });
    const row = async (id: number) => (await runRow(h.mirror, id))!;
    const r1 = await row(s1.runId);
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
    const r2 = await row(s2.runId);
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
    expect((await h.mirror.counts()).runs).toBe(2);
  });

  it("a run left 'running' becomes 'interrupted' at the start-up sweep, not when another run starts; reopening keeps every run", async () => {
    const target = engine.target();
    const m1 = await engine.open({}, target);
    const dead = await m1.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    await m1.close(); // the process "died" without finishRun
    const m2 = await engine.open({}, target);
    expect(await m2.runStatus(dead)).toBe('running');
    // Runs overlap in the daemon: starting or finishing one never touches another.
    const concurrent = await m2.startRun({ scope: 'conversations', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
    expect(concurrent).toBeGreaterThan(dead);
    expect(await m2.runStatus(dead)).toBe('running');
    await m2.finishRun(concurrent, { status: 'succeeded' });
    expect(await m2.runStatus(dead)).toBe('running');
    expect(await m2.markInterruptedRuns()).toBe(1);
    expect(await m2.runStatus(dead)).toBe('interrupted');
    expect(await m2.runEnded(dead)).toBe(true);
    expect((await runRow(m2, dead))!['ended_at']).not.toBeNull();
    expect(await m2.resumeRun(dead)).toBe('resumed');
    expect(await m2.runStatus(dead)).toBe('running');
    expect((await m2.lastRuns(5)).map((r) => [r['id'], r['status']])).toEqual([
      [concurrent, 'succeeded'],
      [dead, 'running'],
    ]);
  });

  it("a run left 'running' is marked interrupted by the start-up sweep; a sync itself never touches another run", async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const h = await startOn({ workspace: ws });
    const other = await elsewhere(h.dbPath, (o) => o.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }));
    const s1 = await h.sync();
    expect(await h.mirror.runStatus(other)).toBe('running');
    expect(await sweepInterruptedRuns(h.mirror, quietLogger())).toBe(1);
    const s2 = await h.sync();
    expect((await h.mirror.lastRuns(5)).map((r) => ({ id: r['id'], status: r['status'] }))).toEqual([
      { id: s2.runId, status: 'succeeded' },
      { id: s1.runId, status: 'succeeded' },
      { id: other, status: 'interrupted' },
    ]);
  });
});
