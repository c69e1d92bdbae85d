/**
 * The store's side of the archive step of erasures (issue 26, item 2), on each engine (the
 * conformance suite, test/engines.ts): `subjectLines` names every published line of a subject (by
 * sender, by conversation, before and after the erasure, by the markers once redacted);
 * `planErasureRecord` reserves one batch id for an erasure's record (the same on every call, never
 * planned for a batch after it, refused while a batch is pending); `recordErasureRecord` moves the
 * head by compare-and-set, records the entry and replaces the rewritten files, and is fenced when
 * the head or the reserved id is not the one its entry says.
 */
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { StoreError } from '../src/errors.js';
import { publishChanges } from '../src/export/exporter.js';
import type { LedgerEntry, Mirror, PublishedFile } from '../src/store/mirror.js';
import { testClock } from './clock.js';
import { engines } from './engines.js';
import { ACCOUNT_ID, tempDir } from './helpers.js';
import { changeRows } from './mirror-reads.js';

const A = ACCOUNT_ID;
const S = 'cus_erase_me';
const t0 = Date.UTC(2026, 2, 1, 9);
const at = (minute: number): string => new Date(t0 + minute * 60_000).toISOString();

const msg = (id: string, sender: string, content: string, minute: number) => ({
  id,
  content,
  visibility: 'global',
  sender: { id: sender, name: sender === S ? 'Ms Erasable' : 'Dana Lee', type: sender === S ? 'Customer' : 'User' },
  created_at: at(minute),
});
const messagesPage = (objs: ReturnType<typeof msg>[]): Page<Message> => ({
  page: 1,
  data: objs as unknown as Message[],
  raw: objs as unknown as Record<string, unknown>[],
  meta: { current_page: 1, total_pages: 1, total_count: objs.length },
});
const conversationsPage = (objs: Record<string, unknown>[]): Page<Conversation> => ({
  page: 1,
  data: objs as unknown as Conversation[],
  raw: objs,
  meta: { current_page: 1, total_pages: 1, total_count: objs.length },
});

const code = async (p: Promise<unknown>): Promise<string | undefined> =>
  p.then(
    () => undefined,
    (e: unknown) => (e instanceof StoreError ? e.code : `not a StoreError: ${String(e)}`),
  );

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());

  /** c1: m1 (S), m2 (other), m3 (S, then edited); c2: m4 (other); all published in one batch, then m5 (S, c2) unpublished. */
  async function published(): Promise<{ m: Mirror; exportDir: string }> {
    const clock = testClock({ start: t0 });
    const m = await engine.open({ clock });
    const exportDir = path.join(tempDir('convo-mirror-erasure-archive-'), 'exports');
    await m.upsertConversations(A, conversationsPage([{ id: 'c1' }, { id: 'c2' }]), null);
    await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, 'one', 1), msg('m2', 'usr_1', 'two', 2), msg('m3', S, 'three', 3)]), null);
    await m.commitMessagesPage(A, 'c1', messagesPage([msg('m1', S, 'one', 1), msg('m2', 'usr_1', 'two', 2), msg('m3', S, 'three, edited', 3)]), null);
    await m.commitMessagesPage(A, 'c2', messagesPage([msg('m4', 'usr_1', 'four', 4)]), null);
    await publishChanges(m, { exportDir, clock });
    await m.commitMessagesPage(A, 'c2', messagesPage([msg('m4', 'usr_1', 'four', 4), msg('m5', S, 'five', 5)]), null);
    return { m, exportDir };
  }

  it("names every published line of a sender and of a conversation, before the erasure and after it (by the erasure's markers)", async () => {
    const { m } = await published();
    const rows = await changeRows(m);
    const watermark = await m.exportWatermark();
    const seqsOf = (pred: (c: (typeof rows)[number]) => boolean) => rows.filter((c) => c.seq <= watermark && pred(c)).map((c) => ({ seq: c.seq, stream: c.stream }));
    const ofSender = seqsOf((c) => c.stream === 'messages' && ['m1', 'm3'].includes(c.record_id));
    expect(ofSender.length).toBe(3); // m1's insert, m3's insert and update
    const ofC1 = seqsOf((c) => (c.stream === 'messages' || c.stream === 'conversations') && c.conversation_id === 'c1');
    expect(ofC1.map((l) => l.stream)).toContain('conversations');

    const sender = { kind: 'sender' as const, accountId: A, subject: S };
    expect(await m.subjectLines(sender, watermark)).toEqual(ofSender);
    expect(await m.subjectLines({ kind: 'conversation', accountId: A, subject: 'c1' }, watermark)).toEqual(ofC1);
    // Nothing of another account, nor above the seq given.
    expect(await m.subjectLines({ ...sender, accountId: 'other' }, watermark)).toEqual([]);
    expect(await m.subjectLines(sender, ofSender[0]!.seq)).toEqual(ofSender.slice(0, 1));

    const r = await m.eraseSubject({ ...sender, reason: 'T-1' });
    expect(r.publishedThroughSeq).toBe(watermark);
    // Redacted: the mirror knows the sender's messages by their markers; m5 (unpublished) is above the seq.
    expect(await m.subjectLines(sender, watermark)).toEqual(ofSender);
    expect((await m.subjectLines(sender, Number.MAX_SAFE_INTEGER)).map((l) => l.seq)).toEqual([...ofSender.map((l) => l.seq), rows.find((c) => c.record_id === 'm5')!.seq]);
  });

  it('reserves one batch id for an erasure record, which no batch takes after it; records it by compare-and-set, replacing the rewritten files', async () => {
    const { m } = await published();
    const { erasureId } = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'T-1' });
    const head = (await m.ledgerHead())!;
    const watermark = await m.exportWatermark();
    const id = await m.planErasureRecord(erasureId!);
    expect(id).toBe(head.batch_id + 1);
    expect(await m.planErasureRecord(erasureId!)).toBe(id);
    expect((await m.erasures())[0]!.archiveBatchId).toBe(id);
    expect(await code(m.planErasureRecord(99))).toBe('ERASURE_UNKNOWN');

    const [old] = await m.publishedFiles();
    const rewritten: PublishedFile = { ...old!, path: old!.path.replace(/\.jsonl$/, '.e1.jsonl'), sha256: 'ab'.repeat(32), bytes: old!.bytes - 1 };
    const entry: LedgerEntry = { batch_id: id, hash: 'cd'.repeat(32), prev_hash: head.hash, path: `_ledger/${String(id).padStart(12, '0')}.json`, files: 1, lines: 3, key_id: null };
    // Fenced: another head, another id; nothing changed.
    expect(await code(m.recordErasureRecord(erasureId!, { ...entry, prev_hash: 'ef'.repeat(32) }, [{ from: old!.path, file: rewritten }], at(9)))).toBe('LEDGER_FENCED');
    expect(await code(m.recordErasureRecord(erasureId!, { ...entry, batch_id: id + 1 }, [{ from: old!.path, file: rewritten }], at(9)))).toBe('LEDGER_FENCED');
    expect(await m.ledgerHead()).toEqual(head);
    expect((await m.publishedFiles()).map((f) => f.path)).toContain(old!.path);

    await m.recordErasureRecord(erasureId!, entry, [{ from: old!.path, file: rewritten }], at(9));
    expect(await m.ledgerHead()).toEqual({ batch_id: id, hash: entry.hash });
    expect((await m.ledgerEntries()).at(-1)).toEqual(entry);
    expect(await m.exportWatermark()).toBe(watermark); // an erasure record covers no new seq
    const files = await m.publishedFiles();
    expect(files.map((f) => f.path)).not.toContain(old!.path);
    expect(files.find((f) => f.path === rewritten.path)).toEqual(rewritten);
    // Recorded: the same id again; the next batch is planned after it.
    expect(await m.planErasureRecord(erasureId!)).toBe(id);
    const next = await m.planExportBatch(null, at(10));
    expect(next!.id).toBeGreaterThan(id);
  });

  it('refuses to reserve a record id while an export batch is planned and not published (its record comes first)', async () => {
    const { m } = await published();
    const { erasureId } = await m.eraseSubject({ kind: 'sender', accountId: A, subject: S, reason: 'T-1' });
    const planned = await m.planExportBatch(null, at(10));
    expect(planned).toBeDefined();
    expect(await code(m.planErasureRecord(erasureId!))).toBe('LEDGER_FENCED');
    expect((await m.erasures())[0]!.archiveBatchId).toBeNull();
  });
});
