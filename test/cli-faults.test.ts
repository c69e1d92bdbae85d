/**
 * The CLI as a process under faults: a second writer, SIGKILL in the middle of export publication,
 * SIGINT during a long Retry-After, secrets at trace level, and configuration mistakes. Each test
 * spawns the built CLI (package.json's `bin`, built by `npm test`) against the fake API in this
 * process, on 127.0.0.1, with real SQLite and export files in temp dirs. Every wait is bounded and
 * every child is killed afterwards; what did not happen is read from the fake's request log, the
 * exit codes and the mirror's rows, never from elapsed time.
 */
import { describe, it, expect, beforeAll, afterEach, afterAll } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, mirrorEqualsFake, readExportLines, snapshotFiles, tempDir as makeTempDir, withMirror } from './helpers.js';
import { CLI as CLI_JS, assertBuilt, killLeftovers, run, start, startCommand, waitFor, type Ran, type Started } from './children.js';
import { sqlAll, sqlValue } from './sql.js';

/** Temp dirs of this file, removed in afterAll. */
const dirs: string[] = [];
function tempDir(): string {
  const d = makeTempDir('convo-mirror-faults-');
  dirs.push(d);
  return d;
}

beforeAll(assertBuilt);

afterEach(async () => {
  await killLeftovers();
});

afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('one writer per mirror file', () => {
  it('refuses a second sync naming the file and the holder, lets status read, and takes over the lock of a SIGKILLed holder', async () => {
    const ws = FakeWorkspace.generate({ seed: 11, conversations: 40 });
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    const dir = tempDir();
    const env = cliEnv(fake, dir);
    const db = path.join(dir, 'mirror.sqlite');
    const lockFile = `${db}.lock`;
    let first: Started | undefined;
    try {
      // One messages request hangs for 20 s: the first sync holds the lock until we kill it.
      fake.injectFault({ kind: 'slow', delayMs: 20_000, match: { path: /\/messages$/ }, times: 1 });
      first = start(['sync'], env);
      const holder = first.child.pid!;
      // The lock is taken before the first request, so the hung request proves the lock is held.
      await waitFor(() => fake.requests.some((r) => /\/messages$/.test(r.path) && r.status === 0), 10_000, 'the first sync to hit the slow request');
      expect(first.child.exitCode).toBeNull();
      expect(JSON.parse(fs.readFileSync(`${lockFile}.json`, 'utf8')).pid).toBe(holder);

      // Refused at once, not queued behind the lock: it ends while the holder still hangs.
      const second = await run(['sync'], env, 10_000);
      expect(second.code, second.stderr).toBe(2);
      expect(second.stderr).toContain(`the mirror ${db} is in use by process ${holder}`);
      // The refusal did not disturb the holder or its lock.
      expect(first.child.exitCode).toBeNull();
      expect(JSON.parse(fs.readFileSync(`${lockFile}.json`, 'utf8')).pid).toBe(holder);

      // Readers take no lock: status works while the writer runs, and sees its run.
      const st = await run(['status', '--json'], env, 10_000);
      expect(st.code, st.stderr).toBe(0);
      const status = JSON.parse(st.stdout) as { runs: { id: number; status: string }[] };
      expect(status.runs[0]!.status).toBe('running');
      expect(first.child.exitCode, 'the first sync ended before status ran').toBeNull();

      // SIGKILL the holder: its lock file stays, naming a dead pid.
      first.child.kill('SIGKILL');
      const killed = await first.done;
      expect(killed.signal).toBe('SIGKILL');
      expect(fs.existsSync(`${lockFile}.json`)).toBe(true);
      expect(JSON.parse(fs.readFileSync(`${lockFile}.json`, 'utf8')).pid).toBe(holder);

      // A new sync takes the stale lock over, completes, and releases it.
      const third = await run(['sync'], env);
      expect(third.code, third.stderr).toBe(0);
      expect(third.stderr).not.toContain('in use by process');
      expect(fs.existsSync(`${lockFile}.json`)).toBe(false);
      await withMirror(db, (m) => {
        const eq = mirrorEqualsFake(m, ws);
        expect(eq.ok, eq.detail).toBe(true);
        const runs = sqlAll<{ status: string }>(m, `SELECT status FROM runs ORDER BY id`);
        expect(runs.map((r) => r.status)).toEqual(['interrupted', 'succeeded']);
      });
    } finally {
      first?.child.kill('SIGKILL');
      await fake.close();
    }
  });
});

describe('SIGKILL during export publication, then re-run', () => {
  it('re-publishes the interrupted batch exactly once, leaves no temp file, and never changes a published file', async () => {
    const ws = FakeWorkspace.generate({ seed: 3, conversations: 150 });
    const totals = ws.totals();
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    const dir = tempDir();
    const db = path.join(dir, 'mirror.sqlite');
    const exportDir = path.join(dir, 'exports');
    const env = cliEnv(fake, dir, { LOG_LEVEL: 'warn', CONVO_MIRROR_CONCURRENCY: '8' });
    try {
      // A first sync whose publication is refused (a manifest.json convo-mirror did not write sits
      // in the export directory): everything is mirrored and nothing is published or planned.
      // Mirrored changes keep their payloads until a publication is recorded, so this is the state
      // every crash before the first rename leaves.
      fs.mkdirSync(exportDir, { mode: 0o700 });
      fs.writeFileSync(path.join(exportDir, 'manifest.json'), 'not a manifest');
      const first = await run(['sync'], env);
      expect(first.code, first.stderr).toBe(1);
      expect(first.stderr).toMatch(/manifest\.json is not a convo-mirror manifest/);
      fs.rmSync(path.join(exportDir, 'manifest.json'));
      await withMirror(db, (m) => {
        expect(sqlValue(m, `SELECT count(*) FROM export_batches`)).toBe(0);
        expect(sqlValue(m, `SELECT count(*) FROM change_payloads`)).toBe(sqlValue(m, `SELECT count(*) FROM change_log`));
      });
      // The publication is then killed for real at the failpoint before the messages file's
      // rename: its temp file is written and fsynced in .convo-mirror-tmp/, nothing is recorded.
      const killer = startCommand([process.execPath, '--input-type=module', '-e', publishUntilKilled(db, exportDir)], env);
      const r = await killer.done;
      expect(r.signal, `the publication was not killed at its failpoint: exit ${r.code}; stderr: ${r.stderr.slice(-500)}`).toBe('SIGKILL');
      expect(fs.readdirSync(path.join(exportDir, '.convo-mirror-tmp')).filter((n) => n.startsWith('messages-') && n.endsWith('.tmp'))).toHaveLength(1);
      await withMirror(db, (m) => {
        expect(sqlValue(m, `SELECT count(*) FROM export_batches WHERE published_at IS NULL`)).toBe(1);
        expect(sqlValue(m, `SELECT watermark FROM export_state WHERE id = 1`)).toBe(0);
      });
      // What was published (renamed into place) before the kill.
      const before = new Map([...snapshotFiles(exportDir)].filter(([rel]) => rel.endsWith('.jsonl')));
      expect([...before.keys()].some((rel) => new RegExp(`^conversations/account=${ACCOUNT_ID}/date=\\d{4}-\\d{2}-\\d{2}/`).test(rel)), [...before.keys()].join(', ')).toBe(true);
      expect([...before.keys()].some((rel) => rel.startsWith('messages/')), [...before.keys()].join(', ')).toBe(false);

      const again = await run(['sync', '--json'], env);
      expect(again.code, again.stderr).toBe(0);
      const summary = JSON.parse(again.stdout) as { status: string; export: { resumed: boolean } };
      expect(summary.status).toBe('succeeded');
      expect(summary.export.resumed).toBe(true);

      const after = snapshotFiles(exportDir);
      expect([...after.keys()].filter((rel) => rel.endsWith('.tmp'))).toEqual([]);
      for (const [rel, bytes] of before) {
        expect(after.get(rel), `published file ${rel} vanished`).toBeDefined();
        expect(after.get(rel)!.equals(bytes), `published file ${rel} changed on re-run`).toBe(true);
      }
      const v = await run(['verify'], env, 10_000);
      expect(v.code, v.stderr).toBe(0);
      expect(v.stdout).toMatch(/archive intact/);

      const msgs = readExportLines(exportDir, 'messages');
      const convs = readExportLines(exportDir, 'conversations');
      const allSeqs = [...msgs, ...convs].map((l) => l.seq);
      expect(new Set(allSeqs).size).toBe(allSeqs.length);
      expect(msgs.length).toBe(totals.messages);
      const inserts = new Map<string, number>();
      for (const l of msgs) if (l.op === 'insert') inserts.set(`${l.conversation_id}/${l.id}`, (inserts.get(`${l.conversation_id}/${l.id}`) ?? 0) + 1);
      expect(inserts.size).toBe(totals.messages);
      expect([...inserts.values()].every((n) => n === 1)).toBe(true);
      const convIds = convs.map((l) => l.id);
      expect(new Set(convIds).size).toBe(convIds.length);
      expect(convIds.length).toBe(totals.conversations);
    } finally {
      await fake.close();
    }
  });
});

/**
 * A module script that opens the mirror and publishes its pending batch, killing its own process
 * (SIGKILL, like a power cut) at the exporter's `before-rename` failpoint of the first messages file.
 */
function publishUntilKilled(db: string, exportDir: string): string {
  const dist = (rel: string) => JSON.stringify(pathToFileURL(path.join(path.dirname(CLI_JS), '..', rel)).href);
  return `
    import { openMirror } from ${dist('store/open-mirror.js')};
    import { publishChanges } from ${dist('export/exporter.js')};
    const mirror = await openMirror(${JSON.stringify(db)});
    await publishChanges(mirror, {
      exportDir: ${JSON.stringify(exportDir)},
      failpoint: (point, file) => {
        if (point === 'before-rename' && file.includes('/messages/')) process.kill(process.pid, 'SIGKILL');
      },
    });
    process.stderr.write('publication ended without reaching the failpoint\\n');
  `;
}

describe('SIGINT during a long Retry-After', () => {
  it('stops without waiting out the Retry-After, exit 130, prints an interrupted summary and records the run as interrupted', async () => {
    const ws = FakeWorkspace.generate({ seed: 7, conversations: 10 });
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    const dir = tempDir();
    const db = path.join(dir, 'mirror.sqlite');
    let s: Started | undefined;
    try {
      fake.injectFault({ kind: 'status', status: 429, retryAfter: '60', match: { path: /\/messages$/ }, times: Infinity });
      // The child's own limit (30 s) is half the Retry-After: ending at all proves it did not wait it out.
      s = start(['sync'], cliEnv(fake, dir, { CONVO_MIRROR_MAX_RETRIES: '3' }), 30_000);
      await waitFor(() => fake.requests.some((r) => r.status === 429), 10_000, 'the first 429');
      s.child.kill('SIGINT');
      const r = await s.done;
      expect(r.signal, r.stderr).toBeNull();
      expect(r.code, r.stderr).toBe(130);
      expect(r.stdout).toMatch(/run 1 \(workspace, incremental\) interrupted/);
      // A conversation stopped by the shutdown is not a failure.
      expect(r.stderr).not.toMatch(/^failed: /m);
      // No conversation was asked for twice: the shutdown ended every wait for its Retry-After.
      const messagePaths = fake.requests.filter((q) => /\/messages$/.test(q.path)).map((q) => q.path);
      expect(messagePaths.length).toBeGreaterThan(0);
      expect(new Set(messagePaths).size).toBe(messagePaths.length);
      expect(fake.requests.filter((q) => /\/messages$/.test(q.path)).every((q) => q.status === 429)).toBe(true);
      await withMirror(db, (m) => {
        expect(sqlValue<string>(m, `SELECT status FROM runs ORDER BY id DESC LIMIT 1`)).toBe('interrupted');
      });
      expect(fs.existsSync(`${db}.lock.json`)).toBe(false);
    } finally {
      s?.child.kill('SIGKILL');
      await fake.close();
    }
  });
});

describe('the API key never reaches stdout or stderr, even at trace level', () => {
  const SECRET = 'sk-live-7Qx93fA1c2ZZ-secret';

  /** Fails naming where the secret showed up. */
  function expectNoSecret(r: Ran, secret: string): void {
    expect(r.stdout.includes(secret), `API key printed on stdout:\n${r.stdout}`).toBe(false);
    expect(r.stderr.includes(secret), `API key printed on stderr:\n${r.stderr.split('\n').filter((l) => l.includes(secret)).join('\n')}`).toBe(false);
  }

  const injectRetries = (fake: FakeApi) => {
    fake.injectFault({ kind: 'drop', match: { path: '/v1/conversations' }, times: 1 });
    fake.injectFault({ kind: 'status', status: 503, match: { path: /\/messages$/ }, times: 2 });
  };

  it('during a run with retries (key from the env, then from --api-key), and on an auth failure', async () => {
    const ws = FakeWorkspace.generate({ seed: 21, conversations: 6 });
    const fake = await startFakeApi({ workspace: ws, apiKey: SECRET, accountId: ACCOUNT_ID });
    try {
      // 1. Key from the environment.
      injectRetries(fake);
      const dir1 = tempDir();
      const fromEnv = await run(['sync'], cliEnv(fake, dir1, { CONVO_MIRROR_API_KEY: SECRET, LOG_LEVEL: 'trace', CONVO_MIRROR_MAX_RETRIES: '3' }));
      expect(fromEnv.code, fromEnv.stderr).toBe(0);
      expect(fake.requests.filter((q) => q.status === 'dropped')).toHaveLength(1);
      expect(fake.requests.filter((q) => q.status === 503)).toHaveLength(2);
      expect(fake.requests.every((q) => q.apiKey === SECRET)).toBe(true); // the key was really sent
      expect(fromEnv.stderr).toContain('request failed, retrying'); // the retries were logged
      expectNoSecret(fromEnv, SECRET);
      // Nor in what it wrote to disk.
      for (const [rel, bytes] of [...snapshotFiles(dir1)]) expect(bytes.includes(SECRET), `API key written into ${rel}`).toBe(false);

      // 2. Key as a flag, not in the environment.
      fake.requests.length = 0;
      injectRetries(fake);
      const fromFlag = await run(
        ['sync', '--api-key', SECRET, '--log-level', 'trace'],
        cliEnv(fake, tempDir(), { CONVO_MIRROR_API_KEY: undefined, LOG_LEVEL: 'trace', CONVO_MIRROR_MAX_RETRIES: '3' }),
      );
      expect(fromFlag.code, fromFlag.stderr).toBe(0);
      expect(fake.requests.filter((q) => q.status === 'dropped')).toHaveLength(1);
      expect(fake.requests.filter((q) => q.status === 503)).toHaveLength(2);
      expect(fake.requests.every((q) => q.apiKey === SECRET)).toBe(true);
      expectNoSecret(fromFlag, SECRET);

      // 3. A rejected key at trace level: exit 2, the key it sent is not echoed.
      const WRONG = 'sk-live-wrong-Kp4402mm';
      const denied = await run(['sync'], cliEnv(fake, tempDir(), { CONVO_MIRROR_API_KEY: WRONG, LOG_LEVEL: 'trace' }));
      expect(denied.code, denied.stderr).toBe(2);
      expect(denied.stderr).toMatch(/authentication error: .*401.*CONVO_MIRROR_API_KEY/);
      expectNoSecret(denied, WRONG);
      expectNoSecret(denied, SECRET);
      const deniedFlag = await run(['sync', '--api-key', WRONG], cliEnv(fake, tempDir(), { CONVO_MIRROR_API_KEY: undefined, LOG_LEVEL: 'trace' }));
      expect(deniedFlag.code, deniedFlag.stderr).toBe(2);
      expectNoSecret(deniedFlag, WRONG);
    } finally {
      await fake.close();
    }
  });
});

describe('configuration mistakes exit 2 and say what to fix', () => {
  it('verify (and status) with a CONVO_MIRROR_DB that does not exist exit 2 naming the variable and create nothing', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.generate({ seed: 1, conversations: 1 }), apiKey: API_KEY, accountId: ACCOUNT_ID });
    try {
      const dir = tempDir();
      const missing = path.join(dir, 'absent', 'mirror.sqlite');
      const env = cliEnv(fake, dir, { CONVO_MIRROR_DB: missing });
      for (const cmd of ['verify', 'status']) {
        const r = await run([cmd], env, 10_000);
        expect(r.code, `${cmd}: ${r.stderr}`).toBe(2);
        expect(r.stderr).toContain('CONVO_MIRROR_DB');
        expect(r.stderr).toContain(missing);
        expect(fs.existsSync(missing), `${cmd} created ${missing}`).toBe(false);
        expect(fs.existsSync(`${missing}.lock`)).toBe(false);
        expect(fs.existsSync(path.dirname(missing)), `${cmd} created ${path.dirname(missing)}`).toBe(false);
      }
      expect(fake.requests).toHaveLength(0);
    } finally {
      await fake.close();
    }
  });

  it('a base URL with a wrong path makes sync exit 2 naming CONVO_MIRROR_BASE_URL and the 404, without retrying', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.generate({ seed: 2, conversations: 3 }), apiKey: API_KEY, accountId: ACCOUNT_ID });
    try {
      const r = await run(['sync'], cliEnv(fake, tempDir(), { CONVO_MIRROR_BASE_URL: `${fake.url}/nope`, CONVO_MIRROR_MAX_RETRIES: '3' }));
      expect(r.code, r.stderr).toBe(2);
      const last = r.stderr.trim().split('\n').at(-1)!;
      expect(last).toMatch(/^convo-mirror: configuration error: CONVO_MIRROR_BASE_URL: .*404/);
      expect(fake.requests.map((q) => `${q.path} ${q.status}`)).toEqual(['/nope/v1/conversations 404']);
    } finally {
      await fake.close();
    }
  });
});
