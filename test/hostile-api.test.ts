/**
 * ApiClient against a misbehaving API (issue 8): oversized and endless bodies, bodies that trickle. Real HTTP on 127.0.0.1 to the in-process fake (a tiny
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
  type ApiClientOptions,
} from '../src/api/client.js';
import { HttpError, ResponseTooLargeError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';

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

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

async function collect<T>(gen: AsyncGenerator<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of gen) out.push(x);
  return out;
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected the promise to reject, but it resolved');
}

const msgRe = (id: string): string => `/v1/conversations/${id}/messages`;
const msgPath = (id: string, page = 1): string => `${msgRe(id)}?page=${page}&per_page=100`;

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
    expect(e.message).toContain(`content-length is ${300 * MiB} bytes`);
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
    expect(e.message).toMatch(/reading stopped at \d+ bytes/);
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
    const t0 = Date.now();
    const err = await rejection(collect(api.conversations()));
    const elapsed = Date.now() - t0;
    expect(err).toBeInstanceOf(HttpError);
    expect((err as HttpError).status).toBeUndefined();
    expect((err as HttpError).message).toMatch(/timed out after 300 ms/);
    expect((err as HttpError).retryable).toBe(true);
    await serverDone; // the client hung up
    expect(elapsed).toBeGreaterThanOrEqual(250);
    expect(elapsed).toBeLessThan(5_000);
    expect(api.stats.networkErrors).toBe(1);
    expect(api.stats.byStatus).toEqual({ 200: 1 });
  });
});
