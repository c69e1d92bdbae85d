/**
 * `convo-mirror enqueue --wait` never hangs: the built CLI as a child process against the test
 * run's real Redis (test/global-setup.ts), each test on its own queue prefix, with (when a test
 * needs one) a minimal BullMQ worker in this process on the same queue name and prefix instead of
 * a daemon.
 *
 * - No worker on the queue: exit 3 at once, one line naming the prefix, the Redis URL (password
 *   masked) and `convo-mirror daemon`; the job stays queued. A worker that goes away mid-wait is
 *   the same failure, seen within the command's worker check interval.
 * - A worker that completes the jobs: exit 0.
 * - `--timeout` with a worker that never finishes: exit 3 naming each job and its state, never
 *   BullMQ's own text.
 * - Redis that accepts connections but never answers, refuses them, or stops answering mid-wait
 *   (a proxy in this process goes silent): one line naming REDIS_URL (masked), exit 2, within a
 *   few seconds.
 *
 * Waits are bounded by polling state. No elapsed time is asserted: the reason in the one line
 * ("no worker serves", "gave up waiting after 1500 ms (--timeout)", "no answer within 3 s",
 * "stopped answering") shows which check ended the wait, where a slow machine would only make a
 * time bound flaky; each child's life is capped by its spawn deadline.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import { Job, Queue, Worker, type Processor } from 'bullmq';
import { redisShown } from '../config/redis-url.js';
import { QUEUE_NAME, redisConnection } from '../jobs/queue.js';
import { assertBuilt, closedPort, killLeftovers, run, start, waitFor, within } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl, redisUrlVia } from './redis.js';

const prefixes = prefixSequence('enqueue-wait');
const workers: Worker[] = [];
const queues: Queue[] = [];
/** Stops the TCP servers of a test (their connections destroyed first: closing waits for them). */
const stoppers: (() => Promise<void>)[] = [];
/** Gates of processors that never finish on their own; opened in afterEach so their workers can close. */
const gates: (() => void)[] = [];

/** The CLI's environment: the copied env without any CONVO_MIRROR_* setting, plus Redis and a prefix. */
function cliEnvFor(prefix: string, url = redisUrl()): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('CONVO_MIRROR_') && k !== 'REDIS_URL' && k !== 'LOG_LEVEL') env[k] = v;
  return { ...env, REDIS_URL: url, CONVO_MIRROR_QUEUE_PREFIX: prefix };
}

function queueFor(prefix: string): Queue {
  const q = new Queue(QUEUE_NAME, { connection: redisConnection(redisUrl()), prefix });
  queues.push(q);
  return q;
}

/** Starts a BullMQ worker on the queue of `prefix` and waits (bounded) until BullMQ lists it. */
async function startWorker(prefix: string, processor: Processor, concurrency = 1): Promise<Worker> {
  const w = new Worker(QUEUE_NAME, processor, { connection: redisConnection(redisUrl()), prefix, concurrency });
  w.on('error', () => {});
  workers.push(w);
  const q = queueFor(prefix);
  await waitFor(async () => (await q.getWorkersCount()) > 0, 10_000, 'the worker to be listed');
  return w;
}

/** A processor that finishes only when the test opens its gate. */
function gatedProcessor(): Processor {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  gates.push(open);
  return async () => {
    await gate;
    return { status: 'succeeded' };
  };
}

async function stateOf(queue: Queue, id: string): Promise<string | undefined> {
  const job = await Job.fromId(queue, id);
  return job ? job.getState() : undefined;
}

/** The URL of the test Redis with a user and password in it (the password is what must never show). */
function urlWithPassword(): { url: string; password: string } {
  const u = new URL(redisUrl());
  if (!u.password) {
    u.username = 'default'; // Redis 6+: the default user without a password accepts any
    u.password = 'pw-never-printed-7f3a';
  }
  return { url: u.toString(), password: decodeURIComponent(u.password) };
}

/** What a user reads must hold no library text of BullMQ or ioredis and no stack frame. */
function expectOurWords(text: string): void {
  expect(text).not.toMatch(/^\s+at /m);
  expect(text).not.toMatch(/timed out before finishing|Job wait|no finish notification|ECONNREFUSED|Command timed out|Connection is closed|ioredis|maxRetriesPerRequest/);
}

/** Listens on a free port of 127.0.0.1, tracking connections so the server can be stopped; returns the port. */
async function listen(srv: net.Server): Promise<number> {
  const sockets = new Set<net.Socket>();
  srv.on('connection', (sock) => {
    sockets.add(sock);
    sock.on('error', () => {});
    sock.on('close', () => sockets.delete(sock));
  });
  stoppers.push(() => {
    for (const sock of sockets) sock.destroy();
    return new Promise<void>((resolve) => srv.close(() => resolve()));
  });
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  return (srv.address() as net.AddressInfo).port;
}

/** A TCP server on 127.0.0.1 that accepts connections and never answers. */
async function silentServer(): Promise<number> {
  return listen(net.createServer((socket) => socket.on('data', () => {})));
}

/**
 * A TCP proxy on 127.0.0.1 to the test Redis; `silence()` cuts every connection's traffic from
 * then on (a Redis that stops answering) and keeps accepting connections that go nowhere.
 */
async function redisProxy(): Promise<{ port: number; silence(): void }> {
  const target = new URL(redisUrl());
  let silent = false;
  const pairs: [net.Socket, net.Socket][] = [];
  const srv = net.createServer((client) => {
    if (silent) return;
    const up = net.connect(Number(target.port || 6379), target.hostname);
    up.on('error', () => {});
    client.pipe(up);
    up.pipe(client);
    pairs.push([client, up]);
  });
  const port = await listen(srv);
  const silence = () => {
    silent = true;
    for (const [client, up] of pairs) {
      client.unpipe(up);
      up.unpipe(client);
      up.destroy();
    }
  };
  return { port, silence };
}

beforeAll(assertBuilt);

afterEach(async () => {
  await killLeftovers();
  for (const open of gates.splice(0)) open();
  await Promise.allSettled(workers.splice(0).map((w) => within(w.close(), 10_000, 'closing a worker')));
  await Promise.allSettled(queues.splice(0).map((q) => within(q.close(), 5_000, 'closing a queue')));
  await Promise.allSettled(stoppers.splice(0).map((stop) => within(stop(), 5_000, 'stopping a TCP server')));
});

afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
});

describe('enqueue --wait without a worker', () => {
  it('exits 3 at once with one line naming the prefix, the masked Redis URL and convo-mirror daemon; the job stays queued', async () => {
    const prefix = prefixes.next();
    const { url, password } = urlWithPassword();
    const r = await run(['enqueue', '--wait'], cliEnvFor(prefix, url), 30_000);
    expect(r.code, r.stderr).toBe(3);
    const id = r.stdout.trim();
    expect(id).toMatch(/^\S+$/);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toMatch(/^convo-mirror: no worker serves queue prefix /);
    expect(lines[0]).toContain(`"${prefix}"`);
    expect(lines[0]).toContain(`redis://***@${new URL(url).host}`);
    expect(lines[0]).toContain(`job ${id} (waiting) stays queued`);
    expect(lines[0]).toContain('start convo-mirror daemon with the same REDIS_URL and CONVO_MIRROR_QUEUE_PREFIX');
    expect(r.stderr).not.toContain(password);
    expectOurWords(r.stderr);
    expect(await stateOf(queueFor(prefix), id)).toBe('waiting');
  });

  it('a worker that goes away mid-wait: exit 3 naming the job and its state', async () => {
    const prefix = prefixes.next();
    const queue = queueFor(prefix);
    const worker = await startWorker(prefix, gatedProcessor());
    const child = start(['enqueue', '--wait'], cliEnvFor(prefix), 40_000);
    await waitFor(() => child.stdout.trim() !== '', 10_000, 'the job id');
    const id = child.stdout.trim();
    await waitFor(async () => (await stateOf(queue, id)) === 'active', 10_000, 'the job to be active');
    await worker.close(true); // gone, its job still active (its lock not expired)
    const r = await child.done;
    expect(r.code, r.stderr).toBe(3);
    expect(r.stderr).toContain(`no worker serves queue prefix "${prefix}"`);
    expect(r.stderr).toContain(`job ${id} (active) stays queued`);
    expect(r.stderr).toContain('convo-mirror daemon');
    expectOurWords(r.stderr);
  });
});

describe('enqueue --wait with a worker', () => {
  it('exits 0 when the worker completes the jobs (a workspace job, then two conversations)', async () => {
    const prefix = prefixes.next();
    const queue = queueFor(prefix);
    await startWorker(prefix, async () => ({ status: 'succeeded' }));
    const ws = await run(['enqueue', '--wait', '--timeout', '20000'], cliEnvFor(prefix), 30_000);
    expect(ws.code, ws.stderr).toBe(0);
    const id = ws.stdout.trim();
    expect(ws.stderr).toBe(`job ${id}: completed\n`);
    expect(await stateOf(queue, id)).toBe('completed');

    const convs = await run(['enqueue', '--conversation', 'c-1', '--conversation', 'c-2', '--wait', '--timeout', '20000'], cliEnvFor(prefix), 30_000);
    expect(convs.code, convs.stderr).toBe(0);
    const ids = convs.stdout.trim().split('\n');
    expect(ids).toHaveLength(2);
    expect(convs.stderr).toBe(ids.map((i) => `job ${i}: completed\n`).join(''));
  });

  it('--timeout 1500 with a worker that never finishes: exit 3 naming each job and its state, not BullMQ text', async () => {
    const prefix = prefixes.next();
    const queue = queueFor(prefix);
    await startWorker(prefix, gatedProcessor(), 1); // one at a time: the first active, the second waiting
    const r = await run(['enqueue', '--conversation', 'c-1', '--conversation', 'c-2', '--wait', '--timeout', '1500'], cliEnvFor(prefix), 30_000);
    expect(r.code, r.stderr).toBe(3);
    const [first, second] = r.stdout.trim().split('\n');
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toBe(`convo-mirror: gave up waiting after 1500 ms (--timeout): job ${first} (active) and job ${second} (waiting) stay queued, not finished; convo-mirror status shows the queue`);
    expectOurWords(r.stderr);
    expect(await stateOf(queue, first!)).toBe('active');
    expect(await stateOf(queue, second!)).toBe('waiting');
  });

  it('documents the --timeout default in its help', async () => {
    const r = await run(['enqueue', '--help'], cliEnvFor(prefixes.next()));
    expect(r.code).toBe(0);
    expect(r.stdout.replace(/\s+/g, ' ')).toContain('--timeout <ms> with --wait, give up after this long, ms (default 600000, 10 minutes)');
  });
});

describe('enqueue --wait against a Redis that does not answer', () => {
  it('accepting connections but never answering: exit 2 within a few seconds, one line naming REDIS_URL, password masked', async () => {
    const port = await silentServer();
    const password = 'pw-silent-never-printed';
    const r = await run(['enqueue', '--wait'], cliEnvFor(prefixes.next(), `redis://default:${password}@127.0.0.1:${port}/0`), 30_000);
    expect(r.code, r.stderr).toBe(2);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toBe(`convo-mirror: configuration error: REDIS_URL: cannot reach Redis at redis://***@127.0.0.1:${port}/0: no answer within 3 s; start Redis there or set REDIS_URL`);
    expect(r.stdout).toBe('');
  });

  it('stopping to answer mid-wait: exit 2 within a few seconds, one line naming REDIS_URL', async () => {
    const prefix = prefixes.next();
    const queue = queueFor(prefix);
    await startWorker(prefix, gatedProcessor());
    const proxy = await redisProxy();
    // Through the proxy to the same database the worker watches (REDIS_URL=…/5 included).
    const viaProxy = redisUrlVia(proxy.port);
    const child = start(['enqueue', '--wait'], cliEnvFor(prefix, viaProxy), 40_000);
    await waitFor(() => child.stdout.trim() !== '', 10_000, 'the job id');
    await waitFor(async () => (await stateOf(queue, child.stdout.trim())) === 'active', 10_000, 'the job to be active');
    proxy.silence();
    const r = await child.done;
    expect(r.code, r.stderr).toBe(2);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    // The URL shown is the proxy's, with its database (and its password masked, if REDIS_URL has one).
    expect(lines[0]!.startsWith(`convo-mirror: configuration error: REDIS_URL: Redis at ${redisShown(viaProxy)} stopped answering: `), lines[0]).toBe(true);
    expectOurWords(r.stderr);
  });

  it('refusing connections: exit 2, one line naming REDIS_URL, no library text', async () => {
    const port = await closedPort();
    const r = await run(['enqueue', '--wait'], cliEnvFor(prefixes.next(), `redis://127.0.0.1:${port}`), 30_000);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toBe(`convo-mirror: configuration error: REDIS_URL: cannot reach Redis at redis://127.0.0.1:${port}/0: connection refused; start Redis there or set REDIS_URL\n`);
    expectOurWords(r.stderr);
  });
});
