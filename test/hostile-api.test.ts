/**
 * ApiClient against a misbehaving API (issue 8): oversized and endless bodies, bodies that trickle,
 * page loops that never end, pages of more than per_page records, ids URL normalization would
 * rewrite, and JSON nested too deeply to store. Real HTTP on 127.0.0.1 to the in-process fake (a tiny
 * node:http server only for answers the fake cannot give); nothing of ours is mocked. Outcomes are
 * asserted on the fake's request log and its byte counters, never on elapsed time alone.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { inspect } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import {
  ApiClient,
  DEFAULT_MAX_RESPONSE_BYTES,
  PER_PAGE,
  apiClientFromConfig,
  pageBound,
  type ApiClientOptions,
} from '../src/api/client.js';
import { MAX_JSON_DEPTH, MAX_JSON_VALUES, countJsonValues } from '../src/api/schemas.js';
import { HttpError, PageRunawayError, ResponseTooLargeError, SchemaError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { collect, json, rejection } from './helpers.js';

const API_KEY = 'sk-live-HOSTILE-5e1d77a0b3';
const MiB = 1024 * 1024;
/** The small cap most tests use, so oversized bodies are cut off quickly. */
const CAP = 1 * MiB;

// ---- harness ---------------------------------------------------------------------------------

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function fakeApi(workspace: FakeWorkspace): Promise<FakeApi> {
  const fake = await startFakeApi({ workspace, apiKey: API_KEY });
  cleanups.push(() => fake.close());
  return fake;
}

function client(baseUrl: string, extra: Partial<ApiClientOptions> = {}): ApiClient {
  const api = new ApiClient({ baseUrl, apiKey: API_KEY, maxRps: 0, backoff: { baseMs: 5, maxMs: 20 }, maxResponseBytes: CAP, ...extra });
  cleanups.push(() => api.close());
  return api;
}

/** A minimal node:http server on 127.0.0.1; counts the body bytes its handler reports writing. */
async function tinyServer(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ url: string; hits: string[] }> {
  const hits: string[] = [];
  const server = createServer((req, res) => {
    hits.push(req.url ?? '');
    handler(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  );
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits };
}

const msgRe = (id: string): string => `/v1/conversations/${id}/messages`;
const msgPath = (id: string, page = 1): string => `${msgRe(id)}?page=${page}&per_page=100`;

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

/** JSON text of arrays nested `levels` deep (`1` → `[]`, `2` → `[[]]`), built without recursion. */
const nestedArrayJson = (levels: number): string => '['.repeat(levels) + ']'.repeat(levels);

/** A one-message page whose message carries `attachments` nested `levels` deep (record depth 1 + levels). */
function deepMessagePage(levels: number): string {
  const msg = JSON.stringify(validMessage('m-deep', { attachments: '@@' }));
  return `{"data":[${msg.replace('"@@"', nestedArrayJson(levels))}],"meta":{"current_page":1,"total_pages":1,"total_count":1}}`;
}

/** Asserts the common shape of a {@link ResponseTooLargeError}. */
function expectTooLarge(err: unknown, what: string, path: string, cap = CAP): ResponseTooLargeError {
  expect(err).toBeInstanceOf(ResponseTooLargeError);
  const e = err as ResponseTooLargeError;
  expect(e.code).toBe('RESPONSE_TOO_LARGE');
  expect(e.retryable).toBe(false);
  expect(e.attempts).toBe(1);
  expect(e.status).toBe(200);
  expect(e.path).toBe(path);
  expect(e.limitBytes).toBe(cap);
  expect(e.message).toContain(`${what}: GET ${path}`);
  expect(e.message).toContain(`${cap} bytes`);
  expect(e.message).toContain(`${Math.round((cap / MiB) * 100) / 100} MiB`);
  expect(e.message).toContain('CONVO_MIRROR_MAX_RESPONSE_BYTES');
  expect(e.message).not.toContain(API_KEY);
  expect(inspect(e, { depth: 8 })).not.toContain(API_KEY);
  return e;
}

// ---- byte cap --------------------------------------------------------------------------------

describe('response byte cap', () => {
  it('a 300 MiB page with content-length is refused unread: one request, little sent', async () => {
    const ws = FakeWorkspace.fromCounts([3, 2]);
    const fake = await fakeApi(ws);
    const [a, b] = ws.list();
    const api = client(fake.url);
    fake.injectFault({ kind: 'huge', bytes: 300 * MiB, match: { path: msgRe(a!.id) } });

    const err = await rejection(collect(api.messages(a!.id)));
    const e = expectTooLarge(err, `conversation ${a!.id} messages page 1`, msgPath(a!.id));
    expect(e.message).toContain(`(1 MiB): its content-length is ${300 * MiB} bytes, so none of it was read. If the API`);
    expect(fake.requests).toHaveLength(1);
    await fake.whenStreamsEnd();
    expect(fake.requests[0]!.closedEarly).toBe(true);
    expect(fake.requests[0]!.bytesSent).toBeLessThan(CAP + 16 * MiB);

    // The client carries on: the next conversation is read normally.
    const pages = await collect(api.messages(b!.id));
    expect(pages[0]!.data.map((m) => m.id)).toEqual(b!.messages.map((m) => m.id));
    expect(api.stats.retries).toBe(0);
  });

  it('a 300 MiB chunked page (no content-length) is cut off once the cap is crossed', async () => {
    const ws = FakeWorkspace.fromCounts([150]);
    const fake = await fakeApi(ws);
    const conv = ws.list()[0]!;
    const api = client(fake.url);
    fake.injectFault({ kind: 'huge', bytes: 300 * MiB, contentLength: false, match: { path: msgRe(conv.id), page: 2 } });

    const pages: number[] = [];
    const err = await rejection(
      (async () => {
        for await (const p of api.messages(conv.id)) pages.push(p.page);
      })(),
    );
    expect(pages).toEqual([1]);
    const e = expectTooLarge(err, `conversation ${conv.id} messages page 2`, msgPath(conv.id, 2));
    expect(e.message).toMatch(/\(1 MiB\): reading stopped at \d+ bytes and the rest was not read\. If the API/);
    expect(e.context).toMatchObject({ method: 'GET', path: msgPath(conv.id, 2), status: 200 });
    expect(fake.requests.map((r) => r.query['page'])).toEqual(['1', '2']);
    await fake.whenStreamsEnd();
    const rec = fake.requests[1]!;
    expect(rec.closedEarly).toBe(true);
    expect(rec.bytesSent).toBeGreaterThan(CAP);
    expect(rec.bytesSent).toBeLessThan(CAP + 16 * MiB);
  });

  it('an oversized conversation list page names the list page', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    fake.injectFault({ kind: 'huge', bytes: 300 * MiB, contentLength: false });
    const err = await rejection(collect(api.conversations()));
    expectTooLarge(err, 'conversation list page 1', '/v1/conversations?page=1&per_page=100');
    expect(fake.requests).toHaveLength(1);
    await fake.whenStreamsEnd();
    expect(fake.requests[0]!.bytesSent).toBeLessThan(CAP + 16 * MiB);
  });

  it('an endless body is cut off at the cap and the request ends', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const conv = ws.list()[0]!;
    const api = client(fake.url);
    fake.injectFault({ kind: 'endless', times: Infinity });
    const err = await rejection(collect(api.messages(conv.id)));
    expectTooLarge(err, `conversation ${conv.id} messages page 1`, msgPath(conv.id));
    expect(fake.requests).toHaveLength(1);
    // The fake's writer stops because the client closed the connection.
    await fake.whenStreamsEnd();
    expect(fake.requests[0]!.closedEarly).toBe(true);
    expect(fake.requests[0]!.bytesSent).toBeGreaterThan(CAP);
    expect(fake.requests[0]!.bytesSent).toBeLessThan(CAP + 16 * MiB);
  });

  it('a body of exactly the cap is read; one byte more is refused (with and without content-length)', async () => {
    const cap = 300_000;
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url, { maxResponseBytes: cap });
    for (const contentLength of [true, false]) {
      fake.requests.length = 0;
      fake.injectFault({ kind: 'huge', bytes: cap, contentLength });
      const pages = await collect(api.conversations());
      expect(pages).toHaveLength(1);
      expect(pages[0]!.data).toEqual([]);
      expect(fake.requests[0]!.bytesSent).toBe(cap);

      fake.injectFault({ kind: 'huge', bytes: cap + 1, contentLength });
      const err = await rejection(collect(api.conversations()));
      expectTooLarge(err, 'conversation list page 1', '/v1/conversations?page=1&per_page=100', cap);
      expect(fake.requests).toHaveLength(2);
    }
  });

  it('apiClientFromConfig passes maxResponseBytes through; the default is 32 MiB', async () => {
    expect(DEFAULT_MAX_RESPONSE_BYTES).toBe(33_554_432);
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = apiClientFromConfig({
      baseUrl: fake.url,
      apiKey: API_KEY,
      accountId: undefined,
      maxRps: 0,
      concurrency: 1,
      requestTimeoutMs: 10_000,
      maxRetries: 0,
      maxResponseBytes: 65_536,
    });
    cleanups.push(() => api.close());
    fake.injectFault({ kind: 'huge', bytes: 65_537 });
    expectTooLarge(await rejection(collect(api.conversations())), 'conversation list page 1', '/v1/conversations?page=1&per_page=100', 65_536);
  });

  it('rejects a maxResponseBytes that is not a positive integer', () => {
    for (const bad of [0, -1, 1.5, Number.NaN, Infinity]) {
      expect(() => new ApiClient({ baseUrl: 'http://127.0.0.1:1', apiKey: 'k', maxResponseBytes: bad }), String(bad)).toThrow(RangeError);
    }
  });

  it('the body of a non-2xx answer is read at most 64 KiB: an endless 503 body fails at once as a 503', async () => {
    let written = 0;
    let closed!: () => void;
    const serverDone = new Promise<void>((resolve) => (closed = resolve));
    const tiny = await tinyServer((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      const chunk = Buffer.alloc(64 * 1024, 'e');
      const pump = (): void => {
        while (!res.destroyed) {
          written += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
      };
      res.on('close', () => closed());
      pump();
    });
    const api = client(tiny.url, { maxRetries: 0, requestTimeoutMs: 30_000 });
    const err = await rejection(collect(api.conversations()));
    expect(err).toBeInstanceOf(HttpError);
    expect(err).not.toBeInstanceOf(ResponseTooLargeError);
    expect((err as HttpError).status).toBe(503);
    expect((err as HttpError).message).not.toMatch(/timed out/);
    await serverDone; // the client closed the connection instead of reading on
    expect(written).toBeLessThan(16 * MiB);
    expect(tiny.hits).toHaveLength(1);
  });

  it('a body trickling in slower than the request timeout is cut off by it', async () => {
    let closed!: () => void;
    const serverDone = new Promise<void>((resolve) => (closed = resolve));
    const tiny = await tinyServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"data":[],"meta":{"current_page":1,"total_pages":0,"total_count":0},"padding":"');
      // One byte every 20 ms: never idle long enough for an idle timeout, never done.
      const timer = setInterval(() => res.write('x'), 20);
      res.on('close', () => {
        clearInterval(timer);
        closed();
      });
    });
    const api = client(tiny.url, { maxRetries: 0, requestTimeoutMs: 300 });
    const err = await rejection(collect(api.conversations()));
    expect(err).toBeInstanceOf(HttpError);
    expect((err as HttpError).status).toBeUndefined();
    expect((err as HttpError).message).toMatch(/timed out after 300 ms/);
    expect((err as HttpError).retryable).toBe(true);
    await serverDone; // the client hung up
    expect(api.stats.networkErrors).toBe(1);
    expect(api.stats.byStatus).toEqual({ 200: 1 });
  });
});

// ---- page loops ------------------------------------------------------------------------------

describe('every page loop ends', () => {
  it('pageBound: ceil(expected * 1.1) + 10 pages, expected the smaller of total_pages and what total_count allows', () => {
    const b = (total_pages: number, total_count: number): number => pageBound({ current_page: 1, total_pages, total_count });
    expect(b(0, 0)).toBe(10);
    expect(b(1, 100)).toBe(12);
    expect(b(2, 200)).toBe(13);
    expect(b(10, 1000)).toBe(21); // not 22: 10 * 1.1 is 11.000000000000002 in floating point
    expect(b(100, 10_000)).toBe(120);
    expect(b(1, 1000)).toBe(12); // total_pages says 1: paging stops there anyway
    expect(b(30, 5)).toBe(12); // total_count allows 1 page: 30 is not believed
    expect(b(10_000_000, 0)).toBe(10); // a first page claiming pages of nothing
    expect(b(10_000_000, 10_000)).toBe(120);
  });

  it('a conversation list that never ends stops with PageRunawayError after exactly pageBound pages', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    fake.injectFault({ kind: 'runaway', match: { path: '/v1/conversations' }, times: Infinity });
    let served = 0;
    const err = await rejection(
      (async () => {
        for await (const p of api.conversations()) served += p.data.length;
      })(),
    );
    // The first page says 200 records in 2 pages: ceil(2 * 1.1) + 10 = 13 pages at most.
    const maxPage = 13;
    expect(pageBound({ current_page: 1, total_pages: 2, total_count: 200 })).toBe(maxPage);
    expect(err).toBeInstanceOf(PageRunawayError);
    const e = err as PageRunawayError;
    expect(e.code).toBe('PAGE_RUNAWAY');
    expect(e.retryable).toBe(false);
    expect(e.message).toBe(
      `conversation list: the API kept serving pages past its own total (its first page said 200 records in 2 pages; stopped after page ${maxPage})`,
    );
    expect(e.context).toEqual({ path: `/v1/conversations?page=${maxPage}&per_page=100`, page: maxPage });
    expect(fake.requests).toHaveLength(maxPage);
    expect(fake.requests.map((r) => Number(r.query['page']))).toEqual(Array.from({ length: maxPage }, (_, i) => i + 1));
    expect(served).toBe(maxPage * PER_PAGE);
  });

  it("a conversation whose messages never end stops after exactly pageBound pages, naming the conversation", async () => {
    const ws = FakeWorkspace.fromCounts([5]);
    const fake = await fakeApi(ws);
    const conv = ws.list()[0]!;
    const api = client(fake.url);
    fake.injectFault({ kind: 'runaway', match: { path: msgRe(conv.id) }, times: Infinity });
    const err = await rejection(collect(api.messages(conv.id)));
    const maxPage = 13;
    expect(err).toBeInstanceOf(PageRunawayError);
    expect((err as PageRunawayError).message).toBe(
      `conversation ${conv.id} messages: the API kept serving pages past its own total (its first page said 200 records in 2 pages; stopped after page ${maxPage})`,
    );
    expect((err as PageRunawayError).context).toEqual({ path: msgPath(conv.id, maxPage), page: maxPage, conversation_id: conv.id });
    expect(fake.requests).toHaveLength(maxPage);
  });

  it('the bound comes from the first page fetched, also when starting later (incremental crawls)', async () => {
    const ws = FakeWorkspace.fromCounts([5]);
    const fake = await fakeApi(ws);
    const conv = ws.list()[0]!;
    const api = client(fake.url);
    fake.injectFault({ kind: 'runaway', match: { path: msgRe(conv.id) }, times: Infinity });
    const err = await rejection(collect(api.messages(conv.id, 5)));
    // Page 5 says 600 records in 6 pages: ceil(6 * 1.1) + 10 = 17, so pages 5..17.
    expect(pageBound({ current_page: 5, total_pages: 6, total_count: 600 })).toBe(17);
    expect(err).toBeInstanceOf(PageRunawayError);
    expect((err as PageRunawayError).message).toContain('its first page said 600 records in 6 pages; stopped after page 17');
    expect(fake.requests.map((r) => Number(r.query['page']))).toEqual(Array.from({ length: 13 }, (_, i) => i + 5));
  });

  it('a conversation that grows while it is read, but catches up, is read to the end', async () => {
    const ws = FakeWorkspace.fromCounts([250]);
    const fake = await fakeApi(ws);
    const conv = ws.list()[0]!;
    fake.beforeServe((req) => {
      if (req.path === msgRe(conv.id)) ws.appendMessages(conv.id, 50);
    });
    const api = client(fake.url);
    const pages = await collect(api.messages(conv.id));
    // Page k sees 250 + 50k messages; it ends at page 5 (500 messages, 5 pages).
    expect(pages.map((p) => p.meta.total_count)).toEqual([300, 350, 400, 450, 500]);
    expect(pages.flatMap((p) => p.data.map((m) => m.id))).toEqual(ws.get(conv.id)!.messages.map((m) => m.id));
  });

  it('a page of more than 100 records is a SchemaError naming what and the count', async () => {
    const tiny = await tinyServer((req, res) => {
      const list = req.url?.startsWith('/v1/conversations?') ?? false;
      const data = Array.from({ length: 101 }, (_, i) => (list ? { id: `c-${i}` } : validMessage(`m-${i}`)));
      json(res, 200, { data, meta: { current_page: 1, total_pages: 2, total_count: 101 } });
    });
    const api = client(tiny.url);
    const m = (await rejection(collect(api.messages('c-7')))) as SchemaError;
    expect(m).toBeInstanceOf(SchemaError);
    expect(m.message).toBe(
      'conversation c-7 messages page 1: the API served 101 records on one page, more than per_page=100 (their positions would overlap the next page)',
    );
    expect(m.context).toMatchObject({ conversation_id: 'c-7', page: 1, field: 'data', count: 101 });
    const l = (await rejection(collect(api.conversations()))) as SchemaError;
    expect(l).toBeInstanceOf(SchemaError);
    expect(l.message).toMatch(/^conversation list page 1: the API served 101 records on one page/);
    expect(tiny.hits).toHaveLength(2);
  });
});

// ---- ids -------------------------------------------------------------------------------------

describe('conversation ids that URL normalization would rewrite', () => {
  it.each(['..', '.', ''])('%j is refused before any request', async (id) => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    const err = await rejection(collect(api.messages(id)));
    expect(err).toBeInstanceOf(SchemaError);
    expect((err as SchemaError).message).toBe(`conversation id ${JSON.stringify(id)} cannot be used in a request path`);
    expect((err as SchemaError).context).toEqual({ conversation_id: id });
    expect(fake.requests).toHaveLength(0);
    expect(api.stats.requests).toBe(0);
  });

  it('ids with dots and slashes are encoded and reach the fake as one path segment', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    for (const id of ['../x', '...', 'a/../b']) {
      const err = (await rejection(collect(api.messages(id)))) as HttpError;
      expect(err.status).toBe(404);
    }
    expect(fake.requests.map((r) => r.path)).toEqual([
      '/v1/conversations/..%2Fx/messages',
      '/v1/conversations/.../messages',
      '/v1/conversations/a%2F..%2Fb/messages',
    ]);
  });
});

// ---- nesting ---------------------------------------------------------------------------------

describe('JSON nested too deeply', () => {
  it('an attachment nested 100,000 levels is a SchemaError naming the conversation, page and field path', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const fake = await fakeApi(ws);
    const conv = ws.list()[0]!;
    const api = client(fake.url, { maxResponseBytes: 4 * MiB });
    fake.injectFault({ kind: 'status', status: 200, body: deepMessagePage(100_000), times: Infinity });
    const err = await rejection(collect(api.messages(conv.id)));
    expect(err).toBeInstanceOf(SchemaError);
    const e = err as SchemaError;
    // The record is level 1, `attachments` level 2, each [0] one more: level 65 is 63 [0]s in.
    const field = `data[0].attachments${'[0]'.repeat(63)}`;
    expect(e.message).toBe(
      `conversation ${conv.id} messages page 1: JSON nested deeper than 64 levels at ${field} (a record this deep cannot be stored or exported)`,
    );
    expect(e.context).toMatchObject({ conversation_id: conv.id, page: 1, field, max_depth: 64 });
    expect(() => JSON.stringify(e.context)).not.toThrow();
    expect(fake.requests).toHaveLength(1);
  });

  it('a message nested 60 levels passes, 64 passes, 65 is refused', async () => {
    expect(MAX_JSON_DEPTH).toBe(64);
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    for (const depth of [60, 64]) {
      fake.injectFault({ kind: 'status', status: 200, body: deepMessagePage(depth - 1) });
      const pages = await collect(api.messages('c-deep'));
      expect(pages[0]!.data).toHaveLength(1);
      expect(JSON.stringify(pages[0]!.raw[0])).toContain('['.repeat(depth - 1));
    }
    fake.injectFault({ kind: 'status', status: 200, body: deepMessagePage(64) });
    const err = (await rejection(collect(api.messages('c-deep')))) as SchemaError;
    expect(err).toBeInstanceOf(SchemaError);
    expect(err.context['field']).toBe(`data[0].attachments${'[0]'.repeat(63)}`);
  });

  it('deep nesting in a listed conversation or in meta is refused too', async () => {
    const fake = await fakeApi(FakeWorkspace.fromCounts([1]));
    const api = client(fake.url);
    fake.injectFault({
      kind: 'status',
      status: 200,
      body: `{"data":[{"id":"c1"},{"id":"c2","custom":{"tree":${nestedArrayJson(5_000)}}}],"meta":{"current_page":1,"total_pages":1,"total_count":2}}`,
    });
    const list = (await rejection(collect(api.conversations()))) as SchemaError;
    expect(list).toBeInstanceOf(SchemaError);
    expect(list.message).toMatch(/^conversation list page 1: JSON nested deeper than 64 levels at data\[1\]\.custom\.tree\[0\]/);

    fake.injectFault({
      kind: 'status',
      status: 200,
      body: `{"data":[],"meta":{"current_page":1,"total_pages":0,"total_count":0,"x":${nestedArrayJson(70)}}}`,
    });
    const meta = (await rejection(collect(api.conversations()))) as SchemaError;
    expect(meta).toBeInstanceOf(SchemaError);
    expect(meta.context['field']).toBe(`meta.x${'[0]'.repeat(63)}`);
  });
});

// ---- what parsing may build ------------------------------------------------------------------

describe('a body under the byte cap cannot make parsing build gigabytes', () => {
  it('countJsonValues counts values outside strings only, and stops past the limit', () => {
    const b = (t: string) => countJsonValues(Buffer.from(t, 'utf8'));
    expect(b('{}')).toBe(2);
    expect(b('{"a":1,"b":[1,2,3]}')).toBe(6);
    expect(b('{"a":"x,y{[z\\",\\\\"}')).toBe(2); // commas, braces and escaped quotes inside a string
    expect(b('"é,ü"')).toBe(1);
    expect(countJsonValues(Buffer.from('[' + '1,'.repeat(1000) + '1]'), 100)).toBe(101);
  });

  it.each([
    ['a million {} records', (n: number) => `{"data":[${'{},'.repeat(n - 1)}{}],"meta":{"current_page":1,"total_pages":1,"total_count":1}}`],
    ['a million {} in an unknown envelope field', (n: number) => `{"data":[],"meta":{"current_page":1,"total_pages":0,"total_count":0},"x":[${'{},'.repeat(n - 1)}{}]}`],
  ])('%s (3 MB, under the cap): a SchemaError before parsing, after one request', async (_name, body) => {
    const tiny = await tinyServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body(1_000_000));
    });
    const api = client(tiny.url, { maxResponseBytes: 8 * MiB });
    const err = (await rejection(collect(api.messages('c-9')))) as SchemaError;
    expect(err).toBeInstanceOf(SchemaError);
    expect(err.message).toMatch(new RegExp(`^conversation c-9 messages page 1: GET .* answered a body of more than ${MAX_JSON_VALUES} JSON values`));
    expect(tiny.hits).toHaveLength(1);
  });

  it('a page of 101 records is refused before validation (no issue per record)', async () => {
    const tiny = await tinyServer((_req, res) => json(res, 200, { data: Array.from({ length: 50_000 }, () => ({})), meta: { current_page: 1, total_pages: 1, total_count: 1 } }));
    const err = (await rejection(collect(client(tiny.url, { maxResponseBytes: 8 * MiB }).conversations()))) as SchemaError;
    expect(err.message).toMatch(/served 50000 records on one page, more than per_page=100/);
  });
});
