/**
 * The queue dashboard of the daemon's HTTP server (BullMQ mode, `CONVO_MIRROR_ADMIN_PASSWORD`):
 * bull-board under `/admin/queues`, behind HTTP basic auth (user `admin`).
 *
 * What it shows: the `sync` queue with its job counts by state (active, waiting, waiting-children,
 * prioritized, delayed, paused, completed, failed); each state's jobs with their name
 * (`sync-workspace`, `sync-conversation`), id, timestamps (added, processed, finished), attempts,
 * data (account id, conversation id, mode, trigger, the step and run id of a workspace job, the
 * tally and failure record a conversation job wrote), return value (a run's summary or a crawl's
 * result) and failure reason with its stack; the parent/children flow of a workspace run; the job
 * schedulers with their crons and next run; Redis memory and version.
 *
 * It is read-only (bull-board's `readOnlyMode`, which also turns retries off): a workspace run is
 * a step job waiting for its children, and removing, promoting, emptying or editing jobs or
 * schedulers by hand can cut a run short or leave it waiting forever. Re-queue failed jobs with
 * `convo-mirror retry-failed`, which keeps each job's run.
 *
 * While Redis is away it answers at once with 503 and the reason (the page and its API; its static
 * assets still load), and an API request whose Redis does not answer within 4 s gets 503 too: never
 * a request held until Redis returns.
 */
import crypto from 'node:crypto';
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import type { Queue } from 'bullmq';
import type { Logger } from 'pino';
import basicAuth from '@fastify/basic-auth';
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { FastifyAdapter } from '@bull-board/fastify';
import { DEFAULT_LOG_WINDOW_MS, LogThrottle, type LogThrottleOptions } from '../src/log-throttle.js';
import { escapeForTerminal } from '../src/terminal.js';
import type { AppControllerRoute, ControllerHandlerReturnType } from '@bull-board/api/typings/app';
import type { RedisLink } from './redis-link.js';

/** Where the dashboard is served. */
export const DASHBOARD_PATH = '/admin/queues';
/** The one user of the dashboard's basic auth. */
export const DASHBOARD_USER = 'admin';
/** Default of {@link DashboardOptions.answerWithinMs}: 4000 ms. */
export const DASHBOARD_ANSWER_WITHIN_MS = 4000;

/** Options of {@link dashboardPlugin}. */
export interface DashboardOptions {
  /** The daemon's queue. */
  queue: Queue;
  /** The state of the queue's connection: while it is not ready, every route but the assets answers 503. */
  link: Pick<RedisLink, 'problem' | 'where'>;
  /** Longest wait for an API request's Redis commands, ms; past it the answer is 503. @defaultValue 4000 */
  answerWithinMs?: number;
  /** Basic-auth password of user `admin` (`CONVO_MIRROR_ADMIN_PASSWORD`). Never logged. */
  password: string;
  logger: Logger;
  /** @defaultValue `/admin/queues` */
  basePath?: string;
  /** Clock of the failed-login log throttle, epoch ms. @defaultValue Date.now */
  now?: () => number;
  /** Timer of the failed-login log throttle (src/log-throttle.ts). @defaultValue an unref'd `setTimeout` */
  setTimer?: LogThrottleOptions['setTimer'];
}

/** SHA-256 of a string: equal-length buffers for a constant-time comparison. */
const digest = (s: string) => crypto.createHash('sha256').update(s, 'utf8').digest();

/**
 * A Fastify plugin (for `ServerDeps.plugins`) serving bull-board's page, assets and JSON API under
 * `basePath`, every route behind basic auth (401 with `WWW-Authenticate: Basic realm="convo-mirror"`
 * otherwise; user and password compared in constant time). While `link` is not ready, the page and
 * the API answer 503 `{"error":"the queue dashboard needs Redis: Redis at <host:port> is not
 * connected (<state>: <last error>)"}` at once; an API request not answered within
 * `answerWithinMs` gets 503 `{"error":"the queue dashboard needs Redis: Redis at <host:port> did
 * not answer within 4 s"}`. Its hooks are encapsulated: routes outside the plugin are untouched.
 */
export function dashboardPlugin(o: DashboardOptions): FastifyPluginAsync {
  const basePath = o.basePath ?? DASHBOARD_PATH;
  const wantUser = digest(DASHBOARD_USER);
  const wantPassword = digest(o.password);
  const log = o.logger.child({ component: 'dashboard' });
  // Failed logins are logged at most once per 10 s, with the count of those left out (src/log-throttle.ts).
  const refusals = new LogThrottle<'bad_credentials'>({
    ...(o.now ? { now: o.now } : {}),
    ...(o.setTimer ? { setTimer: o.setTimer } : {}),
    onSuppressed: (refusal, suppressed) => log.warn({ refusal, suppressed, window_ms: DEFAULT_LOG_WINDOW_MS }, 'dashboard: refused credentials suppressed'),
  });
  return async (app) => {
    app.addHook('onClose', async () => refusals.flush());
    await app.register(basicAuth, {
      authenticate: { realm: 'convo-mirror' },
      validate: async (user: string, password: string, req: FastifyRequest, _reply: FastifyReply) => {
        // Both compared, always: no early exit tells which one was wrong.
        const userOk = crypto.timingSafeEqual(digest(user), wantUser);
        const passwordOk = crypto.timingSafeEqual(digest(password), wantPassword);
        if (!(userOk && passwordOk)) {
          const admitted = refusals.admit('bad_credentials');
          if (admitted) log.warn({ refusal: 'bad_credentials', path: escapeForTerminal(req.url.split('?')[0]!), remote: req.ip, ...(admitted.suppressed ? { suppressed: admitted.suppressed } : {}) }, 'dashboard: refused credentials');
          throw new Error('invalid credentials');
        }
      },
    });
    app.addHook('onRequest', app.basicAuth);
    const assets = `${basePath}/static/`;
    app.addHook('onRequest', async (req, reply) => {
      const problem = o.link.problem();
      if (problem === undefined || req.url.startsWith(assets)) return;
      return reply.code(503).send({ error: `the queue dashboard needs Redis: ${problem}` });
    });
    const serverAdapter = new BoundedAdapter(o.answerWithinMs ?? DASHBOARD_ANSWER_WITHIN_MS, o.link.where);
    serverAdapter.setBasePath(basePath);
    const adapter = new BullMQAdapter(o.queue, { readOnlyMode: true, displayName: `convo-mirror (${o.queue.qualifiedName})`, description: 'workspace runs and conversation jobs' });
    // An erase job holds its subject (personal data) while it waits: the dashboard never shows it.
    adapter.setFormatter('data', hideErasureSubject);
    createBullBoard({
      queues: [adapter],
      serverAdapter,
      options: { uiConfig: { boardTitle: 'convo-mirror' } },
    });
    await app.register(serverAdapter.registerPlugin(), { prefix: basePath });
  };
}

/** Job data as the dashboard shows it: an erase job's `subject` (a sender or conversation id) replaced by a placeholder. */
export function hideErasureSubject(data: unknown): unknown {
  if (typeof data !== 'object' || data === null || !('subject' in data)) return data;
  return { ...data, subject: '(hidden: the erasure subject is personal data)' };
}

/**
 * bull-board's Fastify adapter with each JSON API handler bounded: one whose Redis commands are not
 * answered within `answerWithinMs` answers 503 (its commands are abandoned, not waited for).
 */
class BoundedAdapter extends FastifyAdapter {
  constructor(
    private readonly answerWithinMs: number,
    private readonly where: string,
  ) {
    super();
  }

  override setApiRoutes(routes: AppControllerRoute[]): FastifyAdapter {
    return super.setApiRoutes(routes.map((route) => ({ ...route, handler: (req) => this.bounded(Promise.resolve(route.handler(req))) }) as AppControllerRoute));
  }

  private async bounded<T extends ControllerHandlerReturnType>(work: Promise<T>): Promise<T | ControllerHandlerReturnType> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<ControllerHandlerReturnType>((resolve) => {
      timer = setTimeout(
        // bull-board's type lists the statuses its own handlers answer; its Fastify adapter sends any.
        () => resolve({ status: 503 as ControllerHandlerReturnType['status'], body: { error: `the queue dashboard needs Redis: Redis at ${this.where} did not answer within ${this.answerWithinMs / 1000} s` } }),
        this.answerWithinMs,
      );
    });
    try {
      return await Promise.race([work, late]);
    } finally {
      clearTimeout(timer);
    }
  }
}
