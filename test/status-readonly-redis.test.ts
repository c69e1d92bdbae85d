/**
 * `convo-mirror status` writes nothing to Redis. The built CLI as a child process against the test
 * run's real Redis: every key under the queue prefix (its type, its `DUMP`ed value, whether it has
 * a TTL) is snapshotted with SCAN before and after `status --json` and `status`, and must not
 * change, on a queue holding jobs in every state and a job scheduler, and on a prefix never used
 * (which must keep zero keys).
 *
 * The populated queue is built without BullMQ's queue metadata (`skipMetasUpdate`): the version
 * that `new Queue()` writes into the `<prefix>:sync:meta` hash would show as a changed value (on a
 * prefix never used, as a new key).
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { QUEUE_NAME, WORKSPACE_JOB, redisConnection } from '../jobs/queue.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, within } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';

const prefixes = prefixSequence('status-readonly');
const dirs: string[] = [];
const closers: (() => Promise<unknown>)[] = [];

/** Every key `<prefix>:*` with its type, dumped value (hex) and whether it expires, sorted by key. */
async function snapshot(prefix: string): Promise<Record<string, string>> {
  const redis = new Redis(redisUrl(), { maxRetriesPerRequest: 1 });
  try {
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    const out: Record<string, string> = {};
    for (const key of keys.sort()) {
      const [type, dump, ttl] = await Promise.all([redis.type(key), redis.dumpBuffer(key), redis.pttl(key)]);
      out[key] = `${type} ${ttl > 0 ? 'expires' : 'persists'} ${dump?.toString('hex') ?? 'gone'}`;
    }
    return out;
  } finally {
    redis.disconnect();
  }
}

/** The `version` field of the queue's metadata hash (written by `new Queue()` unless `skipMetasUpdate`). */
async function metaVersion(prefix: string): Promise<string | null> {
  const redis = new Redis(redisUrl(), { maxRetriesPerRequest: 1 });
  try {
    return await redis.hget(`${prefix}:${QUEUE_NAME}:meta`, 'version');
  } finally {
    redis.disconnect();
  }
}

/** A mirror file for `status` (it reads the mirror before the queue) and the CLI's environment. */
async function statusEnv(prefix: string): Promise<NodeJS.ProcessEnv> {
  const dir = tempDir('convo-mirror-status-redis-');
  dirs.push(dir);
  const db = path.join(dir, 'mirror.sqlite');
  await (await openMirror(db)).close();
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('CONVO_MIRROR_') && k !== 'REDIS_URL' && k !== 'LOG_LEVEL') env[k] = v;
  return { ...env, REDIS_URL: redisUrl(), CONVO_MIRROR_QUEUE_PREFIX: prefix, CONVO_MIRROR_DB: db, CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports') };
}

/**
 * A queue on `prefix` with one job in each state (completed, failed, active, delayed, prioritized,
 * waiting) and a job scheduler; the worker that moved them is closed before this returns (the
 * active job keeps a 10-minute lock), so nothing else writes under the prefix meanwhile.
 */
async function populatedQueue(prefix: string): Promise<void> {
  const connection = redisConnection(redisUrl());
  const queue = new Queue(QUEUE_NAME, { connection, prefix, skipMetasUpdate: true });
  closers.push(() => queue.close());
  const worker = new Worker(QUEUE_NAME, null, { connection, prefix, autorun: false, lockDuration: 600_000 });
  closers.push(() => worker.close(true));
  const opts = { attempts: 1, removeOnComplete: false, removeOnFail: false };
  for (const name of ['to-complete', 'to-fail', 'to-hold']) await queue.add(name, { conversationId: name }, opts);
  const token = 'status-readonly-test';
  const taken = [await worker.getNextJob(token), await worker.getNextJob(token), await worker.getNextJob(token)];
  await taken[0]!.moveToCompleted({ status: 'succeeded' }, token, false);
  await taken[1]!.moveToFailed(new Error('broken on purpose'), token, false);
  await queue.add('later', { conversationId: 'later' }, { ...opts, delay: 3_600_000 });
  await queue.add('urgent', { conversationId: 'urgent' }, { ...opts, priority: 5 });
  await queue.add('plain', { conversationId: 'plain' }, opts);
  await queue.upsertJobScheduler('workspace-regular:default', { pattern: '15 3 1 1 *', tz: 'UTC' }, { name: WORKSPACE_JOB, data: { mode: 'regular' } });
  await worker.close(true);
  await queue.close();
}

beforeAll(assertBuilt);

afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(closers.splice(0).map((c) => within(c(), 10_000, 'closing a fixture')));
});

afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('status reads the queue without writing to Redis', () => {
  it('a queue with jobs in every state and a scheduler: every key and value under the prefix unchanged', async () => {
    const prefix = prefixes.next();
    await populatedQueue(prefix);
    const env = await statusEnv(prefix);
    const before = await snapshot(prefix);
    expect(Object.keys(before).length).toBeGreaterThan(10);
    expect(await metaVersion(prefix), 'the fixture has no queue version, so writing it would show').toBeNull();

    const json = await run(['status', '--json'], env);
    expect(json.code, json.stderr).toBe(0);
    const s = JSON.parse(json.stdout) as { queue: { prefix: string; counts: Record<string, number>; schedulers: { id: string }[]; failed: { reason: string }[] } };
    expect(s.queue.prefix).toBe(prefix);
    expect(s.queue.counts).toEqual({ waiting: 1, active: 1, delayed: 2, failed: 1, completed: 1, 'waiting-children': 0, prioritized: 1 });
    expect(s.queue.schedulers.map((x) => x.id)).toEqual(['workspace-regular:default']);
    expect(s.queue.failed.map((f) => f.reason)).toEqual(['broken on purpose']);
    expect(await snapshot(prefix)).toEqual(before);

    const text = await run(['status'], env);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain(`queue ${prefix} on `);
    expect(await snapshot(prefix)).toEqual(before);
  });

  it('a prefix never used keeps zero keys', async () => {
    const prefix = prefixes.next();
    const env = await statusEnv(prefix);
    expect(await snapshot(prefix)).toEqual({});
    const json = await run(['status', '--json'], env);
    expect(json.code, json.stderr).toBe(0);
    const s = JSON.parse(json.stdout) as { queue: { prefix: string; counts: Record<string, number> } };
    expect(s.queue.prefix).toBe(prefix);
    expect(Object.values(s.queue.counts).every((n) => n === 0)).toBe(true);
    expect(await snapshot(prefix)).toEqual({});
  });
});
