/**
 * Redis is shown one way everywhere (config/redis-url.ts `redisShown`): scheme, host, port and
 * database number, `/0` when the URL names none, user and password masked. Unit tests of the form
 * and of the setting's validation, then the built CLI against the test run's real Redis on
 * database 5: `status`, the daemon's ready line, `check` and `enqueue` all say `/5`, and the
 * connection the queue uses is the one shown (a job enqueued lands in database 5).
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { Redis } from 'ioredis';
import { loadConfig } from '../config/index.js';
import { redisShown, redisTarget } from '../config/redis-url.js';
import { openQueue, redisConnection } from '../jobs/queue.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir as makeTempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, startDaemon, within } from './children.js';
import { NEVER } from './daemon-fixtures.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';

/** The test run's Redis on database `db`. */
function onDb(db: number): string {
  const u = new URL(redisUrl());
  u.pathname = `/${db}`;
  return u.href;
}

/** How database 5 of the test run's Redis must be shown, built by hand from the URL's parts. */
function shownDb5(): string {
  const u = new URL(redisUrl());
  return `${u.protocol}//${u.username || u.password ? '***@' : ''}${u.hostname}:${u.port || 6379}/5`;
}

const prefixes = prefixSequence('redis-shown');
const dirs: string[] = [];
const fakes: FakeApi[] = [];
function tempDir(): string {
  const d = makeTempDir('convo-mirror-redis-shown-');
  dirs.push(d);
  return d;
}

beforeAll(assertBuilt);
afterEach(killLeftovers);
afterAll(async () => {
  await Promise.all(fakes.splice(0).map((f) => f.close()));
  for (const p of prefixes.all) await cleanupPrefix(onDb(5), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('redisShown', () => {
  it('always the port and the database number (/0 by default); user and password masked; rediss kept; IPv6 bracketed', () => {
    expect(redisShown('redis://127.0.0.1:6379')).toBe('redis://127.0.0.1:6379/0');
    expect(redisShown('redis://127.0.0.1')).toBe('redis://127.0.0.1:6379/0');
    expect(redisShown('redis://127.0.0.1:6379/')).toBe('redis://127.0.0.1:6379/0');
    expect(redisShown('redis://127.0.0.1:6379/5')).toBe('redis://127.0.0.1:6379/5');
    expect(redisShown('rediss://default:s3cret@cache.example.com:6380/2')).toBe('rediss://***@cache.example.com:6380/2');
    expect(redisShown('redis://user@h/1')).toBe('redis://***@h:6379/1');
    expect(redisShown('redis://[::1]:6390/3')).toBe('redis://[::1]:6390/3');
    expect(redisShown('redis://h:1/0?password=s3cret')).toBe('redis://h:1/0?***');
    expect(redisShown('not a url s3cret')).toBe('***');
  });

  it('shows what the connections use: the same host, port and database', () => {
    expect(redisTarget('redis://[::1]:6390/3')).toMatchObject({ host: '::1', port: 6390, db: 3, tls: false });
    const c = redisConnection('rediss://u:p%40ss@h:6380/7');
    expect([c.host, c.port, c.db, c.username, c.password, c.tls]).toEqual(['h', 6380, 7, 'u', 'p@ss', {}]);
    expect(redisConnection('redis://h').db).toBe(0);
  });

  it('REDIS_URL: a path that is not a database number, or a query, is refused naming REDIS_URL, never showing the URL', () => {
    const load = (url: string) => () => loadConfig({ REDIS_URL: url }, {}, { needsApi: false });
    expect(load('redis://:s3cret@h:6379/abc')).toThrow('REDIS_URL: the path after the host must be a database number, e.g. redis://127.0.0.1:6379/5');
    expect(load('redis://:s3cret@h:6379/5/6')).toThrow('REDIS_URL: the path after the host must be a database number');
    expect(load('redis://:s3cret@h:6379/0?family=6')).toThrow(/^REDIS_URL: must not carry a query string or fragment: .*%3F or %23\)$/);
    for (const url of ['redis://:s3cret@h:6379/abc', 'redis://:s3cret@h:6379/0?family=6']) {
      try {
        load(url)();
      } catch (err) {
        expect((err as Error).message).not.toContain('s3cret');
      }
    }
    expect(loadConfig({ REDIS_URL: 'redis://h:6379/15' }, {}, { needsApi: false }).redisUrl).toBe('redis://h:6379/15');
  });
});

describe('every command shows the database number', () => {
  it('status (text and JSON) shows /5 for REDIS_URL .../5', async () => {
    const dir = tempDir();
    const db = path.join(dir, 'mirror.sqlite');
    await (await openMirror(db)).close();
    const env = { PATH: process.env.PATH, REDIS_URL: onDb(5), CONVO_MIRROR_QUEUE_PREFIX: prefixes.next(), CONVO_MIRROR_DB: db };
    const text = await run(['status'], env);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain(`queue ${env.CONVO_MIRROR_QUEUE_PREFIX} on ${shownDb5()}: `);
    const json = await run(['status', '--json'], env);
    expect((JSON.parse(json.stdout) as { queue: { redis: string } }).queue.redis).toBe(shownDb5());
  });

  it("the daemon's ready line shows /5, and the queue it serves lives in database 5", async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([2]), apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const prefix = prefixes.next();
    const env = cliEnv(fake, tempDir(), { REDIS_URL: onDb(5), CONVO_MIRROR_QUEUE_PREFIX: prefix, CONVO_MIRROR_SCHEDULE: NEVER, CONVO_MIRROR_FULL_SCHEDULE: NEVER });
    const daemon = await startDaemon(env);
    try {
      const ready = daemon.stderr.split('\n').find((l) => l.includes('"msg":"daemon ready"'))!;
      expect((JSON.parse(ready) as { redis: string }).redis).toBe(shownDb5());
      // Its job schedulers are in database 5, not in the URL-less default.
      const redis = new Redis(redisConnection(onDb(5)));
      try {
        expect(await redis.exists(`${prefix}:sync:repeat`)).toBe(1);
      } finally {
        redis.disconnect();
      }
    } finally {
      daemon.child.kill('SIGTERM');
      await within(daemon.done, 15_000, 'daemon shutdown');
    }
  });

  it('check says "redis://…/5 answers PING"; enqueue names /5 when no worker serves the queue, and its job is in database 5', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const prefix = prefixes.next();
    const env = cliEnv(fake, tempDir(), { REDIS_URL: onDb(5), CONVO_MIRROR_QUEUE_PREFIX: prefix });
    const check = await run(['check'], env);
    expect(check.code, check.stdout).toBe(0);
    expect(check.stdout).toContain(`✓ redis: ${shownDb5()} answers PING (REDIS_URL)\n`);
    const enqueue = await run(['enqueue', '--conversation', 'c-1', '--wait', '--timeout', '5000'], env, 30_000);
    expect(enqueue.code, enqueue.stderr).toBe(3);
    expect(enqueue.stderr).toContain(`no worker serves queue prefix "${prefix}" on ${shownDb5()} `);
    const queue = openQueue({ redisUrl: onDb(5), prefix });
    try {
      expect(await queue.getJob(enqueue.stdout.trim())).toBeDefined();
    } finally {
      await queue.close();
    }
  });

  it('a database number the server does not have fails check and the daemon, naming REDIS_URL (it used to pass and run in database 0)', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const env = cliEnv(fake, tempDir(), { REDIS_URL: onDb(9999), CONVO_MIRROR_QUEUE_PREFIX: prefixes.next() });
    const check = await run(['check'], env);
    expect(check.code, check.stdout).toBe(2);
    expect(check.stdout).toMatch(/^✗ redis: REDIS_URL: cannot reach Redis at redis:\/\/\S+\/9999: the database number in the URL does not exist;/m);
    const daemon = await run(['daemon'], env);
    expect(daemon.code).toBe(2);
    expect(daemon.stderr).toContain('the database number in the URL does not exist');
  });
});
