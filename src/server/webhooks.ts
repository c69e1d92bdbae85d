/**
 * `POST /webhooks/conversations`: the support system's "this conversation changed" trigger.
 *
 * Verified with the Standard Webhooks scheme (headers `webhook-id`, `webhook-timestamp`,
 * `webhook-signature`: HMAC-SHA256 over `<id>.<timestamp>.<body>`, the `standardwebhooks` package)
 * before anything else is read. The event's shape is not documented (spec 6), so the conversation id
 * is the first configured JSON pointer that resolves to a string, and the workspace comes from the
 * body, the `X-Account-Id` header, or the only configured workspace. Every refusal queues nothing
 * and makes no API request. The server knows nothing of queues: the daemon injects `enqueue`.
 */
import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import { Webhook, WebhookVerificationError } from 'standardwebhooks';
import { withTimeout } from './metrics.js';

/** Largest webhook body accepted, bytes: 1 MiB; larger is refused with 413. */
export const WEBHOOK_BODY_LIMIT = 1024 * 1024;
/** Default of {@link WebhookOptions.windowMs}: 5 minutes, the Standard Webhooks timestamp tolerance. */
export const DEFAULT_REPLAY_WINDOW_MS = 5 * 60 * 1000;
/** Most webhook ids remembered at once; beyond it the oldest are forgotten first. */
export const MAX_REMEMBERED_IDS = 100_000;
/** Default of {@link WebhookOptions.enqueueTimeoutMs}: 5000 ms. */
export const DEFAULT_ENQUEUE_TIMEOUT_MS = 5000;
/** Where the workspace is looked for in the body, before the `X-Account-Id` header. */
export const ACCOUNT_POINTERS = ['/account_id', '/data/account_id'] as const;

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
  /** How long a `webhook-id` is remembered to refuse a replay, ms. @defaultValue 300000 */
  windowMs?: number;
  /** Clock of the replay cache, epoch ms. @defaultValue Date.now */
  now?: () => number;
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
 * Remembers the `webhook-id`s accepted within the replay window, bounded in memory: expired ids are
 * dropped as new ones come (insertion order is time order), and past {@link MAX_REMEMBERED_IDS} the
 * oldest go first.
 */
export class ReplayCache {
  private readonly seen = new Map<string, number>();

  constructor(
    private readonly windowMs: number,
    private readonly now: () => number,
    private readonly max = MAX_REMEMBERED_IDS,
  ) {}

  /** When `id` was accepted (epoch ms), if within the window. */
  seenAt(id: string): number | undefined {
    this.prune();
    return this.seen.get(id);
  }

  /** Records `id` as accepted now. */
  remember(id: string): void {
    this.prune();
    this.seen.delete(id);
    this.seen.set(id, this.now());
    while (this.seen.size > this.max) this.seen.delete(this.seen.keys().next().value!);
  }

  /** Forgets `id` (its job could not be queued: the sender's retry must be accepted). */
  forget(id: string): void {
    this.seen.delete(id);
  }

  private prune(): void {
    const oldest = this.now() - this.windowMs;
    for (const [id, at] of this.seen) {
      if (at >= oldest) break;
      this.seen.delete(id);
    }
  }
}

/** A refusal: HTTP status and the reason given in `{"error"}`. */
class Refusal extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * The plugin serving `POST /webhooks/conversations`, in its own encapsulated context: a body parser
 * that keeps the raw text (any content type, at most {@link WEBHOOK_BODY_LIMIT} bytes: 413 beyond).
 * Answers `202` {@link WebhookAccepted}; `401` for a missing or bad signature or a timestamp more
 * than 5 minutes off; `409` for a `webhook-id` already accepted within the window; `422` for a body
 * that is not JSON, no conversation id, or an unknown or unnamed workspace; `503` when the job could
 * not be queued within `enqueueTimeoutMs` (the id is forgotten, so the sender's retry is accepted).
 */
export function webhookPlugin(o: WebhookOptions, logger: Logger): FastifyPluginAsync {
  const verifier = new Webhook(o.secret);
  const replays = new ReplayCache(o.windowMs ?? DEFAULT_REPLAY_WINDOW_MS, o.now ?? Date.now);
  return async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', { parseAs: 'string', bodyLimit: WEBHOOK_BODY_LIMIT }, (_req, body, done) => done(null, body));
    scope.post('/webhooks/conversations', { bodyLimit: WEBHOOK_BODY_LIMIT }, async (req, reply) => {
      const raw = typeof req.body === 'string' ? req.body : '';
      const webhookId = headerOf(req.headers['webhook-id'])?.slice(0, 256);
      try {
        verify(verifier, raw, req.headers);
        const seen = replays.seenAt(webhookId!);
        if (seen !== undefined) throw new Refusal(409, `replayed: webhook-id ${JSON.stringify(webhookId)} was already received at ${new Date(seen).toISOString()}`);
        replays.remember(webhookId!);
        const target = targetOf(raw, headerOf(req.headers['x-account-id']), o);
        let jobId: string;
        try {
          jobId = await withTimeout(o.enqueue(target.account_id, target.conversation_id), o.enqueueTimeoutMs ?? DEFAULT_ENQUEUE_TIMEOUT_MS, 'queueing the job');
        } catch (err) {
          replays.forget(webhookId!);
          logger.error({ webhook_id: webhookId, ...target, err: err instanceof Error ? err.message : String(err) }, 'webhook: could not queue the job');
          throw new Refusal(503, 'could not queue the job; retry later');
        }
        logger.info({ webhook_id: webhookId, job: jobId, ...target }, 'webhook accepted: conversation job queued');
        return reply.code(202).send({ job_id: jobId, ...target } satisfies WebhookAccepted);
      } catch (err) {
        return refuse(reply, err, webhookId, logger);
      }
    });
  };
}

/** The first value of a header. */
function headerOf(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/**
 * Checks the Standard Webhooks signature and timestamp over the raw body.
 * @throws {@link Refusal} 401 naming what is wrong (never echoing the signature)
 */
function verify(verifier: Webhook, raw: string, headers: Record<string, string | string[] | undefined>): void {
  const h: Record<string, string> = {};
  for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature']) {
    const v = headerOf(headers[name]);
    if (v === undefined || v === '') throw new Refusal(401, `missing ${name} header (Standard Webhooks)`);
    h[name] = v;
  }
  try {
    verifier.verify(raw, h, { jsonParse: false });
  } catch (err) {
    const why = err instanceof WebhookVerificationError ? err.message : 'signature could not be verified';
    throw new Refusal(401, `invalid webhook: ${why}`);
  }
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
    throw new Refusal(422, 'the body is not JSON');
  }
  const id = o.idPointers.map((p) => resolvePointer(doc, p)).find((v): v is string => typeof v === 'string' && v.trim() !== '');
  if (id === undefined) throw new Refusal(422, `no conversation id: none of ${o.idPointers.join(', ')} is a string in the body (set CONVO_MIRROR_WEBHOOK_ID_POINTERS)`);
  const conversationId = id.trim();
  // Ids are single path segments of /v1/conversations/:id/messages.
  if (conversationId.length > 256 || conversationId === '.' || conversationId === '..' || /[/\\\x00-\x1f\x7f]/.test(conversationId)) {
    throw new Refusal(422, 'the conversation id is not usable as an id (a path separator, a control character, or over 256 characters)');
  }
  return { conversation_id: conversationId, account_id: accountOf(doc, headerAccount, o.accounts) };
}

/**
 * The workspace: `/account_id` or `/data/account_id`, else the `X-Account-Id` header, else the only
 * configured one; compared case-insensitively, answered with the configured spelling.
 * @throws {@link Refusal} 422 when it is not configured, or several are and none is named
 */
function accountOf(doc: unknown, headerAccount: string | undefined, accounts: readonly string[]): string {
  const named = ACCOUNT_POINTERS.map((p) => resolvePointer(doc, p)).find((v): v is string => typeof v === 'string' && v !== '') ?? headerAccount;
  if (named === undefined) {
    if (accounts.length === 1) return accounts[0]!;
    throw new Refusal(422, `no workspace named (${ACCOUNT_POINTERS.join(' or ')} in the body, or the X-Account-Id header) and ${accounts.length} are configured`);
  }
  const found = accounts.find((a) => a.toLowerCase() === named.trim().toLowerCase());
  if (found === undefined) throw new Refusal(422, `workspace ${JSON.stringify(named.slice(0, 64))} is not configured in this daemon`);
  return found;
}

/** Answers a refusal (its status and reason), logged at warn; anything else is a 500. */
function refuse(reply: FastifyReply, err: unknown, webhookId: string | undefined, logger: Logger): FastifyReply {
  if (err instanceof Refusal) {
    logger.warn({ webhook_id: webhookId, status: err.status, reason: err.message }, 'webhook refused');
    return reply.code(err.status).send({ error: err.message });
  }
  logger.error({ webhook_id: webhookId, err: err instanceof Error ? err.message : String(err) }, 'webhook failed');
  return reply.code(500).send({ error: 'internal error' });
}
