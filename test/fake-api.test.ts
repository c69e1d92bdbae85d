import http from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { ConversationsPageSchema, MessagesPageSchema } from '../src/api/schemas.js';
import { FakeWorkspace, MIN_HUGE_BYTES, mulberry32, startFakeApi, type FakeApi, type FakeApiOptions } from '../src/fake-api/index.js';
import { waitFor } from './children.js';

const KEY = 'test-key';
const ACCOUNT = '0b7e6a52-1c3d-4f8e-9a2b-5c6d7e8f9a0b';

const running: FakeApi[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((a) => a.close()));
});

async function start(workspace: FakeWorkspace, extra: Partial<FakeApiOptions> = {}): Promise<FakeApi> {
  const api = await startFakeApi({ workspace, apiKey: KEY, ...extra });
  running.push(api);
  return api;
}

interface Res {
  status: number;
  headers: Headers;
  text: string;
  json: any;
}

async function get(api: FakeApi, path: string, headers: Record<string, string> = { 'X-Api-Key': KEY }): Promise<Res> {
  const r = await fetch(api.url + path, { headers });
  const text = await r.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, headers: r.headers, text, json };
}

const msgs = (id: string, q = ''): string => `/v1/conversations/${id}/messages${q}`;

interface PartialRead {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** Body bytes received before the client hung up. */
  received: number;
  /** Whether the body ended normally before `stopAfter` bytes. */
  complete: boolean;
}

/**
 * GET over node:http that reads at most `stopAfter` body bytes, then destroys the request (the
 * client hangs up). Resolves when the response ends or the request is destroyed.
 */
function getPartial(api: FakeApi, path: string, stopAfter: number): Promise<PartialRead> {
  return new Promise((resolve, reject) => {
    const req = http.get(api.url + path, { headers: { 'X-Api-Key': KEY }, agent: false }, (res) => {
      let received = 0;
      let settled = false;
      const done = (complete: boolean): void => {
        if (settled) return;
        settled = true;
        resolve({ status: res.statusCode ?? 0, headers: res.headers, received, complete });
      };
      res.on('data', (c: Buffer) => {
        received += c.length;
        if (received >= stopAfter) {
          req.destroy();
          done(false);
        }
      });
      res.on('end', () => done(true));
      res.on('error', () => done(false));
      res.on('close', () => done(false));
    });
    req.on('error', (err) => {
      if (!req.destroyed) reject(err);
    });
  });
}

describe('prng', () => {
  it('mulberry32 is deterministic and in [0, 1)', () => {
    const a = mulberry32(123);
    const b = mulberry32(123);
    for (let i = 0; i < 1000; i++) {
      const x = a();
      expect(x).toBe(b());
      expect(x).toBeGreaterThanOrEqual(0);
      expect(x).toBeLessThan(1);
    }
    expect(mulberry32(124)()).not.toBe(mulberry32(123)());
  });
});

describe('messages endpoint (spec 4.1, 8)', () => {
  it('pages with defaults and correct meta, in chronological order', async () => {
    const ws = FakeWorkspace.fromCounts([120, 0, 50]);
    const api = await start(ws);
    const [c0, c1, c2] = ws.list();

    const p1 = await get(api, msgs(c0!.id));
    expect(p1.status).toBe(200);
    expect(p1.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(p1.json.data).toHaveLength(50);
    expect(p1.json.meta).toEqual({ current_page: 1, total_pages: 3, total_count: 120 });

    const p3 = await get(api, msgs(c0!.id, '?page=3'));
    expect(p3.json.data).toHaveLength(20);
    expect(p3.json.meta).toEqual({ current_page: 3, total_pages: 3, total_count: 120 });

    const all = [...(await get(api, msgs(c0!.id, '?per_page=100'))).json.data, ...(await get(api, msgs(c0!.id, '?page=2&per_page=100'))).json.data];
    expect(all).toEqual(JSON.parse(JSON.stringify(c0!.messages)));
    const times = all.map((m: { created_at: string }) => m.created_at);
    expect([...times].sort()).toEqual(times);
    expect(new Set(times).size).toBe(times.length);
    for (const t of times) expect(t).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

    const empty = await get(api, msgs(c1!.id));
    expect(empty.json).toEqual({ data: [], meta: { current_page: 1, total_pages: 0, total_count: 0 } });

    const exact = await get(api, msgs(c2!.id));
    expect(exact.json.meta).toEqual({ current_page: 1, total_pages: 1, total_count: 50 });
  });

  it('answers a page past the end with empty data and correct meta', async () => {
    const ws = FakeWorkspace.fromCounts([7]);
    const api = await start(ws);
    const r = await get(api, msgs(ws.list()[0]!.id, '?page=9&per_page=5'));
    expect(r.status).toBe(200);
    expect(r.json).toEqual({ data: [], meta: { current_page: 9, total_pages: 2, total_count: 7 } });
  });

  it('rejects out-of-range or malformed paging parameters with 400', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const api = await start(ws);
    const id = ws.list()[0]!.id;
    for (const q of ['?per_page=0', '?per_page=101', '?per_page=abc', '?per_page=1.5', '?page=0', '?page=-1', '?page=', '?page=2x']) {
      const r = await get(api, msgs(id, q));
      expect(r.status, q).toBe(400);
      expect(r.json.error.code, q).toBe('invalid_parameter');
      expect(typeof r.json.error.message).toBe('string');
    }
    expect((await get(api, msgs(id, '?per_page=1'))).json.data).toHaveLength(1);
    expect((await get(api, msgs(id, '?per_page=100'))).json.data).toHaveLength(3);
  });

  it('answers 404 for an unknown conversation and for unknown routes', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    const r = await get(api, msgs('00000000-0000-4000-8000-000000000000'));
    expect(r.status).toBe(404);
    expect(r.json.error.code).toBe('not_found');
    expect((await get(api, '/v1/nope')).status).toBe(404);
    expect((await get(api, '/v2/conversations')).status).toBe(404);
    const post = await fetch(api.url + '/v1/conversations', { method: 'POST', headers: { 'X-Api-Key': KEY } });
    expect(post.status).toBe(404);
    await post.text();
  });
});

describe('conversations endpoint (spec 4.2)', () => {
  it('pages through conversation data in list order', async () => {
    const ws = FakeWorkspace.fromCounts([1, 2, 3, 4, 5]);
    const api = await start(ws);
    const r = await get(api, '/v1/conversations?per_page=2&page=2');
    expect(r.json.meta).toEqual({ current_page: 2, total_pages: 3, total_count: 5 });
    expect(r.json.data.map((c: { id: string }) => c.id)).toEqual(ws.list().slice(2, 4).map((c) => c.id));
    expect(r.json.data[0]).toMatchObject({ messages_count: 3, status: expect.any(String), contact: { id: expect.any(String) } });
    expect((await get(api, '/v1/conversations?per_page=101')).status).toBe(400);

    ws.reverse();
    const rev = await get(api, '/v1/conversations?per_page=100');
    expect(rev.json.data.map((c: { id: string }) => c.id)).toEqual(ws.list().map((c) => c.id));
    expect(rev.json.data[0].messages_count).toBe(5);
  });
});

describe('authentication (spec 5)', () => {
  it('answers 401 for a missing or wrong X-Api-Key, before 400/404', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const api = await start(ws);
    const id = ws.list()[0]!.id;
    expect((await get(api, msgs(id), {})).status).toBe(401);
    const wrong = await get(api, msgs(id), { 'X-Api-Key': 'nope' });
    expect(wrong.status).toBe(401);
    expect(wrong.json.error.code).toBe('unauthorized');
    expect((await get(api, '/v1/conversations', {})).status).toBe(401);
    expect((await get(api, msgs('unknown'), {})).status).toBe(401);
    expect((await get(api, msgs(id, '?per_page=0'), {})).status).toBe(401);
  });

  it('answers 403 for a missing or different X-Account-Id when the server has one', async () => {
    const ws = FakeWorkspace.fromCounts([1]);
    const api = await start(ws, { accountId: ACCOUNT });
    const id = ws.list()[0]!.id;
    expect((await get(api, msgs(id))).status).toBe(403);
    const other = await get(api, msgs(id), { 'X-Api-Key': KEY, 'X-Account-Id': '11111111-1111-4111-8111-111111111111' });
    expect(other.status).toBe(403);
    expect(other.json.error.code).toBe('forbidden');
    expect((await get(api, msgs(id), { 'X-Account-Id': ACCOUNT })).status).toBe(401);
    expect((await get(api, msgs(id), { 'X-Api-Key': KEY, 'X-Account-Id': ACCOUNT })).status).toBe(200);
    expect(api.requests.at(-1)).toMatchObject({ method: 'GET', path: msgs(id), apiKey: KEY, accountId: ACCOUNT, status: 200 });
  });

  it('does not fake the signed-in-user endpoints (POST /v1/sessions, GET /v1/me): 404', async () => {
    const api = await start(FakeWorkspace.fromCounts([]));
    const post = await fetch(api.url + '/v1/sessions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(post.status).toBe(404);
    await post.text();
    expect((await get(api, '/v1/me', { Authorization: 'Bearer x' })).status).toBe(404);
  });
});

describe('fault injection', () => {
  it('serves 429 with Retry-After once, then recovers', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const api = await start(ws);
    api.injectFault({ kind: 'status', status: 429, retryAfter: '2' });
    const r = await get(api, '/v1/conversations');
    expect(r.status).toBe(429);
    expect(r.headers.get('retry-after')).toBe('2');
    expect(r.json.error.code).toBe('rate_limited');
    expect((await get(api, '/v1/conversations')).status).toBe(200);
    expect(api.requests.map((q) => q.status)).toEqual([429, 200]);
  });

  it('matches faults by path and page, counts times, and can serve a non-JSON 200', async () => {
    const ws = FakeWorkspace.fromCounts([120]);
    const api = await start(ws);
    const id = ws.list()[0]!.id;
    api.injectFault({ kind: 'status', status: 503, match: { path: /\/messages$/, page: 2 }, times: 2 });
    api.injectFault({ kind: 'status', status: 200, body: '<html>oops</html>', match: { path: '/v1/conversations' } });
    expect((await get(api, msgs(id))).status).toBe(200);
    expect((await get(api, msgs(id, '?page=2'))).status).toBe(503);
    expect((await get(api, msgs(id, '?page=2'))).status).toBe(503);
    expect((await get(api, msgs(id, '?page=2'))).status).toBe(200);
    const html = await get(api, '/v1/conversations');
    expect(html.status).toBe(200);
    expect(html.text).toBe('<html>oops</html>');
    expect(html.json).toBeUndefined();
    api.injectFault({ kind: 'status', status: 500, times: Infinity });
    expect((await get(api, '/v1/conversations')).status).toBe(500);
    expect((await get(api, '/v1/conversations')).status).toBe(500);
    api.clearFaults();
    expect((await get(api, '/v1/conversations')).status).toBe(200);
  });

  it('does not apply faults to unauthenticated requests', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    api.injectFault({ kind: 'status', status: 503 });
    expect((await get(api, '/v1/conversations', {})).status).toBe(401);
    expect((await get(api, '/v1/conversations')).status).toBe(503);
  });

  it('drops the connection: fetch rejects and the request is recorded as dropped', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    api.injectFault({ kind: 'drop' });
    await expect(get(api, '/v1/conversations')).rejects.toThrow();
    expect(api.requests).toHaveLength(1);
    expect(api.requests[0]!.status).toBe('dropped');
    expect((await get(api, '/v1/conversations')).status).toBe(200);
    // Also on a reused keep-alive connection (the client must not silently retry).
    api.injectFault({ kind: 'drop', match: { page: 2 } });
    await expect(get(api, '/v1/conversations?page=2')).rejects.toThrow();
    expect(api.requests.map((q) => q.status)).toEqual(['dropped', 200, 'dropped']);
  });

  it('answers slowly after delayMs', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    api.injectFault({ kind: 'slow', delayMs: 300, times: 1 });
    // The slowed request is sent first and answered last: the one after it was not slowed.
    const order: string[] = [];
    const slow = get(api, '/v1/conversations').then((r) => (order.push('slowed'), r));
    await waitFor(() => api.requests.length === 1, 5000, 'the slowed request to arrive');
    const fast = get(api, '/v1/conversations?page=1').then((r) => (order.push('plain'), r));
    const [a, b] = await Promise.all([slow, fast]);
    expect([a.status, b.status]).toEqual([200, 200]);
    expect(order).toEqual(['plain', 'slowed']);
  });

  it('holds a request until the test releases it, then answers it normally', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    let release!: () => void;
    api.injectFault({ kind: 'hold', until: new Promise<void>((r) => (release = r)), times: 1 });
    const order: string[] = [];
    const held = get(api, '/v1/conversations').then((r) => (order.push('held'), r));
    await waitFor(() => api.requests.length === 1, 5000, 'the held request to arrive');
    const plain = await get(api, '/v1/conversations?page=1');
    order.push('plain');
    expect(api.requests.map((q) => q.status)).toEqual([0, 200]);
    release();
    expect((await held).status).toBe(200);
    expect(plain.status).toBe(200);
    expect(order).toEqual(['plain', 'held']);
  });

  it('validates faults', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    expect(() => api.injectFault({ kind: 'drop', times: 0 })).toThrow(RangeError);
    expect(() => api.injectFault({ kind: 'status', status: 42 })).toThrow(RangeError);
    expect(() => api.injectFault({ kind: 'slow', delayMs: -1 })).toThrow(RangeError);
  });
});

describe('hostile faults: huge, endless, runaway', () => {
  it('records bytesSent for ordinary answers', async () => {
    const api = await start(FakeWorkspace.fromCounts([3]));
    const r = await get(api, '/v1/conversations');
    expect(api.requests[0]!.bytesSent).toBe(Buffer.byteLength(r.text));
    expect(api.requests[0]!.closedEarly).toBe(false);
  });

  it('huge: exactly `bytes` bytes of valid JSON with content-length, or chunked without', async () => {
    const ws = FakeWorkspace.fromCounts([3]);
    const api = await start(ws);
    const id = ws.list()[0]!.id;
    const bytes = 300_000;
    api.injectFault({ kind: 'huge', bytes, match: { page: 2 } });
    const sized = await get(api, msgs(id, '?page=2&per_page=100'));
    expect(sized.status).toBe(200);
    expect(sized.headers.get('content-length')).toBe(String(bytes));
    expect(Buffer.byteLength(sized.text)).toBe(bytes);
    expect(sized.json.data).toEqual([]);
    expect(sized.json.meta).toEqual({ current_page: 2, total_pages: 0, total_count: 0 });
    expect(sized.json.padding).toMatch(/^x+$/);

    api.injectFault({ kind: 'huge', bytes, contentLength: false });
    const chunked = await get(api, '/v1/conversations');
    expect(chunked.headers.get('content-length')).toBeNull();
    expect(chunked.headers.get('transfer-encoding')).toBe('chunked');
    expect(Buffer.byteLength(chunked.text)).toBe(bytes);
    expect(chunked.json.meta.current_page).toBe(1);

    expect(api.requests.map((q) => [q.status, q.bytesSent, q.closedEarly])).toEqual([
      [200, bytes, false],
      [200, bytes, false],
    ]);
    // Consumed: the next request is ordinary.
    expect((await get(api, '/v1/conversations')).json.data).toHaveLength(1);
  });

  it('huge: stops writing soon after the client hangs up (backpressure)', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    const bytes = 1024 * 1024 * 1024;
    api.injectFault({ kind: 'huge', bytes, contentLength: false });
    const r = await getPartial(api, '/v1/conversations', 256 * 1024);
    expect(r.status).toBe(200);
    expect(r.complete).toBe(false);
    await api.whenStreamsEnd();
    const rec = api.requests[0]!;
    expect(rec.closedEarly).toBe(true);
    expect(rec.bytesSent).toBeGreaterThanOrEqual(r.received);
    // Only what the socket buffers hold beyond what was read, far below the 1 GiB body.
    expect(rec.bytesSent).toBeLessThan(32 * 1024 * 1024);
  });

  it('endless: chunked filler until the client hangs up', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    api.injectFault({ kind: 'endless' });
    const r = await getPartial(api, '/v1/conversations?page=4', 2 * 1024 * 1024);
    expect(r.status).toBe(200);
    expect(r.headers['content-length']).toBeUndefined();
    expect(r.headers['transfer-encoding']).toBe('chunked');
    expect(r.received).toBeGreaterThanOrEqual(2 * 1024 * 1024);
    await api.whenStreamsEnd();
    const rec = api.requests[0]!;
    expect(rec.closedEarly).toBe(true);
    expect(rec.bytesSent).toBeGreaterThanOrEqual(r.received);
    expect(rec.bytesSent).toBeLessThan(r.received + 32 * 1024 * 1024);
  });

  it('close() stops an endless writer blocked by backpressure, and resolves', async () => {
    const api = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: KEY });
    api.injectFault({ kind: 'endless' });
    // Read the head, then stop reading (the socket fills up and the writer waits for 'drain').
    let res!: http.IncomingMessage;
    await new Promise<void>((resolve) => {
      http.get(api.url + '/v1/conversations', { headers: { 'X-Api-Key': KEY }, agent: false }, (r) => {
        res = r;
        r.once('data', (c: Buffer) => {
          expect(c.toString()).toMatch(/^\{"data":\[\],"meta":\{"current_page":1,/);
          r.pause();
          resolve();
        });
      });
    });
    await api.close();
    await api.whenStreamsEnd();
    expect(api.requests[0]!.closedEarly).toBe(true);
    // The client, reading again, drains what was buffered and then sees the connection end.
    const ended = new Promise<void>((resolve) => res.on('close', resolve));
    res.on('error', () => {});
    res.resume();
    await ended;
  });

  it('runaway: full pages of unique schema-valid records, always one page more', async () => {
    const ws = FakeWorkspace.fromCounts([2]);
    const api = await start(ws);
    api.injectFault({ kind: 'runaway', match: { path: '/v1/conversations' }, times: Infinity });
    const p3 = await get(api, '/v1/conversations?page=3&per_page=100');
    const p4 = await get(api, '/v1/conversations?page=4&per_page=100');
    for (const [p, page] of [[p3, 3], [p4, 4]] as const) {
      expect(p.status).toBe(200);
      expect(ConversationsPageSchema.safeParse(p.json).success).toBe(true);
      expect(p.json.data).toHaveLength(100);
      expect(p.json.meta).toEqual({ current_page: page, total_pages: page + 1, total_count: (page + 1) * 100 });
      for (const c of p.json.data) expect(c.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-8[0-9a-f]{3}-[0-9a-f]{12}$/);
    }
    const ids = [...p3.json.data, ...p4.json.data].map((c: { id: string }) => c.id);
    expect(new Set(ids).size).toBe(200);
    expect((await get(api, '/v1/conversations?per_page=7')).json.data).toHaveLength(7);
    // Deterministic.
    expect((await get(api, '/v1/conversations?page=3&per_page=100')).text).toBe(p3.text);
    // Other routes are handled normally by a runaway fault that matches them (it is consumed).
    api.clearFaults();
    api.injectFault({ kind: 'runaway' });
    expect((await get(api, '/v1/nope')).status).toBe(404);
    const real = await get(api, msgs(ws.list()[0]!.id, '?per_page=100'));
    expect(real.json.meta).toEqual({ current_page: 1, total_pages: 1, total_count: 2 });
  });

  it('runaway: messages of any conversation id, created_at increasing across pages', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    api.injectFault({ kind: 'runaway', match: { path: /\/messages$/ }, times: 2 });
    const id = '00000000-0000-4000-8000-00000000abcd';
    const p1 = await get(api, msgs(id, '?page=1&per_page=100'));
    const p2 = await get(api, msgs(id, '?page=2&per_page=100'));
    for (const p of [p1, p2]) expect(MessagesPageSchema.safeParse(p.json).success).toBe(true);
    expect(p2.json.meta).toEqual({ current_page: 2, total_pages: 3, total_count: 300 });
    const all = [...p1.json.data, ...p2.json.data];
    expect(new Set(all.map((m: { id: string }) => m.id)).size).toBe(200);
    const times = all.map((m: { created_at: string }) => m.created_at);
    expect([...times].sort()).toEqual(times);
    expect(new Set(times).size).toBe(200);
    // times: 2 used up: an unknown conversation is a 404 again.
    expect((await get(api, msgs(id))).status).toBe(404);
  });

  it('validates huge faults', async () => {
    const api = await start(FakeWorkspace.fromCounts([1]));
    expect(() => api.injectFault({ kind: 'huge', bytes: MIN_HUGE_BYTES - 1 })).toThrow(RangeError);
    expect(() => api.injectFault({ kind: 'huge', bytes: 1.5e3 + 0.5 })).toThrow(RangeError);
    expect(() => api.injectFault({ kind: 'endless', times: 0 })).toThrow(RangeError);
    api.injectFault({ kind: 'huge', bytes: MIN_HUGE_BYTES });
    const r = await get(api, '/v1/conversations');
    expect(Buffer.byteLength(r.text)).toBe(MIN_HUGE_BYTES);
    expect(r.json.data).toEqual([]);
  });
});

describe('mutations mid-crawl', () => {
  it('beforeServe can mutate the workspace when page 2 is requested; unsubscribe stops it', async () => {
    const ws = FakeWorkspace.fromCounts([60, 10]);
    const api = await start(ws);
    const [a, b] = ws.list();
    const unsubscribe = api.beforeServe((req) => {
      if (req.path === msgs(a!.id) && req.query['page'] === '2') ws.appendMessages(a!.id, 5);
    });
    const p1 = await get(api, msgs(a!.id));
    expect(p1.json.meta.total_count).toBe(60);
    const p2 = await get(api, msgs(a!.id, '?page=2'));
    expect(p2.json.meta.total_count).toBe(65);
    expect(p2.json.data).toHaveLength(15);
    unsubscribe();
    expect((await get(api, msgs(a!.id, '?page=2'))).json.meta.total_count).toBe(65);

    ws.moveToFront(b!.id);
    expect((await get(api, '/v1/conversations?per_page=1')).json.data[0].id).toBe(b!.id);
  });

  it('keeps data current and answers 404 after deleteConversation', async () => {
    const ws = FakeWorkspace.fromCounts([5, 5]);
    const api = await start(ws);
    const [a, b] = ws.list();
    const lastBefore = a!.messages.at(-1)!.created_at;
    const activityBefore = a!.data['last_activity_at'] as string;
    const added = ws.appendMessages(a!.id, 2);
    expect(added[0]!.created_at > lastBefore).toBe(true);
    expect(added[1]!.created_at > added[0]!.created_at).toBe(true);
    expect(a!.data['messages_count']).toBe(7);
    expect((a!.data['last_activity_at'] as string) > activityBefore).toBe(true);

    ws.editMessage(a!.id, added[0]!.id, 'edited ✏️');
    ws.deleteMessage(a!.id, a!.messages[0]!.id);
    const page = await get(api, msgs(a!.id));
    expect(page.json.meta.total_count).toBe(6);
    expect(page.json.data[4].content).toBe('edited ✏️');

    ws.deleteConversation(b!.id);
    expect((await get(api, msgs(b!.id))).status).toBe(404);
    const list = await get(api, '/v1/conversations');
    expect(list.json.data.map((c: { id: string }) => c.id)).toEqual([a!.id]);

    const fresh = ws.addConversation(3);
    const back = ws.addConversation(0, 'back');
    expect(ws.list().map((c) => c.id)).toEqual([fresh.id, a!.id, back.id]);
    expect(ws.totals()).toEqual({ conversations: 3, messages: 9 });
    expect(() => ws.deleteConversation(b!.id)).toThrow();
  });
});

describe('data generator', () => {
  it('is deterministic: same seed and calls give identical JSON over HTTP', async () => {
    const make = () => {
      const ws = FakeWorkspace.generate({ seed: 99, conversations: 40 });
      const target = ws.list()[3]!.id;
      ws.appendMessages(target, 3);
      ws.addConversation(4);
      return ws;
    };
    const [api1, api2] = await Promise.all([start(make()), start(make())]);
    const c1 = await get(api1, '/v1/conversations?per_page=100');
    const c2 = await get(api2, '/v1/conversations?per_page=100');
    expect(c1.text).toBe(c2.text);
    const busiest = api1.workspace.list().reduce((x, y) => (y.messages.length > x.messages.length ? y : x));
    for (const page of [1, 2, 3]) {
      const q = msgs(busiest.id, `?page=${page}&per_page=100`);
      expect((await get(api1, q)).text).toBe((await get(api2, q)).text);
    }
    const other = FakeWorkspace.generate({ seed: 100, conversations: 40 });
    expect(JSON.stringify(other.list()[0]!.data)).not.toBe(JSON.stringify(api1.workspace.list()[1]!.data));
  });

  it('generates UUID conversation ids, unique message ids and the documented message shape', () => {
    const ws = FakeWorkspace.generate({ seed: 5, conversations: 60 });
    const ids = new Set<string>();
    for (const c of ws.list()) {
      expect(c.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      expect(c.data['id']).toBe(c.id);
      expect(c.data['messages_count']).toBe(c.messages.length);
      for (const m of c.messages) {
        ids.add(m.id);
        expect(['global', 'personal']).toContain(m.visibility);
        expect(['Customer', 'User']).toContain(m.sender.type);
        if (m.visibility === 'personal') expect(m.sender.type).toBe('User');
        if ('attachments' in m) expect(Array.isArray(m.attachments)).toBe(true);
      }
    }
    expect(ids.size).toBe(ws.totals().messages);
  });

  it('meets the size requirement: 30k–45k messages for 320 conversations, one over 1,000', () => {
    for (const [seed, n] of [
      [42, 320],
      [1, 300],
      [2, 320],
    ] as const) {
      const ws = FakeWorkspace.generate({ seed, conversations: n });
      const { conversations, messages } = ws.totals();
      expect(conversations).toBe(n);
      expect(messages, `seed ${seed}`).toBeGreaterThanOrEqual(30_000);
      expect(messages, `seed ${seed}`).toBeLessThanOrEqual(45_000);
      const counts = ws.list().map((c) => c.messages.length);
      expect(counts.some((x) => x > 1_000)).toBe(true);
      for (const special of [99, 100, 101, 200, 250, 1200]) expect(counts).toContain(special);
    }
  });
});

describe('lifecycle', () => {
  it('close() resolves with an idle keep-alive connection open, is idempotent, and stops listening', async () => {
    const api = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: KEY });
    expect(api.url).toBe(`http://127.0.0.1:${api.port}`);
    expect((await get(api, '/v1/conversations')).status).toBe(200);
    await api.close();
    await api.close();
    await expect(fetch(`${api.url}/v1/conversations`, { headers: { 'X-Api-Key': KEY } })).rejects.toThrow();
  });
});

describe('admin route (not part of the API)', () => {
  it('POST /_fake/conversations/:id/messages?count=N appends messages, with the API key only', async () => {
    const { FakeWorkspace: W, startFakeApi: start } = await import('../src/fake-api/index.js');
    const ws = W.fromCounts([2]);
    const api = await start({ workspace: ws, apiKey: 'k' });
    try {
      const id = ws.list()[0]!.id;
      const denied = await fetch(`${api.url}/_fake/conversations/${id}/messages?count=3`, { method: 'POST' });
      expect(denied.status).toBe(401);
      const ok = await fetch(`${api.url}/_fake/conversations/${id}/messages?count=3`, { method: 'POST', headers: { 'x-api-key': 'k' } });
      expect(ok.status).toBe(201);
      expect(((await ok.json()) as { appended: string[] }).appended).toHaveLength(3);
      expect(ws.get(id)!.messages).toHaveLength(5);
    } finally {
      await api.close();
    }
  });
});
