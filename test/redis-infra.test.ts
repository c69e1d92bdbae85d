/**
 * The test Redis itself: the provided URL answers, prefixes are unique, and cleanupPrefix removes
 * exactly its own prefix's keys.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupPrefix, randomPrefix, redisUrl, redisUrlVia, runPrefix } from './redis.js';
import { redisDb } from './redis-url.js';

describe('test Redis', () => {
  let redis: Redis;
  const prefixes: string[] = [];

  beforeAll(async () => {
    redis = new Redis(redisUrl(), { lazyConnect: true, maxRetriesPerRequest: 1 });
    await redis.connect();
  });

  afterAll(async () => {
    for (const p of prefixes) await cleanupPrefix(redisUrl(), p);
    redis?.disconnect();
  });

  it('answers PING at the provided URL', async () => {
    expect(redisUrl()).toMatch(/^rediss?:\/\//);
    expect(await redis.ping()).toBe('PONG');
  });

  it('gives every call a different, labelled prefix under the run\'s cmtest-<run id>- (what the global teardown scans)', () => {
    expect(runPrefix()).toMatch(/^cmtest-[0-9a-f]{8}-$/);
    const a = randomPrefix('infra');
    const b = randomPrefix('infra');
    expect(a).not.toBe(b);
    expect(a).toMatch(new RegExp(`^${runPrefix()}infra-[0-9a-f]{16}$`));
    expect(randomPrefix('a b*c')).toMatch(new RegExp(`^${runPrefix()}a-b-c-[0-9a-f]{16}$`));
    // Within CONVO_MIRROR_QUEUE_PREFIX's 64 characters, with a sequence number, however long the label.
    const long = randomPrefix('x'.repeat(100));
    expect(`${long}-99`.length).toBeLessThanOrEqual(64);
  });

  it('a URL through a proxy keeps the database, user and password of the run\'s REDIS_URL', () => {
    const via = new URL(redisUrlVia(6390));
    const url = new URL(redisUrl());
    expect([via.hostname, via.port]).toEqual(['127.0.0.1', '6390']);
    expect([via.username, via.password, via.protocol]).toEqual([url.username, url.password, url.protocol]);
    expect(redisDb(via.toString())).toBe(redisDb(redisUrl()));
    // The mistake this guards against: a bare redis://host:port is database 0, whatever REDIS_URL says.
    expect(redisDb('redis://127.0.0.1:6390')).toBe(0);
    expect(redisDb('redis://127.0.0.1:6379/5')).toBe(5);
    expect(new URL(redisUrlVia(6390)).pathname).toBe(`/${redisDb(redisUrl())}`);
  });

  it('cleanupPrefix deletes only the keys under <prefix>:', async () => {
    const mine = randomPrefix('infra-mine');
    const other = randomPrefix('infra-other');
    prefixes.push(mine, other);

    // Enough keys to need several SCAN rounds, as BullMQ lays them out (<prefix>:<queue>:...).
    const pipeline = redis.pipeline();
    for (let i = 0; i < 2_500; i++) pipeline.set(`${mine}:q:${i}`, 'x');
    pipeline.hset(`${mine}:q:meta`, 'opts', '{}');
    pipeline.set(`${other}:q:1`, 'keep');
    pipeline.set(`${mine}extra`, 'keep'); // starts with the prefix, but not "<prefix>:"
    pipeline.set(mine, 'keep'); // the bare prefix
    await pipeline.exec();

    expect(await cleanupPrefix(redisUrl(), mine)).toBe(2_501);

    const left: string[] = [];
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${mine}:*`, 'COUNT', 1_000);
      cursor = next;
      left.push(...keys);
    } while (cursor !== '0');
    expect(left).toEqual([]);
    expect(await redis.get(`${other}:q:1`)).toBe('keep');
    expect(await redis.get(`${mine}extra`)).toBe('keep');
    expect(await redis.get(mine)).toBe('keep');

    // Nothing left: a second cleanup is a no-op.
    expect(await cleanupPrefix(redisUrl(), mine)).toBe(0);
    await redis.del(`${mine}extra`, mine);
  });
});
