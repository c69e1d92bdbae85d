/**
 * `convo-mirror config [--json]`: every setting with where it came from (flag, environment, .env,
 * default, unset); secrets only as set or unset; URLs' user info masked; a malformed value shown
 * with its error (exit 2); nothing written, nothing connected to. The built CLI runs as a child
 * process in a fresh temp directory, with an environment stripped of every convo-mirror setting.
 */
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { CONFIG_FIELDS } from '../config/index.js';
import { assertBuilt, CLI, killLeftovers, cleanEnv, runIn, workDirs } from './children.js';

beforeAll(assertBuilt);
afterEach(killLeftovers);

const work = workDirs('convo-mirror-config-');
afterEach(() => work.cleanup());
/** A fresh working directory, removed after the test; `dotenv` is written to its `.env`. */
const workDir = (dotenv?: string): string => work.make(dotenv);

/** The `config` text output as `{ NAME: [source, value] }`. */
function table(stdout: string): Record<string, [string, string]> {
  return Object.fromEntries(
    stdout
      .trimEnd()
      .split('\n')
      .map((l) => {
        const [name, source, ...rest] = l.split(/ {2,}/);
        return [name!, [source!, rest.join('  ')]] as const;
      }),
  );
}

const KEY = 'sk-config-SECRET-91c3d7';
const WEBHOOK = 'whsec_' + Buffer.from('0123456789abcdef0123').toString('base64');
const ADMIN = 'admin-PASSWORD-7f2e';
const REDIS_PASSWORD = 'redis-PASSWORD-c4a1';
const WS_KEY = 'sk-workspace-SECRET-0b9e';
const SECRETS = [KEY, WEBHOOK, ADMIN, REDIS_PASSWORD, WS_KEY];

describe('convo-mirror config', () => {
  it('shows every setting with its source: flag, environment, .env, default, unset', async () => {
    const dir = workDir('CONVO_MIRROR_DB=dot.sqlite\nCONVO_MIRROR_CONCURRENCY=5\nCONVO_MIRROR_MAX_RPS=2\n');
    const env = cleanEnv({ CONVO_MIRROR_CONCURRENCY: '7', CONVO_MIRROR_BASE_URL: 'https://support.example.com/api/' });
    const r = await runIn(dir, ['config', '--max-rps', '3', '--gzip'], env);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const t = table(r.stdout);
    expect(Object.keys(t)).toEqual(Object.values(CONFIG_FIELDS).map((d) => d.env));
    expect(t['CONVO_MIRROR_MAX_RPS']).toEqual(['flag', '3']);
    expect(t['CONVO_MIRROR_EXPORT_GZIP']).toEqual(['flag', 'true']);
    expect(t['CONVO_MIRROR_CONCURRENCY']).toEqual(['environment', '7']);
    expect(t['CONVO_MIRROR_BASE_URL']).toEqual(['environment', 'https://support.example.com/api']);
    expect(t['CONVO_MIRROR_DB']).toEqual(['.env', 'dot.sqlite']);
    expect(t['CONVO_MIRROR_SCHEDULE']).toEqual(['default', '*/15 * * * *']);
    expect(t['CONVO_MIRROR_ACCOUNT_ID']).toEqual(['unset', '']);
    expect(t['CONVO_MIRROR_API_KEY']).toEqual(['unset', '']);
  });

  it('never shows a secret: keys, webhook secret, admin password (flag, environment, .env) only as set; a Redis password masked', async () => {
    const dir = workDir(`CONVO_MIRROR_API_KEY=${KEY}\nACME_KEY=${WS_KEY}\n`);
    const file = path.join(dir, 'workspaces.json');
    fs.writeFileSync(file, JSON.stringify([{ account_id: '3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d01', api_key_env: 'ACME_KEY' }, { account_id: '3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d02', api_key_env: 'OTHER_KEY' }]));
    const env = cleanEnv({ CONVO_MIRROR_WEBHOOK_SECRET: WEBHOOK, REDIS_URL: `redis://user:${REDIS_PASSWORD}@127.0.0.1:6390/0`, CONVO_MIRROR_WORKSPACES: file });
    for (const args of [['config', '--admin-password', ADMIN], ['config', '--json', '--admin-password', ADMIN]]) {
      const r = await runIn(dir, args, env);
      expect(r.code, r.stderr).toBe(0);
      for (const s of SECRETS) expect(r.stdout + r.stderr, `${args.join(' ')} shows a secret`).not.toContain(s);
    }
    const t = table((await runIn(dir, ['config', '--admin-password', ADMIN], env)).stdout);
    // The workspaces file names other variables for the keys: CONVO_MIRROR_API_KEY is read by nothing.
    expect(t['CONVO_MIRROR_API_KEY']).toEqual(['.env', "set (secret, not shown)  (ignored: with a workspaces file (CONVO_MIRROR_WORKSPACES) each workspace's key comes from the variable its api_key_env names)"]);
    expect(t['CONVO_MIRROR_WEBHOOK_SECRET']).toEqual(['environment', 'set (secret, not shown)']);
    expect(t['CONVO_MIRROR_ADMIN_PASSWORD']).toEqual(['flag', 'set (secret, not shown)']);
    expect(t['ACME_KEY']).toEqual(['.env', 'set (secret, not shown)']);
    expect(t['OTHER_KEY']).toEqual(['unset', '']);
    expect(t['REDIS_URL']).toEqual(['environment', 'redis://***@127.0.0.1:6390/0']);
  });

  it('--json: an object keyed by variable, { value, source } or { set, source } for a secret', async () => {
    const dir = workDir(`CONVO_MIRROR_API_KEY=${KEY}\n`);
    const r = await runIn(dir, ['config', '--json', '--concurrency', '9'], cleanEnv({ CONVO_MIRROR_ACCOUNT_ID: '3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d01' }));
    expect(r.code, r.stderr).toBe(0);
    const json = JSON.parse(r.stdout) as Record<string, Record<string, unknown>>;
    expect(Object.keys(json)).toEqual(Object.values(CONFIG_FIELDS).map((d) => d.env));
    expect(json['CONVO_MIRROR_API_KEY']).toEqual({ set: true, source: '.env' });
    expect(json['CONVO_MIRROR_ADMIN_PASSWORD']).toEqual({ set: false, source: 'unset' });
    expect(json['CONVO_MIRROR_CONCURRENCY']).toEqual({ value: 9, source: 'flag' });
    expect(json['CONVO_MIRROR_ACCOUNT_ID']).toEqual({ value: '3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d01', source: 'environment' });
    expect(json['CONVO_MIRROR_GROUP_READABLE']).toEqual({ value: false, source: 'default' });
    expect(json['CONVO_MIRROR_BASE_URL']).toEqual({ value: null, source: 'unset' });
    expect(r.stdout).not.toContain(KEY);
  });

  it('a malformed value is shown with its error, named on stderr, exit 2; a malformed key is never shown', async () => {
    const dir = workDir('CONVO_MIRROR_API_KEY="sk-bad\tKEY-SECRET"\n');
    const env = cleanEnv({ CONVO_MIRROR_MAX_RPS: 'fast', CONVO_MIRROR_BASE_URL: 'https://user:pw-SECRET@support.example.com/api' });
    const r = await runIn(dir, ['config'], env);
    expect(r.code).toBe(2);
    const t = table(r.stdout);
    expect(t['CONVO_MIRROR_MAX_RPS']).toEqual(['environment', 'fast  (invalid: must be a number)']);
    expect(t['CONVO_MIRROR_BASE_URL']![1]).toMatch(/^https:\/\/\*\*\*@support\.example\.com\/api {2}\(invalid: must not carry a user name or password/);
    expect(t['CONVO_MIRROR_API_KEY']![1]).toMatch(/^set \(secret, not shown\) {2}\(invalid: must be printable ASCII/);
    expect(t['CONVO_MIRROR_DB']).toEqual(['default', 'data/mirror.sqlite']);
    expect(r.stderr).toContain('convo-mirror: configuration error: CONVO_MIRROR_MAX_RPS: must be a number\n');
    expect(r.stderr).toContain('convo-mirror: configuration error: CONVO_MIRROR_API_KEY: must be printable ASCII');
    expect(r.stdout + r.stderr).not.toContain('pw-SECRET');
    expect(r.stdout + r.stderr).not.toContain('KEY-SECRET');
    const json = await runIn(dir, ['config', '--json', '--max-rps', 'slow'], env);
    expect(json.code).toBe(2);
    expect((JSON.parse(json.stdout) as Record<string, unknown>)['CONVO_MIRROR_MAX_RPS']).toEqual({ value: 'slow', source: 'flag', error: 'must be a number' });
    expect(json.stderr).toContain('configuration error: --max-rps: must be a number');
  });

  it('writes nothing and connects nowhere: no mirror, no directory, no Redis or API connection', async () => {
    const dir = workDir();
    const server = net.createServer((s) => s.destroy());
    let connections = 0;
    server.on('connection', () => connections++);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const port = (server.address() as net.AddressInfo).port;
      const env = cleanEnv({ REDIS_URL: `redis://127.0.0.1:${port}`, CONVO_MIRROR_BASE_URL: `http://127.0.0.1:${port}`, CONVO_MIRROR_SCHEDULER: 'bullmq' });
      const r = await runIn(dir, ['config', '--db', 'sub/mirror.sqlite', '--export-dir', 'out'], env);
      expect(r.code, r.stderr).toBe(0);
      expect(fs.readdirSync(dir)).toEqual([]);
      expect(connections).toBe(0);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('an unusable workspaces file is an error of CONVO_MIRROR_WORKSPACES, exit 2', async () => {
    const dir = workDir();
    const r = await runIn(dir, ['config'], cleanEnv({ CONVO_MIRROR_WORKSPACES: path.join(dir, 'missing.json') }));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^convo-mirror: configuration error: CONVO_MIRROR_WORKSPACES: \S+missing\.json: cannot be read/m);
  });
});
