import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Tests spawn child processes and servers; two workers fit the 2-core machine.
    maxWorkers: 2,
    // One real Redis for the run (REDIS_URL with its database, else a spawned redis-server, else
    // testcontainers), read with redisUrl() from test/redis.ts; its teardown fails the run naming
    // any key of the run's prefixes (cmtest-<run id>-*) left behind. As root, also a copy of the
    // built CLI that user 65534 can read, for the tests run through setpriv (test/unprivileged.ts).
    globalSetup: ['test/global-setup.ts'],
  },
});
