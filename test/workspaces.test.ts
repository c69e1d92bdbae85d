/**
 * Several workspaces (issue 10; spec 1 and 5: a user may belong to several accounts, selected with
 * `X-Account-Id`): the account-id list and the workspaces file in config/, `sync` mirroring each
 * workspace into the one mirror (its own run, its own summary block, the worst exit code,
 * `--account`), one workspace's 401 failing only its own run, and one rate limiter per base URL +
 * key. Real HTTP to one fake serving several workspaces, real SQLite, the built CLI as a child.
 */
import { describe, it, expect, beforeAll, afterAll, afterEach } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { loadConfig, type ConfigFlags } from '../config/index.js';
import { ConfigError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { apiClientFromConfig, type ApiClient, type ApiConfig } from '../src/api/client.js';
import { RECOVERY_SHARE, RateLimiterPool, limiterKey } from '../src/api/rate-limit.js';
import { worstExit } from '../src/cli/exit.js';
import { API_KEY, cliEnv, mirrorEqualsFake, tempDir, testClock, withMirror } from './helpers.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { sqlAll } from './sql.js';

const A = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';
const B = '7a1c9e04-2b3d-4f5e-8a6b-1c2d3e4f5a6b';
const C = 'c2e4a6b8-0d1f-4a3c-9e5b-7d9f1b3d5f7a';
const KEY = 'sk-ws-SECRET-0a1b2c3d';
const OTHER_KEY = 'sk-ws-OTHER-SECRET-9f8e';
const BASE = { CONVO_MIRROR_BASE_URL: 'https://support.example.com/api', CONVO_MIRROR_API_KEY: KEY } as const;

/** The ConfigError loadConfig throws; fails the test if it throws none. */
function configError(env: NodeJS.ProcessEnv, flags: ConfigFlags = {}, opts?: { needsApi?: boolean }): ConfigError {
  try {
    loadConfig(env, flags, opts);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error('expected loadConfig to throw a ConfigError');
}

/** Writes `content` (JSON unless a string) to a workspaces file in a temp dir; returns its path. */
function workspacesFile(content: unknown): string {
  const file = path.join(tempDir(), 'workspaces.json');
  fs.writeFileSync(file, typeof content === 'string' ? content : JSON.stringify(content));
  return file;
}

describe('config: where the workspaces come from', () => {
  it('a command that makes no API call never reads the workspaces file (one not mounted where status runs does not stop it)', () => {
    const cfg = loadConfig({ CONVO_MIRROR_WORKSPACES: '/nonexistent/workspaces.json' }, {}, { needsApi: false });
    expect(cfg.workspaces).toHaveLength(1);
    expect(configError({ ...BASE, CONVO_MIRROR_WORKSPACES: '/nonexistent/workspaces.json' }).message).toMatch(/CONVO_MIRROR_WORKSPACES: .*cannot be read/);
  });

  it('the file and the account ids given in different places: the command line wins; given in the same place: refused', () => {
    const file = workspacesFile([{ account_id: C, api_key_env: 'KEY_C' }]);
    const env = { ...BASE, KEY_C: OTHER_KEY };
    expect(loadConfig({ ...env, CONVO_MIRROR_WORKSPACES: file }, { accountId: A }).workspaces.map((w) => w.accountId)).toEqual([A]);
    expect(loadConfig({ ...env, CONVO_MIRROR_ACCOUNT_ID: A }, { workspacesFile: file }).workspaces.map((w) => [w.accountId, w.keyVariable])).toEqual([[C, 'KEY_C']]);
    expect(configError({ ...env, CONVO_MIRROR_ACCOUNT_ID: A, CONVO_MIRROR_WORKSPACES: file }).message).toMatch(/CONVO_MIRROR_WORKSPACES: cannot be combined with CONVO_MIRROR_ACCOUNT_ID/);
    expect(configError(env, { accountId: A, workspacesFile: file }).message).toMatch(/--workspaces: cannot be combined with --account-id/);
  });
});

describe('config: the account-id list', () => {
  it('one UUID is one workspace, exactly as before', () => {
    const cfg = loadConfig({ ...BASE, CONVO_MIRROR_ACCOUNT_ID: A });
    expect(cfg.accountId).toBe(A);
    expect(cfg.workspaces).toEqual([{ accountId: A, baseUrl: 'https://support.example.com/api', apiKey: KEY, schedule: '*/15 * * * *', fullSchedule: '0 3 * * *' }]);
  });

  it('a comma-separated list is one workspace per UUID, each with the same key and base URL; accountId is the first', () => {
    const cfg = loadConfig({ ...BASE, CONVO_MIRROR_ACCOUNT_ID: `${A}, ${B}` });
    expect(cfg.workspaces.map((w) => [w.accountId, w.baseUrl, w.apiKey])).toEqual([
      [A, 'https://support.example.com/api', KEY],
      [B, 'https://support.example.com/api', KEY],
    ]);
    expect([cfg.accountId, cfg.apiKey, cfg.baseUrl]).toEqual([A, KEY, 'https://support.example.com/api']);
    expect(Object.isFrozen(cfg.workspaces) && Object.isFrozen(cfg.workspaces[0])).toBe(true);
  });

  it('refuses a UUID listed twice (case-insensitively) and names a malformed item', () => {
    const dup = configError({ ...BASE, CONVO_MIRROR_ACCOUNT_ID: `${A},${B},${A.toUpperCase()}` });
    expect(dup.variable).toBe('CONVO_MIRROR_ACCOUNT_ID');
    expect(dup.message).toContain('twice');
    const bad = configError({ ...BASE }, { accountId: `${A},nope` });
    expect(bad.variable).toBe('--account-id');
    expect(bad.message).toContain('item 2 of the list must be a UUID');
    expect(configError({ ...BASE, CONVO_MIRROR_ACCOUNT_ID: `${A},` }).message).toContain('item 2');
  });

  it('never serializes a key: JSON of the config shows [redacted]', () => {
    const cfg = loadConfig({ ...BASE, CONVO_MIRROR_ACCOUNT_ID: `${A},${B}` });
    const json = JSON.stringify(cfg.workspaces);
    expect(json).not.toContain(KEY);
    expect(json).toContain('[redacted]');
  });
});

describe('config: the workspaces file', () => {
  it('reads each key from the variable its entry names; base URL and schedules default to the settings', () => {
    const file = workspacesFile([
      { account_id: A, api_key_env: 'KEY_ONE' },
      { account_id: B, api_key_env: 'KEY_TWO', base_url: 'https://eu.example.com/api/', schedule: '*/5 * * * *', full_schedule: '30 2 * * *' },
    ]);
    const cfg = loadConfig({ CONVO_MIRROR_BASE_URL: 'https://support.example.com/api', CONVO_MIRROR_WORKSPACES: file, KEY_ONE: KEY, KEY_TWO: OTHER_KEY });
    expect(cfg.workspaces).toEqual([
      { accountId: A, baseUrl: 'https://support.example.com/api', apiKey: KEY, keyVariable: 'KEY_ONE', schedule: '*/15 * * * *', fullSchedule: '0 3 * * *' },
      { accountId: B, baseUrl: 'https://eu.example.com/api', apiKey: OTHER_KEY, keyVariable: 'KEY_TWO', schedule: '*/5 * * * *', fullSchedule: '30 2 * * *' },
    ]);
    // Existing callers see the first workspace; CONVO_MIRROR_API_KEY is not needed.
    expect([cfg.accountId, cfg.apiKey, cfg.workspacesFile]).toEqual([A, KEY, file]);
  });

  it('the example file parses', () => {
    const cfg = loadConfig({ CONVO_MIRROR_BASE_URL: 'https://x.example.com', CONVO_MIRROR_WORKSPACES: 'config/workspaces.example.json', ACME_SUPPORT_API_KEY: KEY, EU_SUPPORT_API_KEY: OTHER_KEY });
    expect(cfg.workspaces).toHaveLength(3);
  });

  it('a missing or empty key variable is one ConfigError naming the variable and the entry, never a key', () => {
    const file = workspacesFile([
      { account_id: A, api_key_env: 'KEY_ONE' },
      { account_id: B, api_key_env: 'KEY_TWO' },
    ]);
    for (const two of [undefined, '', '  ']) {
      const err = configError({ ...BASE, CONVO_MIRROR_WORKSPACES: file, KEY_ONE: KEY, ...(two === undefined ? {} : { KEY_TWO: two }) });
      expect(err.variable).toBe('KEY_TWO');
      expect(err.message).toContain(`workspace ${B} ([1] of ${file})`);
      expect(err.message).not.toContain(KEY);
      expect(err.message.split('\n')).toHaveLength(1);
    }
    // Commands that make no API call do not read the file, so they need no key.
    expect(loadConfig({ CONVO_MIRROR_WORKSPACES: file }, {}, { needsApi: false }).workspaces.map((w) => w.apiKey)).toEqual([undefined]);
    // A malformed key: named by its variable, not shown.
    const bad = configError({ ...BASE, CONVO_MIRROR_WORKSPACES: file, KEY_ONE: KEY, KEY_TWO: 'sk-\nSECRET' });
    expect(bad.variable).toBe('KEY_TWO');
    expect(bad.message).not.toContain('SECRET');
  });

  it.each([
    ['an unknown key (a key pasted into the file)', [{ account_id: A, api_key_env: 'K', api_key: 'sk-PASTED-SECRET' }], '[0]: Unrecognized key'],
    ['a bad account id', [{ account_id: A, api_key_env: 'K' }, { account_id: 'x', api_key_env: 'K' }], '[1].account_id: must be a UUID'],
    ['a key in api_key_env', [{ account_id: A, api_key_env: 'sk-PASTED-SECRET' }], '[0].api_key_env: must be the name of an environment variable'],
    ['a bad base URL', [{ account_id: A, api_key_env: 'K', base_url: 'ftp://x' }], '[0].base_url: must use http or https'],
    ['a bad schedule', [{ account_id: A, api_key_env: 'K', schedule: 'often' }], '[0].schedule: must be a cron expression'],
    ['a duplicate account', [{ account_id: A, api_key_env: 'K' }, { account_id: A.toUpperCase(), api_key_env: 'K' }], '[1].account_id: 3D6F0A52'],
    ['an empty list', [], 'must list at least one workspace'],
    ['an object', { account_id: A }, 'must be a JSON list of workspaces'],
    ['text that is not JSON', '[{"account_id": "sk-PASTED-SECRET",', 'is not valid JSON'],
  ])('refuses %s, naming the file and the entry, showing no value', (_what, content, expected) => {
    const file = workspacesFile(content);
    const err = configError({ ...BASE, CONVO_MIRROR_WORKSPACES: file, K: KEY });
    expect(err.variable).toBe('CONVO_MIRROR_WORKSPACES');
    expect(err.message).toContain(file);
    expect(err.message).toContain(expected);
    expect(err.message).not.toContain('SECRET');
  });

  it('refuses an unreadable file, an entry without base URL, and the file together with an account-id list', () => {
    expect(configError({ ...BASE }, { workspacesFile: '/nonexistent/ws.json' }).message).toContain('/nonexistent/ws.json: cannot be read (ENOENT)');
    const file = workspacesFile([{ account_id: A, api_key_env: 'K' }]);
    expect(configError({ CONVO_MIRROR_WORKSPACES: file, K: KEY }).message).toContain('[0]: has no base_url and CONVO_MIRROR_BASE_URL is not set');
    const both = configError({ ...BASE, CONVO_MIRROR_WORKSPACES: file, K: KEY, CONVO_MIRROR_ACCOUNT_ID: B });
    expect(both.variable).toBe('CONVO_MIRROR_WORKSPACES');
    expect(both.message).toContain('cannot be combined with CONVO_MIRROR_ACCOUNT_ID');
  });
});

describe('the fake serving several workspaces', () => {
  it('serves each workspace by X-Account-Id to its key: 401 for a key none has, 403 for a workspace of another key or none', async () => {
    const wsA = FakeWorkspace.generate({ seed: 5, conversations: 2 });
    const wsC = FakeWorkspace.generate({ seed: 6, conversations: 3 });
    const fake = await startFakeApi({ workspaces: { [A]: { workspace: wsA, apiKey: KEY }, [C]: { workspace: wsC, apiKey: OTHER_KEY } }, rateLimit: { rps: 2, headers: false } });
    try {
      const get = async (key: string, account?: string) => {
        const res = await fetch(`${fake.url}/v1/conversations?per_page=100`, { headers: { 'x-api-key': key, ...(account ? { 'x-account-id': account } : {}) } });
        return { status: res.status, ids: res.ok ? ((await res.json()) as { data: { id: string }[] }).data.map((c) => c.id) : [] };
      };
      expect(await get(KEY, A)).toEqual({ status: 200, ids: wsA.list().map((c) => c.id) });
      expect(await get(OTHER_KEY, C)).toEqual({ status: 200, ids: wsC.list().map((c) => c.id) });
      expect((await get('nobody', A)).status).toBe(401);
      expect((await get(KEY, C)).status).toBe(403);
      expect((await get(KEY)).status).toBe(403);
      // The rate window is per key: KEY's second request is its 2nd in the window, OTHER_KEY's too.
      expect((await get(KEY, A)).status).toBe(200);
      expect((await get(OTHER_KEY, C)).status).toBe(200);
      expect((await get(KEY, A)).status).toBe(429);
      expect(fake.workspace).toBe(wsA);
      await expect(startFakeApi({ workspace: wsA, apiKey: KEY, workspaces: { [A]: { workspace: wsA, apiKey: KEY } } })).rejects.toThrow(RangeError);
    } finally {
      await fake.close();
    }
  });
});

describe('worst exit code of several workspaces', () => {
  it('2 over 1 over 130 over 0', () => {
    expect(worstExit([])).toBe(0);
    expect(worstExit([0, 130, 0])).toBe(130);
    expect(worstExit([130, 1, 0])).toBe(1);
    expect(worstExit([1, 2, 130])).toBe(2);
  });
});

describe('one rate limiter per base URL + key', () => {
  const wsA = FakeWorkspace.generate({ seed: 1, conversations: 3 });
  const wsB = FakeWorkspace.generate({ seed: 2, conversations: 3 });
  const wsC = FakeWorkspace.generate({ seed: 3, conversations: 3 });
  let fake: FakeApi;
  const clients: ApiClient[] = [];
  beforeAll(async () => {
    fake = await startFakeApi({ workspaces: { [A]: { workspace: wsA, apiKey: KEY }, [B]: { workspace: wsB, apiKey: KEY }, [C]: { workspace: wsC, apiKey: OTHER_KEY } } });
  });
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await fake.close();
  });

  const configOf = (accountId: string, apiKey: string): ApiConfig => ({
    baseUrl: fake.url,
    apiKey,
    accountId,
    maxRps: 0,
    concurrency: 1,
    requestTimeoutMs: 5000,
    maxRetries: 2,
    maxResponseBytes: 1 << 20,
  });
  /** Reads the first list page (one request, plus its retries). */
  const firstPage = async (api: ApiClient) => {
    for await (const page of api.conversations()) return page;
    throw new Error('no page');
  };

  it('keys by origin + path and a SHA-256 of the key, never the key', () => {
    const k = limiterKey('http://127.0.0.1:9/api/', KEY);
    expect(k).not.toContain(KEY);
    expect(k.startsWith('http://127.0.0.1:9/api key-sha256:')).toBe(true);
    expect(limiterKey('http://127.0.0.1:9/api', KEY)).toBe(k);
    expect(limiterKey('http://127.0.0.1:9/api', OTHER_KEY)).not.toBe(k);
  });

  it("a 429 for one workspace slows the other workspace of its key (pause and learned rate), not a workspace of another key", async () => {
    const clock = testClock();
    const pool = new RateLimiterPool(0, clock);
    const [a, b, c] = [configOf(A, KEY), configOf(B, KEY), configOf(C, OTHER_KEY)].map((cfg) => apiClientFromConfig(cfg, { limiters: pool, clock }));
    clients.push(a!, b!, c!);
    expect(pool.limiterFor(fake.url, KEY)).toBe(pool.limiterFor(`${fake.url}/`, KEY));
    // Each client reaches its own workspace: the fake serves it by X-Account-Id.
    expect((await firstPage(a!)).data.map((x) => x.id)).toEqual(wsA.list().map((x) => x.id));
    await firstPage(a!);
    expect((await firstPage(b!)).data.map((x) => x.id)).toEqual(wsB.list().map((x) => x.id));
    expect((await firstPage(c!)).data.map((x) => x.id)).toEqual(wsC.list().map((x) => x.id));
    expect(pool.size).toBe(2);
    expect([a!.rateCap, b!.rateCap, c!.rateCap]).toEqual([0, 0, 0]);

    // Workspace A is answered 429 with Retry-After: 2, after 3 answered requests of its key in the last second.
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '2', match: { accountId: A } });
    await firstPage(a!);
    const learned = a!.rateCap;
    // The key's first 429 (slow start): 95 % of the 3 answered in the last second.
    expect(learned).toBeCloseTo(3 * RECOVERY_SHARE, 5);
    expect(b!.rateCap).toBe(learned); // the same limiter: learned rate included
    expect(c!.rateCap).toBe(0); // another key: untouched

    // B, never answered 429 itself, waits out A's pause (virtual time has not moved).
    let before = clock.sleeps.length;
    await firstPage(b!);
    const waitedB = clock.sleeps.slice(before);
    expect(waitedB.reduce((x, y) => x + y, 0)).toBeGreaterThanOrEqual(2000);
    // C, on another key, does not wait at all.
    before = clock.sleeps.length;
    await firstPage(c!);
    expect(clock.sleeps.slice(before)).toEqual([]);
    // The fake saw B's request after A's 429 and its retry; every 429 went to A.
    expect(fake.requests.filter((r) => r.status === 429).map((r) => r.accountId)).toEqual([A]);
  });

  it('without a pool, each client keeps a limiter of its own', async () => {
    const clock = testClock();
    const a = apiClientFromConfig(configOf(A, KEY), { clock });
    const b = apiClientFromConfig(configOf(B, KEY), { clock });
    clients.push(a, b);
    await firstPage(a);
    await firstPage(a);
    await firstPage(a);
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '2', match: { accountId: A } });
    await firstPage(a);
    expect(a.rateCap).toBeGreaterThan(0);
    expect(b.rateCap).toBe(0);
  });
});

describe('convo-mirror sync of several workspaces (CLI)', () => {
  let fake: FakeApi;
  let wsA: FakeWorkspace;
  let wsB: FakeWorkspace;
  beforeAll(async () => {
    assertBuilt();
    wsA = FakeWorkspace.generate({ seed: 21, conversations: 12 });
    wsB = FakeWorkspace.generate({ seed: 22, conversations: 9 });
    fake = await startFakeApi({ workspaces: { [A]: { workspace: wsA, apiKey: API_KEY }, [B]: { workspace: wsB, apiKey: API_KEY } } });
  });
  afterAll(async () => fake.close());
  afterEach(killLeftovers);

  /** The runs recorded in the mirror of `dir`: account and status, in order. */
  const runsOf = (dir: string) =>
    withMirror(path.join(dir, 'mirror.sqlite'), (m) => sqlAll<{ account_id: string; status: string }>(m, 'SELECT account_id, status FROM runs ORDER BY id'));

  it('mirrors two workspaces of one key into one mirror, each its own run and summary block; exit 0', async () => {
    const dir = tempDir();
    const r = await run(['sync'], cliEnv(fake, dir, { CONVO_MIRROR_ACCOUNT_ID: `${A},${B}` }), 60_000);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^account ${A}: run 1 \\(workspace, incremental\\) succeeded`, 'm'));
    expect(r.stdout).toMatch(new RegExp(`^account ${B}: run 2 \\(workspace, incremental\\) succeeded`, 'm'));
    expect(r.stdout + r.stderr).not.toContain(API_KEY);
    await withMirror(path.join(dir, 'mirror.sqlite'), (m) => {
      for (const [id, ws] of [[A, wsA], [B, wsB]] as const) {
        const eq = mirrorEqualsFake(m, ws, id);
        expect(eq.ok, eq.detail).toBe(true);
      }
    });
    expect(await runsOf(dir)).toEqual([
      { account_id: A, status: 'succeeded' },
      { account_id: B, status: 'succeeded' },
    ]);
    // The exports hold both accounts, side by side.
    expect(fs.readdirSync(path.join(dir, 'exports', 'messages')).sort()).toEqual([`account=${A}`, `account=${B}`].sort());
  });

  it('one workspace answered 401 ends at first contact (no run of its own); the other is mirrored; exit 2', async () => {
    const dir = tempDir();
    const file = path.join(dir, 'workspaces.json');
    // The failing one first: the other still goes on.
    fs.writeFileSync(file, JSON.stringify([{ account_id: B, api_key_env: 'KEY_B' }, { account_id: A, api_key_env: 'KEY_A' }]));
    const env = cliEnv(fake, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_API_KEY: undefined, CONVO_MIRROR_WORKSPACES: file, KEY_A: API_KEY, KEY_B: 'revoked-key-7' });
    const r = await run(['sync'], env, 60_000);
    expect(r.code, r.stderr).toBe(2);
    // B's key is refused by its first request: no run is recorded for it, nothing published.
    expect(r.stdout).not.toContain(`account ${B}`);
    expect(r.stdout).toMatch(new RegExp(`^account ${A}: run 1 \\(workspace, incremental\\) succeeded`, 'm'));
    expect(r.stderr).toMatch(new RegExp(`^convo-mirror: account ${B}: authentication error: `, 'm'));
    // The key came from KEY_B, not CONVO_MIRROR_API_KEY: the message says so.
    const authLine = r.stderr.split('\n').find((l) => l.includes('authentication error'))!;
    expect(authLine).toContain("KEY_B (this workspace's api_key_env)");
    expect(authLine).not.toContain('CONVO_MIRROR_API_KEY');
    expect(r.stderr + r.stdout).not.toContain('revoked-key-7');
    expect(await runsOf(dir)).toEqual([{ account_id: A, status: 'succeeded' }]);
    await withMirror(path.join(dir, 'mirror.sqlite'), (m) => expect(mirrorEqualsFake(m, wsA, A).ok).toBe(true));
    // --json: one list, one entry per workspace.
    const j = await run(['sync', '--json'], env, 60_000);
    expect(j.code).toBe(2);
    const list = JSON.parse(j.stdout) as { account_id: string; exit_code: number; summary: { status: string } | null; error: string | null }[];
    expect(list.map((o) => [o.account_id, o.exit_code, o.summary?.status ?? null])).toEqual([
      [B, 2, null],
      [A, 0, 'succeeded'],
    ]);
    expect(list[0]!.error).toContain('authentication error');
  });

  it('--account narrows to the workspaces it names; an id not configured is exit 2 naming it', async () => {
    const dir = tempDir();
    const env = cliEnv(fake, dir, { CONVO_MIRROR_ACCOUNT_ID: `${A},${B}` });
    const before = fake.requests.length;
    const r = await run(['sync', '--account', B], env, 60_000);
    expect(r.code, r.stderr).toBe(0);
    // One workspace: today's output, unlabelled.
    expect(r.stdout).toMatch(/^run 1 \(workspace, incremental\) succeeded/);
    expect(new Set(fake.requests.slice(before).map((q) => q.accountId))).toEqual(new Set([B]));
    expect(await runsOf(dir)).toEqual([{ account_id: B, status: 'succeeded' }]);

    const unknown = await run(['sync', '--account', A, '--account', C], env);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr.trim().split('\n')).toEqual([expect.stringContaining(`--account: "${C}" is not a configured workspace`)]);
  });

  it('a workspaces file naming an unset key variable: exit 2, one line naming it, before any request', async () => {
    const dir = tempDir();
    const file = path.join(dir, 'workspaces.json');
    fs.writeFileSync(file, JSON.stringify([{ account_id: A, api_key_env: 'KEY_A' }, { account_id: B, api_key_env: 'KEY_MISSING' }]));
    const before = fake.requests.length;
    const r = await run(['sync', '--workspaces', file], cliEnv(fake, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, KEY_A: API_KEY }));
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain('KEY_MISSING: is not set or empty');
    expect(r.stderr).toContain(B);
    expect(fake.requests.length).toBe(before);
  });
  it("the daemon's --account naming a workspace that is not configured: exit 2, one line naming it, before any request or file", async () => {
    const dir = tempDir();
    const before = fake.requests.length;
    const r = await run(['daemon', '--account', C], cliEnv(fake, dir, { CONVO_MIRROR_ACCOUNT_ID: `${A},${B}` }));
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain(`--account: "${C}" is not a configured workspace (configured: ${A}, ${B})`);
    expect(fake.requests.length).toBe(before);
    expect(fs.existsSync(path.join(dir, 'mirror.sqlite'))).toBe(false);
  });
});
