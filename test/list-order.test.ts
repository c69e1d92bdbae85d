/**
 * Listings that stop early: the order of the conversation list by its change signal (the pure
 * tracker), recorded by complete listings; an incremental listing of an ordered list stops once
 * past what changed (new and bumped conversations still found); a disorder turns it off; a
 * conversation deleted deep in the list is tombstoned by the next full refresh. Real HTTP to the
 * fake, real SQLite.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { OrderTracker, compareSignals } from '../src/sync/list-order.js';
import { ACCOUNT_ID, harnessPool, mirrorEqualsFake, type Harness, type HarnessOptions } from './helpers.js';
import { sqlGet } from './sql.js';
import { testClock } from './clock.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());
const start = (opts: HarnessOptions): Promise<Harness> => pool.start(opts);

const at = (n: number) => new Date(Date.UTC(2026, 0, 1) + n * 60_000).toISOString();
const conv = (id: string, t: string | number | undefined) => (t === undefined ? { id } : { id, last_activity_at: t });

describe('OrderTracker', () => {
  it('follows a list newest first (ties allowed), names the first disorder, counts pages older than the threshold', () => {
    const t = new OrderTracker('last_activity_at', at(50));
    t.observe([conv('a', at(90)), conv('b', at(60)), conv('c', at(60))]);
    expect([t.ordered, t.newest, t.olderPages]).toEqual([true, at(90), 0]);
    t.observe([conv('d', at(49)), conv('e', at(10))]);
    expect(t.olderPages).toBe(1);
    t.observe([conv('f', at(5))]);
    expect(t.olderPages).toBe(2);
    t.observe([conv('g', at(7))]);
    expect([t.ordered, t.why, t.olderPages]).toEqual([false, `conversation g (last_activity_at ${at(7)}) comes after f (${at(5)})`, 0]);
  });

  it('a conversation without the field, or signals that cannot be compared, is a disorder; an equal signal is not older', () => {
    const missing = new OrderTracker('last_activity_at');
    missing.observe([conv('a', at(2)), conv('b', undefined)]);
    expect([missing.ordered, missing.why]).toEqual([false, 'conversation b serves no last_activity_at']);
    const mixed = new OrderTracker('last_activity_at');
    mixed.observe([conv('a', 5), conv('b', at(1))]);
    expect(mixed.ordered).toBe(false);
    const tie = new OrderTracker('last_activity_at', at(3));
    tie.observe([conv('a', at(3))]);
    expect(tie.olderPages).toBe(0);
  });

  it('compares numbers numerically and times by instant, whatever their offsets', () => {
    expect(compareSignals(10, 9)).toBeGreaterThan(0);
    expect(compareSignals('2026-01-01T10:00:00+02:00', '2026-01-01T09:00:00Z')).toBeLessThan(0);
    expect(compareSignals('2026-01-01T09:00:00Z', '2026-01-01T09:00:00.000Z')).toBeGreaterThan(0); // same instant: by text
    expect(compareSignals(1, 'x')).toBeUndefined();
  });
});

/** A workspace of `n` conversations (1 message each) listed newest activity first. */
function orderedWorkspace(n: number): FakeWorkspace {
  const ws = FakeWorkspace.fromCounts(Array.from({ length: n }, () => 1), 5);
  ws.reverse();
  return ws;
}

const listRequests = (h: Harness, from: number) => h.fake.requests.slice(from).filter((r) => r.path === '/v1/conversations').length;

describe('incremental listings of an ordered list stop early', () => {
  it('a complete listing records the order; then new and bumped conversations are found in 3 list pages of 10', async () => {
    const ws = orderedWorkspace(1000);
    const h = await start({ workspace: ws });
    await h.sync();
    const order = (await h.mirror.listOrder(ACCOUNT_ID))!;
    expect(order).toMatchObject({ field: 'last_activity_at', ordered: true, newest: ws.list()[0]!.data['last_activity_at'] });
    const list = ws.list();
    for (const i of [3, 400, 950]) {
      ws.appendMessages(list[i]!.id, 2);
      ws.moveToFront(list[i]!.id);
    }
    const added = ws.addConversation(3, 'front');
    const before = h.fake.requests.length;
    const s = await h.sync();
    expect(listRequests(h, before)).toBe(3);
    expect(s.listConfirmed).toBe(true);
    expect(s.messages.inserted).toBe(2 * 3 + 3);
    expect(await h.mirror.hasConversation(ACCOUNT_ID, added.id)).toBe(true);
    const eq = mirrorEqualsFake(h.mirror, ws);
    expect(eq.ok, eq.detail).toBe(true);
    // one list request per page read, and the crawls of the four that changed: nothing else
    expect(h.fake.requests.length - before).toBe(3 + 4);
  });

  it('a conversation deleted deep in the list is left by the stopped listing and tombstoned by the next --full, which reads every page', async () => {
    const ws = orderedWorkspace(1000);
    const h = await start({ workspace: ws });
    await h.sync();
    const deep = ws.list()[700]!;
    ws.deleteConversation(deep.id);
    ws.appendMessages(ws.list()[0]!.id, 1);
    await h.sync();
    expect(sqlGet(h.mirror, `SELECT deleted_at FROM conversations WHERE id = ?`, deep.id)).toEqual({ deleted_at: null });
    const before = h.fake.requests.length;
    const full = await h.sync({ full: true });
    expect(listRequests(h, before)).toBe(2 * 10); // two passes of every page
    expect(full.conversations.deleted).toBe(1);
    expect(sqlGet<{ deleted_at: string | null }>(h.mirror, `SELECT deleted_at FROM conversations WHERE id = ?`, deep.id)!.deleted_at).not.toBeNull();
    expect((await h.mirror.listOrder(ACCOUNT_ID))!.ordered).toBe(true);
  });

  it('a conversation whose crawl failed, deep in the list, is asked about again by the next (stopped) listing', async () => {
    const ws = orderedWorkspace(1000);
    const h = await start({ workspace: ws, client: { maxRetries: 1 } });
    const deep = ws.list()[600]!;
    h.fake.injectFault({ kind: 'status', status: 503, match: { path: `/v1/conversations/${deep.id}/messages` }, times: Infinity });
    const first = await h.sync();
    expect(first.failures.map((f) => f.id)).toEqual([deep.id]);
    expect((await h.mirror.listOrder(ACCOUNT_ID))!.ordered).toBe(true);
    h.fake.clearFaults();
    const before = h.fake.requests.length;
    const second = await h.sync();
    expect(listRequests(h, before)).toBe(3); // page 1 holds the newest (not older), pages 2 and 3 are older
    // the only messages request is the one for the conversation that failed: the rest were skipped on their signal
    expect(h.fake.requests.slice(before).filter((r) => r.path.endsWith('/messages')).map((r) => r.path)).toEqual([`/v1/conversations/${deep.id}/messages`]);
    expect(second.failures).toEqual([]);
    expect(h.fake.requests.slice(before).filter((r) => r.path === `/v1/conversations/${deep.id}/messages`)).toHaveLength(1);
    const eq = mirrorEqualsFake(h.mirror, ws);
    expect(eq.ok, eq.detail).toBe(true);
  });

  it('a list that stops being sorted turns it off (the listing reads every page and says why), and a sorted complete listing turns it on again', async () => {
    const ws = orderedWorkspace(500);
    const h = await start({ workspace: ws });
    await h.sync();
    ws.reverse(); // oldest first now
    const before = h.fake.requests.length;
    await h.sync();
    expect(listRequests(h, before)).toBe(5);
    const off = (await h.mirror.listOrder(ACCOUNT_ID))!;
    expect(off.ordered).toBe(false);
    expect(off.why).toMatch(/^conversation \S+ \(last_activity_at .*\) comes after \S+ \(.*\)$/);
    ws.reverse(); // newest first again
    const before2 = h.fake.requests.length;
    await h.sync();
    expect(listRequests(h, before2)).toBe(5); // off: every page, which finds the list sorted again
    expect((await h.mirror.listOrder(ACCOUNT_ID))!.ordered).toBe(true);
    const before3 = h.fake.requests.length;
    ws.appendMessages(ws.list()[1]!.id, 1);
    ws.moveToFront(ws.list()[1]!.id);
    await h.sync();
    expect(listRequests(h, before3)).toBe(3);
    const eq = mirrorEqualsFake(h.mirror, ws);
    expect(eq.ok, eq.detail).toBe(true);
  });

  it('a list ordered by a count (messages_count) never stops early: a count that grew can still be below the largest', async () => {
    // 100 conversations of 3 messages, then 500 of 1: ordered by messages_count, descending.
    const ws = FakeWorkspace.fromCounts([...Array.from({ length: 100 }, () => 3), ...Array.from({ length: 500 }, () => 1)], 9);
    const h = await start({ workspace: ws });
    await h.sync({ changeFieldSetting: 'messages_count' });
    expect(await h.mirror.listOrder(ACCOUNT_ID)).toMatchObject({ field: 'messages_count', ordered: true, newest: 3 });
    // Deep in the list, a conversation grows from 1 to 2 messages: still below 3, and not moved.
    const deep = ws.list()[550]!;
    ws.appendMessages(deep.id, 1);
    const before = h.fake.requests.length;
    const s = await h.sync({ changeFieldSetting: 'messages_count' });
    expect(listRequests(h, before)).toBe(6);
    expect(s.messages.inserted).toBe(1);
    const eq = mirrorEqualsFake(h.mirror, ws);
    expect(eq.ok, eq.detail).toBe(true);
  });

  it('a signal later than the listing itself (a bogus future date) is not taken as the threshold: at most the time the listing began', async () => {
    const ws = orderedWorkspace(400);
    ws.list()[0]!.data['last_activity_at'] = '2999-01-01T00:00:00.000Z';
    const t0 = Date.UTC(2026, 0, 15, 12);
    const clock = testClock({ start: t0, sleep: 'advance' });
    const h = await start({ workspace: ws, clock });
    await h.sync();
    const order = (await h.mirror.listOrder(ACCOUNT_ID))!;
    expect(order.ordered).toBe(true);
    expect(Date.parse(String(order.newest))).toBeGreaterThanOrEqual(t0);
    expect(Date.parse(String(order.newest))).toBeLessThanOrEqual(clock.now());
  });

  it('without a change signal nothing is recorded and every page is read', async () => {
    const ws = orderedWorkspace(300);
    const h = await start({ workspace: ws });
    await h.sync({ changeFieldSetting: 'none' });
    expect(await h.mirror.listOrder(ACCOUNT_ID)).toBeUndefined();
    const before = h.fake.requests.length;
    await h.sync({ changeFieldSetting: 'none' });
    expect(listRequests(h, before)).toBe(3);
  });
});
