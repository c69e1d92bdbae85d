/**
 * `sync-workspace` jobs, in steps (BullMQ's step-job pattern): `list` pages the conversation list
 * and adds one child `sync-conversation` job per conversation; `crawl` waits for the children;
 * `finish` gathers the children's results and failures and completes the run. Each step is
 * idempotent, so a retried job continues where it was.
 */
import { Job, WaitingChildrenError } from 'bullmq';
import { newTally } from '../src/api/client.js';
import { DriftError } from '../src/errors.js';
import {
  failureRecord,
  openRun,
  parseFailureMessage,
  resumeRun,
  workOfCrawls,
  type CrawlRecord,
  type ListingFigures,
  type EarlierRun,
  type RunSpec,
  type RunSummary,
} from '../src/run/index.js';
import type { RunFailureRecord } from '../src/store/mirror.js';
import { LIST_FAILURE_ID, listWorkspace, type ListingResult } from '../src/sync/workspace.js';
import { completeJobRun, requeueAfterShutdown, runTarget, type JobDeps } from './deps.js';
import { CONVERSATION_JOB, jobOptions, type ConversationJobData, type ConversationJobResult, type WorkspaceJobData } from './queue.js';

/** Child job id of a conversation in a workspace run: deterministic, so a retried step adds nothing twice. */
export const childJobId = (runId: number, conversationId: string) => `run-${runId}-c-${conversationId}`;

/**
 * `sync-workspace`: runs the job's steps from the one its data names.
 *
 * @returns the run's summary (from `finish`)
 * @throws `WaitingChildrenError` while children run; `DelayedError` after a shutdown; the listing's
 *   error (processJob lets it decide retry), or a `RunError` once the run is recorded as failed
 */
export async function processWorkspaceJob(d: JobDeps, job: Job<WorkspaceJobData>, token: string | undefined): Promise<RunSummary> {
  const deps = { ...d, logger: d.logger.child({ job: job.id, mode: job.data.mode }) };
  for (;;) {
    const step = job.data.step ?? 'list';
    if (step === 'list') await listStep(deps, job, token);
    else if (step === 'crawl') await crawlStep(job, token);
    else return finishStep(deps, job);
  }
}

/** The run a workspace job records: scope `workspace`, its refresh, and who asked. */
function workspaceSpec(d: JobDeps, job: Job<WorkspaceJobData>): RunSpec {
  return {
    scope: 'workspace',
    refresh: job.data.mode === 'full' ? 'full' : 'incremental',
    // Jobs made by a job scheduler carry its key; the rest were enqueued.
    trigger: job.data.trigger ?? (job.repeatJobKey ? 'schedule' : 'on-demand'),
    accountId: d.accountId,
  };
}

/** The run recorded earlier by this job (by its `list` step), if any. */
function earlierRun(job: Job<WorkspaceJobData>): EarlierRun | undefined {
  return job.data.runId !== undefined ? { runId: job.data.runId, startedMs: job.data.startedMs } : undefined;
}

/**
 * `list`: starts (or takes up) the run, pages the conversation list, and adds one child job per
 * conversation listed or to re-check. A listing that fails is never fanned out: a transient
 * failure retries the step within the same run; one that will not be retried records the run as
 * failed.
 */
async function listStep(d: JobDeps, job: Job<WorkspaceJobData>, token: string | undefined): Promise<void> {
  // A list step cut short by a crash lists again within the same run (reopened).
  const run = await openRun(d, workspaceSpec(d, job), earlierRun(job));
  if (job.data.runId !== run.runId) await job.updateData({ ...job.data, runId: run.runId, startedMs: run.startedMs, step: 'list' });
  let listing: ListingResult;
  const tally = newTally();
  try {
    listing = await listWorkspace(
      d,
      { accountId: d.accountId, runId: run.runId, signal: d.signal, changeFieldSetting: d.changeFieldSetting, confirmListing: job.data.mode === 'full' },
      { tally },
    );
  } catch (err) {
    // Auth, config or an unusable mirror: record the run as failed, with the requests the listing
    // made (completeRun throws a RunError carrying it); the error decides that it is never retried.
    const asked = { passes: 0, confirmed: false, listed: 0, inserted: 0, updated: 0, tally };
    await completeJobRun(d, { run, target: runTarget(d), work: workOfCrawls(asked, []), fatal: err });
    throw err;
  }
  if (d.signal?.aborted) return requeueAfterShutdown(job, token); // list again after the restart, same run
  if (listing.failure && !(listing.failure instanceof DriftError)) {
    const f = listing.failure as Error & { retryable?: boolean };
    const lastAttempt = job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
    if (f.retryable === true && !lastAttempt) throw f;
    await completeJobRun(d, { run, target: runTarget(d), work: workOfCrawls(listingFigures(listing), []), fatal: f }); // throws the RunError
  }
  const children = await addChildren(d, job, run.runId, listing);
  await job.updateData({ ...job.data, step: 'crawl', listing: listingFigures(listing) });
  d.logger.info({ run: run.runId, conversations: children, passes: listing.passes }, 'workspace listed; conversation jobs added');
}

/** The listing's figures, as the job keeps them for `finish`. */
function listingFigures(l: ListingResult): ListingFigures {
  return {
    passes: l.passes,
    confirmed: l.confirmed,
    listed: l.seen.length,
    inserted: l.inserted,
    updated: l.updated,
    tally: l.tally,
    ...(l.failure ? { failure: failureRecord({ id: LIST_FAILURE_ID, error: l.failure }) } : {}),
  };
}

/** BullMQ's lowest priority (highest number). */
const MAX_PRIORITY = 2_097_151;

/**
 * The priority of a run's `i`-th child (0-based): `i + 1`, at most {@link MAX_PRIORITY}. BullMQ takes
 * the lowest number first and, within one number, the oldest: so the children of the workspace runs
 * queued at once are taken in turns (the first of each, then the second of each...), not one run's
 * after the other's, and the workspaces' keys, each paced by its own limit, are used at once. Jobs
 * with no priority (on-demand conversations, webhooks, the workspace jobs' steps) go before them all.
 */
export function childPriority(i: number): number {
  return Math.min(i + 1, MAX_PRIORITY);
}

/** The children added by the first `addBulk` of a run: few, so the first crawls start while the rest are added. */
const FIRST_CHILDREN = 25;
/** The children added by each later `addBulk`. */
const CHILDREN_PER_ADD = 500;

/**
 * Adds one child job per conversation (deterministic ids: adding twice adds nothing, so a list step
 * cut short while adding them adds the rest when it runs again). They are added in order of
 * priority, a few first and then in larger groups, so the first crawls start while the rest are
 * added. @returns how many
 */
async function addChildren(d: JobDeps, job: Job<WorkspaceJobData>, runId: number, listing: ListingResult): Promise<number> {
  const recheck = new Set(listing.recheck);
  // An early-stopped listing's `retry`: not listed, but their last crawl failed (asked again, no 404 tombstone).
  const ids = [...new Set([...listing.seen, ...listing.recheck, ...(listing.retry ?? [])])];
  const opts = jobOptions(d.policy);
  const full = job.data.mode === 'full';
  const child = (conversationId: string, i: number) =>
    ({
      name: CONVERSATION_JOB,
      data: {
        accountId: d.accountId,
        conversationId,
        runId,
        ...(full ? { full: true } : {}),
        // Re-checks (gone from the complete listing) always ask the API (no change-signal skip),
        // and for them alone a 404 means a deletion.
        ...(listing.changeField && !recheck.has(conversationId) ? { changeField: listing.changeField } : {}),
        ...(recheck.has(conversationId) ? { unlisted: true } : {}),
      } satisfies ConversationJobData,
      opts: {
        ...opts,
        jobId: childJobId(runId, conversationId),
        parent: { id: job.id!, queue: job.queueQualifiedName },
        ignoreDependencyOnFailure: true,
        priority: childPriority(i),
      },
    }) as const;
  for (let from = 0; from < ids.length; ) {
    const to = from === 0 ? Math.min(ids.length, FIRST_CHILDREN) : Math.min(ids.length, from + CHILDREN_PER_ADD);
    await d.queue.addBulk(ids.slice(from, to).map((id, k) => child(id, from + k)));
    from = to;
  }
  return ids.length;
}

/** `crawl`: waits for the children (the job moves to waiting-children until they have all ended). */
async function crawlStep(job: Job<WorkspaceJobData>, token: string | undefined): Promise<void> {
  if (await job.moveToWaitingChildren(token ?? '')) throw new WaitingChildrenError();
  await job.updateData({ ...job.data, step: 'finish' });
}

/** `finish`: gathers every child's outcome and what it cost, and completes the run. */
async function finishStep(d: JobDeps, job: Job<WorkspaceJobData>): Promise<RunSummary> {
  const data = job.data;
  // Finishing a run a crash left interrupted reopens it; a finish step retried after recording
  // the run records it again.
  const run = (await resumeRun(d, workspaceSpec(d, job), earlierRun(job)!, { evenIfEnded: true }))!;
  const crawls = [...(await succeededChildren(job)), ...(await failedChildren(d, job))];
  const l = data.listing;
  const listing: ListingFigures | undefined = l && {
    ...l,
    failure: typeof l.failure === 'string' ? parseFailureMessage(LIST_FAILURE_ID, l.failure) : l.failure,
  };
  return completeJobRun(d, { run, target: runTarget(d), work: workOfCrawls(listing, crawls) });
}

/** The children that completed: each one's result, and what all its attempts cost. */
async function succeededChildren(job: Job<WorkspaceJobData>): Promise<CrawlRecord[]> {
  const values = await job.getChildrenValues<ConversationJobResult>();
  return Object.values(values).map((v) => ({ result: v.result, tally: v.tally ?? v.result.tally }));
}

/**
 * The children that failed for good: the failure record and tally each wrote into its data before
 * failing; for a child failed by an older version, its `[CODE] message` failure reason.
 */
async function failedChildren(d: JobDeps, job: Job<WorkspaceJobData>): Promise<CrawlRecord[]> {
  const failed = await job.getIgnoredChildrenFailures();
  const out: CrawlRecord[] = [];
  for (const [key, reason] of Object.entries(failed)) {
    // Keys are `<prefix>:<queue>:<job id>`; the children are in this job's queue.
    const own = `${job.queueQualifiedName}:`;
    const childId = key.startsWith(own) ? key.slice(own.length) : key.slice(key.lastIndexOf(':') + 1);
    const child = (await Job.fromId<ConversationJobData>(d.queue, childId)) ?? undefined;
    const id = child?.data.conversationId ?? childId.replace(/^run-\d+-c-/, '');
    const failure: RunFailureRecord = child?.data.failure ?? parseFailureMessage(id, reason);
    out.push({ failure: { ...failure, id }, tally: child?.data.tally ?? newTally() });
  }
  return out;
}
