/**
 * The CLI as a user runs it: a child process (the built CLI that package.json's `bin` names, built
 * by `npm test`) against the fake API in this process, real SQLite and export files in temp dirs.
 * Every child has a time limit and is killed afterwards.
 */
import { describe, it, expect, beforeAll, afterAll, afterEach } from 'vitest';
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { verifyExports } from '../src/export/exporter.js';
import { ACCOUNT_ID, API_KEY, cliEnv, mirrorEqualsFake, readExportLines, replay, tempDir, liveMessages } from './helpers.js';
import { assertBuilt, killLeftovers, run, start } from './children.js';
import { sqlAll } from './sql.js';

beforeAll(assertBuilt);
afterEach(killLeftovers);

describe('convo-mirror sync (CLI)', () => {
  let fake: FakeApi;
  let ws: FakeWorkspace;
  beforeAll(async () => {
    ws = FakeWorkspace.generate({ seed: 11, conversations: 30 });
    fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
  });
  afterAll(async () => fake.close());

  it('mirrors the workspace, exits 0, logs JSON to stderr off a TTY, and never prints the API key', async () => {
    const dir = tempDir();
    const r = await run(['sync'], cliEnv(fake, dir));
    expect(r.stderr).not.toContain(API_KEY);
    expect(r.stdout).not.toContain(API_KEY);
    expect(r.code, r.stderr).toBe(0);
    const logLines = r.stderr.trim().split('\n').map((l) => JSON.parse(l) as { msg: string });
    expect(logLines.map((l) => l.msg)).toContain('run finished');
    expect(r.stdout).toMatch(/run 1 \(workspace, incremental\) succeeded/);
    const mirror = await openMirror(path.join(dir, 'mirror.sqlite'));
    try {
      const eq = mirrorEqualsFake(mirror, ws);
      expect(eq.ok, eq.detail).toBe(true);
    } finally {
      await mirror.close();
    }
    // status and verify read the same files.
    const st = await run(['status', '--json'], cliEnv(fake, dir));
    expect(st.code).toBe(0);
    const status = JSON.parse(st.stdout) as { counts: { messages: number }; runs: { status: string }[] };
    expect(status.counts.messages).toBe(ws.totals().messages);
    expect(status.runs[0]!.status).toBe('succeeded');
    const v = await run(['verify'], cliEnv(fake, dir));
    expect(v.code, v.stderr).toBe(0);
    expect(v.stdout).toMatch(/archive intact/);
    // A second run changes nothing and says so.
    const again = await run(['sync'], cliEnv(fake, dir));
    expect(again.code).toBe(0);
    expect(again.stdout).toMatch(/exports: no new lines/);
  });

  it('exits 2 on 401 without retrying, naming the variable to fix', async () => {
    const before = fake.requests.length;
    const r = await run(['sync'], cliEnv(fake, tempDir(), { CONVO_MIRROR_API_KEY: 'not-the-key' }));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/authentication error: .*401.*CONVO_MIRROR_API_KEY/);
    expect(r.stderr).not.toContain('not-the-key');
    expect(fake.requests.length - before).toBe(1);
  });

  it('exits 2 on 403 (wrong X-Account-Id) without retrying', async () => {
    const before = fake.requests.length;
    const r = await run(['sync'], cliEnv(fake, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: '00000000-0000-4000-8000-000000000000' }));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/authentication error: .*403.*CONVO_MIRROR_ACCOUNT_ID/);
    expect(fake.requests.length - before).toBe(1);
  });

  it('exits 2 with a one-line message naming a missing or malformed variable', async () => {
    const env = cliEnv(fake, tempDir());
    delete env.CONVO_MIRROR_BASE_URL;
    const r = await run(['sync'], env);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/CONVO_MIRROR_BASE_URL/);
    const bad = await run(['sync', '--concurrency', 'lots'], cliEnv(fake, tempDir()));
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--concurrency/);
  });

  it('exits 1 and names each conversation that failed after retries; the others are mirrored', async () => {
    const victim = ws.list()[3]!.id;
    fake.injectFault({ kind: 'status', status: 503, match: { path: `/v1/conversations/${victim}/messages` }, times: Infinity });
    try {
      const dir = tempDir();
      const r = await run(['sync'], cliEnv(fake, dir, { CONVO_MIRROR_MAX_RETRIES: '1' }));
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`failed: conversation ${victim}`);
      const mirror = await openMirror(path.join(dir, 'mirror.sqlite'));
      try {
        const live = liveMessages(mirror);
        const others = ws.list().filter((c) => c.id !== victim);
        expect(live.size).toBe(others.reduce((n, c) => n + c.messages.length, 0));
      } finally {
        await mirror.close();
      }
    } finally {
      fake.clearFaults();
    }
  });
});

describe('crash safety: SIGKILL mid-run, then re-run', () => {
  it('leaves an exact mirror, no duplicate export line and no partial file', async () => {
    const ws = FakeWorkspace.generate({ seed: 5, conversations: 40 });
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    const dir = tempDir();
    const env = cliEnv(fake, dir, { CONVO_MIRROR_CONCURRENCY: '3', LOG_LEVEL: 'warn' });
    try {
      // Kill the process at several points: early in the listing, mid-crawl, late in the crawl.
      const killPoints = [2, 15, 30];
      let killed = 0;
      for (const k of killPoints) {
        let seen = 0;
        let child: ChildProcess | undefined;
        const off = fake.beforeServe(() => {
          seen++;
          if (seen === k && child) {
            child.kill('SIGKILL');
            killed++;
          }
        });
        const started = start(['sync'], env);
        child = started.child;
        const r = await started.done;
        off();
        expect(r.signal).toBe('SIGKILL');
      }
      expect(killed).toBe(killPoints.length);
      // Between the kills some pages were committed: checkpoints or rows exist.
      const mid = await openMirror(path.join(dir, 'mirror.sqlite'));
      const midMessages = liveMessages(mid).size;
      await mid.close();
      expect(midMessages).toBeGreaterThan(0);
      expect(midMessages).toBeLessThan(ws.totals().messages);

      const final = await run(['sync'], env);
      expect(final.code, final.stderr).toBe(0);
      const mirror = await openMirror(path.join(dir, 'mirror.sqlite'));
      try {
        const eq = mirrorEqualsFake(mirror, ws);
        expect(eq.ok, eq.detail).toBe(true);
        expect(await verifyExports(mirror, path.join(dir, 'exports'))).toEqual([]);
        const runs = sqlAll<{ status: string }>(mirror, `SELECT status FROM runs ORDER BY id`);
        expect(runs.map((r) => r.status)).toEqual(['interrupted', 'interrupted', 'interrupted', 'succeeded']);
      } finally {
        await mirror.close();
      }
      const lines = readExportLines(path.join(dir, 'exports'), 'messages');
      const seqs = lines.map((l) => l.seq);
      expect(new Set(seqs).size).toBe(seqs.length);
      const keys = lines.map((l) => `${l.conversation_id}/${l.id}/${l.op}`);
      expect(new Set(keys).size).toBe(keys.length); // nothing changed at the fake: one insert per message, ever
      expect(lines.length).toBe(ws.totals().messages);
      expect(replay(lines, 'messages').size).toBe(ws.totals().messages);
      // No temp file anywhere.
      const tmp: string[] = [];
      const walk = (d: string) => {
        for (const e of fs.readdirSync(d, { withFileTypes: true })) {
          if (e.isDirectory()) walk(path.join(d, e.name));
          else if (e.name.endsWith('.tmp')) tmp.push(e.name);
        }
      };
      walk(path.join(dir, 'exports'));
      expect(tmp).toEqual([]);
    } finally {
      await fake.close();
    }
  });
});

describe('convo-mirror demo', () => {
  it('mirrors the demo workspace with equal counts, and a second run publishes no new line', async () => {
    const dir = tempDir();
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', LOG_LEVEL: 'warn' };
    const first = await run(['demo', '--dir', dir, '--conversations', '40', '--seed', '9'], env);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout).toMatch(/mirror: (\d+) conversations, (\d+) messages {2}\(equal\)/);
    const ws = FakeWorkspace.generate({ seed: 9, conversations: 40 });
    expect(first.stdout).toContain(`fake:   40 conversations, ${ws.totals().messages} messages`);
    const second = await run(['demo', '--dir', dir, '--conversations', '40', '--seed', '9'], env);
    expect(second.code).toBe(0);
    expect(second.stdout).toMatch(/exports: no new lines/);
  });

  it('applies CONVO_MIRROR_RETENTION with CONVO_MIRROR_PRUNE_MIRROR: the messages created before the cutoff are erased, the archive still verifies', async () => {
    const dir = tempDir();
    const env = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', LOG_LEVEL: 'warn' };
    expect((await run(['demo', '--dir', dir, '--conversations', '40', '--seed', '9'], env)).code).toBe(0);
    // The fake's messages were written from 2025-01-01 on: a cutoff in the first days of 2025 expires some of them.
    const ws = FakeWorkspace.generate({ seed: 9, conversations: 40 });
    const created = ws.list().flatMap((c) => c.messages.map((m) => Date.parse(m.created_at)));
    const cutoff = new Date(Math.min(...created) + 3 * 86_400_000).toISOString().slice(0, 10);
    const days = Math.round((Date.parse(new Date().toISOString().slice(0, 10)) - Date.parse(cutoff)) / 86_400_000);
    const expired = created.filter((t) => t < Date.parse(cutoff)).length;
    expect(expired).toBeGreaterThan(0);
    const again = await run(['demo', '--dir', dir, '--conversations', '40', '--seed', '9'], { ...env, CONVO_MIRROR_RETENTION: `messages=${days}d`, CONVO_MIRROR_PRUNE_MIRROR: 'true' });
    expect(again.code, again.stderr).toBe(0);
    const m = await openMirror(path.join(dir, 'mirror.sqlite'), { readonly: true });
    let subject = '';
    try {
      const [e, ...more] = await m.erasures();
      expect(more).toEqual([]);
      // The demo's clock is the system's: midnight UTC may pass between this test's day and the publication's.
      subject = e!.subject;
      expect([cutoff, new Date(Date.parse(cutoff) + 86_400_000).toISOString().slice(0, 10)]).toContain(subject);
      const erased = created.filter((t) => t < Date.parse(subject)).length;
      expect([e!.kind, e!.messages]).toEqual(['retention', erased]);
      expect((await m.counts()).messages_erased).toBe(erased);
      expect(erased).toBeGreaterThanOrEqual(expired);
    } finally {
      await m.close();
    }
    const v = await run(['verify', '--db', path.join(dir, 'mirror.sqlite'), '--export-dir', path.join(dir, 'exports'), '--deep'], env);
    expect(v.code, v.stdout).toBe(0);
    expect(v.stdout).toMatch(new RegExp(`^erased: record \\d+ .*erasure 1 of the messages created before ${subject} \\(retention\\).*: \\d+ lines? in \\d+ files? replaced by stubs$`, 'm'));
  });
});
