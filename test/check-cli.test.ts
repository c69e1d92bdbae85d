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
import net, { type AddressInfo } from 'node:net';
import path from 'node:path';
import { ApiClient } from '../src/api/client.js';
import { ConfigError, HttpError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { whyNotWritable } from '../src/writable.js';
import { generateKeyPair } from '../src/export/signing.js';
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

/** True when this kernel lets a socket bind an address no interface has (Linux net.ipv4.ip_nonlocal_bind). */
function nonLocalBind(): boolean {
  try {
    return fs.readFileSync('/proc/sys/net/ipv4/ip_nonlocal_bind', 'utf8').trim() !== '0';
  } catch {
    return false;
  }
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
    const r = await run(['check', '--json'], cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_CONCURRENCY: 'many' }));
    expect(r.code).toBe(2);
    const parsed = JSON.parse(r.stdout) as { ok: boolean; checks: { name: string; ok: boolean; detail: string }[] };
    expect(parsed).toMatchObject({ ok: false, checks: [{ name: 'config', ok: false }] });
    expect(parsed.checks[0]!.detail).toBe('CONVO_MIRROR_CONCURRENCY: must be a number (got "many")');
  });

  it('a missing key is the api line, and the rest is still checked; without --json too', async () => {
    const f = await fake();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_API_KEY: undefined });
    const r = await run(['check', '--no-queue', '--json'], env);
    expect(r.code).toBe(2);
    const parsed = JSON.parse(r.stdout) as { ok: boolean; checks: { name: string; ok: boolean; detail: string }[] };
    expect(parsed.checks.map((c) => [c.name, c.ok])).toEqual([['api', false], ['mirror', true], ['exports', true]]);
    expect(parsed.checks[0]!.detail).toMatch(/^CONVO_MIRROR_API_KEY: is required/);
    const text = await run(['check', '--no-queue'], env);
    expect(text.code).toBe(2);
    expect(text.stdout).toMatch(/^✗ api: CONVO_MIRROR_API_KEY: is required.*\n✓ mirror: .*\n✓ exports: .*\n$/);
    expect(f.requests).toHaveLength(0);
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

describe('check: everything else a run needs', () => {
  it('a signing key file that is missing: check fails naming CONVO_MIRROR_SIGNING_KEY_FILE and the file, and so does sync, both before any request', async () => {
    const f = await fake();
    const dir = tempDir();
    const missing = path.join(dir, 'keys', 'ledger.key');
    const env = cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_SIGNING_KEY_FILE: missing, LOG_LEVEL: 'silent' });
    const r = await run(['check', '--no-queue'], env);
    expect(r.code).toBe(2);
    expect(r.stdout).toContain(`✗ signing key: CONVO_MIRROR_SIGNING_KEY_FILE: the key file ${missing} is missing (no such file)\n`);
    // Every other line is still there.
    expect(r.stdout.trim().split('\n').map((l) => l.split(':')[0])).toEqual(['✓ api', '✓ messages', '✗ signing key', '✓ mirror', '✓ exports']);
    const before = f.requests.length;
    const sync = await run(['sync'], env);
    expect(sync.code).toBe(2);
    expect(sync.stderr).toContain(`configuration error: CONVO_MIRROR_SIGNING_KEY_FILE: the key file ${missing} is missing (no such file)`);
    expect(f.requests).toHaveLength(before);
  });

  it('the public key where the private one belongs: fails saying so; the private key passes with its key id; one readable by others passes with a warning (!), exit 0', async () => {
    const f = await fake();
    const dir = tempDir();
    const priv = path.join(dir, 'ledger.key');
    const pub = path.join(dir, 'ledger.pub');
    const { keyId } = generateKeyPair(priv, pub);
    const env = cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_SIGNING_KEY_FILE: pub });
    const wrong = await run(['check', '--no-queue'], env);
    expect(wrong.code).toBe(2);
    expect(wrong.stdout).toContain(`✗ signing key: CONVO_MIRROR_SIGNING_KEY_FILE: ${pub} holds a public key where the private key is expected: point CONVO_MIRROR_SIGNING_KEY_FILE at the private key (the .key file convo-mirror keygen wrote), not the .pub\n`);
    const right = await run(['check', '--no-queue'], { ...env, CONVO_MIRROR_SIGNING_KEY_FILE: priv });
    expect(right.code, right.stdout).toBe(0);
    expect(right.stdout).toContain(`✓ signing key: ${priv}: an Ed25519 private key, key id ${keyId} (CONVO_MIRROR_SIGNING_KEY_FILE)\n`);
    fs.chmodSync(priv, 0o644);
    const open = await run(['check', '--no-queue', '--json'], { ...env, CONVO_MIRROR_SIGNING_KEY_FILE: priv });
    expect(open.code, open.stdout).toBe(0);
    const parsed = JSON.parse(open.stdout) as { ok: boolean; checks: { name: string; ok: boolean; warning?: boolean; detail: string }[] };
    expect(parsed.ok).toBe(true);
    expect(parsed.checks.find((c) => c.name === 'signing key')).toEqual({
      name: 'signing key',
      ok: true,
      warning: true,
      detail: `${priv}: an Ed25519 private key, key id ${keyId} (CONVO_MIRROR_SIGNING_KEY_FILE); but it can be read or written by its group and others (mode 0644); chmod 600 it`,
    });
    const text = await run(['check', '--no-queue'], { ...env, CONVO_MIRROR_SIGNING_KEY_FILE: priv });
    expect(text.stdout).toMatch(/^! signing key: .*chmod 600 it$/m);
    const pem = fs.readFileSync(priv, 'utf8');
    for (const out of [wrong, right, open, text]) expect(out.stdout + out.stderr).not.toContain(pem.split('\n')[1]!);
  });

  it('a workspaces file that cannot be used is a line of its own, and the rest is still checked; a good one says how many workspaces it lists', async () => {
    const f = await fake();
    const dir = tempDir();
    const file = path.join(dir, 'workspaces.json');
    fs.writeFileSync(file, JSON.stringify([{ account_id: 'not-a-uuid', api_key_env: 'ACME_KEY' }]));
    const env = cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_API_KEY: undefined, CONVO_MIRROR_WORKSPACES: file, ACME_KEY: API_KEY });
    const bad = await run(['check', '--no-queue'], env);
    expect(bad.code).toBe(2);
    expect(bad.stdout.trim().split('\n')).toEqual([
      `✗ workspaces: CONVO_MIRROR_WORKSPACES: ${file}: [0].account_id: must be a UUID (spec 5: X-Account-Id is a UUID)`,
      `✓ mirror: ${path.join(dir, 'mirror.sqlite')} can be written (CONVO_MIRROR_DB)`,
      `✓ exports: ${path.join(dir, 'exports')} can be written (CONVO_MIRROR_EXPORT_DIR)`,
    ]);
    // The key variable the file names, unset: the same line, naming the variable.
    fs.writeFileSync(file, JSON.stringify([{ account_id: '3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d01', api_key_env: 'ACME_KEY' }]));
    const unset = await run(['check', '--no-queue'], { ...env, ACME_KEY: undefined });
    expect(unset.stdout).toMatch(/^✗ workspaces: ACME_KEY: is not set or empty: it must hold the API key of workspace 3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d01/m);
    expect(f.requests).toHaveLength(0);
    const good = await run(['check', '--no-queue'], env);
    expect(good.stdout.split('\n')[0]).toBe(`✓ workspaces: ${file} lists 1 workspace (CONVO_MIRROR_WORKSPACES)`);
    expect(good.stdout).toMatch(/^✓ api: /m);
  });

  it('an export directory that is the mirror\'s own directory fails naming CONVO_MIRROR_EXPORT_DIR (assertSafeExportDir), creating nothing', async () => {
    const f = await fake();
    const dir = tempDir();
    const r = await run(['check', '--no-queue'], cliEnv(f, dir, { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_EXPORT_DIR: dir }));
    expect(r.code).toBe(2);
    expect(r.stdout).toMatch(new RegExp(`^✗ exports: CONVO_MIRROR_EXPORT_DIR: the export directory ${dir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.* is the directory of the mirror database`, 'm'));
    expect(fs.readdirSync(dir)).toEqual([]);
  });

  it('--daemon: the HTTP port in use, free, 0, and an interface this machine lacks, each one line naming the setting; the port is released at once', async () => {
    const f = await fake();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_ACCOUNT_ID: undefined, CONVO_MIRROR_HTTP_HOST: '127.0.0.1' });
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const busy = (taken.address() as AddressInfo).port;
    try {
      const inUse = await run(['check', '--daemon', '--no-queue'], { ...env, CONVO_MIRROR_HTTP_PORT: String(busy) });
      expect(inUse.code).toBe(2);
      expect(inUse.stdout).toContain(`✗ http: CONVO_MIRROR_HTTP_PORT: 127.0.0.1:${busy} is already in use: choose another port (--http-port), or 0 for no HTTP server\n`);
    } finally {
      await new Promise<void>((resolve) => taken.close(() => resolve()));
    }
    const free = await closedPort();
    // The daemon's flags are check's too: the same command line, with check --daemon for daemon.
    const ok = await run(['check', '--daemon', '--no-queue', '--http-port', String(free)], env);
    expect(ok.code, ok.stdout).toBe(0);
    expect(ok.stdout).toContain(`✓ http: 127.0.0.1:${free} can be listened on (CONVO_MIRROR_HTTP_HOST, CONVO_MIRROR_HTTP_PORT)\n`);
    // Released: the port can be listened on again right away.
    const again = net.createServer();
    await new Promise<void>((resolve, reject) => again.once('error', reject).listen(free, '127.0.0.1', resolve));
    await new Promise<void>((resolve) => again.close(() => resolve()));
    const off = await run(['check', '--daemon', '--no-queue'], { ...env, CONVO_MIRROR_HTTP_PORT: '0' });
    expect(off.stdout).toContain('✓ http: no HTTP server (CONVO_MIRROR_HTTP_PORT=0)\n');
    // 192.0.2.1 (TEST-NET-1, RFC 5737) is no interface of this machine; a kernel told to bind
    // addresses it does not have (net.ipv4.ip_nonlocal_bind=1) would accept it, so not there.
    if (!nonLocalBind()) {
      const absent = await run(['check', '--daemon', '--no-queue'], { ...env, CONVO_MIRROR_HTTP_HOST: '192.0.2.1', CONVO_MIRROR_HTTP_PORT: String(free) });
      expect(absent.code).toBe(2);
      expect(absent.stdout).toContain('✗ http: CONVO_MIRROR_HTTP_HOST: cannot listen on 192.0.2.1: no such interface on this machine (EADDRNOTAVAIL)\n');
    }
    // Without --daemon, no http line: sync needs no port.
    expect((await run(['check', '--no-queue'], { ...env, CONVO_MIRROR_HTTP_PORT: String(busy) })).stdout).not.toContain('http:');
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
