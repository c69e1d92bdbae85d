/**
 * Read-only opens of a mirror that has a `-wal` beside it, or that a writer holds or changes while
 * it is read (`status`, `verify`, an auditor's copy, a filesystem snapshot of a crashed or running
 * mirror). Real SQLite files in temp dirs, real writers (in this process and in child `node`
 * processes on the built `dist/`, SIGKILLed), the real CLI for `status` and `verify`. Nothing of
 * ours is mocked; no sleep proves an absence (every wait is on an event, and bounded).
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { writerIsLive } from '../src/store/sqlite/lock.js';
import { readMirrorResult, statusOf, verifyOf } from '../src/cli/index.js';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { ACCOUNT_ID, API_KEY, cliEnv, snapshotEntries, tempDir, type EntrySnapshot } from './helpers.js';
import { assertBuilt, CHILD_CWD, CLI, killLeftovers, run, within } from './children.js';
import { connectionOf, sqlRun } from './sql.js';
import { asRoot, asUnprivileged, skipTitle, unprivilegedPath, unprivilegedSkip } from './unprivileged.js';

const dirs: string[] = [];
const mirrors: Mirror[] = [];
const children: ChildProcess[] = [];
const fakes: FakeApi[] = [];

function dir(prefix?: string): string {
  const d = tempDir(prefix);
  dirs.push(d);
  return d;
}
function track(m: Mirror): Mirror {
  mirrors.push(m);
  return m;
}

beforeAll(assertBuilt);
afterEach(async () => {
  for (const m of mirrors.splice(0)) await m.close();
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await killLeftovers();
  await Promise.all(fakes.splice(0).map((f) => f.close()));
});
afterAll(() => {
  for (const d of dirs) {
    spawnSync('chmod', ['-R', 'u+w', d]);
    fs.rmSync(d, { recursive: true, force: true });
  }
});

// ------------------------------------------------------------------ helpers

function messagePage(conversationId: string, page: number, count: number, total: number): Page<Message> {
  const data: Message[] = [];
  for (let i = 0; i < count; i++) {
    const n = (page - 1) * 100 + i;
    data.push({
      id: `${conversationId}-m${String(n).padStart(5, '0')}`,
      content: `message ${n} `.padEnd(200, 'x'),
      visibility: 'global',
      sender: { id: `s${n % 5}`, name: `Sender ${n % 5}`, type: n % 2 ? 'Customer' : 'Agent' },
      created_at: new Date(Date.UTC(2025, 0, 1) + n * 60_000).toISOString(),
    });
  }
  return { page, data, raw: data.map((m) => ({ ...m })), meta: { current_page: page, total_count: total, total_pages: Math.max(1, Math.ceil(total / 100)) } };
}

function conversationPage(ids: string[]): Page<Conversation> {
  const convs = ids.map((id) => ({ id, updated_at: '2025-06-01T00:00:00Z' }));
  return { page: 1, data: convs as unknown as Conversation[], raw: convs, meta: { current_page: 1, total_count: convs.length, total_pages: 1 } };
}

/** Adds `conversations` conversations of `perConversation` messages, named `<prefix>NNN`. */
async function fill(m: Mirror, prefix: string, conversations: number, perConversation: number): Promise<void> {
  const ids = Array.from({ length: conversations }, (_, i) => `${prefix}${String(i).padStart(3, '0')}`);
  await m.upsertConversations(ACCOUNT_ID, conversationPage(ids), null);
  for (const id of ids) {
    for (let p = 1, left = perConversation; p === 1 || left > 0; p++, left -= 100) {
      await m.commitMessagesPage(ACCOUNT_ID, id, messagePage(id, p, Math.min(100, Math.max(0, left)), perConversation), null);
    }
    await m.completeCrawl(ACCOUNT_ID, id, null, 'updated_at');
  }
}

function expectUnchanged(d: string, before: Map<string, EntrySnapshot>): void {
  const after = snapshotEntries(d);
  expect([...after.keys()].sort()).toEqual([...before.keys()].sort());
  for (const [rel, b] of before) {
    const a = after.get(rel)!;
    expect(a.bytes === null ? null : a.bytes.equals(b.bytes!), rel).toBe(b.bytes === null ? null : true);
    expect(a.mtimeMs, rel).toBe(b.mtimeMs);
    expect(a.mode, rel).toBe(b.mode);
  }
}

/** Runs `f` with `os.tmpdir()` (where private copies go) pointing at `tmp`. */
async function withTmpdir<T>(tmp: string, f: () => T | Promise<T>): Promise<T> {
  const saved = process.env.TMPDIR;
  process.env.TMPDIR = tmp;
  try {
    return await f();
  } finally {
    if (saved === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = saved;
  }
}

/**
 * A closed mirror whose last commits are only in its `-wal`: `conversations` x 120 messages
 * checkpointed into the file, then `walConversations` x 120 more with the checkpoint off, and the
 * file, `-wal` and `-shm` copied into `copyDir` while the writer is open (as a filesystem snapshot
 * of a running mirror would be). The writer is closed afterwards (its own files are checkpointed).
 */
async function copyWithWal(copyDir: string, opts: { shm: boolean; conversations?: number; walConversations?: number }): Promise<string> {
  const src = path.join(dir(), 'mirror.sqlite');
  const w = await openMirror(src);
  await fill(w, 'a', opts.conversations ?? 3, 120);
  sqlRun(w, `PRAGMA wal_checkpoint(TRUNCATE)`);
  sqlRun(w, `PRAGMA wal_autocheckpoint = 0`);
  await fill(w, 'b', opts.walConversations ?? 2, 120);
  fs.mkdirSync(copyDir, { recursive: true });
  const file = path.join(copyDir, 'mirror.sqlite');
  fs.copyFileSync(src, file);
  fs.copyFileSync(`${src}-wal`, `${file}-wal`);
  if (opts.shm) fs.copyFileSync(`${src}-shm`, `${file}-shm`);
  await w.close();
  expect(fs.statSync(`${file}-wal`).size).toBeGreaterThan(0);
  return file;
}

/** The names of the private copies (`convo-mirror-read-*`) under `tmp`. */
const privateCopies = (tmp: string) => fs.readdirSync(tmp).filter((n) => n.startsWith('convo-mirror-read-'));

const distMirror = fileURLToPath(new URL('../dist/src/store/sqlite/mirror.js', import.meta.url));

/**
 * Starts a child `node` that opens the mirror at `file` as a writer (taking its lock), commits
 * `runs` runs with the checkpoint off, prints `ready` and waits to be killed.
 */
async function childWriter(file: string, runs: number): Promise<ChildProcess> {
  const script = `
    const { SqliteMirror } = await import(${JSON.stringify(distMirror)});
    const m = SqliteMirror.open(${JSON.stringify(file)});
    m.db.pragma('wal_autocheckpoint = 0'); // plain JS in a child: the private connection, as test/sql.ts reaches it
    for (let i = 0; i < ${runs}; i++) await m.finishRun(await m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: 'acct' }), { status: 'succeeded' });
    process.stdout.write('ready\\n');
    setInterval(() => {}, 60_000);
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let out = '';
  let err = '';
  child.stderr!.on('data', (d) => (err += d));
  await within(
    new Promise<void>((resolve, reject) => {
      child.stdout!.on('data', (d) => {
        out += d;
        if (out.includes('ready')) resolve();
      });
      child.on('close', (code) => reject(new Error(`child writer exited (${code}) before it was ready: ${err}`)));
    }),
    20_000,
    'the child writer',
  );
  return child;
}

async function kill9(child: ChildProcess): Promise<void> {
  const closed = new Promise((r) => child.once('close', r));
  child.kill('SIGKILL');
  await within(closed, 5000, 'the SIGKILLed child to go');
}

/**
 * Makes `d` (recursively) read-only for whoever reads it next: as root, hands it to user 65534
 * (root ignores permission bits) and drops every write bit; otherwise only drops the write bits.
 */
function makeReadOnly(d: string): void {
  if (asRoot) {
    execFileSync('chown', ['-R', '65534:65534', d]);
    const tmp = fs.realpathSync(os.tmpdir());
    for (let p = path.dirname(fs.realpathSync(d)); p.startsWith(`${tmp}/`); p = path.dirname(p)) execFileSync('chmod', ['a+x', p]);
  }
  execFileSync('chmod', ['-R', 'a-w', d]);
}

/** A temp directory the reader (65534 when root) may write its private copies in. */
function readerTmpdir(): string {
  const t = dir('convo-mirror-reader-tmp-');
  if (asRoot) execFileSync('chown', ['65534:65534', t]);
  return t;
}

/** Runs `node <args>` as the reader (65534 under setpriv when root), bounded, with `env`. */
function runAsReader(args: string[], env: NodeJS.ProcessEnv, timeoutMs = 20_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const argv = asUnprivileged([process.execPath, ...args]);
  // In the children's empty directory: the checkout may be one the reader cannot enter (its .env unreadable).
  const child = spawn(argv[0]!, argv.slice(1), { env, cwd: CHILD_CWD, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => (stdout += d));
  child.stderr!.on('data', (d) => (stderr += d));
  return within(
    new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr }))),
    timeoutMs,
    `${args.join(' ')} as the reader`,
  );
}

// ------------------------------------------------------------------ writerIsLive

describe('writerIsLive', () => {
  it('is false with no lock file and with a released one, true while a writer holds it (this process or another), false once a holder is SIGKILLed; the probe creates and changes nothing', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    expect(writerIsLive(file)).toBe(false);
    expect(fs.readdirSync(d)).toEqual([]);
    const w = await openMirror(file);
    const held = snapshotEntries(d);
    expect(writerIsLive(file)).toBe(true);
    expectUnchanged(d, held);
    await w.close();
    expect(writerIsLive(file)).toBe(false);

    const child = await childWriter(file, 1);
    expect(writerIsLive(file)).toBe(true);
    await kill9(child);
    // The killed holder left its lock's -journal behind: neither read as hot nor removed.
    expect(fs.readdirSync(d)).toContain('mirror.sqlite.lock-journal');
    const killed = snapshotEntries(d);
    expect(writerIsLive(file)).toBe(false);
    expectUnchanged(d, killed);
  });

  it.skipIf(unprivilegedSkip)(skipTitle('in a read-only directory (as another user when root) answers false, creating nothing'), async () => {
    const d = path.join(dir(), 'ro');
    fs.mkdirSync(d);
    const file = path.join(d, 'mirror.sqlite');
    await (await openMirror(file)).close();
    makeReadOnly(d);
    const before = snapshotEntries(d);
    const script = `const { writerIsLive } = await import(${JSON.stringify(unprivilegedPath(fileURLToPath(new URL('../dist/src/store/sqlite/lock.js', import.meta.url))))});
      process.stdout.write(String(writerIsLive(${JSON.stringify(file)})));`;
    const r = await runAsReader(['--input-type=module', '-e', script], { PATH: process.env.PATH });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe('false');
    expectUnchanged(d, before);
  });

  it('a reader probing the lock delays a starting writer instead of refusing it', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    await (await openMirror(file)).close();
    // A reader child holds a SHARED lock on <db>.lock (what a probe holds for microseconds) until it
    // is told to let go, and it is told only once the writer child is about to take the lock (a
    // test hook): the writer meets the held lock however slow the machine; no timer decides.
    const reader = spawn(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const Database = (await import(${JSON.stringify(fileURLToPath(new URL('../node_modules/better-sqlite3/lib/index.js', import.meta.url)))})).default;
         const db = new Database(${JSON.stringify(`${file}.lock`)}, { readonly: true, fileMustExist: true });
         db.exec('BEGIN');
         db.prepare('SELECT count(*) FROM sqlite_master').get();
         process.stdout.write('reading\\n');
         process.stdin.once('data', () => { db.exec('COMMIT'); db.close(); process.exit(0); });`,
      ],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    children.push(reader);
    await within(new Promise<void>((resolve) => reader.stdout!.on('data', (x) => String(x).includes('reading') && resolve())), 20_000, 'the reading child');
    const writer = spawn(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `import fs from 'node:fs';
         const { SqliteMirror } = await import(${JSON.stringify(distMirror)});
         const m = SqliteMirror.open(${JSON.stringify(file)}, { onLockAttempt: () => fs.writeSync(1, 'locking\\n') });
         fs.writeSync(1, m.access + '\\n');
         await m.close();`,
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    children.push(writer);
    let out = '';
    let err = '';
    writer.stderr!.on('data', (x) => (err += String(x)));
    const exited = new Promise<number | null>((resolve) => writer.once('exit', (code) => resolve(code)));
    const locking = new Promise<void>((resolve) =>
      writer.stdout!.on('data', (x) => {
        out += String(x);
        if (out.includes('locking')) resolve();
      }),
    );
    await within(locking, 20_000, 'the writer child to take the lock');
    reader.stdin!.end('release\n');
    expect(await within(exited, 20_000, 'the writer child'), err).toBe(0);
    const w = { access: out.split('\n')[1] };
    expect(w.access).toBe('read-write');
  });
});

// ------------------------------------------------------------------ a copy with a -wal

describe('read-only open of a copy with a -wal', () => {
  it('without -shm: reads the rows only the -wal holds from a private copy, creates no file beside it, changes no byte, and removes the private copy at close', async () => {
    const d = path.join(dir(), 'copy');
    const file = await copyWithWal(d, { shm: false });
    expect(fs.readdirSync(d).sort()).toEqual(['mirror.sqlite', 'mirror.sqlite-wal']);
    const before = snapshotEntries(d);
    const tmp = dir();
    const m = await withTmpdir(tmp, () => openMirror(file, { readonly: true }));
    try {
      expect(m.access).toBe('private-copy');
      expect(m.location).toBe(file);
      expect(await m.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 5, messages: 600 });
      expect(await m.quickCheck()).toEqual([]);
      expect(await m.snapshotChanged()).toBe(false);
      await expect(m.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID })).rejects.toThrow(/read-only/);
      expect(() => connectionOf(m).exec(`DELETE FROM runs`)).toThrow(/readonly|read-only/i);
      const copies = privateCopies(tmp);
      expect(copies).toHaveLength(1);
      const copyDir = path.join(tmp, copies[0]!);
      expect(fs.statSync(copyDir).mode & 0o777).toBe(0o700);
      for (const f of fs.readdirSync(copyDir)) expect(fs.statSync(path.join(copyDir, f)).mode & 0o777, f).toBe(0o600);
      expectUnchanged(d, before);
    } finally {
      await m.close();
    }
    expect(privateCopies(tmp)).toEqual([]);
    expectUnchanged(d, before);
  });

  it('a process that exits (or throws) without closing the mirror still removes its private copy', async () => {
    const d = path.join(dir(), 'copy');
    const file = await copyWithWal(d, { shm: false });
    for (const end of ['process.exit(3)', "throw new Error('boom')"]) {
      const tmp = dir();
      const script = `
        const { SqliteMirror } = await import(${JSON.stringify(distMirror)});
        const m = SqliteMirror.open(${JSON.stringify(file)}, { readonly: true });
        const fs = await import('node:fs');
        process.stdout.write(m.access + ' ' + fs.readdirSync(${JSON.stringify(tmp)}).length);
        ${end};
      `;
      const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', env: { PATH: process.env.PATH, TMPDIR: tmp }, timeout: 20_000 });
      expect(r.status, r.stderr).not.toBe(0);
      expect(r.stdout).toBe('private-copy 1');
      expect(fs.readdirSync(tmp)).toEqual([]);
    }
  });

  it('with -shm: no byte of the file, the -wal or the -shm changes', async () => {
    const d = path.join(dir(), 'copy');
    const file = await copyWithWal(d, { shm: true });
    expect(fs.readdirSync(d).sort()).toEqual(['mirror.sqlite', 'mirror.sqlite-shm', 'mirror.sqlite-wal']);
    const before = snapshotEntries(d);
    const tmp = dir();
    const m = await withTmpdir(tmp, () => openMirror(file, { readonly: true }));
    expect(m.access).toBe('private-copy');
    expect(await m.counts()).toMatchObject({ conversations: 5, messages: 600 });
    await m.close();
    expect(privateCopies(tmp)).toEqual([]);
    expectUnchanged(d, before);
  });

  it('an empty -wal is read immutable, and nothing is created', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    const w = await openMirror(file);
    await fill(w, 'a', 2, 10);
    await w.close();
    fs.writeFileSync(`${file}-wal`, '');
    const before = snapshotEntries(d);
    const m = await openMirror(file, { readonly: true });
    expect(m.access).toBe('immutable');
    expect(await m.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 2, messages: 20 });
    expect(await m.snapshotChanged()).toBe(false);
    await m.close();
    expectUnchanged(d, before);
  });

  it('a private copy that cannot be made (TMPDIR missing) is a StoreError naming the mirror and the temp directory, with nothing left behind', async () => {
    const d = path.join(dir(), 'copy');
    const file = await copyWithWal(d, { shm: false });
    const before = snapshotEntries(d);
    const missing = path.join(dir(), 'no', 'such', 'tmp');
    let err: unknown;
    try {
      await withTmpdir(missing, () => openMirror(file, { readonly: true }));
    } catch (e) {
      err = e;
    }
    expect((err as Error).name).toBe('StoreError');
    expect((err as Error).message).toContain(file);
    expect((err as Error).message).toContain(missing);
    expect(fs.existsSync(missing)).toBe(false);
    expectUnchanged(d, before);
  });
});

// ------------------------------------------------------------------ a live writer, then a killed one

describe('read-only open of a live mirror', () => {
  it('a writer in this process: a shared read-only connection sees its commits (also later ones) and creates nothing new', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    const w = track(await openMirror(file));
    await fill(w, 'a', 2, 30);
    expect(writerIsLive(file)).toBe(true);
    const names = fs.readdirSync(d).sort();
    expect(names).toEqual(expect.arrayContaining(['mirror.sqlite-wal', 'mirror.sqlite-shm']));
    const r = track(await openMirror(file, { readonly: true }));
    expect(r.access).toBe('shared');
    expect(await r.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 2, messages: 60 });
    await fill(w, 'b', 1, 15);
    expect(await r.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 3, messages: 75 });
    expect(await r.snapshotChanged()).toBe(false);
    expect(fs.readdirSync(d).sort()).toEqual(names);
  });

  it('a writer in another process: shared while it lives; SIGKILLed, its -wal is read from a private copy and its files stay byte for byte', async () => {
    const d = dir();
    const file = path.join(d, 'mirror.sqlite');
    await (await openMirror(file)).close();
    const child = await childWriter(file, 20);
    expect(writerIsLive(file)).toBe(true);
    const names = fs.readdirSync(d).sort();
    const live = await openMirror(file, { readonly: true });
    expect(live.access).toBe('shared');
    expect((await live.counts()).runs).toBe(20);
    await live.close();
    expect(fs.readdirSync(d).sort()).toEqual(names);

    await kill9(child);
    expect(writerIsLive(file)).toBe(false);
    expect(fs.statSync(`${file}-wal`).size).toBeGreaterThan(0);
    const before = snapshotEntries(d);
    const tmp = dir();
    const m = await withTmpdir(tmp, () => openMirror(file, { readonly: true }));
    expect(m.access).toBe('private-copy');
    expect((await m.counts()).runs).toBe(20);
    expect(await m.quickCheck()).toEqual([]);
    await m.close();
    expect(privateCopies(tmp)).toEqual([]);
    expectUnchanged(d, before);
  });
});

// ------------------------------------------------------------------ a writer comes along under an immutable reader

describe('a writer changes the file under an immutable reader', () => {
  /** A closed mirror with 3 x 120 messages. */
  async function closedMirror(): Promise<string> {
    const file = path.join(dir(), 'mirror.sqlite');
    const w = await openMirror(file);
    await fill(w, 'a', 3, 120);
    await w.close();
    expect(fs.existsSync(`${file}-wal`)).toBe(false);
    return file;
  }

  it('snapshotChanged is false until a writer commits and checkpoints into the file, then true; a fresh open sees the new rows', async () => {
    const file = await closedMirror();
    const r = track(await openMirror(file, { readonly: true }));
    expect(r.access).toBe('immutable');
    expect(await r.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 3, messages: 360 });
    expect(await r.snapshotChanged()).toBe(false);
    const w = await openMirror(file);
    // A live writer (its lock, its -wal) is a change already, before it wrote anything.
    expect(await r.snapshotChanged()).toBe(true);
    await fill(w, 'b', 20, 250);
    await w.close(); // checkpoints every page into the file and removes the -wal
    expect(fs.existsSync(`${file}-wal`)).toBe(false);
    expect(writerIsLive(file)).toBe(false);
    expect(await r.snapshotChanged()).toBe(true);
    const again = track(await openMirror(file, { readonly: true }));
    expect(again.access).toBe('immutable');
    expect(await again.liveCounts(ACCOUNT_ID)).toEqual({ conversations: 23, messages: 360 + 20 * 250 });
    expect(await again.quickCheck()).toEqual([]);
    expect(await again.snapshotChanged()).toBe(false);
  });

  it('verify (the CLI computation) throws away what it read while a sync ran and finished under it, and recomputes on a fresh open', async () => {
    // What the first attempt reads depends on what SQLite had cached: stale rows, or pages of the
    // old and new file mixed ("invalid page number", SQLITE_CORRUPT: a false "damaged"). Whatever it
    // was, it is not used.
    const file = await closedMirror();
    const exportDir = path.join(path.dirname(file), 'exports');
    const computed: { access: string; dbProblems: unknown[] }[] = [];
    const checked: { attempt: number; changed: boolean }[] = [];
    let calls = 0;
    const result = await readMirrorResult(
      file,
      async (m) => {
        if (++calls === 1) {
          // A sync runs and finishes between the open and the check (the race a reviewer hit).
          const w = await openMirror(file);
          await fill(w, 'b', 20, 250);
          await w.close();
        }
        const r = { verify: await verifyOf(m, { exportDir }), status: await statusOf(m) };
        computed.push({ access: m.access, dbProblems: r.verify.problems.filter((p) => p.path === file) });
        return r;
      },
      {
        onSnapshot: async (attempt, m) => {
          checked.push({ attempt, changed: await m.snapshotChanged() });
        },
      },
    );
    // The first computation may even have thrown (SQLITE_CORRUPT from counts()): retried all the same.
    expect(calls).toBe(2);
    expect(computed.at(-1)!.access).toBe('immutable');
    expect(checked).toEqual([
      { attempt: 1, changed: true },
      { attempt: 2, changed: false },
    ]);
    expect(result.verify.problems.filter((p) => p.path === file)).toEqual([]);
    expect(result.verify.checks.find((c) => c.name === 'database')?.status).toBe('ok');
    expect(result.verify.file).toBe(file);
    expect(result.status.counts).toMatchObject({ conversations: 23, messages: 360 + 20 * 250 });
  });

  it('status (the CLI computation) recomputes through a shared connection when the writer is still running', async () => {
    const file = await closedMirror();
    const seen: string[] = [];
    const result = await readMirrorResult(file, statusOf, {
      onSnapshot: async (attempt, m) => {
        seen.push(m.access);
        if (attempt === 1) await fill(track(await openMirror(file)), 'b', 4, 50); // stays open: a running sync
      },
    });
    expect(seen).toEqual(['immutable', 'shared']);
    expect(result.counts).toMatchObject({ conversations: 7, messages: 560 });
  });

  it('an error computed on a changed snapshot is retried; on an unchanged one it is thrown; at most 3 attempts', async () => {
    const file = await closedMirror();
    let calls = 0;
    const n = await readConsistent(
      file,
      async (m) => {
        calls++;
        if (calls === 1) throw new Error('read garbage');
        return (await m.counts()).conversations;
      },
      {
        onSnapshot: async (attempt) => {
          if (attempt === 1) {
            const w = await openMirror(file);
            await fill(w, 'b', 1, 1);
            await w.close();
          }
        },
      },
    );
    expect([calls, n]).toEqual([2, 4]);
    await expect(readConsistent(file, () => {
      throw new Error('a real failure');
    })).rejects.toThrow('a real failure');
    // A writer that comes and goes at every attempt: the third result is taken.
    let attempts = 0;
    const last = await readConsistent(file, async (m) => (await m.counts()).conversations, {
      onSnapshot: async () => {
        attempts++;
        const w = await openMirror(file);
        await fill(w, `z${attempts}`, 1, 1);
        await w.close();
      },
    });
    expect([attempts, last]).toEqual([3, 6]);
  });
});

// ------------------------------------------------------------------ the CLI on a read-only copy with a -wal

describe('status and verify (the CLI) on a read-only copy with a -wal', () => {
  async function syncedCopyWithWal(shm: boolean): Promise<{ fake: FakeApi; copy: string; runs: number }> {
    const ws = FakeWorkspace.fromCounts([4, 7, 2]);
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const src = dir();
    const s = await run(['sync'], cliEnv(fake, src));
    expect(s.code, s.stderr).toBe(0);
    // A sync that is still running when the snapshot is taken: its last runs are only in the -wal.
    const db = path.join(src, 'mirror.sqlite');
    const w = await openMirror(db);
    sqlRun(w, `PRAGMA wal_autocheckpoint = 0`);
    for (let i = 0; i < 3; i++) await w.finishRun(await w.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID }), { status: 'succeeded' });
    const copy = path.join(dir(), 'snapshot');
    fs.cpSync(src, copy, { recursive: true });
    if (!shm) fs.rmSync(path.join(copy, 'mirror.sqlite-shm'));
    await w.close();
    expect(fs.statSync(path.join(copy, 'mirror.sqlite-wal')).size).toBeGreaterThan(0);
    return { fake, copy, runs: 4 };
  }

  for (const shm of [false, true]) {
    it.skipIf(unprivilegedSkip)(skipTitle(`${shm ? 'with' : 'without'} -shm, ${asRoot ? 'as an unprivileged user (setpriv) on a copy it does not own' : 'with no write bit'}: the -wal's rows are counted, exports intact, nothing created or changed, no private copy left`), async () => {
      const { fake, copy, runs } = await syncedCopyWithWal(shm);
      const tmp = readerTmpdir();
      makeReadOnly(copy);
      const before = snapshotEntries(copy);
      const env = cliEnv(fake, copy, { REDIS_URL: 'redis://127.0.0.1:1', TMPDIR: tmp });
      const st = await runAsReader([unprivilegedPath(CLI), 'status', '--json'], env);
      expect(st.code, st.stderr).toBe(0);
      const status = JSON.parse(st.stdout) as { db: string; counts: Record<string, number> };
      expect(status.db).toBe(path.join(copy, 'mirror.sqlite'));
      expect(status.counts).toMatchObject({ conversations: 3, messages: 13, runs });
      const v = await runAsReader([unprivilegedPath(CLI), 'verify'], env);
      expect(v.code, v.stderr + v.stdout).toBe(0);
      expect(v.stdout).toMatch(/^ok   database: quick_check ok/);
      expect(v.stdout).toMatch(/\narchive intact: \d+ records, \d+ files, \d+ lines; head \d+:[0-9a-f]{64}; not checked: signatures, head, witness, deep\n$/);
      expect(v.stderr).toBe('');
      expect(fs.readdirSync(tmp)).toEqual([]);
      expectUnchanged(copy, before);
    });
  }
});
