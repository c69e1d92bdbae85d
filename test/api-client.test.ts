/**
 * ApiClient against the real in-process fake API (and a few tiny node:http servers for answers the
 * fake cannot give). Real HTTP on 127.0.0.1; nothing of ours is mocked. Waits are asserted on the
 * injected test clock's recorded sleeps; where real waiting matters, on the gaps between arrivals in
 * the fake's request log (lower bounds only), never on measured elapsed time.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { inspect } from 'node:util';
import { getEventListeners } from 'node:events';
import { afterEach, describe, expect, it } from 'vitest';
import { ApiClient, AttemptDeadline, PER_PAGE, newTally, type ApiClientOptions } from '../src/api/client.js';
import { RateLimiter } from '../src/api/rate-limit.js';
import { systemClock } from '../src/clock.js';
import { AuthError, ConfigError, ConvoMirrorError, HttpError, NotFoundError, RateLimitedError, RedirectRefusedError, SchemaError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi, type FakeApiOptions } from '../src/fake-api/index.js';
import { collect, frozenClock, json, rejection, testClock } from './helpers.js';

const API_KEY = 'sk-live-SECRET-9f3a71c2e4';
const ACCOUNT_ID = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';

// ---- harness ---------------------------------------------------------------------------------

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  // Clients first (registered after their server), then servers.
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function fakeApi(workspace: FakeWorkspace, extra: Partial<FakeApiOptions> = {}): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace, apiKey: API_KEY, ...extra });
  cleanups.push(() => fake.close());
  return fake;
}

function client(baseUrl: string, extra: Partial<ApiClientOptions> = {}): ApiClient {
  const api = new ApiClient({
    baseUrl,
    apiKey: API_KEY,
    maxRps: 0,
    backoff: { baseMs: 5, maxMs: 20 },
    ...extra,
  });
  cleanups.push(() => api.close());
  return api;
}

/** Virtual time that moves by each recorded sleep (starts on a whole second, so HTTP-dates are exact). */
const recordingClock = () => testClock({ start: Date.parse('2025-03-04T05:06:07.000Z'), sleep: 'advance' });

interface Tiny {
  url: string;
  /** Request URLs (path + query) in arrival order. */
  hits: string[];
  /** Request headers in arrival order. */
  headers: IncomingMessage['headers'][];
}

/** A minimal node:http server on 127.0.0.1 with a custom handler. */
async function tinyServer(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<Tiny> {
  const hits: string[] = [];
  const headers: IncomingMessage['headers'][] = [];
  const server = createServer((req, res) => {
    hits.push(req.url ?? '');
    headers.push(req.headers);
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  );
  return { url: `http://127.0.0.1:${port}`, hits, headers };
}

const msgPath = (id: string, page = 1): string => `/v1/conversations/${id}/messages?page=${page}&per_page=100`;
const msgRe = (id: string): string => `/v1/conversations/${id}/messages`;

function validMessage(id: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    id,
    content: 'hello',
    visibility: 'global',
    sender: { id: 'cus_1', name: 'Ann', type: 'Customer' },
    created_at: '2025-01-01T00:00:00.000Z',
    ...extra,
  };
}

// ---- tests -----------------------------------------------------------------------------------

describe('ApiClient: headers and per_page', () => {
  it('sends per_page=100, X-Api-Key and X-Account-Id on every request (messages and list)', async () => {
    const ws = FakeWorkspace.fromCounts([250, 3, 0]);
    const fake = await fakeApi(ws, { accountId: ACCOUNT_ID });
    const api = client(fake.url, { accountId: ACCOUNT_ID });
    const conv = ws.list()[0]!;

    const pages = await collect(api.messages(conv.id));
    expect(pages.map((p) => p.data.length)).toEqual([100, 100, 50]);
    const list = await collect(api.conversations());
    expect(list.map((p) => p.data.length)).toEqual([3]);

    expect(PER_PAGE).toBe(100);
    expect(fake.requests).toHaveLength(4);
    for (const r of fake.requests) {
      expect(r.method).toBe('GET');
      expect(r.query['per_page']).toBe('100');
      expect(r.apiKey).toBe(API_KEY);
      expect(r.accountId).toBe(ACCOUNT_ID);
      expect(r.status).toBe(200);
    }
    expect(fake.requests.map((r) => `${r.path}?page=${r.query['page']}`)).toEqual([
      `${msgRe(conv.id)}?page=1`,
      `${msgRe(conv.id)}?page=2`,
      `${msgRe(conv.id)}?page=3`,
      '/v1/conversations?page=1',
    ]);
    expect(api.stats.requests).toBe(4);
    expect(api.stats.retries).toBe(0);
    expect(api.stats.byStatus).toEqual({ 200: 4 });
  });

  it('adds the configured list parameters to every list request (after page and per_page), and to no messages request', async () => {
    const ws = FakeWorkspace.fromCounts(Array.from({ length: 150 }, () => 1));
    const fake = await fakeApi(ws);
    const api = client(fake.url, { listParams: [['sort', 'last_activity_at'], ['order', 'desc'], ['q', 'a b&c']] });
    const list = await collect(api.conversations());
    expect(list.map((p) => p.data.length)).toEqual([100, 50]);
    await collect(api.messages(ws.list()[0]!.id));
    expect(fake.requests.map((r) => [r.path.startsWith('/v1/conversations/') ? 'messages' : 'list', r.query['page'], r.query['sort'], r.query['order'], r.query['q']])).toEqual([
      ['list', '1', 'last_activity_at', 'desc', 'a b&c'],
      ['list', '2', 'last_activity_at', 'desc', 'a b&c'],
      ['messages', '1', undefined, undefined, undefined],
    ]);
  });

  it('sends no X-Account-Id header when no account id is configured', async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    await collect(api.messages(ws.list()[0]!.id));
    await collect(api.conversations());
    expect(fake.requests).toHaveLength(2);
    for (const r of fake.requests) {
      expect(r.apiKey).toBe(API_KEY);
      expect(r.accountId).toBeUndefined();
    }
  });

  it('appends /v1/... to a base URL with a path prefix; error paths stay relative', async () => {
    const tiny = await tinyServer((_req, res) => json(res, 404, { error: { code: 'not_found', message: 'x' } }));
    const api = client(`${tiny.url}/api/`);
    const err = await rejection(api.getJson('/v1/conversations?page=1&per_page=100'));
    expect(tiny.hits).toEqual(['/api/v1/conversations?page=1&per_page=100']);
    expect(err).toBeInstanceOf(NotFoundError);
    expect((err as HttpError).path).toBe('/v1/conversations?page=1&per_page=100');
    expect((err as HttpError).status).toBe(404);
  });
});

describe('ApiClient: pagination', () => {
  it('messages(id) yields ceil(n/100) pages (1 for n=0) with every id in order', async () => {
    const counts = [0, 1, 100, 101];
    const ws = FakeWorkspace.fromCounts(counts);
    const fake = await fakeApi(ws);
    const api = client(fake.url);

    for (const [i, conv] of ws.list().entries()) {
      const n = counts[i]!;
      fake.requests.length = 0;
      const pages = await collect(api.messages(conv.id));
      const expectedPages = Math.max(1, Math.ceil(n / 100));
      expect(pages, `n=${n}`).toHaveLength(expectedPages);
      expect(pages.map((p) => p.page)).toEqual(Array.from({ length: expectedPages }, (_, k) => k + 1));
      expect(pages.flatMap((p) => p.data.map((m) => m.id))).toEqual(conv.messages.map((m) => m.id));
      // raw is the served object, index-aligned with data
      expect(pages.flatMap((p) => p.raw)).toEqual(conv.messages.map((m) => JSON.parse(JSON.stringify(m))));
      for (const p of pages) {
        expect(p.meta.total_count).toBe(n);
        expect(p.meta.total_pages).toBe(Math.ceil(n / 100));
      }
      expect(fake.requests.map((r) => r.query['page'])).toEqual(pages.map((p) => String(p.page)));
    }
  });

  it('messages(id, startPage) starts at that page', async () => {
    const ws = FakeWorkspace.fromCounts([250]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    const conv = ws.list()[0]!;
    const pages = await collect(api.messages(conv.id, 2));
    expect(pages.map((p) => p.page)).toEqual([2, 3]);
    expect(pages.flatMap((p) => p.data.map((m) => m.id))).toEqual(conv.messages.slice(100).map((m) => m.id));
  });

  it('conversations() pages through the whole list in order', async () => {
    const ws = FakeWorkspace.fromCounts(Array.from({ length: 230 }, () => 0));
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    const pages = await collect(api.conversations());
    expect(pages.map((p) => p.data.length)).toEqual([100, 100, 30]);
    expect(pages.flatMap((p) => p.data.map((c) => c.id))).toEqual(ws.list().map((c) => c.id));
    expect(pages.flatMap((p) => p.raw)).toEqual(ws.list().map((c) => c.data));
    expect(fake.requests.map((r) => r.query['page'])).toEqual(['1', '2', '3']);
  });

  it('conversations() of an empty workspace is one empty page', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([]));
    const api = client(fake.url);
    const pages = await collect(api.conversations());
    expect(pages).toHaveLength(1);
    expect(pages[0]!.data).toEqual([]);
    expect(pages[0]!.meta).toEqual({ current_page: 1, total_pages: 0, total_count: 0 });
  });
});

describe('ApiClient: request tallies', () => {
  it('a tally counts attempts, retries, 429s and the records served on pages that parsed', async () => {
    const ws = FakeWorkspace.fromCounts([250, 7]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { clock: frozenClock() });
    const [big] = ws.list();
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '0', match: { path: msgRe(big!.id), page: 2 } });
    const tally = newTally();
    await collect(api.messages(big!.id, 1, tally));
    // 3 pages + 1 retry of page 2; 100 + 100 + 50 messages served.
    expect(tally).toEqual({ requests: 4, retries: 1, rateLimited: 1, served: 250 });
    const list = newTally();
    await collect(api.conversations(1, list));
    expect(list).toEqual({ requests: 1, retries: 0, rateLimited: 0, served: 2 });
    // A page that does not parse serves nothing.
    fake.injectFault({ kind: 'status', status: 200, body: 'not json' });
    const broken = newTally();
    await rejection(collect(api.messages(big!.id, 1, broken)));
    expect(broken).toEqual({ requests: 1, retries: 0, rateLimited: 0, served: 0 });
  });
});

describe('ApiClient: prefetch (first contact ahead of a run)', () => {
  it('the list page 1 prefetched answers the listing: one request, counted in the tally that used it', async () => {
    const ws = FakeWorkspace.fromCounts(Array.from({ length: 150 }, () => 0));
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    const ahead = await api.prefetch();
    expect(ahead.outcome).toBe('page');
    expect(ahead.tally).toEqual({ requests: 1, retries: 0, rateLimited: 0, served: 0 });
    const tally = newTally();
    const pages = await collect(api.conversations(1, tally));
    expect(pages.map((p) => p.data.length)).toEqual([100, 50]);
    expect(fake.requests.map((r) => r.query['page'])).toEqual(['1', '2']);
    expect(tally).toEqual({ requests: 2, retries: 0, rateLimited: 0, served: 150 });
    expect(ahead.release()).toBe(true);
  });

  it('a kept answer serves one request only; released unused, it serves none', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    const id = ws.list()[0]!.id;
    const used = await api.prefetch(id);
    await collect(api.messages(id));
    await collect(api.messages(id));
    expect(fake.requests.map((r) => r.path)).toEqual([`/v1/conversations/${id}/messages`, `/v1/conversations/${id}/messages`]);
    expect(used.release()).toBe(true);
    fake.requests.length = 0;
    const unused = await api.prefetch(id);
    expect(unused.release()).toBe(false);
    expect(unused.release()).toBe(false);
    await collect(api.messages(id));
    expect(fake.requests).toHaveLength(2);
  });

  it('a refused key and a wrong base URL end it at once (AuthError, ConfigError) and keep nothing', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const wrongKey = client(fake.url, { apiKey: 'wrong', failFast: true });
    await expect(wrongKey.prefetch()).rejects.toBeInstanceOf(AuthError);
    const noList = await tinyServer((_req, res) => {
      res.writeHead(404).end();
    });
    const wrongPath = client(noList.url, { failFast: true });
    const err = await rejection(wrongPath.prefetch());
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message).toMatch(/GET \/v1\/conversations\?page=1&per_page=100 answered 404: check that the base URL/);
    // Nothing kept: the listing sends its own request.
    await rejection(collect(wrongPath.conversations()));
    expect(noList.hits).toHaveLength(2);
    const nothing = client('http://127.0.0.1:1', { failFast: true });
    await expect(nothing.prefetch()).rejects.toBeInstanceOf(ConfigError);
  });

  it('a web page or another JSON at the base URL is a ConfigError naming it: the list page 1 is not JSON, or not {data, meta}', async () => {
    const html = await tinyServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>Support portal</title>');
    });
    const a = await rejection(client(html.url, { failFast: true }).prefetch());
    expect(a).toBeInstanceOf(ConfigError);
    expect((a as Error).message).toMatch(/^CONVO_MIRROR_BASE_URL: .*not JSON.*: is the base URL the API's \{base_url\}\?/);
    const other = await tinyServer((_req, res) => json(res, 200, { status: 'ok', version: 3 }));
    const b = await rejection(client(other.url, { failFast: true }).prefetch());
    expect(b).toBeInstanceOf(ConfigError);
    expect((b as Error).message).toBe(
      "CONVO_MIRROR_BASE_URL: GET /v1/conversations?page=1&per_page=100 answered 200 with an object without a data array (spec 4.1's page: {data, meta}): is the base URL the API's {base_url}? (something other than the API answers there)",
    );
    // A conversation's page that is not JSON is that conversation's problem, kept for its crawl.
    const ahead = await client(html.url).prefetch('c-1');
    expect(ahead.outcome).toBe('error');
  });

  it("a conversation's 404 is not-found, and a 503 after retries is an error: both kept for the run's request", async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { maxRetries: 1 });
    const missing = await api.prefetch('no-such-conversation');
    expect(missing.outcome).toBe('not-found');
    expect(await rejection(collect(api.messages('no-such-conversation')))).toBeInstanceOf(NotFoundError);
    expect(fake.requests).toHaveLength(1);
    const id = ws.list()[0]!.id;
    fake.injectFault({ kind: 'status', status: 503, times: 2 });
    const failing = await api.prefetch(id);
    expect(failing.outcome).toBe('error');
    expect(failing.tally).toEqual({ requests: 2, retries: 1, rateLimited: 0, served: 0 });
    const tally = newTally();
    const err = await rejection(collect(api.messages(id, 1, tally)));
    expect(err).toBeInstanceOf(HttpError);
    expect((err as HttpError).status).toBe(503);
    expect(tally).toEqual({ requests: 2, retries: 1, rateLimited: 0, served: 0 });
    expect(fake.requests).toHaveLength(3);
  });

  it('a second prefetch of the same page asks again: an answer a run never took is not served to the next one', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    const id = ws.list()[0]!.id;
    await api.prefetch(id); // never released (a run that failed before its crawl)
    ws.appendMessages(id, 5);
    await api.prefetch(id);
    expect(fake.requests).toHaveLength(2);
    const pages = await collect(api.messages(id));
    expect(pages[0]!.data).toHaveLength(8);
    expect(fake.requests).toHaveLength(2);
  });

  it('an id no request can carry sends nothing', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    const ahead = await api.prefetch('..');
    expect(ahead.outcome).toBe('error');
    expect(ahead.release()).toBe(false);
    expect(fake.requests).toHaveLength(0);
  });
});

describe('ApiClient: Retry-After', () => {
  it('honours Retry-After in seconds (recorded delay 1000 ms)', async () => {
    const ws = FakeWorkspace.fromCounts([5]);
    const fake = await fakeApi(ws);
    const clock = recordingClock();
    const api = client(fake.url, { clock });
    const conv = ws.list()[0]!;
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '1' });

    const pages = await collect(api.messages(conv.id));
    expect(pages[0]!.data).toHaveLength(5);
    expect(clock.sleeps).toEqual([1000]);
    expect(fake.requests.map((r) => r.status)).toEqual([429, 200]);
    expect(api.stats.rateLimited).toBe(1);
    expect(api.stats.retries).toBe(1);
    expect(api.stats.requests).toBe(2);
  });

  it('honours Retry-After as an HTTP-date (recorded delay: the date minus the clock)', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const clock = recordingClock();
    const api = client(fake.url, { clock });
    fake.injectFault({ kind: 'status', status: 429, retryAfter: new Date(clock.now() + 2000).toUTCString() });

    await collect(api.messages(ws.list()[0]!.id));
    expect(clock.sleeps).toEqual([2000]);
  });

  it('honours Retry-After on a 503 too', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const clock = recordingClock();
    const api = client(fake.url, { clock });
    fake.injectFault({ kind: 'status', status: 503, retryAfter: '2' });
    await collect(api.messages(ws.list()[0]!.id));
    expect(clock.sleeps).toEqual([2000]);
    expect(api.stats.rateLimited).toBe(0);
  });

  it('caps a Retry-After larger than maxRetryAfterMs', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const clock = recordingClock();
    const api = client(fake.url, { clock, maxRetryAfterMs: 50 });
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '3600' });
    await collect(api.messages(ws.list()[0]!.id));
    expect(clock.sleeps).toEqual([50]);
  });

  it('really waits a second for Retry-After: 1 on the system clock (gap in the fake\'s log)', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { clock: systemClock });
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '1' });
    const pages = await collect(api.messages(ws.list()[0]!.id));
    expect(pages[0]!.data).toHaveLength(1);
    expect(fake.requests.map((r) => r.status)).toEqual([429, 200]);
    const [first, second] = fake.requests;
    expect(second!.at - first!.at).toBeGreaterThanOrEqual(950);
  });

  it("a 429's Retry-After holds other concurrent requests of the same client", async () => {
    const ws = FakeWorkspace.fromCounts([1, 1]);
    const fake = await fakeApi(ws);
    const [a, b] = ws.list();
    // Real waits, recorded; B starts once A's retry delay has begun (the limiter is paused by then).
    const clock = testClock({ start: Date.now(), sleep: 'real' });
    const realSleep = clock.sleep;
    let signalSleep!: () => void;
    const sleeping = new Promise<void>((resolve) => (signalSleep = resolve));
    clock.sleep = (ms, signal) => {
      const slept = realSleep(ms, signal);
      if (ms >= 500) signalSleep();
      return slept;
    };
    const api = client(fake.url, { clock });
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '1', match: { path: msgRe(a!.id) } });

    const pa = collect(api.messages(a!.id));
    await sleeping;
    const pb = await collect(api.messages(b!.id));
    await pa;

    expect(pb[0]!.data).toHaveLength(1);
    // A's retry delay, then B held by the limiter for the rest of the same pause (not a retry of B).
    expect(clock.sleeps).toHaveLength(2);
    expect(clock.sleeps[0]).toBe(1000);
    expect(clock.sleeps[1]).toBeGreaterThan(0);
    expect(clock.sleeps[1]).toBeLessThanOrEqual(1000);
    expect(api.stats.retries).toBe(1);
    const rate429 = fake.requests.find((r) => r.status === 429)!;
    const bReq = fake.requests.find((r) => r.path === msgRe(b!.id))!;
    expect(bReq.at - rate429.at).toBeGreaterThanOrEqual(950);
  });
});

describe('ApiClient: retries', () => {
  it('retries 503 and 500, then succeeds; counts retries and requests', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const fake = await fakeApi(ws);
    const clock = recordingClock();
    const api = client(fake.url, { clock });
    fake.injectFault({ kind: 'status', status: 503 });
    fake.injectFault({ kind: 'status', status: 500 });

    const pages = await collect(api.messages(ws.list()[0]!.id));
    expect(pages[0]!.data.map((m) => m.id)).toEqual(ws.list()[0]!.messages.map((m) => m.id));
    expect(fake.requests.map((r) => r.status)).toEqual([503, 500, 200]);
    expect(api.stats.requests).toBe(3);
    expect(api.stats.retries).toBe(2);
    expect(api.stats.byStatus).toEqual({ 503: 1, 500: 1, 200: 1 });
    // Backoff without Retry-After: full jitter below min(maxMs, baseMs * 2^(retry-1))
    expect(clock.sleeps).toHaveLength(2);
    expect(clock.sleeps[0]).toBeGreaterThanOrEqual(0);
    expect(clock.sleeps[0]).toBeLessThan(5);
    expect(clock.sleeps[1]).toBeLessThan(10);
  });

  it('retries 408 and 502', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    fake.injectFault({ kind: 'status', status: 408 });
    fake.injectFault({ kind: 'status', status: 502 });
    await collect(api.messages(ws.list()[0]!.id));
    expect(fake.requests.map((r) => r.status)).toEqual([408, 502, 200]);
  });

  it('after maxRetries throws HttpError with status, attempts = maxRetries+1, method and relative path', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { maxRetries: 3 });
    const conv = ws.list()[0]!;
    fake.injectFault({ kind: 'status', status: 503, times: Infinity });

    const err = await rejection(collect(api.messages(conv.id)));
    expect(err).toBeInstanceOf(HttpError);
    expect(err).not.toBeInstanceOf(AuthError);
    const h = err as HttpError;
    expect(h.status).toBe(503);
    expect(h.attempts).toBe(4);
    expect(h.method).toBe('GET');
    expect(h.path).toBe(msgPath(conv.id));
    expect(h.code).toBe('HTTP_ERROR');
    expect(h.retryable).toBe(true);
    expect(h.message).toContain('503');
    expect(h.context).toMatchObject({ method: 'GET', path: msgPath(conv.id), status: 503 });
    expect(fake.requests).toHaveLength(4);
    expect(api.stats.requests).toBe(4);
    expect(api.stats.retries).toBe(3);
  });

  it('maxRetries 0 makes exactly one attempt', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { maxRetries: 0 });
    fake.injectFault({ kind: 'status', status: 500, times: Infinity });
    const err = (await rejection(collect(api.messages(ws.list()[0]!.id)))) as HttpError;
    expect(err.status).toBe(500);
    expect(err.attempts).toBe(1);
    expect(fake.requests).toHaveLength(1);
  });

  it('a dropped connection is retried and succeeds', async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    fake.injectFault({ kind: 'drop' });
    const pages = await collect(api.messages(ws.list()[0]!.id));
    expect(pages[0]!.data).toHaveLength(2);
    expect(fake.requests.map((r) => r.status)).toEqual(['dropped', 200]);
    expect(api.stats.networkErrors).toBe(1);
    expect(api.stats.retries).toBe(1);
  });

  it('connections always dropped: HttpError without status after maxRetries', async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { maxRetries: 2 });
    fake.injectFault({ kind: 'drop', times: Infinity });
    const err = (await rejection(collect(api.messages(ws.list()[0]!.id)))) as HttpError;
    expect(err).toBeInstanceOf(HttpError);
    expect(err.status).toBeUndefined();
    expect(err.attempts).toBe(3);
    expect(err.message).toMatch(/network error/);
    expect(fake.requests).toHaveLength(3);
  });

  it('a slow answer beyond requestTimeoutMs times out and is retried', async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { requestTimeoutMs: 200, maxRetries: 1 });
    // Answered only after a minute (cancelled when the fake closes): the client cannot have waited for it.
    fake.injectFault({ kind: 'slow', delayMs: 60_000 });
    const pages = await collect(api.messages(ws.list()[0]!.id));
    expect(pages[0]!.data).toHaveLength(2);
    expect(fake.requests.map((r) => r.status)).toEqual([0, 200]);
    expect(fake.requests[1]!.at - fake.requests[0]!.at).toBeGreaterThanOrEqual(190);
    expect(fake.requests).toHaveLength(2);
    expect(api.stats.networkErrors).toBe(1);
    expect(api.stats.retries).toBe(1);
  });

  it('a slow answer every time fails with a timeout HttpError (status undefined)', async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { requestTimeoutMs: 200, maxRetries: 1 });
    fake.injectFault({ kind: 'slow', delayMs: 60_000, times: Infinity });
    const err = await rejection(collect(api.messages(ws.list()[0]!.id)));
    expect(err).toBeInstanceOf(HttpError);
    const h = err as HttpError;
    expect(h.status).toBeUndefined();
    expect(h.message).toMatch(/timed out/);
    expect(h.attempts).toBe(2);
    expect(h.retryable).toBe(true);
    // Neither attempt was answered: each ended on its own timeout.
    expect(fake.requests.map((r) => r.status)).toEqual([0, 0]);
    expect(fake.requests[1]!.at - fake.requests[0]!.at).toBeGreaterThanOrEqual(190);
  });
});

describe('ApiClient: errors that are never retried', () => {
  it('401 (wrong key) is an AuthError after exactly one request', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url, { apiKey: 'wrong-key' });
    const err = await rejection(collect(api.messages(ws.list()[0]!.id)));
    expect(err).toBeInstanceOf(AuthError);
    expect((err as AuthError).status).toBe(401);
    expect((err as AuthError).code).toBe('AUTH_ERROR');
    expect((err as AuthError).attempts).toBe(1);
    expect((err as AuthError).retryable).toBe(false);
    expect(fake.requests).toHaveLength(1);
    expect(fake.requests[0]!.status).toBe(401);
  });

  it('403 (wrong account) is an AuthError after exactly one request', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws, { accountId: ACCOUNT_ID });
    const api = client(fake.url, { accountId: '00000000-0000-4000-8000-000000000000' });
    const err = await rejection(collect(api.conversations()));
    expect(err).toBeInstanceOf(AuthError);
    expect((err as AuthError).status).toBe(403);
    expect((err as AuthError).message).toContain('CONVO_MIRROR_ACCOUNT_ID');
    expect(fake.requests).toHaveLength(1);
  });

  it.each([400, 404, 422, 409])('%i is an HttpError after exactly one request', async (status) => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    fake.injectFault({ kind: 'status', status, times: Infinity });
    const err = await rejection(collect(api.messages(ws.list()[0]!.id)));
    expect(err).toBeInstanceOf(HttpError);
    expect(err).not.toBeInstanceOf(AuthError);
    expect((err as HttpError).status).toBe(status);
    expect((err as HttpError).attempts).toBe(1);
    expect((err as HttpError).retryable).toBe(false);
    expect(fake.requests).toHaveLength(1);
    expect(api.stats.retries).toBe(0);
  });

  it('an unknown conversation answers 404 once, not retried: a NotFoundError', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    const err = (await rejection(collect(api.messages('no-such-conversation')))) as HttpError;
    expect(err).toBeInstanceOf(NotFoundError);
    expect(err).toMatchObject({ code: 'NOT_FOUND', retryable: false, method: 'GET', status: 404, attempts: 1 });
    expect(err.message).toBe(`GET ${msgPath('no-such-conversation')}: answered 404`);
    expect(err.path).toBe(msgPath('no-such-conversation'));
    expect(fake.requests).toHaveLength(1);
  });

  it('a 404 of the conversation list is a wrong base URL: ConfigError naming CONVO_MIRROR_BASE_URL, one request', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(`${fake.url}/nope`, { maxRetries: 3 });
    const err = (await rejection(collect(api.conversations()))) as ConfigError;
    expect(err).toBeInstanceOf(ConfigError);
    expect(err.variable).toBe('CONVO_MIRROR_BASE_URL');
    expect(err.retryable).toBe(false);
    expect(err.message).toBe(
      "CONVO_MIRROR_BASE_URL: GET /v1/conversations?page=1&per_page=100 answered 404: check that the base URL is the API's {base_url} (paths /v1/... are appended)",
    );
    expect(err.cause).toBeInstanceOf(NotFoundError);
    expect(fake.requests.map((r) => [r.path, r.status])).toEqual([['/nope/v1/conversations', 404]]);
  });

  it('a 429 whose retries run out is a RateLimitedError (code HTTP_ERROR, retryable)', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const clock = frozenClock();
    const api = client(fake.url, { maxRetries: 1, clock });
    fake.injectFault({ kind: 'status', status: 429, retryAfter: '2', times: Infinity });
    const err = (await rejection(collect(api.messages(ws.list()[0]!.id)))) as HttpError;
    expect(err).toBeInstanceOf(RateLimitedError);
    expect(err).toMatchObject({ code: 'HTTP_ERROR', retryable: true, status: 429, attempts: 2, retryAfterMs: 2000 });
    // One retry, after the server's 2 s; the limiter was paused until then (frozen time: it waits too).
    expect(clock.sleeps[0]).toBe(2000);
    expect(fake.requests.map((r) => r.status)).toEqual([429, 429]);
  });

  it('a 302 redirect is neither followed nor retried', async () => {
    const other = await tinyServer((_req, res) => json(res, 200, { data: [], meta: { current_page: 1, total_pages: 0, total_count: 0 } }));
    const redirector = await tinyServer((req, res) => {
      res.writeHead(302, { location: `${other.url}${req.url ?? '/'}`, 'content-length': 0 });
      res.end();
    });
    const api = client(redirector.url);
    const err = await rejection(collect(api.conversations()));
    expect(err).toBeInstanceOf(RedirectRefusedError);
    expect((err as HttpError).code).toBe('HTTP_ERROR');
    expect((err as HttpError).status).toBe(302);
    expect((err as HttpError).retryable).toBe(false);
    expect((err as HttpError).attempts).toBe(1);
    expect((err as HttpError).message).toMatch(/redirect/);
    expect(redirector.hits).toEqual(['/v1/conversations?page=1&per_page=100']);
    expect(other.hits).toEqual([]);
  });

  it('200 with a non-JSON body is a SchemaError, not retried', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const api = client(fake.url);
    const conv = ws.list()[0]!;
    fake.injectFault({ kind: 'status', status: 200, body: '<html>oops</html>', times: Infinity });
    const err = await rejection(collect(api.messages(conv.id)));
    expect(err).toBeInstanceOf(SchemaError);
    expect((err as SchemaError).code).toBe('SCHEMA_ERROR');
    expect((err as SchemaError).message).toMatch(/not JSON/);
    expect((err as SchemaError).context).toMatchObject({ path: msgPath(conv.id), conversation_id: conv.id });
    expect(fake.requests).toHaveLength(1);
  });

  it('a page breaking the schema is a SchemaError naming the field path and the conversation', async () => {
    const tiny = await tinyServer((_req, res) =>
      json(res, 200, { data: [{ id: 1 }], meta: { current_page: 1, total_pages: 1, total_count: 1 } }),
    );
    const api = client(tiny.url);
    const err = await rejection(collect(api.messages('conv-xyz-42')));
    expect(err).toBeInstanceOf(SchemaError);
    const s = err as SchemaError;
    expect(s.message).toContain('data[0].id');
    expect(s.message).toContain('conv-xyz-42');
    expect(s.context).toMatchObject({ field: 'data[0].id', conversation_id: 'conv-xyz-42', page: 1 });
    expect(tiny.hits).toHaveLength(1);
  });

  it('a nested schema break names the nested path (data[1].sender.type)', async () => {
    const tiny = await tinyServer((_req, res) =>
      json(res, 200, {
        data: [validMessage('m1'), validMessage('m2', { sender: { id: 's', name: 'n' } })],
        meta: { current_page: 1, total_pages: 1, total_count: 2 },
      }),
    );
    const api = client(tiny.url);
    const err = (await rejection(collect(api.messages('c1')))) as SchemaError;
    expect(err).toBeInstanceOf(SchemaError);
    expect(err.context['field']).toBe('data[1].sender.type');
    expect(err.message).toContain('data[1].sender.type');
  });

  it('a page whose meta.current_page is not the requested page is a SchemaError', async () => {
    const tiny = await tinyServer((_req, res) =>
      json(res, 200, { data: [validMessage('m1')], meta: { current_page: 7, total_pages: 1, total_count: 1 } }),
    );
    const api = client(tiny.url);
    const err = (await rejection(collect(api.messages('c1')))) as SchemaError;
    expect(err).toBeInstanceOf(SchemaError);
    expect(err.context['field']).toBe('meta.current_page');
  });
});

describe('ApiClient: open schema', () => {
  it('accepts unknown fields, any visibility and sender.type, and absent attachments', async () => {
    const served = {
      data: [
        validMessage('m1', { visibility: 'team-only', sender: { id: 'b1', name: 'Bot', type: 'Bot', avatar: 'x.png' }, reactions: ['👍'] }),
        validMessage('m2', { visibility: '', attachments: [] }),
        validMessage('m3', { attachments: [{ anything: true }] }),
      ],
      meta: { current_page: 1, total_pages: 1, total_count: 3, next_cursor: null },
      links: { self: '/x' },
    };
    const tiny = await tinyServer((_req, res) => json(res, 200, served));
    const api = client(tiny.url);
    const pages = await collect(api.messages('c1'));
    expect(pages).toHaveLength(1);
    const [p] = pages;
    expect(p!.data.map((m) => m.id)).toEqual(['m1', 'm2', 'm3']);
    expect(p!.data[0]!.visibility).toBe('team-only');
    expect(p!.data[0]!.sender.type).toBe('Bot');
    expect(p!.data[0]!.attachments).toBeUndefined();
    expect('attachments' in p!.raw[0]!).toBe(false);
    expect((p!.data[0] as Record<string, unknown>)['reactions']).toEqual(['👍']);
    expect(p!.data[1]!.attachments).toEqual([]);
    expect(p!.raw).toEqual(served.data);
  });

  it('accepts unknown fields on listed conversations', async () => {
    const served = {
      data: [{ id: 'c-1', status: 'snoozed', custom: { tier: 'gold' } }],
      meta: { current_page: 1, total_pages: 1, total_count: 1 },
    };
    const tiny = await tinyServer((_req, res) => json(res, 200, served));
    const api = client(tiny.url);
    const pages = await collect(api.conversations());
    expect(pages[0]!.raw).toEqual(served.data);
    expect(pages[0]!.data[0]!.id).toBe('c-1');
  });
});

describe('ApiClient: the API key never leaks into errors', () => {
  it('no error message, JSON form, context or inspection contains the key', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws, { accountId: ACCOUNT_ID });
    const conv = ws.list()[0]!;
    const errors: unknown[] = [];
    const tries = async (f: () => Promise<unknown>) => errors.push(await rejection(f()));

    // 401: the fake wants a different key; ours still must not show up.
    const stranger = client(fake.url, { apiKey: `${API_KEY}-x`, accountId: ACCOUNT_ID });
    await tries(() => collect(stranger.conversations()));
    const api = client(fake.url, { accountId: ACCOUNT_ID, maxRetries: 1, requestTimeoutMs: 200 });
    // 403
    const noAccount = client(fake.url);
    await tries(() => collect(noAccount.conversations()));
    // 404, 503 exhausted, drop exhausted, timeout, non-JSON
    await tries(() => collect(api.messages('missing')));
    fake.injectFault({ kind: 'status', status: 503, times: 2 });
    await tries(() => collect(api.messages(conv.id)));
    fake.injectFault({ kind: 'drop', times: 2 });
    await tries(() => collect(api.messages(conv.id)));
    fake.injectFault({ kind: 'slow', delayMs: 1000, times: 2 });
    await tries(() => collect(api.messages(conv.id)));
    fake.injectFault({ kind: 'status', status: 200, body: 'not json' });
    await tries(() => collect(api.messages(conv.id)));
    // schema break and redirect
    const bad = await tinyServer((req, res) =>
      req.url?.startsWith('/v1/conversations?')
        ? (res.writeHead(302, { location: `${fake.url}${req.url}`, 'content-length': 0 }), res.end())
        : json(res, 200, { data: [{ id: 1 }], meta: { current_page: 1, total_pages: 1, total_count: 1 } }),
    );
    const badApi = client(bad.url, { accountId: ACCOUNT_ID });
    await tries(() => collect(badApi.messages('c')));
    await tries(() => collect(badApi.conversations()));

    expect(errors).toHaveLength(9);
    expect(errors.map((e) => (e as ConvoMirrorError).code)).toEqual([
      'AUTH_ERROR',
      'AUTH_ERROR',
      'NOT_FOUND',
      'HTTP_ERROR',
      'HTTP_ERROR',
      'HTTP_ERROR',
      'SCHEMA_ERROR',
      'SCHEMA_ERROR',
      'HTTP_ERROR',
    ]);
    for (const e of errors) {
      const err = e as ConvoMirrorError;
      expect(err).toBeInstanceOf(ConvoMirrorError);
      expect(err.message).not.toContain(API_KEY);
      expect(JSON.stringify(err)).not.toContain(API_KEY);
      expect(JSON.stringify(err.context)).not.toContain(API_KEY);
      expect(inspect(err, { depth: 8 })).not.toContain(API_KEY);
      expect(String(err.stack)).not.toContain(API_KEY);
    }
    // The key was really sent (so the test could have seen it leak).
    expect(fake.requests.some((r) => r.apiKey === API_KEY)).toBe(true);
  });
});

describe('ApiClient: nothing of a finished attempt outlives it', () => {
  /**
   * Signals that Node's `AbortSignal.any` keeps (weakly) on a source signal: an internal set, read
   * where this Node has it (0 elsewhere); the listener and timer checks below hold on any Node.
   */
  const dependants = (signal: AbortSignal): number => {
    const k = Object.getOwnPropertySymbols(signal).find((s) => s.description === 'kDependantSignals');
    return k ? ((signal as unknown as Record<symbol, Set<unknown>>)[k]?.size ?? 0) : 0;
  };
  const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

  it('100 requests under a shutdown signal leave no listener, no dependent signal and no timer behind (a sync of 100,000 conversations grew by one each)', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const shutdown = new AbortController();
    const api = client(fake.url, { signal: shutdown.signal, maxRps: 0, requestTimeoutMs: 60_000 });
    const before = timers();
    for (let i = 0; i < 100; i++) await api.getJson('/v1/conversations?page=1&per_page=100');
    // A failed attempt (a 500, retried) cleans up as well.
    fake.injectFault({ kind: 'status', status: 500 });
    await api.getJson('/v1/conversations?page=1&per_page=100');
    expect(fake.requests).toHaveLength(102);
    expect(getEventListeners(shutdown.signal, 'abort')).toHaveLength(0);
    expect(dependants(shutdown.signal)).toBe(0);
    expect(timers() - before).toBeLessThan(10);
  });

  it('30 requests at once under one shutdown signal raise no MaxListenersExceededWarning (each waiting or in-flight request listens for shutdown)', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const shutdown = new AbortController();
    const api = client(fake.url, { signal: shutdown.signal, maxRps: 0 });
    const warnings: string[] = [];
    const onWarning = (w: Error): void => void warnings.push(w.name);
    process.on('warning', onWarning);
    try {
      await Promise.all(Array.from({ length: 30 }, () => api.getJson('/v1/conversations?page=1&per_page=100')));
      // Warnings are emitted on the next tick.
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off('warning', onWarning);
    }
    expect(fake.requests).toHaveLength(30);
    expect(warnings).not.toContain('MaxListenersExceededWarning');
  });

  it('AttemptDeadline aborts with the parent or at its timeout, and dispose detaches it', async () => {
    const parent = new AbortController();
    const d = new AttemptDeadline(60_000, parent.signal);
    expect(getEventListeners(parent.signal, 'abort')).toHaveLength(1);
    d.dispose();
    expect(getEventListeners(parent.signal, 'abort')).toHaveLength(0);
    parent.abort(new Error('shutdown'));
    expect(d.signal.aborted).toBe(false);

    const p2 = new AbortController();
    const d2 = new AttemptDeadline(60_000, p2.signal);
    p2.abort(new Error('shutdown'));
    expect(d2.signal.aborted).toBe(true);
    expect((d2.signal.reason as Error).message).toBe('shutdown');
    d2.dispose();

    const d3 = new AttemptDeadline(1);
    await new Promise<void>((resolve) => d3.signal.addEventListener('abort', () => resolve(), { once: true }));
    expect((d3.signal.reason as Error).name).toBe('TimeoutError');
    d3.dispose();
    // Already aborted: the deadline starts aborted, with the parent's reason.
    const d4 = new AttemptDeadline(60_000, AbortSignal.abort(new Error('gone')));
    expect((d4.signal.reason as Error).message).toBe('gone');
    d4.dispose();
  });
});

describe('ApiClient: rate cap', () => {
  it('with maxRps 20, 21 concurrent requests are spaced 50 ms apart: recorded waits 50, 100, ... 1000 ms', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const clock = frozenClock();
    // Spacing alone: without slow start all 21 are queued at once (slow start is tested in rate-limit.test.ts).
    const api = client(fake.url, { maxRps: 20, clock, rateLimit: { slowStart: false } });
    const results = await Promise.all(Array.from({ length: 21 }, () => api.getJson('/v1/conversations?page=1&per_page=100')));
    expect(results.every((r) => r.status === 200)).toBe(true);
    expect(fake.requests).toHaveLength(21);
    expect(clock.sleeps).toEqual(Array.from({ length: 20 }, (_, i) => 50 * (i + 1)));
  });

  it('with maxRps 20 on the system clock, 21 concurrent requests reach the server over at least a second', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url, { maxRps: 20, rateLimit: { slowStart: false } });
    await Promise.all(Array.from({ length: 21 }, () => api.getJson('/v1/conversations?page=1&per_page=100')));
    expect(fake.requests).toHaveLength(21);
    const span = fake.requests[20]!.at - fake.requests[0]!.at;
    expect(span).toBeGreaterThanOrEqual(940);
  });

  it('with maxRps 0 there is no cap: nothing waits', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const clock = frozenClock();
    const api = client(fake.url, { maxRps: 0, clock, rateLimit: { slowStart: false } });
    await Promise.all(Array.from({ length: 21 }, () => api.getJson('/v1/conversations?page=1&per_page=100')));
    expect(fake.requests).toHaveLength(21);
    expect(clock.sleeps).toEqual([]);
  });
});

describe('RateLimiter (injected clock)', () => {

  it('without a cap or pause, nothing waits', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    expect(await Promise.all([l.acquire(), l.acquire(), l.acquire()])).toEqual([0, 0, 0]);
    expect(clock.sleeps).toEqual([]);
  });

  it('spaces requests 1000/rps ms apart', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(4, clock);
    expect(await Promise.all([l.acquire(), l.acquire(), l.acquire(), l.acquire()])).toEqual([0, 250, 500, 750]);
    expect(clock.sleeps).toEqual([250, 500, 750]);
  });

  it('pauseUntil holds every concurrent request until the pause ends', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    l.pauseUntil(clock.t + 1500);
    expect(await Promise.all([l.acquire(), l.acquire(), l.acquire()])).toEqual([1500, 1500, 1500]);
    clock.t += 1500;
    expect(await l.acquire()).toBe(0);
  });

  it('pauseUntil combines with the cap: requests resume spaced after the pause', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(10, clock);
    l.pauseUntil(clock.t + 500);
    expect(await Promise.all([l.acquire(), l.acquire(), l.acquire()])).toEqual([500, 600, 700]);
  });

  it('an earlier pauseUntil never shortens a pause', async () => {
    const clock = frozenClock();
    const l = new RateLimiter(0, clock);
    l.pauseUntil(clock.t + 2000);
    l.pauseUntil(clock.t + 100);
    expect(await l.acquire()).toBe(2000);
  });
});
