/**
 * Real Redis for tests (design habit 9): `test/global-setup.ts` finds or starts one server for the
 * whole run and provides its URL (with the database of `REDIS_URL`) and a run id; each test file
 * uses its own random BullMQ queue prefix `cmtest-<run id>-<label>-<random>`, so files running in
 * parallel (and runs sharing one `REDIS_URL`) never see each other's keys, and the global teardown
 * fails the run naming any key of its run left behind (in the run's database, and in database 0).
 *
 * Every key a test writes goes under such a prefix; a URL built from {@link redisUrl} (a proxy)
 * keeps its database ({@link redisUrlVia}).
 *
 * ```ts
 * const url = redisUrl();
 * const prefix = randomPrefix('daemon');
 * afterAll(() => cleanupPrefix(url, prefix));
 * new Queue('sync', { connection: { url }, prefix });
 * ```
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { inject } from 'vitest';
import { redisUrlVia as via, runKeyPrefix } from './redis-url.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** URL of the Redis server shared by the whole test run (see test/global-setup.ts). */
    redisUrl: string;
    /** 8 hex digits drawn once per run: every test queue prefix starts `cmtest-<run id>-`. */
    redisRunId: string;
  }
}

/** The URL of the test run's Redis server, as provided by test/global-setup.ts. */
export function redisUrl(): string {
  const url = inject('redisUrl');
  if (!url) throw new Error('redisUrl was not provided: is test/global-setup.ts listed in vitest.config.ts globalSetup?');
  return url;
}

/**
 * The URL of the test run's Redis reached through `host:port` (a proxy in this process), with the
 * same database, user and password: a child given it writes where the test looks.
 */
export function redisUrlVia(port: number, host = '127.0.0.1'): string {
  return via(redisUrl(), port, host);
}

/** What every test queue prefix of this run starts with: `cmtest-<run id>-`. */
export function runPrefix(): string {
  const runId = inject('redisRunId');
  if (!runId) throw new Error('redisRunId was not provided: is test/global-setup.ts listed in vitest.config.ts globalSetup?');
  return runKeyPrefix(runId);
}

/** Longest label kept in a prefix: the whole prefix stays within CONVO_MIRROR_QUEUE_PREFIX's 64 characters. */
const MAX_LABEL = 24;

/**
 * A fresh BullMQ queue prefix for one test file: `cmtest-<run id>-<label>-<16 hex chars>` (at most
 * 57 characters; {@link prefixSequence} adds `-<n>`). Characters of `label` other than letters,
 * digits, `_` and `-` become `-` (a prefix is also a SCAN pattern); a label is cut at 24 characters.
 */
export function randomPrefix(label: string): string {
  const safe = label.replace(/[^A-Za-z0-9_-]/g, '-').slice(0, MAX_LABEL) || 'x';
  return `${runPrefix()}${safe}-${randomBytes(8).toString('hex')}`;
}

/** Escapes Redis glob metacharacters so `prefix` is matched literally by SCAN MATCH. */
function globEscape(s: string): string {
  return s.replace(/[\\*?[\]^]/g, (c) => `\\${c}`);
}

/**
 * Deletes every key `<prefix>:*` (BullMQ's keys for every queue under that prefix) with SCAN + UNLINK,
 * and returns how many were deleted. Keys that merely start with `prefix` without the `:` are kept.
 * Bounded: gives up with an error after `timeoutMs` (default 10 000 ms) rather than hanging a test.
 */
export async function cleanupPrefix(url: string, prefix: string, timeoutMs = 10_000): Promise<number> {
  if (!prefix) throw new Error('cleanupPrefix: empty prefix would match every key');
  const redis = new Redis(url, {
    lazyConnect: true,
    maxRetriesPerRequest: 1,
    connectTimeout: 2_000,
    retryStrategy: () => null,
  });
  let socketError: Error | undefined;
  redis.on('error', (err: Error) => (socketError ??= err)); // rethrown below, not printed by ioredis
  const deadline = Date.now() + timeoutMs;
  let deleted = 0;
  try {
    await redis.connect().catch((err: unknown) => {
      throw socketError ?? err;
    });
    const match = `${globEscape(prefix)}:*`;
    let cursor = '0';
    do {
      if (Date.now() > deadline) throw new Error(`cleanupPrefix(${prefix}): not finished after ${timeoutMs} ms`);
      const [next, keys] = await redis.scan(cursor, 'MATCH', match, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) deleted += await redis.unlink(...keys);
    } while (cursor !== '0');
    return deleted;
  } finally {
    redis.disconnect();
  }
}

/**
 * Queue prefixes for one test file: `next()` gives a fresh one per test (under one random file
 * prefix); `all` lists them for cleanup in afterAll.
 */
export function prefixSequence(label: string): { next(): string; readonly all: string[] } {
  const base = randomPrefix(label);
  const all: string[] = [];
  return {
    next() {
      const p = `${base}-${all.length + 1}`;
      all.push(p);
      return p;
    },
    all,
  };
}
