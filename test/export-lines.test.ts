/**
 * The export line format (src/export/lines.ts), pure: a row written since schema version 6 (the
 * record) gives exactly the bytes a row written before (the finished line) gives, key order
 * included; legacy rows come out byte for byte as before.
 */
import { describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { exportLine, type LineSource } from '../src/export/lines.js';
import { ExportError } from '../src/errors.js';

/**
 * The line (without seq) the store wrote into `change_log.line` before schema version 6, copied
 * verbatim from that version: the reference the new format must reproduce.
 */
function legacyMessageLine(op: string, syncedAt: string, accountId: string, conversationId: string, raw: Record<string, unknown>): string {
  const sender = (raw.sender ?? {}) as Record<string, unknown>;
  const line: Record<string, unknown> = {
    op,
    synced_at: syncedAt,
    account_id: accountId,
    conversation_id: conversationId,
    id: raw.id,
    content: raw.content,
    visibility: raw.visibility,
    sender: { id: sender.id, name: sender.name, type: sender.type },
  };
  if (raw.attachments !== undefined) line.attachments = raw.attachments;
  line.created_at = raw.created_at;
  return JSON.stringify(line);
}

/** See {@link legacyMessageLine}. */
function legacyConversationLine(op: string, syncedAt: string, accountId: string, id: string, raw: unknown): string {
  return JSON.stringify({ op, synced_at: syncedAt, account_id: accountId, id, data: raw });
}

const AT = '2026-01-15T12:00:00.000Z';

/** A row of the messages stream holding `record`, as written since version 6. */
function messageRow(seq: number, op: LineSource['op'], record: Record<string, unknown>, conversationId = 'c1'): LineSource {
  return { seq, stream: 'messages', op, account_id: 'acct', conversation_id: conversationId, record_id: String(record.id), synced_at: AT, record: JSON.stringify(record), line: null };
}

/** A row of the conversations stream holding `record`, as written since version 6. */
function conversationRow(seq: number, op: LineSource['op'], id: string, record: unknown): LineSource {
  return { seq, stream: 'conversations', op, account_id: 'acct', conversation_id: id, record_id: id, synced_at: AT, record: JSON.stringify(record), line: null };
}

/** The same change as a row written before version 6: the finished line, no record. */
function asLegacy(row: LineSource): LineSource {
  const record = JSON.parse(row.record!) as Record<string, unknown>;
  const line =
    row.stream === 'messages'
      ? legacyMessageLine(row.op, row.synced_at, row.account_id, row.conversation_id, record)
      : legacyConversationLine(row.op, row.synced_at, row.account_id, row.record_id, record);
  return { ...row, record: null, line };
}

describe('exportLine', () => {
  it('a message without attachments: the documented keys in order, no attachments key, no newline', () => {
    const msg = { id: 'm1', content: 'Hi "there"\n✅', visibility: 'global', sender: { type: 'Customer', id: 'u1', name: 'Ann', extra: 1 }, created_at: '2025-01-01T00:00:00Z', unknown: true };
    expect(exportLine(messageRow(7, 'insert', msg))).toBe(
      '{"seq":7,"op":"insert","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","conversation_id":"c1","id":"m1",' +
        '"content":"Hi \\"there\\"\\n✅","visibility":"global","sender":{"id":"u1","name":"Ann","type":"Customer"},"created_at":"2025-01-01T00:00:00Z"}',
    );
  });

  it('a message with attachments (even empty) carries them before created_at', () => {
    const msg = { created_at: '2025-01-01T00:00:00Z', attachments: [], id: 'm2', content: '', visibility: 'personal', sender: { id: 'u', name: 'n', type: 'User' } };
    expect(exportLine(messageRow(8, 'update', msg))).toBe(
      '{"seq":8,"op":"update","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","conversation_id":"c1","id":"m2",' +
        '"content":"","visibility":"personal","sender":{"id":"u","name":"n","type":"User"},"attachments":[],"created_at":"2025-01-01T00:00:00Z"}',
    );
  });

  it('a delete carries the last version of the record', () => {
    const last = { id: 'm3', content: 'last words', visibility: 'global', sender: { id: 'u', name: 'n', type: 'User' }, attachments: [{ url: 'https://x/y' }], created_at: '2025-01-01T00:00:00Z' };
    expect(exportLine(messageRow(9, 'delete', last))).toBe(
      '{"seq":9,"op":"delete","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","conversation_id":"c1","id":"m3",' +
        '"content":"last words","visibility":"global","sender":{"id":"u","name":"n","type":"User"},"attachments":[{"url":"https://x/y"}],"created_at":"2025-01-01T00:00:00Z"}',
    );
    expect(exportLine(conversationRow(10, 'delete', 'c1', { id: 'c1', subject: 's' }))).toBe(
      '{"seq":10,"op":"delete","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","id":"c1","data":{"id":"c1","subject":"s"}}',
    );
  });

  it('a conversation known only by id exports data {"id": ...}', () => {
    expect(exportLine(conversationRow(1, 'insert', 'c9', { id: 'c9' }))).toBe(
      '{"seq":1,"op":"insert","synced_at":"2026-01-15T12:00:00.000Z","account_id":"acct","id":"c9","data":{"id":"c9"}}',
    );
  });

  it('a legacy row (line set) is exported as {"seq":N, + its line, byte for byte', () => {
    const line = '{"op":"insert","synced_at":"2025-06-01T10:00:00.000Z","account_id":"a","id":"c1","data":{"b":1,"a":[1.0,2e3]}}';
    const row: LineSource = { seq: 42, stream: 'conversations', op: 'insert', account_id: 'a', conversation_id: 'c1', record_id: 'c1', synced_at: 'ignored', record: null, line };
    expect(exportLine(row)).toBe(`{"seq":42,${line.slice(1)}`);
  });

  it('new rows and legacy rows of the same changes give the same bytes, for every record of a generated workspace', () => {
    const ws = FakeWorkspace.fromCounts([0, 3, 101, 230, 17]);
    let seq = 0;
    let rows = 0;
    const ops: LineSource['op'][] = ['insert', 'update', 'delete'];
    for (const c of ws.list()) {
      for (const op of ops) {
        const conv = conversationRow(++seq, op, c.id, c.data);
        expect(exportLine(conv)).toBe(exportLine(asLegacy(conv)));
        rows++;
      }
      for (const m of c.messages) {
        const row = messageRow(++seq, ops[seq % 3]!, m as unknown as Record<string, unknown>, c.id);
        const legacy = asLegacy(row);
        expect(exportLine(row)).toBe(exportLine(legacy));
        expect(exportLine(row)).toBe(`{"seq":${seq},${legacy.line!.slice(1)}`);
        rows++;
      }
    }
    expect(rows).toBe(5 * 3 + 351);
  });

  it('a row with neither record nor line is an ExportError naming its seq', () => {
    const row: LineSource = { seq: 5, stream: 'messages', op: 'insert', account_id: 'a', conversation_id: 'c', record_id: 'm', synced_at: AT, record: null, line: null };
    expect(() => exportLine(row)).toThrow(ExportError);
    expect(() => exportLine(row)).toThrow(/change_log row 5/);
    expect(() => exportLine({ ...row, record: '{not json' })).toThrow(/change_log row 5 holds a record that is not JSON/);
  });
});
