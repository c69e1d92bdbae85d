/**
 * The order of a daemon's start, as its log shows it and its HTTP server answers, with the real
 * daemon (`node dist/src/cli/index.js daemon`) and the test run's Redis:
 *
 * - the server listens once Redis and the mirror are checked, before the workspaces are:
 *   `http server listening on …`, `checking the workspaces`, then `daemon ready`; meanwhile
 *   `/healthz` answers 200 and `/readyz` 503 naming what the daemon waits for (`daemon: starting:
 *   checking the workspaces`, `api: account …: not checked yet`), and 200 from `daemon ready` on;
 * - a daemon that exits 2 at start (its only workspace refuses its key) closes the server first:
 *   `http server closed` is logged before the one-line error, and nothing listens when it has exited.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import net from 'node:net';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, closedPort, killLeftovers, start, waitFor, within } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { NEVER } from './daemon-fixtures.js';

const prefixes = prefixSequence('daemon-startup');
const dirs: string[] = [];
const fakes: FakeApi[] = [];

beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
});
afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

async function setUp(extra: Record<string, string> = {}): Promise<{ fake: FakeApi; env: NodeJS.ProcessEnv; port: number; base: string }> {
  const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([2]), apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(fake);
  const dir = tempDir('convo-mirror-daemon-startup-');
  dirs.push(dir);
  const port = await closedPort();
  const env = cliEnv(fake, dir, {
    REDIS_URL: redisUrl(),
    CONVO_MIRROR_QUEUE_PREFIX: prefixes.next(),
    CONVO_MIRROR_SCHEDULE: NEVER,
    CONVO_MIRROR_FULL_SCHEDULE: NEVER,
    CONVO_MIRROR_HTTP_PORT: String(port),
    CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
    ...extra,
  });
  return { fake, env, port, base: `http://127.0.0.1:${port}` };
}

/** The messages of the daemon's JSON log lines, in order. */
const messages = (stderr: string) =>
  stderr
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => (JSON.parse(l) as { msg: string }).msg);

/** Whether something accepts connections on 127.0.0.1:`port`. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

async function get(url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(5_000) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

describe('the HTTP server during start-up', () => {
  it('listens before the workspaces are checked: /healthz 200, /readyz 503 naming what the daemon waits for, 200 from "daemon ready" on', async () => {
    const { fake, env, port, base } = await setUp();
    // The start-up check (page 1 of the list) is held until the test has seen the phase.
    let release!: () => void;
    fake.injectFault({ kind: 'hold', until: new Promise<void>((r) => (release = r)), match: { path: '/v1/conversations' }, times: 1 });
    const d = start(['daemon'], env, 30_000);
    await waitFor(() => d.stderr.includes('"msg":"checking the workspaces"') || d.child.exitCode !== null, 15_000, 'the workspace check to begin');
    expect((await get(`${base}/healthz`)).status).toBe(200);
    const waiting = await get(`${base}/readyz`);
    expect(waiting.status).toBe(503);
    expect(waiting.body['checks']).toMatchObject({ daemon: 'starting: checking the workspaces', api: `account ${ACCOUNT_ID}: not checked yet`, redis: 'ok', mirror: 'ok' });
    expect(d.stderr).not.toContain('daemon ready');
    release();

    await waitFor(() => d.stderr.includes('"msg":"daemon ready"') || d.child.exitCode !== null, 15_000, 'the daemon to be ready');
    expect(await get(`${base}/readyz`)).toEqual({ status: 200, body: { status: 'ready', checks: { redis: 'ok', mirror: 'ok', api: 'ok', daemon: 'ok' } } });
    d.child.kill('SIGTERM');
    const ran = await within(d.done, 15_000, 'the daemon to exit');
    expect(ran.code, ran.stderr.slice(-2000)).toBe(0);
    const order = messages(ran.stderr).filter((m) => /^http server|^checking the workspaces$|^daemon ready$|^shutting down|^daemon stopped$|^exiting$/.test(m));
    expect(order).toEqual([
      `http server listening on http://127.0.0.1:${port}`,
      'checking the workspaces',
      'daemon ready',
      'shutting down: no new jobs; waiting for running ones',
      'http server closed',
      'daemon stopped',
      'exiting',
    ]);
    expect(await listening(port)).toBe(false);
  });

  it('a daemon that exits 2 at start (its only key refused) closes the server before its one-line error; nothing listens afterwards', async () => {
    const { env, port } = await setUp({ CONVO_MIRROR_API_KEY: 'wrong-key-0000' });
    const d = start(['daemon'], env, 30_000);
    const ran = await within(d.done, 20_000, 'the daemon to exit');
    expect(ran.code, ran.stderr).toBe(2);
    expect(messages(ran.stderr)).toEqual([
      `http server listening on http://127.0.0.1:${port}`,
      'checking the workspaces',
      'workspace check failed: its configuration or key is refused; its jobs will fail until that is fixed',
      'http server closed',
    ]);
    const lines = ran.stderr.trim().split('\n');
    expect(lines.at(-1), 'the last line: the one-line error').toMatch(/^convo-mirror: authentication error: .*CONVO_MIRROR_API_KEY/);
    expect(ran.stderr).not.toContain('daemon ready');
    expect(ran.stderr).not.toContain('wrong-key-0000');
    expect(await listening(port)).toBe(false);
  });
});
