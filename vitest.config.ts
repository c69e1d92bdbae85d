import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Tests spawn child processes and servers; two workers fit the 2-core machine.
    maxWorkers: 2,
  },
});
