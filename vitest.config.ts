import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Tests spawn child processes and servers; two workers fit the 2-core machine.
    maxWorkers: 2,
    // One real Redis for the run (REDIS_URL, else a spawned redis-server, else testcontainers);
    // tests read its URL with redisUrl() from test/redis.ts.
    globalSetup: ['test/global-setup.ts'],
  },
});
