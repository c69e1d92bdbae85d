/**
 * The rate limiters of a daemon's clients: with the BullMQ engine, shared through Redis by every
 * daemon of the queue prefix (src/api/fleet-rate-limit.ts, on a connection of its own); with the
 * local engine, this process's own (src/api/rate-limit.ts), as `sync` has.
 */
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Config } from '../config/index.js';
import { redisShown } from '../config/redis-url.js';
import { FleetRateLimiterPool } from '../src/api/fleet-rate-limit.js';
import { RateLimiterPool, type LimiterPool } from '../src/api/rate-limit.js';
import { systemClock } from '../src/clock.js';
import { describeError } from '../src/errors.js';
import { redisConnection } from './queue.js';

/**
 * A limiter's Redis command not answered within this long fails, ms: the request is then paced by
 * its daemon alone rather than held on a Redis that hangs.
 */
export const FLEET_COMMAND_TIMEOUT_MS = 1000;

/** The daemon's limiter pool and how to release it. */
export interface DaemonLimiters {
  pool: LimiterPool;
  /** `shared` through Redis (BullMQ engine) or `process` (local engine). */
  scope: 'shared' | 'process';
  /** Closes the pool's Redis connection, if any (at once: nothing it sends needs to land). */
  close(): void;
}

/**
 * Builds the daemon's limiter pool: `config.maxRps` per base URL + key, fleet-wide with the BullMQ
 * engine (keys under `<queue prefix>:ratelimit:`), per process with the local engine. A Redis that
 * is away is logged once per outage (each daemon then paces alone) and once when it is back.
 */
export function daemonLimiters(config: Config, logger: Logger): DaemonLimiters {
  if (config.scheduler !== 'bullmq') return { pool: new RateLimiterPool(config.maxRps, systemClock), scope: 'process', close: () => {} };
  const redis = new Redis({
    ...redisConnection(config.redisUrl),
    // Fail at once while the connection is away, and within a bound when Redis hangs: a request
    // is never held for Redis; it is paced by this daemon alone meanwhile.
    enableOfflineQueue: false,
    commandTimeout: FLEET_COMMAND_TIMEOUT_MS,
    maxRetriesPerRequest: 1,
  });
  redis.on('error', () => {}); // the queue's connection reports Redis being away
  const where = redisShown(config.redisUrl);
  const pool = new FleetRateLimiterPool(redis, config.queuePrefix, config.maxRps, systemClock, {
    onUnavailable: (err) =>
      logger.warn({ redis: where, err: describeError(err) }, 'rate limits cannot be shared through Redis: this daemon paces its own requests until Redis answers again'),
    onRestored: () => logger.info({ redis: where }, 'rate limits shared through Redis again'),
  });
  return { pool, scope: 'shared', close: () => redis.disconnect() };
}
