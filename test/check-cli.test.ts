/**
 * `convo-mirror check` and the fail-fast start of `sync`, as a user meets them: the built CLI in a
 * child process against the fake API in this process, a closed port, https against the fake's plain
 * HTTP, a wrong key, and paths that cannot be written (CI runs as root, so under a regular file and
 * under /proc, never chmod). Asserts on exit codes, the setting named, and the absence of the key,
 * stack frames and library error codes in what the user reads; what was requested comes from the
 * fake's request log, never from elapsed time. Also the client's rule behind it: only a failure
 * before the first answer is a configuration error; after it, the same failure is a transient.
 */
import { describe, it, expect, beforeAll, afterEach, afterAll } from 'vitest';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { ApiClient } from '../src/api/client.js';
import { ConfigError, HttpError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { whyNotWritable } from '../src/writable.js';
import { firstContactProblem } from '../src/api/first-contact.js';
import { API_KEY, cliEnv, tempDir as makeTempDir } from './helpers.js';
import { assertBuilt, closedPort, killLeftovers, run } from './children.js';

const dirs: string[] = [];
const fakes: FakeApi[] = [];
function tempDir(): string {
  const d = makeTempDir('convo-mirror-check-');
  dirs.push(d);
  return d;
}
async function fake(): Promise<FakeApi> {
  // No account id: the key's own workspace.
  const f = await startFakeApi({ workspace: FakeWorkspace.generate({ seed: 5, conversations: 12 }), apiKey: API_KEY });
  fakes.push(f);
  return f;
}
/** What the user reads must hold no key, no stack frame and no library error code. */
function expectClean(text: string): void {
  expect(text).not.toContain(API_KEY);
  expect(text).not.toMatch(/^\s+at /m);
  expect(text).not.toMatch(/UND_ERR|ERR_SSL|0A00010B|ECONNREFUSED|ENOTFOUND/);
}

beforeAll(assertBuilt);
afterEach(killLeftovers);
afterAll(async () => {
  await Promise.all(fakes.splice(0).map((f) => f.close()));
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('convo-mirror check', () => {
  it('passes against the fake with two API requests, prints a line per check, and creates nothing', async () => {
    const f = await fake();
    const dir = tempDir();
    const env = cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined });
    const r = await run(['check', '--no-queue'], env);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines.map((l) => l.split(':')[0])).toEqual(['✓ api', '✓ messages', '✓ mirror', '✓ exports']);
    expect(lines[0]).toContain('12 conversations');
    expect(f.requests.map((q) => q.path.replace(/\/conversations\/[^/]+\//, '/conversations/:id/'))).toEqual(['/v1/conversations', '/v1/conversations/:id/messages']);
    expect(fs.readdirSync(dir)).toEqual([]);
    const json = await run(['check', '--no-queue', '--json'], env);
    expect(json.code).toBe(0);
    const parsed = JSON.parse(json.stdout) as { ok: boolean; checks: { name: string; ok: boolean }[] };
    expect(parsed.ok).toBe(true);
    expect(parsed.checks.map((c) => c.name)).toEqual(['api', 'messages', 'mirror', 'exports']);
    expectClean(r.stdout + r.stderr + json.stdout + json.stderr);
  });

  it('a wrong key: exit 2, naming CONVO_MIRROR_API_KEY, after one request, the key never shown', async () => {
    const f = await fake();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_API_KEY: 'wrong-key-0123456789' });
    const r = await run(['check', '--no-queue'], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toMatch(/^✗ api: .*answered 401.*CONVO_MIRROR_API_KEY/m);
    expect(f.requests).toHaveLength(1);
    expect(r.stdout + r.stderr).not.toContain('wrong-key-0123456789');
    expectClean(r.stdout + r.stderr);
  });

  it('nothing listening, and https against plain HTTP: exit 2, naming CONVO_MIRROR_BASE_URL, the host and port, and what was found', async () => {
    const port = await closedPort();
    const f = await fake();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_BASE_URL: `http://127.0.0.1:${port}` });
    const refused = await run(['check', '--no-queue'], env);
    expect(refused.code).toBe(2);
    expect(refused.stdout).toContain(`✗ api: CONVO_MIRROR_BASE_URL: http://127.0.0.1:${port} does not answer: nothing is listening on 127.0.0.1 port ${port}`);
    const tls = await run(['check', '--no-queue'], { ...env, CONVO_MIRROR_BASE_URL: f.url.replace('http://', 'https://') });
    expect(tls.code).toBe(2);
    expect(tls.stdout).toMatch(/✗ api: CONVO_MIRROR_BASE_URL: https:\/\/127\.0\.0\.1:\d+ does not answer: the URL says https:\/\/ but the server on 127\.0\.0\.1 port \d+ speaks plain HTTP/);
    expect(f.requests).toHaveLength(0);
    expectClean(refused.stdout + refused.stderr + tls.stdout + tls.stderr);
  });

  it('a redirect at first contact (http:// sent to https://): exit 2, naming the setting and where it points, never its query', async () => {
    const f = await fake();
    const srv = http.createServer((_req, res) => res.writeHead(301, { location: 'https://api.test:8443/v1/conversations?token=s3cret' }).end());
    await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
    try {
      const port = (srv.address() as AddressInfo).port;
      const r = await run(['check', '--no-queue'], cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_BASE_URL: `http://127.0.0.1:${port}` }));
      expect(r.code).toBe(2);
      expect(r.stdout).toContain(`✗ api: CONVO_MIRROR_BASE_URL: http://127.0.0.1:${port} answers with a 301 redirect to https://api.test:8443: set the base URL to where the API answers`);
      expect(r.stdout + r.stderr).not.toContain('s3cret');
    } finally {
      await new Promise<void>((resolve) => srv.close(() => resolve()));
    }
  });

  it('paths that cannot be written: exit 2, naming the variable, the path and the reason, and creating nothing', async () => {
    const f = await fake();
    const dir = tempDir();
    const file = path.join(dir, 'a-file');
    fs.writeFileSync(file, 'x');
    const env = cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_DB: path.join(file, 'mirror.sqlite'), CONVO_MIRROR_EXPORT_DIR: '/proc/convo-mirror-test/exports' });
    const r = await run(['check', '--no-queue'], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toContain(`✗ mirror: CONVO_MIRROR_DB: cannot write ${path.join(file, 'mirror.sqlite')}: ${file} is not a directory`);
    expect(r.stdout).toMatch(/✗ exports: CONVO_MIRROR_EXPORT_DIR: cannot write \/proc\/convo-mirror-test\/exports: nothing can be created in \/proc \(/);
    expect(r.stdout).toMatch(/^✓ api/m);
    expect(fs.readdirSync(dir)).toEqual(['a-file']);
    expectClean(r.stdout + r.stderr);
  });

  it('--json with a configuration that cannot be read still prints JSON: a failed config check, exit 2', async () => {
    const f = await fake();
    const r = await run(['check', '--json'], cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_API_KEY: undefined }));
    expect(r.code).toBe(2);
    const parsed = JSON.parse(r.stdout) as { ok: boolean; checks: { name: string; ok: boolean; detail: string }[] };
    expect(parsed).toMatchObject({ ok: false, checks: [{ name: 'config', ok: false }] });
    expect(parsed.checks[0]!.detail).toMatch(/^CONVO_MIRROR_API_KEY: is required/);
  });

  it('Redis that does not answer fails the check (exit 2, naming REDIS_URL); --no-queue skips it', async () => {
    const f = await fake();
    const port = await closedPort();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, REDIS_URL: `redis://127.0.0.1:${port}` });
    const r = await run(['check'], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toContain(`✗ redis: REDIS_URL: cannot reach Redis at redis://127.0.0.1:${port}/0: connection refused; start Redis there or set REDIS_URL`);
    expect((await run(['check', '--no-queue'], env)).code).toBe(0);
  });
});

describe('sync fails fast at first contact', () => {
  it('nothing listening: one line naming CONVO_MIRROR_BASE_URL, exit 2, no summary of zeros; an unusable mirror path: one line naming CONVO_MIRROR_DB', async () => {
    const port = await closedPort();
    const f = await fake();
    const dir = tempDir();
    const env = cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_BASE_URL: `http://127.0.0.1:${port}`, LOG_LEVEL: 'silent' });
    const r = await run(['sync'], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(`convo-mirror: configuration error: CONVO_MIRROR_BASE_URL: http://127.0.0.1:${port} does not answer: nothing is listening on 127.0.0.1 port ${port} (connection refused)\n`);
    const bad = await run(['sync', '--db', '/proc/convo-mirror-test/mirror.sqlite'], { ...env, CONVO_MIRROR_BASE_URL: f.url });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^convo-mirror: configuration error: CONVO_MIRROR_DB: cannot write \/proc\/convo-mirror-test\/mirror\.sqlite: nothing can be created in \/proc \(.+\)\n$/);
    expect(f.requests).toHaveLength(0);
  });
});

describe('first contact (ApiClient failFast)', () => {
  it('a refused connection is a ConfigError with failFast before any answer, and a retryable HttpError without failFast', async () => {
    const port = await closedPort();
    const opts = { apiKey: API_KEY, maxRps: 0, maxRetries: 0 };
    const early = new ApiClient({ ...opts, baseUrl: `http://127.0.0.1:${port}`, failFast: true });
    const plain = new ApiClient({ ...opts, baseUrl: `http://127.0.0.1:${port}` });
    try {
      await expect(early.getJson('/v1/conversations?page=1&per_page=100')).rejects.toBeInstanceOf(ConfigError);
      const e = await plain.getJson('/v1/conversations?page=1&per_page=100').catch((err: unknown) => err);
      expect(e).toBeInstanceOf(HttpError);
      expect((e as HttpError).retryable).toBe(true);
    } finally {
      await Promise.all([early.close(), plain.close()]);
    }
  });

  it('the same client keeps a refused connection after its first answer as a retryable HttpError', async () => {
    const f = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY });
    const api = new ApiClient({ apiKey: API_KEY, maxRps: 0, maxRetries: 0, baseUrl: f.url, failFast: true, connections: 1 });
    try {
      await api.getJson('/v1/conversations?page=1&per_page=100');
      await f.close();
      const e = await api.getJson('/v1/conversations?page=1&per_page=100').catch((err: unknown) => err);
      expect(e).toBeInstanceOf(HttpError);
      expect((e as HttpError).retryable).toBe(true);
    } finally {
      await api.close();
    }
  });
});

describe('what first contact may call a wrong setting', () => {
  it('refused, no such host, https against HTTP, untrusted certificate: yes; a name server or route not there yet, a reset, a timeout: no (retried)', () => {
    const at = (code: string, url = 'http://api.test:8080') => firstContactProblem(url, Object.assign(new Error(code), { code }));
    expect(at('ECONNREFUSED')).toBe('nothing is listening on api.test port 8080 (connection refused)');
    expect(at('ENOTFOUND')).toBe('no such host: api.test');
    expect(at('ERR_SSL_WRONG_VERSION_NUMBER', 'https://api.test')).toMatch(/speaks plain HTTP/);
    expect(at('DEPTH_ZERO_SELF_SIGNED_CERT', 'https://api.test')).toMatch(/not trusted/);
    for (const code of ['EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET', 'UND_ERR_SOCKET', 'UND_ERR_CONNECT_TIMEOUT']) expect(at(code), code).toBeUndefined();
  });
});

describe('whyNotWritable', () => {
  it('says why in words, and is undefined for a writable new file, an existing file and a directory', () => {
    const dir = tempDir();
    const file = path.join(dir, 'f');
    fs.writeFileSync(file, 'x');
    expect(whyNotWritable(path.join(dir, 'new', 'deeper', 'm.sqlite'), 'file')).toBeUndefined();
    expect(whyNotWritable(file, 'file')).toBeUndefined();
    expect(whyNotWritable(dir, 'dir')).toBeUndefined();
    expect(whyNotWritable(dir, 'file')).toBe('is a directory');
    expect(whyNotWritable(path.join(file, 'x', 'y'), 'dir')).toBe(`${file} is not a directory`);
    expect(whyNotWritable('/proc/convo-mirror-test/x', 'dir')).toMatch(/^nothing can be created in \/proc \(/);
    // A symbolic link to nothing: SQLite and mkdir would fail on it later.
    fs.symlinkSync(path.join(dir, 'missing', 'x'), path.join(dir, 'dangling'));
    expect(whyNotWritable(path.join(dir, 'dangling'), 'dir')).toBe(`${path.join(dir, 'dangling')} is a symbolic link to a missing target`);
    expect(whyNotWritable(path.join(dir, 'dangling'), 'file')).toMatch(/symbolic link to a missing target/);
    fs.unlinkSync(path.join(dir, 'dangling'));
    // The probe files it made are gone: only what the test wrote is left.
    expect(fs.readdirSync(dir)).toEqual(['f']);
  });
});
