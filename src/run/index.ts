/**
 * One recorded run: start (a new `runs` row, or a run taken up again), sync (the workspace, named
 * conversations, or one conversation job), complete (publish the exports, record failures and
 * figures, build the summary). Every run is provable after the fact from `runs`/`run_failures`.
 *
 * - `start.ts`: {@link startRun}, {@link resumeRun}, {@link openRun}, {@link sweepInterruptedRuns}
 * - `sync.ts`: {@link syncRun} (CLI), {@link crawlConversation} (one conversation, for jobs)
 * - `work.ts`: what a run did ({@link RunWork}), from one sync or from a run's jobs
 * - `figures.ts`: pure figures from the work's request tallies; the `runs` columns
 * - `complete.ts`: {@link completeRun}, {@link interruptRun}
 * - `failures.ts`: `run_failures` records ({@link failureRecord})
 *
 * {@link runSync} is the whole use case in one process (the CLI's `sync`); the daemon's job
 * processors (jobs/) call the same steps, one job at a time.
 */
import { addTally } from '../api/client.js';
import type { SyncDeps } from '../sync/types.js';
import { completeRun } from './complete.js';
import { startRun } from './start.js';
import { syncRun } from './sync.js';
import type { RunOptions, RunSummary, RunTarget } from './types.js';
import { workOfSync } from './work.js';

export type { RunHandle, RunOptions, RunOutcome, RunSpec, RunSummary, RunTarget, RunWork } from './types.js';
export { openRun, resumeRun, runIsOpen, startRun, sweepInterruptedRuns, openMirrorForRuns, type EarlierRun, type RunDeps } from './start.js';
export { crawlConversation, syncRun, type CrawlOptions, type CrawlOutcome, type SyncOutcome } from './sync.js';
export { workOfCrawls, workOfSync, type CrawlRecord, type ListingFigures } from './work.js';
export { minimumRequests, runColumns, workFigures, type WorkFigures } from './figures.js';
export { completeRun, interruptRun } from './complete.js';
export { failureMessage, failureRecord, parseFailureMessage } from './failures.js';

/** The publish settings among run options. */
function targetOf(opts: RunOptions): RunTarget {
  return { exportDir: opts.exportDir, modes: opts.modes, gzip: opts.gzip, signingKey: opts.signingKey, witnessDir: opts.witnessDir, publishIntervalMs: opts.publishIntervalMs, publishLines: opts.publishLines, runsHeartbeatMs: opts.runsHeartbeatMs, retention: opts.retention };
}

/**
 * Runs one recorded sync and publishes its changes: starts the run (scope `conversations` when
 * `opts.conversationIds` names any, else `workspace`; refresh `full` with `opts.full`; trigger
 * `opts.trigger`, default `cli`), syncs, completes.
 *
 * @throws {@link RunError} (with the run's summary; its `cause` is the {@link AuthError},
 *   {@link ConfigError} or {@link ExportError} that stopped the run). The run is recorded as failed;
 *   whatever was committed before the error is still exported.
 */
export async function runSync(deps: SyncDeps, opts: RunOptions): Promise<RunSummary> {
  const named = opts.conversationIds && opts.conversationIds.length > 0 ? new Set(opts.conversationIds) : undefined;
  const run = await startRun(deps, {
    scope: named ? 'conversations' : 'workspace',
    refresh: opts.full ? 'full' : 'incremental',
    trigger: opts.trigger ?? 'cli',
    accountId: opts.accountId,
  });
  const { result, fatal, publishedDuringRun } = await syncRun(deps, run, opts);
  const work = result ? workOfSync(result, named?.size) : undefined;
  // A first request sent ahead and not used by the run (a crawl that started past page 1) is
  // still part of what the run asked.
  if (opts.prefetched && !opts.prefetched.release() && work) work.tally = addTally(work.tally, opts.prefetched.tally);
  return await completeRun(deps, {
    run,
    target: targetOf(opts),
    work,
    fatal,
    interrupted: opts.signal?.aborted === true,
    publishedDuringRun,
  });
}
