/**
 * The test Redis itself: the provided URL answers, prefixes are unique, and cleanupPrefix removes
 * exactly its own prefix's keys.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupPrefix, randomPrefix, redisUrl } from './redis.js';

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

  it('gives every call a different, labelled prefix', () => {
    const a = randomPrefix('infra');
    const b = randomPrefix('infra');
    expect(a).not.toBe(b);
    expect(a).toMatch(/^cmtest-infra-[0-9a-f]{16}$/);
    expect(randomPrefix('a b*c')).toMatch(/^cmtest-a-b-c-[0-9a-f]{16}$/);
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
