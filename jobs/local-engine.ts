/**
 * The daemon's local engine (`--scheduler local`): no Redis. node-cron fires each workspace's
 * schedules in this process, and an in-process queue (jobs/local-queue.ts) runs the jobs with the
 * same per-conversation deduplication as BullMQ's, through the same src/run steps: a workspace job
 * is one recorded run as the CLI's `sync` makes it (listing and crawls in this process), a
 * conversation job (a webhook's) is the same on-demand run as the BullMQ job's.
 *
 * What it gives up, by design: jobs live in memory. Jobs waiting at shutdown are dropped (the next
 * tick lists again; a webhook's sender retries what it was not answered, and what it was answered is
 * found by the next regular sync through the conversation's change signal); a run cut short resumes
 * from its checkpoints. The dead letter list is the failed runs in the mirror (`status`).
 */
import { describeError, RunError } from '../src/errors.js';
import { runSync, startRun, type RunSummary } from '../src/run/index.js';
import { jobFigures, type DaemonEngine, type DaemonWorkspace, type EngineContext } from './engine.js';
import { crawlOnDemand, firstContact, notFound, onDemandSpec, type NotFoundJobResult } from './conversation-job.js';
import { KeyedMutex, type RunJobDeps } from './deps.js';
import { LocalQueue, LocalScheduler, type LocalJob } from './local-queue.js';
import { conversationDedupId, schedulerId, type ConversationJobData, type WorkspaceJobData } from './queue.js';

/** A job of the local queue: a workspace sync, or one conversation's. */
type LocalJobData = ({ kind: 'workspace' } & WorkspaceJobData) | ({ kind: 'conversation' } & ConversationJobData);

/** Builds the local engine (nothing runs until `start()`). */
export function localEngine(ctx: EngineContext): DaemonEngine {
  const { config, logger } = ctx;
  const byAccount = new Map(ctx.workspaces.map((w) => [w.accountId.toLowerCase(), w]));
  // Runs overlap here (a webhook's and a scheduled one): one crawl of a conversation at a time.
  const locks = new KeyedMutex();
  const queue = new LocalQueue<LocalJobData>({
    concurrency: config.concurrency,
    attempts: config.jobAttempts,
    logger,
    logFields: (job, value) => ({ account_id: job.data.accountId, ...(job.data.kind === 'conversation' ? { conversation_id: job.data.conversationId } : { mode: job.data.mode }), ...jobFigures(value) }),
    process: (job, signal) => processLocalJob(ctx, byAccount, locks, job, signal),
  });
  const scheduler = new LocalScheduler({ tz: config.tz, logger });
  return {
    name: 'local',
    checks: [],
    plugins: [],
    jobCounts: async () => queue.counts(),
    async enqueueConversation(accountId, conversationId) {
      return queue.add('sync-conversation', { kind: 'conversation', accountId, conversationId, trigger: 'webhook' }, { dedupId: conversationDedupId(accountId, conversationId) });
    },
    async start() {
      for (const w of ctx.workspaces) {
        for (const mode of ['regular', 'full'] as const) {
          const id = schedulerId(mode, w.accountId);
          // A tick while the workspace's last one still waits adds nothing; while it runs, one follow-up.
          scheduler.add(
            id,
            mode === 'full' ? w.workspace.fullSchedule : w.workspace.schedule,
            () => void queue.add('sync-workspace', { kind: 'workspace', accountId: w.accountId, mode, trigger: 'schedule' }, { dedupId: id }),
            { setting: mode === 'full' ? 'CONVO_MIRROR_FULL_SCHEDULE' : 'CONVO_MIRROR_SCHEDULE' },
          );
        }
      }
    },
    describe: () => ({ queue: 'in-process' }),
    async stop(graceMs, abort, abortWaitMs) {
      scheduler.stop();
      // The queue aborts each running job's own signal at the grace period's end; abort() then
      // cuts the requests of the daemon's clients too.
      const closing = queue.close(graceMs, { abortWaitMs });
      const timer = setTimeout(abort, graceMs);
      try {
        return await closing;
      } finally {
        clearTimeout(timer);
      }
    },
    async close(waitMs) {
      scheduler.stop();
      await queue.close(0, { abortWaitMs: waitMs });
    },
  };
}

/**
 * Runs one local job within its workspace. A workspace job's run that ends partial completes the
 * job (its failures are in the run); a conversation that fails fails the job, and the error decides
 * whether it is retried (each attempt is a run of its own).
 *
 * @throws the run's error; an error whose `retryable` is false is not retried
 */
async function processLocalJob(
  ctx: EngineContext,
  byAccount: ReadonlyMap<string, DaemonWorkspace>,
  locks: KeyedMutex,
  job: LocalJob<LocalJobData>,
  signal: AbortSignal,
): Promise<RunSummary | NotFoundJobResult | undefined> {
  const w = byAccount.get((job.data.accountId ?? '').toLowerCase());
  if (!w) throw Object.assign(new Error(`job ${job.id} is for workspace ${job.data.accountId}, which this daemon does not mirror`), { retryable: false });
  const deps: RunJobDeps = {
    api: w.api,
    mirror: ctx.mirror,
    logger: w.logger.child({ job: job.id }),
    clock: ctx.clock,
    crawlLock: (key, task) => locks.run(key, task),
    accountId: w.accountId,
    target: ctx.target,
    signal,
    changeFieldSetting: ctx.config.changeField,
    onFatal: ctx.onFatal,
    onRunFinished: ctx.onRunFinished,
    onNotFound: ctx.onNotFound,
  };
  try {
    return job.data.kind === 'workspace' ? await workspaceRun(ctx, deps, job.data, signal) : await conversationRun(deps, job.data);
  } catch (err) {
    const cause = err instanceof RunError ? err.cause : err;
    if (cause instanceof Error) ctx.onFatal(cause);
    throw err;
  }
}

/** A workspace job: one recorded run, as `sync` makes it, reported to the metrics. */
async function workspaceRun(ctx: EngineContext, d: RunJobDeps, data: WorkspaceJobData, signal: AbortSignal): Promise<RunSummary> {
  try {
    const summary = await runSync(d, {
      accountId: d.accountId,
      concurrency: ctx.config.concurrency,
      full: data.mode === 'full',
      trigger: data.trigger ?? 'schedule',
      changeFieldSetting: ctx.config.changeField,
      ...ctx.target,
      signal,
    });
    d.onRunFinished?.(summary, d.accountId);
    return summary;
  } catch (err) {
    if (err instanceof RunError && err.summary) d.onRunFinished?.(err.summary as RunSummary, d.accountId);
    d.logger.warn({ err: describeError(err) }, 'workspace run failed');
    throw err;
  }
}

/** A conversation job: its own on-demand run (trigger `webhook`); a failed crawl fails the job. */
async function conversationRun(d: RunJobDeps, data: ConversationJobData): Promise<RunSummary | NotFoundJobResult | undefined> {
  // As the BullMQ job: a conversation that does not exist leaves no run behind.
  const ahead = await firstContact(d, data.conversationId);
  if (ahead?.outcome === 'not-found') return notFound(d, data.conversationId, ahead);
  let outcome: Awaited<ReturnType<typeof crawlOnDemand>>;
  try {
    const run = await startRun(d, onDemandSpec(d.accountId, data));
    outcome = await crawlOnDemand(d, run, data.conversationId, { full: data.full, prefetched: ahead });
  } finally {
    ahead?.release(); // whatever failed before the crawl took it: never served to a later request
  }
  const { crawl, summary } = outcome;
  if (crawl.kind === 'failed') throw crawl.failure.error;
  return summary;
}
