/**
 * The daemon's HTTP face (Fastify 5): `GET /healthz` (liveness), `GET /readyz` (readiness: every
 * injected check answers) and `GET /metrics` (Prometheus text exposition of {@link Metrics}).
 * It knows nothing of Redis, BullMQ or SQLite: the daemon (jobs/daemon.ts) injects the checks and
 * the metrics' sources, the webhook route's `enqueue` ({@link ServerDeps.webhooks}) and more routes
 * such as the queue dashboard ({@link ServerDeps.plugins}).
 *
 * Fastify's own per-request logging is off (probes and scrapes would flood the log, and nothing of
 * a request's headers is ever logged); its few lines (listening, errors) go through the pino logger
 * given.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyPluginAsync } from 'fastify';
import type { Logger } from 'pino';
import { settlesWithin } from '../clock.js';
import { Metrics, withTimeout } from './metrics.js';
import { webhookPlugin, type WebhookOptions } from './webhooks.js';

export { Metrics, withTimeout, type MetricsOptions, type DbPoolFigures, RUN_DURATION_BUCKETS, DEFAULT_COLLECT_TIMEOUT_MS } from './metrics.js';
export { resolvePointer, ReplayCache, webhookPlugin, WEBHOOK_BODY_LIMIT, DEFAULT_TIMESTAMP_TOLERANCE_MS, MAX_REMEMBERED_IDS, type RefusalClass, type WebhookAccepted, type WebhookOptions } from './webhooks.js';

/** Default of {@link ServerDeps.checkTimeoutMs}: 1000 ms. */
export const DEFAULT_CHECK_TIMEOUT_MS = 1000;

/** Longest reason a failed check reports in `/readyz`'s body, characters. */
const MAX_REASON_CHARS = 300;

/**
 * One readiness check of `/readyz`, e.g. `redis` (a PING) or `mirror` (a trivial read). It passes
 * by returning (or resolving); it fails by throwing (or rejecting), its message being the reason
 * shown, or by taking longer than {@link ServerDeps.checkTimeoutMs}.
 */
export interface ReadinessCheck {
  /** Short name shown in `/readyz`'s body, e.g. `redis`. */
  name: string;
  check: () => unknown;
}

/** What {@link buildServer} needs. */
export interface ServerDeps {
  /** The daemon's logger; the server logs through a child (`component: "http"`). */
  logger: Logger;
  /** Rendered by `GET /metrics`. */
  metrics: Metrics;
  /** The checks of `GET /readyz`, run in parallel at each request. */
  checks: readonly ReadinessCheck[];
  /** Longest wait for one check, ms; a slower check fails with a timeout. @defaultValue 1000 */
  checkTimeoutMs?: number;
  /**
   * More routes, each an encapsulated Fastify plugin registered after the built-in ones (e.g. the
   * queue dashboard of jobs/dashboard.ts), so this module needs to know nothing of what they serve.
   */
  plugins?: readonly FastifyPluginAsync[];
  /**
   * The webhook trigger `POST /webhooks/conversations` (src/server/webhooks.ts); without it the
   * route does not exist (404): never an unauthenticated trigger.
   */
  webhooks?: WebhookOptions | undefined;
}

/** Where {@link startServer} listens. */
export interface ListenOptions {
  /** Interface to bind, e.g. `127.0.0.1` (the default of `CONVO_MIRROR_HTTP_HOST`). */
  host: string;
  /** TCP port; 0 = a free port chosen by the OS (the caller decides what "off" means). */
  port: number;
}

/** A listening server, as {@link startServer} returns it. */
export interface RunningServer {
  app: FastifyInstance;
  /** The address bound (the actual port when 0 was asked). */
  host: string;
  port: number;
  /** `http://<host>:<port>` (IPv6 hosts in brackets). */
  url: string;
  /**
   * Stops listening; idle keep-alive connections are closed, requests in flight get `waitMs` (ms)
   * to finish, then their connections are cut. Idempotent (later calls share the first one's close).
   *
   * @param waitMs - @defaultValue no limit
   */
  close(waitMs?: number): Promise<void>;
}

/** `/readyz`'s body. */
export interface Readiness {
  status: 'ready' | 'unavailable';
  /** Every check by name: `ok`, or why it failed. */
  checks: Record<string, string>;
  /** The checks that failed, with their reasons (absent when ready). */
  failed?: { check: string; reason: string }[];
}

/**
 * Builds the app (not listening; `app.inject` works on it): `GET /healthz` answers 200
 * `{"status":"ok"}` while the process serves; `GET /readyz` 200 {@link Readiness} when every check
 * passes, else 503 naming each failed check and why; `GET /metrics` the Prometheus text.
 */
export function buildServer(deps: ServerDeps): FastifyInstance {
  const app = Fastify({
    loggerInstance: deps.logger.child({ component: 'http' }) as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    requestTimeout: 30_000,
    // Only the webhook route takes a body (its own limit, 1 MiB); refuse big ones early elsewhere.
    bodyLimit: 64 * 1024,
  });
  const timeoutMs = deps.checkTimeoutMs ?? DEFAULT_CHECK_TIMEOUT_MS;
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async (_req, reply) => {
    const r = await readiness(deps.checks, timeoutMs);
    if (r.status !== 'ready') deps.logger.warn({ failed: r.failed }, 'not ready');
    return reply.code(r.status === 'ready' ? 200 : 503).send(r);
  });
  app.get('/metrics', async (_req, reply) => {
    const text = await deps.metrics.render();
    return reply.type(deps.metrics.contentType).send(text);
  });
  if (deps.webhooks) void app.register(webhookPlugin(deps.webhooks, deps.logger.child({ component: 'webhooks' })));
  for (const plugin of deps.plugins ?? []) void app.register(plugin);
  return app;
}

/**
 * Runs every check in parallel, each bounded by `timeoutMs`.
 *
 * @returns `ready` when all pass (also with no checks), else `unavailable` with each failure's reason
 */
export async function readiness(checks: readonly ReadinessCheck[], timeoutMs: number = DEFAULT_CHECK_TIMEOUT_MS): Promise<Readiness> {
  const results = await Promise.all(
    checks.map(async (c) => {
      try {
        await withTimeout(Promise.resolve().then(c.check), timeoutMs, `${c.name} check`);
        return { check: c.name, reason: undefined };
      } catch (err) {
        return { check: c.name, reason: safeReason(err) };
      }
    }),
  );
  const failed = results.filter((r): r is { check: string; reason: string } => r.reason !== undefined);
  const out: Readiness = { status: failed.length === 0 ? 'ready' : 'unavailable', checks: Object.fromEntries(results.map((r) => [r.check, r.reason ?? 'ok'])) };
  if (failed.length > 0) out.failed = failed;
  return out;
}

/**
 * A failed check's reason, safe to show: its message, any `user:password@` of a URL in it masked,
 * cut to 300 characters.
 */
export function safeReason(err: unknown): string {
  const text = err instanceof Error ? err.message || err.name : String(err);
  const masked = text.replace(/\/\/[^\s/@]*@/g, '//***@');
  return masked.length > MAX_REASON_CHARS ? `${masked.slice(0, MAX_REASON_CHARS - 1)}…` : masked;
}

/**
 * Builds the app and listens on `listen`; logs one line `http server listening` with the URL.
 *
 * @throws the listen error, e.g. `EADDRINUSE` (the port is taken) or `EADDRNOTAVAIL` (no such
 *   interface); the app is closed first
 */
export async function startServer(deps: ServerDeps, listen: ListenOptions): Promise<RunningServer> {
  const app = buildServer(deps);
  try {
    await app.listen({ host: listen.host, port: listen.port, listenTextResolver: (address) => `http server listening on ${address}` });
  } catch (err) {
    await app.close().catch(() => undefined);
    throw err;
  }
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : listen.port;
  const host = typeof addr === 'object' && addr ? addr.address : listen.host;
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  let closing: Promise<void> | undefined;
  const close = async (waitMs: number | undefined): Promise<void> => {
    const closed = app.close();
    if (waitMs !== undefined && !(await settlesWithin(closed, waitMs))) app.server.closeAllConnections();
    await closed;
  };
  return { app, host, port, url, close: (waitMs) => (closing ??= close(waitMs)) };
}
