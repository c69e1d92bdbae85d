/**
 * Settings given but ignored in the configuration chosen (config/ignored.ts): which, and why, as a
 * unit; then as the user meets them: `check` warns once on stderr, the daemon logs one warn line at
 * start, `config` shows the reason in its listing; never a value, and nothing for a setting that is
 * used or only defaulted.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { ignoredSettings, ignoredWarning } from '../config/ignored.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir as makeTempDir } from './helpers.js';
import { assertBuilt, closedPort, killLeftovers, run, startDaemon, within } from './children.js';
import { NEVER } from './daemon-fixtures.js';

const ADMIN = 'admin-password-never-shown';
const WEBHOOK = 'whsec_' + Buffer.alloc(24, 7).toString('base64');

const dirs: string[] = [];
const fakes: FakeApi[] = [];
function tempDir(): string {
  const d = makeTempDir('convo-mirror-ignored-');
  dirs.push(d);
  return d;
}
async function fake(): Promise<FakeApi> {
  const f = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY, accountId: ACCOUNT_ID });
  fakes.push(f);
  return f;
}

beforeAll(assertBuilt);
afterEach(killLeftovers);
afterAll(async () => {
  await Promise.all(fakes.splice(0).map((f) => f.close()));
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('ignoredSettings', () => {
  const lines = (env: NodeJS.ProcessEnv, flags = {}) => ignoredSettings(env, flags).map(ignoredWarning);

  it('the admin password with the local scheduler, named as given (variable or flag)', () => {
    expect(lines({ CONVO_MIRROR_ADMIN_PASSWORD: ADMIN, CONVO_MIRROR_SCHEDULER: 'local' })).toEqual([
      'CONVO_MIRROR_ADMIN_PASSWORD is set but ignored: with CONVO_MIRROR_SCHEDULER=local there is no queue dashboard, which needs the bullmq scheduler',
    ]);
    expect(lines({}, { adminPassword: ADMIN, scheduler: 'local' })).toEqual([
      '--admin-password is set but ignored: with --scheduler local there is no queue dashboard, which needs the bullmq scheduler',
    ]);
    // Used: BullMQ mode with an HTTP server.
    expect(lines({ CONVO_MIRROR_ADMIN_PASSWORD: ADMIN })).toEqual([]);
  });

  it('without an HTTP server: the webhook secret, the ID pointers, the admin password and the host; the job lock with the local scheduler', () => {
    expect(
      lines({
        CONVO_MIRROR_HTTP_PORT: '0',
        CONVO_MIRROR_HTTP_HOST: '0.0.0.0',
        CONVO_MIRROR_WEBHOOK_SECRET: WEBHOOK,
        CONVO_MIRROR_WEBHOOK_ID_POINTERS: '/id',
        CONVO_MIRROR_ADMIN_PASSWORD: ADMIN,
      }),
    ).toEqual([
      'CONVO_MIRROR_ADMIN_PASSWORD is set but ignored: with CONVO_MIRROR_HTTP_PORT=0 there is no HTTP server, so no queue dashboard',
      'CONVO_MIRROR_WEBHOOK_SECRET is set but ignored: with CONVO_MIRROR_HTTP_PORT=0 there is no HTTP server, so no webhook route',
      'CONVO_MIRROR_WEBHOOK_ID_POINTERS is set but ignored: with CONVO_MIRROR_HTTP_PORT=0 there is no HTTP server, so no webhook route',
      'CONVO_MIRROR_HTTP_HOST is set but ignored: with CONVO_MIRROR_HTTP_PORT=0 there is no HTTP server',
    ]);
    expect(lines({ CONVO_MIRROR_WEBHOOK_ID_POINTERS: '/id' })).toEqual([
      'CONVO_MIRROR_WEBHOOK_ID_POINTERS is set but ignored: the webhook route exists only with CONVO_MIRROR_WEBHOOK_SECRET, which is not set',
    ]);
    expect(lines({ CONVO_MIRROR_JOB_LOCK_MS: '5000', CONVO_MIRROR_SCHEDULER: 'local' })).toEqual([
      'CONVO_MIRROR_JOB_LOCK_MS is set but ignored: with CONVO_MIRROR_SCHEDULER=local jobs take no lock (the lock is BullMQ\'s, in Redis)',
    ]);
    // REDIS_URL and the queue prefix: status still reads the queue in Redis, so they are not ignored.
    expect(lines({ REDIS_URL: 'redis://h:6379/1', CONVO_MIRROR_QUEUE_PREFIX: 'p', CONVO_MIRROR_SCHEDULER: 'local' })).toEqual([]);
    // A malformed value is not judged here (loading the configuration names it).
    expect(lines({ CONVO_MIRROR_ADMIN_PASSWORD: 'short', CONVO_MIRROR_SCHEDULER: 'local' })).toEqual([]);
  });

  it('the workspaces: the key variable a workspaces file does not name, and account ids the command line overrides', () => {
    const dir = tempDir();
    const file = path.join(dir, 'workspaces.json');
    fs.writeFileSync(file, JSON.stringify([{ account_id: ACCOUNT_ID, api_key_env: 'ACME_KEY' }]));
    expect(lines({ CONVO_MIRROR_API_KEY: API_KEY, CONVO_MIRROR_WORKSPACES: file })).toEqual([
      "CONVO_MIRROR_API_KEY is set but ignored: with a workspaces file (CONVO_MIRROR_WORKSPACES) each workspace's key comes from the variable its api_key_env names",
    ]);
    fs.writeFileSync(file, JSON.stringify([{ account_id: ACCOUNT_ID, api_key_env: 'CONVO_MIRROR_API_KEY' }]));
    expect(lines({ CONVO_MIRROR_API_KEY: API_KEY, CONVO_MIRROR_WORKSPACES: file })).toEqual([]);
    expect(lines({ CONVO_MIRROR_ACCOUNT_ID: ACCOUNT_ID }, { workspacesFile: file })).toEqual(['CONVO_MIRROR_ACCOUNT_ID is set but ignored: --workspaces gives the workspaces']);
    expect(lines({ CONVO_MIRROR_WORKSPACES: file }, { accountId: ACCOUNT_ID })).toEqual(['CONVO_MIRROR_WORKSPACES is set but ignored: --account-id gives the workspaces']);
  });
});

describe('the warning as the user meets it', () => {
  it('check: once on stderr, naming the setting, never its value; the checks themselves unchanged', async () => {
    const f = await fake();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_SCHEDULER: 'local', CONVO_MIRROR_ADMIN_PASSWORD: ADMIN });
    const r = await run(['check', '--daemon'], env);
    expect(r.code, r.stdout).toBe(0);
    expect(r.stderr).toBe('convo-mirror: warning: CONVO_MIRROR_ADMIN_PASSWORD is set but ignored: with CONVO_MIRROR_SCHEDULER=local there is no queue dashboard, which needs the bullmq scheduler\n');
    expect(r.stdout).not.toContain('redis');
    const json = await run(['check', '--daemon', '--json'], env);
    expect(JSON.parse(json.stdout)).toMatchObject({ ok: true });
    expect(json.stderr.split('\n').filter(Boolean)).toHaveLength(1);
    for (const out of [r, json]) expect(out.stdout + out.stderr).not.toContain(ADMIN);
    // BullMQ mode with an HTTP server: the password is used, nothing to say.
    const used = await run(['check', '--daemon', '--no-queue'], { ...env, CONVO_MIRROR_SCHEDULER: 'bullmq', CONVO_MIRROR_HTTP_PORT: String(await closedPort()) });
    expect(used.stderr).toBe('');
  });

  it('daemon --scheduler local: one warn line at start, naming the setting, never its value', async () => {
    const f = await fake();
    const env = cliEnv(f, tempDir(), { CONVO_MIRROR_ADMIN_PASSWORD: ADMIN, CONVO_MIRROR_SCHEDULE: NEVER, CONVO_MIRROR_FULL_SCHEDULE: NEVER });
    const daemon = await startDaemon(env, ['--scheduler', 'local']);
    try {
      const warned = daemon.stderr
        .split('\n')
        .filter((l) => l.includes('is set but ignored'))
        .map((l) => JSON.parse(l) as { level: number; msg: string; setting: string });
      expect(warned).toEqual([
        expect.objectContaining({
          level: 40,
          setting: 'CONVO_MIRROR_ADMIN_PASSWORD',
          msg: 'CONVO_MIRROR_ADMIN_PASSWORD is set but ignored: with --scheduler local there is no queue dashboard, which needs the bullmq scheduler',
        }),
      ]);
    } finally {
      daemon.child.kill('SIGTERM');
      const ended = await within(daemon.done, 15_000, 'daemon shutdown');
      expect(ended.stderr).not.toContain(ADMIN);
      expect(ended.stderr.split('\n').filter((l) => l.includes('is set but ignored'))).toHaveLength(1);
    }
  });

  it('config: the reason in the listing and in --json, exit 0', async () => {
    const env = cliEnv(await fake(), tempDir(), { CONVO_MIRROR_SCHEDULER: 'local', CONVO_MIRROR_ADMIN_PASSWORD: ADMIN });
    const text = await run(['config'], env);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^CONVO_MIRROR_ADMIN_PASSWORD +environment +set \(secret, not shown\) {2}\(ignored: with CONVO_MIRROR_SCHEDULER=local there is no queue dashboard, which needs the bullmq scheduler\)$/m);
    const json = JSON.parse((await run(['config', '--json'], env)).stdout) as Record<string, Record<string, unknown>>;
    expect(json['CONVO_MIRROR_ADMIN_PASSWORD']).toEqual({
      set: true,
      source: 'environment',
      ignored: 'with CONVO_MIRROR_SCHEDULER=local there is no queue dashboard, which needs the bullmq scheduler',
    });
    expect(text.stdout + JSON.stringify(json)).not.toContain(ADMIN);
  });
});
