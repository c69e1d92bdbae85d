/**
 * `convo-mirror backup FILE`: a consistent copy of a live mirror with SQLite's online backup,
 * taken without the writer lock. While a real `sync` writes the mirror, the backup is made through
 * the writer's WAL, passes `PRAGMA integrity_check`, and `status` reads it; in-process, the copy
 * is the snapshot of the moment the source was opened whatever the writer commits meanwhile, a
 * writer that starts under an immutable read makes it copy again, and the new file is private,
 * never written over an existing one, and removed when the backup is interrupted.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { BackupInterrupted, backupMirror } from '../src/store/sqlite/backup.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { Database } from '../src/store/sqlite/sqlite.js';
import { assertBuilt, killLeftovers, run, runCommand, start, waitFor, CLI } from './children.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { sqlValue } from './sql.js';

const dirs: string[] = [];
const fakes: FakeApi[] = [];
beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.all(fakes.splice(0).map((f) => f.close()));
});
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

function dir(): string {
  const d = tempDir('convo-mirror-backup-');
  dirs.push(d);
  return d;
}

async function fake(conversations: number, seed = 21): Promise<FakeApi> {
  const f = await startFakeApi({ workspace: FakeWorkspace.generate({ seed, conversations }), apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(f);
  return f;
}

/** `PRAGMA integrity_check` of `file`, opened read-only and immutable (nothing created beside it). */
function integrity(file: string): string {
  const db = new Database(`file://${file}?immutable=1`, { readonly: true, fileMustExist: true });
  try {
    return (db.pragma('integrity_check') as { integrity_check: string }[]).map((r) => r.integrity_check).join('; ');
  } finally {
    db.close();
  }
}

/** A mirror with some data in `d` (a CLI sync of a small fake); returns its path. */
async function smallMirror(d: string): Promise<string> {
  const f = await fake(20);
  const r = await run(['sync'], cliEnv(f, d, { LOG_LEVEL: 'warn' }), 30_000);
  expect(r.code, r.stderr).toBe(0);
  return path.join(d, 'mirror.sqlite');
}

/** Live messages in the mirror `file` as status reads them; 0 while there is no mirror yet. */
async function messagesIn(file: string): Promise<number> {
  if (!fs.existsSync(file)) return 0;
  try {
    return await readConsistent(file, async (m) => (await m.counts())['messages'] ?? 0);
  } catch {
    return 0; // created but not yet migrated by the starting sync
  }
}

const runsIn = (file: string): Promise<number> => readConsistent(file, (m) => sqlValue(m, 'SELECT count(*) FROM runs'));

describe('backup while a real sync writes the mirror', () => {
  it('copies through the writer\'s WAL: exit 0, a 0600 file that passes integrity_check and that status reads, while the sync goes on', async () => {
    const f = await fake(400, 22);
    const d = dir();
    // 10 requests/s over about 800 requests: the sync writes for over a minute unless stopped.
    const env = cliEnv(f, d, { CONVO_MIRROR_MAX_RPS: '10', LOG_LEVEL: 'warn' });
    const db = path.join(d, 'mirror.sqlite');
    const sync = start(['sync'], env, 120_000);
    // Wait until the sync holds the writer lock and has committed messages (read as status reads).
    await waitFor(async () => (await messagesIn(db)) > 0, 60_000, 'the sync to commit messages', 100);
    const backup = path.join(d, 'backups', 'mirror-copy.sqlite');
    fs.mkdirSync(path.dirname(backup));
    const b = await runCommand(['sh', '-c', 'umask 000; exec "$@"', 'sh', process.execPath, CLI, 'backup', backup], env, 30_000);
    expect(b.code, b.stderr).toBe(0);
    expect(b.stdout).toMatch(/^backup written: .*mirror-copy\.sqlite \(\d+\.\d MiB; read through the running writer's WAL, at one instant\)$/m);
    expect(b.stdout).toMatch(/checked: PRAGMA quick_check ok/);
    expect(sync.child.exitCode, 'the sync was still running when the backup ended').toBeNull();
    expect(fs.statSync(backup).mode & 0o777).toBe(0o600);
    expect(fs.readdirSync(path.dirname(backup))).toEqual(['mirror-copy.sqlite']); // no -journal left
    expect(integrity(backup)).toBe('ok');
    const atBackup = await messagesIn(backup);
    expect(atBackup).toBeGreaterThan(0);
    const status = await run(['status'], { ...env, CONVO_MIRROR_DB: backup }, 20_000);
    expect(status.code, status.stderr).toBe(0);
    expect(status.stdout).toContain(`mirror ${backup}`);
    expect(status.stdout).toMatch(new RegExp(`^ {2}messages +${atBackup}$`, 'm'));
    // status of the backup created nothing beside it
    expect(fs.readdirSync(path.dirname(backup))).toEqual(['mirror-copy.sqlite']);
    // The sync went on writing after the backup, and ends as interrupted when asked to.
    await waitFor(async () => (await messagesIn(db)) > atBackup, 60_000, 'the sync to commit more', 100);
    sync.child.kill('SIGTERM');
    const ended = await sync.done;
    expect(ended.code, ended.stderr).toBe(130);
  });
});

describe('backupMirror (in-process)', () => {
  it('copies the snapshot of the moment it opened the source: commits a live writer makes between steps are not in it', async () => {
    const d = dir();
    const file = await smallMirror(d);
    const writer = await openMirror(file); // a live writer: the backup reads through its WAL
    try {
      const before = await runsIn(file);
      let steps = 0;
      const out = path.join(d, 'copy.sqlite');
      const r = await backupMirror(file, out, {
        pagesPerStep: 1,
        onProgress: async () => {
          // Every step, the writer commits: without a pinned snapshot SQLite would restart the copy.
          if (steps++ < 50) await writer.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
        },
      });
      expect(r.access).toBe('shared');
      expect(steps).toBeGreaterThan(50);
      expect(r.pages).toBeGreaterThan(50);
      expect(await runsIn(file)).toBe(before + 50);
      expect(await runsIn(out)).toBe(before);
      expect(integrity(out)).toBe('ok');
    } finally {
      await writer.close();
    }
  });

  it('a writer that starts under an immutable read makes it copy again, through the writer', async () => {
    const d = dir();
    const file = await smallMirror(d);
    const before = await runsIn(file);
    let writer: Mirror | undefined;
    const seen: string[] = [];
    try {
      const r = await backupMirror(file, path.join(d, 'copy.sqlite'), {
        onSourceOpen: async (attempt, access) => {
          seen.push(`${attempt}:${access}`);
          if (attempt === 1) {
            writer = await openMirror(file);
            await writer.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'cli', accountId: ACCOUNT_ID });
          }
        },
      });
      expect(seen).toEqual(['1:immutable', '2:shared']);
      expect(r.attempts).toBe(2);
      expect(await runsIn(r.file)).toBe(before + 1);
      expect(integrity(r.file)).toBe('ok');
    } finally {
      await writer?.close();
    }
  });

  it('never writes over a file: an existing file, a dangling symbolic link, a stale -journal; a missing directory; the mirror itself', async () => {
    const d = dir();
    const file = await smallMirror(d);
    const existing = path.join(d, 'existing.sqlite');
    fs.writeFileSync(existing, 'keep me');
    const link = path.join(d, 'link.sqlite');
    fs.symlinkSync(path.join(d, 'nowhere'), link);
    const journaled = path.join(d, 'journaled.sqlite');
    fs.writeFileSync(`${journaled}-journal`, 'stale');
    for (const [dest, why] of [
      [existing, /existing\.sqlite already exists; a backup never writes over a file/],
      [link, /link\.sqlite already exists/],
      [journaled, /journaled\.sqlite-journal already exists/],
      [path.join(d, 'no', 'such', 'dir', 'b.sqlite'), /its directory .*no\/such\/dir does not exist/],
      [file, /onto itself: name a new file/],
    ] as const) {
      await expect(backupMirror(file, dest)).rejects.toThrow(why);
    }
    expect(fs.readFileSync(existing, 'utf8')).toBe('keep me');
    expect(fs.readlinkSync(link)).toBe(path.join(d, 'nowhere'));
    expect(fs.existsSync(path.join(d, 'nowhere'))).toBe(false);
    expect(fs.existsSync(journaled)).toBe(false);
    expect(integrity(file)).toBe('ok');
  });

  it('interrupted mid-copy: BackupInterrupted, and the partial file and its -journal are removed', async () => {
    const d = dir();
    const file = await smallMirror(d);
    const out = path.join(d, 'copy.sqlite');
    let steps = 0;
    const err = await backupMirror(file, out, { pagesPerStep: 1, onProgress: () => void steps++, interrupted: () => (steps >= 3 ? 'SIGINT' : undefined) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BackupInterrupted);
    expect((err as Error).message).toBe('backup interrupted by SIGINT; the partial copy was removed');
    expect(fs.readdirSync(d).filter((n) => n.startsWith('copy'))).toEqual([]);
  });

  it('the new file is 0640 with the group-readable modes, whatever the umask', async () => {
    const d = dir();
    const file = await smallMirror(d);
    const out = path.join(d, 'copy.sqlite');
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, CONVO_MIRROR_DB: file, LOG_LEVEL: 'warn' };
    const r = await runCommand(['sh', '-c', 'umask 077; exec "$@"', 'sh', process.execPath, CLI, 'backup', '--group-readable', out], env, 30_000);
    expect(r.code, r.stderr).toBe(0);
    expect(fs.statSync(out).mode & 0o777).toBe(0o640);
    const again = await run(['backup', out], env, 30_000);
    expect(again.code).toBe(2);
    expect(again.stderr.trim()).toBe(`convo-mirror: mirror error: cannot back up to ${out}: ${out} already exists; a backup never writes over a file, name a new one`);
    const none = await run(['backup', path.join(d, 'other.sqlite')], { ...env, CONVO_MIRROR_DB: path.join(d, 'none.sqlite') }, 30_000);
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/no mirror at .*none\.sqlite \(CONVO_MIRROR_DB\): nothing to back up/);
    expect(fs.existsSync(path.join(d, 'other.sqlite'))).toBe(false);
  });
});
