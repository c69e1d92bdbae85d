/**
 * `sync-conversation` jobs: a child of a workspace run crawls within that run; an on-demand job is a
 * recorded run of its own (start or take up, crawl, complete), through the same src/run steps as
 * the CLI's `sync`.
 */
import type { Job } from 'bullmq';
import { addTally, newTally, type Prefetch, type RequestTally } from '../src/api/client.js';
import {
  crawlConversation,
  failureRecord,
  interruptRun,
  resumeRun,
  runIsOpen,
  startRun,
  workOfCrawls,
  type CrawlOutcome,
  type RunHandle,
  type RunSpec,
  type RunSummary,
} from '../src/run/index.js';
import { completeJobRun, requeueAfterShutdown, runTarget, type JobDeps, type RunJobDeps } from './deps.js';
import type { ConversationJobData, ConversationJobResult } from './queue.js';

/**
 * `sync-conversation`. A child of a workspace run crawls within it, also when a crashed daemon left
 * the run interrupted (the run is reopened: its parent job is still waiting for its children). Only
 * a child whose run has properly ended (e.g. re-queued by `retry-failed`) would change the mirror
 * with nobody to publish or record it: it runs as an on-demand job instead.
 *
 * @throws the crawl's error (processJob lets it decide retry), after writing the failure record
 *   and tally into the job's data; `DelayedError` when shutdown cut the crawl short
 */
export async function processConversationJob(d: JobDeps, job: Job<ConversationJobData>, token?: string): Promise<ConversationJobResult | NotFoundJobResult> {
  const { conversationId, runId } = job.data;
  const deps = { ...d, logger: d.logger.child({ job: job.id, conversation_id: conversationId }) };
  return d.locks.run(`${d.accountId}/${conversationId}`, async () =>
    runId !== undefined && (await runIsOpen(d.mirror, runId)) ? crawlAsChild(deps, job, runId, token) : runOnDemand(deps, job, token),
  );
}

/** A child of workspace run `runId`: crawls within it; the run's `finish` step records the outcome. */
async function crawlAsChild(d: JobDeps, job: Job<ConversationJobData>, runId: number, token: string | undefined): Promise<ConversationJobResult> {
  const { conversationId, full, changeField, unlisted } = job.data;
  const crawl = await crawlConversation(d, { runId, accountId: d.accountId }, conversationId, { full, changeField, unlisted, signal: d.signal });
  return settle(job, token, crawl);
}

/**
 * An on-demand job: its own recorded run (scope `conversations`, trigger `on-demand` or `webhook`),
 * kept across attempts and across a daemon crash, so a retried or stalled full job resumes its own
 * checkpoint.
 */
async function runOnDemand(d: JobDeps, job: Job<ConversationJobData>, token: string | undefined): Promise<ConversationJobResult | NotFoundJobResult> {
  const { conversationId, full } = job.data;
  const spec = onDemandSpec(d.accountId, job.data);
  const earlier = job.data.ownRunId;
  // A conversation the mirror never had is asked about before any run exists: one that does not
  // exist either (a webhook's typo, an attacker's id) completes the job and leaves nothing behind.
  const ahead = earlier === undefined ? await firstContact(d, conversationId) : undefined;
  if (ahead?.outcome === 'not-found') return notFound(d, conversationId, ahead);
  try {
    // An attempt after a crash reopens the interrupted run; one after a failed attempt continues it.
    const run: RunHandle = (earlier !== undefined ? await resumeRun(d, spec, { runId: earlier }, { evenIfEnded: true }) : undefined) ?? (await startRun(d, spec));
    if (run.runId !== earlier) {
      // A run of its own from here on: what the job did for another run (as a child of a run that
      // has ended, re-queued by retry-failed) is not this run's.
      const { tally: _tally, failure: _failure, ...rest } = job.data;
      await job.updateData({ ...rest, ownRunId: run.runId });
    }
    const { crawl, summary } = await crawlOnDemand(d, run, conversationId, { full, spent: job.data.tally, prefetched: ahead });
    return await settle(job, token, crawl, summary);
  } finally {
    ahead?.release(); // whatever failed before the crawl took it: never served to a later request
  }
}

/** What an on-demand job returns for a conversation that does not exist: no run was recorded. */
export interface NotFoundJobResult {
  outcome: 'not_found';
  conversationId: string;
  /** What asking cost (the one request, with its retries). */
  tally: RequestTally;
}

/**
 * First contact for an on-demand job: page 1 of the messages of a conversation the mirror never
 * had (live or tombstoned), sent ahead of the run and kept for its crawl, which starts there; for
 * a conversation the mirror has, nothing (its crawl asks, and a 404 is weighed as today).
 *
 * @throws the {@link AuthError} of a refused key (the job fails as a crawl's would)
 */
export async function firstContact(d: RunJobDeps, conversationId: string): Promise<Prefetch | undefined> {
  return (await d.mirror.hasConversation(d.accountId, conversationId)) ? undefined : d.api.prefetch(conversationId);
}

/**
 * Ends an on-demand job whose conversation the API answers 404 and the mirror never had: one log
 * line, {@link RunJobDeps.onNotFound}, no run, no change, no ledger record.
 */
export function notFound(d: RunJobDeps, conversationId: string, ahead: Prefetch): NotFoundJobResult {
  ahead.release();
  d.logger.info({ conversation_id: conversationId, outcome: 'not_found' }, 'conversation not found: the API answers 404 and the mirror never had it; no run recorded');
  try {
    d.onNotFound?.(d.accountId);
  } catch {
    /* an observer never fails a job */
  }
  return { outcome: 'not_found', conversationId, tally: ahead.tally };
}

/** The run an on-demand conversation job records. */
export function onDemandSpec(accountId: string, data: Pick<ConversationJobData, 'full' | 'trigger'>): RunSpec {
  return { scope: 'conversations', refresh: data.full ? 'full' : 'incremental', trigger: data.trigger ?? 'on-demand', accountId };
}

/**
 * Crawls one named conversation within its own run `run` and completes the run (unless a shutdown
 * stopped the crawl: then the run is marked interrupted and left for the job to resume). Shared by
 * the BullMQ job and the local scheduler's.
 *
 * @param o.spent - what earlier attempts of the job cost (added to this one's in the run's figures)
 * @returns the crawl's outcome and the run's summary (undefined when stopped)
 * @throws the {@link RunError} of a run a fatal error stopped (after recording it)
 */
export async function crawlOnDemand(
  d: RunJobDeps,
  run: RunHandle,
  conversationId: string,
  o: { full?: boolean | undefined; spent?: RequestTally | undefined; prefetched?: Prefetch | undefined },
): Promise<{ crawl: CrawlOutcome; summary: RunSummary | undefined }> {
  const crawl = await crawlConversation(d, run, conversationId, { full: o.full, named: true, signal: d.signal });
  // A first request sent ahead that the crawl did not use is still part of what the run asked.
  const unused = o.prefetched && !o.prefetched.release() ? o.prefetched.tally : newTally();
  crawl.tally = addTally(crawl.tally, unused);
  if (crawl.kind === 'stopped') {
    await interruptRun(d, run, 'daemon shutting down; the job resumes from its checkpoint');
    return { crawl, summary: undefined };
  }
  const fatal = crawl.kind === 'failed' && crawl.fatal ? crawl.failure.error : undefined;
  const tally = addTally(o.spent ?? newTally(), crawl.tally);
  const summary = await completeJobRun(d, {
    run,
    target: runTarget(d),
    // A fatal error fails the run itself (no failure row): nothing more could be attempted.
    work: workOfCrawls(undefined, fatal ? [] : [crawl.kind === 'synced' ? { result: crawl.result, tally } : { failure: failureRecord(crawl.failure), tally }]),
    fatal,
    interrupted: d.signal?.aborted === true,
  });
  return { crawl, summary };
}

/** What the job's attempts cost: the earlier attempts' (kept in its data) and this one's. */
function spentSoFar(job: Job<ConversationJobData>, crawl: CrawlOutcome): RequestTally {
  return addTally(job.data.tally ?? newTally(), crawl.tally);
}

/**
 * Ends the job as its crawl ended: returns the result with every attempt's tally; puts the job back
 * after a shutdown; or keeps the failure record and the tally in the job's data and throws the error.
 */
async function settle(job: Job<ConversationJobData>, token: string | undefined, crawl: CrawlOutcome, summary?: ConversationJobResult['summary']): Promise<ConversationJobResult> {
  const tally = spentSoFar(job, crawl);
  if (crawl.kind === 'stopped') return requeueAfterShutdown(job, token, tally);
  if (crawl.kind === 'synced') return { result: crawl.result, tally, ...(summary ? { summary } : {}) };
  await job.updateData({ ...job.data, tally, failure: failureRecord(crawl.failure) });
  throw crawl.failure.error;
}
