/**
 * ApiClient: the only code that talks HTTP to the support API (design: src/api/).
 *
 * - undici `Pool` bound to the base URL's origin, keep-alive; redirects are never followed (a 3xx is
 *   an error), so the API key can never travel to another origin; TLS certificates are verified.
 * - Every request carries `X-Api-Key` and, when configured, `X-Account-Id` (spec 5); lists always ask
 *   `per_page=100`, the maximum (spec 8).
 * - Retries with p-retry: network errors, timeouts, 408, 429 and 5xx, with exponential backoff and
 *   full jitter; `Retry-After` (seconds or HTTP-date) is honoured, capped, and pauses every request of
 *   the process. 400, 401, 403, 404, 422 and other 4xx are never retried.
 * - A request-rate cap ({@link RateLimiter}), shared by the clients of one base URL and key when they
 *   get it from one {@link LimiterPool} (a `RateLimiterPool` in one process; a `FleetRateLimiterPool`
 *   shares it with every daemon of a fleet through Redis): `maxRps` is an upper bound; below it the
 *   cap adapts to the server (slow start: one request in flight, widening, until the server shows a
 *   limit; lowered after a 429 to 90 % of the rate achieved in the last second, 97.5 % for slow
 *   start's first, never more than that many in any second of actual send times; paced by `RateLimit-Limit`/`-Remaining`/`-Reset` headers when served).
 * - Every response body is read under a byte cap (`maxResponseBytes`): a larger `content-length` is
 *   refused before reading, and a body that crosses the cap while streaming is cut off at once
 *   ({@link ResponseTooLargeError}, never retried). Bodies of failed requests are read at most
 *   {@link ERROR_BODY_LIMIT_BYTES}, then dropped. The per-request timeout covers the body too.
 * - Responses are validated with zod ({@link parsePage}); pages flow out as async generators.
 */
import { getMaxListeners, setMaxListeners } from 'node:events';
import { Pool, type Dispatcher } from 'undici';
import pRetry, { AbortError } from 'p-retry';
import type { Logger } from 'pino';
import {
  AuthError,
  ConfigError,
  HttpError,
  NotFoundError,
  PageRunawayError,
  RateLimitedError,
  RedirectRefusedError,
  ResponseTooLargeError,
  SchemaError,
  type HttpErrorDetails,
} from '../errors.js';
import { systemClock, type Clock } from '../clock.js';
import { RateLimiter, parseRateLimitHeaders, type AdaptiveOptions, type LimiterPool, type RequestLimiter } from './rate-limit.js';
import { parseRetryAfter, retryDelay, type BackoffOptions } from './backoff.js';
import { firstContactError } from './first-contact.js';
import {
  ConversationsPageSchema,
  MAX_JSON_VALUES,
  MessagesPageSchema,
  PER_PAGE,
  countJsonValues,
  parsePage,
  type Conversation,
  type Message,
  type Meta,
  type Page,
} from './schemas.js';


export { PER_PAGE };

/** Default of {@link ApiClientOptions.maxResponseBytes}: 33554432 bytes (32 MiB). */
export const DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024;

/** Most bytes read from the body of a non-2xx answer (65536, 64 KiB) before it is dropped; it is never used. */
export const ERROR_BODY_LIMIT_BYTES = 64 * 1024;

/** Options of {@link ApiClient}. */
export interface ApiClientOptions {
  /** The spec's `{base_url}` (may carry a path prefix); `/v1/...` is appended. */
  baseUrl: string;
  /** Sent as `X-Api-Key`; never logged, never put in an error. */
  apiKey: string;
  /** Sent as `X-Account-Id` when set (a UUID, spec 5). */
  accountId?: string | undefined;
  /**
   * Extra query parameters of every `GET /v1/conversations` request, after `page` and `per_page`
   * (e.g. `[['sort', 'last_activity_at'], ['order', 'desc']]` for an API that sorts on request).
   * @defaultValue none
   */
  listParams?: readonly (readonly [string, string])[] | undefined;
  /**
   * Requests per second across this client, an upper bound; 0 = no configured cap (a cap learned
   * from 429s and `RateLimit-*` headers still applies). @defaultValue 10
   */
  maxRps?: number;
  /** How the cap adapts to the server (see {@link RateLimiter}). @defaultValue adaptive */
  rateLimit?: AdaptiveOptions;
  /**
   * A limiter shared with other clients (e.g. {@link LimiterPool.limiterFor} this base URL and
   * key: a `RateLimiter`, or a `FleetRateLimiter` shared through Redis); when given, `maxRps` and
   * `rateLimit` are not used (the limiter has its own).
   * @defaultValue a limiter of this client's own
   */
  limiter?: RequestLimiter | undefined;
  /** Keep-alive connections to the API. @defaultValue 8 */
  connections?: number;
  /**
   * Per-attempt timeout in ms, from sending to the last body byte: a body that trickles in slower
   * is cut off (a timeout, retried like one). @defaultValue 30000
   */
  requestTimeoutMs?: number;
  /**
   * Largest response body read, in bytes. A `content-length` above it is refused without reading;
   * a body crossing it while streaming is cut off as soon as the cap is crossed. Either way the
   * request fails with {@link ResponseTooLargeError}, never retried. At most this much (plus one
   * chunk) is buffered per request in flight. @defaultValue 33554432 (32 MiB,
   * {@link DEFAULT_MAX_RESPONSE_BYTES})
   */
  maxResponseBytes?: number;
  /** Retries after the first attempt for transient failures. @defaultValue 6 */
  maxRetries?: number;
  /** Backoff shape for retries without `Retry-After`. */
  backoff?: BackoffOptions;
  /** Longest `Retry-After` we honour, ms; longer values are capped to this. @defaultValue 120000 */
  maxRetryAfterMs?: number;
  /** Time source for delays and the rate cap. @defaultValue the system clock */
  clock?: Clock;
  /** Where retries and failures are logged (debug/warn). */
  logger?: Logger | undefined;
  /** Aborts in-flight requests and pending retries (shutdown). */
  signal?: AbortSignal | undefined;
  /**
   * Called when the API answers 429, with the wait (ms) before the next attempt, e.g. so every
   * worker of a queue backs off (`queue.rateLimit`), not just this request.
   */
  onRateLimited?: ((delayMs: number) => void) | undefined;
  /**
   * Called once per attempt sent (each retry counts, exactly when {@link ApiStats.requests} grows),
   * as soon as its outcome is known: with the HTTP status once the status line arrives (a 2xx whose
   * body then fails to read still reports that status), or `status: undefined` when the attempt got
   * no status (network error, timeout, abort). `retry` is true for every attempt after the first of
   * a request. Never called for an attempt not sent (aborted while waiting for the rate cap). E.g.
   * the daemon's Prometheus counters. A hook that throws is ignored: it never fails a request.
   */
  onAttempt?: ((e: AttemptEvent) => void) | undefined;
  /**
   * Fail fast at first contact (`check`, `sync`, the daemon's start-up check): until the server has
   * answered anything, a refused connection, an unknown host, `https://` against plain HTTP or an
   * untrusted certificate is a {@link ConfigError} naming {@link baseUrlSetting}, not retried (see
   * src/api/first-contact.ts). After the first answer the same failures are transients, retried.
   * @defaultValue false
   */
  failFast?: boolean | undefined;
  /** The setting that holds the base URL, for errors. @defaultValue `CONVO_MIRROR_BASE_URL` */
  baseUrlSetting?: string | undefined;
}

/** What {@link ApiClientOptions.onAttempt} is told about one attempt. */
export interface AttemptEvent {
  /** The HTTP status answered; undefined when the attempt ended without one (network error, timeout). */
  status: number | undefined;
  /** True for a retry (every attempt after the first of one request). */
  retry: boolean;
}

/** Counters of one client, read by progress bars and the runs table. */
export interface ApiStats {
  /** Attempts sent (each retry counts). */
  requests: number;
  /** Attempts that were retries. */
  retries: number;
  /** Responses answered 429. */
  rateLimited: number;
  /** Attempts that ended without an HTTP status (network error, timeout). */
  networkErrors: number;
  /** Responses by HTTP status. */
  byStatus: Record<number, number>;
}

/**
 * Per-caller request counters (e.g. one conversation's crawl), added to by the client as requests
 * are sent and pages served: the one source of a run's request and "served" figures.
 */
export interface RequestTally {
  /** Attempts sent (each retry counts). */
  requests: number;
  /** Attempts that were retries. */
  retries: number;
  /** Responses answered 429. */
  rateLimited: number;
  /** Records served on the pages that parsed (conversations for the list, messages for a crawl). */
  served: number;
}

/** A zeroed {@link RequestTally}. */
export const newTally = (): RequestTally => ({ requests: 0, retries: 0, rateLimited: 0, served: 0 });

/** `a` + `b`, field by field. */
export const addTally = (a: RequestTally, b: RequestTally): RequestTally => ({
  requests: a.requests + b.requests,
  retries: a.retries + b.retries,
  rateLimited: a.rateLimited + b.rateLimited,
  served: a.served + b.served,
});

/** A response we fetched and parsed as JSON. */
interface JsonResponse {
  status: number;
  body: unknown;
}

/** Adds `b` into `a`, field by field. */
function addInto(a: RequestTally, b: RequestTally): void {
  a.requests += b.requests;
  a.retries += b.retries;
  a.rateLimited += b.rateLimited;
  a.served += b.served;
}

/** Whether a conversation id can be a path segment (URL normalization would rewrite empty, `.` and `..`). */
function usableInPath(conversationId: string): boolean {
  return conversationId !== '' && conversationId !== '.' && conversationId !== '..';
}

/** The path of page `page` of a conversation's messages (spec 4.1), `per_page=100`. */
function messagesPath(conversationId: string, page: number): string {
  return `/v1/conversations/${encodeURIComponent(conversationId)}/messages?page=${page}&per_page=${PER_PAGE}`;
}

/** An answer (or failure) fetched ahead by {@link ApiClient.prefetch}, and what fetching it cost. */
interface Kept {
  response?: JsonResponse;
  error?: unknown;
  tally: RequestTally;
  /** Set when the run's request took it. */
  used: boolean;
}

/**
 * A first request sent ahead of its run by {@link ApiClient.prefetch}: how it ended, what it cost,
 * and its release.
 */
export class Prefetch {
  /** @internal made by {@link ApiClient.prefetch} */
  constructor(
    private readonly store: Map<string, Kept>,
    private readonly path: string | undefined,
    /**
     * How the request ended: `page` (a 2xx answer), `not-found` (404: the conversation does not
     * exist, or no longer does), `error` (another failure, e.g. a 503 after its retries, or an id
     * no request can carry). The answer is kept for the run either way.
     */
    readonly outcome: 'page' | 'not-found' | 'error',
    /** Attempts sent for it (retries included). */
    readonly tally: RequestTally,
    private readonly kept?: Kept,
  ) {}

  /**
   * Ends the prefetch: a kept answer the run did not take is dropped (it will not answer a later
   * request). Idempotent.
   *
   * @returns whether the run's request took the answer (then its {@link tally} is counted in that
   *   request's tally; else the caller decides where the cost goes)
   */
  release(): boolean {
    if (this.path !== undefined && this.store.get(this.path) === this.kept) this.store.delete(this.path);
    return this.kept?.used === true;
  }
}

/**
 * HTTP client of the support API.
 *
 * @example
 * ```ts
 * const api = new ApiClient({ baseUrl, apiKey, accountId });
 * for await (const page of api.messages(conversationId)) console.log(page.meta.current_page, page.data.length);
 * await api.close();
 * ```
 */
export class ApiClient {
  readonly stats: ApiStats = { requests: 0, retries: 0, rateLimited: 0, networkErrors: 0, byStatus: {} };
  private readonly pool: Pool;
  private readonly basePath: string;
  /** `&`-prefixed, encoded {@link ApiClientOptions.listParams} ('' when none). */
  private readonly listQuery: string;
  private readonly headers: Record<string, string>;
  private readonly limiter: RequestLimiter;
  private readonly clock: Clock;
  private readonly timeoutMs: number;
  private readonly maxRetries: number;
  private readonly maxRetryAfterMs: number;
  private readonly maxResponseBytes: number;
  /** Whether any response (any status) has arrived: ends {@link ApiClientOptions.failFast}'s first contact. */
  private answered = false;
  /** Answers fetched ahead by {@link prefetch}, by path, until the run's request takes them. */
  private readonly prefetched = new Map<string, Kept>();

  /** @throws RangeError when `maxResponseBytes` is not a positive safe integer */
  constructor(private readonly opts: ApiClientOptions) {
    const url = new URL(opts.baseUrl);
    this.basePath = url.pathname.replace(/\/+$/, '');
    const extra = new URLSearchParams(opts.listParams?.map(([k, v]): [string, string] => [k, v]) ?? []).toString();
    this.listQuery = extra === '' ? '' : `&${extra}`;
    this.clock = opts.clock ?? systemClock;
    this.timeoutMs = opts.requestTimeoutMs ?? 30_000;
    this.maxRetries = opts.maxRetries ?? 6;
    this.maxRetryAfterMs = opts.maxRetryAfterMs ?? 120_000;
    this.maxResponseBytes = opts.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
    if (!(Number.isSafeInteger(this.maxResponseBytes) && this.maxResponseBytes > 0)) {
      throw new RangeError(`ApiClient: maxResponseBytes must be a positive integer, got ${this.maxResponseBytes}`);
    }
    this.limiter = opts.limiter ?? new RateLimiter(opts.maxRps ?? 10, this.clock, opts.rateLimit);
    // Every request waiting at the limiter or in flight listens for shutdown (and removes its
    // listener when done): more than Node's default of 10 is normal, not a leak.
    if (opts.signal && getMaxListeners(opts.signal) < SIGNAL_LISTENERS) setMaxListeners(SIGNAL_LISTENERS, opts.signal);
    this.pool = new Pool(url.origin, {
      connections: opts.connections ?? 8,
      keepAliveTimeout: 30_000,
      headersTimeout: this.timeoutMs,
      bodyTimeout: this.timeoutMs,
      connect: { timeout: Math.min(this.timeoutMs, 10_000) },
    });
    this.headers = { accept: 'application/json', 'x-api-key': opts.apiKey };
    if (opts.accountId) this.headers['x-account-id'] = opts.accountId;
  }

  /** The path of conversation list page `page` (with {@link ApiClientOptions.listParams}). */
  private listPath(page: number): string {
    return `/v1/conversations?page=${page}&per_page=${PER_PAGE}${this.listQuery}`;
  }

  /** The request-rate cap in force (configured or learned), requests/s; 0 = none. */
  get rateCap(): number {
    return this.limiter.currentRps;
  }

  /**
   * Pages through `GET /v1/conversations` (spec 4.2; envelope assumed as in 4.1) from `startPage`
   * while `page < meta.total_pages`, re-reading `total_pages` on every page so a growing list keeps
   * paging. Stops early at an empty page.
   *
   * Bounded: the first page fetched fixes the most pages this pass may read, {@link pageBound} of its
   * meta (its own total plus 10 % plus 10 pages). A server that keeps announcing more pages beyond
   * that gets a {@link PageRunawayError} instead of another request.
   *
   * @throws {@link ConfigError} for `CONVO_MIRROR_BASE_URL` when the list answers 404 (the list
   *   endpoint is missing: the base URL is wrong); {@link HttpError}, {@link AuthError},
   *   {@link ResponseTooLargeError}, {@link SchemaError} (also for a page of more than
   *   {@link PER_PAGE} records), {@link PageRunawayError}
   */
  async *conversations(startPage = 1, tally?: RequestTally): AsyncGenerator<Page<Conversation>> {
    let bound: { maxPage: number; meta: Meta } | undefined;
    for (let page = startPage; ; page++) {
      const path = this.listPath(page);
      const context = { path, page };
      const what = `conversation list page ${page}`;
      const res = await this.getJson(path, {}, tally, what).catch((err: unknown) => {
        throw err instanceof NotFoundError ? wrongBaseUrl(err, this.opts.baseUrlSetting) : err;
      });
      checkPageSize(res.body, what, context);
      const parsed = parsePage(ConversationsPageSchema, res.body, page, what, context);
      bound ??= { maxPage: pageBound(parsed.meta), meta: parsed.meta };
      if (tally) tally.served += parsed.data.length;
      yield parsed;
      if (parsed.data.length === 0 || page >= parsed.meta.total_pages) return;
      if (page + 1 > bound.maxPage) throw runaway('conversation list', bound.meta, page, context);
    }
  }

  /**
   * Pages through `GET /v1/conversations/:id/messages` (spec 4.1) from `startPage`, with
   * `per_page=100`, while `page < meta.total_pages` (re-read on every page). Stops early at an
   * empty page. The caller checks drift (`meta.total_count` changes) and may stop iterating.
   *
   * Bounded like {@link ApiClient.conversations}: at most {@link pageBound} of the first fetched
   * page's meta, then {@link PageRunawayError}. An id that URL normalization would rewrite (empty,
   * `.` or `..`) is refused before any request.
   *
   * @throws {@link SchemaError} for such an id (no request is sent), for a page that is not JSON,
   *   breaks the documented shape, holds more than {@link PER_PAGE} records or whose
   *   `meta.current_page` is not the page asked for; {@link NotFoundError} (404: the conversation is
   *   gone, or never existed), {@link HttpError}, {@link AuthError}, {@link ResponseTooLargeError},
   *   {@link PageRunawayError}
   */
  async *messages(conversationId: string, startPage = 1, tally?: RequestTally): AsyncGenerator<Page<Message>> {
    if (!usableInPath(conversationId)) {
      throw new SchemaError(`conversation id ${JSON.stringify(conversationId)} cannot be used in a request path`, {
        conversation_id: conversationId,
      });
    }
    let bound: { maxPage: number; meta: Meta } | undefined;
    for (let page = startPage; ; page++) {
      const path = messagesPath(conversationId, page);
      const context = { path, page, conversation_id: conversationId };
      const what = `conversation ${conversationId} messages page ${page}`;
      const res = await this.getJson(path, { conversation_id: conversationId }, tally, what);
      checkPageSize(res.body, what, context);
      const parsed = parsePage(MessagesPageSchema, res.body, page, what, context);
      if (parsed.meta.current_page !== page) {
        throw new SchemaError(
          `conversation ${conversationId} messages page ${page}: meta.current_page is ${parsed.meta.current_page}, expected ${page} (spec 4.1 rule 2)`,
          { ...context, field: 'meta.current_page' },
        );
      }
      bound ??= { maxPage: pageBound(parsed.meta), meta: parsed.meta };
      if (tally) tally.served += parsed.data.length;
      yield parsed;
      if (parsed.data.length === 0 || page >= parsed.meta.total_pages) return;
      if (page + 1 > bound.maxPage) throw runaway(`conversation ${conversationId} messages`, bound.meta, page, context);
    }
  }

  /**
   * First contact ahead of a run: sends the request the run will make first (page 1 of the
   * conversation list, or of `conversationId`'s messages) before anything of the run exists, and
   * keeps its answer, so that the run's own request for that page is answered from it, once,
   * instead of being sent again. The request counts where it is used: in the tally of the request
   * that takes the kept answer, else (see {@link Prefetch.release}) wherever the caller puts it.
   * A run that could not begin (a wrong base URL, a refused key) thus leaves nothing behind, and
   * one that does costs no extra request.
   *
   * Retries and limits as any request (with {@link ApiClientOptions.failFast}, a wrong base URL
   * fails at once). A failure that is not the end of a run (a 404 of the conversation, a 503 after
   * its retries...) is kept like an answer: the run's request meets it as it would have.
   *
   * @param conversationId - prefetch page 1 of this conversation's messages; undefined: page 1 of
   *   the conversation list (spec 4.1, 4.2)
   * @throws {@link ConfigError} naming the base URL's setting when nothing answers there, it
   *   redirects, or the list's first page answers 404, a body that is not JSON, or JSON that is not
   *   the documented envelope (the base URL is not the API's); {@link AuthError} for 401/403.
   *   Nothing is kept then.
   */
  async prefetch(conversationId?: string): Promise<Prefetch> {
    const tally = newTally();
    if (conversationId !== undefined && !usableInPath(conversationId)) {
      // messages() refuses such an id before any request: nothing to send, nothing to keep.
      return new Prefetch(this.prefetched, undefined, 'error', tally);
    }
    const path = conversationId === undefined ? this.listPath(1) : messagesPath(conversationId, 1);
    const what = conversationId === undefined ? 'conversation list page 1' : `conversation ${conversationId} messages page 1`;
    const context = conversationId === undefined ? {} : { conversation_id: conversationId };
    // A kept answer for this path (one a run never took) is dropped: first contact always asks.
    this.prefetched.delete(path);
    let kept: Kept;
    try {
      kept = { response: await this.getJson(path, context, tally, what), tally, used: false };
    } catch (err) {
      const error = conversationId === undefined ? listAtFirstContact(err, this.opts.baseUrlSetting) : err;
      if (error instanceof ConfigError || error instanceof AuthError) throw error;
      kept = { error, tally, used: false };
    }
    if (conversationId === undefined && kept.response) {
      const why = notAListPage(kept.response.body);
      if (why !== undefined) throw notTheApi(path, kept.response.status, why, this.opts.baseUrlSetting);
    }
    this.prefetched.set(path, kept);
    const outcome = kept.error === undefined ? 'page' : kept.error instanceof NotFoundError ? 'not-found' : 'error';
    return new Prefetch(this.prefetched, path, outcome, tally, kept);
  }

  /**
   * GET `path` (relative to the base URL, starting `/v1/`) with retries; parses the JSON body, read
   * under the `maxResponseBytes` cap.
   *
   * @param context - loggable fields added to errors and logs (e.g. `conversation_id`)
   * @param tally - per-caller counters, added to as attempts are sent
   * @param label - what is being read, for error messages, e.g. `conversation 1b2c… messages page 3`
   *   @defaultValue `GET <path>`
   * @throws {@link AuthError} on 401/403 (not retried), {@link NotFoundError} on 404 (not retried),
   *   {@link RedirectRefusedError} on 3xx (not retried), {@link ResponseTooLargeError} when the body
   *   exceeds `maxResponseBytes` (not retried), {@link RateLimitedError} (429) or {@link HttpError}
   *   on other failures once retries are exhausted or for non-retryable statuses,
   *   {@link SchemaError} when a 2xx body is not JSON
   */
  async getJson(path: string, context: Record<string, unknown> = {}, tally?: RequestTally, label?: string): Promise<JsonResponse> {
    const kept = this.prefetched.get(path);
    if (kept) {
      // The run's first request, answered ahead by prefetch(): counted here, where it is used.
      this.prefetched.delete(path);
      kept.used = true;
      if (tally) addInto(tally, kept.tally);
      if (kept.error !== undefined) throw kept.error;
      return kept.response!;
    }
    let attempts = 0;
    const log = this.opts.logger;
    try {
      return await pRetry(
        async () => {
          attempts++;
          if (attempts > 1) {
            this.stats.retries++;
            if (tally) tally.retries++;
          }
          try {
            return await this.attempt(path, attempts, context, label ?? `GET ${path}`, tally);
          } catch (err) {
            if (err instanceof HttpError) err.attempts = attempts;
            if (err instanceof HttpError && err.retryable && !this.opts.signal?.aborted) throw err;
            throw new AbortError(err as Error);
          }
        },
        {
          retries: this.maxRetries,
          signal: this.opts.signal,
          minTimeout: 0,
          maxTimeout: 0,
          onFailedAttempt: async ({ error, retriesLeft }) => {
            const httpErr = error as HttpError;
            const delay = retryDelay({
              attempt: attempts,
              error: httpErr,
              retriesLeft,
              backoff: this.opts.backoff,
              maxRetryAfterMs: this.maxRetryAfterMs,
            });
            if (delay === undefined) return;
            const limited = httpErr instanceof RateLimitedError;
            if (limited || httpErr.retryAfterMs !== undefined) this.limiter.pauseUntil(this.clock.now() + delay);
            if (limited) this.opts.onRateLimited?.(delay);
            log?.warn(
              { method: 'GET', path, status: httpErr.status, attempt: attempts, delay_ms: delay, err_code: httpErr.code, ...context },
              'request failed, retrying',
            );
            await this.clock.sleep(delay, this.opts.signal);
          },
        },
      );
    } catch (err) {
      if (err instanceof HttpError) err.attempts = attempts;
      throw err;
    }
  }

  /** One attempt: rate cap, request, status mapping, capped body read, JSON parse. */
  private async attempt(
    path: string,
    attempt: number,
    context: Record<string, unknown>,
    label: string,
    tally?: RequestTally,
  ): Promise<JsonResponse> {
    const firstContact = this.opts.failFast === true && !this.answered;
    const { res, deadline } = await this.send(path, attempt, tally);
    try {
      const { statusCode, headers } = res;
      const details = { method: 'GET', path, attempts: attempt };
      if (firstContact && statusCode >= 300 && statusCode < 400) {
        await res.body.dump({ limit: ERROR_BODY_LIMIT_BYTES }).catch(() => undefined);
        throw redirectAtFirstContact(this.opts.baseUrl, statusCode, firstHeader(headers['location']), this.opts.baseUrlSetting);
      }
      if (statusCode >= 200 && statusCode < 300) {
        const buf = await this.readBody(res, label, { ...details, status: statusCode });
        return { status: statusCode, body: decodeJson(buf, statusCode, path, label, context) };
      }
      // The body of a failure is never used: read a little (so a short one keeps the connection
      // reusable), then drop it. Bounded in bytes and by the request's signal.
      await res.body.dump({ limit: ERROR_BODY_LIMIT_BYTES }).catch(() => undefined);
      if (statusCode === 429) {
        this.stats.rateLimited++;
        if (tally) tally.rateLimited++;
      }
      throw statusError({ ...details, status: statusCode, retryAfterMs: parseRetryAfter(headers['retry-after'], this.clock.now()) });
    } finally {
      deadline.dispose();
    }
  }

  /**
   * Sends one request through the limiter (slow-start window, then spacing) and waits for its
   * status; the limiter sees the status and headers before the body is read.
   *
   * @throws {@link HttpError} without status on a network error or timeout
   */
  private async send(path: string, attempt: number, tally?: RequestTally): Promise<{ res: Dispatcher.ResponseData; deadline: AttemptDeadline }> {
    await this.limiter.enter(this.opts.signal);
    try {
      await this.limiter.acquire(this.opts.signal);
      const sentSeq = this.limiter.sentCount;
      this.stats.requests++;
      if (tally) tally.requests++;
      // One signal bounds the whole attempt: undici keeps it armed until the body stream closes;
      // the caller disposes of it once the body is read (here, if anything fails before that).
      const deadline = new AttemptDeadline(this.timeoutMs, this.opts.signal);
      let res: Dispatcher.ResponseData | undefined;
      try {
        res = await this.pool.request({ path: this.basePath + path, method: 'GET', headers: this.headers, signal: deadline.signal });
        this.noteResponse(res, attempt, sentSeq);
        return { res, deadline };
      } catch (err) {
        deadline.dispose();
        if (res) {
          res.body.destroy();
          throw err;
        }
        this.reportAttempt(undefined, attempt);
        throw this.transportError(path, { method: 'GET', path, attempts: attempt }, err);
      }
    } finally {
      this.limiter.leave();
    }
  }

  /** Counts a response's status and tells the limiter (before its body is read). */
  private noteResponse(res: Dispatcher.ResponseData, attempt: number, sentSeq: number): void {
    const { statusCode, headers } = res;
    this.answered = true;
    this.reportAttempt(statusCode, attempt);
    this.stats.byStatus[statusCode] = (this.stats.byStatus[statusCode] ?? 0) + 1;
    const now = this.clock.now();
    this.limiter.observe(statusCode, parseRateLimitHeaders(headers, now), sentSeq);
    if (statusCode === 429) {
      // The pause is set here, when the 429 arrives, not only once this request's retry is
      // scheduled (after its body is dropped): onRateLimited may end slow start and open the gate,
      // and a waiting request would go out into the same refusal.
      const retryAfter = parseRetryAfter(headers['retry-after'], now);
      if (retryAfter !== undefined) this.limiter.pauseUntil(now + Math.min(retryAfter, this.maxRetryAfterMs));
      this.limiter.onRateLimited(sentSeq);
    }
  }

  /**
   * Reads a 2xx body, at most `maxResponseBytes`: a larger
   * `content-length` is refused unread, and the stream is destroyed (closing the connection) the
   * moment the running total crosses the cap.
   *
   * @throws {@link ResponseTooLargeError}; {@link HttpError} without status when the stream fails
   *   (network error, timeout, shutdown)
   */
  private async readBody(res: Dispatcher.ResponseData, label: string, details: HttpErrorDetails): Promise<Buffer> {
    const cap = this.maxResponseBytes;
    const body = res.body;
    const declared = firstHeader(res.headers['content-length']);
    if (declared !== undefined && /^\d+$/.test(declared.trim()) && Number(declared.trim()) > cap) {
      discard(body);
      throw this.tooLarge(label, details, `its content-length is ${declared.trim()} bytes, so none of it was read`);
    }
    const chunks: Buffer[] = [];
    let total = 0;
    try {
      for await (const chunk of body as AsyncIterable<Buffer>) {
        total += chunk.length;
        if (total > cap) {
          discard(body);
          throw this.tooLarge(label, details, `reading stopped at ${total} bytes and the rest was not read`);
        }
        chunks.push(chunk);
      }
    } catch (err) {
      if (err instanceof ResponseTooLargeError) throw err;
      throw this.transportError(details.path, details, err);
    }
    return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, total);
  }

  /** Tells {@link ApiClientOptions.onAttempt} about one attempt sent; a hook that throws is ignored. */
  private reportAttempt(status: number | undefined, attempt: number): void {
    try {
      this.opts.onAttempt?.({ status, retry: attempt > 1 });
    } catch {
      /* an observer never fails a request */
    }
  }

  /** The {@link ResponseTooLargeError} of `label`; `how` says what gave the size away. */
  private tooLarge(label: string, details: HttpErrorDetails, how: string): ResponseTooLargeError {
    const cap = this.maxResponseBytes;
    const mib = Math.round((cap / (1024 * 1024)) * 100) / 100;
    return new ResponseTooLargeError(
      `${label}: GET ${details.path} answered ${details.status} with a body larger than the limit of ${cap} bytes (${mib} MiB): ${how}. ` +
        'If the API really serves responses this large, raise CONVO_MIRROR_MAX_RESPONSE_BYTES',
      { ...details, limitBytes: cap },
    );
  }

  /**
   * The {@link HttpError} (no status, retryable) of a request or body read that failed in transport;
   * with {@link ApiClientOptions.failFast}, before any answer, the {@link ConfigError} of a wrong
   * base URL when the failure shows one (not retried).
   */
  private transportError(path: string, details: HttpErrorDetails, err: unknown): HttpError | ConfigError {
    this.stats.networkErrors++;
    if (this.opts.failFast && !this.answered && !this.opts.signal?.aborted) {
      const wrong = firstContactError(this.opts.baseUrl, err, this.opts.baseUrlSetting);
      if (wrong) return wrong;
    }
    const e = err as Error & { code?: string };
    const what = this.opts.signal?.aborted
      ? 'aborted (shutting down)'
      : e.name === 'TimeoutError' || /timeout/i.test(e.code ?? '')
        ? `timed out after ${this.timeoutMs} ms`
        : `network error (${e.code ?? e.name}: ${e.message})`;
    return new HttpError(`GET ${path}: ${what}`, { method: details.method, path: details.path, attempts: details.attempts }, { cause: err });
  }

  /** Closes the connection pool. */
  async close(): Promise<void> {
    await this.pool.close();
  }
}

/**
 * Abort listeners a client's `signal` may hold before Node warns: up to three per request (waiting
 * at the slow-start gate, sleeping for its slot, in flight), for every client sharing the signal.
 */
const SIGNAL_LISTENERS = 1000;

/**
 * The signal of one attempt: aborts with a `TimeoutError` after `timeoutMs`, or with the parent's
 * reason when `parent` aborts. Unlike `AbortSignal.any([parent, AbortSignal.timeout(ms)])`,
 * {@link dispose} clears the timer and detaches from the parent at once: with those, every request
 * left a timer alive for the whole timeout and a weak reference on the parent signal for the life
 * of the process, so a sync's heap grew with its request count.
 */
export class AttemptDeadline {
  private readonly controller = new AbortController();
  private readonly timer: NodeJS.Timeout;
  private readonly onParentAbort: (() => void) | undefined;

  /**
   * @param timeoutMs - ms until the signal aborts with a `TimeoutError` (`DOMException`)
   * @param parent - a signal whose abort aborts this one too (e.g. shutdown)
   */
  constructor(
    timeoutMs: number,
    private readonly parent?: AbortSignal,
  ) {
    this.timer = setTimeout(() => this.controller.abort(new DOMException(`timed out after ${timeoutMs} ms`, 'TimeoutError')), timeoutMs);
    if (parent?.aborted) this.controller.abort(parent.reason);
    else if (parent) {
      const onAbort = (): void => this.controller.abort(parent.reason);
      parent.addEventListener('abort', onAbort, { once: true });
      this.onParentAbort = onAbort;
    }
  }

  /** Aborts at the deadline or with the parent. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** The attempt is over: clears the timer and the listener on the parent. Idempotent. */
  dispose(): void {
    clearTimeout(this.timer);
    if (this.onParentAbort) this.parent!.removeEventListener('abort', this.onParentAbort);
  }
}

/**
 * The pages a page's meta declares: `min(meta.total_pages, ceil(meta.total_count / 100))` (spec 2.3;
 * the two describe the same records, and a `total_pages` beyond what `total_count` allows is not
 * believed).
 */
export function declaredPages(meta: Meta): number {
  return Math.min(meta.total_pages, Math.ceil(meta.total_count / PER_PAGE));
}

/**
 * The last page a paging pass may request, given the meta of the first page it fetched:
 * `ceil(expected * 1.1) + 10` where `expected = min(meta.total_pages, ceil(meta.total_count / 100))`
 * (spec 2.3: both describe the same records; a `total_pages` beyond what `total_count` allows is
 * not believed). The slack lets a list or conversation grow by 10 % plus 1,000 records during one
 * pass; a server still announcing more pages beyond it is running away. E.g. a first page saying 1
 * page allows 12 pages, 2 pages allow 13, 100 pages allow 120; 10,000,000 pages of 0 records, 10.
 */
export function pageBound(meta: Meta): number {
  const expected = declaredPages(meta);
  // Integer arithmetic: expected * 1.1 in floating point would round 10 pages up to 12.
  return Math.ceil((expected * 11) / 10) + 10;
}

/**
 * The typed error of a non-2xx answer: {@link AuthError} (401, 403), {@link NotFoundError} (404),
 * {@link RateLimitedError} (429), {@link RedirectRefusedError} (3xx, never followed), else
 * {@link HttpError} (retryable for 408 and 5xx).
 */
function statusError(details: HttpErrorDetails & { status: number }): HttpError {
  const { status, path } = details;
  if (details.retryAfterMs === undefined) delete details.retryAfterMs;
  if (status === 401 || status === 403) return new AuthError(details);
  if (status === 404) return new NotFoundError(`GET ${path}: answered 404`, details);
  if (status === 429) return new RateLimitedError(`GET ${path}: answered 429`, details);
  if (status >= 300 && status < 400) {
    return new RedirectRefusedError(
      `GET ${path}: answered a ${status} redirect, which is never followed (the API key must not leave the configured origin)`,
      details,
    );
  }
  return new HttpError(`GET ${path}: answered ${status}`, details);
}

/**
 * A redirect at first contact (`failFast`): the base URL is not where the API answers, typically
 * `http://` redirected to `https://`. Names the setting and where the redirect points (scheme, host
 * and port only: never its path or query). Redirects are never followed (the key stays at the
 * configured origin).
 */
function redirectAtFirstContact(baseUrl: string, status: number, location: string | undefined, setting = 'CONVO_MIRROR_BASE_URL'): ConfigError {
  const from = new URL(baseUrl);
  let to = 'elsewhere';
  try {
    if (location !== undefined) to = new URL(location, from).origin;
  } catch {
    /* an unparsable Location: say elsewhere */
  }
  return new ConfigError(
    setting,
    `${from.origin}${from.pathname.replace(/\/+$/, '')} answers with a ${status} redirect to ${to}: set the base URL to where the API answers (redirects are never followed, so the key never leaves the configured origin)`,
  );
}

/**
 * A 404 of the conversation list: the list endpoint itself is missing, so the base URL is wrong
 * (not a transient failure, and not a deletion).
 */
/**
 * What a failure of the list's first page at first contact means: a 404 (the list endpoint is not
 * there) or a body that is not JSON (a web page answers there) says the base URL is not the API's,
 * a {@link ConfigError}; anything else is what it is.
 */
function listAtFirstContact(err: unknown, setting?: string): unknown {
  if (err instanceof NotFoundError) return wrongBaseUrl(err, setting);
  if (err instanceof SchemaError) return new ConfigError(setting ?? 'CONVO_MIRROR_BASE_URL', `${err.message}: is the base URL the API's {base_url}? (something other than the API answers there)`, err);
  return err;
}

/** Why a list page's body is not the documented envelope at all (`{ data: [...], meta: {...} }`), or undefined. */
function notAListPage(body: unknown): string | undefined {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return `a JSON ${body === null ? 'null' : Array.isArray(body) ? 'array' : typeof body}, not an object`;
  const b = body as { data?: unknown; meta?: unknown };
  if (!Array.isArray(b.data)) return 'an object without a data array';
  if (b.meta === null || typeof b.meta !== 'object' || Array.isArray(b.meta)) return 'an object without a meta object';
  return undefined;
}

/** The {@link ConfigError} of a first list page that is JSON but not the documented envelope. */
function notTheApi(path: string, status: number, why: string, setting = 'CONVO_MIRROR_BASE_URL'): ConfigError {
  return new ConfigError(setting, `GET ${path} answered ${status} with ${why} (spec 4.1's page: {data, meta}): is the base URL the API's {base_url}? (something other than the API answers there)`);
}

function wrongBaseUrl(err: NotFoundError, setting = 'CONVO_MIRROR_BASE_URL'): ConfigError {
  return new ConfigError(
    setting,
    `GET ${err.path} answered 404: check that the base URL is the API's {base_url} (paths /v1/... are appended)`,
    err,
  );
}

/**
 * Parses a 2xx body read under the byte cap: at most {@link MAX_JSON_VALUES} JSON values (the byte
 * cap bounds the text; this bounds what parsing it may build: a few MB of `{},` would otherwise
 * become gigabytes of objects), a UTF-8 BOM skipped, then `JSON.parse`.
 *
 * @throws {@link SchemaError} for too many values, a body too long to decode, or one that is not JSON
 */
function decodeJson(buf: Buffer, status: number, path: string, label: string, context: Record<string, unknown>): unknown {
  if (countJsonValues(buf) > MAX_JSON_VALUES) {
    throw new SchemaError(
      `${label}: GET ${path} answered a body of more than ${MAX_JSON_VALUES} JSON values; a page holds at most ${PER_PAGE} records`,
      { ...context, path, max_values: MAX_JSON_VALUES },
    );
  }
  let text: string;
  const bom = buf.length >= 3 && buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf;
  try {
    text = buf.toString('utf8', bom ? 3 : 0);
  } catch (err) {
    // ERR_STRING_TOO_LONG: only possible with a cap above V8's longest string (about 512 MiB).
    throw new SchemaError(`${label}: GET ${path} answered a body of ${buf.length} bytes, too long to decode as text`, { path }, err);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    const why = err instanceof RangeError ? 'JSON nested too deeply to parse' : 'a body that is not JSON';
    throw new SchemaError(`GET ${path}: answered ${status} with ${why}`, { ...context, path }, err);
  }
}

/** The {@link PageRunawayError} of a pass stopped after `page`. */
function runaway(what: string, first: Meta, page: number, context: Record<string, unknown>): PageRunawayError {
  return new PageRunawayError(
    `${what}: the API kept serving pages past its own total (its first page said ${first.total_count} records in ` +
      `${first.total_pages} pages; stopped after page ${page})`,
    context,
  );
}

/**
 * A page of more than {@link PER_PAGE} records breaks paging: record (page-1)*100+i would overlap
 * the next page's positions. Checked on the parsed body, before validation.
 *
 * @throws {@link SchemaError} naming `what` and the count
 */
function checkPageSize(body: unknown, what: string, context: Record<string, unknown>): void {
  // Before validation: zod would otherwise build an issue per record of a huge page.
  const data = (body as { data?: unknown } | null)?.data;
  if (Array.isArray(data) && data.length > PER_PAGE) {
    throw new SchemaError(
      `${what}: the API served ${data.length} records on one page, more than per_page=${PER_PAGE} ` +
        '(their positions would overlap the next page)',
      { ...context, field: 'data', count: data.length },
    );
  }
}

/** The first value of a header that may repeat. */
function firstHeader(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/** Destroys a response body we will not read (closing its connection), swallowing the abort error. */
function discard(body: Dispatcher.ResponseData['body']): void {
  body.on('error', () => undefined);
  body.destroy();
}

/** The configuration fields an {@link ApiClient} is built from. */
export interface ApiConfig {
  baseUrl: string | undefined;
  apiKey: string | undefined;
  accountId: string | undefined;
  maxRps: number;
  concurrency: number;
  requestTimeoutMs: number;
  maxRetries: number;
  /** Largest response body read, bytes (`CONVO_MIRROR_MAX_RESPONSE_BYTES`); see {@link ApiClientOptions.maxResponseBytes}. */
  maxResponseBytes: number;
  /** Extra list parameters (`CONVO_MIRROR_LIST_PARAMS`); see {@link ApiClientOptions.listParams}. */
  listParams?: readonly (readonly [string, string])[] | undefined;
}

/**
 * Builds the client from the frozen configuration: rate cap, timeouts, retries and the response
 * byte cap as configured, two keep-alive connections per conversation in flight. Pass a
 * workspace's `accountId`, `baseUrl` and `apiKey` over the config's (`{ ...config, ...workspace }`)
 * to build that workspace's client.
 *
 * @param extra - `limiters`: the pool the client takes its limiter from (one per base URL and key,
 *   so clients of workspaces sharing both share their pacing; with a `FleetRateLimiterPool`, so do
 *   the daemons of a fleet); without it the client has its own
 * @throws Error when `baseUrl` or `apiKey` is missing (config/ requires them for API commands)
 */
export function apiClientFromConfig(
  config: ApiConfig,
  extra: Pick<ApiClientOptions, 'logger' | 'signal' | 'onRateLimited' | 'onAttempt' | 'clock' | 'failFast' | 'baseUrlSetting' | 'maxRetries'> & {
    limiters?: LimiterPool | undefined;
  } = {},
): ApiClient {
  if (!config.baseUrl || !config.apiKey) throw new Error('apiClientFromConfig: baseUrl and apiKey are required');
  const { limiters, ...rest } = extra;
  return new ApiClient({
    baseUrl: config.baseUrl,
    apiKey: config.apiKey,
    accountId: config.accountId,
    maxRps: config.maxRps,
    connections: Math.max(2, config.concurrency * 2),
    requestTimeoutMs: config.requestTimeoutMs,
    maxRetries: config.maxRetries,
    maxResponseBytes: config.maxResponseBytes,
    listParams: config.listParams,
    ...(limiters ? { limiter: limiters.limiterFor(config.baseUrl, config.apiKey) } : {}),
    ...rest,
  });
}

/**
 * A client for a connection check (`check`, the daemon's start-up check): it fails fast at first
 * contact ({@link ApiClientOptions.failFast}), never retries, and gives each request at most
 * `timeoutCapMs` (the configured timeout when that is shorter).
 *
 * @param timeoutCapMs - the longest one request may take, ms
 * @throws Error when `baseUrl` or `apiKey` is missing (as {@link apiClientFromConfig})
 */
export function checkClientFromConfig(
  config: ApiConfig,
  timeoutCapMs: number,
  extra: Pick<ApiClientOptions, 'logger' | 'signal' | 'onAttempt' | 'baseUrlSetting'> = {},
): ApiClient {
  return apiClientFromConfig({ ...config, requestTimeoutMs: Math.min(config.requestTimeoutMs, timeoutCapMs) }, { ...extra, failFast: true, maxRetries: 0 });
}
