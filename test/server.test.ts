/**
 * The daemon's HTTP server (src/server/): `/healthz`, `/readyz`, `/metrics` over real HTTP; the
 * Metrics module on its own; the client's `onAttempt` hook against the fake; and the daemon in this
 * process (runDaemon, real Redis, the real fake API): the request counter equal to the fake's
 * request log after a run with a retried 503, `/readyz` going 503 while a Redis of this test's own
 * is stopped and 200 once it is back, 127.0.0.1 by default, a taken port refused, port 0 = off, and
 * the CLI's `--http-port`.
 *
 * Daemons here listen on a port the OS picks (`httpListen: { port: 0 }`, a test option of
 * runDaemon; `CONVO_MIRROR_HTTP_PORT=0` means "no server"), or, for the CLI, on a port found free
 * just before.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import os from 'node:os';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { register as globalRegister } from 'prom-client';
import { loadConfig, type Config } from '../config/index.js';
import { runDaemon, type DaemonExit, type DaemonOptions } from '../jobs/daemon.js';
import { enqueueWorkspace, openQueue } from '../jobs/queue.js';
import { ApiClient, type AttemptEvent } from '../src/api/client.js';
import { ConfigError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi } from '../src/fake-api/index.js';
import type { RunSummary } from '../src/run/index.js';
import { Metrics, readiness, startServer, type RunningServer } from '../src/server/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, quietLogger, tempDir } from './helpers.js';
import { killLeftovers, start, waitFor, within } from './children.js';
import { daemonFixtures, messagesPath, waitForJob } from './daemon-fixtures.js';
import { redisUrl } from './redis.js';

// ------------------------------------------------------------------ a tiny Prometheus text parser

/** One sample of the text exposition format. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses Prometheus text exposition 0.0.4: samples, and the `# TYPE` of each family. */
function parseProm(text: string): { samples: Sample[]; types: Map<string, string> } {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const type = line.match(/^# TYPE (\S+) (\S+)$/);
    if (type) types.set(type[1]!, type[2]!);
    if (line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$/);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/g)) {
      labels[l[1]!] = l[2]!.replace(/\\n/g, '\n').replace(/\\(["\\])/g, '$1');
    }
    const raw = m[3]!;
    samples.push({ name: m[1]!, labels, value: raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : Number(raw) });
  }
  return { samples, types };
}

/** Samples named `name` whose labels include `labels`. */
function find(samples: Sample[], name: string, labels: Record<string, string> = {}): Sample[] {
  return samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
}

/** The one value of `name{labels}`; fails when there is not exactly one. */
function value(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  const found = find(samples, name, labels);
  expect(found, `${name}${JSON.stringify(labels)}`).toHaveLength(1);
  return found[0]!.value;
}

const sum = (samples: Sample[]) => samples.reduce((n, s) => n + s.value, 0);

// ------------------------------------------------------------------ fixtures

const fx = daemonFixtures('server');
const servers: RunningServer[] = [];
const daemons: { stop(): Promise<DaemonExit> }[] = [];
const redisChildren: ChildProcess[] = [];

afterEach(async () => {
  await Promise.allSettled(daemons.splice(0).map((d) => d.stop()));
  await Promise.allSettled(servers.splice(0).map((s) => s.close()));
  await Promise.allSettled(redisChildren.splice(0).map((c) => stopChild(c)));
  await fx.afterEachTest();
  await killLeftovers();
});
afterAll(fx.afterAllTests);

/** A port that was free on 127.0.0.1 a moment ago. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

/** Starts runDaemon in this process with `opts`; resolves with the URL its HTTP server listens on (bounded). */
async function startHttpDaemon(
  config: Config,
  opts: Pick<DaemonOptions, 'httpListen'> = { httpListen: { port: 0 } },
  stopWithinMs = 15_000,
): Promise<{ url: string | undefined; stop(): Promise<DaemonExit> }> {
  let release!: () => void;
  const stop = new Promise<void>((r) => (release = r));
  let onReady!: (r: { httpUrl: string | undefined }) => void;
  const ready = new Promise<{ httpUrl: string | undefined }>((r) => (onReady = r));
  const done = runDaemon({ config, logger: quietLogger(), stop, onReady, ...opts });
  let stopped: Promise<DaemonExit> | undefined;
  const d = { stop: () => (stopped ??= (release(), within(done, stopWithinMs, 'daemon shutdown'))) };
  daemons.push(d);
  const failedEarly = done.then(() => Promise.reject(new Error('daemon ended before it was ready')));
  const { httpUrl } = await within(Promise.race([ready, failedEarly]), 15_000, 'daemon startup');
  return { url: httpUrl, stop: d.stop };
}

async function get(url: string): Promise<{ status: number; type: string | null; text: string }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(5_000) });
  return { status: res.status, type: res.headers.get('content-type'), text: await res.text() };
}

/** A redis-server of this test's own on `port` (no persistence), answering PING (bounded). */
async function spawnRedis(port: number): Promise<ChildProcess> {
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', os.tmpdir()], { stdio: 'ignore' });
  redisChildren.push(child);
  await waitFor(
    () =>
      new Promise<boolean>((resolve) => {
        const s = net.connect(port, '127.0.0.1', () => {
          s.write('PING\r\n');
        });
        s.once('data', (d) => {
          s.destroy();
          resolve(d.toString().startsWith('+PONG'));
        });
        s.once('error', () => resolve(false));
      }),
    10_000,
    `redis-server on port ${port}`,
    50,
  );
  return child;
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return within(
    new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
    }),
    5_000,
    'stopping redis-server',
  );
}

function summary(over: Partial<RunSummary> = {}): RunSummary {
  return {
    runId: 1,
    scope: 'workspace',
    refresh: 'incremental',
    trigger: 'schedule',
    status: 'succeeded',
    durationMs: 2_500,
    listPasses: 1,
    listConfirmed: true,
    conversations: { listed: 3, synced: 2, deleted: 0, failed: 1, inserted: 3, updated: 0, notSynced: 0 },
    messages: { served: 10, inserted: 7, updated: 2, deleted: 1, restarts: 0 },
    requests: 5,
    retries: 1,
    rateLimited: 0,
    minimumRequests: 4,
    export: { files: 1, lines: 10, watermark: 10, resumed: false },
    failures: [],
    ...over,
  };
}

// ------------------------------------------------------------------ Metrics

describe('Metrics', () => {
  it('counts attempts by account and status (no status = "error"), retries and 429s, in a registry of its own', async () => {
    const m = new Metrics({ processMetrics: false });
    m.onResponse('a', 200, false, false);
    m.onResponse('a', 503, false, false);
    m.onResponse('a', 200, true, false);
    m.onResponse('a', undefined, true, false);
    m.onResponse('b', 429, false, true);
    const { samples, types } = parseProm(await m.render());
    expect(value(samples, 'convo_mirror_api_requests_total', { account_id: 'a', status: '200' })).toBe(2);
    expect(value(samples, 'convo_mirror_api_requests_total', { account_id: 'a', status: '503' })).toBe(1);
    expect(value(samples, 'convo_mirror_api_requests_total', { account_id: 'a', status: 'error' })).toBe(1);
    expect(value(samples, 'convo_mirror_api_requests_total', { account_id: 'b', status: '429' })).toBe(1);
    expect(value(samples, 'convo_mirror_api_retries_total', { account_id: 'a' })).toBe(2);
    expect(value(samples, 'convo_mirror_api_rate_limited_total', { account_id: 'b' })).toBe(1);
    expect(find(samples, 'convo_mirror_api_rate_limited_total', { account_id: 'a' })).toEqual([]);
    expect(types.get('convo_mirror_api_requests_total')).toBe('counter');
    // Nothing leaks into prom-client's global registry.
    expect(await globalRegister.metrics()).not.toContain('convo_mirror_');
  });

  it('records a finished run: messages by op, failed conversations, status, duration histogram, last success time', async () => {
    const m = new Metrics({ processMetrics: false, now: () => 1_700_000_000_000 });
    m.onRunFinished(summary(), 'acc');
    m.onRunFinished(summary({ runId: 2, status: 'failed', refresh: 'full', durationMs: 90_000, messages: { served: 0, inserted: 1, updated: 0, deleted: 0, restarts: 0 } }), 'acc');
    const { samples, types } = parseProm(await m.render());
    expect(value(samples, 'convo_mirror_messages_total', { account_id: 'acc', op: 'insert' })).toBe(8);
    expect(value(samples, 'convo_mirror_messages_total', { account_id: 'acc', op: 'update' })).toBe(2);
    expect(value(samples, 'convo_mirror_messages_total', { account_id: 'acc', op: 'delete' })).toBe(1);
    expect(value(samples, 'convo_mirror_conversations_failed_total', { account_id: 'acc' })).toBe(2);
    expect(value(samples, 'convo_mirror_runs_total', { account_id: 'acc', status: 'succeeded' })).toBe(1);
    expect(value(samples, 'convo_mirror_runs_total', { account_id: 'acc', status: 'failed' })).toBe(1);
    expect(types.get('convo_mirror_run_duration_seconds')).toBe('histogram');
    expect(value(samples, 'convo_mirror_run_duration_seconds_count', { account_id: 'acc', refresh: 'incremental' })).toBe(1);
    expect(value(samples, 'convo_mirror_run_duration_seconds_sum', { account_id: 'acc', refresh: 'incremental' })).toBe(2.5);
    expect(value(samples, 'convo_mirror_run_duration_seconds_bucket', { account_id: 'acc', refresh: 'full', le: '60' })).toBe(0);
    expect(value(samples, 'convo_mirror_run_duration_seconds_bucket', { account_id: 'acc', refresh: 'full', le: '120' })).toBe(1);
    // Only the succeeded run sets it.
    expect(value(samples, 'convo_mirror_last_success_timestamp_seconds', { account_id: 'acc' })).toBe(1_700_000_000);
  });

  it('counts a run reported twice (a retried finish step) once', async () => {
    const m = new Metrics({ processMetrics: false });
    m.onRunFinished(summary({ runId: 7 }), 'acc');
    m.onRunFinished(summary({ runId: 7 }), 'acc');
    const { samples } = parseProm(await m.render());
    expect(value(samples, 'convo_mirror_runs_total', { account_id: 'acc', status: 'succeeded' })).toBe(1);
    expect(value(samples, 'convo_mirror_messages_total', { account_id: 'acc', op: 'insert' })).toBe(summary().messages.inserted);
  });

  it('reads the export lag and the queue at scrape time; a source that throws (NaN) or hangs (no sample) counts a collect error', async () => {
    let lag = 5;
    const m = new Metrics({ processMetrics: false, exportLag: () => ({ changes: lag, runLines: 3 }), queueJobCounts: async () => ({ waiting: 2, active: 1, failed: 0 }) });
    let p = parseProm(await m.render()).samples;
    expect(value(p, 'convo_mirror_export_lag_changes')).toBe(5);
    expect(value(p, 'convo_mirror_export_held_run_lines')).toBe(3);
    expect(value(p, 'convo_mirror_queue_jobs', { state: 'waiting' })).toBe(2);
    expect(value(p, 'convo_mirror_queue_jobs', { state: 'active' })).toBe(1);
    lag = 0;
    expect(value(parseProm(await m.render()).samples, 'convo_mirror_export_lag_changes')).toBe(0);

    const broken = new Metrics({
      processMetrics: false,
      exportLag: () => {
        throw new Error('mirror closed');
      },
      queueJobCounts: () => new Promise(() => {}), // never answers
      collectTimeoutMs: 50,
    });
    p = parseProm(await within(broken.render(), 5_000, 'a scrape with a hung source')).samples;
    expect(value(p, 'convo_mirror_export_lag_changes')).toBeNaN();
    expect(value(p, 'convo_mirror_export_held_run_lines')).toBeNaN();
    expect(find(p, 'convo_mirror_queue_jobs')).toEqual([]);
    expect(value(p, 'convo_mirror_collect_errors_total', { collector: 'export_lag' })).toBe(1);
    expect(value(p, 'convo_mirror_collect_errors_total', { collector: 'queue_jobs' })).toBe(1);
  });

  it('includes the default process metrics', async () => {
    const { samples } = parseProm(await new Metrics().render());
    for (const name of ['process_cpu_user_seconds_total', 'process_start_time_seconds', 'nodejs_heap_size_used_bytes', 'nodejs_eventloop_lag_seconds']) {
      expect(find(samples, name).length, name).toBeGreaterThan(0);
    }
  });
});

// ------------------------------------------------------------------ ApiClient.onAttempt

describe('ApiClient onAttempt', () => {
  it('is called once per attempt sent, with its status (none for a dropped connection) and whether it is a retry', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([3]), apiKey: API_KEY });
    const events: AttemptEvent[] = [];
    const api = new ApiClient({ baseUrl: fake.url, apiKey: API_KEY, maxRps: 0, maxRetries: 4, backoff: { baseMs: 5, maxMs: 20 }, onAttempt: (e) => events.push(e) });
    try {
      fake.injectFault({ kind: 'status', status: 503, match: { path: '/v1/conversations' } });
      fake.injectFault({ kind: 'drop', match: { path: '/v1/conversations' } });
      const pages = [];
      for await (const page of api.conversations()) pages.push(page);
      expect(pages).toHaveLength(1);
      expect(events).toEqual([
        { status: 503, retry: false },
        { status: undefined, retry: true },
        { status: 200, retry: true },
      ]);
      expect(events).toHaveLength(fake.requests.length);
      expect(events).toHaveLength(api.stats.requests);
    } finally {
      await api.close();
      await fake.close();
    }
  });

  it('a hook that throws never fails a request', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY });
    const api = new ApiClient({ baseUrl: fake.url, apiKey: API_KEY, maxRps: 0, onAttempt: () => { throw new Error('observer bug'); } });
    try {
      const pages = [];
      for await (const page of api.conversations()) pages.push(page);
      expect(pages).toHaveLength(1);
    } finally {
      await api.close();
      await fake.close();
    }
  });
});

// ------------------------------------------------------------------ the server on its own

describe('HTTP server', () => {
  async function server(checks: Parameters<typeof startServer>[0]['checks'], checkTimeoutMs?: number): Promise<RunningServer> {
    const s = await startServer({ logger: quietLogger(), metrics: new Metrics({ processMetrics: false }), checks, checkTimeoutMs }, { host: '127.0.0.1', port: 0 });
    servers.push(s);
    return s;
  }

  it('/healthz answers 200 {"status":"ok"}; /metrics the text format; other paths 404', async () => {
    const s = await server([]);
    expect(s.host).toBe('127.0.0.1');
    expect(s.url).toBe(`http://127.0.0.1:${s.port}`);
    const health = await get(`${s.url}/healthz`);
    expect(health.status).toBe(200);
    expect(JSON.parse(health.text)).toEqual({ status: 'ok' });
    const metrics = await get(`${s.url}/metrics`);
    expect(metrics.status).toBe(200);
    expect(metrics.type).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(parseProm(metrics.text).types.get('convo_mirror_api_requests_total')).toBe('counter');
    expect((await get(`${s.url}/webhooks/conversations`)).status).toBe(404);
    expect((await get(`${s.url}/admin/queues`)).status).toBe(404);
  });

  it('/readyz: 200 when every check passes; 503 naming each failed check and why (a timeout too), a URL password masked', async () => {
    let redisUp = true;
    const s = await server(
      [
        { name: 'redis', check: () => { if (!redisUp) throw new Error('connect ECONNREFUSED redis://user:s3cret-pw@10.0.0.5:6379'); } },
        { name: 'mirror', check: () => undefined },
      ],
      100,
    );
    let r = await get(`${s.url}/readyz`);
    expect(r.status).toBe(200);
    expect(JSON.parse(r.text)).toEqual({ status: 'ready', checks: { redis: 'ok', mirror: 'ok' } });
    redisUp = false;
    r = await get(`${s.url}/readyz`);
    expect(r.status).toBe(503);
    expect(r.text).not.toContain('s3cret-pw');
    expect(JSON.parse(r.text)).toEqual({
      status: 'unavailable',
      checks: { redis: 'connect ECONNREFUSED redis://***@10.0.0.5:6379', mirror: 'ok' },
      failed: [{ check: 'redis', reason: 'connect ECONNREFUSED redis://***@10.0.0.5:6379' }],
    });
    redisUp = true;
    expect((await get(`${s.url}/readyz`)).status).toBe(200);

    const hung = await readiness([{ name: 'slow', check: () => new Promise(() => {}) }], 50);
    expect(hung).toEqual({ status: 'unavailable', checks: { slow: 'slow check timed out after 50 ms' }, failed: [{ check: 'slow', reason: 'slow check timed out after 50 ms' }] });
  });

  it('close(waitMs): a request in flight that never ends is cut after waitMs instead of holding the close', async () => {
    let arrived!: () => void;
    const inFlight = new Promise<void>((r) => (arrived = r));
    const s = await startServer(
      {
        logger: quietLogger(),
        metrics: new Metrics({ processMetrics: false }),
        checks: [],
        plugins: [
          async (app) =>
            void app.get('/never', () => {
              arrived();
              return new Promise(() => {});
            }),
        ],
      },
      { host: '127.0.0.1', port: 0 },
    );
    const request = fetch(`${s.url}/never`).then(
      () => 'answered',
      () => 'cut',
    );
    await inFlight;
    await within(s.close(200), 5_000, 'close(200) with a request that never ends');
    expect(await request).toBe('cut');
    // Idempotent: a later call shares the first one's close.
    await within(s.close(), 1_000, 'a second close');
  });
});

// ------------------------------------------------------------------ the daemon's server

describe('the daemon serves health, readiness and metrics', () => {
  it('after a run with a retried 503, the request counter equals the fake request log, by status; run figures and gauges are there', async () => {
    const ws = FakeWorkspace.fromCounts([3, 150, 1]);
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const config = fx.daemonConfig(fake, prefix); // CONVO_MIRROR_MAX_RETRIES=1
    const daemon = await startHttpDaemon(config);
    const url = daemon.url!;
    const target = ws.list()[1]!.id;
    fake.injectFault({ kind: 'status', status: 503, match: { path: messagesPath(target), page: 2 }, times: 1 });
    const queue = fx.queueFor(prefix);
    const asked = Date.now() / 1000;
    const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } });
    await waitForJob(queue, id, 'completed', 30_000);

    const { samples, types } = parseProm((await get(`${url}/metrics`)).text);
    const scraped = Date.now() / 1000;
    const account = config.accountId!;
    const requests = find(samples, 'convo_mirror_api_requests_total', { account_id: account });
    expect(sum(requests)).toBe(fake.requests.length);
    const byStatus = new Map<string, number>();
    for (const r of fake.requests) byStatus.set(String(r.status), (byStatus.get(String(r.status)) ?? 0) + 1);
    expect(Object.fromEntries(requests.map((s) => [s.labels.status, s.value]))).toEqual(Object.fromEntries(byStatus));
    expect(byStatus.get('503')).toBe(1);
    expect(value(samples, 'convo_mirror_api_retries_total', { account_id: account })).toBe(1);
    const messages = ws.totals().messages;
    expect(value(samples, 'convo_mirror_messages_total', { account_id: account, op: 'insert' })).toBe(messages);
    expect(value(samples, 'convo_mirror_messages_total', { account_id: account, op: 'update' })).toBe(0);
    expect(value(samples, 'convo_mirror_conversations_failed_total', { account_id: account })).toBe(0);
    expect(value(samples, 'convo_mirror_run_duration_seconds_count', { account_id: account, refresh: 'incremental' })).toBe(1);
    // Set when the run finished: after the job was asked for, before the scrape.
    const lastSuccess = value(samples, 'convo_mirror_last_success_timestamp_seconds', { account_id: account });
    expect(lastSuccess).toBeGreaterThanOrEqual(asked);
    expect(lastSuccess).toBeLessThanOrEqual(scraped);
    expect(value(samples, 'convo_mirror_export_lag_changes')).toBe(0);
    expect(value(samples, 'convo_mirror_queue_jobs', { state: 'completed' })).toBeGreaterThanOrEqual(1);
    expect(value(samples, 'convo_mirror_queue_jobs', { state: 'failed' })).toBe(0);
    expect(types.get('process_cpu_user_seconds_total')).toBe('counter');
    expect(find(samples, 'nodejs_heap_size_used_bytes')).toHaveLength(1);

    expect((await get(`${url}/healthz`)).status).toBe(200);
    expect((await get(`${url}/readyz`)).status).toBe(200);
    await daemon.stop();
    // Closed on shutdown.
    await expect(fetch(`${url}/healthz`, { signal: AbortSignal.timeout(5_000) })).rejects.toThrow();
  });

  it('/readyz goes 503 naming Redis while its Redis is stopped, and 200 once it is back (and jobs run again)', async () => {
    const fake = await fx.fakeApi(FakeWorkspace.fromCounts([1]));
    const port = await freePort();
    const redis = await spawnRedis(port);
    const prefix = fx.prefix();
    const config = fx.daemonConfig(fake, prefix, { REDIS_URL: `redis://127.0.0.1:${port}` });
    const { url, stop } = await startHttpDaemon(config);
    expect((await get(`${url}/readyz`)).status).toBe(200);

    await stopChild(redis);
    let body: { status: string; checks: Record<string, string>; failed?: { check: string; reason: string }[] } | undefined;
    await waitFor(
      async () => {
        const r = await get(`${url}/readyz`);
        body = JSON.parse(r.text);
        return r.status === 503;
      },
      15_000,
      '/readyz to answer 503',
      100,
    );
    expect(body!.status).toBe('unavailable');
    expect(body!.failed!.map((f) => f.check)).toEqual(['redis']);
    expect(body!.failed![0]!.reason).toContain(`127.0.0.1:${port}`);
    expect(body!.checks.mirror).toBe('ok');
    // The process itself still serves.
    expect((await get(`${url}/healthz`)).status).toBe(200);

    await spawnRedis(port); // the same port: the daemon's connections find it again
    await waitFor(async () => (await get(`${url}/readyz`)).status === 200, 15_000, '/readyz to answer 200 again', 100);
    expect(JSON.parse((await get(`${url}/readyz`)).text)).toEqual({ status: 'ready', checks: { redis: 'ok', mirror: 'ok', api: 'ok', daemon: 'ok' } });
    // The daemon works again: a job enqueued on the restarted Redis is processed.
    const queue = openQueue({ redisUrl: `redis://127.0.0.1:${port}`, prefix });
    try {
      const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } });
      await waitForJob(queue, id, 'completed', 30_000);
    } finally {
      await queue.close();
    }
    expect((await stop()).fatal).toBeUndefined();
  });

  it('binds 127.0.0.1 by default (not reachable on another interface); a taken port is refused naming the setting; port 0 = no server', async () => {
    const fake = await fx.fakeApi(FakeWorkspace.fromCounts([1]));
    const defaults = loadConfig({ CONVO_MIRROR_BASE_URL: fake.url, CONVO_MIRROR_API_KEY: API_KEY });
    expect([defaults.httpHost, defaults.httpPort]).toEqual(['127.0.0.1', 9464]);
    const config = fx.daemonConfig(fake, fx.prefix());
    expect(config.httpHost).toBe('127.0.0.1');
    const a = await startHttpDaemon(config);
    const port = Number(new URL(a.url!).port);
    expect(a.url).toBe(`http://127.0.0.1:${port}`);
    const other = Object.values(os.networkInterfaces())
      .flat()
      .find((i) => i && i.family === 'IPv4' && !i.internal);
    if (other) {
      await expect(fetch(`http://${other.address}:${port}/healthz`, { signal: AbortSignal.timeout(5_000) })).rejects.toThrow();
    }
    await a.stop();

    // The same port while something else holds it: startup fails, naming CONVO_MIRROR_HTTP_PORT.
    const holder = net.createServer();
    await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r));
    const taken = (holder.address() as net.AddressInfo).port;
    try {
      const err = await runDaemon({ config: fx.daemonConfig(fake, fx.prefix()), logger: quietLogger(), stop: new Promise(() => {}), httpListen: { port: taken } }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).variable).toBe('CONVO_MIRROR_HTTP_PORT');
      expect((err as Error).message).toContain(`127.0.0.1:${taken} is already in use`);
    } finally {
      await new Promise((r) => holder.close(r));
    }

    // CONVO_MIRROR_HTTP_PORT=0: no server.
    const off = await startHttpDaemon(fx.daemonConfig(fake, fx.prefix(), { CONVO_MIRROR_HTTP_PORT: '0' }), {});
    expect(off.url).toBeUndefined();
  });

  it('convo-mirror daemon --http-port: logs where it listens, serves /healthz, exits 0 on SIGTERM', async () => {
    const fake = await fx.fakeApi(FakeWorkspace.fromCounts([1]));
    const port = await freePort();
    const dir = tempDir('convo-mirror-server-cli-');
    const env = cliEnv(fake, dir, {
      REDIS_URL: redisUrl(),
      CONVO_MIRROR_QUEUE_PREFIX: fx.prefix(),
      CONVO_MIRROR_SCHEDULE: '0 0 1 1 *',
      CONVO_MIRROR_FULL_SCHEDULE: '0 0 1 1 *',
    });
    const d = start(['daemon', '--http-port', String(port)], env, 40_000);
    await waitFor(() => d.stderr.includes('"msg":"daemon ready"') || d.child.exitCode !== null, 15_000, 'the daemon to be ready');
    expect(d.stderr).toContain(`http server listening on http://127.0.0.1:${port}`);
    const health = await get(`http://127.0.0.1:${port}/healthz`);
    expect(health.status).toBe(200);
    d.child.kill('SIGTERM');
    const ran = await d.done;
    expect(ran.code).toBe(0);
    expect(ran.stderr).not.toContain(API_KEY);
  });
});
