/**
 * Issue 8 through the CLI as a process: a misbehaving API (404s it contradicts, a list that never
 * ends, huge and endless bodies, hostile ids), bad input refused before any request or file, a
 * damaged or full mirror, files private whatever the umask, and read-only commands on an auditor's
 * copy. Each test spawns the built CLI (package.json's `bin`, built by `npm test`) against the fake
 * API in this process on 127.0.0.1, with real SQLite and export files in temp dirs. Every wait is bounded and
 * every child is killed afterwards.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, mirrorEqualsFake, readExportLines, replay, snapshotFiles, tempDir as makeTempDir, withMirror } from './helpers.js';
import { CLI, assertBuilt, killLeftovers, run, runCommand, waitFor, type Ran } from './children.js';
import { sqlAll, sqlValue } from './sql.js';
import { asRoot, asUnprivileged, skipTitle, unprivilegedPath, unprivilegedSkip } from './unprivileged.js';

const dirs: string[] = [];
function tempDir(): string {
  const d = makeTempDir('convo-mirror-hardening-');
  dirs.push(d);
  return d;
}
const fakes: FakeApi[] = [];
async function fakeApi(ws: FakeWorkspace): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(fake);
  return fake;
}

beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.all(fakes.splice(0).map((f) => f.close()));
});
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

const msgPath = (id: string): string => `/v1/conversations/${id}/messages`;

async function expectExact(db: string, ws: FakeWorkspace): Promise<void> {
  await withMirror(db, (m) => {
    const eq = mirrorEqualsFake(m, ws);
    expect(eq.ok, eq.detail).toBe(true);
  });
}

/** Runs the CLI under `umask` (through sh, so the mask is the process's own from the start). */
const runWithUmask = (mask: string, args: string[], env: NodeJS.ProcessEnv): Promise<Ran> =>
  runCommand(['sh', '-c', 'umask "$1"; shift; exec "$@"', 'sh', mask, process.execPath, CLI, ...args], env, 30_000);

describe('a 404 the listing contradicts is a failure, not a deletion', () => {
  it('sync --full exits 1 naming the 3 conversations, keeps every row they had; disarmed, a plain sync leaves the mirror exact', async () => {
    const ws = FakeWorkspace.generate({ seed: 5, conversations: 30 });
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const env = cliEnv(fake, dir);
    const db = path.join(dir, 'mirror.sqlite');
    const first = await run(['sync'], env);
    expect(first.code, first.stderr).toBe(0);
    const before = await withMirror(db, (m) => m.liveCounts(ACCOUNT_ID));

    const flaky = [ws.list()[3]!, ws.list()[11]!, ws.list()[27]!].map((c) => c.id);
    for (const id of flaky) fake.injectFault({ kind: 'status', status: 404, match: { path: msgPath(id) }, times: Infinity });
    const full = await run(['sync', '--full'], env);
    expect(full.code, full.stderr).toBe(1);
    for (const id of flaky) expect(full.stderr).toMatch(new RegExp(`failed: conversation ${id}: \\[LISTED_BUT_NOT_FOUND\\] .*404`));
    expect(full.stdout).toMatch(/0 tombstoned/);
    expect(await withMirror(db, (m) => m.liveCounts(ACCOUNT_ID))).toEqual(before);
    expect(readExportLines(path.join(dir, 'exports'), 'messages').filter((l) => l.op === 'delete')).toEqual([]);

    fake.clearFaults();
    const again = await run(['sync'], env);
    expect(again.code, again.stderr).toBe(0);
    await expectExact(db, ws);
  });
});

describe('bad input is refused before any request or file', () => {
  const cases: [string, string[], Record<string, string>, RegExp][] = [
    ['an API key with a line feed', [], { CONVO_MIRROR_API_KEY: `${API_KEY}\nX-Evil: 1` }, /CONVO_MIRROR_API_KEY: must be printable ASCII/],
    ['an API key with a carriage return', [], { CONVO_MIRROR_API_KEY: `${API_KEY}\r` + 'x' }, /CONVO_MIRROR_API_KEY: must be printable ASCII/],
    ['an API key with a tab', [], { CONVO_MIRROR_API_KEY: `ab\tcd` }, /CONVO_MIRROR_API_KEY: must be printable ASCII/],
    ['a non-ASCII API key', [], { CONVO_MIRROR_API_KEY: 'clé-secrète' }, /CONVO_MIRROR_API_KEY: must be printable ASCII/],
    ['--max-rps below 0.1', ['--max-rps', '0.05'], {}, /--max-rps: must be 0 \(no cap\) or at least 0.1/],
    ['an empty --conversation', ['--conversation', ''], {}, /--conversation: must not be empty/],
    ['--conversation ..', ['--conversation', '..'], {}, /--conversation: "\.\." is not a conversation id/],
    ['--conversation .', ['--conversation', '.'], {}, /--conversation: "\." is not a conversation id/],
  ];
  it.each(cases)('%s: exit 2, one line naming it, no request, no file', async (_name, args, extra, message) => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([2]));
    const dir = tempDir();
    const r = await run(['sync', ...args], cliEnv(fake, path.join(dir, 'sub'), extra));
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(message);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(fake.requests).toEqual([]);
    expect(fs.readdirSync(dir)).toEqual([]);
    expect(r.stderr + r.stdout).not.toContain('secrète');
  });

  it('a base URL with credentials, a query or a fragment is refused and the password is never printed', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([2]));
    const dir = tempDir();
    const port = new URL(fake.url).port;
    const urls = [
      [`http://admin:hunter2-secret@127.0.0.1:${port}`, /must not carry a user name or password/],
      [`http://127.0.0.1:${port}/api?token=hunter2-secret`, /must not carry a query string/],
      [`http://127.0.0.1:${port}/api#hunter2-secret`, /must not carry a fragment/],
      [`http://admin:hunter2-secret@[not-a-host/`, /must be an absolute http\(s\) URL/],
      [`admin:hunter2-secret@127.0.0.1`, /must be an absolute http\(s\) URL|must use http or https/],
      [`https://bob:hunter2/secret@api.example.com`, /CONVO_MIRROR_BASE_URL/],
      [`https://bob:hunter2#secret@api.example.com`, /CONVO_MIRROR_BASE_URL/],
      [`https://bob:hunter2?secret@api.example.com`, /CONVO_MIRROR_BASE_URL/],
      [`https://bob:hunter2@secret@api.example.com`, /CONVO_MIRROR_BASE_URL/],
    ] as const;
    for (const [url, why] of urls) {
      const r = await run(['sync'], cliEnv(fake, path.join(dir, 'sub'), { CONVO_MIRROR_BASE_URL: url }));
      expect(r.code, `${url}: ${r.stderr}`).toBe(2);
      expect(r.stderr).toMatch(why);
      expect(r.stderr).toMatch(/CONVO_MIRROR_BASE_URL/);
      expect(r.stderr + r.stdout).not.toContain('hunter2');
    }
    expect(fake.requests).toEqual([]);
    expect(fs.readdirSync(dir)).toEqual([]);
  });

  it('an export directory that is /, a file, the database directory or one of its ancestors is refused', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([2]));
    const dir = tempDir();
    const data = path.join(dir, 'data');
    fs.mkdirSync(data);
    const aFile = path.join(dir, 'a-file');
    fs.writeFileSync(aFile, 'not a directory');
    for (const exportDir of ['/', aFile, data, dir]) {
      const r = await run(['sync', '--export-dir', exportDir], cliEnv(fake, data));
      expect(r.code, `${exportDir}: ${r.stderr}`).toBe(2);
      expect(r.stderr).toMatch(/CONVO_MIRROR_EXPORT_DIR/);
    }
    expect(fake.requests).toEqual([]);
    expect(fs.readdirSync(data)).toEqual([]);
    expect(fs.readFileSync(aFile, 'utf8')).toBe('not a directory');
  });

  it('a conversation id ".." served by the listing is never sent as a path segment: that conversation fails, named', async () => {
    const ws = FakeWorkspace.fromCounts([3, 4]);
    ws.list()[0]!.data.id = '..';
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const r = await run(['sync'], cliEnv(fake, dir));
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/failed: conversation \.\.: \[SCHEMA_ERROR\]/);
    const paths = new Set(fake.requests.map((q) => q.path));
    expect([...paths].sort()).toEqual(['/v1/conversations', msgPath(ws.list()[1]!.id)].sort());
  });
});

describe('a misbehaving server cannot make a run endless or unbounded', () => {
  it('a conversation list that never ends stops the run within a few hundred requests, exit 1, nothing tombstoned', async () => {
    const ws = FakeWorkspace.fromCounts([3, 4, 5]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const env = cliEnv(fake, dir);
    expect((await run(['sync'], env)).code).toBe(0);
    fake.requests.length = 0;
    fake.injectFault({ kind: 'runaway', match: { path: '/v1/conversations' }, times: Infinity });
    const r = await run(['sync', '--full'], env);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/failed: conversation list: \[PAGE_RUNAWAY\] .*kept serving pages past its own total/);
    const list = fake.requests.filter((q) => q.path === '/v1/conversations').length;
    expect(list).toBe(13); // its first page says 2 pages: ceil(2 * 1.1) + 10 pages, then it stops
    expect(fake.requests.length).toBeLessThan(300);
    const tombstoned = await withMirror(path.join(dir, 'mirror.sqlite'), (m) => sqlValue(m, `SELECT count(*) FROM messages WHERE deleted_at IS NOT NULL`));
    expect(tombstoned).toBe(0);
  });

  it('a 300 MiB page and a body that never ends fail their conversations, named with the page and the cap; the others are mirrored', async () => {
    const ws = FakeWorkspace.fromCounts([2, 3, 4, 5]);
    const fake = await fakeApi(ws);
    const [huge, endless] = [ws.list()[0]!.id, ws.list()[1]!.id];
    fake.injectFault({ kind: 'huge', bytes: 300 * 1024 * 1024, contentLength: false, match: { path: msgPath(huge) }, times: Infinity });
    fake.injectFault({ kind: 'endless', match: { path: msgPath(endless) }, times: Infinity });
    const dir = tempDir();
    const r = await run(['sync', '--max-response-bytes', String(4 * 1024 * 1024)], cliEnv(fake, dir));
    expect(r.code, r.stderr).toBe(1);
    for (const id of [huge, endless]) {
      expect(r.stderr).toMatch(new RegExp(`failed: conversation ${id}: \\[RESPONSE_TOO_LARGE\\] .*conversation ${id} messages page 1.*4194304 bytes`));
    }
    // Aborted as soon as the cap was crossed, and not retried.
    for (const id of [huge, endless]) {
      const reqs = fake.requests.filter((q) => q.path === msgPath(id));
      expect(reqs.length).toBe(1);
      expect(reqs[0]!.bytesSent).toBeLessThan(4 * 1024 * 1024 + 32 * 1024 * 1024);
    }
    await withMirror(path.join(dir, 'mirror.sqlite'), (m) => {
      expect(sqlValue(m, `SELECT count(*) FROM messages WHERE deleted_at IS NULL`)).toBe(9);
    });
  });

  it('JSON nested 100,000 levels deep in one message fails that conversation as a SCHEMA_ERROR naming it and the page', async () => {
    const ws = FakeWorkspace.fromCounts([2, 3]);
    const fake = await fakeApi(ws);
    const deepId = ws.list()[0]!.id;
    const deep = '['.repeat(100_000) + ']'.repeat(100_000);
    const body = `{"data":[{"id":"msg_deep","content":"x","visibility":"global","sender":{"id":"c","name":"n","type":"Customer"},"attachments":${deep},"created_at":"2025-01-01T00:00:00.000Z"}],"meta":{"current_page":1,"total_pages":1,"total_count":1}}`;
    fake.injectFault({ kind: 'status', status: 200, body, match: { path: msgPath(deepId) }, times: Infinity });
    const r = await run(['sync'], cliEnv(fake, tempDir()));
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(new RegExp(`failed: conversation ${deepId}: \\[SCHEMA_ERROR\\] conversation ${deepId} messages page 1: .*64 levels`));
    expect(r.stderr).not.toMatch(/Maximum call stack/);
  });
});

describe('the run summary tells the truth', () => {
  it('a 401 in the middle of a run: exit 2, and the summary shows what had been committed', async () => {
    const ws = FakeWorkspace.fromCounts(Array(10).fill(25));
    const fake = await fakeApi(ws);
    let served = 0;
    fake.beforeServe((req) => {
      if (req.path.endsWith('/messages') && ++served === 4) fake.injectFault({ kind: 'status', status: 401, times: Infinity });
    });
    const dir = tempDir();
    const r = await run(['sync', '--concurrency', '1'], cliEnv(fake, dir));
    expect(r.code, r.stderr).toBe(2);
    expect(r.stdout).toMatch(/conversations: 3 synced, 0 tombstoned, 0 failed, \d+ not synced/);
    expect(r.stdout).toMatch(/messages: 75 served; 75 inserted/);
    expect(r.stdout).toMatch(/exports: \d+ new lines/);
    expect(r.stderr).toMatch(/authentication error: .*401.*CONVO_MIRROR_API_KEY/);
  });

  it('a failed publication says it failed, and the next run publishes every line', async () => {
    const ws = FakeWorkspace.fromCounts([5, 5]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const env = cliEnv(fake, dir);
    expect((await run(['sync'], env)).code).toBe(0);
    ws.appendMessages(ws.list()[0]!.id, 3);
    // The reserved temp directory of publication is taken by a file: nothing can be written.
    const blocker = path.join(dir, 'exports', '.convo-mirror-tmp');
    fs.rmSync(blocker, { recursive: true, force: true });
    fs.writeFileSync(blocker, 'in the way');
    const failed = await run(['sync'], env);
    expect(failed.code, failed.stderr).toBe(1);
    expect(failed.stdout).toMatch(/exports: publication FAILED \(.*\.convo-mirror-tmp.*\); every committed change stays in the change log/);
    expect(failed.stdout).not.toMatch(/nothing changed/);
    fs.rmSync(blocker);
    const next = await run(['sync'], env);
    expect(next.code, next.stderr).toBe(0);
    const lines = readExportLines(path.join(dir, 'exports'), 'messages');
    expect(replay(lines, 'messages').size).toBe(13);
    expect(new Set(lines.map((l) => l.seq)).size).toBe(lines.length);
  });
});

/**
 * A real full disk needs a small filesystem of its own: a 1 MiB tmpfs, which only root may mount.
 * Where that is not possible the test is skipped, saying why; the in-process test of a full mirror
 * (hardening.test.ts, SQLite's max_page_count) runs everywhere.
 */
function tmpfsMountable(): boolean {
  if (os.platform() !== 'linux' || os.userInfo().uid !== 0) return false;
  const probe = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-tmpfs-probe-'));
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', probe], { stdio: 'ignore' });
    execFileSync('umount', [probe], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  } finally {
    fs.rmSync(probe, { recursive: true, force: true });
  }
}
const canMountTmpfs = tmpfsMountable();

describe('a full disk', () => {
  it.runIf(canMountTmpfs)('(needs root to mount a tmpfs) stops the run with exit 2 and the summary; after space is freed the next sync loses nothing', async () => {
    const ws = FakeWorkspace.generate({ seed: 3, conversations: 60 });
    const fake = await fakeApi(ws);
    const mnt = tempDir();
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', mnt]);
    try {
      const env = cliEnv(fake, mnt);
      const full = await run(['sync'], env);
      expect(full.code, full.stdout + full.stderr.split('\n').filter((l) => !l.startsWith('{')).join('\n')).toBe(2);
      expect(full.stdout).toMatch(/^run 1 \(workspace, incremental\) failed/m);
      expect(full.stdout).toMatch(/conversations: \d+ synced/);
      expect(full.stderr).toMatch(/mirror error: the mirror .* cannot be written \(SQLITE_FULL|disk is full|ENOSPC/);
      expect(full.stderr).not.toMatch(/failed: conversation /);

      execFileSync('mount', ['-o', 'remount,size=256m', mnt]);
      const next = await run(['sync'], env);
      expect(next.code, next.stderr).toBe(0);
      await expectExact(path.join(mnt, 'mirror.sqlite'), ws);
      const lines = readExportLines(path.join(mnt, 'exports'), 'messages');
      expect(new Set(lines.map((l) => l.seq)).size).toBe(lines.length);
      expect(replay(lines, 'messages').size).toBe(ws.totals().messages);
      const v = await run(['verify'], env);
      expect(v.code, v.stderr + v.stdout).toBe(0);
    } finally {
      execFileSync('umount', ['-l', mnt]);
    }
  });
});

describe('a damaged mirror stops the run', () => {
  it('SQLITE_CORRUPT in the messages table: exit 2 saying the mirror is damaged and how to recover, no per-conversation failures', async () => {
    const ws = FakeWorkspace.fromCounts(Array(20).fill(60));
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const env = cliEnv(fake, dir);
    const db = path.join(dir, 'mirror.sqlite');
    expect((await run(['sync'], env)).code).toBe(0);
    // Overwrite the root page of the messages table (and of its index) with garbage.
    const pages = await withMirror(db, (m) => {
      const size = sqlValue(m, `PRAGMA page_size`);
      const roots = sqlAll<{ rootpage: number }>(m, `SELECT rootpage FROM sqlite_master WHERE tbl_name = 'messages' AND rootpage > 0`);
      return { size, roots: roots.map((r) => r.rootpage) };
    });
    const fd = fs.openSync(db, 'r+');
    for (const p of pages.roots) fs.writeSync(fd, Buffer.alloc(pages.size, 0xa5), 0, pages.size, (p - 1) * pages.size);
    fs.closeSync(fd);
    for (const c of ws.list()) ws.appendMessages(c.id, 2);

    const r = await run(['sync'], env);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(/mirror error: the mirror .*mirror\.sqlite is damaged \(SQLITE_CORRUPT/);
    expect(r.stderr).toMatch(/restoring a backup/);
    expect(r.stderr).toMatch(/sync --full/);
    expect(r.stderr).not.toMatch(/failed: conversation/);

    const v = await run(['verify'], env);
    expect(v.code, v.stderr).toBe(1);
    expect(v.stderr + v.stdout).toMatch(/database/);
  });
});

describe('files are private whatever the umask', () => {
  it.each(['000', '022', '077'])('under umask %s: database, WAL, lock and directories are 0600/0700, published exports read-only 0400', async (mask) => {
    const ws = FakeWorkspace.fromCounts([3, 120]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const home = path.join(dir, 'home');
    fs.mkdirSync(home);
    const env = cliEnv(fake, home, { CONVO_MIRROR_DB: path.join(home, 'data', 'mirror.sqlite'), CONVO_MIRROR_EXPORT_DIR: path.join(home, 'data', 'exports') });
    // A slow request (cut by a 1 s timeout) keeps the writer alive while its WAL, SHM and lock files exist.
    let holding = false;
    fake.beforeServe((req) => {
      if (req.path === msgPath(ws.list()[1]!.id) && req.query['page'] === '2') holding = true;
    });
    fake.injectFault({ kind: 'slow', delayMs: 15_000, match: { path: msgPath(ws.list()[1]!.id), page: 2 } });
    const modes: Record<string, { mode: string; dir: boolean }> = {};
    const walk = (p: string, rel: string) => {
      const st = fs.lstatSync(p);
      modes[rel] = { mode: (st.mode & 0o7777).toString(8), dir: st.isDirectory() };
      if (st.isDirectory()) for (const n of fs.readdirSync(p)) walk(path.join(p, n), `${rel}/${n}`);
    };
    const running = runWithUmask(mask, ['sync', '--request-timeout', '1000', '--max-retries', '0'], env);
    await waitFor(() => holding, 10_000, 'the slow request');
    walk(path.join(home, 'data'), 'data'); // while the writer runs
    const r = await running;
    expect(r.code, r.stderr).toBe(1); // the held request timed out: that conversation failed, as arranged
    walk(path.join(home, 'data'), 'data'); // after publication
    const names = Object.keys(modes);
    for (const suffix of ['mirror.sqlite', 'mirror.sqlite-wal', 'mirror.sqlite-shm', 'mirror.sqlite.lock', 'mirror.sqlite.lock.json', 'exports/manifest.json']) {
      expect(names, suffix).toContain(`data/${suffix}`);
    }
    expect(names.some((n) => n.endsWith('.jsonl'))).toBe(true);
    // Published files (data files, batch records, the manifest) lose their write bits: another tool's overwrite fails loudly.
    const published = (rel: string) => rel.startsWith('data/exports/') && !rel.startsWith('data/exports/.convo-mirror-tmp/');
    for (const [rel, m] of Object.entries(modes)) expect(`${rel} ${m.mode}`).toBe(`${rel} ${m.dir ? '700' : published(rel) ? '400' : '600'}`);
  });

  it('--group-readable: files 0640, directories 0750, published exports 0440', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([3]));
    const dir = tempDir();
    const r = await runWithUmask('077', ['sync', '--group-readable'], cliEnv(fake, path.join(dir, 'data')));
    expect(r.code, r.stderr).toBe(0);
    expect((fs.statSync(path.join(dir, 'data')).mode & 0o777).toString(8)).toBe('750');
    expect((fs.statSync(path.join(dir, 'data', 'mirror.sqlite')).mode & 0o777).toString(8)).toBe('640');
    expect((fs.statSync(path.join(dir, 'data', 'exports', 'manifest.json')).mode & 0o777).toString(8)).toBe('440');
    expect((fs.statSync(path.join(dir, 'data', 'exports', '_ledger', '000000000001.json')).mode & 0o777).toString(8)).toBe('440');
    expect((fs.statSync(path.join(dir, 'data', 'exports', '_ledger')).mode & 0o777).toString(8)).toBe('750');
  });
});

describe('status and verify on a read-only copy', () => {
  it.skipIf(unprivilegedSkip)(skipTitle('read an auditor\'s copy without creating, changing or migrating anything'), async () => {
    const ws = FakeWorkspace.fromCounts([4, 7]);
    const fake = await fakeApi(ws);
    const dir = tempDir();
    const env = cliEnv(fake, dir);
    expect((await run(['sync'], env)).code).toBe(0);
    const copy = path.join(tempDir(), 'copy');
    fs.cpSync(dir, copy, { recursive: true });
    const before = snapshotFiles(copy);
    const mtimes = new Map([...before.keys()].map((rel) => [rel, fs.statSync(path.join(copy, rel)).mtimeMs]));
    const copyEnv = cliEnv(fake, copy, { REDIS_URL: 'redis://127.0.0.1:1' });
    // Read-only for real: no write bit anywhere in the copy. Root ignores permission bits, so as
    // root the copy is handed to an unprivileged user (65534) who then reads it without write access.
    if (asRoot) {
      execFileSync('chown', ['-R', '65534:65534', copy]);
      execFileSync('chmod', ['a+x', path.dirname(copy)]);
    }
    execFileSync('chmod', ['-R', 'a-w', copy]);
    const asReader = (args: string[]) => runCommand(asUnprivileged([process.execPath, unprivilegedPath(CLI), ...args]), copyEnv);
    const st = await asReader(['status', '--json']);
    expect(st.code, st.stderr).toBe(0);
    expect(JSON.parse(st.stdout).counts.messages).toBe(11);
    const v = await asReader(['verify']);
    expect(v.code, v.stderr + v.stdout).toBe(0);
    expect(v.stdout).toMatch(/intact/);
    execFileSync('chmod', ['-R', 'u+w', copy]);
    const after = snapshotFiles(copy);
    expect([...after.keys()].sort()).toEqual([...before.keys()].sort());
    for (const [rel, bytes] of before) {
      expect(after.get(rel)!.equals(bytes), rel).toBe(true);
      expect(fs.statSync(path.join(copy, rel)).mtimeMs, rel).toBe(mtimes.get(rel));
    }
  });
});
