/**
 * A run's figures: pure functions from what the run did ({@link RunWork}) to the summary's counts
 * and to the `runs` columns. One counter: requests, retries, 429s and messages served come from the
 * request tallies the client filled; nothing is derived from live progress counters or from the
 * size of the conversations synced.
 */
import { PER_PAGE } from '../api/schemas.js';
import type { RunFigures, RunScope } from '../store/mirror.js';
import { LIST_FAILURE_ID } from '../sync/workspace.js';
import { crawlMinimum, emptyCrawlTotals } from '../sync/crawl-totals.js';
import type { RunSummary, RunWork } from './types.js';

/** The summary's counts of a run's work (everything but status, timing and export). */
export type WorkFigures = Pick<
  RunSummary,
  'listPasses' | 'listConfirmed' | 'conversations' | 'messages' | 'requests' | 'retries' | 'rateLimited' | 'minimumRequests' | 'failures'
>;

/**
 * Counts of a run's work. `conversations.notSynced` is counted only when the run stopped early
 * (`stoppedEarly`): conversations it knew of that were neither synced nor failed.
 */
export function workFigures(work: RunWork | undefined, scope: RunScope, stoppedEarly: boolean): WorkFigures {
  const crawls = work?.crawls ?? emptyCrawlTotals();
  const crawled = crawls.synced + crawls.deleted;
  const failed = (work?.failures ?? []).filter((f) => f.id !== LIST_FAILURE_ID).length;
  const listed = work?.conversationsListed ?? 0;
  const known = work?.known ?? crawled + failed;
  return {
    listPasses: work?.listPasses ?? 0,
    listConfirmed: work?.listConfirmed ?? false,
    conversations: {
      listed,
      synced: crawls.synced,
      skipped: crawls.skipped,
      deleted: crawls.deleted,
      failed,
      inserted: work?.conversationsInserted ?? 0,
      updated: work?.conversationsUpdated ?? 0,
      notSynced: stoppedEarly ? Math.max(0, known - crawled - failed) : 0,
    },
    messages: {
      served: work?.messagesServed ?? 0,
      inserted: crawls.messagesInserted,
      updated: crawls.messagesUpdated,
      deleted: crawls.messagesDeleted,
      restarts: crawls.restarts,
    },
    requests: work?.tally.requests ?? 0,
    retries: work?.tally.retries ?? 0,
    rateLimited: work?.tally.rateLimited ?? 0,
    minimumRequests: listingMinimum(scope, listed) + crawls.minimumRequests,
    failures: (work?.failures ?? []).map((f) => ({ id: f.id, code: f.code, message: f.message })),
  };
}

/**
 * Fewest requests that could have produced this mirror: `ceil(listed/100)` (at least 1) for a
 * workspace listing, plus `max(1, ceil(messages/100))` per conversation.
 */
export function minimumRequests(scope: RunScope, listed: number, messageCounts: number[]): number {
  return listingMinimum(scope, listed) + messageCounts.reduce((n, c) => n + crawlMinimum(c), 0);
}

/** Fewest list requests: `ceil(listed/100)` (at least 1) for a workspace listing, 0 for named conversations. */
function listingMinimum(scope: RunScope, listed: number): number {
  return scope === 'workspace' ? Math.max(1, Math.ceil(listed / PER_PAGE)) : 0;
}

/** The `runs` columns of a finished run, from its summary and the error that ended it (if any). */
export function runColumns(s: RunSummary, error: string | null): RunFigures {
  return {
    status: s.status,
    list_passes: s.listPasses,
    conversations_listed: s.conversations.listed,
    conversations_synced: s.conversations.synced,
    conversations_failed: s.conversations.failed,
    conversations_deleted: s.conversations.deleted,
    conversations_inserted: s.conversations.inserted,
    conversations_updated: s.conversations.updated,
    messages_served: s.messages.served,
    messages_inserted: s.messages.inserted,
    messages_updated: s.messages.updated,
    messages_deleted: s.messages.deleted,
    requests: s.requests,
    retries: s.retries,
    rate_limited: s.rateLimited,
    export_lines: s.export.lines,
    export_files: s.export.files,
    error,
  };
}
