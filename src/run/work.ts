/**
 * What a run did ({@link RunWork}), gathered from wherever it was done: one sync in this process
 * (the CLI), one conversation job, or a workspace job's listing and its conversation jobs. The
 * figures come from request tallies: listing + every crawl (every attempt, whatever its outcome).
 */
import { addTally, newTally, type RequestTally } from '../api/client.js';
import type { RunFailureRecord } from '../store/mirror.js';
import type { ConversationResult } from '../sync/conversation.js';
import { LIST_FAILURE_ID, type WorkspaceResult } from '../sync/workspace.js';
import { CrawlAccumulator } from '../sync/crawl-totals.js';
import { failureRecord } from './failures.js';
import type { RunWork } from './types.js';

/**
 * The work of one sync in this process (`runSync`).
 *
 * @param known - conversations the run set out to sync when it named them (distinct ids);
 *   a workspace run knows the ones it listed
 */
export function workOfSync(result: WorkspaceResult, known?: number): RunWork {
  return {
    listPasses: result.listPasses,
    listConfirmed: result.listConfirmed,
    conversationsListed: result.conversationsListed,
    conversationsInserted: result.conversationsInserted,
    conversationsUpdated: result.conversationsUpdated,
    crawls: result.crawls,
    failures: result.failures.map(failureRecord),
    // The sync fills both; without them, what the listing and the failed crawls cost is all that is known.
    tally: result.tally ?? result.failures.map((f) => f.tally ?? newTally()).reduce(addTally, result.listingTally ?? newTally()),
    messagesServed: result.messagesServed ?? 0,
    known: known ?? result.conversationsListed,
  };
}

/** A listing as a workspace run keeps it between its steps. */
export interface ListingFigures {
  passes: number;
  confirmed: boolean;
  /** Distinct conversations seen. */
  listed: number;
  /** Conversation rows inserted / updated (change-log rows written). */
  inserted: number;
  updated: number;
  /** What the listing asked and was served. */
  tally: RequestTally;
  /** Why the listing is incomplete (an unsettled list), if it is: recorded as the listing's failure. */
  failure?: RunFailureRecord | undefined;
}

/** One conversation crawled for a run (by a job, over all its attempts): its result or its failure, and what it cost. */
export type CrawlRecord = { result: ConversationResult; tally: RequestTally } | { failure: RunFailureRecord; tally: RequestTally };

/**
 * The work of a run done in pieces: a listing (absent for a run of named conversations) and the
 * crawls of its conversations, each with what all its attempts cost.
 */
export function workOfCrawls(listing: ListingFigures | undefined, crawls: CrawlRecord[]): RunWork {
  const acc = new CrawlAccumulator();
  const failures: RunFailureRecord[] = [];
  let crawlTally = newTally();
  for (const c of crawls) {
    if ('result' in c) acc.add(c.result);
    else failures.push(c.failure);
    crawlTally = addTally(crawlTally, c.tally);
  }
  if (listing?.failure) failures.push({ ...listing.failure, id: LIST_FAILURE_ID });
  return {
    listPasses: listing?.passes ?? 0,
    listConfirmed: listing ? listing.confirmed : true,
    conversationsListed: listing?.listed ?? 0,
    conversationsInserted: listing?.inserted ?? 0,
    conversationsUpdated: listing?.updated ?? 0,
    crawls: acc.totals(),
    failures,
    tally: addTally(listing?.tally ?? newTally(), crawlTally),
    messagesServed: crawlTally.served,
    known: listing ? listing.listed : crawls.length,
  };
}
