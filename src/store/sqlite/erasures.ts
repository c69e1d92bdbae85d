/**
 * Erasures (issue 26, the mirror side): the `erasures` table, the redaction of a subject's rows
 * (`messages`, `message_history`, unpublished `change_payloads`, a conversation's own row), and the
 * erasures in force that a page committed later applies as it arrives. What a redacted record is
 * belongs to src/store/redaction.ts; this group finds the rows and writes it. Methods that change
 * rows expect to run inside the caller's transaction; none opens one itself. No change-log row is
 * ever appended here.
 */
import type { Db, Statement } from './sqlite.js';
import {
  belongsToSender,
  conversationBelongsToSender,
  conversationErasures,
  conversationNamesSender,
  dayAfter,
  erasureRow,
  expiredRecord,
  erasuresInForce,
  messageKey,
  namesSender,
  REDACTED_MARK,
  redactedConversation,
  redactedMessage,
  redactionOf,
  senderNeedle,
  type ConversationErasures,
  type ErasuresInForce,
  type StoredErasure,
} from '../redaction.js';
import type { ChangeStream, ErasureCounts, ErasureKind, ErasureRequest, ErasureResult, ErasureRow, ErasureSubject, SubjectLine } from '../types.js';

/** A `messages` row as the erasure reads it (by rowid: a key holding a lone surrogate does not read back as stored). */
interface MessageRow {
  rowid: number;
  conversation_id: string;
  id: string;
  raw: string;
}
/** A `message_history` row as the erasure reads it. */
interface HistoryRow {
  rowid: number;
  id: string;
  raw: string;
}
/** An unpublished change of the account: its keys (the payload is read when it concerns the subject). */
type PendingKey = [seq: number, stream: string, conversation_id: string, record_id: string, named: number];
/** An unpublished `conversations` change of the account: its seq, the conversation, whether its payload holds the needle. */
type PendingConversation = [seq: number, conversation_id: string, named: number];

/** Typed statements and row logic of erasures. */
export class Erasures {
  private readonly insert: Statement<[kind: string, accountId: string, subject: string, reason: string, requestedAt: string, publishedThrough: number]>;
  private readonly setCounts: Statement<[messages: number, history: number, pending: number, conversations: number, published: number, id: number]>;
  private readonly list: Statement<[], StoredErasure>;
  private readonly archived: Statement<[doneAt: string, id: number]>;
  private readonly archiveBatch: Statement<[batchId: number, id: number]>;
  private readonly one: Statement<[id: number], StoredErasure>;
  private readonly publishedSeqsOfAccount: Statement<[through: number, accountId: string], [seq: number, conversation_id: string, record_id: string]>;
  private readonly publishedSeqsOfConversation: Statement<[through: number, accountId: string, conversationId: string], [seq: number, stream: ChangeStream]>;
  private readonly exists: Statement<[id: number], { archive_done_at: string | null }>;
  private readonly earlier: Statement<[accountId: string, kind: string, subject: string], { id: number }>;
  private readonly publishedThrough: Statement<[], { n: number }>;
  private readonly forPage: Statement<{ account: string; conversation: string; senders: string; floor: string | null }, { kind: ErasureKind; subject: string; id: number }>;
  private readonly createdBeforeCandidates: Statement<[accountId: string, upper: string], MessageRow & { created_at: string }>;
  private readonly accounts: Statement<[], { account_id: string }>;
  private readonly bySubject: Statement<[accountId: string, kind: string, subject: string], { id: number }>;
  private readonly forConversations: Statement<[accountId: string, ids: string], { kind: ErasureKind; subject: string; id: number }>;
  private readonly senderConversationCandidates: Statement<[accountId: string, needle: string, mark: string | null], { id: string; raw: string | null }>;
  private readonly pendingConversationsOfAccount: Statement<[{ after: number; account: string; needle: string }], PendingConversation>;
  private readonly publishedConversationSeqsOfAccount: Statement<[through: number, accountId: string], [seq: number, conversation_id: string]>;
  private readonly ofConversationMessages: Statement<[accountId: string, conversationId: string], MessageRow>;
  private readonly senderCandidates: Statement<[accountId: string, needle: string, mark: string | null], MessageRow>;
  private readonly messageByKey: Statement<[accountId: string, conversationId: string, id: string], MessageRow>;
  private readonly senderHistory: Statement<[accountId: string, needle: string], { conversation_id: string; id: string; raw: string }>;
  private readonly historyOfKey: Statement<[accountId: string, conversationId: string, id: string], HistoryRow>;
  private readonly historyOfConversation: Statement<[accountId: string, conversationId: string], HistoryRow>;
  private readonly pendingOfAccount: Statement<[{ after: number; account: string; needle: string | null }], PendingKey>;
  private readonly pendingOfConversation: Statement<[after: number, accountId: string, conversationId: string], PendingKey>;
  private readonly payload: Statement<[seq: number], { record: string | null; line: string | null }>;
  private readonly publishedOfAccount: Statement<[through: number, accountId: string], [conversation_id: string, record_id: string]>;
  private readonly publishedOfConversation: Statement<[through: number, accountId: string, conversationId: string], { n: number }>;
  private readonly conversationRaw: Statement<[accountId: string, id: string], { raw: string | null }>;
  private readonly writeMessage: Statement<[raw: string, rowid: number]>;
  private readonly writeHistory: Statement<[raw: string, rowid: number]>;
  private readonly writePayload: Statement<[record: string, seq: number]>;
  private readonly writeConversation: Statement<[raw: string, accountId: string, id: string]>;

  constructor(db: Db) {
    this.insert = db.prepare(`INSERT INTO erasures (kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations, published_lines, published_through_seq)
                              VALUES (?, ?, ?, ?, ?, 0, 0, 0, 0, 0, ?)`);
    this.setCounts = db.prepare(`UPDATE erasures SET messages = ?, history = ?, pending_changes = ?, conversations = ?, published_lines = ? WHERE id = ?`);
    this.list = db.prepare(`SELECT * FROM erasures ORDER BY id`);
    this.archived = db.prepare(`UPDATE erasures SET archive_done_at = ? WHERE id = ? AND archive_done_at IS NULL`);
    this.archiveBatch = db.prepare(`UPDATE erasures SET archive_batch_id = ? WHERE id = ?`);
    this.one = db.prepare(`SELECT * FROM erasures WHERE id = ?`);
    this.exists = db.prepare(`SELECT archive_done_at FROM erasures WHERE id = ?`);
    this.publishedSeqsOfAccount = db
      .prepare<[number, string], [number, string, string]>(`SELECT seq, conversation_id, record_id FROM change_log WHERE seq <= ? AND account_id = ? AND stream = 'messages' ORDER BY seq`)
      .raw(true);
    this.publishedSeqsOfConversation = db
      .prepare<[number, string, string], [number, ChangeStream]>(
        `SELECT seq, stream FROM change_log WHERE seq <= ? AND account_id = ? AND conversation_id = ? AND stream IN ('messages', 'conversations') ORDER BY seq`,
      )
      .raw(true);
    this.earlier = db.prepare(`SELECT id FROM erasures WHERE account_id = ? AND kind = ? AND subject = ?`);
    // A planned, unpublished batch may have its files in the export directory already, and its
    // re-publication must write the same bytes: its range counts as published.
    this.publishedThrough = db.prepare(
      `SELECT max((SELECT watermark FROM export_state WHERE id = 1), coalesce((SELECT max(last_seq) FROM export_batches WHERE published_at IS NULL), 0)) AS n`,
    );
    this.forPage = db.prepare(
      `SELECT kind, subject, min(id) AS id FROM erasures
       WHERE account_id = @account AND ((kind = 'conversation' AND subject = @conversation)
                                        OR (kind = 'sender' AND subject IN (SELECT value FROM json_each(@senders)))
                                        OR (kind = 'retention' AND subject > @floor))
       GROUP BY kind, subject`,
    );
    // Every message that may be created before a cutoff day (string order, a day of margin for UTC
    // offsets): decided in JS (createdBefore).
    this.createdBeforeCandidates = db.prepare(`SELECT rowid, conversation_id, id, raw, created_at FROM messages WHERE account_id = ? AND created_at < ?`);
    // One probe of the primary key per account (a skip scan), in code-point order.
    this.accounts = db.prepare(
      `WITH RECURSIVE a(id) AS (
         SELECT (SELECT min(account_id) FROM messages)
         UNION ALL SELECT (SELECT min(account_id) FROM messages WHERE account_id > a.id) FROM a WHERE a.id IS NOT NULL)
       SELECT id AS account_id FROM a WHERE id IS NOT NULL`,
    );
    this.bySubject = db.prepare(`SELECT id FROM erasures WHERE account_id = ? AND kind = ? AND subject = ?`);
    // The page's conversations erased, and every sender the account erased (a served conversation
    // may name any of them): one read of the index by subject.
    this.forConversations = db.prepare(
      `SELECT kind, subject, min(id) AS id FROM erasures
       WHERE account_id = ? AND ((kind = 'conversation' AND subject IN (SELECT value FROM json_each(?))) OR kind = 'sender') GROUP BY kind, subject`,
    );
    // The conversations whose text holds the sender's id, or (erasing again) a marker: decided in JS.
    this.senderConversationCandidates = db.prepare(`SELECT id, raw FROM conversations WHERE account_id = ? AND (instr(raw, ?) > 0 OR instr(raw, ?) > 0)`);
    this.pendingConversationsOfAccount = db
      .prepare<[{ after: number; account: string; needle: string }], PendingConversation>(
        `SELECT c.seq, c.conversation_id, coalesce(instr(coalesce(p.record, p.line), @needle) > 0, 0)
         FROM change_log c JOIN change_payloads p ON p.seq = c.seq
         WHERE c.seq > @after AND c.account_id = @account AND c.stream = 'conversations' ORDER BY c.seq`,
      )
      .raw(true);
    this.publishedConversationSeqsOfAccount = db
      .prepare<[number, string], [number, string]>(`SELECT seq, conversation_id FROM change_log WHERE seq <= ? AND account_id = ? AND stream = 'conversations' ORDER BY seq`)
      .raw(true);
    this.ofConversationMessages = db.prepare(`SELECT rowid, conversation_id, id, raw FROM messages WHERE account_id = ? AND conversation_id = ?`);
    // The rows whose text holds the sender's id, or (erasing again) a marker: decided in JS.
    this.senderCandidates = db.prepare(`SELECT rowid, conversation_id, id, raw FROM messages WHERE account_id = ? AND (instr(raw, ?) > 0 OR instr(raw, ?) > 0)`);
    this.messageByKey = db.prepare(`SELECT rowid, conversation_id, id, raw FROM messages WHERE account_id = ? AND conversation_id = ? AND id = ?`);
    this.senderHistory = db.prepare(`SELECT conversation_id, id, raw FROM message_history WHERE account_id = ? AND instr(raw, ?) > 0`);
    this.historyOfKey = db.prepare(`SELECT rowid, id, raw FROM message_history WHERE account_id = ? AND conversation_id = ? AND id = ?`);
    this.historyOfConversation = db.prepare(`SELECT rowid, id, raw FROM message_history WHERE account_id = ? AND conversation_id = ?`);
    // Above the published range: a range of the change log's primary key.
    this.pendingOfAccount = db
      .prepare<[{ after: number; account: string; needle: string | null }], PendingKey>(
        `SELECT c.seq, c.stream, c.conversation_id, c.record_id, coalesce(instr(coalesce(p.record, p.line), @needle) > 0, 0)
         FROM change_log c JOIN change_payloads p ON p.seq = c.seq
         WHERE c.seq > @after AND c.account_id = @account AND c.stream = 'messages' ORDER BY c.seq`,
      )
      .raw(true);
    this.pendingOfConversation = db
      .prepare<[number, string, string], PendingKey>(
        `SELECT c.seq, c.stream, c.conversation_id, c.record_id, 0
         FROM change_log c JOIN change_payloads p ON p.seq = c.seq
         WHERE c.seq > ? AND c.account_id = ? AND c.conversation_id = ? AND c.stream IN ('messages', 'conversations') ORDER BY c.seq`,
      )
      .raw(true);
    this.payload = db.prepare(`SELECT record, line FROM change_payloads WHERE seq = ?`);
    this.publishedOfAccount = db
      .prepare<[number, string], [string, string]>(`SELECT conversation_id, record_id FROM change_log WHERE seq <= ? AND account_id = ? AND stream = 'messages'`)
      .raw(true);
    this.publishedOfConversation = db.prepare(
      `SELECT count(*) AS n FROM change_log WHERE seq <= ? AND account_id = ? AND conversation_id = ? AND stream IN ('messages', 'conversations')`,
    );
    this.conversationRaw = db.prepare(`SELECT raw FROM conversations WHERE account_id = ? AND id = ?`);
    this.writeMessage = db.prepare(`UPDATE messages SET raw = ? WHERE rowid = ?`);
    this.writeHistory = db.prepare(`UPDATE message_history SET raw = ? WHERE rowid = ?`);
    this.writePayload = db.prepare(`UPDATE change_payloads SET record = ?, line = NULL WHERE seq = ?`);
    this.writeConversation = db.prepare(`UPDATE conversations SET raw = ? WHERE account_id = ? AND id = ?`);
  }

  /**
   * The erasures in force for a page of messages of one conversation: those of the conversation,
   * those of the page's senders, and the retention erasures whose cutoff is after `retentionFloor`
   * (`pageRetentionFloor`; undefined: none) (one indexed read).
   */
  inForce(accountId: string, conversationId: string, senderIds: readonly string[], retentionFloor?: string): ErasuresInForce {
    return erasuresInForce(
      conversationId,
      this.forPage.all({ account: accountId, conversation: conversationId, senders: JSON.stringify(senderIds), floor: retentionFloor ?? null }),
    );
  }

  /**
   * The erasures in force for a listing page of the account: the lowest erasure id of each of
   * `ids` (its conversations) that a conversation erasure covers, and of each sender the account
   * erased (one indexed read).
   */
  conversationsInForce(accountId: string, ids: readonly string[]): ConversationErasures {
    return conversationErasures(this.forConversations.all(accountId, JSON.stringify(ids)));
  }

  /** The accounts the mirror holds messages of, in code-point order. */
  messageAccounts(): string[] {
    return this.accounts.all().map((r) => r.account_id);
  }

  /** Every erasure, oldest first. */
  all(): ErasureRow[] {
    return this.list.all().map(erasureRow);
  }

  /**
   * Sets `archive_done_at` of an erasure when not set yet (see `Mirror.recordErasureArchived`).
   *
   * @returns true when set now, false when set before; undefined when there is no such erasure
   */
  setArchived(id: number, doneAt: string): boolean | undefined {
    if (!this.exists.get(id)) return undefined;
    return this.archived.run(doneAt, id).changes > 0;
  }

  /** The erasure `id`; undefined when there is none. */
  get(id: number): ErasureRow | undefined {
    const r = this.one.get(id);
    return r ? erasureRow(r) : undefined;
  }

  /** Sets `archive_batch_id` of an erasure (the batch id reserved for its record). Call inside a transaction. */
  setArchiveBatch(id: number, batchId: number): void {
    this.archiveBatch.run(batchId, id);
  }

  /**
   * The change-log lines at or below `through` that concern `subject` (see `Mirror.subjectLines`),
   * by seq: kind `conversation`, every line of the conversation in the `messages` and
   * `conversations` streams; kind `sender`, every `messages` line of a message of the sender's
   * (one a version of which names it, or the marker of an erasure of the same sender) and every
   * `conversations` line of a conversation of the sender's (likewise: {@link senderConversations}).
   * Call inside a read transaction (one snapshot).
   */
  subjectLines(subject: ErasureSubject, through: number): SubjectLine[] {
    const a = subject.accountId;
    if (subject.kind === 'conversation') return this.publishedSeqsOfConversation.all(through, a, subject.subject).map(([seq, stream]) => ({ seq, stream }));
    const all = new Set(this.earlier.all(a, 'sender', subject.subject).map((r) => r.id));
    const { keys } =
      subject.kind === 'retention'
        ? this.expiredKeys(a, subject.subject, through, new Set(this.bySubject.all(a, 'retention', subject.subject).map((r) => r.id)))
        : this.senderKeys(a, subject.subject, all, through);
    const out: SubjectLine[] = [];
    if (keys.size > 0) for (const [seq, conversationId, recordId] of this.publishedSeqsOfAccount.iterate(through, a)) if (keys.has(messageKey(conversationId, recordId))) out.push({ seq, stream: 'messages' });
    // A retention erasure's lines are its messages' only.
    const ids = subject.kind === 'sender' ? this.senderConversations(a, subject.subject, all, through).ids : new Set<string>();
    if (ids.size > 0) {
      for (const [seq, conversationId] of this.publishedConversationSeqsOfAccount.iterate(through, a)) if (ids.has(conversationId)) out.push({ seq, stream: 'conversations' });
      out.sort((x, y) => x.seq - y.seq);
    }
    return out;
  }

  /**
   * The conversations of sender `s` in account `a`: every conversation a version of which (its
   * row, a change payload above `through`) names the sender ({@link conversationNamesSender}), and
   * those whose row is the marker of an `earlier` erasure of it; with their rows (`raw`) and the
   * unpublished `conversations` changes of the account.
   */
  private senderConversations(a: string, s: string, earlier: ReadonlySet<number>, through: number): { rows: Map<string, string | null>; ids: Set<string>; pending: PendingConversation[] } {
    const needle = senderNeedle(s);
    const rows = new Map<string, string | null>();
    const ids = new Set<string>();
    for (const r of this.senderConversationCandidates.all(a, needle, earlier.size > 0 ? REDACTED_MARK : null)) {
      if (!conversationBelongsToSender(r.raw, s, earlier)) continue;
      ids.add(r.id);
      rows.set(r.id, r.raw);
    }
    const pending = this.pendingConversationsOfAccount.all({ after: through, account: a, needle });
    for (const [seq, conversationId, named] of pending) {
      if (!named || ids.has(conversationId)) continue;
      const p = this.payload.get(seq);
      if (conversationNamesSender(p?.record ?? p?.line ?? null, s)) ids.add(conversationId);
    }
    for (const id of ids) if (!rows.has(id)) rows.set(id, this.conversationRaw.get(a, id)?.raw ?? null);
    return { rows, ids, pending };
  }

  /**
   * The messages of sender `s` in account `a`: every message a version of which (its row, a
   * superseded version, a change payload above `through`) names the sender, and those an `earlier`
   * erasure of it redacted; with their rows (when the mirror has one) and the unpublished changes
   * of the account.
   */
  private senderKeys(a: string, s: string, earlier: ReadonlySet<number>, through: number): { rows: Map<string, MessageRow>; keys: Set<string>; pending: PendingKey[] } {
    const needle = senderNeedle(s);
    const rows = new Map<string, MessageRow>();
    const keys = new Set<string>();
    for (const r of this.senderCandidates.all(a, needle, earlier.size > 0 ? REDACTED_MARK : null)) {
      if (!belongsToSender(r.raw, s, earlier)) continue;
      const k = messageKey(r.conversation_id, r.id);
      keys.add(k);
      rows.set(k, r);
    }
    for (const h of this.senderHistory.all(a, needle)) if (namesSender(h.raw, s)) keys.add(messageKey(h.conversation_id, h.id));
    const pending = this.pendingOfAccount.all({ after: through, account: a, needle });
    for (const [seq, , conversationId, recordId, named] of pending) {
      if (!named) continue;
      const p = this.payload.get(seq);
      if (namesSender(p?.record ?? p?.line ?? null, s)) keys.add(messageKey(conversationId, recordId));
    }
    for (const k of keys) {
      if (rows.has(k)) continue;
      const [conversationId, messageId] = k.split('\0') as [string, string];
      const r = this.messageByKey.get(a, conversationId, messageId);
      if (r) rows.set(k, r);
    }
    return { rows, keys, pending };
  }

  /**
   * The messages of account `a` a retention erasure of cutoff day `cutoff` erases (see
   * {@link expiredRecord}: created before the day, and not redacted by another erasure than one of
   * `own`), with their rows and the unpublished changes of the account.
   */
  private expiredKeys(a: string, cutoff: string, through: number, own: ReadonlySet<number>): { rows: Map<string, MessageRow>; keys: Set<string>; pending: PendingKey[] } {
    const rows = new Map<string, MessageRow>();
    for (const r of this.createdBeforeCandidates.iterate(a, dayAfter(cutoff))) if (expiredRecord(r.raw, r.created_at, cutoff, own)) rows.set(messageKey(r.conversation_id, r.id), r);
    return { rows, keys: new Set(rows.keys()), pending: rows.size > 0 ? this.pendingOfAccount.all({ after: through, account: a, needle: null }) : [] };
  }

  /**
   * Erases a subject (see `Mirror.eraseSubject`; the request is checked by the caller). Call inside
   * an immediate transaction, or a read transaction for a dry run (which writes nothing).
   *
   * @param now - the erasure's `requested_at`
   */
  erase(req: ErasureRequest, now: string, dryRun: boolean): ErasureResult {
    const through = this.publishedThrough.get()?.n ?? 0;
    const erasureId = dryRun ? undefined : Number(this.insert.run(req.kind, req.accountId, req.subject, req.reason, now, through).lastInsertRowid);
    // A dry run computes the markers with a stand-in id and writes none of them.
    const id = erasureId ?? 0;
    const counts: ErasureCounts = { messages: 0, history: 0, pendingChanges: 0, conversations: 0, publishedLines: 0 };
    const a = req.accountId;

    /** Writes `write(marker)` for a record not redacted yet; returns whether it did (or would). */
    const redact = (record: string | null, marker: () => string, write: (m: string) => void): boolean => {
      if (record === null || redactionOf(record) !== undefined) return false;
      if (!dryRun) write(marker());
      return true;
    };

    if (req.kind === 'conversation') {
      const c = req.subject;
      for (const r of this.ofConversationMessages.all(a, c)) if (redact(r.raw, () => redactedMessage(r.raw, id, r.id), (m) => this.writeMessage.run(m, r.rowid))) counts.messages++;
      for (const h of this.historyOfConversation.all(a, c)) if (redact(h.raw, () => redactedMessage(h.raw, id, h.id), (m) => this.writeHistory.run(m, h.rowid))) counts.history++;
      for (const [seq, stream, , recordId] of this.pendingOfConversation.all(through, a, c)) {
        const p = this.payload.get(seq);
        const record = p?.record ?? p?.line ?? null;
        const marker = () => (stream === 'conversations' ? redactedConversation(c, id) : redactedMessage(record!, id, recordId));
        if (redact(record, marker, (m) => this.writePayload.run(m, seq))) counts.pendingChanges++;
      }
      const conv = this.conversationRaw.get(a, c);
      if (conv && redact(conv.raw, () => redactedConversation(c, id), (m) => this.writeConversation.run(m, a, c))) counts.conversations++;
      counts.publishedLines = this.publishedOfConversation.get(through, a, c)?.n ?? 0;
    } else {
      const s = req.subject;
      // The subject's messages. A sender's: every message a version of which (its row, a
      // superseded version, an unpublished payload) names the sender, and those an earlier erasure
      // of it redacted. A retention cutoff's: every message created before the day.
      const earlier = req.kind === 'sender' ? new Set(this.earlier.all(a, 'sender', s).map((r) => r.id).filter((n) => n !== erasureId)) : new Set<number>();
      const { rows, keys, pending } = req.kind === 'retention' ? this.expiredKeys(a, s, through, new Set()) : this.senderKeys(a, s, earlier, through);
      for (const r of rows.values()) if (redact(r.raw, () => redactedMessage(r.raw, id, r.id), (m) => this.writeMessage.run(m, r.rowid))) counts.messages++;
      for (const k of keys) {
        const [conversationId, messageId] = k.split('\0') as [string, string];
        for (const h of this.historyOfKey.all(a, conversationId, messageId)) {
          if (redact(h.raw, () => redactedMessage(h.raw, id, h.id), (m) => this.writeHistory.run(m, h.rowid))) counts.history++;
        }
      }
      for (const [seq, , conversationId, recordId] of pending) {
        if (!keys.has(messageKey(conversationId, recordId))) continue;
        const p = this.payload.get(seq);
        const record = p?.record ?? p?.line ?? null;
        if (redact(record, () => redactedMessage(record!, id, recordId), (m) => this.writePayload.run(m, seq))) counts.pendingChanges++;
      }
      if (keys.size > 0) for (const [conversationId, recordId] of this.publishedOfAccount.iterate(through, a)) if (keys.has(messageKey(conversationId, recordId))) counts.publishedLines++;
      // The sender's conversations: every conversation a version of which (its row, an unpublished
      // payload) names the sender, and those an earlier erasure of it redacted; their rows and
      // unpublished payloads become the conversation's marker. (A retention erasure's: none.)
      const convs = req.kind === 'sender' ? this.senderConversations(a, s, earlier, through) : { rows: new Map<string, string | null>(), ids: new Set<string>(), pending: [] };
      for (const [c, raw] of convs.rows) if (redact(raw, () => redactedConversation(c, id), (m) => this.writeConversation.run(m, a, c))) counts.conversations++;
      for (const [seq, c] of convs.pending) {
        if (!convs.ids.has(c)) continue;
        const p = this.payload.get(seq);
        if (redact(p?.record ?? p?.line ?? null, () => redactedConversation(c, id), (m) => this.writePayload.run(m, seq))) counts.pendingChanges++;
      }
      if (convs.ids.size > 0) for (const [, c] of this.publishedConversationSeqsOfAccount.iterate(through, a)) if (convs.ids.has(c)) counts.publishedLines++;
    }
    if (erasureId !== undefined) this.setCounts.run(counts.messages, counts.history, counts.pendingChanges, counts.conversations, counts.publishedLines, erasureId);
    return { ...counts, erasureId, dryRun, publishedThroughSeq: through };
  }
}
