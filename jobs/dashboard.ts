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

/** Where the dashboard is served. */
export const DASHBOARD_PATH = '/admin/queues';
/** The one user of the dashboard's basic auth. */
export const DASHBOARD_USER = 'admin';

/** Options of {@link dashboardPlugin}. */
export interface DashboardOptions {
  /** The daemon's queue. */
  queue: Queue;
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
 * otherwise; user and password compared in constant time). Its hooks are encapsulated: routes
 * outside the plugin are untouched.
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
    const serverAdapter = new FastifyAdapter();
    serverAdapter.setBasePath(basePath);
    createBullBoard({
      queues: [new BullMQAdapter(o.queue, { readOnlyMode: true, displayName: `convo-mirror (${o.queue.qualifiedName})`, description: 'workspace runs and conversation jobs' })],
      serverAdapter,
      options: { uiConfig: { boardTitle: 'convo-mirror' } },
    });
    await app.register(serverAdapter.registerPlugin(), { prefix: basePath });
  };
}
