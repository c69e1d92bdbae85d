/**
 * The queue dashboard (jobs/dashboard.ts): bull-board under /admin/queues behind basic auth, over
 * real HTTP with a real BullMQ queue on the test run's Redis: the page, its assets and its JSON API
 * refuse missing or wrong credentials (401 with a Basic challenge) and answer the right ones; the API
 * lists the queue's jobs; it is read-only; routes outside it are untouched; without the plugin it
 * does not exist; the password never reaches the log. While its Redis (a redis-server of this file's
 * own, test/own-redis.ts) is stopped, the page and the API answer 503 with the reason at once and
 * the assets still load; an API request whose Redis does not answer (CLIENT PAUSE) gets 503 after
 * `answerWithinMs`; once Redis is back it answers 200 again. Also the daemon wiring: with
 * CONVO_MIRROR_ADMIN_PASSWORD the BullMQ daemon serves it, without it 404.
 */
import { Writable } from 'node:stream';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import pino from 'pino';
import type { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { dashboardPlugin } from '../jobs/dashboard.js';
import { enqueueConversation, enqueueErase, enqueueWorkspace, openQueue } from '../jobs/queue.js';
import { redisShown } from '../config/redis-url.js';
import { RedisLink } from '../jobs/redis-link.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { Metrics, startServer, type RunningServer } from '../src/server/index.js';
import { ACCOUNT_ID } from './helpers.js';
import { daemonFixtures } from './daemon-fixtures.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { closeOwnRedis, ownRedis } from './own-redis.js';
import { waitFor } from './children.js';

const PASSWORD = 'correct-horse-battery-staple';
const prefixes = prefixSequence('dashboard');
const servers: RunningServer[] = [];
const queues: Queue[] = [];
const fx = daemonFixtures('dashboard-daemon');
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
  await Promise.all(queues.splice(0).map((q) => q.close()));
  await fx.afterEachTest();
});
afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  await fx.afterAllTests();
  await closeOwnRedis();
});

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

/** A server with the dashboard over a fresh queue holding two waiting jobs; the log captured. */
async function serve(withDashboard = true, o: { url?: string; answerWithinMs?: number } = {}) {
  const url = o.url ?? redisUrl();
  const queue = openQueue({ redisUrl: url, prefix: prefixes.next() });
  queues.push(queue);
  const link = new RedisLink(queue.getBackend().client, redisShown(url));
  await link.connected;
  const policy = { attempts: 1 };
  const ids = [await enqueueConversation(queue, 'conv-1', { accountId: ACCOUNT_ID, policy }), await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy })];
  let log = '';
  const logger = pino({ level: 'debug' }, new Writable({ write: (c, _e, cb) => ((log += String(c)), cb()) }));
  const server = await startServer(
    { logger, metrics: new Metrics({ processMetrics: false }), checks: [], ...(withDashboard ? { plugins: [dashboardPlugin({ queue, link, password: PASSWORD, logger, answerWithinMs: o.answerWithinMs })] } : {}) },
    { host: '127.0.0.1', port: 0 },
  );
  servers.push(server);
  return { server, queue, ids, log: () => log };
}

describe('the queue dashboard', () => {
  it('refuses missing, wrong-password and wrong-user credentials with a Basic challenge, on the page and on its API', async () => {
    const { server, log } = await serve();
    for (const path of ['/admin/queues', '/admin/queues/api/queues']) {
      for (const auth of [undefined, basic('admin', 'wrong-password-123'), basic('root', PASSWORD)]) {
        const res = await fetch(`${server.url}${path}`, { headers: auth ? { authorization: auth } : {} });
        expect(res.status, `${path} with ${auth ?? 'no credentials'}`).toBe(401);
        expect(res.headers.get('www-authenticate')).toMatch(/^Basic realm="convo-mirror"/);
        await res.body?.cancel();
      }
    }
    expect(log()).toContain('dashboard: refused credentials');
    expect(log()).not.toContain(PASSWORD);
    expect(log()).not.toContain('wrong-password-123');
  });

  it('with the right credentials: the page, its assets, and the queue API listing the waiting jobs; read-only', async () => {
    const { server, ids, queue } = await serve();
    const headers = { authorization: basic('admin', PASSWORD) };
    const page = await fetch(`${server.url}/admin/queues`, { headers });
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/text\/html/);
    const html = await page.text();
    // An asset the page loads also requires the credentials.
    // Assets are relative to the page's <base href="/admin/queues/">.
    expect(html).toContain('<base href="/admin/queues/"');
    const asset = html.match(/(?:src|href)="((?:\/admin\/queues\/)?static\/[^"]+\.css)"/)?.[1];
    expect(asset, 'a static asset referenced by the page').toBeTruthy();
    const assetUrl = new URL(asset!, `${server.url}/admin/queues/`).toString();
    expect((await fetch(assetUrl)).status).toBe(401);
    const got = await fetch(assetUrl, { headers });
    expect(got.status).toBe(200);
    await got.body?.cancel();

    const api = await fetch(`${server.url}/admin/queues/api/queues?activeQueue=${encodeURIComponent(queue.name)}&status=waiting&page=1`, { headers });
    expect(api.status).toBe(200);
    const body = (await api.json()) as { queues: { name: string; readOnlyMode: boolean; counts: Record<string, number>; jobs: { id: string }[] }[] };
    const q = body.queues.find((x) => x.name === queue.name)!;
    expect(q, 'the queue listed').toBeTruthy();
    expect(q.readOnlyMode).toBe(true);
    expect(q.counts.waiting).toBe(2);
    expect(q.jobs.map((j) => j.id).sort()).toEqual([...ids].sort());
    // Read-only: an action is refused and changes nothing.
    const clean = await fetch(`${server.url}/admin/queues/api/queues/${encodeURIComponent(queue.name)}/empty`, { method: 'PUT', headers });
    expect(clean.status).toBeGreaterThanOrEqual(400);
    await clean.body?.cancel();
    expect(await queue.getWaitingCount()).toBe(2);
  });

  it("never shows a waiting erase job's subject (personal data), only that it is hidden", async () => {
    const { server, queue } = await serve();
    const subject = 'cus_dashboard_subject';
    const id = await enqueueErase(queue, { accountId: ACCOUNT_ID, kind: 'sender', subject, reason: 'DSR-9' }, { attempts: 1 });
    const headers = { authorization: basic('admin', PASSWORD) };
    const api = await fetch(`${server.url}/admin/queues/api/queues?activeQueue=${encodeURIComponent(queue.name)}&status=waiting&page=1`, { headers });
    expect(api.status).toBe(200);
    const text = await api.text();
    expect(text).not.toContain(subject);
    const body = JSON.parse(text) as { queues: { name: string; jobs: { id: string; data: Record<string, unknown> }[] }[] };
    const job = body.queues.find((x) => x.name === queue.name)!.jobs.find((j) => j.id === id)!;
    expect(job.data).toEqual({ accountId: ACCOUNT_ID, kind: 'sender', subject: '(hidden: the erasure subject is personal data)', reason: 'DSR-9' });
    const one = await fetch(`${server.url}/admin/queues/api/queues/${encodeURIComponent(queue.name)}/${id}`, { headers });
    expect(await one.text()).not.toContain(subject);
    expect((await queue.getJob(id))!.data.subject).toBe(subject); // the job itself still has it
  });

  it('leaves the other routes alone, and does not exist without the plugin', async () => {
    const { server } = await serve();
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    const bare = await serve(false);
    const res = await fetch(`${bare.server.url}/admin/queues`, { headers: { authorization: basic('admin', PASSWORD) } });
    expect(res.status).toBe(404);
  });

  it('while its Redis is stopped: the page and the API answer 503 with the reason at once, the assets still load; a Redis that does not answer gets 503 after answerWithinMs; 200 again once it is back', async () => {
    const redis = await ownRedis();
    const { server, queue } = await serve(true, { url: redis.url, answerWithinMs: 300 });
    const headers = { authorization: basic('admin', PASSWORD) };
    const api = `${server.url}/admin/queues/api/queues?activeQueue=${encodeURIComponent(queue.name)}&status=waiting&page=1`;
    const html = await (await fetch(`${server.url}/admin/queues`, { headers })).text();
    const asset = new URL(html.match(/(?:src|href)="((?:\/admin\/queues\/)?static\/[^"]+\.css)"/)![1]!, `${server.url}/admin/queues/`).toString();
    expect((await fetch(api, { headers })).status).toBe(200);

    // Redis stops answering (every client paused): the API answers 503 after 300 ms, not when Redis does.
    const admin = new Redis(redis.url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    admin.on('error', () => {});
    await admin.connect();
    await admin.call('CLIENT', 'PAUSE', '3000', 'ALL');
    admin.disconnect();
    const paused = await fetch(api, { headers, signal: AbortSignal.timeout(5_000) });
    expect(paused.status).toBe(503);
    expect(await paused.json()).toEqual({ error: `the queue dashboard needs Redis: Redis at ${redisShown(redis.url)} did not answer within 0.3 s` });

    await redis.stop();
    const why = `the queue dashboard needs Redis: Redis at ${redisShown(redis.url)} is not connected (`;
    await waitFor(async () => (await fetch(api, { headers, signal: AbortSignal.timeout(5_000) })).status === 503, 5_000, 'the API to answer 503', 50);
    for (const url of [api, `${server.url}/admin/queues`]) {
      const res = await fetch(url, { headers, signal: AbortSignal.timeout(5_000) });
      expect(res.status, url).toBe(503);
      expect(((await res.json()) as { error: string }).error, url).toContain(why);
    }
    // Credentials first, still; the assets do not need Redis.
    expect((await fetch(api, { signal: AbortSignal.timeout(5_000) })).status).toBe(401);
    const css = await fetch(asset, { headers, signal: AbortSignal.timeout(5_000) });
    expect(css.status).toBe(200);
    await css.body?.cancel();

    await redis.start();
    await waitFor(async () => (await fetch(api, { headers, signal: AbortSignal.timeout(5_000) })).status === 200, 10_000, 'the API to answer 200 again', 50);
    const back = (await (await fetch(api, { headers })).json()) as { queues: { name: string; counts: Record<string, number> }[] };
    expect(back.queues.find((q) => q.name === queue.name)!.counts.waiting, 'the jobs kept across the restart').toBe(2);
  });

  it('the BullMQ daemon serves it with CONVO_MIRROR_ADMIN_PASSWORD, and answers 404 without', async () => {
    const fake = await fx.fakeApi(FakeWorkspace.fromCounts([2]));
    const withPw = await fx.startDaemon(fx.daemonConfig(fake, fx.prefix(), { CONVO_MIRROR_ADMIN_PASSWORD: PASSWORD }), { http: true });
    expect((await fetch(`${withPw.url}/admin/queues`)).status).toBe(401);
    const ok = await fetch(`${withPw.url}/admin/queues/api/queues`, { headers: { authorization: basic('admin', PASSWORD) } });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { queues: { name: string }[] }).queues.map((q) => q.name)).toEqual(['sync']);
    const without = await fx.startDaemon(fx.daemonConfig(fake, fx.prefix()), { http: true });
    expect((await fetch(`${without.url}/admin/queues`, { headers: { authorization: basic('admin', PASSWORD) } })).status).toBe(404);
  });
});
