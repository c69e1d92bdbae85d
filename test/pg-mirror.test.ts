/**
 * The PostgreSQL engine's conversations, messages and change log behave as the SQLite engine's:
 * one scenario (listing pages upserted and skipped when unchanged, message pages with edits,
 * moved positions, a repeated id, deletions, a conversation synced by id, a tombstone and a
 * revival, incremental seeds, runs, records jsonb cannot hold) runs against both engines with one
 * clock, and every answer, the change log as the exporter reads it (records byte for byte), the
 * audit reads and the counts must be the same. Plus what only PostgreSQL has: `raw` as jsonb with
 * its derived columns, `raw_text` byte-exact, and a page that is one transaction.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror } from '../src/store/open-mirror.js';
import { PostgresMirror } from '../src/store/postgres/mirror.js';
import { testClock, type TestClock } from './clock.js';
import { dropSchema, pgQuery, pgUrl, randomSchema } from './pg.js';

const schema = randomSchema('mirror');
afterAll(() => dropSchema(schema));

/** The methods the scenario calls: either engine's (SQLite answers at once, PostgreSQL with promises). */
type Awaitable<T> = T | Promise<T>;
type Engine = { [K in keyof PostgresMirror]: PostgresMirror[K] extends (...args: infer A) => Promise<infer R> ? (...args: A) => Awaitable<R> : PostgresMirror[K] } & {
  changesOf(batch: { first_seq: number; last_seq: number }): Iterable<unknown> | AsyncIterable<unknown>;
  auditRecords(table: 'messages' | 'conversations'): Iterable<unknown> | AsyncIterable<unknown>;
  auditHistory(): Iterable<unknown> | AsyncIterable<unknown>;
};

/** Everything of an (async or sync) iterable. */
async function all<T>(it: Iterable<T> | AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

const A = 'acct-1';
const B = 'Acct-2';

/** A listing page of conversations (objects as served). */
function conversations(objs: Record<string, unknown>[], pageNo = 1): Page<Conversation> {
  return { page: pageNo, data: objs as Conversation[], raw: objs, meta: { total_count: objs.length, page: pageNo, per_page: 100, total_pages: 1 } } as unknown as Page<Conversation>;
}

/** A message as served. */
function msg(id: string, content: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { id, content, visibility: 'public', sender: { id: 'u1', name: 'Ann', type: 'agent' }, created_at: '2026-01-15T10:00:00Z', ...extra };
}

/** A message page. */
function messages(objs: Record<string, unknown>[], pageNo = 1, total = objs.length): Page<Message> {
  return { page: pageNo, data: objs as Message[], raw: objs, meta: { total_count: total, page: pageNo, per_page: 100, total_pages: 1 } } as unknown as Page<Message>;
}

/** A checkpoint with its set as a sorted list (comparable). */
const cp = (c: { seenIds: Set<string> } | undefined) => (c ? { ...c, seenIds: [...c.seenIds].sort() } : c);

/**
 * The scenario: every step's answer, in order, then the end state. The clock moves one second
 * before every step, so times are the same on both engines whatever each reads of it.
 */
async function scenario(m: Engine, clock: TestClock, startDeadRun: (run: Parameters<Engine['startRun']>[0]) => Promise<number>): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  const step = async (name: string, f: () => Awaitable<unknown>) => {
    clock.advance(1000);
    out[name] = await f();
  };
  const run = await m.startRun({ scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: A });
  const c1 = { id: 'c1', status: 'open', updated_at: '2026-01-15T09:00:00Z', subject: 'Hello', n: 1e21 };
  const c2 = { id: 'c2', status: 'closed', last_activity_at: '2026-01-14T09:00:00.5+02:00', subject: 'Zürich 🚀' };
  const c3 = { id: 'c3', status: 7, updated_at: 'yesterday' };
  await step('list1', () => m.upsertConversations(A, conversations([c1, c2, c3]), run));
  await step('list1 again', () => m.upsertConversations(A, conversations([c1, c2, c3]), run));
  await step('list2', () => m.upsertConversations(A, conversations([{ ...c1, status: 'pending' }, c2, c1]), run));
  await step('other account', () => m.upsertConversations(B, conversations([{ id: 'c1', status: 'open' }]), run));

  const p1 = [msg('m1', 'first'), msg('m2', 'second', { attachments: [{ name: 'a.png', size: 12 }] }), msg('m3', 'third', { attachments: null })];
  await step('page1', () => m.commitMessagesPage(A, 'c1', messages(p1, 1, 4), run));
  await step('checkpoint1', async () => cp(await m.loadCheckpoint(A, 'c1')));
  await step('page1 again', () => m.commitMessagesPage(A, 'c1', messages(p1, 1, 4), run));
  await step('page2', () => m.commitMessagesPage(A, 'c1', messages([msg('m4', 'fourth \u0000 nul'), msg('m5', 'lone \ud800 surrogate')], 2, 5), run));
  await step('complete1', () => m.completeCrawl(A, 'c1', run, 'updated_at'));
  await step('state1', () => m.crawlState(A, 'c1'));
  // A re-crawl: m1 edited, m2 gone (m3 moves up a position), m4 repeated on the page.
  const p1b = [msg('m1', 'first, edited'), msg('m3', 'third', { attachments: null }), msg('m4', 'fourth \u0000 nul'), msg('m4', 'fourth, edited twice')];
  await step('recrawl', () => m.commitMessagesPage(A, 'c1', messages(p1b, 1, 3), run));
  await step('complete2', () => m.completeCrawl(A, 'c1', run));
  await step('at1', () => m.messageIdAt(A, 'c1', 1));
  await step('seed', () => m.seedIncrementalCrawl(A, 'c1', 2));
  await step('checkpoint2', async () => cp(await m.loadCheckpoint(A, 'c1')));
  await step('reset', () => m.resetCrawl(A, 'c1'));
  // Synced by id, never listed: a stand-in, replaced when listed.
  await step('by id', () => m.commitMessagesPage(A, 'c9', messages([msg('x1', 'hi')]), null));
  await step('list c9', () => m.upsertConversations(A, conversations([{ id: 'c9', status: 'open', updated_at: '2026-01-16T00:00:00Z' }]), run));
  await step('tombstone c2', () => m.tombstoneConversation(A, 'c2', run));
  await step('tombstone again', () => m.tombstoneConversation(A, 'c2', run));
  await step('tombstone c1', () => m.tombstoneConversation(A, 'c1', run));
  await step('revive c1', () => m.upsertConversations(A, conversations([{ ...c1, status: 'pending' }]), run));
  await step('revived state', () => m.crawlState(A, 'c1'));
  await step('page after revival', () => m.commitMessagesPage(A, 'c1', messages([msg('m1', 'first, edited')]), run));
  await step('forget', () => m.forgetCrawlBaseline(A, 'c9'));
  await step('has', async () => [await m.hasConversation(A, 'c2'), await m.hasConversation(A, 'nope')]);
  await step('live ids', () => m.liveConversationIds(A));
  await step('not in', () => m.liveConversationIdsNotIn(A, new Set(['c1'])));
  await step('unsettled', () => m.unsettledConversationIds(A));
  await step('live counts', () => m.liveCounts(A));
  await step('list all', () => m.listConversations());
  await step('list filtered', () => m.listConversations({ accountIds: ['ACCT-1'], statuses: ['pending', '7'], includeDeleted: true }));
  await step('list since', () => m.listConversations({ sinceMs: Date.parse('2026-01-15T00:00:00Z'), limit: 1 }));
  await step('list order', async () => {
    await m.recordListOrder(A, { field: 'updated_at', ordered: true, newest: '2026-01-16T00:00:00Z', at: '2026-01-16T00:00:01.000Z' });
    return m.listOrder(A);
  });
  await step('run changes', () => m.runChanges(run));
  await step('failures', () => m.recordFailures(run, [{ id: 'c3', code: 'HTTP_ERROR', status: 500, attempts: 3, message: 'boom' }]));
  await step('finish', () => m.finishRun(run, { status: 'partial', conversations_failed: 1 }));
  await step('finish again', () => m.finishRun(run, { status: 'partial', conversations_failed: 1 }));
  // A run whose process is gone: SQLite's sweep marks every running run (the writer lock says no
  // other process lives); PostgreSQL's only those whose writer holds no owner lock (test/pg-owners.test.ts).
  const second = await startDeadRun({ scope: 'conversations', refresh: 'incremental', trigger: 'webhook', accountId: A });
  await step('interrupted', () => m.markInterruptedRuns());
  await step('resume', () => m.resumeRun(second));
  await step('statuses', async () => [await m.runStatus(run), await m.runEnded(run), await m.runStatus(second), await m.runStatus(999)]);

  const everything = { first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER };
  out.changes = await all(m.changesOf(everything));
  out.auditMessages = await all(m.auditRecords('messages'));
  out.auditConversations = await all(m.auditRecords('conversations'));
  out.auditHistory = await all(m.auditHistory());
  out.auditRuns = await m.auditRuns();
  out.counts = await m.counts();
  out.pending = await m.pendingExport();
  return out;
}

let sqlite: Mirror;
let postgres: PostgresMirror;
let sqliteOut: Record<string, unknown>;
let postgresOut: Record<string, unknown>;

beforeAll(async () => {
  const start = Date.UTC(2026, 0, 15, 12);
  const c1 = testClock({ start });
  const c2 = testClock({ start });
  sqlite = await openMirror(':memory:', { clock: c1 });
  postgres = await PostgresMirror.open(pgUrl(schema), { clock: c2 });
  sqliteOut = await scenario(sqlite as unknown as Engine, c1, async (run) => sqlite.startRun(run));
  postgresOut = await scenario(postgres as unknown as Engine, c2, async (run) => {
    const gone = await PostgresMirror.open(pgUrl(schema), { clock: c2 });
    try {
      return await gone.startRun(run);
    } finally {
      await gone.close();
    }
  });
});
afterAll(async () => {
  await sqlite?.close();
  await postgres?.close();
});

describe('the PostgreSQL engine answers as the SQLite engine', () => {
  it('step by step', () => {
    const steps = Object.keys(sqliteOut).filter((k) => !['changes', 'auditMessages', 'auditConversations', 'auditHistory', 'auditRuns', 'counts', 'pending'].includes(k));
    expect(steps.length).toBeGreaterThan(40);
    for (const k of steps) expect({ step: k, answer: postgresOut[k] }).toEqual({ step: k, answer: sqliteOut[k] });
  });

  it('the change log, as the exporter reads it, record for record and byte for byte', () => {
    const changes = sqliteOut.changes as { record: string | null }[];
    expect(changes.length).toBeGreaterThan(25);
    expect(postgresOut.changes).toEqual(changes);
  });

  it('the audit reads of verify --deep, the counts and what waits for export', () => {
    for (const k of ['auditMessages', 'auditConversations', 'auditHistory', 'auditRuns', 'counts', 'pending']) {
      expect({ k, v: postgresOut[k] }).toEqual({ k, v: sqliteOut[k] });
    }
    expect((postgresOut.auditHistory as unknown[]).length).toBeGreaterThan(0);
  });
});

describe('what only the PostgreSQL engine has', () => {
  it('raw as jsonb with derived columns, raw_text byte for byte; raw NULL only where jsonb cannot hold the text', async () => {
    const rows = await pgQuery<Record<string, unknown>>(
      `SELECT id, raw_text, raw IS NULL AS no_jsonb, content, visibility, sender_id, sender_name, sender_type, attachments, created_at
       FROM "${schema}".messages WHERE account_id = $1 AND conversation_id = 'c1' ORDER BY id`,
      [A],
    );
    const byId = new Map(rows.map((r) => [r.id as string, r]));
    expect(byId.get('m1')).toMatchObject({ raw_text: JSON.stringify(msg('m1', 'first, edited')), no_jsonb: false, content: 'first, edited', sender_name: 'Ann', sender_type: 'agent', attachments: null, created_at: '2026-01-15T10:00:00Z' });
    expect(byId.get('m2')).toMatchObject({ attachments: [{ name: 'a.png', size: 12 }] });
    expect(byId.get('m4')).toMatchObject({ raw_text: JSON.stringify(msg('m4', 'fourth, edited twice')), no_jsonb: false });
    expect(byId.get('m5')).toMatchObject({ raw_text: JSON.stringify(msg('m5', 'lone \ud800 surrogate')), no_jsonb: true, content: null });
    const c1 = await pgQuery<{ raw_text: string; status: string; n: string }>(
      `SELECT raw_text, raw->>'status' AS status, raw->>'n' AS n FROM "${schema}".conversations WHERE account_id = $1 AND id = 'c1'`,
      [A],
    );
    expect(c1).toEqual([{ raw_text: '{"id":"c1","status":"pending","updated_at":"2026-01-15T09:00:00Z","subject":"Hello","n":1e+21}', status: 'pending', n: '1000000000000000000000' }]);
  });

  it('a page is one transaction: a failure before its commit leaves nothing of it, checkpoint included', async () => {
    const s = randomSchema('pagetx');
    const failing = await PostgresMirror.open(pgUrl(s), {
      hooks: {
        beforeCommit: () => {
          throw new Error('failpoint before commit');
        },
      },
    });
    try {
      await expect(failing.commitMessagesPage(A, 'c1', messages([msg('m1', 'x'), msg('m2', 'y')], 1, 2), null)).rejects.toThrow('failpoint before commit');
      expect(await failing.hasConversation(A, 'c1')).toBe(false);
      expect(await failing.loadCheckpoint(A, 'c1')).toBeUndefined();
      expect(await failing.counts()).toMatchObject({ messages: 0, change_log: 0, checkpoints: 0 });
      expect(await pgQuery(`SELECT last FROM "${s}".change_seq`)).toEqual([{ last: '0' }]);
    } finally {
      await failing.close();
      await dropSchema(s);
    }
  });

  it('pages commit without waiting for the WAL flush; an export plan and a recorded publication wait for it (every change before them durable)', async () => {
    const s = randomSchema('durable');
    const seen: string[] = [];
    const m = await PostgresMirror.open(pgUrl(s), { hooks: { beforeCommit: ({ synchronousCommit }) => void seen.push(synchronousCommit) } });
    try {
      await m.upsertConversations(A, conversations([{ id: 'c1' }]), null);
      await m.commitMessagesPage(A, 'c1', messages([msg('m1', 'x')]), null);
      await m.completeCrawl(A, 'c1', null);
      expect(seen.splice(0)).toEqual(['off', 'off', 'off']);
      const batch = (await m.planExportBatch(null, '2026-01-15T12:00:00.000Z'))!;
      await m.recordPublication(batch, [], { batch_id: batch.id, hash: 'h', prev_hash: null, path: '_ledger/x.json', files: 0, lines: 0, key_id: null }, '2026-01-15T12:00:01.000Z');
      expect(seen).toEqual(['on', 'on']);
    } finally {
      await m.close();
      await dropSchema(s);
    }
  });
});
