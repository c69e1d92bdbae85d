/**
 * planCrawl / checkPage / checkComplete: the decisions of a conversation crawl, as pure functions of
 * what the mirror says and what the API served. No HTTP, no SQLite, no clock.
 */
import { describe, expect, it } from 'vitest';
import { checkComplete, checkPage, planCrawl, type CrawlFacts, type CrawlPolicy, type CrawlStart } from '../src/sync/crawl-plan.js';
import type { Checkpoint } from '../src/store/mirror.js';

const NOW = 1_700_000_000_000;
const DAY = 86_400_000;

function checkpoint(over: Partial<Checkpoint> = {}): Checkpoint {
  return { nextPage: 3, totalCount: 250, seenIds: new Set(['a', 'b', 'c']), lastPageIds: ['b', 'c'], updatedAt: NOW - 60_000, runId: 7, ...over };
}

/** Facts of a conversation whose mirrored messages are `m0`, `m1`, ... (positions 0..n-1). */
function facts(over: Partial<CrawlFacts> & { mirrored?: number } = {}): CrawlFacts {
  const n = over.mirrored ?? 0;
  return {
    checkpoint: undefined,
    state: undefined,
    messageIdAt: (position) => (position < n ? `m${position}` : undefined),
    ...over,
  };
}

const policy = (over: Partial<CrawlPolicy> = {}): CrawlPolicy => ({
  incremental: false,
  changeField: undefined,
  resume: undefined,
  runId: 8,
  now: NOW,
  first: true,
  ...over,
});

const state = (messageCount: number | null, signal: string | null, crawledSignal: string | null = signal) => ({
  messageCount,
  crawledSignal,
  raw: signal === null ? '{}' : JSON.stringify({ updated_at: signal }),
});

describe('planCrawl', () => {
  it('with nothing mirrored: a full crawl from page 1, nothing to verify', () => {
    expect(planCrawl(facts(), policy())).toEqual({ kind: 'crawl', crawl: 'full', startPage: 1 });
    expect(planCrawl(facts({ state: state(null, null) }), policy({ incremental: true }))).toEqual({ kind: 'crawl', crawl: 'full', startPage: 1 });
  });

  it('skips when the change signal has not moved since the last complete crawl', () => {
    const f = facts({ state: state(42, '2025-01-01T00:00:00Z'), mirrored: 42 });
    const p = policy({ incremental: true, changeField: 'updated_at' });
    expect(planCrawl(f, p)).toEqual({ kind: 'skip', signal: '2025-01-01T00:00:00Z', messageCount: 42 });
  });

  it('does not skip when the signal moved, is missing, was never recorded, no crawl completed, there is a checkpoint, or after a restart', () => {
    const p = policy({ incremental: true, changeField: 'updated_at' });
    const kinds = [
      planCrawl(facts({ state: state(42, 'new', 'old'), mirrored: 42 }), p),
      planCrawl(facts({ state: state(42, null, 'old'), mirrored: 42 }), p),
      planCrawl(facts({ state: state(42, 'x', null), mirrored: 42 }), p),
      planCrawl(facts({ state: state(null, 'x'), mirrored: 42 }), p),
      planCrawl(facts({ state: state(42, 'x'), mirrored: 42, checkpoint: checkpoint() }), p),
      planCrawl(facts({ state: state(42, 'x'), mirrored: 42 }), { ...p, first: false }),
      planCrawl(facts({ state: state(42, 'x'), mirrored: 42 }), { ...p, changeField: undefined }),
    ].map((plan) => plan.kind);
    expect(kinds).toEqual(['crawl', 'crawl', 'crawl', 'crawl', 'crawl', 'crawl', 'crawl']);
  });

  it('resumes a recent checkpoint: re-reads its last committed page first and carries its total', () => {
    const cp = checkpoint();
    expect(planCrawl(facts({ checkpoint: cp }), policy())).toEqual({
      kind: 'crawl',
      crawl: 'full',
      startPage: 2,
      resume: cp,
      verify: { page: 2, ids: ['b', 'c'] },
      lastTotal: 250,
    });
  });

  it('a checkpoint at page 1 (nothing committed past it) starts at page 1 with nothing to verify', () => {
    const cp = checkpoint({ nextPage: 1, lastPageIds: [] });
    const plan = planCrawl(facts({ checkpoint: cp }), policy()) as CrawlStart;
    expect(plan).toMatchObject({ startPage: 1, resume: cp, lastTotal: 250 });
    expect(plan.verify).toBeUndefined();
  });

  it('discards a checkpoint older than checkpointMaxAgeMs (24 h by default), or with a NaN age', () => {
    const old = checkpoint({ updatedAt: NOW - DAY - 1 });
    expect(planCrawl(facts({ checkpoint: old }), policy())).toEqual({
      kind: 'crawl',
      crawl: 'full',
      startPage: 1,
      discard: { checkpoint: old, why: 'too-old', ageMs: DAY + 1 },
    });
    expect(planCrawl(facts({ checkpoint: checkpoint({ updatedAt: NOW - DAY }) }), policy())).toMatchObject({ resume: expect.anything() });
    expect(planCrawl(facts({ checkpoint: checkpoint({ updatedAt: NOW - 5000 }) }), policy({ checkpointMaxAgeMs: 4999 }))).toMatchObject({ discard: { why: 'too-old' } });
    expect(planCrawl(facts({ checkpoint: checkpoint({ updatedAt: Number.NaN }) }), policy())).toMatchObject({ discard: { why: 'too-old' } });
  });

  it("discards any checkpoint when resume is false, and another run's when resume is 'same-run'", () => {
    expect(planCrawl(facts({ checkpoint: checkpoint() }), policy({ resume: false }))).toMatchObject({ startPage: 1, discard: { why: 'resume-off' } });
    expect(planCrawl(facts({ checkpoint: checkpoint({ runId: 7 }) }), policy({ resume: 'same-run', runId: 8 }))).toMatchObject({ discard: { why: 'other-run' } });
    expect(planCrawl(facts({ checkpoint: checkpoint({ runId: null }) }), policy({ resume: 'same-run', runId: null }))).toMatchObject({ discard: { why: 'other-run' } });
    const own = checkpoint({ runId: 8 });
    expect(planCrawl(facts({ checkpoint: own }), policy({ resume: 'same-run', runId: 8 }))).toMatchObject({ resume: own, startPage: 2 });
  });

  it('a checkpoint left after a restart is resumed without being judged again', () => {
    const old = checkpoint({ updatedAt: NOW - 10 * DAY });
    const plan = planCrawl(facts({ checkpoint: old }), policy({ first: false, resume: false })) as CrawlStart;
    expect(plan.discard).toBeUndefined();
    expect(plan).toMatchObject({ resume: old, startPage: 2 });
  });

  it('incremental: starts at the page holding the last known message, checking its first message', () => {
    const cases = [1, 99, 100, 101, 250, 1200].map((n) => {
      const plan = planCrawl(facts({ state: state(n, null), mirrored: n }), policy({ incremental: true })) as CrawlStart;
      return [n, plan.crawl, plan.startPage, plan.boundary];
    });
    expect(cases).toEqual([
      [1, 'incremental', 1, { page: 1, position: 0, firstId: 'm0', known: 1 }],
      [99, 'incremental', 1, { page: 1, position: 0, firstId: 'm0', known: 99 }],
      [100, 'incremental', 1, { page: 1, position: 0, firstId: 'm0', known: 100 }],
      [101, 'incremental', 2, { page: 2, position: 100, firstId: 'm100', known: 101 }],
      [250, 'incremental', 3, { page: 3, position: 200, firstId: 'm200', known: 250 }],
      [1200, 'incremental', 12, { page: 12, position: 1100, firstId: 'm1100', known: 1200 }],
    ]);
  });

  it('incremental after a discarded checkpoint: the boundary still applies', () => {
    const plan = planCrawl(facts({ state: state(250, null), mirrored: 250, checkpoint: checkpoint({ updatedAt: NOW - 2 * DAY }) }), policy({ incremental: true }));
    expect(plan).toMatchObject({ crawl: 'incremental', startPage: 3, discard: { why: 'too-old' }, boundary: { page: 3, firstId: 'm200' } });
  });

  it('a full crawl instead of an incremental one: not incremental, 0 messages known, or the boundary message is gone', () => {
    expect(planCrawl(facts({ state: state(250, null), mirrored: 250 }), policy({ incremental: false }))).toEqual({ kind: 'crawl', crawl: 'full', startPage: 1 });
    expect(planCrawl(facts({ state: state(0, null) }), policy({ incremental: true }))).toEqual({ kind: 'crawl', crawl: 'full', startPage: 1 });
    expect(planCrawl(facts({ state: state(250, null), mirrored: 150 }), policy({ incremental: true }))).toEqual({ kind: 'crawl', crawl: 'full', startPage: 1 });
  });

  it('a resumable checkpoint wins over the incremental boundary', () => {
    const cp = checkpoint();
    expect(planCrawl(facts({ state: state(250, null), mirrored: 250, checkpoint: cp }), policy({ incremental: true }))).toMatchObject({
      crawl: 'full',
      resume: cp,
      startPage: 2,
    });
  });
});

describe('checkPage', () => {
  const ids = (from: number, n: number): string[] => Array.from({ length: n }, (_, i) => `m${from + i}`);
  const none = { plan: {}, lastTotal: undefined, seen: new Set<string>() };

  it('passes a first page, and a page that continues the crawl (total equal or grown)', () => {
    expect(checkPage({ page: 1, ids: ids(0, 100), totalCount: 150 }, none)).toEqual({ ok: true });
    expect(checkPage({ page: 2, ids: ids(100, 60), totalCount: 160 }, { plan: {}, lastTotal: 150, seen: new Set(ids(0, 100)) })).toEqual({ ok: true });
    expect(checkPage({ page: 2, ids: [], totalCount: 100 }, { plan: {}, lastTotal: 100, seen: new Set(ids(0, 100)) })).toEqual({ ok: true });
  });

  it('total_count shrinking is drift (restart, not a fall-back to a full crawl)', () => {
    expect(checkPage({ page: 2, ids: ids(100, 40), totalCount: 140 }, { plan: {}, lastTotal: 150, seen: new Set() })).toEqual({
      ok: false,
      drift: 'total-shrank',
      reason: 'meta.total_count shrank from 150 to 140 at page 2',
      earlierPagesChanged: false,
    });
  });

  it('an id served twice, on the page or on an earlier one, is drift', () => {
    expect(checkPage({ page: 1, ids: ['a', 'b', 'a'], totalCount: 3 }, none)).toMatchObject({ ok: false, drift: 'duplicate', reason: 'message a served twice (pages shifted) at page 1' });
    expect(checkPage({ page: 2, ids: ['x', 'b'], totalCount: 4 }, { plan: {}, lastTotal: 4, seen: new Set(['a', 'b']) })).toMatchObject({
      ok: false,
      drift: 'duplicate',
      earlierPagesChanged: false,
    });
  });

  it('the re-read page of a resumed crawl must serve exactly the committed ids; its own ids are not duplicates', () => {
    const progress = { plan: { verify: { page: 2, ids: ['b', 'c'] } }, lastTotal: 250, seen: new Set(['a', 'b', 'c']) };
    expect(checkPage({ page: 2, ids: ['b', 'c'], totalCount: 250 }, progress)).toEqual({ ok: true });
    expect(checkPage({ page: 2, ids: ['c', 'b'], totalCount: 250 }, progress)).toEqual({
      ok: false,
      drift: 'page-changed',
      reason: 'page 2 changed since the checkpoint',
      earlierPagesChanged: false,
    });
    expect(checkPage({ page: 2, ids: ['b'], totalCount: 250 }, progress)).toMatchObject({ drift: 'page-changed' });
    // Past the re-read page, the committed ids count as seen again.
    expect(checkPage({ page: 3, ids: ['b'], totalCount: 250 }, progress)).toMatchObject({ drift: 'duplicate' });
  });

  it('the incremental boundary page: a total below the known count, or another first message, means earlier pages changed', () => {
    const boundary = { page: 3, position: 200, firstId: 'm200', known: 250 };
    const progress = { plan: { boundary }, lastTotal: undefined, seen: new Set(ids(0, 200)) };
    expect(checkPage({ page: 3, ids: ids(200, 50), totalCount: 250 }, progress)).toEqual({ ok: true });
    expect(checkPage({ page: 3, ids: ids(200, 49), totalCount: 249 }, progress)).toEqual({
      ok: false,
      drift: 'boundary-total',
      reason: 'meta.total_count 249 is below the 250 messages mirrored',
      earlierPagesChanged: true,
    });
    expect(checkPage({ page: 3, ids: ids(201, 50), totalCount: 251 }, progress)).toEqual({
      ok: false,
      drift: 'boundary-mismatch',
      reason: 'boundary check failed at page 3: the first message is m201, the mirror has m200',
      earlierPagesChanged: true,
    });
    expect(checkPage({ page: 3, ids: [], totalCount: 250 }, progress)).toMatchObject({ drift: 'boundary-mismatch', reason: expect.stringContaining('is missing') });
    // The boundary is checked on its page only.
    expect(checkPage({ page: 4, ids: ['n1'], totalCount: 251 }, { ...progress, lastTotal: 251 })).toEqual({ ok: true });
  });

  it('checks in order: boundary, then total, then the re-read page, then duplicates', () => {
    const progress = {
      plan: { boundary: { page: 2, position: 100, firstId: 'm100', known: 150 }, verify: { page: 2, ids: ['m100'] } },
      lastTotal: 200,
      seen: new Set(['dup']),
    };
    expect(checkPage({ page: 2, ids: ['zz'], totalCount: 100 }, progress)).toMatchObject({ drift: 'boundary-total' });
    expect(checkPage({ page: 2, ids: ['m100', 'dup'], totalCount: 190 }, progress)).toMatchObject({ drift: 'total-shrank' });
    expect(checkPage({ page: 2, ids: ['m100', 'dup'], totalCount: 200 }, progress)).toMatchObject({ drift: 'page-changed' });
  });
});

describe('checkComplete', () => {
  it('passes when the distinct ids equal the last total (or no page was served)', () => {
    expect(checkComplete(250, 250)).toEqual({ ok: true });
    expect(checkComplete(0, undefined)).toEqual({ ok: true });
    expect(checkComplete(0, 0)).toEqual({ ok: true });
  });

  it('fewer or more distinct ids than total_count is drift', () => {
    expect(checkComplete(249, 250)).toEqual({
      ok: false,
      drift: 'incomplete',
      reason: 'crawl ended with 249 distinct messages but meta.total_count is 250',
      earlierPagesChanged: false,
    });
    expect(checkComplete(251, 250)).toMatchObject({ ok: false, drift: 'incomplete' });
  });
});
