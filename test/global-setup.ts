/**
 * vitest globalSetup: what the whole test run shares, made once in vitest's main process.
 *
 * **One real Redis**, provided to tests as `redisUrl` (read it with `redisUrl()` from
 * test/redis.ts). Where it comes from, in order:
 *
 * 1. `REDIS_URL` from the environment, if set, with its database (`redis://127.0.0.1:6379/5`). It
 *    must answer PING, or the run fails naming it.
 * 2. Else `redis-server` from PATH, spawned on a free 127.0.0.1 port with no persistence, and
 *    stopped in teardown.
 * 3. Else a `redis:7` container through testcontainers, if a container runtime (Docker) answers.
 * 4. Else the run fails with a message saying how to get one.
 *
 * **A run id** (`redisRunId`, 8 hex digits): every test queue prefix is `cmtest-<run id>-…`
 * (test/redis.ts). The teardown scans that pattern in the run's database, and in database 0 when
 * the run uses another (where a URL that lost its database lands), and fails the run naming every
 * key it finds, then deletes them so one failure does not carry into the next run. Keys of other
 * runs or other programs sharing the server never match and are never touched.
 *
 * **An unprivileged copy of the CLI** (`unprivileged`, test/unprivileged-copy.ts) when the suite
 * runs as root, removed in teardown.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import type { TestProject } from 'vitest/node';
import { redactRedisUrl as redactUrl, redisDb, runKeyPrefix, withRedisDb } from './redis-url.js';
import { makeUnprivilegedCopy, SETPRIV_ARGV, type Unprivileged } from './unprivileged-copy.js';

/** The repository root (this file is test/global-setup.ts). */
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** The built CLI, as package.json's `bin` names it. */
const CLI = path.resolve(ROOT, (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { bin: Record<string, string> }).bin['convo-mirror']!);

const HOW_TO_GET_ONE =
  'set REDIS_URL, or install redis-server (apt-get install -y redis-server), or run Docker';

/** Milliseconds a spawned redis-server has to answer PING. */
const SPAWN_READY_MS = 10_000;

/** Resolves when `url` answers PING, rejects otherwise; one connection attempt, bounded. */
async function ping(url: string, timeoutMs = 2_000): Promise<void> {
  const redis = new Redis(url, {
    lazyConnect: true,
    connectTimeout: timeoutMs,
    commandTimeout: timeoutMs,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  });
  // ioredis rejects with a bare "Connection is closed."; the socket error says why (ECONNREFUSED...).
  let socketError: Error | undefined;
  redis.on('error', (err: Error) => (socketError ??= err));
  try {
    await redis.connect();
    const answer = await redis.ping();
    if (answer !== 'PONG') throw new Error(`PING answered ${JSON.stringify(answer)}`);
  } catch (err) {
    throw socketError ?? err;
  } finally {
    redis.disconnect();
  }
}

function findOnPath(bin: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, bin);
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      if (fs.statSync(candidate).isFile()) return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** A port that was free a moment ago on 127.0.0.1 (the spawn retries if it is taken meanwhile). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function stopChild(child: ChildProcess, graceMs = 3_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

interface Started {
  url: string;
  /** Where the server came from, for the one line logged at start. */
  source: string;
  stop: () => Promise<void>;
}

/** Spawns `bin` on a free port and waits (bounded) until it answers PING; retries a taken port. */
async function spawnRedisServer(bin: string): Promise<Started> {
  let lastError = '';
  for (let attempt = 1; attempt <= 3; attempt++) {
    const port = await freePort();
    const child = spawn(
      bin,
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', os.tmpdir()],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    const keep = (chunk: Buffer) => {
      output = (output + chunk.toString()).slice(-4_000);
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    let spawnError: Error | undefined;
    child.once('error', (err) => (spawnError = err));
    // If vitest itself dies without running teardown, do not leave the server behind.
    const onExit = () => child.kill('SIGKILL');
    process.once('exit', onExit);

    const url = `redis://127.0.0.1:${port}`;
    const deadline = Date.now() + SPAWN_READY_MS;
    while (Date.now() < deadline && !spawnError && child.exitCode === null && child.signalCode === null) {
      try {
        await ping(url, 500);
        return {
          url,
          source: `spawned ${bin}`,
          stop: async () => {
            process.off('exit', onExit);
            await stopChild(child);
          },
        };
      } catch {
        await sleep(50);
      }
    }
    const exited = child.exitCode !== null || child.signalCode !== null;
    lastError = spawnError
      ? `${bin} could not be started: ${spawnError.message}`
      : exited
        ? `${bin} --port ${port} exited (${child.exitCode ?? child.signalCode}): ${output.trim().split('\n').slice(-3).join(' | ')}`
        : `${bin} --port ${port} did not answer PING within ${SPAWN_READY_MS} ms`;
    process.off('exit', onExit);
    await stopChild(child);
    // Only an early exit (most likely the port was taken meanwhile) is worth another port.
    if (!exited || spawnError) break;
  }
  throw new Error(`Redis for tests: ${lastError}`);
}

/** Starts `redis:7` through testcontainers, or returns undefined when no container runtime answers. */
async function startContainer(): Promise<Started | undefined> {
  const { GenericContainer, Wait, getContainerRuntimeClient } = await import('testcontainers');
  try {
    await getContainerRuntimeClient();
  } catch {
    return undefined;
  }
  const container = await new GenericContainer('redis:7')
    .withCommand(['redis-server', '--save', '', '--appendonly', 'no'])
    .withExposedPorts(6379)
    .withWaitStrategy(Wait.forLogMessage('Ready to accept connections'))
    .start();
  const url = `redis://${container.getHost()}:${container.getMappedPort(6379)}`;
  await ping(url, 5_000);
  return { url, source: 'testcontainers redis:7', stop: async () => void (await container.stop()) };
}

async function resolveRedis(): Promise<Started> {
  const fromEnv = process.env.REDIS_URL;
  if (fromEnv !== undefined && fromEnv !== '') {
    // The database is the URL's path, as the application reads it; a ?db= query ioredis alone
    // would honour would put the tests' own connections and the CLI's in different databases.
    let problem: string | undefined;
    try {
      const u = new URL(fromEnv);
      if (u.searchParams.has('db')) problem = 'give the database as the path (redis://host:6379/5), not a ?db= query the application does not read';
      else redisDb(fromEnv);
    } catch (err) {
      problem = (err as Error).message;
    }
    if (problem) throw new Error(`Redis for tests: REDIS_URL=${redactUrl(fromEnv)}: ${problem}`);
    try {
      await ping(fromEnv);
    } catch (err) {
      throw new Error(
        `Redis for tests: REDIS_URL=${redactUrl(fromEnv)} does not answer PING (${(err as Error).message}). ` +
          'Start that server, fix REDIS_URL, or unset REDIS_URL to let the tests start their own redis-server.',
      );
    }
    return { url: fromEnv, source: 'REDIS_URL', stop: async () => {} };
  }

  const bin = findOnPath('redis-server');
  if (bin) return spawnRedisServer(bin);

  const container = await startContainer();
  if (container) return container;

  throw new Error(
    `Redis for tests: REDIS_URL is not set, redis-server is not on PATH and no Docker engine answers. ` +
      `To get one: ${HOW_TO_GET_ONE}.`,
  );
}

/** Longest list of leftover keys printed by the teardown (the count says how many more). */
const MAX_KEYS_SHOWN = 50;

/** Bound on the teardown's scan and delete, ms: a leftover check never hangs the run. */
const LEFTOVER_SCAN_MS = 20_000;

/**
 * Every key matching `<pattern prefix>*` in database `db` of `url`, deleted once listed; sorted.
 * Bounded by {@link LEFTOVER_SCAN_MS}.
 */
async function takeLeftovers(url: string, db: number, keyPrefix: string): Promise<string[]> {
  const redis = new Redis(withRedisDb(url, db), { lazyConnect: true, connectTimeout: 5_000, commandTimeout: 5_000, maxRetriesPerRequest: 1, retryStrategy: () => null });
  redis.on('error', () => {}); // the awaits below report it
  const deadline = Date.now() + LEFTOVER_SCAN_MS;
  const keys: string[] = [];
  try {
    await redis.connect();
    let cursor = '0';
    do {
      if (Date.now() > deadline) throw new Error(`scanning database ${db} for ${keyPrefix}* took longer than ${LEFTOVER_SCAN_MS} ms`);
      const [next, batch] = await redis.scan(cursor, 'MATCH', `${keyPrefix}*`, 'COUNT', 1000);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    const unique = [...new Set(keys)].sort();
    for (let i = 0; i < unique.length; i += 500) await redis.unlink(...unique.slice(i, i + 500));
    return unique;
  } finally {
    redis.disconnect();
  }
}

/**
 * The teardown's check: the keys of this run's prefixes left in the run's database and in
 * database 0, deleted; an Error naming them (database and key) when there are any.
 */
async function checkLeftovers(url: string, keyPrefix: string): Promise<Error | undefined> {
  const runDb = redisDb(url);
  const found: string[] = [];
  for (const db of runDb === 0 ? [0] : [runDb, 0]) {
    for (const key of await takeLeftovers(url, db, keyPrefix)) found.push(`db ${db}${db === runDb ? '' : ' (not the run\'s database)'}: ${key}`);
  }
  if (found.length === 0) return undefined;
  const shown = found.slice(0, MAX_KEYS_SHOWN).map((k) => `  ${k}`);
  if (found.length > MAX_KEYS_SHOWN) shown.push(`  … and ${found.length - MAX_KEYS_SHOWN} more`);
  return new Error(
    `the tests left ${found.length} Redis key${found.length === 1 ? '' : 's'} of their prefixes (${keyPrefix}*) behind ` +
      `(now deleted; a test that writes under a prefix must remove it, and a URL built from REDIS_URL must keep its database):\n${shown.join('\n')}`,
  );
}

/** How tests run as an unprivileged user here; logs one line saying which. */
function unprivilegedRun(): { provided: Unprivileged; remove(): void } {
  if (os.userInfo().uid !== 0) return { provided: { argv: [], root: ROOT }, remove: () => {} };
  const copy = makeUnprivilegedCopy(ROOT, CLI);
  if ('skip' in copy) {
    process.stderr.write(`Tests as an unprivileged user: skipped (${copy.skip})\n`);
    return { provided: copy, remove: () => {} };
  }
  process.stderr.write(`Tests as an unprivileged user: user 65534 through setpriv, on a readable copy of the CLI in ${copy.dir} (${copy.linked} files linked, ${copy.copied} copied)\n`);
  // If vitest dies without running teardown, do not leave the copy behind.
  process.once('exit', copy.remove);
  return {
    provided: { argv: SETPRIV_ARGV, root: copy.dir },
    remove: () => {
      process.off('exit', copy.remove);
      copy.remove();
    },
  };
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const redis = await resolveRedis();
  const runId = randomBytes(4).toString('hex');
  const keyPrefix = runKeyPrefix(runId);
  project.provide('redisUrl', redis.url);
  project.provide('redisRunId', runId);
  process.stderr.write(`Redis for tests: ${redactUrl(redis.url)}, database ${redisDb(redis.url)} (${redis.source}); test keys ${keyPrefix}*\n`);
  const unprivileged = unprivilegedRun();
  project.provide('unprivileged', unprivileged.provided);
  return async () => {
    let leftovers: Error | undefined;
    try {
      leftovers = await checkLeftovers(redis.url, keyPrefix);
    } catch (err) {
      leftovers = new Error(`could not check for Redis keys left behind (${keyPrefix}*): ${(err as Error).message}`);
    } finally {
      unprivileged.remove();
      await redis.stop();
    }
    if (leftovers) {
      // Printed once and failing the run by its exit code: vitest would print a thrown teardown
      // error again with a stack trace, after the summary, and still exit 0.
      process.exitCode = 1;
      process.stderr.write(`\nGlobal teardown FAILED: ${leftovers.message}\n`);
      return;
    }
    process.stderr.write(`Global teardown: no Redis key of ${keyPrefix}* left (database ${redisDb(redis.url)}${redisDb(redis.url) === 0 ? '' : ' and database 0'})\n`);
  };
}
