/**
 * What tests read of a mirror, through the `Mirror` interface only, so a test reads either engine
 * the same way (the conformance suite, test/engines.ts). test/sql.ts stays the escape hatch for
 * what only a SQLite file has (pragmas, derived columns, timestamps no method returns).
 */
import type { FakeWorkspace } from '../src/fake-api/index.js';
import type { ChangeStream, ExportChange, HistoryRow, Mirror, RecordRow } from '../src/store/mirror.js';
import { ACCOUNT_ID } from './helpers.js';

/** Every change-log row, by seq, as the exporter reads them (a published row's `record` is null: its payload was pruned). */
export async function changeRows(m: Mirror): Promise<ExportChange[]> {
  const out: ExportChange[] = [];
  for await (const c of m.changesOf({ first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER })) out.push(c);
  return out.sort((a, b) => a.seq - b.seq);
}

/** The ops of the changes of one record (a message's or conversation's id), by seq; of one stream when given. */
export async function opsOf(m: Mirror, recordId: string, stream?: ChangeStream): Promise<string[]> {
  return (await changeRows(m)).filter((c) => c.record_id === recordId && (stream === undefined || c.stream === stream)).map((c) => c.op);
}

/** The highest seq of the change log; 0 when it is empty. */
export async function maxSeq(m: Mirror): Promise<number> {
  return (await changeRows(m)).reduce((top, c) => Math.max(top, c.seq), 0);
}

/** Every message or conversation row (tombstoned ones too), by key. */
export async function records(m: Mirror, table: 'messages' | 'conversations'): Promise<RecordRow[]> {
  const out: RecordRow[] = [];
  for await (const r of m.auditRecords(table)) out.push(r);
  return out;
}

/** Every `message_history` row, by the seq of the update that replaced it. */
export async function historyRows(m: Mirror): Promise<HistoryRow[]> {
  const out: HistoryRow[] = [];
  for await (const h of m.auditHistory()) out.push(h);
  return out;
}

/**
 * The positions of the live messages of a conversation (id → position), found through
 * `messageIdAt` from position 0 on until every live message is found (positions may have gaps:
 * e.g. a page that served an id twice keeps its last position).
 */
export async function livePositions(m: Mirror, conversationId: string, accountId = ACCOUNT_ID): Promise<Map<string, number>> {
  const live = (await records(m, 'messages')).filter((r) => r.account_id === accountId && r.conversation_id === conversationId && r.deleted === 0).length;
  const out = new Map<string, number>();
  // A gap wider than every live message plus 1,000 positions would be a bug of its own: stop there.
  for (let p = 0; out.size < live && p < 2 * live + 1000; p++) {
    const id = await m.messageIdAt(accountId, conversationId, p);
    if (id !== undefined) out.set(id, p);
  }
  return out;
}

/** Ids of the live messages of a conversation, by position. */
export async function liveIdsByPosition(m: Mirror, conversationId: string, accountId = ACCOUNT_ID): Promise<string[]> {
  return [...(await livePositions(m, conversationId, accountId)).entries()].sort((a, b) => a[1] - b[1]).map(([id]) => id);
}

/** A message row as tests compare it: `position` for a live message (undefined for a tombstoned one). */
export interface MessageRow {
  id: string;
  raw: string;
  deleted: boolean;
  position: number | undefined;
}

/**
 * Every message row of a conversation (tombstoned ones too): the live ones by position, then the
 * tombstoned ones by id.
 */
export async function messageRows(m: Mirror, conversationId: string, accountId = ACCOUNT_ID): Promise<MessageRow[]> {
  const rows = (await records(m, 'messages')).filter((r) => r.account_id === accountId && r.conversation_id === conversationId);
  const order = await livePositions(m, conversationId, accountId);
  const out = rows.map((r) => ({ id: r.id, raw: r.raw ?? '', deleted: r.deleted !== 0, position: r.deleted === 0 ? order.get(r.id) : undefined }));
  const key = (r: MessageRow) => (r.position === undefined ? Number.MAX_SAFE_INTEGER : r.position);
  return out.sort((a, b) => key(a) - key(b) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

/** A run's row (every column of `runs`), by id; undefined for an unknown one. */
export async function runRow(m: Mirror, runId: number): Promise<Record<string, unknown> | undefined> {
  return (await m.lastRuns(1_000_000)).find((r) => Number(r['id']) === runId);
}

/** A conversation as `conversations` lists it (tombstoned ones too); undefined when the mirror has no row for it. */
export async function conversationRow(m: Mirror, conversationId: string, accountId = ACCOUNT_ID) {
  return (await m.listConversations({ accountIds: [accountId], includeDeleted: true })).rows.find((r) => r.id === conversationId);
}

/**
 * Whether the mirror's live messages and conversations of `accountId` equal what the fake serves
 * now, by value (the async, any-engine twin of `mirrorEqualsFake` in helpers.ts).
 */
export async function mirrorMatchesFake(m: Mirror, ws: FakeWorkspace, accountId = ACCOUNT_ID): Promise<{ ok: boolean; detail: string }> {
  const live = (rows: RecordRow[]) => rows.filter((r) => r.account_id === accountId && r.deleted === 0);
  const a = new Map(live(await records(m, 'messages')).map((r) => [`${r.conversation_id}/${r.id}`, r.raw]));
  const b = new Map<string, string>();
  for (const c of ws.list()) for (const msg of c.messages) b.set(`${c.id}/${msg.id}`, JSON.stringify(msg));
  const missing = [...b.keys()].filter((k) => a.get(k) !== b.get(k));
  const extra = [...a.keys()].filter((k) => !b.has(k));
  const convs = new Map(live(await records(m, 'conversations')).map((r) => [r.id, r.raw]));
  const fakeConvs = new Map(ws.list().map((c) => [c.id, JSON.stringify(c.data)]));
  const convMissing = [...fakeConvs.keys()].filter((id) => convs.get(id) !== fakeConvs.get(id));
  const convExtra = [...convs.keys()].filter((id) => !fakeConvs.has(id));
  const ok = missing.length === 0 && extra.length === 0 && convMissing.length === 0 && convExtra.length === 0;
  return {
    ok,
    detail: `messages missing/different ${missing.length} ${missing.slice(0, 3).join(',')}; extra ${extra.length} ${extra.slice(0, 3).join(',')}; conversations missing/different ${convMissing.length}, extra ${convExtra.length}`,
  };
}
