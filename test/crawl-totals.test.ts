/**
 * The crawls of a run summed as they finish (flat memory): each conversation counts once, by its
 * last outcome; a failure replaces an earlier outcome; messages count in every crawl.
 */
import { describe, expect, it } from 'vitest';
import { newTally } from '../src/api/client.js';
import type { ConversationResult } from '../src/sync/conversation.js';
import { CrawlAccumulator, crawlTotals } from '../src/sync/crawl-totals.js';

const result = (id: string, o: Partial<ConversationResult> = {}): ConversationResult => ({
  id,
  status: 'synced',
  pages: 1,
  messageCount: 0,
  inserted: 0,
  updated: 0,
  deleted: 0,
  restarts: 0,
  resumed: false,
  tally: newTally(),
  crawl: 'full',
  ...o,
});

describe('crawl totals', () => {
  it('sum messages over every crawl, count each conversation by its last outcome, and its minimum requests', () => {
    const acc = new CrawlAccumulator();
    acc.add(result('a', { messageCount: 250, inserted: 250, restarts: 1 }));
    acc.add(result('b', { messageCount: 0 }));
    // a re-check of a: deleted now (404); its 250 inserted messages were still written in this run
    acc.add(result('a', { status: 'deleted', messageCount: 0, deleted: 250 }));
    expect(acc.size).toBe(2);
    expect(acc.totals()).toEqual({ synced: 1, skipped: 0, deleted: 1, messagesInserted: 250, messagesUpdated: 0, messagesDeleted: 250, restarts: 1, minimumRequests: 2 });
  });

  it('a conversation whose last crawl failed has no outcome; an empty run sums to zero', () => {
    const acc = new CrawlAccumulator();
    acc.add(result('a', { messageCount: 101 }));
    acc.forget('a');
    expect(acc.totals()).toMatchObject({ synced: 0, deleted: 0, minimumRequests: 0 });
    expect(crawlTotals([result('x', { messageCount: 201 }), result('y', { messageCount: 100 })])).toMatchObject({ synced: 2, minimumRequests: 4 });
  });

  it('a conversation skipped on its change signal counts as synced and as skipped, by its last outcome', () => {
    const acc = new CrawlAccumulator();
    acc.add(result('a', { crawl: 'skipped', messageCount: 250 }));
    acc.add(result('b', { crawl: 'incremental', messageCount: 30, inserted: 3 }));
    acc.add(result('c', { crawl: 'skipped', messageCount: 0 }));
    // a re-check of c crawled it after all: its last outcome is a crawl, not a skip
    acc.add(result('c', { crawl: 'full', messageCount: 0 }));
    expect(acc.totals()).toMatchObject({ synced: 3, skipped: 1, deleted: 0, messagesInserted: 3, minimumRequests: 3 + 1 + 1 });
  });
});
