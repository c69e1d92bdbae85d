/**
 * What the crawls of a run did, summed as they finish. Nothing is kept per conversation but its id
 * and one number (its last outcome), so a run over 100,000 conversations holds no object for any
 * of them once its crawl is done (flat memory).
 *
 * A conversation crawled twice in one run (a re-check after the listing) counts once, by its last
 * outcome (synced, of which skipped, or deleted); the messages it changed count in every crawl that
 * changed them (each change is its own change-log row).
 */
import { PER_PAGE } from '../api/schemas.js';
import type { ConversationResult } from './conversation.js';

/** The crawls of a run, summed. */
export interface CrawlTotals {
  /** Conversations whose last crawl in the run completed (those {@link skipped} included). */
  synced: number;
  /**
   * Of {@link synced}, the conversations whose last crawl was skipped without a request: their
   * change signal had not moved since their last complete crawl.
   */
  skipped: number;
  /** Conversations whose last crawl in the run found them deleted (404, tombstoned). */
  deleted: number;
  /** Messages inserted, updated and tombstoned by the run's crawls. */
  messagesInserted: number;
  messagesUpdated: number;
  messagesDeleted: number;
  /** Crawl restarts caused by drift. */
  restarts: number;
  /**
   * Fewest requests that could have served those conversations: `max(1, ceil(messages / 100))`
   * for each one's last crawl.
   */
  minimumRequests: number;
}

/** Totals of nothing crawled. */
export const emptyCrawlTotals = (): CrawlTotals => ({ synced: 0, skipped: 0, deleted: 0, messagesInserted: 0, messagesUpdated: 0, messagesDeleted: 0, restarts: 0, minimumRequests: 0 });

/** Fewest requests a complete crawl of `messageCount` messages needs: one per page of 100, at least 1. */
export const crawlMinimum = (messageCount: number): number => Math.max(1, Math.ceil(messageCount / PER_PAGE));

/** Outcome bits of {@link CrawlAccumulator}'s numbers (below them, the minimum requests × 4). */
const DELETED = 1;
const SKIPPED = 2;

/** Sums crawl results as they come (see the module comment). */
export class CrawlAccumulator {
  /** Last outcome per conversation: minimum requests × 4, + 1 when it was deleted, + 2 when it was skipped. */
  private readonly outcomes = new Map<string, number>();
  private readonly sums = { messagesInserted: 0, messagesUpdated: 0, messagesDeleted: 0, restarts: 0 };

  /** Adds a finished crawl; a conversation crawled before in the run keeps this, its last, outcome. */
  add(r: ConversationResult): void {
    this.outcomes.set(r.id, crawlMinimum(r.messageCount) * 4 + (r.status === 'deleted' ? DELETED : r.crawl === 'skipped' ? SKIPPED : 0));
    this.sums.messagesInserted += r.inserted;
    this.sums.messagesUpdated += r.updated;
    this.sums.messagesDeleted += r.deleted;
    this.sums.restarts += r.restarts;
  }

  /** Drops the outcome of a conversation whose last crawl failed (the failure counts instead). */
  forget(id: string): void {
    this.outcomes.delete(id);
  }

  /** Conversations with an outcome (synced or deleted). */
  get size(): number {
    return this.outcomes.size;
  }

  /** The totals so far. */
  totals(): CrawlTotals {
    const out = { ...emptyCrawlTotals(), ...this.sums };
    for (const v of this.outcomes.values()) {
      const outcome = v % 4;
      if (outcome === DELETED) out.deleted++;
      else out.synced++;
      if (outcome === SKIPPED) out.skipped++;
      out.minimumRequests += Math.floor(v / 4);
    }
    return out;
  }
}

/** The totals of `results` (each a conversation's last crawl). */
export function crawlTotals(results: Iterable<ConversationResult>): CrawlTotals {
  const acc = new CrawlAccumulator();
  for (const r of results) acc.add(r);
  return acc.totals();
}
