/**
 * The webhook trigger `POST /webhooks/conversations` (src/server/webhooks.ts) over real HTTP, signed
 * with the `standardwebhooks` library itself: a valid event is queued once (202 with the job id);
 * every refusal (missing or bad signature, another secret, a stale or future timestamp, a replayed
 * webhook-id, no id, an unknown or unnamed workspace, a body that is not JSON, one over 1 MiB)
 * queues nothing; without a secret the route does not exist; a failed enqueue answers 503 and the
 * sender's retry is accepted; the secret never reaches the log. Plus the JSON pointer resolver and
 * the replay cache on an injected clock.
 */
import { Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import pino from 'pino';
import { Webhook } from 'standardwebhooks';
import { Metrics, ReplayCache, resolvePointer, startServer, type RunningServer, type WebhookOptions } from '../src/server/index.js';

const SECRET = `whsec_${Buffer.from('convo-mirror-webhook-test-secret!').toString('base64')}`;
const OTHER_SECRET = `whsec_${Buffer.from('some-other-secret-of-32-bytes!!!').toString('base64')}`;
const A = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';
const B = '7a1c9e04-2b3d-4f5e-8a6b-1c2d3e4f5a6b';
const DEFAULT_POINTERS = ['/conversation_id', '/conversation/id', '/data/conversation_id', '/data/conversation/id'];

const servers: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

/** A server with the webhook route (unless `webhooks` is false), a recording enqueue, and a captured log. */
async function serve(o: { accounts?: string[]; webhooks?: false; enqueue?: WebhookOptions['enqueue']; now?: () => number; enqueueTimeoutMs?: number } = {}) {
  const queued: { accountId: string; conversationId: string }[] = [];
  let log = '';
  const logger = pino({ level: 'debug' }, new Writable({ write: (c, _e, cb) => ((log += String(c)), cb()) }));
  const webhooks: WebhookOptions = {
    secret: SECRET,
    idPointers: DEFAULT_POINTERS,
    accounts: o.accounts ?? [A],
    enqueue:
      o.enqueue ??
      (async (accountId, conversationId) => {
        queued.push({ accountId, conversationId });
        return `job-${queued.length}`;
      }),
    ...(o.now ? { now: o.now } : {}),
    ...(o.enqueueTimeoutMs ? { enqueueTimeoutMs: o.enqueueTimeoutMs } : {}),
  };
  const server = await startServer(
    { logger, metrics: new Metrics({ processMetrics: false }), checks: [], ...(o.webhooks === false ? {} : { webhooks }) },
    { host: '127.0.0.1', port: 0 },
  );
  servers.push(server);
  return { server, queued, log: () => log };
}

let seq = 0;
/** Signed headers for `body` (a fresh webhook-id unless given; `at` = now unless given). */
function signed(body: string, o: { id?: string; at?: Date; secret?: string } = {}): Record<string, string> {
  const id = o.id ?? `msg_test_${++seq}`;
  const at = o.at ?? new Date();
  return {
    'content-type': 'application/json',
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': new Webhook(o.secret ?? SECRET).sign(id, at, body),
  };
}

async function post(server: RunningServer, body: string, headers: Record<string, string>) {
  const res = await fetch(`${server.url}/webhooks/conversations`, { method: 'POST', body, headers });
  return { status: res.status, body: (await res.json().catch(() => undefined)) as Record<string, string> | undefined };
}

describe('POST /webhooks/conversations', () => {
  it('a valid event is queued once: 202 with the job id, the conversation and the workspace', async () => {
    const { server, queued, log } = await serve();
    const body = JSON.stringify({ type: 'conversation.updated', conversation_id: 'conv-1' });
    const r = await post(server, body, signed(body));
    expect(r).toEqual({ status: 202, body: { job_id: 'job-1', conversation_id: 'conv-1', account_id: A } });
    expect(queued).toEqual([{ accountId: A, conversationId: 'conv-1' }]);
    expect(log()).toContain('webhook accepted');
    expect(log()).not.toContain(SECRET);
    expect(log()).not.toContain(SECRET.slice('whsec_'.length));
  });

  it('finds the id at each default pointer, in order, and the workspace in the body, the header, or as the only one', async () => {
    const { server, queued } = await serve({ accounts: [A, B] });
    const cases: [unknown, Record<string, string>, string, string][] = [
      [{ conversation: { id: 'c-nested' }, account_id: B }, {}, 'c-nested', B],
      [{ data: { conversation_id: 'c-data', account_id: A.toUpperCase() } }, {}, 'c-data', A],
      [{ data: { conversation: { id: 'c-deep' } } }, { 'x-account-id': B }, 'c-deep', B],
      [{ conversation_id: 'first', data: { conversation_id: 'second' }, account_id: A }, {}, 'first', A],
      [{ conversation_id: 42, conversation: { id: 'string-wins' }, account_id: A }, {}, 'string-wins', A],
    ];
    for (const [event, extra, id, account] of cases) {
      const body = JSON.stringify(event);
      const r = await post(server, body, { ...signed(body), ...extra });
      expect(r.status, JSON.stringify(event)).toBe(202);
      expect(r.body).toMatchObject({ conversation_id: id, account_id: account });
    }
    expect(queued.map((q) => q.conversationId)).toEqual(['c-nested', 'c-data', 'c-deep', 'first', 'string-wins']);
  });

  it('refuses, queueing nothing: no signature headers, a bad signature, another secret, a stale or future timestamp (401)', async () => {
    const { server, queued } = await serve();
    const body = JSON.stringify({ conversation_id: 'conv-x' });
    const good = signed(body);
    const refusals: [string, Record<string, string>][] = [
      ['no headers', { 'content-type': 'application/json' }],
      ['no signature', { ...good, 'webhook-signature': '' }],
      ['bad signature', { ...good, 'webhook-signature': 'v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=' }],
      ['another secret', signed(body, { secret: OTHER_SECRET })],
      ['10 minutes old', signed(body, { at: new Date(Date.now() - 10 * 60_000) })],
      ['10 minutes ahead', signed(body, { at: new Date(Date.now() + 10 * 60_000) })],
      ['body changed after signing', signed(JSON.stringify({ conversation_id: 'other' }))],
    ];
    for (const [what, headers] of refusals) {
      const r = await post(server, body, headers);
      expect(r.status, what).toBe(401);
      expect(r.body?.error, what).toBeTruthy();
    }
    expect(queued).toEqual([]);
  });

  it('a webhook-id already accepted within the window is refused (409); after the window it is accepted again', async () => {
    let now = 1_000_000;
    const { server, queued } = await serve({ now: () => now });
    const body = JSON.stringify({ conversation_id: 'conv-r' });
    expect((await post(server, body, signed(body, { id: 'msg_replayed' }))).status).toBe(202);
    const again = await post(server, body, signed(body, { id: 'msg_replayed' }));
    expect(again.status).toBe(409);
    expect(again.body?.error).toMatch(/replayed: webhook-id "msg_replayed" was already received/);
    expect(queued).toHaveLength(1);
    now += 5 * 60_000 + 1;
    expect((await post(server, body, signed(body, { id: 'msg_replayed' }))).status).toBe(202);
    expect(queued).toHaveLength(2);
  });

  it('refuses with 422, queueing nothing: no id, an unusable id, an unknown workspace, several and none named, not JSON', async () => {
    const { server, queued } = await serve({ accounts: [A, B] });
    const cases: [string, string, Record<string, string>, RegExp][] = [
      ['no id', JSON.stringify({ account_id: A, ticket: 'x' }), {}, /no conversation id: none of \/conversation_id/],
      ['an id with a slash', JSON.stringify({ account_id: A, conversation_id: '../admin' }), {}, /not usable as an id/],
      ['unknown workspace', JSON.stringify({ account_id: 'c2e4a6b8-0d1f-4a3c-9e5b-7d9f1b3d5f7a', conversation_id: 'c' }), {}, /is not configured in this daemon/],
      ['unknown workspace in the header', JSON.stringify({ conversation_id: 'c' }), { 'x-account-id': 'nope' }, /"nope" is not configured/],
      ['several, none named', JSON.stringify({ conversation_id: 'c' }), {}, /no workspace named .* 2 are configured/],
      ['not JSON', 'conversation_id=c', {}, /not JSON/],
    ];
    for (const [what, body, extra, reason] of cases) {
      const r = await post(server, body, { ...signed(body), ...extra });
      expect(r.status, what).toBe(422);
      expect(r.body?.error, what).toMatch(reason);
    }
    expect(queued).toEqual([]);
  });

  it('a body over 1 MiB is refused with 413 and queues nothing', async () => {
    const { server, queued } = await serve();
    const body = JSON.stringify({ conversation_id: 'big', pad: 'x'.repeat(1024 * 1024) });
    const r = await post(server, body, signed(body));
    expect(r.status).toBe(413);
    expect(queued).toEqual([]);
  });

  it('without a secret configured the route does not exist (404), signed or not', async () => {
    const { server } = await serve({ webhooks: false });
    const body = JSON.stringify({ conversation_id: 'c' });
    expect((await post(server, body, signed(body))).status).toBe(404);
  });

  it('a failed enqueue answers 503 and forgets the webhook-id, so the sender retry is accepted', async () => {
    let fail = true;
    const queued: string[] = [];
    const { server, log } = await serve({
      enqueue: async (_a, c) => {
        if (fail) throw new Error('Redis is away');
        queued.push(c);
        return 'job-after-retry';
      },
    });
    const body = JSON.stringify({ conversation_id: 'conv-503' });
    const r = await post(server, body, signed(body, { id: 'msg_retry' }));
    expect(r.status).toBe(503);
    expect(log()).toContain('could not queue the job');
    fail = false;
    const retry = await post(server, body, signed(body, { id: 'msg_retry' }));
    expect(retry).toEqual({ status: 202, body: { job_id: 'job-after-retry', conversation_id: 'conv-503', account_id: A } });
    expect(queued).toEqual(['conv-503']);
  });
});

describe('a queue that does not answer', () => {
  it('an enqueue that hangs (Redis away) answers 503 after enqueueTimeoutMs instead of holding the sender', async () => {
    const { server, log } = await serve({ enqueue: () => new Promise<string>(() => {}), enqueueTimeoutMs: 200 });
    const body = JSON.stringify({ conversation_id: 'conv-hang' });
    const r = await post(server, body, signed(body));
    expect(r.status).toBe(503);
    expect(log()).toContain('queueing the job timed out after 200 ms');
  });
});

describe('JSON pointers and the replay cache', () => {
  it('resolves RFC 6901 pointers: keys, array indexes, ~0 and ~1 escapes, missing paths', () => {
    const doc = { a: { 'b/c': 1, 'd~e': 2, list: ['x', { id: 'y' }] }, '': 'empty key' };
    expect(resolvePointer(doc, '')).toBe(doc);
    expect(resolvePointer(doc, '/a/b~1c')).toBe(1);
    expect(resolvePointer(doc, '/a/d~0e')).toBe(2);
    expect(resolvePointer(doc, '/a/list/1/id')).toBe('y');
    expect(resolvePointer(doc, '/a/list/01')).toBeUndefined();
    expect(resolvePointer(doc, '/a/list/5')).toBeUndefined();
    expect(resolvePointer(doc, '/')).toBe('empty key');
    expect(resolvePointer(doc, '/a/missing/deeper')).toBeUndefined();
    expect(resolvePointer(doc, '/a/toString')).toBeUndefined();
    expect(resolvePointer(doc, 'a')).toBeUndefined();
  });

  it('remembers ids for the window only, and at most its cap (oldest first)', () => {
    let now = 0;
    const cache = new ReplayCache(1000, () => now, 3);
    cache.remember('a');
    now = 500;
    cache.remember('b');
    expect(cache.seenAt('a')).toBe(0);
    now = 1001;
    expect(cache.seenAt('a')).toBeUndefined();
    expect(cache.seenAt('b')).toBe(500);
    cache.remember('c');
    cache.remember('d');
    cache.remember('e');
    expect(cache.seenAt('b')).toBeUndefined();
    expect(['c', 'd', 'e'].map((id) => cache.seenAt(id))).toEqual([1001, 1001, 1001]);
    cache.forget('d');
    expect(cache.seenAt('d')).toBeUndefined();
  });
});
