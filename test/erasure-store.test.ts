/**
 * Erasure, the mirror side (issue 26, item 2), on each engine of the store (the conformance suite:
 * test/engines.ts): `Mirror.eraseSubject` by sender and by conversation redacts the subject's
 * messages, their history and the change payloads not yet published (a planned batch counts as
 * published), records an `erasures` row, appends no change-log row; a dry run counts the same and
 * changes nothing; pages committed later (a sync against the fake, which still serves the subject)
 * redact as they arrive; and no byte of the erased content is left in the SQLite file (after a
 * VACUUM) nor in any PostgreSQL table.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { StoreError } from '../src/errors.js';
import { publishChanges } from '../src/export/exporter.js';
import { FakeWorkspace, type FakeMessage } from '../src/fake-api/index.js';
import type { Mirror } from '../src/store/mirror.js';
import { PostgresMirror, type PostgresHooks } from '../src/store/postgres/mirror.js';
import { conversationNamesSender, redactedConversation, redactedMessage, redactionOf } from '../src/store/redaction.js';
import { testClock } from './clock.js';
import { engines } from './engines.js';
import { ACCOUNT_ID, harnessPool, readExportLines, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import { changeRows, historyRows, maxSeq, records } from './mirror-reads.js';
import { advisoryWaiter64, dropSchema, pgQuery, pgUrl, randomSchema, until } from './pg.js';
import { erasureGateKey } from '../src/store/postgres/locks.js';
import { connectionOf } from './sql.js';

const A = ACCOUNT_ID;
/** The erased customer, and another sender who stays. */
const S = 'cus_erase_me';
const T = 'usr_keeps';
/** Distinctive texts of the subject's, found nowhere else. */
const SECRET = ['Quokka-Zebra-7731 card 4111', 'Quokka-Zebra-8842 new address', 'Quokka-Zebra-9953 phone'] as const;
const NAME = 'Ms Xanthippe Erasable';

const t0 = Date.UTC(2026, 2, 1, 9);
const at = (minute: number): string => new Date(t0 + minute * 60_000).toISOString();

type Msg = { id: string; content: string; visibility: string; sender: { id: string; name: string; type: string }; attachments?: unknown[]; created_at: string };
const msg = (id: string, sender: string, content: string, minute: number, attachments?: unknown[]): Msg => ({
  id,
  content,
  visibility: 'global',
  sender: sender === S ? { id: S, name: NAME, type: 'Customer' } : { id: sender, name: 'Dana Lee', type: 'User' },
  ...(attachments ? { attachments } : {}),
  created_at: at(minute),
});
const messagesPage = (objs: Msg[], page = 1): Page<Message> => ({
  page,
  data: objs as unknown as Message[],
  raw: objs as unknown as Record<string, unknown>[],
  meta: { current_page: page, total_pages: 1, total_count: objs.length },
});
const conversationsPage = (objs: Record<string, unknown>[]): Page<Conversation> => ({
  page: 1,
  data: objs as unknown as Conversation[],
  raw: objs,
  meta: { current_page: 1, total_pages: 1, total_count: objs.length },
});

/** Everything of a mirror an erasure may change (the export state aside). */
async function state(m: Mirror) {
  return {
    messages: await records(m, 'messages'),
    conversations: await records(m, 'conversations'),
    history: await historyRows(m),
    changes: await changeRows(m),
    erasures: await m.erasures(),
    counts: await m.counts(),
  };
}

/** The stored record of a message (`raw`), by id. */
async function rawOf(m: Mirror, id: string): Promise<string | null | undefined> {
  return (await records(m, 'messages')).find((r) => r.id === id)?.raw;
}

/** The payload of each change of `recordId` (null once published and pruned), by seq. */
async function payloadsOf(m: Mirror, recordId: string): Promise<{ seq: number; op: string; record: string | null }[]> {
  return (await changeRows(m)).filter((c) => c.record_id === recordId).map((c) => ({ seq: c.seq, op: c.op, record: c.record }));
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());

  /**
   * A mirror with two conversations:
   * - c1: m1 (S, SECRET[0], then edited to SECRET[1]), m2 (T), m3 (S, an attachment); published
   *   before the edit (m1's and m3's insert lines are in the export files);
   * - c2: m4 (S, SECRET[2]), m5 (T): committed after the publication, then a batch is planned over
   *   them and not published (its range counts as published: left to the archive step);
   * - c3: m6 (S), committed after that plan: unpublished.
   */
  async function scenario(): Promise<{ m: Mirror; exportDir: string; clock: ReturnType<typeof testClock> }> {
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    const exportDir = path.join(tempDir('convo-mirror-erasure-'), 'exports');
    await m.upsertConversations(A, conversationsPage([{ id: 'c1', status: 'open', contact: { id: S } }, { id: 'c2', status: 'open' }]), null);
    await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, SECRET[0], 1), msg('m2', T, 'Thanks, we will look into it', 2), msg('m3', S, 'see attached', 3, [{ id: 7, file_name: 'passport.png' }])]), null);
    await m.completeCrawl(A, 'c1', null);
    await publishChanges(m, { exportDir, clock });
    clock.advance(60_000);
    await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, SECRET[1], 1), msg('m2', T, 'Thanks, we will look into it', 2), msg('m3', S, 'see attached', 3, [{ id: 7, file_name: 'passport.png' }])]), null);
    await m.commitMessagesPage(A, 'c2', messagesPage([msg('m4', S, SECRET[2], 4), msg('m5', T, 'Anything else?', 5)]), null);
    const planned = await m.planExportBatch(null, at(10));
    expect(planned).toBeDefined();
    clock.advance(60_000);
    await m.commitMessagesPage(A, 'c3', messagesPage([msg('m6', S, 'one more thing', 6)]), null);
    return { m, exportDir, clock };
  }

  describe('by sender', () => {
    it('redacts the messages, history and unpublished payloads of the sender (not those published or planned), records the erasure, appends no change', async () => {
      const { m } = await scenario();
      const watermark = await m.exportWatermark();
      const planned = (await changeRows(m)).filter((c) => c.record_id === 'm5')[0]!.seq; // the planned batch's last change
      const before = await state(m);
      const seqBefore = await maxSeq(m);
      const m1Versions = before.history.filter((h) => h.id === 'm1').map((h) => h.raw);
      expect(m1Versions).toHaveLength(1);
      expect(m1Versions[0]).toContain(SECRET[0]);

      const r = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-4711' });
      // m1 m3 m4 m6 (every row); m1's superseded version; of the payloads: m1's update and m4's
      // insert are in the planned batch (left), m6's insert and c3's stand-in are not: m6's only;
      // c1, whose contact is the sender (its row), and c1's published insert line.
      expect(r).toEqual({ erasureId: 1, dryRun: false, publishedThroughSeq: planned, messages: 4, history: 1, pendingChanges: 1, conversations: 1, publishedLines: 5 });
      expect(planned).toBeGreaterThan(watermark);

      const rows = new Map((await records(m, 'messages')).map((x) => [x.id, x]));
      const marker = (id: string, minute: number) => `{"id":"${id}","created_at":"${at(minute)}","redacted":{"erasure":1}}`;
      expect(rows.get('m1')!.raw).toBe(marker('m1', 1));
      expect(rows.get('m3')!.raw).toBe(marker('m3', 3));
      expect(rows.get('m4')!.raw).toBe(marker('m4', 4));
      expect(rows.get('m6')!.raw).toBe(marker('m6', 6));
      // Keys and positions kept; the other sender's messages untouched.
      expect([...rows.values()].map((x) => [x.conversation_id, x.id, x.deleted])).toEqual(before.messages.map((x) => [x.conversation_id, x.id, x.deleted]));
      for (const id of ['m2', 'm5']) expect(rows.get(id)!.raw).toBe(before.messages.find((x) => x.id === id)!.raw);
      expect(await m.messageIdAt(A, 'c1', 2)).toBe('m3');
      expect((await historyRows(m)).map((h) => [h.seq, h.id, h.raw])).toEqual(before.history.map((h) => [h.seq, h.id, marker('m1', 1)]));

      // Payloads: above the planned batch redacted; in it (and published, pruned) left alone.
      expect(await payloadsOf(m, 'm6')).toEqual([{ seq: expect.any(Number), op: 'insert', record: marker('m6', 6) }]);
      const m1 = await payloadsOf(m, 'm1');
      expect(m1.map((p) => p.op)).toEqual(['insert', 'update']);
      expect(m1[1]!.record).toContain(SECRET[1]);
      expect((await payloadsOf(m, 'm4'))[0]!.record).toContain(SECRET[2]);
      // c1 names the sender (its contact): its object is redacted; the others stay.
      const convs = await records(m, 'conversations');
      expect(convs.map((c) => [c.id, c.raw])).toEqual(before.conversations.map((c) => [c.id, c.id === 'c1' ? redactedConversation('c1', 1) : c.raw]));

      // No change-log row appended; the erasure recorded.
      expect(await maxSeq(m)).toBe(seqBefore);
      expect(await m.erasures()).toEqual([
        {
          id: 1,
          kind: 'sender',
          accountId: A,
          subject: S,
          reason: 'TICKET-4711',
          requestedAt: at(2),
          messages: 4,
          history: 1,
          pendingChanges: 1,
          conversations: 1,
          publishedLines: 5,
          publishedThroughSeq: planned,
          archiveBatchId: null,
          archiveDoneAt: null,
        },
      ]);
      expect(await m.counts()).toMatchObject({ erasures: 1, messages_erased: 4, conversations_erased: 1, change_log: before.counts.change_log });
      const c1 = (await m.listConversations({ accountIds: [A] })).rows.find((c) => c.id === 'c1')!;
      expect(c1).toMatchObject({ messages: 3, erasedMessages: 2, erased: true });

      // Erasing again redacts nothing new: a second row, zero counts, the same published lines.
      const again = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-4712 (duplicate)' });
      expect(again).toEqual({ erasureId: 2, dryRun: false, publishedThroughSeq: planned, messages: 0, history: 0, pendingChanges: 0, conversations: 0, publishedLines: 5 });
      expect((await records(m, 'messages')).map((x) => x.raw)).toEqual([...rows.values()].map((x) => x.raw));
      expect((await records(m, 'conversations')).map((x) => x.raw)).toEqual(convs.map((x) => x.raw));
      expect((await m.erasures()).map((e) => [e.id, e.reason])).toEqual([
        [1, 'TICKET-4711'],
        [2, 'TICKET-4712 (duplicate)'],
      ]);
    });

    it('a dry run counts what the erasure then does, and changes nothing', async () => {
      const { m } = await scenario();
      const before = await state(m);
      const dry = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-1', dryRun: true });
      expect(dry.erasureId).toBeUndefined();
      expect(dry.dryRun).toBe(true);
      expect(await state(m)).toEqual(before);
      const real = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-1' });
      const { erasureId: _a, dryRun: _b, ...dryCounts } = dry;
      const { erasureId: _c, dryRun: _d, ...realCounts } = real;
      expect(dryCounts).toEqual(realCounts);
      expect(realCounts.messages).toBeGreaterThan(0);
      // After the erasure, a dry run finds nothing left to redact (the published lines remain the archive step's).
      expect(await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-1', dryRun: true })).toMatchObject({ messages: 0, history: 0, pendingChanges: 0, publishedLines: real.publishedLines });
    });

    it('refuses an empty reason or subject and an unknown kind before reading anything', async () => {
      const m = await engine.open();
      for (const bad of [
        { kind: 'sender' as const, accountId: A, subject: S, reason: '  ' },
        { kind: 'sender' as const, accountId: A, subject: '', reason: 'T-1' },
        { kind: 'customer' as 'sender', accountId: A, subject: S, reason: 'T-1' },
      ]) {
        const err = await m.eraseSubject(bad).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(StoreError);
        expect((err as StoreError).code).toBe('ERASURE_INVALID');
      }
      expect(await m.erasures()).toEqual([]);
    });

    it('records when the archive step finished, once', async () => {
      const m = await engine.open();
      const { erasureId } = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'T-1' });
      expect(erasureId).toBe(1);
      expect(await m.recordErasureArchived(1, at(30))).toBe(true);
      expect(await m.recordErasureArchived(1, at(31))).toBe(false);
      expect((await m.erasures())[0]!.archiveDoneAt).toBe(at(30));
      const err = await m.recordErasureArchived(9, at(32)).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((err as StoreError).code).toBe('ERASURE_UNKNOWN');
    });
  });

  describe('by sender: the conversations naming the sender', () => {
    /** A conversation object naming `who` as its contact. */
    const contact = (id: string, who: string, more: Record<string, unknown> = {}) => ({ id, status: 'open', contact: { id: who, name: who === S ? NAME : 'Olga Other' }, ...more });

    it('redacts each conversation naming the sender (a string value at any depth; not a key, not a substring) and its unpublished payloads, counted; the others stay; erasing again redacts nothing new and still finds the lines', async () => {
      const clock = testClock({ start: t0 });
      const m = await engine.open({ clock });
      const exportDir = path.join(tempDir('convo-mirror-erasure-convs-'), 'exports');
      // Published: cA (contact), cB (another contact), cC (deep in an array), cD (only a key, a substring).
      await m.upsertConversations(
        A,
        conversationsPage([
          contact('cA', S),
          contact('cB', 'cus_other'),
          { id: 'cC', status: 'open', participants: [{ roles: ['watcher'], refs: [7, { who: S }] }] },
          { id: 'cD', status: 'open', contact: { id: `${S}_2`, name: 'Olga Other' }, note: `about ${S}`, [S]: 'a key, not a value' },
        ]),
        null,
      );
      await publishChanges(m, { exportDir, clock });
      const watermark = await m.exportWatermark();
      clock.advance(60_000);
      // Unpublished: cA listed again; cE new; cF named, then listed with another contact (its row no longer names S).
      await m.upsertConversations(A, conversationsPage([contact('cA', S, { status: 'resolved' }), contact('cE', S), contact('cF', S)]), null);
      await m.upsertConversations(A, conversationsPage([contact('cF', 'cus_other')]), null);
      // cG: named, then tombstoned (its delete line carries its last object).
      await m.upsertConversations(A, conversationsPage([contact('cG', S)]), null);
      await m.tombstoneConversation(A, 'cG', null);
      const before = await state(m);
      const seqBefore = await maxSeq(m);
      const convLines = (ids: string[], through: number) =>
        before.changes.filter((c) => c.stream === 'conversations' && c.seq <= through && ids.includes(c.record_id)).map((c) => ({ seq: c.seq, stream: 'conversations' }));
      const sender = { kind: 'sender' as const, accountId: A, subject: S };
      expect(await m.subjectLines(sender, watermark)).toEqual(convLines(['cA', 'cC'], watermark));

      const dry = await m.eraseSubject({ ...sender, reason: 'DSR-1', dryRun: true });
      expect(await state(m)).toEqual(before);
      const r = await m.eraseSubject({ ...sender, reason: 'DSR-1' });
      // Rows: cA cC cE cF cG (tombstoned). Unpublished payloads: cA's update, cE's insert, cF's
      // insert and update, cG's insert and delete. Published lines: cA's and cC's inserts.
      expect(r).toEqual({ erasureId: 1, dryRun: false, publishedThroughSeq: watermark, messages: 0, history: 0, pendingChanges: 6, conversations: 5, publishedLines: 2 });
      expect({ ...dry, erasureId: 1, dryRun: false }).toEqual(r);
      const rows = new Map((await records(m, 'conversations')).map((c) => [c.id, c.raw]));
      for (const id of ['cA', 'cC', 'cE', 'cF', 'cG']) expect(rows.get(id), id).toBe(redactedConversation(id, 1));
      expect((await records(m, 'conversations')).find((c) => c.id === 'cG')!.deleted).not.toBe(0);
      for (const id of ['cB', 'cD']) expect(rows.get(id), id).toBe(before.conversations.find((c) => c.id === id)!.raw);
      const pending = (await changeRows(m)).filter((c) => c.seq > watermark);
      expect(pending.map((c) => [c.record_id, c.op, c.record])).toEqual([
        ['cA', 'update', redactedConversation('cA', 1)],
        ['cE', 'insert', redactedConversation('cE', 1)],
        ['cF', 'insert', redactedConversation('cF', 1)],
        ['cF', 'update', redactedConversation('cF', 1)],
        ['cG', 'insert', redactedConversation('cG', 1)],
        ['cG', 'delete', redactedConversation('cG', 1)],
      ]);
      expect(await maxSeq(m)).toBe(seqBefore);
      expect(await m.counts()).toMatchObject({ conversations_erased: 5, messages_erased: 0 });
      expect((await m.listConversations({ accountIds: [A], includeDeleted: true })).rows.filter((c) => c.erased).map((c) => c.id).sort()).toEqual(['cA', 'cC', 'cE', 'cF', 'cG']);
      // The published lines of the sender's conversations, found by their markers now; the unpublished ones above.
      expect(await m.subjectLines(sender, watermark)).toEqual(convLines(['cA', 'cC'], watermark));
      expect(await m.subjectLines(sender, Number.MAX_SAFE_INTEGER)).toEqual(convLines(['cA', 'cC', 'cE', 'cF', 'cG'], Number.MAX_SAFE_INTEGER));

      // Erasing again: nothing new, the same published lines.
      const again = await m.eraseSubject({ ...sender, reason: 'DSR-2' });
      expect(again).toEqual({ erasureId: 2, dryRun: false, publishedThroughSeq: watermark, messages: 0, history: 0, pendingChanges: 0, conversations: 0, publishedLines: 2 });
      expect(new Map((await records(m, 'conversations')).map((c) => [c.id, c.raw]))).toEqual(rows);
      expect(await m.subjectLines(sender, watermark)).toEqual(convLines(['cA', 'cC'], watermark));
      // Another sender's erasure does not take the first sender's conversations.
      expect(await m.eraseSubject({ kind: 'sender', accountId: A, subject: 'cus_nobody', reason: 'DSR-3' })).toMatchObject({ conversations: 0, pendingChanges: 0, publishedLines: 0 });
    });

    it('a listing served after the erasure arrives redacted: the erased conversation unchanged (no change line), a new one naming the sender as its marker, with the lowest erasure covering it', async () => {
      const m = await engine.open({ clock: testClock({ start: t0 }) });
      await m.upsertConversations(A, conversationsPage([contact('cA', S), contact('cB', 'cus_other')]), null);
      await m.eraseSubject({ kind: 'conversation', accountId: A, subject: 'cX', reason: 'DSR-1' }); // never mirrored
      await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'DSR-2' });
      await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'DSR-3' });
      expect((await records(m, 'conversations')).find((c) => c.id === 'cA')!.raw).toBe(redactedConversation('cA', 2));
      const seq = await maxSeq(m);
      const served = [contact('cA', S, { status: 'resolved' }), contact('cB', 'cus_other'), contact('cN', S), contact('cX', S), { id: 'cZ', watchers: [[S]] }];
      expect(await m.upsertConversations(A, conversationsPage(served), null)).toEqual({ inserted: 3, updated: 0, unchanged: 2, deleted: 0 });
      // cN and cZ: the sender's erasures (the lowest, 2); cX: its own erasure (1) is lower.
      expect((await changeRows(m)).filter((c) => c.seq > seq).map((c) => [c.op, c.record_id, c.record])).toEqual([
        ['insert', 'cN', redactedConversation('cN', 2)],
        ['insert', 'cX', redactedConversation('cX', 1)],
        ['insert', 'cZ', redactedConversation('cZ', 2)],
      ]);
      const rows = new Map((await records(m, 'conversations')).map((c) => [c.id, c.raw]));
      expect(rows.get('cA')).toBe(redactedConversation('cA', 2));
      expect(rows.get('cB')).toBe(JSON.stringify(contact('cB', 'cus_other')));
    });
  });

  describe('by conversation', () => {
    it("redacts every message of the conversation, their history, its unpublished payloads and the conversation's own object", async () => {
      const { m } = await scenario();
      // c1 again, listed with a new status: an unpublished conversation update.
      await m.upsertConversations(A, conversationsPage([{ id: 'c1', status: 'resolved', contact: { id: S, name: NAME } }]), null);
      const before = await state(m);
      const seqBefore = await maxSeq(m);
      const dry = await m.eraseSubject({ kind: 'conversation', accountId: A, subject: 'c1', reason: 'DSR-9', dryRun: true });
      expect(await state(m)).toEqual(before);
      const r = await m.eraseSubject({ kind: 'conversation', accountId: A, subject: 'c1', reason: 'DSR-9' });
      // m1 m2 m3; m1's version; the conversation's update payload (m1's update is in the planned
      // batch); the conversation row; published (or planned): c1's insert, m1 m2 m3's inserts, m1's update.
      expect(r).toMatchObject({ erasureId: 1, messages: 3, history: 1, pendingChanges: 1, conversations: 1, publishedLines: 5 });
      expect({ ...dry, erasureId: 1, dryRun: false }).toEqual(r);

      const rows = await records(m, 'messages');
      for (const x of rows.filter((x) => x.conversation_id === 'c1')) expect(redactionOf(x.raw)).toBe(1);
      expect(rows.find((x) => x.id === 'm2')!.raw).toBe(`{"id":"m2","created_at":"${at(2)}","redacted":{"erasure":1}}`);
      for (const x of rows.filter((x) => x.conversation_id !== 'c1')) expect(x.raw).toBe(before.messages.find((y) => y.id === x.id)!.raw);
      const convs = await records(m, 'conversations');
      expect(convs.find((c) => c.id === 'c1')!.raw).toBe('{"id":"c1","redacted":{"erasure":1}}');
      expect(convs.find((c) => c.id === 'c2')!.raw).toBe(before.conversations.find((c) => c.id === 'c2')!.raw);
      const c1Changes = (await changeRows(m)).filter((c) => c.stream === 'conversations' && c.record_id === 'c1');
      expect(c1Changes.at(-1)).toMatchObject({ op: 'update', record: '{"id":"c1","redacted":{"erasure":1}}' });
      expect(await maxSeq(m)).toBe(seqBefore);

      expect(await m.counts()).toMatchObject({ erasures: 1, messages_erased: 3, conversations_erased: 1 });
      const listed = (await m.listConversations({ accountIds: [A] })).rows.find((c) => c.id === 'c1')!;
      expect(listed).toMatchObject({ erased: true, erasedMessages: 3, messages: 3, status: null });
      expect((await m.listConversations({ accountIds: [A] })).rows.find((c) => c.id === 'c2')).toMatchObject({ erased: false, erasedMessages: 0 });
    });

    it('a page or listing served again is stored redacted: unchanged rows, no change line; a new message arrives redacted', async () => {
      const { m } = await scenario();
      await m.eraseSubject({ kind: 'conversation', accountId: A, subject: 'c1', reason: 'DSR-9' });
      const before = await state(m);
      const again = await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, SECRET[1], 1), msg('m2', T, 'Thanks, we will look into it', 2), msg('m3', S, 'see attached', 3, [{ id: 7, file_name: 'passport.png' }])]), null);
      expect(again).toEqual({ inserted: 0, updated: 0, unchanged: 3, deleted: 0 });
      expect(await m.upsertConversations(A, conversationsPage([{ id: 'c1', status: 'open', contact: { id: S } }]), null)).toEqual({ inserted: 0, updated: 0, unchanged: 1, deleted: 0 });
      expect(await state(m)).toEqual({ ...before, counts: { ...before.counts, checkpoints: expect.any(Number) } });
      const seq = await maxSeq(m);
      const more = await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, SECRET[1], 1), msg('m2', T, 'x', 2), msg('m3', S, 'see attached', 3), msg('m7', T, 'a new note naming Quokka-Zebra', 7)]), null);
      expect(more).toEqual({ inserted: 1, updated: 0, unchanged: 3, deleted: 0 });
      expect((await changeRows(m)).filter((c) => c.seq > seq).map((c) => [c.op, c.record_id, c.record])).toEqual([['insert', 'm7', `{"id":"m7","created_at":"${at(7)}","redacted":{"erasure":1}}`]]);
      // A conversation erased before it is ever mirrored arrives as its marker, stand-in included.
      await m.eraseSubject({ kind: 'conversation', accountId: A, subject: 'c9', reason: 'DSR-10' });
      await m.commitMessagesPage(A, 'c9', messagesPage([msg('m9', T, 'hello', 9)]), null);
      expect((await records(m, 'conversations')).find((c) => c.id === 'c9')!.raw).toBe(redactedConversation('c9', 2));
      expect(await rawOf(m, 'm9')).toBe(redactedMessage(JSON.stringify(msg('m9', T, 'hello', 9)), 2));
    });
  });

  describe('a sync after an erasure (the fake still serves the subject)', () => {
    const pool = harnessPool();
    afterEach(() => pool.closeAll());
    const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

    it('keeps the erased messages redacted with no change line, and a new message of the sender arrives redacted', async () => {
      const ws = FakeWorkspace.fromCounts([40, 25, 60], 11);
      const clock = testClock({ start: t0, sleep: 'advance' });
      const h = await start({ workspace: ws, clock });
      expect((await h.sync()).status).toBe('succeeded');
      const conv = ws.list()[0]!;
      const customer = conv.messages.find((x) => x.sender.type === 'Customer')!.sender;
      const theirs = ws.list().flatMap((c) => c.messages.filter((x) => x.sender.id === customer.id).map((x) => x.id));
      expect(theirs.length).toBeGreaterThan(1);

      // The fake serves the customer as the conversation's contact (its id and name).
      expect(conv.data.contact).toEqual({ id: customer.id, name: customer.name });
      const convRaw = async () => (await records(h.mirror, 'conversations')).find((c) => c.id === conv.id)!.raw;
      expect(await convRaw()).toContain(customer.name);

      const r = await h.mirror.eraseSubject({ kind: 'sender', accountId: A, subject: customer.id, reason: 'TICKET-1' });
      expect(r.messages).toBe(theirs.length);
      expect(r.conversations).toBe(1);
      expect(await convRaw()).toBe(redactedConversation(conv.id, r.erasureId!));
      const erasedRows = async () => (await records(h.mirror, 'messages')).filter((x) => theirs.includes(x.id)).map((x) => x.raw);
      const redacted = await erasedRows();
      expect(redacted.every((raw) => redactionOf(raw) === r.erasureId)).toBe(true);

      // The sender writes again; the fake serves the old messages as they were, and the new one.
      let added: FakeMessage | undefined;
      let other: FakeMessage | undefined;
      for (let i = 0; i < 100 && !(added && other); i++) {
        const [x] = ws.appendMessages(conv.id, 1);
        if (x!.sender.id === customer.id) added ??= x;
        else other ??= x;
      }
      expect(added).toBeDefined();
      expect(other).toBeDefined();
      const seq = await maxSeq(h.mirror);
      clock.advance(3_600_000);
      for (const full of [false, true]) {
        const s = await h.sync({ full });
        expect(s.status).toBe('succeeded');
      }
      expect(await erasedRows()).toEqual(redacted);
      // The fake still serves the contact (its activity moved on): the listing arrives redacted, no line.
      expect(ws.list()[0]!.data.contact).toEqual({ id: customer.id, name: customer.name });
      expect(await convRaw()).toBe(redactedConversation(conv.id, r.erasureId!));
      expect((await changeRows(h.mirror)).filter((c) => c.seq > seq && c.stream === 'conversations' && c.record_id === conv.id)).toEqual([]);
      const since = (await changeRows(h.mirror)).filter((c) => c.seq > seq && c.stream === 'messages');
      // No line for an erased message; the new message of the sender arrives redacted.
      expect(since.filter((c) => theirs.includes(c.record_id))).toEqual([]);
      expect(since.filter((c) => c.record_id === added!.id).map((c) => c.op)).toEqual(['insert']);
      expect(await rawOf(h.mirror, added!.id)).toBe(redactedMessage(JSON.stringify(added), r.erasureId!));
      // Another sender's new message arrived as served.
      expect(await rawOf(h.mirror, other!.id)).toBe(JSON.stringify(other));
      // The sync published its changes (payloads pruned): its line of the new message carries no content of the sender.
      const lines = readExportLines(h.exportDir, 'messages').filter((l) => l.seq > seq && l.id === added!.id);
      expect(lines).toHaveLength(1);
      expect(lines[0]).not.toHaveProperty('content');
      expect(JSON.stringify(lines[0])).not.toContain(customer.name);
      expect(readExportLines(h.exportDir, 'conversations').filter((l) => l.seq > seq && l.id === conv.id)).toEqual([]);
    });
  });

  describe('no byte left', () => {
    it(engine.name === 'sqlite' ? 'none of the erased content is in the SQLite file after the erasure and a VACUUM' : 'none of the erased content is in any PostgreSQL table of the mirror', async () => {
      const clock = testClock({ start: t0 });
      const target = engine.target();
      const m = await engine.open({ clock }, target);
      const page = (edit: number) =>
        messagesPage([msg('m1', S, `${'long text '.repeat(800)}${SECRET[edit]}`, 1), msg('m2', T, 'Thanks', 2), msg('m3', S, SECRET[2], 3, [{ id: 1, file_name: `${NAME}.pdf` }])]);
      await m.upsertConversations(A, conversationsPage([{ id: 'c1', status: 'open', contact: { id: S, name: NAME } }]), null);
      await m.commitMessagesPage(A, 'c1', page(0), null);
      await m.commitMessagesPage(A, 'c1', page(1), null); // a history version of m1
      await m.upsertConversations(A, conversationsPage([{ id: 'c1', status: 'resolved', contact: { id: S, name: NAME } }]), null); // an update payload
      const needles = [...SECRET, NAME, 'Quokka-Zebra'];
      const found = engine.name === 'sqlite' ? sqliteHolds(m, needles) : postgresHolds(target, needles);
      // The test can fail: before the erasure, every needle is there.
      expect(await found()).toEqual(needles);

      await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-1' });
      expect(await found()).toEqual([]);
      // The reason and the subject's id stay (the erasure's own record).
      expect((await m.erasures())[0]!.subject).toBe(S);
    });
  });
});

/**
 * For a SQLite mirror: a function returning which of `needles` the file (and a `-wal`) holds, after
 * a VACUUM and a truncating checkpoint.
 */
function sqliteHolds(m: Mirror, needles: string[]): () => Promise<string[]> {
  return async () => {
    connectionOf(m).exec('VACUUM');
    connectionOf(m).pragma('wal_checkpoint(TRUNCATE)');
    const file = m.localFile!;
    const bytes = Buffer.concat([fs.readFileSync(file), fs.existsSync(`${file}-wal`) ? fs.readFileSync(`${file}-wal`) : Buffer.alloc(0)]);
    return needles.filter((n) => bytes.includes(Buffer.from(n, 'utf8')));
  };
}

/** For a PostgreSQL mirror: a function returning which of `needles` some row of some table of its schema holds. */
function postgresHolds(target: string, needles: string[]): () => Promise<string[]> {
  const schema = new URL(target).searchParams.get('schema')!;
  return async () => {
    const tables = (await pgQuery<{ t: string }>(`SELECT tablename AS t FROM pg_tables WHERE schemaname = $1`, [schema])).map((r) => r.t);
    const out: string[] = [];
    for (const n of needles) {
      for (const t of tables) {
        const rows = await pgQuery(`SELECT 1 FROM "${schema}"."${t}" x WHERE strpos(x::text, $1) > 0 LIMIT 1`, [n]);
        if (rows.length > 0) {
          out.push(n);
          break;
        }
      }
    }
    return out;
  };
}

describe('conversationNamesSender', () => {
  it('is true for the id as a string value at any depth; false for a key, a substring, another type, text that is not JSON (never throws)', () => {
    expect(conversationNamesSender(JSON.stringify({ id: 'c1', contact: { id: S, name: NAME } }), S)).toBe(true);
    expect(conversationNamesSender(JSON.stringify({ id: 'c1', a: [[{ b: [1, S] }]] }), S)).toBe(true);
    expect(conversationNamesSender(`{"id":"c1","x":"\\u0063us_erase_me"}`, S)).toBe(true);
    expect(conversationNamesSender(JSON.stringify({ id: 'c1', [S]: 1 }), S)).toBe(false);
    expect(conversationNamesSender(JSON.stringify({ id: 'c1', note: `hello ${S}`, other: `${S}x` }), S)).toBe(false);
    expect(conversationNamesSender(JSON.stringify({ id: 'c1', n: 7 }), '7')).toBe(false);
    expect(conversationNamesSender(`{"id":"c1","contact":{"id":${JSON.stringify(S)}`, S)).toBe(false);
    expect(conversationNamesSender(null, S)).toBe(false);
    expect(conversationNamesSender(JSON.stringify(S), S)).toBe(true);
  });
});

// PostgreSQL only: an erasure and a page commit of the same sender in flight at once.
describe('postgres: an erasure waits for a page commit in flight, and pages after it wait for it', () => {
  const schema = randomSchema('erasure');
  let held: { armed: boolean; reached: () => void; release: Promise<void> } | undefined;
  let writer: PostgresMirror;
  let eraser: PostgresMirror;
  beforeAll(async () => {
    const hooks: PostgresHooks = {
      beforeCommit: async () => {
        if (!held?.armed) return;
        held.armed = false;
        held.reached();
        await held.release;
      },
    };
    writer = await PostgresMirror.open(pgUrl(schema), { hooks });
    eraser = await PostgresMirror.open(pgUrl(schema));
  });
  afterAll(async () => {
    await Promise.all([writer?.close(), eraser?.close()]);
    await dropSchema(schema);
  });

  it('a message of the sender committed while the erasure waits is redacted by it', async () => {
    let reached!: () => void;
    const atCommit = new Promise<void>((r) => (reached = r));
    let release!: () => void;
    held = { armed: true, reached, release: new Promise<void>((r) => (release = r)) };
    const commit = writer.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, SECRET[0], 1), msg('m2', T, 'hi', 2)]), null);
    await atCommit; // the page's transaction holds its rows (and the gate, shared), uncommitted
    let settled = false;
    const erasure = eraser.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'TICKET-1' });
    void erasure.finally(() => (settled = true)).catch(() => {});
    // The erasure waits for the gate (were it not to, it would settle first, and miss the page).
    await until(async () => settled || (await advisoryWaiter64(erasureGateKey(schema, A))), 'the erasure waiting for the gate');
    expect(settled).toBe(false);
    release();
    await commit;
    expect(await erasure).toMatchObject({ erasureId: 1, messages: 1, pendingChanges: 1 });
    const rows = await records(writer, 'messages');
    expect(rows.find((r) => r.id === 'm1')!.raw).toBe(`{"id":"m1","created_at":"${at(1)}","redacted":{"erasure":1}}`);
    // A page after it sees the erasure: served again, unchanged.
    expect(await writer.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, SECRET[0], 1), msg('m2', T, 'hi', 2)]), null)).toMatchObject({ unchanged: 2 });
  });
});
