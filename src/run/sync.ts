/**
 * The sync step of a recorded run: the whole workspace or named conversations in this process
 * ({@link syncRun}, the CLI), or one conversation ({@link crawlConversation}, a job of the daemon,
 * alone or inside a workspace run).
 */
import { newTally, type RequestTally } from '../api/client.js';
import { syncConversation, type ConversationResult } from '../sync/conversation.js';
import type { SyncDeps } from '../sync/types.js';
import { Publisher } from '../export/publisher.js';
import { isFatal, syncConversations, syncWorkspace, type ConversationFailure, type WorkspaceResult } from '../sync/workspace.js';
import type { RunHandle, RunOptions } from './types.js';

/** What {@link syncRun} did: the sync's result (absent when it threw) and the error that stopped it. */
export interface SyncOutcome {
  result?: WorkspaceResult;
  /** What was published during the run, before its end (`publishIntervalMs`, `publishLines`). */
  publishedDuringRun?: { files: number; lines: number };
  /** An {@link AuthError}, {@link ConfigError}, {@link MirrorUnusableError}, runaway list, or an unexpected error. */
  fatal?: unknown;
}

/**
 * Syncs what the run covers (`run.scope`): every conversation of the workspace, or
 * `opts.conversationIds`. An incremental run resumes recent checkpoints, uses the change signal
 * (`changeFieldSetting`, default `auto`) and settles for one consistent listing pass; a full one
 * re-reads every page, resumes no checkpoint and confirms the listing with a second pass. With
 * `opts.publishIntervalMs`, what is committed is published every that many ms during the run.
 *
 * @returns the result and the error that stopped the run early, if any (never throws)
 */
export async function syncRun(deps: SyncDeps, run: RunHandle, opts: RunOptions): Promise<SyncOutcome> {
  const full = run.refresh === 'full';
  const logger = deps.logger.child({ run: run.runId });
  const wsOpts = {
    ...opts,
    runId: run.runId,
    logger,
    resume: opts.resume ?? !full,
    incremental: opts.incremental ?? !full,
    // A full refresh never skips, but still records each conversation's signal as the baseline the
    // next incremental sync compares with.
    changeFieldSetting: opts.changeFieldSetting ?? 'auto',
    // A full refresh confirms the listing with a second pass; an incremental one settles for one
    // consistent pass (a conversation list drift hid is new, and the next sync finds it).
    confirmListing: opts.confirmListing ?? full,
  };
  // Publish what is committed every publishIntervalMs, or once publishLines changes wait, so a long
  // run reaches the exports progressively, in bounded batches.
  const progressive = opts.publishIntervalMs !== undefined || (opts.publishLines ?? 0) > 0;
  const publisher = progressive ? new Publisher(deps.mirror, opts, { clock: deps.clock, logger, runId: run.runId }) : undefined;
  const afterCommit = async (): Promise<void> => {
    await publisher?.maybePublish();
  };
  const d: SyncDeps = { ...deps, logger, ...(publisher ? { afterCommit } : {}) };
  try {
    const result =
      run.scope === 'workspace' ? await syncWorkspace(d, wsOpts) : await syncConversations(d, opts.conversationIds ?? [], wsOpts);
    // Stopped early (credentials, configuration, unusable mirror, runaway list): the result still
    // says what was committed before.
    const during = publisher ? { publishedDuringRun: publisher.published } : {};
    return result.fatal ? { result, fatal: result.fatal, ...during } : { result, ...during };
  } catch (err) {
    return { fatal: err, ...(publisher ? { publishedDuringRun: publisher.published } : {}) };
  }
}

/** Options of {@link crawlConversation}. */
export interface CrawlOptions {
  /** Re-read every page; resume only a checkpoint of this run (a retried attempt). @defaultValue false */
  full?: boolean | undefined;
  /** Change signal of the run (incremental crawls only): skip the conversation when it has not moved. */
  changeField?: string | undefined;
  /** A complete listing of the run no longer shows it: a 404 tombstones it. @defaultValue false */
  unlisted?: boolean | undefined;
  /** Named by the caller (an on-demand job), not found by a listing. @defaultValue false */
  named?: boolean | undefined;
  /** Shutdown: stops the crawl between pages. */
  signal?: AbortSignal | undefined;
}

/**
 * How one conversation's crawl ended, with what it cost (`tally`: requests and messages served,
 * whatever the outcome): synced, failed (`fatal` when nothing more can succeed in the run), or
 * stopped by shutdown (a checkpoint lets it resume; not a failure).
 */
export type CrawlOutcome =
  | { kind: 'synced'; result: ConversationResult; tally: RequestTally }
  | { kind: 'failed'; failure: ConversationFailure & { tally: RequestTally }; fatal: boolean; tally: RequestTally }
  | { kind: 'stopped'; tally: RequestTally };

/**
 * Crawls one conversation within `run`. A conversation that fails (not fatally) loses its change
 * signal baseline, so the next incremental run asks the API about it whatever the signal says.
 *
 * @returns the outcome (never throws)
 */
export async function crawlConversation(deps: SyncDeps, run: Pick<RunHandle, 'runId' | 'accountId'>, id: string, o: CrawlOptions): Promise<CrawlOutcome> {
  const tally = newTally();
  try {
    const result = await syncConversation(deps, id, {
      accountId: run.accountId,
      runId: run.runId,
      // A full refresh resumes only checkpoints of its own run (a retried attempt).
      resume: o.full ? 'same-run' : true,
      incremental: !o.full,
      // A full crawl never skips (incremental is off) but records the signal as the next baseline.
      changeField: o.changeField,
      unlisted: o.unlisted === true,
      named: o.named === true,
      signal: o.signal,
      tally,
    });
    return { kind: 'synced', result, tally };
  } catch (err) {
    if (o.signal?.aborted) return { kind: 'stopped', tally };
    const fatal = isFatal(err);
    if (!fatal) await forgetBaseline(deps, run.accountId, id);
    return { kind: 'failed', failure: { id, error: err as Error, tally }, fatal, tally };
  }
}

/**
 * A conversation that failed is asked about again by the next incremental run, whatever its
 * change signal says (a failure of the mirror itself is reported by the run).
 */
async function forgetBaseline(deps: SyncDeps, accountId: string, id: string): Promise<void> {
  try {
    await deps.mirror.forgetCrawlBaseline(accountId, id);
  } catch {
    /* the mirror's own failure is reported by the run */
  }
}
