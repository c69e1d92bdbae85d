/**
 * An in-process HTTP fake of the documented API (fake-api/), backing tests and the demo.
 *
 * Implements spec 4.1 (`GET /v1/conversations/:conversation_id/messages`), the conversation list
 * referred to in spec 4.2 (`GET /v1/conversations`), the API-key authentication of spec 5 and the
 * paging limits of spec 8, over a {@link FakeWorkspace}. The signed-in-user endpoints of spec 4.2
 * and 5 (`POST /v1/sessions`, `GET /v1/me`) are not faked: convo-mirror never calls them. Tests can
 * inject faults ({@link Fault}), observe every request ({@link FakeApi.requests}) and mutate the
 * workspace while a crawl is running ({@link FakeApi.beforeServe}). Uses only `node:http`.
 *
 * Order of processing for each request:
 * 1. record it in {@link FakeApi.requests};
 * 2. route it (unknown method/path → 404, no auth needed);
 * 3. authenticate it for its route (401/403; see {@link startFakeApi});
 * 3b. when {@link FakeApiOptions.rateLimit} is set, count it in the 1 s window (429 above the limit);
 * 4. run the {@link FakeApi.beforeServe} hooks;
 * 5. apply the first matching injected {@link Fault}, if any;
 * 6. handle it normally (400 for bad paging, 404 for an unknown conversation, else 200/201).
 *
 * Response bodies are counted as they are written ({@link RequestRecord.bytesSent}); the `huge` and
 * `endless` faults stream with backpressure and never hold their body in memory.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BASE_TIME_MS, type FakeWorkspace } from './workspace.js';

/** One request as the fake saw it. Appended to {@link FakeApi.requests} on arrival. */
export interface RequestRecord {
  /** HTTP method, e.g. `GET`. */
  method: string;
  /** URL pathname, not decoded, without the query string, e.g. `/v1/conversations/…/messages`. */
  path: string;
  /** Query parameters; for a repeated name, the first value (the same one the handlers use). */
  query: Record<string, string>;
  /** Value of the `X-Api-Key` header, if sent. */
  apiKey: string | undefined;
  /** Value of the `X-Account-Id` header, if sent. */
  accountId: string | undefined;
  /**
   * Status code of the answer; `'dropped'` when a `drop` fault destroyed the socket; `0` while the
   * request has not been answered yet (e.g. during a `slow` fault).
   */
  status: number | 'dropped';
  /** Arrival time, `Date.now()` in ms. */
  at: number;
  /**
   * Body bytes the fake has written for this request so far (handed to the socket; the client may
   * not have read them all). Updated as a streamed (`huge`, `endless`) body is written. `0` until
   * the answer is written.
   */
  bytesSent: number;
  /**
   * `true` when the connection closed before the whole body was written: the client went away (or
   * {@link FakeApi.close} ran) during a `huge` or `endless` answer. An `endless` answer always ends
   * this way.
   */
  closedEarly: boolean;
}

/** Which requests a {@link Fault} applies to. Every given criterion must hold; none given = all requests. */
export interface FaultMatch {
  /** Compared with the URL pathname: a string must be equal; a RegExp must match (`lastIndex` is reset first). */
  path?: string | RegExp;
  /** The requested page: the `page` query parameter as an integer, 1 when absent. A non-integer `page` never matches. */
  page?: number;
  /** The `X-Account-Id` sent must equal it (e.g. to fail one of several workspaces). */
  accountId?: string;
}

/**
 * A fault to inject with {@link FakeApi.injectFault}. It applies to requests that passed
 * authentication and match `match`, at most `times` times (default 1; `Infinity` = until
 * {@link FakeApi.clearFaults}). When several are pending, the first matching one in insertion order
 * is consumed, and only one fault applies per request.
 *
 * - `status`: answer with `status` instead of handling the request. `retryAfter`, when given, is sent
 *   verbatim as the `Retry-After` header (seconds such as `'2'`, or an HTTP-date). `body`, when given,
 *   is sent verbatim (still labelled `application/json`), so a test can serve non-JSON with 200;
 *   otherwise the body is the JSON error `{"error":{"code","message"}}`.
 * - `drop`: destroy the socket without answering (the client sees a connection reset / `fetch` rejects).
 * - `slow`: wait `delayMs` ms, then handle the request normally (the response reflects the workspace
 *   as it is after the wait).
 * - `hold`: keep the request waiting until `until` settles, then handle it normally: a test holds
 *   an answer exactly as long as it needs to observe something (no timing to guess). A request
 *   still held when the fake closes is dropped with its socket.
 * - `huge`: answer 200 with a body of exactly `bytes` bytes: a valid JSON page with no records
 *   (`{"data":[],"meta":{"current_page":<page>,"total_pages":0,"total_count":0},"padding":"xxx…"}`),
 *   padded to length inside `padding`. It is streamed in 64 KiB chunks, waiting for `'drain'` whenever
 *   the socket is full, so it is never held in memory; it stops when the client disconnects or the
 *   fake closes. Sent with `content-length` unless `contentLength` is false (then chunked).
 * - `endless`: answer 200, chunked, with the same JSON prefix followed by filler forever (64 KiB
 *   chunks, with backpressure) until the client disconnects or the fake closes.
 * - `runaway`: on `GET /v1/conversations` or a conversation's messages (any id, known or not), answer
 *   200 with a full page of `per_page` synthetic, schema-valid records and meta claiming one page more
 *   than requested: `{current_page: page, total_pages: page + 1, total_count: (page + 1) * per_page}`.
 *   Records are deterministic and their ids unique across pages: conversations
 *   `{id, status: 'open', messages_count: 0}` with UUID-shaped ids derived from the page and index;
 *   messages `msg_` + 16 hex digits, `created_at` increasing with page and index. With
 *   `times: Infinity` it models a list or a conversation that never ends. On any other route the
 *   request is handled normally (the fault is still consumed).
 */
export type Fault =
  | { kind: 'status'; status: number; retryAfter?: string; body?: string; match?: FaultMatch; times?: number }
  | { kind: 'drop'; match?: FaultMatch; times?: number }
  | { kind: 'slow'; delayMs: number; match?: FaultMatch; times?: number }
  | { kind: 'hold'; until: Promise<unknown>; match?: FaultMatch; times?: number }
  | { kind: 'huge'; bytes: number; contentLength?: boolean; match?: FaultMatch; times?: number }
  | { kind: 'endless'; match?: FaultMatch; times?: number }
  | { kind: 'runaway'; match?: FaultMatch; times?: number };

/** One of several workspaces served by one fake ({@link FakeApiOptions.workspaces}). */
export interface FakeTenant {
  /** Its data (live: mutate it at any time). */
  workspace: FakeWorkspace;
  /** The key that reaches it (several workspaces may share one). Must not be empty. */
  apiKey: string;
}

/**
 * Options of {@link startFakeApi}: one workspace (`workspace` + `apiKey`, optionally `accountId`),
 * or several (`workspaces`), never both.
 */
export interface FakeApiOptions {
  /** The data to serve; the same live object is exposed as {@link FakeApi.workspace}. Required unless `workspaces` is given. */
  workspace?: FakeWorkspace;
  /** The only accepted `X-Api-Key` value (spec 5). Must not be empty. Required unless `workspaces` is given. */
  apiKey?: string;
  /**
   * Several workspaces, keyed by account id (spec 1 and 5: a user may belong to several accounts,
   * selected with `X-Account-Id`): a request is served from the workspace its `X-Account-Id` names
   * when its `X-Api-Key` is that workspace's key; a key no workspace has → 401; a workspace missing,
   * unknown or of another key → 403. {@link FakeApi.workspace} is the first one.
   * @defaultValue undefined (one workspace: `workspace`, `apiKey`, `accountId`)
   */
  workspaces?: Record<string, FakeTenant>;
  /**
   * When set, the API endpoints also require `X-Account-Id` to equal it (403 otherwise).
   * @defaultValue undefined (header ignored)
   */
  accountId?: string;
  /** Interface to listen on. @defaultValue '127.0.0.1' */
  host?: string;
  /** TCP port. @defaultValue 0 (a free port chosen by the OS) */
  port?: number;
  /**
   * Server-side rate limit over the authenticated API requests (`GET /v1/conversations` and
   * messages; not the `/_fake/` admin routes): a sliding 1 s window (a log of the accepted
   * requests' arrival times) per API key, shared by the workspaces of that key. A request arriving when `rps` requests were accepted in the last
   * 1000 ms is answered `429 rate_limited` with `Retry-After` = the seconds until the oldest of them
   * leaves the window, rounded up (an integer >= 1, RFC 9110). Unless `headers` is false, every
   * response to a counted request (429s included) carries `RateLimit-Limit: <rps>`,
   * `RateLimit-Remaining` (left in the window after this request), `RateLimit-Reset` (seconds until
   * the oldest accepted request leaves the window, i.e. until a slot frees; **fractional, ms
   * precision**: with a 1 s sliding window an integer would always read 1) and
   * `RateLimit-Policy: <rps>;w=1` (IETF draft-ietf-httpapi-ratelimit-headers style).
   * @defaultValue undefined (no limit, no headers)
   */
  rateLimit?: { rps: number; headers?: boolean };
  /**
   * Time source of the rate-limit window, epoch ms (fractional allowed), so a test can move the
   * window without waiting. @defaultValue `performance.timeOrigin + performance.now()`
   */
  now?: () => number;
}

/** A running fake, as returned by {@link startFakeApi}. */
export interface FakeApi {
  /** The `{base_url}` of the spec, e.g. `http://127.0.0.1:54321`, no trailing slash; append `/v1/...`. */
  url: string;
  /** The TCP port listened on. */
  port: number;
  /** The live workspace being served (with several, the first); mutate it at any time. */
  workspace: FakeWorkspace;
  /** Every request, in arrival order (including unauthenticated and dropped ones). Tests may clear it (`length = 0`). */
  requests: RequestRecord[];
  /**
   * Queues a fault (see {@link Fault}).
   * @throws RangeError when `times` is not a positive integer or `Infinity`, a `status` is not an
   *   integer in 100..599, `delayMs` is negative or not finite, or a `huge` fault's `bytes` is not a
   *   safe integer >= {@link MIN_HUGE_BYTES}
   */
  injectFault(f: Fault): void;
  /** Removes all pending faults. */
  clearFaults(): void;
  /**
   * Registers a hook called synchronously, with the request's record, for every request that passed
   * its route's authentication, before faults and before the response is computed — so a test can,
   * e.g., mutate the workspace when page 2 of a conversation is requested. A hook that throws makes
   * the request answer 500 (`hook_failed`).
   * @returns a function that unregisters the hook
   */
  beforeServe(hook: (req: RequestRecord) => void): () => void;
  /**
   * Resolves once no `huge` or `endless` body is being written (at once when none is), e.g. to
   * check {@link RequestRecord.bytesSent} after the client gave up on one.
   */
  whenStreamsEnd(): Promise<void>;
  /**
   * Stops listening, stops every `huge`/`endless` writer, cancels pending `slow` responses and closes
   * all connections, idle keep-alive ones included. Idempotent.
   */
  close(): Promise<void>;
}

/** Smallest `bytes` of a `huge` fault: room for its JSON prefix and suffix. */
export const MIN_HUGE_BYTES = 256;

const JSON_TYPE = 'application/json; charset=utf-8';

const MESSAGES_RE = /^\/v1\/conversations\/([^/]*)\/messages$/;

/** Chunk size of streamed (`huge`, `endless`) bodies. */
const STREAM_CHUNK_BYTES = 64 * 1024;
/** One shared chunk of filler: streamed bodies reuse it, so they never allocate per chunk. */
const FILLER = Buffer.alloc(STREAM_CHUNK_BYTES, 'x');

interface PendingFault {
  fault: Fault;
  remaining: number;
}

type Route =
  | { kind: 'conversations' }
  | { kind: 'messages'; conversationId: string | undefined }
  | { kind: 'append'; conversationId: string }
  | { kind: 'unknown' };

/**
 * Not part of the API: `POST /_fake/conversations/:id/messages?count=N` appends N generated
 * messages (default 1), so a running fake can be changed from outside (the daemon walkthrough).
 */
const APPEND_RE = /^\/_fake\/conversations\/([^/]+)\/messages$/;

function errorBody(code: string, message: string): string {
  return JSON.stringify({ error: { code, message } });
}

function codeForStatus(status: number): string {
  switch (status) {
    case 400:
      return 'invalid_parameter';
    case 401:
      return 'unauthorized';
    case 403:
      return 'forbidden';
    case 404:
      return 'not_found';
    case 429:
      return 'rate_limited';
    case 502:
      return 'bad_gateway';
    case 503:
      return 'service_unavailable';
    case 504:
      return 'gateway_timeout';
    default:
      return status >= 500 ? 'internal_error' : `http_${status}`;
  }
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** Parses a non-negative decimal integer query value; `undefined` when malformed or unsafe. */
function parseIntParam(raw: string): number | undefined {
  if (!/^[0-9]+$/.test(raw)) return undefined;
  const n = Number(raw);
  return Number.isSafeInteger(n) ? n : undefined;
}

/**
 * Paging parameters per spec 4.1 / 8: page ≥ 1 (default 1), per_page 1..100 (default 50).
 * Returns an error message for a malformed or out-of-range value.
 */
function parsePaging(query: Record<string, string>): { page: number; perPage: number } | { error: string } {
  let page = 1;
  let perPage = 50;
  const rawPage = query['page'];
  if (rawPage !== undefined) {
    const p = parseIntParam(rawPage);
    if (p === undefined || p < 1) return { error: `page must be an integer >= 1, got ${JSON.stringify(rawPage)}` };
    page = p;
  }
  const rawPer = query['per_page'];
  if (rawPer !== undefined) {
    const p = parseIntParam(rawPer);
    if (p === undefined || p < 1 || p > 100) {
      return { error: `per_page must be an integer from 1 to 100, got ${JSON.stringify(rawPer)}` };
    }
    perPage = p;
  }
  return { page, perPage };
}

function pageEnvelope(items: readonly unknown[], page: number, perPage: number): string {
  const total = items.length;
  const start = (page - 1) * perPage;
  const data = start < total ? items.slice(start, start + perPage) : [];
  return JSON.stringify({
    data,
    meta: { current_page: page, total_pages: Math.ceil(total / perPage), total_count: total },
  });
}

function route(method: string, path: string): Route {
  if (path === '/v1/conversations') return method === 'GET' ? { kind: 'conversations' } : { kind: 'unknown' };
  const a = path.match(APPEND_RE);
  if (a && method === 'POST') return { kind: 'append', conversationId: decodeURIComponent(a[1] ?? '') };
  const m = path.match(MESSAGES_RE);
  if (m && method === 'GET') {
    let id: string | undefined;
    try {
      id = decodeURIComponent(m[1] ?? '');
    } catch {
      id = undefined; // malformed percent-encoding: answered 404 after auth
    }
    return { kind: 'messages', conversationId: id };
  }
  return { kind: 'unknown' };
}

function faultMatches(f: Fault, rec: RequestRecord): boolean {
  const match = f.match;
  if (!match) return true;
  if (match.path !== undefined) {
    if (typeof match.path === 'string') {
      if (match.path !== rec.path) return false;
    } else {
      match.path.lastIndex = 0;
      if (!match.path.test(rec.path)) return false;
    }
  }
  if (match.accountId !== undefined && rec.accountId !== match.accountId) return false;
  if (match.page !== undefined) {
    const raw = rec.query['page'];
    const page = raw === undefined ? 1 : parseIntParam(raw);
    if (page !== match.page) return false;
  }
  return true;
}

function validateFault(f: Fault): void {
  const times = f.times ?? 1;
  if (!(times === Infinity || (Number.isInteger(times) && times > 0))) {
    throw new RangeError(`injectFault: times must be a positive integer or Infinity, got ${times}`);
  }
  if (f.kind === 'status' && !(Number.isInteger(f.status) && f.status >= 100 && f.status <= 599)) {
    throw new RangeError(`injectFault: status must be an integer in 100..599, got ${f.status}`);
  }
  if (f.kind === 'slow' && !(Number.isFinite(f.delayMs) && f.delayMs >= 0)) {
    throw new RangeError(`injectFault: delayMs must be a finite number >= 0, got ${f.delayMs}`);
  }
  if (f.kind === 'huge' && !(Number.isSafeInteger(f.bytes) && f.bytes >= MIN_HUGE_BYTES)) {
    throw new RangeError(`injectFault: bytes must be a safe integer >= ${MIN_HUGE_BYTES}, got ${f.bytes}`);
  }
}

/** The requested page for a streamed or runaway answer: the `page` query parameter, 1 when absent or malformed. */
function requestedPage(rec: RequestRecord): number {
  const raw = rec.query['page'];
  const p = raw === undefined ? undefined : parseIntParam(raw);
  return p !== undefined && p >= 1 ? p : 1;
}

/** The JSON prefix of a `huge`/`endless` body: a valid empty page, opening a `padding` string. */
function streamPrefix(page: number): string {
  return `{"data":[],"meta":{"current_page":${page},"total_pages":0,"total_count":0},"padding":"`;
}
const STREAM_SUFFIX = '"}';

/** 8 hex digits of a 32-bit integer. */
const hex8 = (n: number): string => (n >>> 0).toString(16).padStart(8, '0');

/**
 * The body of a `runaway` page: `perPage` synthetic records of `kind` for `page`, with meta claiming
 * one more page. Ids are unique across pages (derived from page and index).
 */
function runawayPage(kind: 'conversations' | 'messages', page: number, perPage: number): string {
  const data: Record<string, unknown>[] = [];
  for (let i = 0; i < perPage; i++) {
    const n = (page - 1) * perPage + i;
    if (kind === 'conversations') {
      const id = `${hex8(page)}-${hex8(i).slice(4)}-4000-8000-${hex8(0x7e57)}${hex8(n).slice(4)}`;
      data.push({ id, status: 'open', messages_count: 0 });
    } else {
      data.push({
        id: `msg_${hex8(page)}${hex8(i)}`,
        content: `runaway message ${n}`,
        visibility: 'global',
        sender: { id: 'cus_runaway', name: 'Runaway', type: 'Customer' },
        created_at: new Date(BASE_TIME_MS + n * 1000).toISOString(),
      });
    }
  }
  return JSON.stringify({ data, meta: { current_page: page, total_pages: page + 1, total_count: (page + 1) * perPage } });
}

/** A workspace served, with the key and account id that reach it (account undefined: header ignored). */
interface Tenant {
  accountId: string | undefined;
  workspace: FakeWorkspace;
  apiKey: string;
}

/** The mutable state of one running fake, shared by its request handler and its {@link FakeApi}. */
interface FakeState {
  opts: FakeApiOptions;
  /** The workspaces served, in option order; one when the fake serves a single workspace. */
  tenants: Tenant[];
  requests: RequestRecord[];
  faults: PendingFault[];
  hooks: ((req: RequestRecord) => void)[];
  /** Pending `slow` answers. */
  timers: Set<NodeJS.Timeout>;
  /** Stop functions of the `huge`/`endless` writers still running. */
  streams: Set<() => void>;
  /** Resolvers of {@link FakeApi.whenStreamsEnd} waiting for the writers to finish. */
  streamsIdle: (() => void)[];
  /** Per API key: arrival times (ms) of the requests accepted in the last second, oldest first. */
  rlWindows: Map<string, number[]>;
}

/** Answers `status` with `body` (JSON) and records it. */
function send(res: ServerResponse, rec: RequestRecord, status: number, body: string, extra?: Record<string, string>): void {
  rec.status = status;
  if (res.headersSent || res.destroyed) return;
  const length = Buffer.byteLength(body);
  res.writeHead(status, { 'content-type': JSON_TYPE, 'content-length': length, ...extra });
  res.end(body);
  rec.bytesSent = length;
}

/** Answers the JSON error `{"error":{"code","message"}}`; `code` defaults to the status's. */
function sendError(res: ServerResponse, rec: RequestRecord, status: number, message: string, code?: string): void {
  send(res, rec, status, errorBody(code ?? codeForStatus(status), message));
}

/**
 * Streams `prefix`, then filler, then `suffix` with backpressure: `total` bytes in all (with a
 * `content-length` header when `withLength`, else chunked), or forever when `total` is undefined
 * (then only the prefix and filler, chunked). Stops when the connection closes.
 */
function stream(
  state: FakeState,
  res: ServerResponse,
  rec: RequestRecord,
  body: { prefix: string; suffix: string; total: number | undefined; withLength: boolean },
): void {
  rec.status = 200;
  if (res.headersSent || res.destroyed) return;
  const head = Buffer.from(body.prefix);
  const tail = Buffer.from(body.suffix);
  const headers: Record<string, string | number> = { 'content-type': JSON_TYPE };
  if (body.total !== undefined && body.withLength) headers['content-length'] = body.total;
  res.writeHead(200, headers);
  let fillerLeft = body.total === undefined ? Infinity : body.total - head.length - tail.length;
  let done = false;
  const finish = (): void => {
    done = true;
    res.off('drain', pump);
    state.streams.delete(stop);
    if (state.streams.size === 0) for (const resolve of state.streamsIdle.splice(0)) resolve();
  };
  /** Ends the writer: on the connection's 'close', or from close(). */
  const stop = (): void => {
    if (done) return;
    finish();
    if (!res.writableFinished) rec.closedEarly = true;
    if (!res.destroyed) res.destroy();
  };
  const write = (chunk: Buffer): boolean => {
    rec.bytesSent += chunk.length;
    return res.write(chunk);
  };
  function pump(): void {
    while (!done) {
      if (fillerLeft <= 0) {
        rec.bytesSent += tail.length;
        res.end(tail);
        finish();
        return;
      }
      const n = Math.min(fillerLeft, FILLER.length);
      fillerLeft -= n;
      if (!write(n === FILLER.length ? FILLER : FILLER.subarray(0, n))) {
        res.once('drain', pump);
        return;
      }
    }
  }
  state.streams.add(stop);
  res.once('close', stop);
  if (write(head)) pump();
  else res.once('drain', pump);
}

/** Handles a request normally (no fault) from `workspace`: the documented endpoints and the admin route. */
function handle(workspace: FakeWorkspace, res: ServerResponse, rec: RequestRecord, r: Route): void {
  switch (r.kind) {
    case 'conversations': {
      const paging = parsePaging(rec.query);
      if ('error' in paging) return sendError(res, rec, 400, paging.error);
      const items = workspace.list().map((c) => c.data);
      return send(res, rec, 200, pageEnvelope(items, paging.page, paging.perPage));
    }
    case 'messages': {
      const paging = parsePaging(rec.query);
      if ('error' in paging) return sendError(res, rec, 400, paging.error);
      const conv = r.conversationId === undefined ? undefined : workspace.get(r.conversationId);
      if (!conv) return sendError(res, rec, 404, `conversation ${JSON.stringify(r.conversationId ?? '')} not found`);
      return send(res, rec, 200, pageEnvelope(conv.messages, paging.page, paging.perPage));
    }
    case 'append': {
      if (!workspace.get(r.conversationId)) return sendError(res, rec, 404, `conversation ${JSON.stringify(r.conversationId)} not found`);
      const count = Number(rec.query['count'] ?? '1');
      if (!Number.isInteger(count) || count < 1 || count > 10_000) return sendError(res, rec, 400, 'count must be an integer 1..10000', 'invalid_request');
      const added = workspace.appendMessages(r.conversationId, count);
      return send(res, rec, 201, JSON.stringify({ appended: added.map((m) => m.id) }));
    }
    case 'unknown':
      return sendError(res, rec, 404, `no route for ${rec.method} ${rec.path}`);
  }
}

/** The record of a request on arrival (status 0: not answered yet). */
function recordOf(req: IncomingMessage): RequestRecord {
  let url: URL;
  try {
    url = new URL(req.url ?? '/', 'http://fake.invalid');
  } catch {
    url = new URL('http://fake.invalid/');
  }
  const query: Record<string, string> = {};
  for (const [k, v] of url.searchParams) {
    if (!Object.hasOwn(query, k)) Object.defineProperty(query, k, { value: v, enumerable: true, writable: true, configurable: true });
  }
  return {
    method: req.method ?? 'GET',
    path: url.pathname,
    query,
    apiKey: header(req, 'x-api-key'),
    accountId: header(req, 'x-account-id'),
    status: 0,
    at: Date.now(),
    bytesSent: 0,
    closedEarly: false,
  };
}

/**
 * API-key authentication (spec 5) of the routes that need it, before any 400/404 of the route: a
 * key no workspace has → 401; no workspace of that key for the `X-Account-Id` sent → 403.
 * @returns the workspace to serve (the first for routes without authentication), or undefined when
 *   the request was answered 401/403
 */
function authenticate(state: FakeState, res: ServerResponse, rec: RequestRecord, r: Route): FakeWorkspace | undefined {
  if (r.kind !== 'conversations' && r.kind !== 'messages' && r.kind !== 'append') return state.tenants[0]!.workspace;
  if (rec.apiKey === undefined || !state.tenants.some((t) => t.apiKey === rec.apiKey)) {
    sendError(res, rec, 401, 'missing or invalid X-Api-Key');
    return undefined;
  }
  const tenant = state.tenants.find((t) => t.apiKey === rec.apiKey && (t.accountId === undefined || t.accountId === rec.accountId));
  if (!tenant) {
    sendError(res, rec, 403, 'missing or wrong X-Account-Id for this API key');
    return undefined;
  }
  return tenant.workspace;
}

/**
 * Counts an API request in the sliding 1 s window of {@link FakeApiOptions.rateLimit}, sets the
 * `RateLimit-*` headers, and answers 429 above the limit.
 * @returns true when the request was answered 429
 */
function refuseOverLimit(state: FakeState, res: ServerResponse, rec: RequestRecord, r: Route): boolean {
  const rateLimit = state.opts.rateLimit;
  if (!rateLimit || (r.kind !== 'conversations' && r.kind !== 'messages')) return false;
  const key = rec.apiKey ?? '';
  let window = state.rlWindows.get(key);
  if (!window) state.rlWindows.set(key, (window = []));
  const now = state.opts.now?.() ?? performance.timeOrigin + performance.now();
  while (window.length > 0 && window[0]! <= now - 1000) window.shift();
  const limited = window.length >= rateLimit.rps;
  if (!limited) window.push(now);
  const freeInMs = window.length > 0 ? Math.max(0, window[0]! + 1000 - now) : 0;
  if (rateLimit.headers !== false) {
    res.setHeader('ratelimit-limit', String(rateLimit.rps));
    res.setHeader('ratelimit-remaining', String(Math.max(0, Math.floor(rateLimit.rps) - window.length)));
    res.setHeader('ratelimit-reset', String(Math.ceil(freeInMs) / 1000));
    res.setHeader('ratelimit-policy', `${rateLimit.rps};w=1`);
  }
  if (!limited) return false;
  const retryAfter = String(Math.max(1, Math.ceil(freeInMs / 1000)));
  send(res, rec, 429, errorBody('rate_limited', `rate limit of ${rateLimit.rps} requests/s exceeded`), { 'retry-after': retryAfter });
  return true;
}

/** Takes the first pending fault matching `rec` (consuming one of its `times`), if any. */
function takeFault(state: FakeState, rec: RequestRecord): Fault | undefined {
  const idx = state.faults.findIndex((p) => faultMatches(p.fault, rec));
  const pending = idx >= 0 ? state.faults[idx] : undefined;
  if (!pending) return undefined;
  pending.remaining -= 1;
  if (pending.remaining <= 0) state.faults.splice(idx, 1);
  return pending.fault;
}

/** Answers `rec` as the fault `f` says (see {@link Fault}); `run` handles it normally. */
function applyFault(state: FakeState, f: Fault, req: IncomingMessage, res: ServerResponse, rec: RequestRecord, r: Route, run: () => void): void {
  switch (f.kind) {
    case 'drop':
      rec.status = 'dropped';
      req.socket.destroy();
      return;
    case 'status': {
      const extra: Record<string, string> = {};
      if (f.retryAfter !== undefined) extra['retry-after'] = f.retryAfter;
      return send(res, rec, f.status, f.body ?? errorBody(codeForStatus(f.status), `injected fault: HTTP ${f.status}`), extra);
    }
    case 'huge':
      return stream(state, res, rec, { prefix: streamPrefix(requestedPage(rec)), suffix: STREAM_SUFFIX, total: f.bytes, withLength: f.contentLength !== false });
    case 'endless':
      return stream(state, res, rec, { prefix: streamPrefix(requestedPage(rec)), suffix: '', total: undefined, withLength: false });
    case 'runaway': {
      if (r.kind !== 'conversations' && r.kind !== 'messages') return run();
      const paging = parsePaging(rec.query);
      if ('error' in paging) return sendError(res, rec, 400, paging.error);
      return send(res, rec, 200, runawayPage(r.kind, paging.page, paging.perPage));
    }
    case 'slow': {
      const timer = setTimeout(() => {
        state.timers.delete(timer);
        run();
      }, f.delayMs);
      state.timers.add(timer);
      return;
    }
    case 'hold': {
      const go = () => {
        if (!res.writableEnded && !req.socket.destroyed) run();
      };
      f.until.then(go, go);
      return;
    }
  }
}

/** The request handler: record, route, authenticate, rate-limit, hooks, fault, handle (see the module doc). */
function requestHandler(state: FakeState): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const rec = recordOf(req);
    state.requests.push(rec);
    const r = route(rec.method, rec.path);
    const workspace = authenticate(state, res, rec, r);
    if (!workspace) return;
    if (refuseOverLimit(state, res, rec, r)) return;
    try {
      for (const hook of state.hooks.slice()) hook(rec);
    } catch (err) {
      return sendError(res, rec, 500, `beforeServe hook threw: ${String(err)}`, 'hook_failed');
    }
    const run = (): void => {
      try {
        handle(workspace, res, rec, r);
      } catch (err) {
        sendError(res, rec, 500, `fake API failure: ${String(err)}`, 'internal_error');
      }
    };
    const fault = takeFault(state, rec);
    if (fault) applyFault(state, fault, req, res, rec, r, run);
    else run();
  };
}

/** The workspaces `opts` asks to serve. @throws RangeError as {@link startFakeApi} says */
function tenantsOf(opts: FakeApiOptions): Tenant[] {
  if (opts.workspaces !== undefined) {
    if (opts.workspace !== undefined || opts.apiKey !== undefined || opts.accountId !== undefined) {
      throw new RangeError('startFakeApi: give either workspaces, or workspace + apiKey (+ accountId), not both');
    }
    const tenants = Object.entries(opts.workspaces).map(([accountId, t]) => ({ accountId, workspace: t.workspace, apiKey: t.apiKey }));
    if (tenants.length === 0) throw new RangeError('startFakeApi: workspaces must not be empty');
    for (const t of tenants) {
      if (!t.accountId || !t.apiKey) throw new RangeError('startFakeApi: every workspace needs a non-empty account id and apiKey');
    }
    return tenants;
  }
  if (!opts.workspace) throw new RangeError('startFakeApi: workspace (or workspaces) is required');
  if (!opts.apiKey) throw new RangeError('startFakeApi: apiKey must not be empty');
  return [{ accountId: opts.accountId, workspace: opts.workspace, apiKey: opts.apiKey }];
}

/** Listens on `host:port` (0: a free port). @returns the port */
async function listen(server: Server, port: number, host: string): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return (server.address() as AddressInfo).port;
}

/** The {@link FakeApi} face of a listening fake. */
function fakeApiOf(state: FakeState, server: Server, url: string, port: number): FakeApi {
  let closing: Promise<void> | undefined;
  return {
    url,
    port,
    workspace: state.tenants[0]!.workspace,
    requests: state.requests,
    injectFault(f: Fault): void {
      validateFault(f);
      state.faults.push({ fault: f, remaining: f.times ?? 1 });
    },
    clearFaults(): void {
      state.faults.length = 0;
    },
    beforeServe(hook: (req: RequestRecord) => void): () => void {
      state.hooks.push(hook);
      return () => {
        const i = state.hooks.indexOf(hook);
        if (i >= 0) state.hooks.splice(i, 1);
      };
    },
    whenStreamsEnd(): Promise<void> {
      if (state.streams.size === 0) return Promise.resolve();
      return new Promise<void>((resolve) => state.streamsIdle.push(resolve));
    },
    close(): Promise<void> {
      closing ??= new Promise<void>((resolve) => {
        for (const t of state.timers) clearTimeout(t);
        state.timers.clear();
        for (const stop of [...state.streams]) stop();
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

/**
 * Starts the fake API on `host:port` and resolves once it is listening.
 *
 * Endpoints (all responses `content-type: application/json; charset=utf-8`, keep-alive allowed,
 * errors as `{"error":{"code":"...","message":"..."}}`):
 * - `GET /v1/conversations/:conversation_id/messages?page&per_page` (spec 4.1) →
 *   `200 {data: FakeMessage[], meta: {current_page, total_pages, total_count}}`, messages in
 *   chronological order. `page` default 1, integer ≥ 1; `per_page` default 50, integer 1..100 (spec 8);
 *   otherwise 400. `current_page` is the requested page, `total_pages = ceil(total_count / per_page)`
 *   (0 when empty); a page past the end has `data: []`. Unknown conversation → 404 (checked after the
 *   paging parameters).
 * - `GET /v1/conversations?page&per_page` (spec 4.2) → the same envelope over the conversations'
 *   `data` objects in current list order, same paging rules.
 * - Both require `X-Api-Key` equal to `apiKey` (else 401) and, when `accountId` is set,
 *   `X-Account-Id` equal to it (else 403) — checked before 400/404 (spec 5). With `workspaces`,
 *   the key must be one of theirs (else 401) and `X-Account-Id` must name a workspace of that key
 *   (else 403); the request is then served from that workspace.
 * - `POST /_fake/conversations/:id/messages?count=N` (not part of the API; same authentication):
 *   appends N generated messages (default 1, at most 10000) → `201 {appended: [ids]}`.
 * - Anything else (other paths or methods, `POST /v1/sessions` and `GET /v1/me` included) → 404.
 *
 * @throws RangeError (rejects) when `apiKey` is empty, neither or both of `workspace` and
 *   `workspaces` are given, `workspaces` is empty or one of its keys is empty, or `rateLimit.rps`
 *   is below 1; rejects with the listen error (e.g. `EADDRINUSE`)
 */
export async function startFakeApi(opts: FakeApiOptions): Promise<FakeApi> {
  const tenants = tenantsOf(opts);
  if (opts.rateLimit && !(Number.isFinite(opts.rateLimit.rps) && opts.rateLimit.rps >= 1)) {
    throw new RangeError(`startFakeApi: rateLimit.rps must be a number >= 1, got ${opts.rateLimit.rps}`);
  }
  const state: FakeState = {
    opts,
    tenants,
    requests: [],
    faults: [],
    hooks: [],
    timers: new Set(),
    streams: new Set(),
    streamsIdle: [],
    rlWindows: new Map(),
  };
  const host = opts.host ?? '127.0.0.1';
  const server = createServer(requestHandler(state));
  const port = await listen(server, opts.port ?? 0, host);
  const urlHost = host.includes(':') ? `[${host}]` : host;
  return fakeApiOf(state, server, `http://${urlHost}:${port}`, port);
}
