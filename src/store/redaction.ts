/**
 * The redaction marker of an erasure (issue 26: GDPR Art. 17, CCPA deletion), the mirror side:
 * pure functions over the records both engines keep, no SQL, no driver. What a redacted record
 * is, byte for byte, is decided here and only here; the engines (src/store/sqlite/erasures.ts,
 * src/store/postgres/erasures.ts) find the rows and write what these functions return.
 *
 * A redacted message keeps its key (account, conversation, id), its position and its times; its
 * record (`raw`, a `message_history` version, an unpublished change payload) becomes exactly
 *
 * ```json
 * {"id":"<id>","created_at":"<created_at>","redacted":{"erasure":<erasure id>}}
 * ```
 *
 * (`content`, `visibility`, the whole `sender`, `attachments` and every other served field gone).
 * A redacted conversation's record becomes `{"id":"<id>","redacted":{"erasure":<erasure id>}}`
 * (the spec shows no field of a conversation, so nothing else is kept): a conversation erasure's
 * own, and each conversation a sender erasure finds naming the sender
 * ({@link conversationNamesSender}). The derived columns of a
 * redacted message (content, visibility, sender_id, sender_name, sender_type, attachments) read
 * NULL; `created_at` is kept.
 */
import type { Conversation, Message, Page } from '../api/schemas.js';
import { StoreError } from '../errors.js';
import { ERASURE_KINDS, type ErasureKind, type ErasureRequest, type ErasureRow } from './types.js';

/**
 * Text every redacted record holds and no served record does in practice (a served string holding
 * it is JSON-escaped: `\"redacted\"`): the cheap SQL test (`instr`, `strpos`) of "this row is
 * redacted" for counts and listings. {@link redactionOf} is the exact test.
 */
export const REDACTED_MARK = '"redacted":{"erasure":';

/** The keys of a redacted message's record, in their written order. */
const MESSAGE_MARKER_KEYS = ['id', 'created_at', 'redacted'];
/** The keys of a redacted conversation's record, in their written order. */
const CONVERSATION_MARKER_KEYS = ['id', 'redacted'];

/** A whole number an erasure id can be (>= 1). */
const isErasureId = (n: unknown): n is number => typeof n === 'number' && Number.isSafeInteger(n) && n >= 1;

/**
 * The redacted form of a message (see the module comment) as an object, whose `JSON.stringify` is
 * {@link redactedMessage}'s text.
 *
 * @param message - the message as served (its object), or any version of it: only `id` and
 *   `created_at` are read (`created_at` is kept when it is a string, else null)
 * @param erasureId - the `erasures.id` that redacts it
 * @param fallbackId - the id kept when `message` has no string `id` (its key in the mirror)
 */
export function messageMarker(message: Record<string, unknown>, erasureId: number, fallbackId?: string): Record<string, unknown> {
  const createdAt = typeof message.created_at === 'string' ? message.created_at : null;
  const id = typeof message.id === 'string' ? message.id : (fallbackId ?? null);
  return { id, created_at: createdAt, redacted: { erasure: erasureId } };
}

/**
 * The redacted record of a message, as JSON text (see the module comment).
 *
 * @param record - the message's record as stored (JSON text of the served object, of a superseded
 *   version, of a change payload; a legacy export line of a message carries `id` and `created_at`
 *   too)
 * @param erasureId - the `erasures.id` that redacts it
 * @param fallbackId - the id kept when the record has none (or is not JSON): the message's key
 */
export function redactedMessage(record: string, erasureId: number, fallbackId?: string): string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(record);
  } catch {
    parsed = {};
  }
  return JSON.stringify(messageMarker(asObject(parsed), erasureId, fallbackId));
}

/** The redacted form of a conversation as an object: `{id, redacted: {erasure}}`. */
export function conversationMarker(conversationId: string, erasureId: number): Record<string, unknown> {
  return { id: conversationId, redacted: { erasure: erasureId } };
}

/** The redacted record of a conversation, as JSON text: `{"id":…,"redacted":{"erasure":N}}`. */
export function redactedConversation(conversationId: string, erasureId: number): string {
  return JSON.stringify(conversationMarker(conversationId, erasureId));
}

/**
 * The erasure a stored record was redacted by; undefined for a record that is not a redaction
 * marker (exactly the keys of one, in their order, with a whole `redacted.erasure` >= 1). Never
 * throws: text that is not JSON is no marker.
 */
export function redactionOf(record: string | null): number | undefined {
  if (record === null || !record.includes(REDACTED_MARK)) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(record);
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const keys = Object.keys(v);
  const shape = keys.length === 3 ? MESSAGE_MARKER_KEYS : CONVERSATION_MARKER_KEYS;
  if (keys.length !== shape.length || keys.some((k, i) => k !== shape[i])) return undefined;
  const redacted = (v as { redacted: unknown }).redacted;
  if (typeof redacted !== 'object' || redacted === null || Object.keys(redacted).join() !== 'erasure') return undefined;
  const id = (redacted as { erasure: unknown }).erasure;
  return isErasureId(id) ? id : undefined;
}

/**
 * The text a record naming sender `senderId` holds (its JSON string, quotes included): a cheap SQL
 * prefilter (`instr`, `strpos`) of the rows {@link namesSender} then decides on.
 */
export const senderNeedle = (senderId: string): string => JSON.stringify(senderId);

/**
 * Whether a stored record (a message, a superseded version, a change payload, a legacy export
 * line of a message) names `senderId` as its sender (`sender.id`). Never throws.
 */
export function namesSender(record: string | null, senderId: string): boolean {
  if (record === null) return false;
  try {
    const sender = (asObject(JSON.parse(record)) as { sender?: unknown }).sender;
    return typeof sender === 'object' && sender !== null && (sender as { id?: unknown }).id === senderId;
  } catch {
    return false;
  }
}

/**
 * Whether a stored record of the conversations stream (a conversation's `raw`, a `conversations`
 * change payload, a legacy export line of one) names `senderId`: the id occurs in it as a JSON
 * string value, at any depth (the fake API's `contact: {id, name}`, an assignee, anything the API
 * adds: the spec shows no field of a conversation). Exactly equal, never a substring; an object's
 * key is no value. Never throws: text that is not JSON names nobody.
 */
export function conversationNamesSender(record: string | null, senderId: string): boolean {
  if (record === null) return false;
  try {
    return stringValues(JSON.parse(record)).has(senderId);
  } catch {
    return false;
  }
}

/** Every string value in `v`, at any depth (keys are not values). */
function stringValues(v: unknown, out = new Set<string>()): Set<string> {
  const stack: unknown[] = [v];
  while (stack.length > 0) {
    const x = stack.pop();
    if (typeof x === 'string') out.add(x);
    else if (Array.isArray(x)) stack.push(...x);
    else if (typeof x === 'object' && x !== null) stack.push(...Object.values(x));
  }
  return out;
}

/**
 * Whether a stored conversation record belongs to the sender erased (again): it names `senderId`
 * ({@link conversationNamesSender}), or it is the marker of one of the `earlier` erasures of the
 * same sender (so erasing a sender again finds the conversations, and the published lines, of
 * the first time). {@link belongsToSender}'s rule for conversations.
 */
export function conversationBelongsToSender(record: string | null, senderId: string, earlier: ReadonlySet<number>): boolean {
  if (conversationNamesSender(record, senderId)) return true;
  const by = earlier.size > 0 ? redactionOf(record) : undefined;
  return by !== undefined && earlier.has(by);
}

/** `v` when it is a JSON object, else an empty one. */
function asObject(v: unknown): Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
}

/**
 * Checks an erasure request before anything is read.
 *
 * @throws {@link StoreError} with code `ERASURE_INVALID` when `kind` is neither `sender` nor
 *   `conversation`, or `accountId`, `subject` or `reason` is empty (blank)
 */
export function checkErasureRequest(r: ErasureRequest): void {
  const bad = (why: string) => new StoreError(`erasure refused: ${why}`, { kind: r.kind, account_id: r.accountId }, undefined, 'ERASURE_INVALID');
  if (!ERASURE_KINDS.includes(r.kind)) throw bad(`kind must be one of ${ERASURE_KINDS.map((k) => `'${k}'`).join(', ')}, got ${JSON.stringify(r.kind)}`);
  if (typeof r.accountId !== 'string' || r.accountId === '') throw bad('the account id is empty');
  if (r.kind === 'retention') {
    if (typeof r.subject !== 'string' || cutoffStartMs(r.subject) === undefined) throw bad(`a retention erasure's subject is its cutoff day, YYYY-MM-DD; got ${JSON.stringify(r.subject)}`);
  } else if (typeof r.subject !== 'string' || r.subject.trim() === '') throw bad(`the ${r.kind} id is empty`);
  if (typeof r.reason !== 'string' || r.reason.trim() === '') throw bad('a reason (e.g. the ticket reference) is required');
}

/**
 * The erasures in force for one page of one conversation: the lowest erasure id covering the
 * conversation (kind `conversation`), per sender id the lowest covering it (kind `sender`), and
 * the retention erasures (kind `retention`) whose cutoff could cover a message of the page. The
 * lowest is the one that redacted a record first, so a record served again comes out as the
 * mirror already holds it.
 */
export interface ErasuresInForce {
  conversation: number | undefined;
  senders: ReadonlyMap<string, number>;
  /**
   * Retention erasures, by ascending id: a message whose `created_at` is before `cutoff` (a day,
   * `YYYY-MM-DD`, UTC) is covered by the first of them whose cutoff is after it. Their cutoffs
   * ascend with their ids (a retention erasure is only made for a cutoff after every earlier one
   * of its account).
   */
  retention: readonly { cutoff: string; id: number }[];
}

/**
 * Folds `(kind, subject, id)` rows of `erasures` into {@link ErasuresInForce} for the
 * conversation `conversationId` (the lowest id per subject wins).
 */
export function erasuresInForce(conversationId: string, rows: readonly { kind: ErasureKind; subject: string; id: number }[]): ErasuresInForce {
  let conversation: number | undefined;
  const senders = new Map<string, number>();
  const retention = new Map<string, number>();
  for (const r of rows) {
    const id = Number(r.id);
    if (r.kind === 'conversation' && r.subject === conversationId) conversation = Math.min(conversation ?? id, id);
    else if (r.kind === 'sender') senders.set(r.subject, Math.min(senders.get(r.subject) ?? id, id));
    else if (r.kind === 'retention' && cutoffStartMs(r.subject) !== undefined) retention.set(r.subject, Math.min(retention.get(r.subject) ?? id, id));
  }
  return { conversation, senders, retention: [...retention].map(([cutoff, id]) => ({ cutoff, id })).sort((x, y) => x.id - y.id) };
}

/** A cutoff day (`YYYY-MM-DD`, a real date) as the epoch ms of its start, UTC; undefined for anything else. */
export function cutoffStartMs(day: string): number | undefined {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(day)) return undefined;
  const ms = Date.parse(`${day}T00:00:00.000Z`);
  return Number.isFinite(ms) && new Date(ms).toISOString().slice(0, 10) === day ? ms : undefined;
}

/** The day after `day` (`YYYY-MM-DD`, UTC): the exclusive string bound of `created_at` values that may be before `day` in some UTC offset. */
export function dayAfter(day: string): string {
  const ms = cutoffStartMs(day);
  return ms === undefined ? day : new Date(ms + 86_400_000).toISOString().slice(0, 10);
}

/**
 * Whether a message created at `createdAt` (its served `created_at`, ISO 8601 with any offset)
 * expires under cutoff day `cutoff`: it was created before that day's start, UTC. A `created_at`
 * that is not a string or does not parse never expires (kept: nothing says it is old).
 */
export function createdBefore(createdAt: unknown, cutoff: string): boolean {
  if (typeof createdAt !== 'string') return false;
  const t = Date.parse(createdAt);
  const c = cutoffStartMs(cutoff);
  return Number.isFinite(t) && c !== undefined && t < c;
}

/** The `created_at` of a stored message record (JSON text); undefined when it has none or is not JSON. Never throws. */
export function createdAtOf(record: string | null): unknown {
  if (record === null) return undefined;
  try {
    return (asObject(JSON.parse(record)) as { created_at?: unknown }).created_at;
  } catch {
    return undefined;
  }
}

/**
 * Whether a retention erasure of cutoff day `cutoff` concerns a message whose record is `record`
 * and whose `created_at` column reads `createdAt`: the message was created before the day
 * ({@link createdBefore}), and its record is not redacted, or redacted by one of `own` (the
 * erasure itself, in its archive step). A message another erasure redacted is that erasure's:
 * its archive step stubbed what was published of it, and everything later carried its marker.
 */
export function expiredRecord(record: string | null, createdAt: unknown, cutoff: string, own: ReadonlySet<number>): boolean {
  if (!createdBefore(createdAt, cutoff)) return false;
  const by = redactionOf(record);
  return by === undefined || own.has(by);
}

/** The retention erasure (of `inForce.retention`) covering a message created at `createdAt`: the first, by id, whose cutoff is after it. */
function retentionCovering(createdAt: unknown, retention: ErasuresInForce['retention']): number | undefined {
  for (const r of retention) if (createdBefore(createdAt, r.cutoff)) return r.id;
  return undefined;
}

/**
 * The lowest cutoff day a retention erasure needs to cover a message of `page`: the day before the
 * earliest parseable `created_at` of its messages (a day of margin for any UTC offset), as
 * `YYYY-MM-DD`; undefined when no message has one (nothing on the page can expire). The engines
 * read only the retention erasures whose cutoff is after it.
 */
export function pageRetentionFloor(page: Page<Message>): string | undefined {
  let min = Infinity;
  for (const obj of page.raw) {
    const t = typeof obj.created_at === 'string' ? Date.parse(obj.created_at) : NaN;
    if (Number.isFinite(t) && t < min) min = t;
  }
  return Number.isFinite(min) ? new Date(Math.max(0, min - 86_400_000)).toISOString().slice(0, 10) : undefined;
}

/** The distinct sender ids (`sender.id`, strings) of a page's served messages. */
export function pageSenderIds(page: Page<Message>): string[] {
  const out = new Set<string>();
  for (const obj of page.raw) {
    const sender = obj.sender;
    const id = typeof sender === 'object' && sender !== null ? (sender as { id?: unknown }).id : undefined;
    if (typeof id === 'string') out.add(id);
  }
  return [...out];
}

/**
 * A message page as the mirror must store it: each served message an erasure covers (its
 * conversation, its sender, or a retention cutoff after its `created_at`, in `inForce`) replaced in `raw` by its marker
 * ({@link messageMarker}, with the lowest covering erasure id); the page itself when none is. The
 * page's `data` (ids, order) and `meta` are kept: only `raw` is written.
 */
export function redactMessagesPage(page: Page<Message>, inForce: ErasuresInForce): Page<Message> {
  if (inForce.conversation === undefined && inForce.senders.size === 0 && inForce.retention.length === 0) return page;
  let changed = false;
  const raw = page.raw.map((obj) => {
    const sender = obj.sender;
    const senderId = typeof sender === 'object' && sender !== null ? (sender as { id?: unknown }).id : undefined;
    const bySender = typeof senderId === 'string' ? inForce.senders.get(senderId) : undefined;
    const byRetention = inForce.retention.length > 0 ? retentionCovering(obj.created_at, inForce.retention) : undefined;
    const ids = [inForce.conversation, bySender, byRetention].filter((n): n is number => n !== undefined);
    if (ids.length === 0) return obj;
    changed = true;
    return messageMarker(obj, Math.min(...ids));
  });
  return changed ? { ...page, raw } : page;
}

/**
 * The erasures in force for a listing page of one account: per conversation id the lowest erasure
 * of kind `conversation` covering it (of the page's ids), and per sender id the lowest of kind
 * `sender` (every sender the account has erased: a served conversation may name any of them).
 */
export interface ConversationErasures {
  conversations: ReadonlyMap<string, number>;
  senders: ReadonlyMap<string, number>;
}

/** No erasure in force for a listing page (an account that has none). */
export const NO_CONVERSATION_ERASURES: ConversationErasures = { conversations: new Map(), senders: new Map() };

/**
 * Folds `(kind, subject, id)` rows of `erasures` (the lowest id per kind and subject, or any of
 * them: the lowest wins) into {@link ConversationErasures}.
 */
export function conversationErasures(rows: readonly { kind: ErasureKind; subject: string; id: number }[]): ConversationErasures {
  const conversations = new Map<string, number>();
  const senders = new Map<string, number>();
  for (const r of rows) {
    const id = Number(r.id);
    const into = r.kind === 'conversation' ? conversations : r.kind === 'sender' ? senders : undefined;
    if (into) into.set(r.subject, Math.min(into.get(r.subject) ?? id, id));
  }
  return { conversations, senders };
}

/**
 * A listing page as the mirror must store it: each conversation an erasure covers replaced in
 * `raw` by its marker ({@link conversationMarker}); the page itself when none is. An erasure
 * covers a served conversation when it is of kind `conversation` and names its id, or of kind
 * `sender` and the served object names that sender ({@link conversationNamesSender}: a string
 * value at any depth); the marker carries the lowest id of those covering it.
 */
export function redactConversationsPage(page: Page<Conversation>, inForce: ConversationErasures): Page<Conversation> {
  if (inForce.conversations.size === 0 && inForce.senders.size === 0) return page;
  let changed = false;
  const raw = page.raw.map((obj, i) => {
    const id = page.data[i]!.id;
    let erasure = inForce.conversations.get(id);
    if (inForce.senders.size > 0) {
      for (const v of stringValues(obj)) {
        const bySender = inForce.senders.get(v);
        if (bySender !== undefined) erasure = Math.min(erasure ?? bySender, bySender);
      }
    }
    if (erasure === undefined) return obj;
    changed = true;
    return conversationMarker(id, erasure);
  });
  return changed ? { ...page, raw } : page;
}

/** A message's key within an account, as one string (NUL never occurs in the ids it joins). */
export const messageKey = (conversationId: string, id: string): string => `${conversationId}\0${id}`;

/**
 * Whether a stored message record belongs to the sender erased again: it names `senderId`
 * ({@link namesSender}), or it is the marker of one of the `earlier` erasures of the same sender
 * (so erasing a sender again finds the messages, and the published lines, of the first time).
 */
export function belongsToSender(record: string | null, senderId: string, earlier: ReadonlySet<number>): boolean {
  if (namesSender(record, senderId)) return true;
  const by = earlier.size > 0 ? redactionOf(record) : undefined;
  return by !== undefined && earlier.has(by);
}

/** The `erasures` columns as either engine stores them (PostgreSQL's int8 read as numbers). */
export interface StoredErasure {
  id: number;
  kind: ErasureKind;
  account_id: string;
  subject: string;
  reason: string;
  requested_at: string;
  messages: number;
  history: number;
  pending_changes: number;
  conversations: number;
  published_lines: number;
  published_through_seq: number;
  archive_batch_id: number | null;
  archive_done_at: string | null;
}

/** Maps a stored row to the interface's shape. */
export const erasureRow = (r: StoredErasure): ErasureRow => ({
  id: r.id,
  kind: r.kind,
  accountId: r.account_id,
  subject: r.subject,
  reason: r.reason,
  requestedAt: r.requested_at,
  messages: r.messages,
  history: r.history,
  pendingChanges: r.pending_changes,
  conversations: r.conversations,
  publishedLines: r.published_lines,
  publishedThroughSeq: r.published_through_seq,
  archiveBatchId: r.archive_batch_id,
  archiveDoneAt: r.archive_done_at,
});
