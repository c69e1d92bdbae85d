/**
 * Edges of issue 26's erasures, on each engine: a retention erasure expires messages whose record
 * PostgreSQL's jsonb cannot hold (read from raw_text) with the same counts as SQLite; a sender
 * erasure stubs a published conversation line of an earlier version that named the sender; a
 * sender and a retention erasure over the same messages agree (lowest id, stubs, verify --deep);
 * offsets at the cutoff, tombstones, several accounts, a policy lengthened then shortened; a day's
 * retention erasure is recorded even when nothing expired yet, so old messages synced later that
 * day arrive redacted; and on PostgreSQL, pages in flight wait for the erasure gate.
 */
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { publishChanges } from '../src/export/exporter.js';
import { verifyArchive } from '../src/export/verify.js';
import { redactionOf } from '../src/store/redaction.js';
import { testClock } from './clock.js';
import { engines } from './engines.js';
import { ACCOUNT_ID, readExportLines, tempDir } from './helpers.js';
import { changeRows, historyRows, records } from './mirror-reads.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { parseRetention, type RetentionPolicy } from '../config/retention.js';
import { harnessPool } from './helpers.js';
import { PostgresMirror, type PostgresHooks } from '../src/store/postgres/mirror.js';
import { erasureGateKey } from '../src/store/postgres/locks.js';
import { advisoryWaiter64, dropSchema, pgUrl, randomSchema, until } from './pg.js';

const A = ACCOUNT_ID;
const S = 'cus_edge_subject';
const NAME = 'Ms Edge Subject';
const t0 = Date.UTC(2026, 2, 1, 9);

type Msg = Record<string, unknown>;
const msg = (id: string, content: string, createdAt: string, sender = S): Msg => ({
  id,
  content,
  visibility: 'global',
  sender: { id: sender, name: sender === S ? NAME : 'Dana Lee', type: sender === S ? 'Customer' : 'User' },
  created_at: createdAt,
});
const messagesPage = (objs: Msg[], page = 1): Page<Message> => ({
  page,
  data: objs as unknown as Message[],
  raw: objs,
  meta: { current_page: page, total_pages: 1, total_count: objs.length },
});
const conversationsPage = (objs: Record<string, unknown>[]): Page<Conversation> => ({
  page: 1,
  data: objs as unknown as Conversation[],
  raw: objs,
  meta: { current_page: 1, total_pages: 1, total_count: objs.length },
});

describe.each(engines)('erasure edges: on $name', (engine) => {
  afterEach(() => engine.cleanup());

  it('a retention erasure expires old messages whose record jsonb cannot hold (a \\u0000, a lone surrogate in the content) on every engine, the same counts', async () => {
    // PostgreSQL keeps raw NULL for such a record (raw_text only), so its generated created_at
    // column is NULL: expiredKeys' `created_at < $2` never selects it. SQLite's json_extract reads it.
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', 'old secret \u0000 with a NUL', '2024-01-01T10:00:00.000Z'), msg('m2', 'old plain secret', '2024-01-02T10:00:00.000Z'), msg('m3', 'old secret with a lone \ud800 surrogate', '2024-01-03T10:00:00.000Z')]), null);
    const r = await m.eraseSubject({ kind: 'retention', accountId: A, subject: '2025-01-01', reason: 'retention 1y' });
    expect(r.messages).toBe(3);
    const rows = await records(m, 'messages');
    for (const row of rows) expect(redactionOf(row.raw), row.id).toBe(r.erasureId);
    // And the payload of m1's (unpublished) insert is redacted too.
    for (const c of await changeRows(m)) if (c.stream === 'messages') expect(c.record ?? '').not.toContain('old secret');
  });

  it('an old message jsonb cannot hold, served again after the retention erasure, changes nothing and leaves no unredacted history version', async () => {
    // On PostgreSQL the erasure skipped m1 (above), but the page path redacts it on arrival (it
    // reads the served created_at): the stored full row differs from the marker, so an update is
    // written and the full, expired version is kept in message_history.
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    const page = messagesPage([msg('m1', 'old secret \u0000 with a NUL', '2024-01-01T10:00:00.000Z')]);
    await m.commitMessagesPage(A, 'c1', page, null);
    await m.eraseSubject({ kind: 'retention', accountId: A, subject: '2025-01-01', reason: 'retention 1y' });
    const before = (await changeRows(m)).length;
    clock.advance(60_000);
    await m.commitMessagesPage(A, 'c1', page, null);
    expect((await changeRows(m)).length).toBe(before);
    expect(JSON.stringify(await historyRows(m))).not.toContain('old secret');
  });

  it('a sender erasure stubs a published conversation line that named the sender, even after the conversation stopped naming them', async () => {
    // cQ is published with contact S; its contact then changes and that update is published too
    // (the payloads are pruned once published). The mirror's row no longer names S and no
    // unpublished payload does, so senderConversations never finds cQ: its first published line,
    // holding S's id and name, survives the erasure in the export file.
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    const exportDir = path.join(tempDir('convo-mirror-erasure-edges-'), 'exports');
    await m.upsertConversations(A, conversationsPage([{ id: 'cQ', status: 'open', contact: { id: S, name: NAME } }]), null);
    await publishChanges(m, { exportDir, clock });
    clock.advance(60_000);
    await m.upsertConversations(A, conversationsPage([{ id: 'cQ', status: 'open', contact: { id: 'cus_other', name: 'Olga Other' } }]), null);
    await publishChanges(m, { exportDir, clock });
    clock.advance(60_000);
    await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'DSR-1' });
    const done = await publishChanges(m, { exportDir, clock });
    expect(done.erasures ?? []).not.toEqual([]);
    const text = JSON.stringify(readExportLines(exportDir, 'conversations'));
    expect(text).not.toContain(S);
    expect(text).not.toContain(NAME);
  });
});


const pool = harnessPool();
afterEach(() => pool.closeAll());
const DAY = 86_400_000;
const START = Date.UTC(2025, 5, 1, 12); // messages=200d cuts at 2024-11-13
const prune = (text: string): RetentionPolicy => ({ ...parseRetention(text)!, pruneMirror: true });

describe.each(engines)('erasure edges: end to end on $name', (engine) => {
  afterEach(() => engine.cleanup());

  for (const order of ['sender first', 'retention first'] as const) {
    it(`a sender erasure and a retention erasure over the same messages (${order}): archive, markers and verify --deep agree; nothing of the sender left`, async () => {
      const clock = testClock({ start: START });
      const ws = FakeWorkspace.fromCounts([4, 3]);
      const [c0] = ws.list();
      // c0's messages: two old (June 2024), two recent; the customer's and the team's.
      c0!.messages.forEach((m, i) => (m.created_at = new Date(i < 2 ? Date.UTC(2024, 5, 1 + i) : Date.UTC(2025, 4, 1 + i)).toISOString()));
      const customer = c0!.messages.find((m) => m.sender.type === 'Customer')!.sender;
      const h = await pool.start({ workspace: ws, clock, engine });
      expect((await h.sync()).status).toBe('succeeded');
      const eraseSender = async () => {
        await h.mirror.eraseSubject({ kind: 'sender', accountId: A, subject: customer.id, reason: 'DSR-9' });
        await publishChanges(h.mirror, { exportDir: h.exportDir, clock });
      };
      if (order === 'sender first') await eraseSender();
      await publishChanges(h.mirror, { exportDir: h.exportDir, clock, retention: prune('messages=200d') });
      if (order === 'retention first') await eraseSender();
      expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
      // Each message is the marker of the lowest erasure covering it.
      const es = await h.mirror.erasures();
      const senderId = es.find((e) => e.kind === 'sender')!.id;
      const retentionId = es.find((e) => e.kind === 'retention')?.id;
      const lowest = (m: NonNullable<typeof c0>['messages'][number]) => {
        const ids = [m.sender.id === customer.id ? senderId : undefined, Date.parse(m.created_at) < Date.UTC(2024, 10, 13) ? retentionId : undefined].filter((x): x is number => x !== undefined);
        return ids.length > 0 ? Math.min(...ids) : undefined;
      };
      const rows = new Map((await records(h.mirror, 'messages')).map((r) => [r.id, r.raw]));
      for (const m of c0!.messages) expect(redactionOf(rows.get(m.id) ?? null), m.id).toBe(lowest(m));
      // Served again: nothing changes.
      const n = (await changeRows(h.mirror)).length;
      clock.advance(DAY / 24);
      expect((await h.sync({ full: true, retention: prune('messages=200d') })).status).toBe('succeeded');
      expect((await changeRows(h.mirror)).slice(n).filter((c) => c.stream !== 'runs')).toEqual([]);
      const all = JSON.stringify([...readExportLines(h.exportDir, 'messages'), ...readExportLines(h.exportDir, 'conversations')]);
      expect(all).not.toContain(customer.id);
      expect(all).not.toContain(customer.name);
      expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
    });
  }
});

describe.each(engines)('erasure edges: edges on $name', (engine) => {
  afterEach(() => engine.cleanup());

  it('a retention erasure: offsets at the cutoff, tombstoned messages and their delete payloads; the same on every engine', async () => {
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    await m.commitMessagesPage(
      A,
      'c1',
      messagesPage([
        msg('m1', 'before: +09:00', '2024-11-13T05:00:00+09:00'), // 2024-11-12T20:00Z
        msg('m2', 'after: -05:00', '2024-11-12T20:00:00-05:00'), // 2024-11-13T01:00Z
        msg('m3', 'before: last ms', '2024-11-12T23:59:59.999Z'),
        msg('m4', 'at the cutoff', '2024-11-13T00:00:00Z'),
        msg('m5', 'before: +23:59', '2024-11-13T23:58:00+23:59'), // 2024-11-12T23:59Z
      ]),
      null,
    );
    await m.commitMessagesPage(A, 'c2', messagesPage([msg('m6', 'tombstoned old', '2024-01-01T00:00:00Z')]), null);
    await m.tombstoneConversation(A, 'c2', null);
    const r = await m.eraseSubject({ kind: 'retention', accountId: A, subject: '2024-11-13', reason: 'r' });
    expect(r.messages).toBe(4);
    const rows = new Map((await records(m, 'messages')).map((x) => [x.id, x]));
    expect(['m1', 'm2', 'm3', 'm4', 'm5', 'm6'].map((id) => redactionOf(rows.get(id)!.raw) ?? null)).toEqual([1, null, 1, null, 1, 1]);
    expect(rows.get('m6')!.deleted).not.toBe(0);
    const text = JSON.stringify((await changeRows(m)).filter((c) => c.stream === 'messages').map((c) => c.record));
    for (const s of ['before: +09:00', 'before: last ms', 'before: +23:59', 'tombstoned old']) expect(text).not.toContain(s);
  });
});

describe.each(engines)('erasure edges: verify on $name', (engine) => {
  afterEach(() => engine.cleanup());

  it('a conversation redacted by a sender erasure, then served naming someone else: verify --deep stays clean', async () => {
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    const exportDir = path.join(tempDir('convo-mirror-erasure-edges-'), 'exports');
    await m.upsertConversations(A, conversationsPage([{ id: 'cA', status: 'open', contact: { id: S, name: NAME } }]), null);
    await m.commitMessagesPage(A, 'cA', messagesPage([msg('m1', 'hello from S', '2026-02-01T00:00:00Z')]), null);
    await publishChanges(m, { exportDir, clock });
    clock.advance(60_000);
    await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'DSR-1' });
    await publishChanges(m, { exportDir, clock });
    expect((await verifyArchive({ exportDir, mirror: m, deep: true })).problems).toEqual([]);
    clock.advance(60_000);
    await m.upsertConversations(A, conversationsPage([{ id: 'cA', status: 'open', contact: { id: 'cus_other', name: 'Olga Other' } }]), null);
    await m.commitMessagesPage(A, 'cA', messagesPage([msg('m1', 'hello, now from another sender', '2026-02-01T00:00:00Z', 'usr_other')]), null);
    await publishChanges(m, { exportDir, clock });
    expect((await verifyArchive({ exportDir, mirror: m, deep: true })).problems).toEqual([]);
  });
});

describe.each(engines)('erasure edges: several accounts on $name', (engine) => {
  afterEach(() => engine.cleanup());

  it('--prune-mirror over two accounts: one retention erasure each, archives and verify --deep clean; policy lengthened then shortened', async () => {
    const B = 'acc-b-edges';
    const clock = testClock({ start: START });
    const m = await engine.open({ clock });
    const exportDir = path.join(tempDir('convo-mirror-erasure-edges-'), 'exports');
    await m.commitMessagesPage(A, 'a1', messagesPage([msg('x1', 'A old', '2024-06-01T00:00:00Z'), msg('x2', 'A mid', '2024-12-01T00:00:00Z')]), null);
    await m.commitMessagesPage(B, 'b1', messagesPage([msg('y1', 'B old', '2024-06-02T00:00:00Z'), msg('y2', 'B new', '2025-05-01T00:00:00Z')]), null);
    await publishChanges(m, { exportDir, clock });
    const r = await publishChanges(m, { exportDir, clock, retention: prune('messages=200d') });
    expect(r.pruned?.map((p) => [p.accountId, p.cutoff, p.messages, p.publishedLines]).sort()).toEqual([
      [A, '2024-11-13', 1, 1],
      [B, '2024-11-13', 1, 1],
    ]);
    expect((await verifyArchive({ exportDir, mirror: m, deep: true })).problems).toEqual([]);
    // Lengthened: nothing new; shortened (100d cuts at 2025-02-21): A's x2 expires.
    clock.advance(DAY);
    expect((await publishChanges(m, { exportDir, clock, retention: prune('messages=400d') })).pruned).toBeUndefined();
    const s = await publishChanges(m, { exportDir, clock, retention: prune('messages=100d') });
    expect(s.pruned?.map((p) => [p.accountId, p.messages])).toEqual([[A, 1]]);
    const rows = new Map((await records(m, 'messages')).map((x) => [x.id, redactionOf(x.raw) ?? null]));
    expect([...rows.entries()].sort()).toEqual([
      ['x1', 1],
      ['x2', 3],
      ['y1', 2],
      ['y2', null],
    ]);
    expect((await verifyArchive({ exportDir, mirror: m, deep: true })).problems).toEqual([]);
    const text = JSON.stringify(readExportLines(exportDir, 'messages'));
    for (const t of ['A old', 'A mid', 'B old']) expect(text).not.toContain(t);
  });
});

describe.each(engines)('--prune-mirror later the same day on $name', (engine) => {
  afterEach(() => engine.cleanup());

  it('old messages synced after the day\'s first --prune-mirror pass arrive redacted: the day\'s cutoff is recorded even when nothing had expired', async () => {
    // The first publication of the day finds nothing expired, yet records the day's retention
    // erasure: the old message a later sync of that day brings arrives redacted.
    const clock = testClock({ start: START });
    const m = await engine.open({ clock });
    const exportDir = path.join(tempDir('convo-mirror-erasure-edges-'), 'exports');
    await m.commitMessagesPage(A, 'a1', messagesPage([msg('x1', 'recent', '2025-05-01T00:00:00Z')]), null);
    expect((await publishChanges(m, { exportDir, clock, retention: prune('messages=200d') })).pruned).toBeUndefined();
    clock.advance(3_600_000);
    await m.commitMessagesPage(A, 'a2', messagesPage([msg('x2', 'expired two years ago, synced today', '2023-05-01T00:00:00Z')]), null);
    await publishChanges(m, { exportDir, clock, retention: prune('messages=200d') });
    expect(JSON.stringify(readExportLines(exportDir, 'messages'))).not.toContain('expired two years ago');
  });
});


describe('erasure edges: postgres: a listing page / an old message in flight while a sender / retention erasure runs', () => {
  const schema = randomSchema('edges');
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

  async function race(write: () => Promise<unknown>, erase: () => Promise<unknown>): Promise<void> {
    let reached!: () => void;
    const atCommit = new Promise<void>((r) => (reached = r));
    let release!: () => void;
    held = { armed: true, reached, release: new Promise<void>((r) => (release = r)) };
    const w = write();
    await atCommit;
    let settled = false;
    const e = erase();
    void e.finally(() => (settled = true)).catch(() => {});
    await until(async () => settled || (await advisoryWaiter64(erasureGateKey(schema, A))), 'the erasure waiting for the gate');
    expect(settled).toBe(false);
    release();
    await w;
    await e;
  }

  it('a listing naming the sender, in flight, is redacted by the sender erasure; an old message in flight by the retention erasure', async () => {
    await race(
      () => writer.upsertConversations(A, conversationsPage([{ id: 'cA', assignee: { id: S } }]), null),
      () => eraser.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'DSR-1' }),
    );
    expect((await records(writer, 'conversations')).find((c) => c.id === 'cA')!.raw).toBe('{"id":"cA","redacted":{"erasure":1}}');
    await race(
      () => writer.commitMessagesPage(A, 'cB', messagesPage([msg('m9', 'old in flight', '2024-01-01T00:00:00Z', 'usr_x')]), null),
      () => eraser.eraseSubject({ kind: 'retention', accountId: A, subject: '2025-01-01', reason: 'r' }),
    );
    expect(redactionOf((await records(writer, 'messages')).find((r) => r.id === 'm9')!.raw)).toBe(2);
    // After it: served again, unchanged.
    expect(await writer.commitMessagesPage(A, 'cB', messagesPage([msg('m9', 'old in flight', '2024-01-01T00:00:00Z', 'usr_x')]), null)).toMatchObject({ unchanged: 1 });
    expect(await writer.upsertConversations(A, conversationsPage([{ id: 'cA', assignee: { id: S } }]), null)).toMatchObject({ unchanged: 1 });
  });
});
