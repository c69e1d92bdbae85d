/**
 * The webhook trigger `POST /webhooks/conversations` (src/server/webhooks.ts) over real HTTP, signed
 * with the `standardwebhooks` library itself: a valid event is queued once (202 with the job id);
 * every refusal (missing or bad signature, another secret, a stale or future timestamp, a replayed
 * webhook-id, no id, an unknown or unnamed workspace, a body that is not JSON, one over 1 MiB)
 * queues nothing; without a secret the route does not exist; a failed enqueue answers 503 and the
 * sender's retry is accepted; the secret never reaches the log. The replay window on an injected
 * clock: an id is remembered until its own timestamp plus the tolerance, so a future-timestamped
 * delivery replayed later is still refused, and a full memory refuses with 503 and Retry-After
 * instead of forgetting an id early. Ids a terminal would interpret (C0/C1 controls, DEL, bidi
 * controls, U+2028/2029, lone surrogates) refused with 422 naming the class and code point. Refusal
 * logs throttled to one line per class per 10 s with the count suppressed (2,000 unsigned POSTs),
 * and no refusal line carrying the body, the signature, the secret or a raw control character.
 * Plus the JSON pointer resolver and the replay cache on an injected clock.
 */
import { Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import pino from 'pino';
import { Webhook } from 'standardwebhooks';
import { Pool } from 'undici';
import { Metrics, ReplayCache, resolvePointer, startServer, type RunningServer, type WebhookOptions } from '../src/server/index.js';
import { unsafeCharOf } from '../src/terminal.js';

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
async function serve(o: { accounts?: string[]; webhooks?: false; enqueue?: WebhookOptions['enqueue']; now?: () => number; enqueueTimeoutMs?: number; maxRememberedIds?: number; setTimer?: WebhookOptions['setTimer'] } = {}) {
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
    ...(o.maxRememberedIds ? { maxRememberedIds: o.maxRememberedIds } : {}),
    ...(o.setTimer ? { setTimer: o.setTimer } : {}),
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
  return { status: res.status, body: (await res.json().catch(() => undefined)) as Record<string, string> | undefined, retryAfter: res.headers.get('retry-after') };
}

/** The log's lines, parsed. */
const logLines = (log: string): Record<string, unknown>[] => log.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);

describe('POST /webhooks/conversations', () => {
  it('a valid event is queued once: 202 with the job id, the conversation and the workspace', async () => {
    const { server, queued, log } = await serve();
    const body = JSON.stringify({ type: 'conversation.updated', conversation_id: 'conv-1' });
    const r = await post(server, body, signed(body));
    expect(r).toMatchObject({ status: 202, body: { job_id: 'job-1', conversation_id: 'conv-1', account_id: A } });
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

  it('a webhook-id is refused (409) while remembered: until its own timestamp plus the tolerance, after which its timestamp is refused (401)', async () => {
    let now = Date.UTC(2026, 0, 1);
    const { server, queued } = await serve({ now: () => now });
    const body = JSON.stringify({ conversation_id: 'conv-r' });
    const headers = signed(body, { id: 'msg_replayed', at: new Date(now) });
    expect((await post(server, body, headers)).status).toBe(202);
    const again = await post(server, body, headers);
    expect(again.status).toBe(409);
    expect(again.body?.error).toMatch(/^replayed: webhook-id "msg_replayed" was already received at 2026-01-01T00:00:00.000Z \(remembered until 2026-01-01T00:05:00.000Z, its timestamp plus 300 s\)$/);
    now += 5 * 60_000; // the timestamp plus the tolerance: the last instant the request passes the timestamp check
    expect((await post(server, body, headers)).status).toBe(409);
    now += 1;
    expect(await post(server, body, headers)).toMatchObject({ status: 401, body: { error: 'invalid webhook: Message timestamp too old' } });
    expect(queued).toHaveLength(1);
    // Ahead of the clock (timestamps are whole seconds): exactly 300 s is accepted, 301 s is not.
    now += 999;
    expect(now % 1000).toBe(0);
    expect((await post(server, body, signed(body, { at: new Date(now + 300_000) }))).status).toBe(202);
    expect(await post(server, body, signed(body, { at: new Date(now + 301_000) }))).toMatchObject({ status: 401, body: { error: 'invalid webhook: Message timestamp too new' } });
  });

  it('a delivery timestamped 290 s ahead, replayed 310 s later, is refused (409): its id is remembered until timestamp + 300 s, not 300 s from acceptance', async () => {
    const t0 = Date.UTC(2026, 0, 1);
    let now = t0;
    const { server, queued } = await serve({ now: () => now });
    const body = JSON.stringify({ conversation_id: 'conv-future' });
    const captured = signed(body, { id: 'msg_future', at: new Date(t0 + 290_000) });
    expect((await post(server, body, captured)).status).toBe(202);
    now = t0 + 310_000; // 5 min 10 s after acceptance; the timestamp is still only 20 s old
    const replay = await post(server, body, captured);
    expect(replay.status).toBe(409);
    expect(replay.body?.error).toContain('remembered until 2026-01-01T00:09:50.000Z');
    now = t0 + 590_000; // timestamp + 300 s: still remembered
    expect((await post(server, body, captured)).status).toBe(409);
    now = t0 + 590_001; // past it: the timestamp check refuses the same request
    expect((await post(server, body, captured)).status).toBe(401);
    expect(queued).toHaveLength(1);
    // The past, too: a delivery 290 s old is remembered 10 s more, the rest of its timestamp's tolerance.
    now = t0 + 600_000;
    const old = signed(body, { id: 'msg_old', at: new Date(now - 290_000) });
    expect((await post(server, body, old)).status).toBe(202);
    now += 10_000;
    expect((await post(server, body, old)).status).toBe(409);
    now += 1;
    expect((await post(server, body, old)).status).toBe(401);
  });

  it('one instant per request: a replay at exactly its timestamp plus the tolerance is refused even when the clock moves while it is handled', async () => {
    const t0 = Date.UTC(2026, 0, 1);
    let now = t0;
    // Every read of this clock moves it 1 ms on: a request that read it twice would check the
    // timestamp at one instant and the replay memory at the next.
    const { server, queued } = await serve({ now: () => now++ });
    const body = JSON.stringify({ conversation_id: 'conv-edge' });
    const captured = signed(body, { id: 'msg_edge', at: new Date(t0) });
    expect((await post(server, body, captured)).status).toBe(202);
    now = t0 + 300_000; // the last instant the timestamp check passes
    expect((await post(server, body, captured)).status).toBe(409);
    expect(queued).toHaveLength(1);
  });

  it('a full replay memory refuses new deliveries with 503 and Retry-After until its first id expires (none is forgotten early); replays stay 409', async () => {
    const t0 = Date.UTC(2026, 0, 1);
    let now = t0;
    const { server, queued, log } = await serve({ now: () => now, maxRememberedIds: 2 });
    const body = JSON.stringify({ conversation_id: 'conv-full' });
    const a = signed(body, { id: 'msg_a', at: new Date(t0) }); // remembered until t0 + 300 s
    const b = signed(body, { id: 'msg_b', at: new Date(t0 + 100_000) }); // until t0 + 400 s
    expect((await post(server, body, a)).status).toBe(202);
    expect((await post(server, body, b)).status).toBe(202);
    const full = await post(server, body, signed(body, { id: 'msg_c', at: new Date(now) }));
    expect(full).toMatchObject({ status: 503, retryAfter: '301', body: { error: 'too many webhook ids to remember (2, each until its timestamp plus 300 s); retry after 301 s' } });
    expect((await post(server, body, a)).status).toBe(409); // the full memory forgot nothing
    now = t0 + 300_000;
    expect(await post(server, body, signed(body, { id: 'msg_c', at: new Date(now) }))).toMatchObject({ status: 503, retryAfter: '1' });
    now += 1; // msg_a's instant has passed: room for one
    expect((await post(server, body, signed(body, { id: 'msg_c', at: new Date(now) }))).status).toBe(202);
    expect((await post(server, body, b)).status).toBe(409);
    expect(queued).toHaveLength(3);
    expect(logLines(log()).find((l) => l['refusal'] === 'ids_full')).toMatchObject({ status: 503, msg: 'webhook refused' });
  });

  it('refuses with 422, queueing nothing: no id, an unusable id, an unknown workspace, several and none named, not JSON', async () => {
    const { server, queued } = await serve({ accounts: [A, B] });
    const cases: [string, string, Record<string, string>, RegExp][] = [
      ['no id', JSON.stringify({ account_id: A, ticket: 'x' }), {}, /no conversation id: none of \/conversation_id/],
      ['an id with a slash', JSON.stringify({ account_id: A, conversation_id: '../admin' }), {}, /not usable as an id: it holds a path separator/],
      ['an id of 257 characters', JSON.stringify({ account_id: A, conversation_id: 'x'.repeat(257) }), {}, /not usable as an id: it is over 256 characters/],
      ['an id ..', JSON.stringify({ account_id: A, conversation_id: '..' }), {}, /not usable as an id: it is "\." or "\.\."/],
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
    expect(retry).toMatchObject({ status: 202, body: { job_id: 'job-after-retry', conversation_id: 'conv-503', account_id: A } });
    expect(queued).toEqual(['conv-503']);
  });
});

describe('ids a terminal would interpret', () => {
  /** One code point of each class, at its boundaries. */
  const BAD: [string, string, string][] = [
    ['\u0000', 'C0 control', 'U+0000'],
    ['\u001b', 'C0 control', 'U+001B'],
    ['\u001f', 'C0 control', 'U+001F'],
    ['\u007f', 'DEL', 'U+007F'],
    ['\u0080', 'C1 control', 'U+0080'],
    ['\u0085', 'C1 control', 'U+0085'],
    ['\u009b', 'C1 control', 'U+009B'],
    ['\u009f', 'C1 control', 'U+009F'],
    ['\u202a', 'bidi embedding or override', 'U+202A'],
    ['\u202e', 'bidi embedding or override', 'U+202E'],
    ['\u2066', 'bidi isolate', 'U+2066'],
    ['\u2069', 'bidi isolate', 'U+2069'],
    ['\u200e', 'bidi mark', 'U+200E'],
    ['\u200f', 'bidi mark', 'U+200F'],
    ['\u061c', 'bidi mark', 'U+061C'],
    ['\u2028', 'line or paragraph separator', 'U+2028'],
    ['\u2029', 'line or paragraph separator', 'U+2029'],
    ['\ud800', 'lone surrogate', 'U+D800'],
    ['\udfff', 'lone surrogate', 'U+DFFF'],
  ];

  it('a conversation id holding any of them is refused with 422 naming the class and code point, never echoing it; their neighbours are accepted', async () => {
    const { server, queued } = await serve();
    for (const [c, cls, name] of BAD) {
      for (const id of [`conv${c}1`, `${c}conv`, `conv${c}`]) {
        const body = JSON.stringify({ conversation_id: id });
        const r = await post(server, body, signed(body));
        expect(r.status, `${name} in ${JSON.stringify(id)}`).toBe(422);
        expect(r.body?.error).toBe(`the conversation id (/conversation_id) is not usable as an id: it holds a ${cls} character (${name}) at index ${id.indexOf(c)}`);
        expect(unsafeCharOf(r.body!.error!)).toBeUndefined();
      }
    }
    expect(queued).toEqual([]);
    const fine = ['conv\u00a0x', 'conv\u202fx', 'conv\u2065x', 'conv\u206ax', 'conv\u2010x', 'conv\u061bx', 'conv\u061dx', '李伟-محمد-נועה-🤖-👍🏽', 'Zoë~ü'];
    for (const id of fine) {
      const body = JSON.stringify({ conversation_id: id });
      expect((await post(server, body, signed(body))).status, JSON.stringify(id)).toBe(202);
    }
    expect(queued.map((q) => q.conversationId)).toEqual(fine);
  });

  it('an account id holding one, in the body or the X-Account-Id header, is refused with 422 naming where, the class and the code point', async () => {
    const { server, queued } = await serve({ accounts: [A, B] });
    const cases: [Record<string, unknown>, Record<string, string>, string][] = [
      [{ conversation_id: 'c', account_id: `${A}\u202e` }, {}, `the account id (/account_id) is not usable as an id: it holds a bidi embedding or override character (U+202E) at index 36`],
      [{ conversation_id: 'c', data: { account_id: `\u2066${A}` } }, {}, `the account id (/data/account_id) is not usable as an id: it holds a bidi isolate character (U+2066) at index 0`],
      [{ conversation_id: 'c', account_id: `${A}\u0085` }, {}, `the account id (/account_id) is not usable as an id: it holds a C1 control character (U+0085) at index 36`],
      // A header's bytes 0x80-0xFF arrive as U+0080-U+00FF.
      [{ conversation_id: 'c' }, { 'x-account-id': `${A}\u0085` }, `the account id (X-Account-Id header) is not usable as an id: it holds a C1 control character (U+0085) at index 36`],
      [{ conversation_id: 'c' }, { 'x-account-id': `\u009b${A}` }, `the account id (X-Account-Id header) is not usable as an id: it holds a C1 control character (U+009B) at index 0`],
    ];
    for (const [event, extra, error] of cases) {
      const body = JSON.stringify(event);
      const r = await post(server, body, { ...signed(body), ...extra });
      expect(r, error).toMatchObject({ status: 422, body: { error } });
    }
    expect(queued).toEqual([]);
  });

  it('a signed webhook-id holding one is refused with 422 (it is logged, escaped); an unsigned one gets its 401 and is logged escaped', async () => {
    const { server, queued, log } = await serve();
    const body = JSON.stringify({ conversation_id: 'c' });
    for (const [id, error] of [
      ['msg_\u0085x', 'the webhook-id header is not usable as an id: it holds a C1 control character (U+0085) at index 4'],
      ['msg_\u009b2J', 'the webhook-id header is not usable as an id: it holds a C1 control character (U+009B) at index 4'],
      ['msg\tx', 'the webhook-id header is not usable as an id: it holds a C0 control character (U+0009) at index 3'],
      [`msg_${'x'.repeat(253)}`, 'the webhook-id header is not usable as an id: it is over 256 characters'],
    ] as const) {
      expect(await post(server, body, signed(body, { id }))).toMatchObject({ status: 422, body: { error } });
    }
    expect(queued).toEqual([]);
    const lines = logLines(log());
    expect(lines.find((l) => l['refusal'] === 'bad_id')).toMatchObject({ status: 422, webhook_id: 'msg_\\u{0085}x' });
    const unsigned = await post(server, body, { 'content-type': 'application/json', 'webhook-id': 'evil\u009b2J\u0085' });
    expect(unsigned.status).toBe(401);
    expect(logLines(log()).find((l) => l['refusal'] === 'missing_header')).toMatchObject({ webhook_id: 'evil\\u{009B}2J\\u{0085}' });
    for (const line of log().split('\n')) expect(unsafeCharOf(line), line).toBeUndefined();
  });
});

describe('refusal logs', () => {
  it('2,000 unsigned POSTs: 2,000 answers as before, one log line; after 10 s the next line carries suppressed: 1999, and a window still open at shutdown is summed up', async () => {
    let now = Date.UTC(2026, 0, 1);
    // The summary timers fire only when the test says: real ones could fire mid-test on a slow machine.
    const timers: { fn: () => void; ms: number }[] = [];
    const setTimer = (fn: () => void, ms: number) => {
      const t = { fn, ms };
      timers.push(t);
      return () => void timers.splice(timers.indexOf(t), 1);
    };
    const { server, queued, log } = await serve({ now: () => now, setTimer });
    const body = JSON.stringify({ conversation_id: 'c', note: 'BODY-MARKER' });
    const unsigned = { 'content-type': 'application/json', 'webhook-id': 'msg_flood', 'webhook-timestamp': String(Math.floor(now / 1000)) };
    const answers = new Map<string, number>();
    let sent = 0;
    // 16 senders over 16 keep-alive connections (undici's pool: fetch costs ~4x more per request); bounded: 2,000 requests in all.
    const pool = new Pool(server.url, { connections: 16 });
    try {
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          while (sent < 2000) {
            sent++;
            const r = await pool.request({ path: '/webhooks/conversations', method: 'POST', body, headers: unsigned });
            const key = `${r.statusCode} ${await r.body.text()}`;
            answers.set(key, (answers.get(key) ?? 0) + 1);
          }
        }),
      );
    } finally {
      await pool.close();
    }
    expect([...answers]).toEqual([['401 {"error":"missing webhook-signature header (Standard Webhooks)"}', 2000]]);
    const refused = () => logLines(log()).filter((l) => String(l['msg']).startsWith('webhook refus'));
    expect(refused()).toEqual([expect.objectContaining({ msg: 'webhook refused', refusal: 'missing_header', status: 401, webhook_id: 'msg_flood', reason: 'missing webhook-signature header (Standard Webhooks)', component: 'webhooks' })]);
    expect(refused()[0]).not.toHaveProperty('suppressed');

    // Another class is logged in the same window.
    const badSig = { ...unsigned, 'webhook-signature': 'v1,c2lnbmF0dXJlLW9mLW5vLXNlY3JldA==' };
    expect((await post(server, body, badSig)).status).toBe(401);
    expect(refused()).toHaveLength(2);
    expect(refused()[1]).toMatchObject({ refusal: 'bad_signature', reason: 'invalid webhook: No matching signature found' });

    now += 9_999; // the bad signature's window too is still open
    expect((await post(server, body, badSig)).status).toBe(401);
    expect(refused()).toHaveLength(2);
    now += 1;
    const ts = { ...unsigned, 'webhook-timestamp': String(Math.floor(now / 1000)) };
    expect((await post(server, body, ts)).status).toBe(401);
    expect(refused()).toHaveLength(3);
    expect(refused()[2]).toMatchObject({ msg: 'webhook refused', refusal: 'missing_header', suppressed: 1999 });

    // The bad signature's window closed with 1 suppressed and no line since: its timer writes the summary.
    expect(timers.map((t) => t.ms)).toEqual([1]);
    timers.splice(0).forEach((t) => t.fn());
    expect(refused()[3]).toMatchObject({ msg: 'webhook refusals suppressed', refusal: 'bad_signature', suppressed: 1, window_ms: 10_000 });

    for (let i = 0; i < 3; i++) await post(server, body, ts);
    await server.close(); // the new unsigned window, still open, is summed up at shutdown
    expect(refused().slice(4)).toEqual([expect.objectContaining({ msg: 'webhook refusals suppressed', refusal: 'missing_header', suppressed: 3, window_ms: 10_000 })]);
    expect(timers).toEqual([]);
    expect(queued).toEqual([]);
    expect(log()).not.toContain('BODY-MARKER');
    expect(log()).not.toContain('c2lnbmF0dXJlLW9mLW5vLXNlY3JldA');
    expect(log()).not.toContain(SECRET.slice('whsec_'.length));
  });

  it('each refusal class is logged with its class, status and reason, and never with the body, the signature or the secret', async () => {
    let now = Date.UTC(2026, 0, 1);
    const { server, log } = await serve({ now: () => now, accounts: [A, B] });
    const at = () => new Date(now);
    const event = (o: Record<string, unknown>) => JSON.stringify({ secret_note: 'BODY-MARKER', account_id: A, ...o });
    const replayed = event({ conversation_id: 'r' });
    const replayedHeaders = signed(replayed, { id: 'msg_twice', at: at() });
    const sent: [string, Record<string, string>][] = [];
    const send = async (body: string, headers: Record<string, string>) => {
      sent.push([body, headers]);
      return (await post(server, body, headers)).status;
    };
    const b = event({ conversation_id: 'c' });
    expect(await send(b, { 'content-type': 'application/json' })).toBe(401);
    expect(await send(b, { ...signed(b, { at: at() }), 'webhook-timestamp': '17e8' })).toBe(401);
    expect(await send(b, signed(b, { at: new Date(now - 301_000) }))).toBe(401);
    expect(await send(b, { ...signed(b, { at: at() }), 'webhook-signature': signed('other', { at: at() })['webhook-signature']! })).toBe(401);
    expect(await send(replayed, replayedHeaders)).toBe(202);
    expect(await send(replayed, replayedHeaders)).toBe(409);
    const badId = event({ conversation_id: 'x\u202ey' });
    expect(await send(badId, signed(badId, { at: at() }))).toBe(422);
    expect(await send('not json BODY-MARKER', signed('not json BODY-MARKER', { at: at() }))).toBe(422);
    const noId = event({});
    expect(await send(noId, signed(noId, { at: at() }))).toBe(422);
    const unknown = event({ conversation_id: 'c', account_id: 'nope' });
    expect(await send(unknown, signed(unknown, { at: at() }))).toBe(422);
    const big = event({ conversation_id: 'c', pad: 'x'.repeat(1024 * 1024) });
    const tooLarge = await fetch(`${server.url}/webhooks/conversations`, { method: 'POST', body: big, headers: signed(big, { at: at() }) });
    expect(tooLarge.status).toBe(413);
    // The answer is Fastify's, as before; only the log line is new.
    expect(await tooLarge.json()).toEqual({ statusCode: 413, code: 'FST_ERR_CTP_BODY_TOO_LARGE', error: 'Payload Too Large', message: 'Request body is too large' });

    const lines = logLines(log()).filter((l) => l['msg'] === 'webhook refused');
    expect(lines.map((l) => [l['refusal'], l['status']])).toEqual([
      ['missing_header', 401],
      ['bad_timestamp', 401],
      ['stale_timestamp', 401],
      ['bad_signature', 401],
      ['replay', 409],
      ['bad_id', 422],
      ['bad_json', 422],
      ['no_id', 422],
      ['unknown_workspace', 422],
      ['body_too_large', 413],
    ]);
    expect(lines.find((l) => l['refusal'] === 'bad_id')!['reason']).toBe('the conversation id (/conversation_id) is not usable as an id: it holds a bidi embedding or override character (U+202E) at index 1');
    const text = log();
    expect(text).not.toContain('BODY-MARKER');
    for (const [, headers] of sent) if (headers['webhook-signature']) expect(text).not.toContain(headers['webhook-signature'].slice(3));
    expect(text).not.toContain(SECRET.slice('whsec_'.length));
    for (const line of text.split('\n')) expect(unsafeCharOf(line), line).toBeUndefined();
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

  it('remembers each id until its own instant (inclusive), in any order of instants; full, it refuses instead of forgetting', () => {
    let now = 0;
    const cache = new ReplayCache(() => now, 3);
    expect(cache.remember('late', 900)).toBe(true);
    expect(cache.remember('early', 300)).toBe(true); // accepted after, forgotten before
    expect(cache.seen('late')).toEqual({ at: 0, until: 900 });
    expect(cache.remember('mid', 600)).toBe(true);
    expect(cache.remember('extra', 1000)).toBe(false); // full: nothing forgotten early
    expect(cache.size).toBe(3);
    expect(cache.nextExpiryIn()).toBe(301);
    now = 300;
    expect(cache.seen('early')).toEqual({ at: 0, until: 300 });
    now = 301;
    expect(cache.seen('early')).toBeUndefined();
    expect(cache.size).toBe(2);
    expect(cache.remember('extra', 1000)).toBe(true);
    expect(cache.seen('mid')).toEqual({ at: 0, until: 600 });
    cache.forget('mid');
    expect(cache.seen('mid')).toBeUndefined();
    expect(cache.nextExpiryIn()).toBe(600); // 'late' at 900 + 1 - 301; the emptied bucket of 600 is skipped
    expect(cache.remember('late', 1200)).toBe(true); // re-remembered: the later instant counts
    now = 901;
    expect(cache.seen('late')).toEqual({ at: 301, until: 1200 });
    now = 1201;
    expect(cache.size).toBe(0);
    expect(cache.nextExpiryIn()).toBe(0);
  });

  it('stays bounded: 100,000 ids over 700 s of deliveries, the memory holds only those still inside their window', () => {
    let now = 0;
    const cache = new ReplayCache(() => now);
    let refused = 0;
    for (let i = 0; i < 100_000; i++) {
      now = i * 7; // 700 s in all
      const ts = Math.floor(now / 1000) * 1000 + ((i % 601) - 300) * 1000; // timestamps up to 300 s either way
      if (!cache.remember(`id-${i}`, ts + 300_000)) refused++;
    }
    expect(refused).toBe(0);
    // Only timestamps at or after now - 300 s can still be remembered: at most 601 s of ids at 1 per 7 ms.
    expect(cache.size).toBeLessThan(601_000 / 7 + 1);
    now += 601_000;
    expect(cache.size).toBe(0);
  });
});
