/**
 * The recorded run (src/run): its figures come from request tallies only, so `messages_served`
 * counts what the API served in that run. `runSync` against the fake over real HTTP into each
 * engine of the store (the conformance suite: test/engines.ts); the pure figure and failure
 * functions on hand-made inputs.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { newTally } from '../src/api/client.js';
import { HttpError, RunError, SchemaError } from '../src/errors.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { failureMessage, failureRecord, minimumRequests, parseFailureMessage, workFigures, workOfCrawls, type RunSummary } from '../src/run/index.js';
import type { ConversationResult } from '../src/sync/conversation.js';
import { harnessPool, type Harness, type HarnessOptions } from './helpers.js';
import { engines } from './engines.js';
import { runRow as row } from './mirror-reads.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const FIGURES = ['scope', 'refresh', 'trigger', 'status', 'messages_served', 'messages_inserted', 'requests'] as const;

/** The columns of `runs` these tests read, of one run. */
const runRow = async (h: Harness, runId: number, cols: readonly string[] = FIGURES) => {
  const r = (await row(h.mirror, runId))!;
  return Object.fromEntries(cols.map((c) => [c, r[c]]));
};

/** A conversation's result, as the sync returns it. */
function result(id: string, over: Partial<ConversationResult> = {}): ConversationResult {
  return { id, status: 'synced', pages: 1, messageCount: 0, inserted: 0, updated: 0, deleted: 0, restarts: 0, resumed: false, tally: newTally(), crawl: 'full', ...over };
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  describe('runSync records what the API served in the run', () => {
    it('a first full sync records every message of the fake as served; an incremental sync of the unchanged workspace records 0 and only list requests', async () => {
      const counts = [0, 1, 99, 100, 101, 250, 7];
      const ws = FakeWorkspace.fromCounts(counts);
      const total = counts.reduce((a, b) => a + b, 0);
      const h = await start({ workspace: ws });

      const first = await h.sync({ full: true });
      expect(first.messages.served).toBe(total);
      expect(first.requests).toBe(h.fake.requests.length);
      expect(await runRow(h, first.runId)).toEqual({
        scope: 'workspace',
        refresh: 'full',
        trigger: 'cli',
        status: 'succeeded',
        messages_served: total,
        messages_inserted: total,
        requests: h.fake.requests.length,
      });

      // Nothing changed at the fake: every conversation's change signal is unmoved, so every one is
      // skipped without a message request; the run asked only for list pages.
      const before = h.fake.requests.length;
      const quiet = await h.sync();
      const asked = h.fake.requests.slice(before);
      expect(asked.length).toBeGreaterThan(0);
      expect(asked.filter((r) => r.path !== '/v1/conversations'), 'message requests of the quiet run').toEqual([]);
      expect(quiet.messages.served).toBe(0);
      expect(await runRow(h, quiet.runId)).toEqual({
        scope: 'workspace',
        refresh: 'incremental',
        trigger: 'cli',
        status: 'succeeded',
        messages_served: 0,
        messages_inserted: 0,
        requests: asked.length,
      });
    });

    it('named conversations: served counts the messages of the pages read, not the size of the conversation', async () => {
      const ws = FakeWorkspace.fromCounts([250, 5]);
      const h = await start({ workspace: ws });
      const [big] = ws.list();
      await h.sync({ conversationIds: [big!.id] });
      ws.appendMessages(big!.id, 3);
      const before = h.fake.requests.length;
      const s = await h.sync({ conversationIds: [big!.id] });
      // Incremental: the page of the last known message (page 3: 50 messages) plus the 3 new ones on it.
      expect(h.fake.requests.slice(before).map((r) => r.query['page'])).toEqual(['3']);
      expect(s.messages.served).toBe(53);
      expect(await runRow(h, s.runId)).toMatchObject({ scope: 'conversations', messages_served: 53, messages_inserted: 3, requests: 1 });
    });
  });

  describe('a run counts what it changed from its own change-log rows', () => {
    it('pages a failed crawl committed before it failed count in messages_inserted, in the summary and in runs', async () => {
      const ws = FakeWorkspace.fromCounts([250, 30]);
      const h = await start({ workspace: ws });
      const broken = ws.list()[0]!;
      // Page 1 (100 messages) commits, then page 2 keeps answering 400: the crawl fails.
      h.fake.injectFault({ kind: 'status', status: 400, match: { path: `/v1/conversations/${broken.id}/messages`, page: 2 }, times: Infinity });
      const s = await h.sync({ full: true });
      expect(s.status).toBe('partial');
      expect(s.failures.map((f) => f.id)).toEqual([broken.id]);
      expect(s.messages.inserted).toBe(100 + 30);
      expect(await runRow(h, s.runId, ['messages_inserted', 'messages_served'])).toEqual({ messages_inserted: 130, messages_served: 130 });
    });
  });

  describe('a run stopped by its listing still counts the listing', () => {
    it('list page 2 answering 401: the summary and runs record every request sent, the list pages included', async () => {
      const ws = FakeWorkspace.fromCounts(Array.from({ length: 150 }, () => 2));
      const h = await start({ workspace: ws });
      h.fake.injectFault({ kind: 'status', status: 401, match: { path: '/v1/conversations', page: 2 }, times: Infinity });
      const err = await h.sync().then(
        () => undefined,
        (e: unknown) => e as RunError<RunSummary>,
      );
      expect(err).toBeInstanceOf(RunError);
      const s = err!.summary;
      expect(h.fake.requests.filter((r) => r.path === '/v1/conversations')).toHaveLength(2);
      expect(s.requests).toBe(h.fake.requests.length);
      expect(await runRow(h, s.runId, ['status', 'requests'])).toEqual({ status: 'failed', requests: h.fake.requests.length });
    });
  });

});

describe('figures (pure)', () => {
  it('served and requests come from the tallies: a skipped conversation of 300 messages counts 0 served and 0 requests', () => {
    const listing = { passes: 1, confirmed: true, listed: 2, inserted: 0, updated: 0, tally: { requests: 1, retries: 0, rateLimited: 0, served: 2 } };
    const work = workOfCrawls(listing, [
      { result: result('a', { messageCount: 300, crawl: 'skipped', pages: 0 }), tally: newTally() },
      { result: result('b', { messageCount: 120, inserted: 20 }), tally: { requests: 3, retries: 1, rateLimited: 1, served: 20 } },
    ]);
    const f = workFigures(work, 'workspace', false);
    expect(f.messages).toEqual({ served: 20, inserted: 20, updated: 0, deleted: 0, restarts: 0 });
    expect({ requests: f.requests, retries: f.retries, rateLimited: f.rateLimited }).toEqual({ requests: 4, retries: 1, rateLimited: 1 });
    expect(f.conversations).toMatchObject({ listed: 2, synced: 2, failed: 0, notSynced: 0 });
    expect(f.minimumRequests).toBe(1 + 3 + 2);
  });

  it('a failed crawl adds what it cost and was served, and its record; the listing failure is not a conversation', () => {
    const listing = {
      passes: 5,
      confirmed: false,
      listed: 3,
      inserted: 3,
      updated: 0,
      tally: { requests: 5, retries: 0, rateLimited: 0, served: 15 },
      failure: { id: 'x', code: 'DRIFT_ERROR', status: null, attempts: null, message: 'kept shifting' },
    };
    const failure = { id: 'c', code: 'SCHEMA_ERROR', status: null, attempts: null, message: 'bad page' };
    const work = workOfCrawls(listing, [
      { result: result('a'), tally: { requests: 1, retries: 0, rateLimited: 0, served: 0 } },
      { failure, tally: { requests: 2, retries: 0, rateLimited: 0, served: 100 } },
    ]);
    expect(work.failures.map((f) => [f.id, f.code])).toEqual([
      ['c', 'SCHEMA_ERROR'],
      ['(conversation list)', 'DRIFT_ERROR'],
    ]);
    const f = workFigures(work, 'workspace', true);
    expect(f.messages.served).toBe(100);
    expect(f.requests).toBe(8);
    // Stopped early: of the 3 listed, one synced and one failed; one was never reached.
    expect(f.conversations).toMatchObject({ failed: 1, synced: 1, notSynced: 1 });
  });

  it('minimumRequests: a listing costs at least one request; each conversation at least one', () => {
    expect(minimumRequests('workspace', 0, [])).toBe(1);
    expect(minimumRequests('workspace', 201, [0, 100, 101])).toBe(3 + 1 + 1 + 2);
    expect(minimumRequests('conversations', 0, [250])).toBe(3);
  });
});

describe('failure records', () => {
  it('keep the code, and for an HTTP failure its status and attempts', () => {
    const http = new HttpError('GET /x answered 503', { method: 'GET', path: '/x', status: 503, attempts: 4 });
    expect(failureRecord({ id: 'a', error: http })).toEqual({ id: 'a', code: 'HTTP_ERROR', status: 503, attempts: 4, message: 'GET /x answered 503' });
    expect(failureRecord({ id: 'b', error: new SchemaError('bad shape', {}) })).toEqual({ id: 'b', code: 'SCHEMA_ERROR', status: null, attempts: null, message: 'bad shape' });
    expect(failureRecord({ id: 'c', error: new Error('boom') })).toMatchObject({ code: 'ERROR', status: null });
  });

  it('a failure known only by its job message ([CODE] message) keeps its code', () => {
    expect(parseFailureMessage('a', failureMessage('SCHEMA_ERROR', 'bad\nshape'))).toEqual({ id: 'a', code: 'SCHEMA_ERROR', status: null, attempts: null, message: 'bad\nshape' });
    expect(parseFailureMessage('b', 'something else')).toEqual({ id: 'b', code: 'ERROR', status: null, attempts: null, message: 'something else' });
  });
});
