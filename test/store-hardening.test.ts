/**
 * Store hardening (issue 8): private file modes whatever the umask, read-only opens that create and
 * change nothing, corrupt or full files stopping every write, conversations back from a tombstone,
 * forgotten crawl baselines and resumed runs. Real SQLite files in temp dirs; umask tests run in a
 * child `node` on the built `dist/` (the umask is process-wide, and process.umask() throws in worker threads).
 * What is no fault of a file runs on every engine of the store (the conformance suite at the end).
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { MIGRATIONS } from '../src/store/sqlite/migrations.js';
import { MirrorUnusableError, StoreError } from '../src/errors.js';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { exportLine } from '../src/export/lines.js';
import { ACCOUNT_ID, harnessPool, snapshotEntries, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import { sqlAll, sqlRun, sqlValue } from './sql.js';
import { engines } from './engines.js';
import { changeRows, mirrorMatchesFake, opsOf, runRow } from './mirror-reads.js';

const pool = harnessPool();
const dirs: string[] = [];
const mirrors: Mirror[] = [];
afterEach(async () => {
  for (const m of mirrors.splice(0)) await m.close();
  await pool.closeAll();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

function dir(): string {
  const d = tempDir();
  dirs.push(d);
  return d;
}

function track(m: Mirror): Mirror {
  mirrors.push(m);
  return m;
}

/** What `f` throws (fails the test when it throws nothing). */
async function thrown(f: () => unknown): Promise<unknown> {
  try {
    await f();
  } catch (err) {
    return err;
  }
  throw new Error('expected an error, none was thrown');
}

// ------------------------------------------------------------------ synthetic API pages

function messagePage(conversationId: string, page: number, count: number, total: number, contentBytes = 120): Page<Message> {
  const data: Message[] = [];
  for (let i = 0; i < count; i++) {
    const n = (page - 1) * 100 + i;
    data.push({
      id: `${conversationId}-m${String(n).padStart(5, '0')}`,
      content: `message ${n} `.padEnd(contentBytes, 'x'),
      visibility: n % 7 === 0 ? 'internal' : 'global',
      sender: { id: `s${n % 13}`, name: `Sender ${n % 13}`, type: n % 2 ? 'Customer' : 'Agent' },
      created_at: new Date(Date.UTC(2025, 0, 1) + n * 60_000).toISOString(),
    });
  }
  return { page, data, raw: data.map((m) => ({ ...m })), meta: { current_page: page, total_count: total, total_pages: Math.max(1, Math.ceil(total / 100)) } };
}

function conversationPage(convs: Record<string, unknown>[]): Page<Conversation> {
  return { page: 1, data: convs as Conversation[], raw: convs, meta: { current_page: 1, total_count: convs.length, total_pages: 1 } };
}

/** Lists, crawls (every page) and completes `conversations` conversations of `perConversation` messages. */
async function fill(m: Mirror, conversations: number, perConversation: number, contentBytes = 120): Promise<string[]> {
  const ids = Array.from({ length: conversations }, (_, i) => `c${String(i).padStart(3, '0')}`);
  await m.upsertConversations(ACCOUNT_ID, conversationPage(ids.map((id) => ({ id, updated_at: '2025-06-01T00:00:00Z' }))), null);
  for (const id of ids) {
    for (let p = 1, left = perConversation; p === 1 || left > 0; p++, left -= 100) {
      await m.commitMessagesPage(ACCOUNT_ID, id, messagePage(id, p, Math.min(100, Math.max(0, left)), perConversation, contentBytes), null);
    }
    await m.completeCrawl(ACCOUNT_ID, id, null, 'updated_at');
  }
  return ids;
}

const mode = (p: string) => fs.statSync(p).mode & 0o7777;

// ------------------------------------------------------------------ 1. private files

const distMirror = fileURLToPath(new URL('../dist/src/store/sqlite/mirror.js', import.meta.url));
const distPrivateFs = fileURLToPath(new URL('../dist/src/private-fs.js', import.meta.url));

/**
 * In a child `node` with `umask`, opens a mirror at `rel` (relative to `cwd`) as a writer with the
 * given modes, writes a run (so -wal and -shm exist), and reports the mode of every entry under
 * `cwd` while the mirror is open and after it is closed.
 */
function openInChild(cwd: string, rel: string, umask: number, modes: 'PRIVATE_MODES' | 'GROUP_READABLE_MODES'): {
  open: Record<string, number>;
  closed: Record<string, number>;
  file: string;
} {
  const script = `
    import fs from 'node:fs';
    import path from 'node:path';
    const { SqliteMirror } = await import(${JSON.stringify(distMirror)});
    const pfs = await import(${JSON.stringify(distPrivateFs)});
    process.umask(${umask});
    const modesOf = (d) => {
      const out = {};
      const walk = (p, rel) => {
        for (const n of fs.readdirSync(p)) {
          const abs = path.join(p, n), r = rel ? rel + '/' + n : n;
          out[r] = fs.statSync(abs).mode & 0o7777;
          if (fs.statSync(abs).isDirectory()) walk(abs, r);
        }
      };
      walk(d, '');
      return out;
    };
    const m = SqliteMirror.open(${JSON.stringify(rel)}, { modes: pfs.${modes} });
    await m.finishRun(await m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: 'a' }), { status: 'succeeded' });
    const open = modesOf('.');
    const file = m.file;
    await m.close();
    process.stdout.write(JSON.stringify({ open, closed: modesOf('.'), file }));
  `;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd, encoding: 'utf8', env: { PATH: process.env.PATH, HOME: process.env.HOME } });
  if (r.status !== 0) throw new Error(`child node failed (status ${r.status}): ${r.stderr}`);
  return JSON.parse(r.stdout) as { open: Record<string, number>; closed: Record<string, number>; file: string };
}

// SQLite only: file and directory modes of the database file and its lock.
describe('private files whatever the umask', () => {
  for (const umask of [0o000, 0o077, 0o777]) {
    for (const [name, file, dirMode] of [
      ['PRIVATE_MODES', 0o600, 0o700],
      ['GROUP_READABLE_MODES', 0o640, 0o750],
    ] as const) {
      it(`umask ${umask.toString(8).padStart(3, '0')}, ${name}: missing directories ${dirMode.toString(8)}, the database, -wal, -shm and lock files ${file.toString(8)}; an existing directory untouched`, () => {
        const root = dir();
        fs.chmodSync(root, 0o755);
        fs.mkdirSync(path.join(root, 'existing'));
        fs.chmodSync(path.join(root, 'existing'), 0o755);
        const r = openInChild(root, 'existing/new/deeper/mirror.sqlite', umask, name);
        expect(r.file).toBe(path.join(fs.realpathSync(root), 'existing/new/deeper/mirror.sqlite'));
        expect(r.open['existing']).toBe(0o755);
        expect(r.open['existing/new']).toBe(dirMode);
        expect(r.open['existing/new/deeper']).toBe(dirMode);
        const files = Object.keys(r.open).filter((k) => k.startsWith('existing/new/deeper/')).map((k) => k.slice('existing/new/deeper/'.length));
        for (const f of ['mirror.sqlite', 'mirror.sqlite-wal', 'mirror.sqlite-shm', 'mirror.sqlite.lock', 'mirror.sqlite.lock.json']) expect(files).toContain(f);
        for (const f of files) expect(r.open[`existing/new/deeper/${f}`], f).toBe(file);
        // Closed: the WAL is checkpointed away, the holder info removed; what stays is still private.
        expect(Object.keys(r.closed).filter((k) => k.startsWith('existing/new/deeper/')).sort()).toEqual(['existing/new/deeper/mirror.sqlite', 'existing/new/deeper/mirror.sqlite.lock']);
        for (const [k, v] of Object.entries(r.closed)) expect(v, k).toBe(k === 'existing' ? 0o755 : k.endsWith('.sqlite') || k.endsWith('.lock') ? file : dirMode);
        expect(mode(root)).toBe(0o755);
      });
    }
  }

  it('a path starting with file: is a plain relative path, never a URI', async () => {
    const root = dir();
    const r = openInChild(root, 'file:mirror.sqlite', 0o022, 'PRIVATE_MODES');
    expect(r.file).toBe(path.join(fs.realpathSync(root), 'file:mirror.sqlite'));
    expect(Object.keys(r.closed).sort()).toEqual(['file:mirror.sqlite', 'file:mirror.sqlite.lock']);
    const ro = track(await openMirror(path.join(root, 'file:mirror.sqlite'), { readonly: true }));
    expect(await ro.lastRuns(5)).toHaveLength(1);
  });

  it('an existing database file and lock keep their mode; a leftover holder file is replaced by a private one', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    await (await openMirror(file)).close();
    fs.chmodSync(file, 0o644);
    fs.writeFileSync(`${file}.lock.json`, JSON.stringify({ pid: 1, host: 'gone', since: 'then' }), { mode: 0o644 });
    fs.chmodSync(`${file}.lock.json`, 0o644);
    const m = track(await openMirror(file));
    expect(mode(file)).toBe(0o644);
    expect(mode(`${file}.lock`)).toBe(0o600);
    expect(mode(`${file}.lock.json`)).toBe(0o600);
    expect(JSON.parse(fs.readFileSync(`${file}.lock.json`, 'utf8'))).toMatchObject({ pid: process.pid });
    await m.close();
    expect(fs.existsSync(`${file}.lock.json`)).toBe(false);
  });
});

// ------------------------------------------------------------------ 2. read-only opens

// SQLite only: the file and what lies beside it (bytes, mtimes, -wal, immutable opens, SQLite's
// migrations and file formats); what any engine does is in 'read-only open (any engine)' below.
describe('read-only open', () => {
  async function closedCopy(): Promise<{ dir: string; file: string; ids: string[] }> {
    const src = path.join(dir(), 'mirror.sqlite');
    const w = await openMirror(src);
    const ids = await fill(w, 3, 150);
    await w.finishRun(await w.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }), { status: 'succeeded', requests: 9 });
    await w.close();
    const copyDir = path.join(dir(), 'auditor copy #1 ?x=%20');
    fs.mkdirSync(copyDir);
    fs.copyFileSync(src, path.join(copyDir, 'mirror.sqlite'));
    return { dir: copyDir, file: path.join(copyDir, 'mirror.sqlite'), ids };
  }

  it('on a closed copy creates no file and changes no byte or mtime, and reads everything', async () => {
    const { dir: d, file } = await closedCopy();
    const before = snapshotEntries(d);
    const m = await openMirror(file, { readonly: true });
    expect(m.location).toBe(file);
    expect(m.access).toBe('immutable');
    expect(await m.snapshotChanged()).toBe(false);
    expect(await m.counts()).toMatchObject({ conversations: 3, messages: 450, runs: 1, change_log: 454 });
    expect(await m.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 3, messages: 450 });
    expect(await m.lastRuns(5)).toMatchObject([{ status: 'succeeded', requests: 9, resumes: 0 }]);
    expect(await m.lastRunFailures()).toEqual([]);
    expect(await m.mirrorId()).toMatch(/^[0-9a-f]{32}$/);
    expect(await m.quickCheck()).toEqual([]);
    expect((await m.crawlState(ACCOUNT_ID, 'c001')).messageCount).toBe(150);
    expect(fs.readdirSync(d)).toEqual(['mirror.sqlite']);
    // Writes are refused before SQLite is touched.
    for (const write of [
      () => m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }),
      () => m.markInterruptedRuns(),
      () => m.upsertConversations(ACCOUNT_ID, conversationPage([{ id: 'new' }]), null),
      () => m.commitMessagesPage(ACCOUNT_ID, 'c000', messagePage('c000', 1, 3, 3), null),
      () => m.forgetCrawlBaseline(ACCOUNT_ID, 'c000'),
      () => m.resumeRun(1),
    ]) {
      const err = await thrown(write);
      expect(err).toBeInstanceOf(StoreError);
      expect((err as StoreError).message).toContain('read-only');
    }
    await m.close();
    expect(snapshotEntries(d)).toEqual(before);
    expect(await m.snapshotChanged()).toBe(false); // closed
  });

  it('an older schema is refused (read-only commands never migrate) and left unchanged', async () => {
    const d = dir();
    const file = path.join(d, 'old.sqlite');
    const db = new Database(file);
    db.pragma('journal_mode = WAL');
    for (let v = 0; v < MIGRATIONS.length - 1; v++) db.exec(MIGRATIONS[v]!);
    db.pragma(`user_version = ${MIGRATIONS.length - 1}`);
    db.close();
    const before = snapshotEntries(d);
    const err = await thrown(() => openMirror(file, { readonly: true }));
    expect(err).toBeInstanceOf(StoreError);
    expect((err as StoreError).message).toContain(file);
    expect((err as StoreError).message).toMatch(/read-only commands never migrate.*sync/);
    expect(snapshotEntries(d)).toEqual(before);
    const after = new Database(file, { readonly: true });
    expect(after.pragma('user_version', { simple: true })).toBe(MIGRATIONS.length - 1);
    after.close();
    // The writer migrates it.
    const w = await openMirror(file);
    expect(sqlValue(w, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
    await w.close();
    track(await openMirror(file, { readonly: true }));
  });

  it('a newer schema, a foreign SQLite file and an empty file are refused read-only, unchanged', async () => {
    const d = dir();
    const newer = path.join(d, 'newer.sqlite');
    await (await openMirror(newer)).close();
    const db = new Database(newer);
    db.pragma(`user_version = ${MIGRATIONS.length + 1}`);
    db.close();
    const foreign = path.join(d, 'foreign.sqlite');
    const f = new Database(foreign);
    f.exec(`CREATE TABLE invoices (id INTEGER PRIMARY KEY)`);
    f.close();
    const empty = path.join(d, 'empty.sqlite');
    fs.writeFileSync(empty, '');
    const before = snapshotEntries(d);
    for (const [file, text] of [
      [newer, /newer than this convo-mirror/],
      [foreign, /not a convo-mirror mirror/],
      [empty, /not a convo-mirror mirror/],
    ] as const) {
      const err = await thrown(() => openMirror(file, { readonly: true }));
      expect(err).toBeInstanceOf(StoreError);
      expect((err as Error).message).toMatch(text);
      expect((err as Error).message).toContain(file);
    }
    expect(snapshotEntries(d)).toEqual(before);
  });

  it('a writer refuses a foreign SQLite file without changing a byte of it', async () => {
    const d = dir();
    const foreign = path.join(d, 'foreign.sqlite');
    const f = new Database(foreign);
    f.exec(`CREATE TABLE invoices (id INTEGER PRIMARY KEY)`);
    f.close();
    const bytes = fs.readFileSync(foreign);
    await expect(openMirror(foreign)).rejects.toThrow(/not a convo-mirror mirror/);
    expect(fs.readFileSync(foreign).equals(bytes)).toBe(true);
  });
});

// ------------------------------------------------------------------ 3. unusable files

// SQLite only: damaged pages, a garbage header and a full disk are faults of a file.
describe('corrupt and unusable files', () => {
  it('a mirror with damaged middle pages: the next write throws MIRROR_CORRUPT, nothing more is written, quickCheck reports it', async () => {
    const file = path.join(dir(), 'mirror.sqlite');
    const w = await openMirror(file);
    const ids = await fill(w, 30, 120);
    expect((await w.liveCounts(ACCOUNT_ID)).messages).toBe(3600);
    await w.close();
    // Damage the root pages of the message and conversation b-trees and the middle third of the file.
    const ro = await openMirror(file, { readonly: true }); // creates no -wal (a plain read-only connection would)
    const pageSize = sqlValue(ro, `PRAGMA page_size`);
    const pageCount = sqlValue(ro, `PRAGMA page_count`);
    const roots = sqlAll<{ rootpage: number }>(ro, `SELECT rootpage FROM sqlite_master WHERE tbl_name IN ('messages', 'conversations') AND rootpage > 0`).map((r) => r.rootpage);
    await ro.close();
    expect(fs.existsSync(`${file}-wal`)).toBe(false);
    const fd = fs.openSync(file, 'r+');
    const garbage = Buffer.alloc(pageSize, 0xa5);
    const pages = new Set([...roots, ...Array.from({ length: Math.floor(pageCount / 3) }, (_, i) => Math.floor(pageCount / 3) + i)]);
    for (const p of pages) if (p > 1) fs.writeSync(fd, garbage, 0, pageSize, (p - 1) * pageSize);
    fs.closeSync(fd);

    let err: unknown;
    let m: Mirror | undefined;
    try {
      m = track(await openMirror(file));
      await m.commitMessagesPage(ACCOUNT_ID, ids[0]!, messagePage(ids[0]!, 2, 100, 200), null);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(MirrorUnusableError);
    expect((err as MirrorUnusableError).code).toBe('MIRROR_CORRUPT');
    expect((err as MirrorUnusableError).sqliteCode).toMatch(/^SQLITE_CORRUPT/);
    expect((err as Error).message).toContain(file);
    expect(m).toBeDefined(); // the schema page is sound: the damage shows at the first write
    const problems = await m!.quickCheck();
    expect(problems.length).toBeGreaterThan(0);
    expect(problems.join('\n')).not.toBe('ok');
    // From now on this instance writes nothing, whatever the call.
    const bytes = fs.readFileSync(file);
    const walBytes = fs.readFileSync(`${file}-wal`);
    for (const write of [
      () => m!.upsertConversations(ACCOUNT_ID, conversationPage([{ id: 'zzz' }]), null),
      () => m!.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }),
      () => m!.resumeRun(1),
      () => m!.forgetCrawlBaseline(ACCOUNT_ID, ids[0]!),
    ]) {
      const e = await thrown(write);
      expect(e).toBeInstanceOf(MirrorUnusableError);
      expect((e as MirrorUnusableError).code).toBe('MIRROR_CORRUPT');
    }
    expect(fs.readFileSync(file).equals(bytes)).toBe(true);
    expect(fs.readFileSync(`${file}-wal`).equals(walBytes)).toBe(true);
    // A read-only open sees the same damage.
    const r = track(await openMirror(file, { readonly: true }));
    expect((await r.quickCheck()).length).toBeGreaterThan(0);
    expect(await thrown(() => r.liveConversationIds(ACCOUNT_ID))).toBeInstanceOf(MirrorUnusableError);
  });

  it('a garbage header: MIRROR_CORRUPT (SQLITE_NOTADB) naming the file at open, writer or reader, and the file is left as it was', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    const w = await openMirror(file);
    await fill(w, 2, 10);
    await w.close();
    const fd = fs.openSync(file, 'r+');
    fs.writeSync(fd, Buffer.from('garbage, not a header '.repeat(5)), 0, 100, 0);
    fs.closeSync(fd);
    const bytes = fs.readFileSync(file);
    for (const opts of [{}, { readonly: true }, { lock: false }]) {
      const err = await thrown(async () => track(await openMirror(file, opts)));
      expect(err).toBeInstanceOf(MirrorUnusableError);
      expect((err as MirrorUnusableError).code).toBe('MIRROR_CORRUPT');
      expect((err as MirrorUnusableError).sqliteCode).toBe('SQLITE_NOTADB');
      expect((err as Error).message).toContain(file);
      expect((err as MirrorUnusableError).context['file']).toBe(file);
    }
    expect(fs.readFileSync(file).equals(bytes)).toBe(true);
    expect(fs.existsSync(`${file}-wal`)).toBe(false);
    // The writer lock was released: a sound file can be put back and opened.
    expect(fs.existsSync(`${file}.lock.json`)).toBe(false);
  });

  it('a full disk (max_page_count reached): MIRROR_UNWRITABLE with SQLITE_FULL, nothing half-written, and writing resumes once there is room', async () => {
    const file = path.join(dir(), 'mirror.sqlite');
    const m = track(await openMirror(file));
    const ids = await fill(m, 2, 50);
    const pages = sqlValue(m, `PRAGMA page_count`);
    expect(sqlValue(m, `PRAGMA freelist_count`)).toBe(0);
    sqlRun(m, `PRAGMA max_page_count = ${pages}`);
    const changes = (await m.counts()).change_log;
    const err = await thrown(() => m.commitMessagesPage(ACCOUNT_ID, ids[1]!, messagePage(ids[1]!, 1, 100, 100, 4000), null));
    expect(err).toBeInstanceOf(MirrorUnusableError);
    expect((err as MirrorUnusableError).code).toBe('MIRROR_UNWRITABLE');
    expect((err as MirrorUnusableError).sqliteCode).toBe('SQLITE_FULL');
    expect((err as Error).message).toContain(file);
    expect((err as Error).message).toContain('disk is full');
    expect((await m.liveCounts(ACCOUNT_ID)).messages).toBe(100);
    expect((await m.counts()).change_log).toBe(changes);
    expect(await m.loadCheckpoint(ACCOUNT_ID, ids[1]!)).toBeUndefined();
    sqlRun(m, `PRAGMA max_page_count = ${pages * 100}`);
    expect((await m.commitMessagesPage(ACCOUNT_ID, ids[1]!, messagePage(ids[1]!, 1, 100, 100, 4000), null)).inserted).toBe(50);
  });
});

// SQLite only: migrates a file written by an older version (a PostgreSQL mirror starts at the current schema).
describe('erasures of an older mirror', () => {
  it('migration 12 keeps the erasures of a version 11 mirror, ids and all, and admits kind retention', async () => {
    const file = path.join(dir(), 'v11.sqlite');
    const db = new Database(file);
    for (let v = 0; v < 11; v++) db.exec(MIGRATIONS[v]!);
    db.pragma('user_version = 11');
    const insert = db.prepare(
      `INSERT INTO erasures (kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations, published_lines, published_through_seq, archive_done_at, archive_batch_id)
       VALUES (?, 'acc', ?, 'DSR-1', '2026-01-01T00:00:00.000Z', 3, 1, 0, 0, 4, 9, '2026-01-01T00:01:00.000Z', 5)`,
    );
    insert.run('sender', 'cus_1');
    expect(() => insert.run('retention', '2025-01-01')).toThrow(/CHECK constraint failed/);
    db.close();
    const m = track(await openMirror(file));
    expect(sqlValue(m, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
    expect(await m.erasures()).toEqual([
      {
        id: 1,
        kind: 'sender',
        accountId: 'acc',
        subject: 'cus_1',
        reason: 'DSR-1',
        requestedAt: '2026-01-01T00:00:00.000Z',
        messages: 3,
        history: 1,
        pendingChanges: 0,
        conversations: 0,
        publishedLines: 4,
        publishedThroughSeq: 9,
        archiveBatchId: 5,
        archiveDoneAt: '2026-01-01T00:01:00.000Z',
      },
    ]);
    const r = await m.eraseSubject({ kind: 'retention', accountId: 'acc', subject: '2025-01-01', reason: 'retention 400d' });
    expect(r.erasureId).toBe(2);
    expect((await m.erasures()).map((e) => e.kind)).toEqual(['sender', 'retention']);
    expect(sqlAll(m, `SELECT name FROM sqlite_master WHERE tbl_name = 'erasures' AND type = 'index'`)).toEqual([{ name: 'erasures_by_subject' }]);
  });
});

describe('runs of an older mirror', () => {
  it('migration 4 adds runs.resumes = 0 to the runs of an older mirror', async () => {
    const file = path.join(dir(), 'old.sqlite');
    const db = new Database(file);
    for (let v = 0; v < 3; v++) db.exec(MIGRATIONS[v]!);
    db.pragma('user_version = 3');
    db.prepare(`INSERT INTO runs (mode, account_id, started_at, status) VALUES ('full', 'default', '2025-01-01T00:00:00.000Z', 'interrupted')`).run();
    db.close();
    const m = track(await openMirror(file));
    expect(sqlValue(m, `PRAGMA user_version`)).toBe(MIGRATIONS.length);
    expect(await m.lastRuns(1)).toMatchObject([{ id: 1, status: 'interrupted', resumes: 0 }]);
    expect(await m.resumeRun(1)).toBe('resumed');
    expect(await m.lastRuns(1)).toMatchObject([{ id: 1, status: 'running', resumes: 1 }]);
  });
});

// ------------------------------------------------------------------ every engine (the conformance suite: test/engines.ts)

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  /** Runs `f` on another writer of `target` that then goes away (a process that died): SQLite's without the writer lock. */
  async function elsewhere<T>(target: string, f: (m: Mirror) => Promise<T>): Promise<T> {
    const o = await engine.open({ lock: false }, target);
    try {
      return await f(o);
    } finally {
      await o.close();
    }
  }

  // ---------------------------------------------------------------- 2. read-only opens

  describe('read-only open (any engine)', () => {
    it('with a writer open: reads what it committed and sees each later commit, takes no lock, and refuses every write', async () => {
      const target = engine.target();
      const w = await engine.open({}, target);
      await fill(w, 2, 30);
      await w.finishRun(await w.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }), { status: 'succeeded', requests: 9 });
      // SQLite only: the writer's -wal, which the reader reads through.
      if (engine.name === 'sqlite') expect(fs.existsSync(`${target}-wal`)).toBe(true);
      const r = await engine.open({ readonly: true }, target);
      expect(r.access).toBe('shared');
      expect(await r.snapshotChanged()).toBe(false);
      expect(await r.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 2, messages: 60 });
      expect(await r.counts()).toMatchObject({ conversations: 2, messages: 60, runs: 1, change_log: 63 });
      expect(await r.lastRuns(5)).toMatchObject([{ status: 'succeeded', requests: 9, resumes: 0 }]);
      expect(await r.lastRunFailures()).toEqual([]);
      expect(await r.mirrorId()).toBe(await w.mirrorId());
      expect(await r.quickCheck()).toEqual([]);
      expect((await r.crawlState(ACCOUNT_ID, 'c001')).messageCount).toBe(30);
      await w.commitMessagesPage(ACCOUNT_ID, 'c000', messagePage('c000', 1, 45, 45), null);
      expect(await r.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 2, messages: 75 });
      // Writes are refused, and write nothing.
      for (const write of [
        () => r.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }),
        () => r.markInterruptedRuns(),
        () => r.upsertConversations(ACCOUNT_ID, conversationPage([{ id: 'new' }]), null),
        () => r.commitMessagesPage(ACCOUNT_ID, 'c000', messagePage('c000', 1, 3, 3), null),
        () => r.forgetCrawlBaseline(ACCOUNT_ID, 'c000'),
        () => r.resumeRun(1),
      ]) {
        const err = await thrown(write);
        expect(err).toBeInstanceOf(StoreError);
        expect((err as StoreError).message).toContain('read-only');
      }
      expect(await w.counts()).toMatchObject({ conversations: 2, messages: 75, runs: 1 });
      // The writer keeps writing; the reader never blocked it.
      const next = await w.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
      expect(await r.runStatus(next)).toBe('running');
    });

    it('a missing target is a StoreError naming it, and nothing is created', async () => {
      const target = engine.absentTarget();
      const err = await thrown(() => engine.open({ readonly: true }, target));
      expect(err).toBeInstanceOf(StoreError);
      expect(err).not.toBeInstanceOf(MirrorUnusableError);
      expect((err as StoreError).message).toContain(engine.named(target));
      expect(await engine.exists(target)).toBe(false);
      if (engine.name === 'sqlite') {
        // SQLite only: a file in a missing directory creates no directory either.
        const d = dir();
        const file = path.join(d, 'sub', 'missing.sqlite');
        expect((await thrown(() => openMirror(file, { readonly: true })) as Error).message).toContain(file);
        expect(fs.readdirSync(d)).toEqual([]);
      }
    });
  });

  // ---------------------------------------------------------------- 4. back from a tombstone

  describe('a conversation back from a tombstone', () => {
    it('listed again: revived with no completed crawl (message_count and crawled_signal NULL) and an insert line', async () => {
      const m = await engine.open();
      const [id] = await fill(m, 1, 130);
      expect(await m.crawlState(ACCOUNT_ID, id!)).toMatchObject({ messageCount: 130, crawledSignal: '2025-06-01T00:00:00Z' });
      await m.tombstoneConversation(ACCOUNT_ID, id!, null);
      const counts = await m.upsertConversations(ACCOUNT_ID, conversationPage([{ id, updated_at: '2025-06-01T00:00:00Z' }]), null);
      expect(counts).toMatchObject({ inserted: 1, updated: 0 });
      expect(await m.crawlState(ACCOUNT_ID, id!)).toEqual({ messageCount: null, crawledSignal: null, raw: JSON.stringify({ id, updated_at: '2025-06-01T00:00:00Z' }) });
      expect(await opsOf(m, id!, 'conversations')).toEqual(['insert', 'delete', 'insert']);
      // A live conversation listed again with a new raw keeps its crawl baseline.
      await m.commitMessagesPage(ACCOUNT_ID, id!, messagePage(id!, 1, 100, 130), null);
      await m.commitMessagesPage(ACCOUNT_ID, id!, messagePage(id!, 2, 30, 130), null);
      await m.completeCrawl(ACCOUNT_ID, id!, null, 'updated_at');
      await m.upsertConversations(ACCOUNT_ID, conversationPage([{ id, updated_at: '2025-07-01T00:00:00Z' }]), null);
      expect(await m.crawlState(ACCOUNT_ID, id!)).toMatchObject({ messageCount: 130, crawledSignal: '2025-06-01T00:00:00Z' });
    });

    it('liveConversationIdsNotIn: the live ids a set does not hold, sorted; tombstoned ones never', async () => {
      const m = await engine.open();
      const ids = await fill(m, 4, 1);
      await m.tombstoneConversation(ACCOUNT_ID, ids[1]!, null);
      const sorted = [...ids].sort();
      expect(await m.liveConversationIdsNotIn(ACCOUNT_ID, new Set([ids[0]!]))).toEqual(sorted.filter((id) => id !== ids[0] && id !== ids[1]));
      expect(await m.liveConversationIdsNotIn(ACCOUNT_ID, new Set(ids))).toEqual([]);
      expect(await m.liveConversationIdsNotIn(ACCOUNT_ID, new Set())).toEqual(await m.liveConversationIds(ACCOUNT_ID));
    });

    it('its messages committed (a named sync): the conversation is revived too, with an insert line carrying its last known data', async () => {
      const m = await engine.open();
      const [id] = await fill(m, 1, 20);
      await m.tombstoneConversation(ACCOUNT_ID, id!, null);
      expect(await m.liveConversationIds(ACCOUNT_ID)).toEqual([]);
      const counts = await m.commitMessagesPage(ACCOUNT_ID, id!, messagePage(id!, 1, 20, 20), 7);
      expect(counts.inserted).toBe(20);
      expect(await m.liveConversationIds(ACCOUNT_ID)).toEqual([id]);
      expect(await m.crawlState(ACCOUNT_ID, id!)).toMatchObject({ messageCount: null, crawledSignal: null });
      const last = (await changeRows(m)).filter((c) => c.stream === 'conversations' && c.record_id === id).at(-1)!;
      expect(last.op).toBe('insert');
      // The revival is run 7's change, with its messages.
      expect(await m.runChanges(7)).toEqual({ messages: { inserted: 20, updated: 0, deleted: 0 }, conversations: { inserted: 1, updated: 0, deleted: 0 } });
      expect(JSON.parse(last.record!)).toEqual({ id, updated_at: '2025-06-01T00:00:00Z' });
      expect(JSON.parse(exportLine(last))).toMatchObject({ op: 'insert', account_id: ACCOUNT_ID, id, data: { id, updated_at: '2025-06-01T00:00:00Z' } });
      // Committing more pages does not revive it twice.
      await m.commitMessagesPage(ACCOUNT_ID, id!, messagePage(id!, 1, 20, 20), 7);
      expect(await m.completeCrawl(ACCOUNT_ID, id!, 7, 'updated_at')).toEqual({ deleted: 0, messageCount: 20 });
      expect(await opsOf(m, id!, 'conversations')).toEqual(['insert', 'delete', 'insert']);
      expect(await m.crawlState(ACCOUNT_ID, id!)).toMatchObject({ messageCount: 20, crawledSignal: '2025-06-01T00:00:00Z' });
    });

    it('an incremental sync crawls a revived conversation in full although its change signal did not move', async () => {
      const ws = FakeWorkspace.fromCounts([130, 5]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[0]!;
      expect((await h.mirror.crawlState(ACCOUNT_ID, c.id)).crawledSignal).not.toBeNull(); // a change signal is in use
      // An earlier run saw it answer 404 (e.g. briefly); the API serves it again, unchanged.
      await h.mirror.tombstoneConversation(ACCOUNT_ID, c.id, null);
      const before = h.fake.requests.length;
      const s = await h.sync();
      expect(h.fake.requests.slice(before).filter((r) => r.path === `/v1/conversations/${c.id}/messages`).map((r) => r.query['page'])).toEqual(['1', '2']);
      expect(s.messages.inserted).toBe(130);
      const eq = await mirrorMatchesFake(h.mirror, ws);
      expect(eq.ok, eq.detail).toBe(true);
    });

    it('a named sync of a tombstoned conversation revives the conversation with its messages', async () => {
      const ws = FakeWorkspace.fromCounts([40, 5]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[0]!;
      await h.mirror.tombstoneConversation(ACCOUNT_ID, c.id, null);
      const s = await h.sync({ conversationIds: [c.id] });
      expect(s.status).toBe('succeeded');
      const eq = await mirrorMatchesFake(h.mirror, ws);
      expect(eq.ok, eq.detail).toBe(true);
      expect((await h.mirror.crawlState(ACCOUNT_ID, c.id)).messageCount).toBe(40);
    });
  });

  // ---------------------------------------------------------------- 5. forgotten crawl baselines

  describe('forgetCrawlBaseline', () => {
    it('clears only the change signal, so the next incremental sync asks about that conversation again', async () => {
      const ws = FakeWorkspace.fromCounts([250, 30, 7]);
      const h = await start({ workspace: ws });
      await h.sync();
      const [a, b] = ws.list();
      const signal = (await h.mirror.crawlState(ACCOUNT_ID, a!.id)).crawledSignal;
      expect(signal).not.toBeNull(); // the fake serves a change signal, so unchanged conversations are skipped
      await h.mirror.forgetCrawlBaseline(ACCOUNT_ID, a!.id);
      await h.mirror.forgetCrawlBaseline(ACCOUNT_ID, 'never-seen'); // nothing to forget: no error
      expect(await h.mirror.crawlState(ACCOUNT_ID, a!.id)).toMatchObject({ messageCount: 250, crawledSignal: null });
      expect((await h.mirror.crawlState(ACCOUNT_ID, b!.id)).crawledSignal).not.toBeNull();
      const before = h.fake.requests.length;
      const s = await h.sync();
      const asked = h.fake.requests.slice(before).filter((r) => r.path.endsWith('/messages')).map((r) => [r.path, r.query['page']]);
      // Only the forgotten one is asked about, incrementally (the page of its last known message).
      expect(asked).toEqual([[`/v1/conversations/${a!.id}/messages`, '3']]);
      expect(s.export.lines).toBe(0);
      expect((await h.mirror.crawlState(ACCOUNT_ID, a!.id)).crawledSignal).toBe(signal);
    });
  });

  // ---------------------------------------------------------------- 6. resumed runs

  describe('resumeRun', () => {
    it('resumes an interrupted run (status running, ended_at and error cleared, resumes + 1); leaves running and ended runs alone', async () => {
      const target = engine.target();
      const m = await engine.open({}, target);
      // The run of a process that dies (and, resumed, dies again): started and resumed by writers that go away.
      const dead = await elsewhere(target, (o) => o.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'schedule', accountId: ACCOUNT_ID }));
      const ok = await m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
      await m.finishRun(ok, { status: 'succeeded' });
      const partial = await m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
      await m.finishRun(partial, { status: 'partial', error: 'some failed' });
      const failed = await m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
      await m.finishRun(failed, { status: 'failed', error: 'boom' });
      const row = async (id: number) => {
        const r = (await runRow(m, id))!;
        return { status: r['status'], ended_at: r['ended_at'], error: r['error'], resumes: r['resumes'] };
      };

      expect(await elsewhere(target, (o) => o.resumeRun(dead))).toBe('running');
      expect(await row(dead)).toEqual({ status: 'running', ended_at: null, error: null, resumes: 0 });
      expect(await m.markInterruptedRuns()).toBe(1);
      // SQLite only: an error on the interrupted run, to see the resume clear it (no method sets one without ending the run).
      if (engine.name === 'sqlite') sqlRun(m, `UPDATE runs SET error = 'process died' WHERE id = ?`, dead);
      expect(await m.runStatus(dead)).toBe('interrupted');
      expect(await m.runEnded(dead)).toBe(true);
      expect(await elsewhere(target, (o) => o.resumeRun(dead))).toBe('resumed');
      expect(await row(dead)).toEqual({ status: 'running', ended_at: null, error: null, resumes: 1 });
      expect(await m.runEnded(dead)).toBe(false);
      expect(await elsewhere(target, (o) => o.resumeRun(dead))).toBe('running');
      expect(await m.markInterruptedRuns()).toBe(1);
      expect(await elsewhere(target, (o) => o.resumeRun(dead))).toBe('resumed');
      expect(await row(dead)).toMatchObject({ status: 'running', resumes: 2 });
      await m.finishRun(dead, { status: 'succeeded' });
      expect(await m.resumeRun(dead)).toBe('ended');
      expect(await row(dead)).toMatchObject({ status: 'succeeded', resumes: 2 });

      for (const id of [ok, partial, failed]) {
        const before = await row(id);
        expect(await m.resumeRun(id)).toBe('ended');
        expect(await row(id)).toEqual(before);
      }
      expect(await m.runStatus(partial)).toBe('partial');
      expect(await m.resumeRun(9999)).toBe('ended');
      expect(await m.runStatus(9999)).toBeUndefined();
      expect((await m.counts()).runs).toBe(4);
    });
  });
});
