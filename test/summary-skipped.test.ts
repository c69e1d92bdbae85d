/**
 * The sync summary tells conversations skipped on their change signal apart from those it asked the
 * API about: a second run over an unchanged workspace said "300 synced" for conversations it never
 * asked about (issue 24). Real CLI runs against the in-process fake.
 */
import fs from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { summaryLines } from '../src/cli/summary.js';
import type { RunSummary } from '../src/run/index.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';

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

/** The `conversations:` line of a text summary. */
const conversationsLine = (stdout: string): string => stdout.split('\n').find((l) => l.startsWith('  conversations:')) ?? `(no conversations line in)\n${stdout}`;

describe('the sync summary says skipped for conversations skipped on their change signal', () => {
  it('first run: all synced; unchanged: 0 synced, all skipped; one changed: 1 synced, the others skipped; --json counts them in synced and in skipped', async () => {
    const ws = FakeWorkspace.generate({ seed: 11, conversations: 25 });
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const dir = tempDir('convo-mirror-skipped-');
    dirs.push(dir);
    const env = cliEnv(fake, dir, { LOG_LEVEL: 'warn' });

    const first = await run(['sync'], env, 30_000);
    expect(first.code, first.stderr).toBe(0);
    expect(conversationsLine(first.stdout)).toBe('  conversations: 25 synced, 0 tombstoned, 0 failed (25 listed in 1 pass)');

    const unchanged = await run(['sync'], env, 30_000);
    expect(unchanged.code, unchanged.stderr).toBe(0);
    const line = conversationsLine(unchanged.stdout);
    const m = /^ {2}conversations: 0 synced, (\d+) skipped \(change signal unmoved\), 0 tombstoned, 0 failed \((\d+) listed in 1 pass\)$/.exec(line);
    expect(m, line).not.toBeNull();
    expect(m![1]).toBe(m![2]); // every conversation listed was skipped
    expect(unchanged.stdout).toMatch(/messages: 0 served/);

    const changed = ws.list()[ws.list().length - 1]!.id;
    ws.appendMessages(changed, 3);
    const one = await run(['sync', '--json'], env, 30_000);
    expect(one.code, one.stderr).toBe(0);
    const s = JSON.parse(one.stdout) as RunSummary;
    expect(s.messages.inserted).toBe(3);
    expect(s.conversations.skipped).toBe(s.conversations.synced - 1);
    expect(summaryLines(s)[1]).toBe(
      `  conversations: 1 synced, ${s.conversations.synced - 1} skipped (change signal unmoved), 0 tombstoned, 0 failed (${s.conversations.listed} listed in 1 pass)`,
    );
  });

  it('a full refresh skips nothing, so its line has no skipped part', async () => {
    const ws = FakeWorkspace.generate({ seed: 12, conversations: 5 });
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const dir = tempDir('convo-mirror-skipped-');
    dirs.push(dir);
    const env = cliEnv(fake, dir, { LOG_LEVEL: 'warn' });
    expect((await run(['sync'], env, 30_000)).code).toBe(0);
    const full = await run(['sync', '--full'], env, 30_000);
    expect(full.code, full.stderr).toBe(0);
    expect(conversationsLine(full.stdout)).toMatch(/^ {2}conversations: 5 synced, 0 tombstoned, 0 failed \(5 listed in 2 passes\)$/);
  });
});
