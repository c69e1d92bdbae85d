/**
 * A redis-server of a test's own, for "Redis down and back": on a free port of 127.0.0.1, stopped
 * and started again on the same port by the test, its data kept across the restart (append-only
 * file in a temp dir, fsynced at every write, as a production Redis with persistence). Never the
 * test run's shared Redis (test/global-setup.ts), which other test files use at the same time.
 *
 * ```ts
 * const redis = await ownRedis();
 * afterAll(closeOwnRedis);
 * await redis.stop();   // down: connections refused
 * await redis.start();  // back, same port, same data
 * ```
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { closedPort, waitFor, within } from './children.js';

/** A redis-server the test controls. */
export interface OwnRedis {
  /** `redis://127.0.0.1:<port>`. */
  url: string;
  port: number;
  /** Whether it runs now. */
  readonly up: boolean;
  /** Starts it (again) on its port; resolves once it answers PING (bounded: 10 s). */
  start(): Promise<void>;
  /** Stops it (SIGTERM; SIGKILL after 5 s) and waits until it has exited. */
  stop(): Promise<void>;
}

const all: { redis: OwnRedis; dir: string }[] = [];
const children = new Set<ChildProcess>();
// If the test process dies without its afterAll, do not leave a server behind.
process.once('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});

/** Whether a redis-server answers PING on `port`. */
function answersPing(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => s.write('PING\r\n'));
    s.setTimeout(500, () => {
      s.destroy();
      resolve(false);
    });
    s.once('data', (d) => {
      s.destroy();
      resolve(d.toString().startsWith('+PONG'));
    });
    s.once('error', () => resolve(false));
  });
}

/** Starts a redis-server of the test's own (see the module's comment). Stop them all with {@link closeOwnRedis}. */
export async function ownRedis(): Promise<OwnRedis> {
  const port = await closedPort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-own-redis-'));
  let child: ChildProcess | undefined;
  const running = () => child !== undefined && child.exitCode === null && child.signalCode === null;
  const redis: OwnRedis = {
    url: `redis://127.0.0.1:${port}`,
    port,
    get up() {
      return running();
    },
    async start() {
      if (running()) return;
      const c = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'yes', '--appendfsync', 'always'], { stdio: 'ignore' });
      child = c;
      children.add(c);
      c.once('exit', () => children.delete(c));
      await waitFor(async () => c.exitCode !== null || (await answersPing(port)), 10_000, `redis-server on port ${port} to answer PING`, 50);
      if (c.exitCode !== null) throw new Error(`redis-server on port ${port} exited (${c.exitCode}) at start`);
    },
    async stop() {
      const c = child;
      if (!c || !running()) return;
      const exited = new Promise<void>((resolve) => c.once('exit', () => resolve()));
      const timer = setTimeout(() => c.kill('SIGKILL'), 5_000);
      c.kill('SIGTERM');
      await within(exited, 10_000, `stopping redis-server on port ${port}`).finally(() => clearTimeout(timer));
    },
  };
  all.push({ redis, dir });
  await redis.start();
  return redis;
}

/** Stops every server {@link ownRedis} started and removes their data; call it in afterAll. */
export async function closeOwnRedis(): Promise<void> {
  for (const { redis, dir } of all.splice(0)) {
    await redis.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
