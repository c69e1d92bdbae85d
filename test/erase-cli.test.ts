/**
 * `convo-mirror erase` as a user runs it (the built CLI, issue 26 item 2): usage errors exit 2 and
 * write nothing; `--dry-run` prints the counts of the mirror and the archive and writes nothing;
 * an erasure prints what it did (never the subject's id, neither on stdout nor in the logs), exits
 * 0, and `verify --deep` then proves the archive intact and lists the erasure record with its
 * reason; a mirror whose writer lock is held is refused. A SQLite mirror synced against the fake.
 */
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { openMirror } from '../src/store/open-mirror.js';
import { assertBuilt, killLeftovers, run, type Ran } from './children.js';
import { ACCOUNT_ID, cliEnv, harnessPool, snapshotFiles, type Harness } from './helpers.js';

const pool = harnessPool();
afterEach(async () => {
  await killLeftovers();
  await pool.closeAll();
});
beforeAll(assertBuilt);

const SECRET = 'Quokka-Zebra-5521 passport number';

/** A synced archive whose customer of conversation 1 wrote {@link SECRET}; the harness's mirror closed (the CLI takes its writer lock). */
async function synced(): Promise<{ h: Harness; sender: string; conversation: string; env: NodeJS.ProcessEnv }> {
  const ws = FakeWorkspace.fromCounts([5, 30, 3]);
  const c = ws.list()[1]!;
  const mine = c.messages.find((m) => m.sender.type === 'Customer')!;
  ws.editMessage(c.id, mine.id, SECRET);
  const h = await pool.start({ workspace: ws });
  expect((await h.sync()).status).toBe('succeeded');
  await h.mirror.close();
  return { h, sender: mine.sender.id, conversation: c.id, env: cliEnv(h.fake, h.dir, { CONVO_MIRROR_BASE_URL: undefined, CONVO_MIRROR_API_KEY: undefined }) };
}

const erase = (args: string[], env: NodeJS.ProcessEnv): Promise<Ran> => run(['erase', ...args], env);

/** Which files under the export directory hold `needle` (decompressed for `.gz`). */
function holding(exportDir: string, needle: string): string[] {
  return [...snapshotFiles(exportDir)].filter(([p, b]) => (p.endsWith('.gz') ? zlib.gunzipSync(b) : b).includes(needle)).map(([p]) => p);
}

describe('convo-mirror erase', () => {
  it('usage errors exit 2 and write nothing: no reason, a blank one, both or neither subject, an unknown account, no mirror', async () => {
    const { h, sender, conversation, env } = await synced();
    const before = snapshotFiles(h.dir);
    const cases: [string[], RegExp][] = [
      [['--sender', sender], /^convo-mirror: configuration error: --reason: is required/m],
      [['--sender', sender, '--reason', '  '], /^convo-mirror: configuration error: --reason: is required/m],
      [['--sender', sender, '--conversation', conversation, '--reason', 'T-1'], /^convo-mirror: configuration error: --sender: give exactly one of --sender ID/m],
      [['--reason', 'T-1'], /^convo-mirror: configuration error: --sender: give exactly one/m],
      [['--sender', sender, '--reason', 'T-1', '--account', 'someone-else'], /^convo-mirror: configuration error: --account: "someone-else" is not a configured workspace/m],
    ];
    for (const [args, message] of cases) {
      const r = await erase(args, env);
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr).toMatch(message);
      expect(r.stdout).toBe('');
    }
    const none = await erase(['--sender', sender, '--reason', 'T-1'], { ...env, CONVO_MIRROR_DB: path.join(h.dir, 'absent.sqlite') });
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/^convo-mirror: configuration error: CONVO_MIRROR_DB: no mirror at .*absent\.sqlite: nothing to erase/m);
    expect(fs.existsSync(path.join(h.dir, 'absent.sqlite'))).toBe(false);
    // A workspace the mirror holds no message of (the account setting wrong): refused, naming it and what the mirror holds.
    const other = '11111111-1111-4111-8111-111111111111';
    for (const extra of [[], ['--dry-run']]) {
      const wrong = await erase(['--sender', sender, '--reason', 'T-1', ...extra], { ...env, CONVO_MIRROR_ACCOUNT_ID: other });
      expect(wrong.code, wrong.stderr).toBe(2);
      expect(wrong.stderr).toMatch(new RegExp(`^convo-mirror: configuration error: CONVO_MIRROR_ACCOUNT_ID: the mirror holds no message of account ${other}, but holds messages of ${ACCOUNT_ID}: name the workspace with --account-id`, 'm'));
      expect(wrong.stdout).toBe('');
    }
    expect(snapshotFiles(h.dir)).toEqual(before);
  });

  it('--dry-run prints what the mirror and the archive would lose, and writes nothing', async () => {
    const { h, sender, env } = await synced();
    const before = snapshotFiles(h.dir);
    const r = await erase(['--sender', sender, '--reason', 'DSR-42', '--dry-run'], env);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines[0]).toBe(`dry run (nothing written): erasing a sender of account ${ACCOUNT_ID}, reason "DSR-42"`);
    // The conversation whose contact is the sender is the sender's too.
    expect(lines[1]).toMatch(/^mirror: would redact \d+ messages, 0 history versions, 0 unpublished changes, 1 conversation object; \d+ published lines at or below seq \d+$/);
    expect(lines[2]).toMatch(/^archive: would rewrite [1-9]\d* files?, replacing [1-9]\d* lines? by stubs$/);
    expect(r.stdout).not.toContain(sender);
    expect(snapshotFiles(h.dir)).toEqual(before);
  });

  it('erases: prints what it did without the subject, exits 0; verify --deep is intact and lists the erasure record with its reason; the content is gone from the archive', async () => {
    const { h, sender, env } = await synced();
    expect(holding(h.exportDir, SECRET).length).toBeGreaterThan(0);
    const r = await erase(['--sender', sender, '--reason', 'DSR-42'], env);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines[0]).toBe(`erasure 1: a sender of account ${ACCOUNT_ID}, reason "DSR-42"`);
    expect(lines[1]).toMatch(/^mirror: redacted [1-9]\d* messages, 0 history versions, 0 unpublished changes, 1 conversation object; [1-9]\d* published lines at or below seq \d+ for the archive$/);
    const archive = /^archive: (\d+) files? rewritten, (\d+) lines? replaced by stubs; erasure record (\d+) \(_ledger\/(\d{12})\.json\); (\d+) replaced files? removed$/.exec(lines[2]!);
    expect(archive, lines[2]).not.toBeNull();
    const [, files, stubbed, record] = archive!;
    expect(lines[3]).toMatch(new RegExp(`^ledger head: ${record}:[0-9a-f]{64}$`));
    expect(lines).toHaveLength(4);
    // Structured logs on stderr (not a terminal), and the subject's id nowhere in the output.
    expect(r.stderr.split('\n').filter(Boolean).every((l) => l.startsWith('{'))).toBe(true);
    expect(r.stderr).toContain('"msg":"erasure recorded in the mirror"');
    expect(r.stdout + r.stderr).not.toContain(sender);
    expect(holding(h.exportDir, SECRET)).toEqual([]);

    const v = await run(['verify', '--deep'], env);
    expect(v.code, v.stderr).toBe(0);
    expect(v.stdout).toMatch(new RegExp(`^erased: record ${record} \\(_ledger/\\d{12}\\.json\\): erasure 1 of a sender of account ${ACCOUNT_ID}, requested \\S+, reason "DSR-42": ${stubbed} lines? in ${files} files? replaced by stubs$`, 'm'));
    expect(v.stdout).toMatch(/^ok {3}deep: /m);
    expect(v.stdout.trimEnd().split('\n').at(-1)).toMatch(/^archive intact: /);

    // Again, --json: nothing left to rewrite, no record.
    const again = await erase(['--sender', sender, '--reason', 'DSR-43', '--json'], env);
    expect(again.code, again.stderr).toBe(0);
    const out = JSON.parse(again.stdout) as { dryRun: boolean; request: Record<string, unknown>; mirror: { erasureId: number }; archived: { erasureId: number; record?: unknown; lines: number }[] };
    expect(out.dryRun).toBe(false);
    expect(out.request).toEqual({ kind: 'sender', reason: 'DSR-43', accountId: ACCOUNT_ID, dryRun: false });
    expect(out.archived).toEqual([{ erasureId: 2, files: [], lines: 0, removed: 0, kept: [] }]);
    expect(again.stdout).not.toContain(sender);
  });

  it('refuses a mirror whose writer lock another process holds (exit 2), and erases nothing', async () => {
    const { h, sender, env } = await synced();
    const writer = await openMirror(path.join(h.dir, 'mirror.sqlite'));
    try {
      const r = await erase(['--sender', sender, '--reason', 'DSR-42'], env);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toMatch(/^convo-mirror: mirror error: /m);
      expect(await writer.erasures()).toEqual([]);
    } finally {
      await writer.close();
    }
  });
});
