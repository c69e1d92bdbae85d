/**
 * The change log on PostgreSQL hands out seqs in COMMIT order with no gap (issue 25, item 2): a
 * transaction that appends changes is held open at its commit (the `beforeCommit` failpoint),
 * while a later page commit from another "process" (another pool) tries to commit and a
 * publisher plans a batch over `(watermark, max(seq)]`. The later commit waits; the publication
 * sees neither; once both commit, the seqs are 1..n, each once, in commit order, and the next
 * batch covers exactly the new ones. A transaction rolled back after taking its seqs gives them
 * back: the next one gets them, no gap.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { PostgresMirror, type PostgresHooks } from '../src/store/postgres/mirror.js';
import { dropSchema, pgQuery, pgUrl, randomSchema, until } from './pg.js';

const ACCOUNT = 'acct';
const schema = randomSchema('order');
afterAll(() => dropSchema(schema));

/** A page of `n` messages of one conversation (ids `<prefix>-<i>`). */
function page(conversationId: string, n: number, pageNo = 1): Page<Message> {
  const data = Array.from({ length: n }, (_, i) => ({
    id: `${conversationId}-m${i}`,
    conversation_id: conversationId,
    content: `message ${i} of ${conversationId}`,
    visibility: 'public',
    sender: { id: 'u1', name: 'Ann', type: 'agent' },
    created_at: `2026-01-01T00:00:0${i}Z`,
  }));
  return { data, raw: data, meta: { total_count: n, page: pageNo, per_page: 100, total_pages: 1 }, page: pageNo } as unknown as Page<Message>;
}

/** A gate a test opens by hand: `wait()` resolves after `open()`. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/** Every change_log row as (seq, record_id), by seq. */
async function logRows(): Promise<{ seq: number; record_id: string }[]> {
  return (await pgQuery<{ seq: string; record_id: string }>(`SELECT seq, record_id FROM "${schema}".change_log ORDER BY seq`)).map((r) => ({ seq: Number(r.seq), record_id: r.record_id }));
}

/** Whether a convo-mirror backend of this schema waits for a lock while moving the change-log counter. */
async function counterWaiter(): Promise<boolean> {
  const rows = await pgQuery(
    `SELECT 1 FROM pg_stat_activity WHERE application_name = 'convo-mirror' AND wait_event_type = 'Lock' AND query LIKE $1`,
    [`%"${schema}"."change_seq"%`],
  );
  return rows.length > 0;
}

let held: { armed: boolean; reached: ReturnType<typeof gate>; release: ReturnType<typeof gate>; fail: boolean };
let writerA: PostgresMirror;
let writerB: PostgresMirror;
let publisher: PostgresMirror;

beforeAll(async () => {
  held = { armed: false, reached: gate(), release: gate(), fail: false };
  const hooks: PostgresHooks = {
    beforeCommit: async () => {
      if (!held.armed) return;
      held.armed = false;
      held.reached.open();
      await held.release.wait;
      if (held.fail) throw new Error('failpoint: rolled back after taking its seqs');
    },
  };
  writerA = await PostgresMirror.open(pgUrl(schema), { hooks });
  writerB = await PostgresMirror.open(pgUrl(schema));
  publisher = await PostgresMirror.open(pgUrl(schema));
});
afterAll(async () => {
  await Promise.all([writerA?.close(), writerB?.close(), publisher?.close()]);
});

describe('change-log seqs on PostgreSQL', () => {
  it('come in commit order with no gap while a transaction commits late, and a publication skips nothing', async () => {
    // Already published: seqs 1..3 (the conversation and two messages).
    await writerB.commitMessagesPage(ACCOUNT, 'c0', page('c0', 2), null);
    const first = await publisher.planExportBatch(null, '2026-01-01T00:00:00.000Z');
    expect(first).toMatchObject({ first_seq: 1, last_seq: 3, resumed: false });
    await publisher.recordPublication(first!, [], { batch_id: first!.id, hash: 'h1', prev_hash: null, path: '_ledger/1.json', files: 0, lines: 0, key_id: null }, '2026-01-01T00:00:01.000Z');

    // A takes seqs 4..7 and is held open at its commit.
    held.armed = true;
    const a = writerA.commitMessagesPage(ACCOUNT, 'cA', page('cA', 3), null);
    await held.reached.wait;

    // B, a later page commit from another pool, does its work and waits for the counter.
    let bDone = false;
    const b = writerB.commitMessagesPage(ACCOUNT, 'cB', page('cB', 2), null).then((r) => {
      bDone = true;
      return r;
    });
    await until(counterWaiter, 'the later commit to wait for the change-log counter');
    expect(bDone).toBe(false);

    // A publication now sees neither transaction: nothing above the published range.
    expect(await publisher.unexportedChanges()).toBe(0);
    expect(await publisher.planExportBatch(null, '2026-01-01T00:00:02.000Z')).toBeUndefined();
    expect((await logRows()).map((r) => r.seq)).toEqual([1, 2, 3]);

    held.release.open();
    expect(await a).toMatchObject({ inserted: 3 });
    expect(await b).toMatchObject({ inserted: 2 });

    // 1..n each once, in commit order: all of A's before all of B's.
    const rows = await logRows();
    expect(rows.map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    expect(rows.slice(3, 7).map((r) => r.record_id)).toEqual(['cA', 'cA-m0', 'cA-m1', 'cA-m2']);
    expect(rows.slice(7).map((r) => r.record_id)).toEqual(['cB', 'cB-m0', 'cB-m1']);
    expect(await pgQuery(`SELECT last FROM "${schema}".change_seq`)).toEqual([{ last: '10' }]);

    // The next batch covers exactly what committed since.
    expect(await publisher.planExportBatch(null, '2026-01-01T00:00:03.000Z')).toMatchObject({ first_seq: 4, last_seq: 10 });
  });

  it('taken by a transaction that rolls back are handed to the next one: no gap', async () => {
    held = { armed: true, reached: gate(), release: gate(), fail: true };
    const a = writerA.commitMessagesPage(ACCOUNT, 'cR', page('cR', 2), null).then(
      () => 'committed',
      (err: Error) => err.message,
    );
    await held.reached.wait;
    const b = writerB.commitMessagesPage(ACCOUNT, 'cS', page('cS', 1), null);
    await until(counterWaiter, 'the next commit to wait for the change-log counter');
    held.release.open();
    expect(await a).toMatch(/failpoint: rolled back/);
    await b;
    const rows = await logRows();
    expect(rows.map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    expect(rows.slice(10).map((r) => r.record_id)).toEqual(['cS', 'cS-m0']);
    // Nothing of the rolled-back page is in the mirror.
    expect(await writerA.hasConversation(ACCOUNT, 'cR')).toBe(false);
    expect(await writerA.quickCheck()).toEqual([]);
  });

  it('a row two writers insert at once: the second runs its transaction again and records what a serial order would (insert, then update)', async () => {
    // A syncs conversation cX by id (a stand-in insert) and is held at its commit; B lists cX
    // meanwhile: its insert waits on A's key, fails with a unique violation once A commits, and
    // B's transaction runs again, now seeing A's row: an update, as if B had come after A.
    held = { armed: true, reached: gate(), release: gate(), fail: false };
    const a = writerA.commitMessagesPage(ACCOUNT, 'cX', page('cX', 1), null);
    await held.reached.wait;
    const listed = [{ id: 'cX', status: 'open' }];
    const listing = { page: 1, data: listed, raw: listed, meta: { total_count: 1, page: 1, per_page: 100, total_pages: 1 } } as unknown as Page<Conversation>;
    const b = writerB.upsertConversations(ACCOUNT, listing, null);
    await until(async () => {
      const rows = await pgQuery(
        `SELECT 1 FROM pg_stat_activity WHERE application_name = 'convo-mirror' AND wait_event_type = 'Lock' AND wait_event = 'transactionid' AND query LIKE $1`,
        [`%INSERT INTO "${schema}"."conversations"%`],
      );
      return rows.length > 0;
    }, 'the listing to wait on the stand-in insert');
    held.release.open();
    await a;
    expect(await b).toEqual({ inserted: 0, updated: 1, unchanged: 0, deleted: 0 });
    const rows = (await logRows()).filter((r) => r.record_id === 'cX');
    expect(rows).toHaveLength(2);
    const ops = await pgQuery<{ op: string; record: string }>(
      `SELECT c.op, p.record FROM "${schema}".change_log c JOIN "${schema}".change_payloads p USING (seq) WHERE c.record_id = 'cX' ORDER BY c.seq`,
    );
    expect(ops).toEqual([
      { op: 'insert', record: '{"id":"cX"}' },
      { op: 'update', record: '{"id":"cX","status":"open"}' },
    ]);
    expect(await writerB.quickCheck()).toEqual([]);
  });
});
