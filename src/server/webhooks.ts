/**
 * `POST /webhooks/conversations`: the support system's "this conversation changed" trigger.
 *
 * Verified with the Standard Webhooks scheme (headers `webhook-id`, `webhook-timestamp`,
 * `webhook-signature`: HMAC-SHA256 over `<id>.<timestamp>.<body>`, signed by the `standardwebhooks`
 * package) before anything else is read, the timestamp against the injected clock. The event's shape
 * is not documented (spec 6), so the conversation id is the first configured JSON pointer that
 * resolves to a string, and the workspace comes from the body, the `X-Account-Id` header, or the
 * only configured workspace. Every refusal queues nothing and makes no API request, and is logged at
 * most once per 10 s per refusal class ({@link RefusalClass}, src/log-throttle.ts). The server knows
 * nothing of queues: the daemon injects `enqueue`.
 */
import crypto from 'node:crypto';
import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import { Webhook } from 'standardwebhooks';
import { LogThrottle, DEFAULT_LOG_WINDOW_MS, type LogThrottleOptions } from '../log-throttle.js';
import { escapeForTerminal, unsafeCharOf } from '../terminal.js';
import { withTimeout } from './metrics.js';

/** Largest webhook body accepted, bytes: 1 MiB; larger is refused with 413. */
export const WEBHOOK_BODY_LIMIT = 1024 * 1024;
/**
 * Default of {@link WebhookOptions.toleranceMs}: 5 minutes, the Standard Webhooks timestamp
 * tolerance (either way of the server's clock).
 */
export const DEFAULT_TIMESTAMP_TOLERANCE_MS = 5 * 60 * 1000;
/**
 * Default of {@link WebhookOptions.maxRememberedIds}: most `webhook-id`s remembered at once. When
 * that many are remembered and none has expired, a new delivery is refused with 503 and
 * `Retry-After` (none is forgotten early: that would reopen its replay window).
 */
export const MAX_REMEMBERED_IDS = 100_000;
/** Default of {@link WebhookOptions.enqueueTimeoutMs}: 5000 ms. */
export const DEFAULT_ENQUEUE_TIMEOUT_MS = 5000;
/** Longest id accepted (`webhook-id`, conversation id), characters; a longer one is refused with 422. */
export const MAX_ID_CHARS = 256;
/** Where the workspace is looked for in the body, before the `X-Account-Id` header. */
export const ACCOUNT_POINTERS = ['/account_id', '/data/account_id'] as const;

/**
 * Why a delivery was refused, one class per log throttle window (the `refusal` field of the log
 * line): `missing_header` 401, `bad_timestamp` 401 (not a whole number), `stale_timestamp` 401 (more
 * than the tolerance off), `bad_signature` 401, `bad_id` 422 (a `webhook-id`, conversation id or
 * account id a terminal would interpret, a path separator, `.`/`..`, too long), `replay` 409,
 * `ids_full` 503 (the replay memory is full), `bad_json` 422, `no_id` 422, `unknown_workspace` 422,
 * `queue_unavailable` 503, `body_too_large` 413, `bad_request` (any other 4xx Fastify answers
 * before the route, e.g. a wrong `Content-Length`).
 */
export type RefusalClass =
  | 'missing_header'
  | 'bad_timestamp'
  | 'stale_timestamp'
  | 'bad_signature'
  | 'bad_id'
  | 'replay'
  | 'ids_full'
  | 'bad_json'
  | 'no_id'
  | 'unknown_workspace'
  | 'queue_unavailable'
  | 'body_too_large'
  | 'bad_request';

/** What the webhook route needs from the daemon. */
export interface WebhookOptions {
  /** The Standard Webhooks secret, `whsec_` + base64 (`CONVO_MIRROR_WEBHOOK_SECRET`). Never logged. */
  secret: string;
  /** JSON pointers (RFC 6901) tried in order for the conversation id (`CONVO_MIRROR_WEBHOOK_ID_POINTERS`). */
  idPointers: readonly string[];
  /** The configured workspaces' account ids (`default` for the key's own workspace without one). */
  accounts: readonly string[];
  /** Queues the deduplicated conversation job; resolves to its job id. */
  enqueue(accountId: string, conversationId: string): Promise<string>;
  /**
   * Longest wait for `enqueue`, ms: past it the answer is 503 (a queue whose Redis is away would
   * otherwise hold the sender's request until its own timeout). @defaultValue 5000
   */
  enqueueTimeoutMs?: number;
  /**
   * Timestamp tolerance, ms: a `webhook-timestamp` further than this from `now()` (either way) is
   * refused with 401; an accepted `webhook-id` is remembered until its timestamp plus this, the
   * last instant at which the same request could pass the timestamp check. @defaultValue 300000
   */
  toleranceMs?: number;
  /** Most `webhook-id`s remembered at once (see {@link MAX_REMEMBERED_IDS}). @defaultValue 100000 */
  maxRememberedIds?: number;
  /** At most one refusal log line per class in this long, ms. @defaultValue 10000 */
  logWindowMs?: number;
  /** The clock of the timestamp check, the replay memory and the log throttle, epoch ms. @defaultValue Date.now */
  now?: () => number;
  /**
   * The log throttle's timer, which writes a window's summary line when it closes (see
   * {@link LogThrottleOptions.setTimer}). @defaultValue an unref'd `setTimeout`
   */
  setTimer?: LogThrottleOptions['setTimer'];
}

/** The 202 answer of an accepted webhook. */
export interface WebhookAccepted {
  job_id: string;
  conversation_id: string;
  account_id: string;
}

/**
 * Resolves an RFC 6901 JSON pointer in `doc`: `""` is the whole document; `/a/0/b~1c` walks object
 * keys and array indexes (`~1` is `/`, `~0` is `~`).
 *
 * @returns the value, or undefined when the path does not exist
 */
export function resolvePointer(doc: unknown, pointer: string): unknown {
  if (pointer === '') return doc;
  if (!pointer.startsWith('/')) return undefined;
  let cur: unknown = doc;
  for (const raw of pointer.slice(1).split('/')) {
    const token = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (Array.isArray(cur)) {
      if (!/^(0|[1-9]\d*)$/.test(token)) return undefined;
      cur = cur[Number(token)];
    } else if (cur !== null && typeof cur === 'object' && Object.prototype.hasOwnProperty.call(cur, token)) {
      cur = (cur as Record<string, unknown>)[token];
    } else {
      return undefined;
    }
  }
  return cur;
}

/**
 * Remembers each accepted `webhook-id` until an instant of its own (its timestamp plus the
 * tolerance: after that the same request fails the timestamp check, so no memory is needed), bounded
 * in memory: expired ids are dropped as requests come, and when {@link ReplayCache.max} ids are
 * remembered and none has expired, {@link ReplayCache.remember} refuses rather than forget one early
 * (forgetting an id before its instant would reopen its replay window). Ids are kept in buckets by
 * expiry instant (whole seconds plus the tolerance: about 600 buckets at most), the buckets in order.
 */
export class ReplayCache {
  /** Each remembered id: when it was accepted and the last instant it is remembered (epoch ms). */
  private readonly ids = new Map<string, { at: number; until: number }>();
  /** Ids by their `until`. */
  private readonly buckets = new Map<number, Set<string>>();
  /** The keys of {@link buckets}, ascending. */
  private readonly order: number[] = [];

  /**
   * @param now - the clock, epoch ms
   * @param max - most ids remembered at once. @defaultValue 100000
   */
  constructor(
    private readonly now: () => number,
    readonly max = MAX_REMEMBERED_IDS,
  ) {}

  /**
   * When `id` was accepted and until when it is remembered (epoch ms), if it still is at `at`.
   * @param at - the request's instant (read once per request), epoch ms. @defaultValue now
   */
  seen(id: string, at = this.now()): { at: number; until: number } | undefined {
    this.prune(at);
    return this.ids.get(id);
  }

  /**
   * Remembers `id` as accepted at `at`, until `until` (epoch ms, inclusive).
   * @param at - the request's instant (read once per request), epoch ms. @defaultValue now
   * @returns false, remembering nothing, when {@link max} ids are remembered and none has expired
   */
  remember(id: string, until: number, at = this.now()): boolean {
    this.prune(at);
    this.forget(id);
    if (this.ids.size >= this.max) return false;
    this.ids.set(id, { at, until });
    let bucket = this.buckets.get(until);
    if (bucket === undefined) {
      bucket = new Set();
      this.buckets.set(until, bucket);
      this.order.splice(this.insertionPoint(until), 0, until);
    }
    bucket.add(id);
    return true;
  }

  /** Forgets `id` (its job could not be queued: the sender's retry must be accepted). */
  forget(id: string): void {
    const known = this.ids.get(id);
    if (known === undefined) return;
    this.ids.delete(id);
    this.buckets.get(known.until)?.delete(id);
  }

  /** Ms until the first remembered id is forgotten (0 when none is remembered). */
  nextExpiryIn(at = this.now()): number {
    this.prune(at);
    const first = this.order[0];
    return first === undefined ? 0 : Math.max(0, first + 1 - at);
  }

  /** Ids remembered now. */
  get size(): number {
    this.prune();
    return this.ids.size;
  }

  /** Drops every id whose instant has passed by `now` (and empty buckets). */
  private prune(now = this.now()): void {
    while (this.order.length > 0 && (this.order[0]! < now || this.buckets.get(this.order[0]!)!.size === 0)) {
      const until = this.order.shift()!;
      for (const id of this.buckets.get(until)!) this.ids.delete(id);
      this.buckets.delete(until);
    }
  }

  /** Index at which `until` keeps {@link order} ascending (binary search). */
  private insertionPoint(until: number): number {
    let lo = 0;
    let hi = this.order.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.order[mid]! < until) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}

/** A refusal: HTTP status, its class, the reason given in `{"error"}`, and its log fields. */
class Refusal extends Error {
  constructor(
    readonly status: number,
    readonly cls: RefusalClass,
    message: string,
    readonly extra: { headers?: Record<string, string>; log?: Record<string, unknown>; level?: 'warn' | 'error' } = {},
  ) {
    super(message);
  }
}

/**
 * The plugin serving `POST /webhooks/conversations`, in its own encapsulated context: a body parser
 * that keeps the raw text (any content type, at most {@link WEBHOOK_BODY_LIMIT} bytes: 413 beyond).
 * Answers `202` {@link WebhookAccepted}; `401` for a missing or bad signature or a timestamp more
 * than the tolerance (5 minutes) off; `409` for a `webhook-id` still remembered (see
 * {@link ReplayCache}); `422` for a `webhook-id`, conversation id or account id that is not usable as
 * an id (naming the character class and code point, never echoing it), a body that is not JSON, no
 * conversation id, or an unknown or unnamed workspace; `503` with `Retry-After` when the replay
 * memory is full, and `503` when the job could not be queued within `enqueueTimeoutMs` (the id is
 * forgotten, so the sender's retry is accepted). Each refusal is logged at most once per
 * `logWindowMs` per {@link RefusalClass}, never with the body, the signature or the secret, and with
 * every id and reason escaped for a terminal.
 */
export function webhookPlugin(o: WebhookOptions, logger: Logger): FastifyPluginAsync {
  const verifier = new Webhook(o.secret);
  const now = o.now ?? Date.now;
  const toleranceMs = o.toleranceMs ?? DEFAULT_TIMESTAMP_TOLERANCE_MS;
  const replays = new ReplayCache(now, o.maxRememberedIds ?? MAX_REMEMBERED_IDS);
  const logWindowMs = o.logWindowMs ?? DEFAULT_LOG_WINDOW_MS;
  const throttle = new LogThrottle<RefusalClass>({
    windowMs: logWindowMs,
    now,
    ...(o.setTimer ? { setTimer: o.setTimer } : {}),
    onSuppressed: (cls, suppressed) => logger.warn({ refusal: cls, suppressed, window_ms: logWindowMs }, 'webhook refusals suppressed'),
  });
  const log = (r: Refusal, webhookId: string | undefined): void => {
    const admitted = throttle.admit(r.cls);
    if (admitted === undefined) return;
    const fields = {
      refusal: r.cls,
      status: r.status,
      reason: escapeForTerminal(r.message),
      ...(webhookId !== undefined ? { webhook_id: escapeForTerminal(webhookId) } : {}),
      ...r.extra.log,
      ...(admitted.suppressed > 0 ? { suppressed: admitted.suppressed } : {}),
    };
    logger[r.extra.level ?? 'warn'](fields, 'webhook refused');
  };
  return async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', { parseAs: 'string', bodyLimit: WEBHOOK_BODY_LIMIT }, (_req, body, done) => done(null, body));
    // Refused by Fastify before the route (a body over the limit, a wrong Content-Length): answered
    // as Fastify answers them, logged here like any refusal.
    scope.addHook('onError', async (req, _reply, err) => {
      const status = (err as { statusCode?: number }).statusCode ?? 500;
      if (status >= 500) return;
      const id = headerOf(req.headers['webhook-id'])?.slice(0, MAX_ID_CHARS);
      log(new Refusal(status, status === 413 ? 'body_too_large' : 'bad_request', err.message), id);
    });
    scope.addHook('onClose', async () => throttle.flush());
    scope.post('/webhooks/conversations', { bodyLimit: WEBHOOK_BODY_LIMIT }, async (req, reply) => {
      const raw = typeof req.body === 'string' ? req.body : '';
      const webhookId = headerOf(req.headers['webhook-id'])?.slice(0, MAX_ID_CHARS);
      try {
        // One instant for the whole request: the timestamp check and the replay memory must agree
        // (read twice, a replay at exactly its timestamp plus the tolerance could pass both).
        const at = now();
        const { id: webhook, timestampMs } = verify(verifier, raw, req.headers, at, toleranceMs);
        const unusable = unusableId(webhook, 'the webhook-id header');
        if (unusable) throw new Refusal(422, 'bad_id', unusable);
        // Remembered whole: two long ids sharing their first 256 characters must not collide.
        if (webhook.length > MAX_ID_CHARS) throw new Refusal(422, 'bad_id', `the webhook-id header is not usable as an id: it is over ${MAX_ID_CHARS} characters`);
        const seen = replays.seen(webhook, at);
        if (seen !== undefined) {
          throw new Refusal(409, 'replay', `replayed: webhook-id ${JSON.stringify(webhook)} was already received at ${new Date(seen.at).toISOString()} (remembered until ${new Date(seen.until).toISOString()}, its timestamp plus ${toleranceMs / 1000} s)`);
        }
        if (!replays.remember(webhook, timestampMs + toleranceMs, at)) {
          const retryAfter = String(Math.max(1, Math.ceil(replays.nextExpiryIn(at) / 1000)));
          throw new Refusal(503, 'ids_full', `too many webhook ids to remember (${replays.max}, each until its timestamp plus ${toleranceMs / 1000} s); retry after ${retryAfter} s`, { headers: { 'retry-after': retryAfter } });
        }
        const target = targetOf(raw, headerOf(req.headers['x-account-id']), o);
        let jobId: string;
        try {
          jobId = await withTimeout(o.enqueue(target.account_id, target.conversation_id), o.enqueueTimeoutMs ?? DEFAULT_ENQUEUE_TIMEOUT_MS, 'queueing the job');
        } catch (err) {
          replays.forget(webhook);
          const why = escapeForTerminal(err instanceof Error ? err.message : String(err));
          throw new Refusal(503, 'queue_unavailable', 'could not queue the job; retry later', { log: { ...target, err: why }, level: 'error' });
        }
        logger.info({ webhook_id: webhook, job: jobId, ...target }, 'webhook accepted: conversation job queued');
        return reply.code(202).send({ job_id: jobId, ...target } satisfies WebhookAccepted);
      } catch (err) {
        if (!(err instanceof Refusal)) {
          logger.error({ webhook_id: webhookId === undefined ? undefined : escapeForTerminal(webhookId), err: escapeForTerminal(err instanceof Error ? err.message : String(err)) }, 'webhook failed');
          return reply.code(500).send({ error: 'internal error' });
        }
        log(err, webhookId);
        if (err.extra.headers) void reply.headers(err.extra.headers);
        return reply.code(err.status).send({ error: err.message });
      }
    });
  };
}

/** The first value of a header. */
function headerOf(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/**
 * Checks the Standard Webhooks timestamp against `nowMs` and the signature over the raw body (the
 * package signs; the comparison is constant-time). Refusal texts are the package's own.
 *
 * @returns the `webhook-id` and the timestamp, epoch ms
 * @throws {@link Refusal} 401 naming what is wrong (never echoing the signature)
 */
function verify(verifier: Webhook, raw: string, headers: Record<string, string | string[] | undefined>, nowMs: number, toleranceMs: number): { id: string; timestampMs: number } {
  const h: Record<string, string> = {};
  for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature']) {
    const v = headerOf(headers[name]);
    if (v === undefined || v === '') throw new Refusal(401, 'missing_header', `missing ${name} header (Standard Webhooks)`);
    h[name] = v;
  }
  // Whole seconds since the epoch; at most 12 digits (the year 33658), so the ms stay exact.
  if (!/^\d{1,12}$/.test(h['webhook-timestamp']!)) throw new Refusal(401, 'bad_timestamp', 'invalid webhook: Invalid Signature Headers');
  const timestampMs = Number(h['webhook-timestamp']) * 1000;
  if (nowMs - timestampMs > toleranceMs) throw new Refusal(401, 'stale_timestamp', 'invalid webhook: Message timestamp too old');
  if (timestampMs - nowMs > toleranceMs) throw new Refusal(401, 'stale_timestamp', 'invalid webhook: Message timestamp too new');
  const expected = digest(verifier.sign(h['webhook-id']!, new Date(timestampMs), raw).slice('v1,'.length));
  let match = false;
  for (const passed of h['webhook-signature']!.split(' ')) {
    const [version, signature] = passed.split(',');
    // Every v1 signature compared, in constant time each: which one matched is not told by the time taken.
    if (version === 'v1' && signature !== undefined && crypto.timingSafeEqual(digest(signature), expected)) match = true;
  }
  if (!match) throw new Refusal(401, 'bad_signature', 'invalid webhook: No matching signature found');
  return { id: h['webhook-id']!, timestampMs };
}

/** SHA-256 of a string: equal-length buffers for a constant-time comparison. */
const digest = (s: string): Buffer => crypto.createHash('sha256').update(s, 'utf8').digest();

/**
 * Why `id` is not usable as an id, or undefined when it is: a code point a terminal would interpret
 * (src/terminal.ts: C0 and C1 controls, DEL, bidi controls, U+2028/2029, lone surrogates), named by
 * class and code point, never echoed.
 */
function unusableId(id: string, what: string): string | undefined {
  const bad = unsafeCharOf(id);
  return bad ? `${what} is not usable as an id: it holds a ${bad.cls} character (${bad.name}) at index ${bad.index}` : undefined;
}

/**
 * The conversation and workspace a verified body names.
 * @throws {@link Refusal} 422 for a body that is not JSON, no usable id, or no known workspace
 */
function targetOf(raw: string, headerAccount: string | undefined, o: WebhookOptions): { conversation_id: string; account_id: string } {
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch {
    throw new Refusal(422, 'bad_json', 'the body is not JSON');
  }
  const pointer = o.idPointers.find((p) => {
    const v = resolvePointer(doc, p);
    return typeof v === 'string' && v.trim() !== '';
  });
  if (pointer === undefined) throw new Refusal(422, 'no_id', `no conversation id: none of ${o.idPointers.join(', ')} is a string in the body (set CONVO_MIRROR_WEBHOOK_ID_POINTERS)`);
  const value = resolvePointer(doc, pointer) as string;
  const what = `the conversation id (${pointer})`;
  // Checked before trimming: trim() would drop U+2028/2029 and C0 at the ends without a word.
  const unusable = unusableId(value, what);
  if (unusable) throw new Refusal(422, 'bad_id', unusable);
  const conversationId = value.trim();
  // Ids are single path segments of /v1/conversations/:id/messages.
  if (/[/\\]/.test(conversationId)) throw new Refusal(422, 'bad_id', `${what} is not usable as an id: it holds a path separator (/ or \\)`);
  if (conversationId === '.' || conversationId === '..') throw new Refusal(422, 'bad_id', `${what} is not usable as an id: it is "." or ".."`);
  if (conversationId.length > MAX_ID_CHARS) throw new Refusal(422, 'bad_id', `${what} is not usable as an id: it is over ${MAX_ID_CHARS} characters`);
  return { conversation_id: conversationId, account_id: accountOf(doc, headerAccount, o.accounts) };
}

/**
 * The workspace: `/account_id` or `/data/account_id`, else the `X-Account-Id` header, else the only
 * configured one; compared case-insensitively, answered with the configured spelling.
 * @throws {@link Refusal} 422 when it holds a code point a terminal would interpret, is not
 *   configured, or several are and none is named
 */
function accountOf(doc: unknown, headerAccount: string | undefined, accounts: readonly string[]): string {
  const pointer = ACCOUNT_POINTERS.find((p) => {
    const v = resolvePointer(doc, p);
    return typeof v === 'string' && v !== '';
  });
  const named = pointer !== undefined ? (resolvePointer(doc, pointer) as string) : headerAccount;
  if (named === undefined) {
    if (accounts.length === 1) return accounts[0]!;
    throw new Refusal(422, 'unknown_workspace', `no workspace named (${ACCOUNT_POINTERS.join(' or ')} in the body, or the X-Account-Id header) and ${accounts.length} are configured`);
  }
  const unusable = unusableId(named, `the account id (${pointer ?? 'X-Account-Id header'})`);
  if (unusable) throw new Refusal(422, 'bad_id', unusable);
  const found = accounts.find((a) => a.toLowerCase() === named.trim().toLowerCase());
  if (found === undefined) throw new Refusal(422, 'unknown_workspace', `workspace ${JSON.stringify(named.slice(0, 64))} is not configured in this daemon`);
  return found;
}
