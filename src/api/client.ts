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
 * - A process-wide request-rate cap ({@link RateLimiter}): `maxRps` is an upper bound; below it the
 *   cap adapts to the server (lowered after a 429 to 90 % of the rate achieved in the last second;
 *   paced by `RateLimit-Limit`/`-Remaining`/`-Reset` headers when served).
 * - Responses are validated with zod ({@link parsePage}); pages flow out as async generators.
 */
import { Pool } from 'undici';
import pRetry, { AbortError } from 'p-retry';
import type { Logger } from 'pino';
import { AuthError, HttpError, SchemaError } from '../errors.js';
import { systemClock, type Clock } from '../clock.js';
import { RateLimiter, parseRateLimitHeaders, type AdaptiveOptions } from './rate-limit.js';
import { fullJitterDelay, parseRetryAfter, type BackoffOptions } from './backoff.js';
import {
  ConversationsPageSchema,
  MessagesPageSchema,
  parsePage,
  type Conversation,
  type Message,
  type Page,
} from './schemas.js';

/** Records per page for every list request: the documented maximum (spec 4.1, 8). */
export const PER_PAGE = 100;

/** Options of {@link ApiClient}. */
export interface ApiClientOptions {
  /** The spec's `{base_url}` (may carry a path prefix); `/v1/...` is appended. */
  baseUrl: string;
  /** Sent as `X-Api-Key`; never logged, never put in an error. */
  apiKey: string;
  /** Sent as `X-Account-Id` when set (a UUID, spec 5). */
  accountId?: string | undefined;
  /**
   * Requests per second across this client, an upper bound; 0 = no configured cap (a cap learned
   * from 429s and `RateLimit-*` headers still applies). @defaultValue 10
   */
  maxRps?: number;
  /** How the cap adapts to the server (see {@link RateLimiter}). @defaultValue adaptive */
  rateLimit?: AdaptiveOptions;
  /** Keep-alive connections to the API. @defaultValue 8 */
  connections?: number;
  /** Per-attempt timeout in ms, from sending to the last body byte. @defaultValue 30000 */
  requestTimeoutMs?: number;
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

/** Per-caller request counters (e.g. one conversation's crawl), added to as requests are sent. */
export interface RequestTally {
  requests: number;
  retries: number;
  rateLimited: number;
}

/** A zeroed {@link RequestTally}. */
export const newTally = (): RequestTally => ({ requests: 0, retries: 0, rateLimited: 0 });

/** A response we fetched and parsed as JSON. */
interface JsonResponse {
  status: number;
  body: unknown;
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
  private readonly headers: Record<string, string>;
  private readonly limiter: RateLimiter;
  private readonly clock: Clock;
  private readonly timeoutMs: number;
  private readonly maxRetries: number;
  private readonly maxRetryAfterMs: number;

  constructor(private readonly opts: ApiClientOptions) {
    const url = new URL(opts.baseUrl);
    this.basePath = url.pathname.replace(/\/+$/, '');
    this.clock = opts.clock ?? systemClock;
    this.timeoutMs = opts.requestTimeoutMs ?? 30_000;
    this.maxRetries = opts.maxRetries ?? 6;
    this.maxRetryAfterMs = opts.maxRetryAfterMs ?? 120_000;
    this.limiter = new RateLimiter(opts.maxRps ?? 10, this.clock, opts.rateLimit);
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

  /** The request-rate cap in force (configured or learned), requests/s; 0 = none. */
  get rateCap(): number {
    return this.limiter.currentRps;
  }

  /**
   * Pages through `GET /v1/conversations` (spec 4.2; envelope assumed as in 4.1) from `startPage`
   * while `page < meta.total_pages`, re-reading `total_pages` on every page so a growing list keeps
   * paging. Stops early at an empty page.
   *
   * @throws {@link HttpError}, {@link AuthError}, {@link SchemaError}
   */
  async *conversations(startPage = 1, tally?: RequestTally): AsyncGenerator<Page<Conversation>> {
    for (let page = startPage; ; page++) {
      const path = `/v1/conversations?page=${page}&per_page=${PER_PAGE}`;
      const res = await this.getJson(path, {}, tally);
      const parsed = parsePage(ConversationsPageSchema, res.body, page, `conversation list page ${page}`, { path, page });
      yield parsed;
      if (parsed.data.length === 0 || page >= parsed.meta.total_pages) return;
    }
  }

  /**
   * Pages through `GET /v1/conversations/:id/messages` (spec 4.1) from `startPage`, with
   * `per_page=100`, while `page < meta.total_pages` (re-read on every page). Stops early at an
   * empty page. The caller checks drift (`meta.total_count` changes) and may stop iterating.
   *
   * @throws {@link HttpError} (404 when the conversation is gone), {@link AuthError}, {@link SchemaError}
   */
  async *messages(conversationId: string, startPage = 1, tally?: RequestTally): AsyncGenerator<Page<Message>> {
    const id = encodeURIComponent(conversationId);
    for (let page = startPage; ; page++) {
      const path = `/v1/conversations/${id}/messages?page=${page}&per_page=${PER_PAGE}`;
      const res = await this.getJson(path, { conversation_id: conversationId }, tally);
      const parsed = parsePage(MessagesPageSchema, res.body, page, `conversation ${conversationId} messages page ${page}`, {
        path,
        page,
        conversation_id: conversationId,
      });
      if (parsed.meta.current_page !== page) {
        throw new SchemaError(
          `conversation ${conversationId} messages page ${page}: meta.current_page is ${parsed.meta.current_page}, expected ${page} (spec 4.1 rule 2)`,
          { path, page, conversation_id: conversationId, field: 'meta.current_page' },
        );
      }
      yield parsed;
      if (parsed.data.length === 0 || page >= parsed.meta.total_pages) return;
    }
  }

  /**
   * GET `path` (relative to the base URL, starting `/v1/`) with retries; parses the JSON body.
   *
   * @throws {@link AuthError} on 401/403 (not retried), {@link HttpError} on other failures once
   *   retries are exhausted or for non-retryable statuses, {@link SchemaError} when a 2xx body is not JSON
   */
  async getJson(path: string, context: Record<string, unknown> = {}, tally?: RequestTally): Promise<JsonResponse> {
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
            return await this.attempt(path, attempts, context, tally);
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
            if (retriesLeft <= 0) return;
            const httpErr = error as HttpError;
            const retryAfter = httpErr.retryAfterMs;
            const delay =
              retryAfter !== undefined
                ? Math.min(retryAfter, this.maxRetryAfterMs)
                : fullJitterDelay(attempts, this.opts.backoff);
            if (httpErr.status === 429 || retryAfter !== undefined) this.limiter.pauseUntil(this.clock.now() + delay);
            if (httpErr.status === 429) this.opts.onRateLimited?.(delay);
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

  /** One attempt: rate cap, request, status mapping, JSON parse. */
  private async attempt(path: string, attempt: number, context: Record<string, unknown>, tally?: RequestTally): Promise<JsonResponse> {
    await this.limiter.acquire(this.opts.signal);
    const sentSeq = this.limiter.sentCount;
    this.stats.requests++;
    if (tally) tally.requests++;
    const details = { method: 'GET', path, attempts: attempt };
    let statusCode: number;
    let headers: Record<string, string | string[] | undefined>;
    let text: string;
    try {
      const signal = this.opts.signal
        ? AbortSignal.any([this.opts.signal, AbortSignal.timeout(this.timeoutMs)])
        : AbortSignal.timeout(this.timeoutMs);
      const res = await this.pool.request({ path: this.basePath + path, method: 'GET', headers: this.headers, signal });
      statusCode = res.statusCode;
      headers = res.headers;
      text = await res.body.text();
    } catch (err) {
      this.stats.networkErrors++;
      const e = err as Error & { code?: string };
      const what = this.opts.signal?.aborted
        ? 'aborted (shutting down)'
        : e.name === 'TimeoutError' || /timeout/i.test(e.code ?? '') ? `timed out after ${this.timeoutMs} ms` : `network error (${e.code ?? e.name}: ${e.message})`;
      throw new HttpError(`GET ${path}: ${what}`, details, { cause: err });
    }
    this.stats.byStatus[statusCode] = (this.stats.byStatus[statusCode] ?? 0) + 1;
    this.limiter.observe(statusCode, parseRateLimitHeaders(headers, this.clock.now()), sentSeq);
    if (statusCode === 429) this.limiter.onRateLimited(sentSeq);
    if (statusCode >= 200 && statusCode < 300) {
      try {
        return { status: statusCode, body: JSON.parse(text) };
      } catch (err) {
        throw new SchemaError(`GET ${path}: answered ${statusCode} with a body that is not JSON`, { ...context, path }, err);
      }
    }
    if (statusCode === 401 || statusCode === 403) throw new AuthError({ ...details, status: statusCode });
    if (statusCode === 429) {
      this.stats.rateLimited++;
      if (tally) tally.rateLimited++;
    }
    const retryAfterMs = parseRetryAfter(headers['retry-after'], this.clock.now());
    const reason =
      statusCode >= 300 && statusCode < 400
        ? `answered a ${statusCode} redirect, which is never followed (the API key must not leave the configured origin)`
        : `answered ${statusCode}`;
    throw new HttpError(`GET ${path}: ${reason}`, { ...details, status: statusCode, ...(retryAfterMs !== undefined ? { retryAfterMs } : {}) });
  }

  /** Closes the connection pool. */
  async close(): Promise<void> {
    await this.pool.close();
  }
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
}

/**
 * Builds the client from the frozen configuration: rate cap, timeouts and retries as configured,
 * two keep-alive connections per conversation in flight.
 *
 * @throws Error when `baseUrl` or `apiKey` is missing (config/ requires them for API commands)
 */
export function apiClientFromConfig(
  config: ApiConfig,
  extra: Pick<ApiClientOptions, 'logger' | 'signal' | 'onRateLimited' | 'clock'> = {},
): ApiClient {
  if (!config.baseUrl || !config.apiKey) throw new Error('apiClientFromConfig: baseUrl and apiKey are required');
  return new ApiClient({
    baseUrl: config.baseUrl,
    apiKey: config.apiKey,
    accountId: config.accountId,
    maxRps: config.maxRps,
    connections: Math.max(2, config.concurrency * 2),
    requestTimeoutMs: config.requestTimeoutMs,
    maxRetries: config.maxRetries,
    ...extra,
  });
}
