/**
 * Erasures on PostgreSQL (issue 26, the mirror side; the SQLite group: src/store/sqlite/erasures.ts,
 * whose rules this ports one for one): the `erasures` table, the redaction of a subject's rows
 * (`messages`, `message_history`, unpublished `change_payloads`, a conversation's own row) and the
 * erasures in force that a page committed later applies as it arrives. What a redacted record is
 * belongs to src/store/redaction.ts. A redacted row's `raw_text` is the marker and its `raw` the
 * same as jsonb (NULL where jsonb cannot hold it, as for any record: `jsonbSafe`); the STORED
 * generated columns follow (content, visibility, sender_*, attachments NULL; created_at kept).
 *
 * Concurrency (the fleet): an erasure must not interleave with a transaction that writes the
 * subject's rows, or a page read before the erasure committed could write an unredacted message
 * after it. Every transaction that writes message or conversation records (a message page, a
 * listing page, a tombstone, a crawl's completion) takes the account's erasure gate SHARED as its
 * first statement ({@link erasureGateKey}, `pg_advisory_xact_lock_shared`), and an erasure takes
 * it EXCLUSIVE: an erasure waits for the account's writers in flight to commit, and the writers
 * that come after it wait for its commit, then (READ COMMITTED: each statement a new snapshot)
 * see its `erasures` row. Shared holders never wait for each other. An erasure also locks
 * `export_state`'s row before it reads the export watermark and the planned batch, so no batch is
 * planned meanwhile (planning locks that row too): every change it leaves unredacted is in a batch
 * planned before it (the archive step's), and every batch planned after it reads redacted payloads.
 */
import type pg from 'pg';
import type { Queryable } from './db.js';
import { qualify } from './db.js';
import { NUMBERS } from './int8.js';
import { jsonbSafe } from './change-log.js';
import {
  belongsToSender,
  conversationBelongsToSender,
  conversationErasures,
  conversationNamesSender,
  createdAtOf,
  dayAfter,
  erasureRow,
  erasuresInForce,
  expiredRecord,
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
import type { ErasureCounts, ErasureKind, ErasureRequest, ErasureResult, ErasureRow, ErasureSubject, SubjectLine } from '../types.js';

/**
 * The DDL of `erasures` in `schema` (migration 2): SQLite's columns and meanings (migration 9 there);
 * ids are given by the erasure itself (max + 1 while it holds `export_state`'s row: ascending from
 * 1, no gap), texts `COLLATE "C"` keys, counts `bigint`.
 */
export const ERASURES_DDL = (schema: string): string[] => {
  const t = (table: string) => qualify(schema, table);
  return [
    `CREATE TABLE ${t('erasures')} (
      id                    bigint PRIMARY KEY CHECK (id >= 1), -- ascending from 1
      kind                  text COLLATE "C" NOT NULL CHECK (kind IN ('sender', 'conversation')),
      account_id            text COLLATE "C" NOT NULL,
      subject               text COLLATE "C" NOT NULL,         -- the sender id or the conversation id
      reason                text NOT NULL CHECK (length(btrim(reason)) > 0),
      requested_at          text NOT NULL,                     -- ISO 8601 UTC, the mirror's clock
      messages              bigint NOT NULL,                   -- messages rows redacted
      history               bigint NOT NULL,                   -- message_history rows redacted
      pending_changes       bigint NOT NULL,                   -- unpublished change payloads redacted
      conversations         bigint NOT NULL,                   -- conversations rows redacted (0 or 1)
      published_lines       bigint NOT NULL,                   -- change-log lines at or below published_through_seq that concern the subject
      published_through_seq bigint NOT NULL,                   -- every line at or below it may be published: the archive step rewrites them
      archive_done_at       text                               -- when the archive step finished; NULL until then
    )`,
    `CREATE INDEX erasures_by_subject ON ${t('erasures')} (account_id, kind, subject)`,
  ];
};

/**
 * Migration 3 (SQLite's 10): the batch id reserved for an erasure's record in the ledger
 * (`Mirror.planErasureRecord`), so an archive step interrupted at any point writes the same record
 * under the same name, and one interrupted after the record was recorded deletes what it replaced.
 */
export const ERASURES_ARCHIVE_DDL = (schema: string): string[] => [
  `ALTER TABLE ${qualify(schema, 'erasures')} ADD COLUMN archive_batch_id bigint -- the erasure record's batch id in the ledger; NULL until reserved`,
];

/**
 * Migration 5 (SQLite's 12): erasures of kind `retention` (`--prune-mirror`), whose subject is a
 * cutoff day. The CHECK of migration 2 is replaced under the name PostgreSQL gave it.
 */
export const ERASURES_RETENTION_DDL = (schema: string): string[] => [
  `ALTER TABLE ${qualify(schema, 'erasures')} DROP CONSTRAINT erasures_kind_check`,
  `ALTER TABLE ${qualify(schema, 'erasures')} ADD CONSTRAINT erasures_kind_check CHECK (kind IN ('sender', 'conversation', 'retention'))`,
];

/** A `messages` row as the erasure reads it. */
interface MessageRow {
  conversation_id: string;
  id: string;
  raw: string;
}
/** A `message_history` row as the erasure reads it (`replaced_by_seq` is one row's own). */
interface HistoryRow {
  seq: number;
  id: string;
  raw: string;
}
/** An unpublished change of the account: its keys (the payload is read when it concerns the subject). */
interface PendingKey {
  seq: number;
  stream: string;
  conversation_id: string;
  record_id: string;
  named: boolean;
}

/** An unpublished `conversations` change of the account: its seq, the conversation, whether its payload holds the needle. */
interface PendingConversation {
  seq: number;
  conversation_id: string;
  named: boolean;
}

/** Rows written by one redaction statement, at most. */
const WRITE_CHUNK = 1000;

/** Calls `write` with `rows` in slices of at most {@link WRITE_CHUNK}, one after the other. */
async function inChunks<T>(rows: readonly T[], write: (chunk: readonly T[]) => Promise<unknown>): Promise<void> {
  for (let i = 0; i < rows.length; i += WRITE_CHUNK) await write(rows.slice(i, i + WRITE_CHUNK));
}

/** The statements of erasures in one schema; every method takes the executor. */
export class Erasures {
  private readonly t: (table: string) => string;

  /** @param schema - the mirror's schema (a validated identifier) */
  constructor(schema: string) {
    this.t = (table) => qualify(schema, table);
  }

  private async all<T>(q: Queryable, text: string, values: unknown[] = []): Promise<T[]> {
    return (await q.query<T & pg.QueryResultRow>({ text, values, types: NUMBERS })).rows;
  }

  /**
   * The erasures in force for a page of messages of one conversation: those of the conversation,
   * those of the page's senders, and the retention erasures whose cutoff is after `retentionFloor`
   * (`pageRetentionFloor`; undefined: none) (one indexed read). Call after the erasure gate was
   * taken shared, in a statement of its own (see the module comment).
   */
  async inForce(q: Queryable, accountId: string, conversationId: string, senderIds: readonly string[], retentionFloor?: string): Promise<ErasuresInForce> {
    const rows = await this.all<{ kind: ErasureKind; subject: string; id: number }>(
      q,
      `SELECT kind, subject, min(id) AS id FROM ${this.t('erasures')}
       WHERE account_id = $1 AND ((kind = 'conversation' AND subject = $2) OR (kind = 'sender' AND subject = ANY ($3::text[]))
                                  OR (kind = 'retention' AND subject > $4::text))
       GROUP BY kind, subject`,
      [accountId, conversationId, senderIds, retentionFloor ?? null],
    );
    return erasuresInForce(conversationId, rows);
  }

  /**
   * The erasures in force for a listing page of the account: the lowest erasure id of each of
   * `ids` (its conversations) that a conversation erasure covers, and of each sender the account
   * erased (one indexed read). Call after the erasure gate was taken shared.
   */
  async conversationsInForce(q: Queryable, accountId: string, ids: readonly string[]): Promise<ConversationErasures> {
    const rows = await this.all<{ kind: ErasureKind; subject: string; id: number }>(
      q,
      `SELECT kind, subject, min(id) AS id FROM ${this.t('erasures')}
       WHERE account_id = $1 AND ((kind = 'conversation' AND subject = ANY ($2::text[])) OR kind = 'sender') GROUP BY kind, subject`,
      [accountId, ids],
    );
    return conversationErasures(rows);
  }

  /** Every erasure, oldest first. */
  async list(q: Queryable): Promise<ErasureRow[]> {
    const rows = await this.all<StoredErasure>(q, `SELECT * FROM ${this.t('erasures')} ORDER BY id`);
    return rows.map(erasureRow);
  }

  /** The erasure `id`; undefined when there is none. */
  async get(q: Queryable, id: number, forUpdate = false): Promise<ErasureRow | undefined> {
    const rows = await this.all<StoredErasure>(q, `SELECT * FROM ${this.t('erasures')} WHERE id = $1${forUpdate ? ' FOR UPDATE' : ''}`, [id]);
    return rows[0] ? erasureRow(rows[0]) : undefined;
  }

  /** Sets `archive_batch_id` of an erasure (the batch id reserved for its record). */
  async setArchiveBatch(q: Queryable, id: number, batchId: number): Promise<void> {
    await q.query({ text: `UPDATE ${this.t('erasures')} SET archive_batch_id = $1 WHERE id = $2`, values: [batchId, id] });
  }

  /**
   * The change-log lines at or below `through` that concern `subject` (see `Mirror.subjectLines`),
   * by seq. Call inside one snapshot.
   */
  async subjectLines(q: Queryable, subject: ErasureSubject, through: number): Promise<SubjectLine[]> {
    const a = subject.accountId;
    if (subject.kind === 'conversation') {
      return this.all<SubjectLine>(
        q,
        `SELECT seq, stream FROM ${this.t('change_log')} WHERE seq <= $1 AND account_id = $2 AND conversation_id = $3 AND stream IN ('messages', 'conversations') ORDER BY seq`,
        [through, a, subject.subject],
      );
    }
    let keys: Set<string>;
    let convs: { ids: Set<string> } = { ids: new Set() };
    if (subject.kind === 'retention') {
      ({ keys } = await this.expiredKeys(q, a, subject.subject, through, new Set((await this.ofKind(q, a, 'retention', subject.subject)).map((r) => r.id))));
    } else {
      const earlier = new Set((await this.earlierOf(q, a, subject.subject)).map((r) => r.id));
      ({ keys } = await this.senderKeys(q, a, subject.subject, earlier, through));
      convs = await this.senderConversations(q, a, subject.subject, earlier, through);
    }
    if (keys.size === 0 && convs.ids.size === 0) return [];
    const all = [...keys].map((k) => k.split('\0') as [string, string]);
    // The sender's messages' lines, and (as the SQLite group) every line of the sender's conversations.
    return this.all<SubjectLine>(
      q,
      `SELECT c.seq, c.stream FROM ${this.t('change_log')} c
       JOIN unnest($3::text[], $4::text[]) AS k(cid, mid) ON c.conversation_id = k.cid AND c.record_id = k.mid
       WHERE c.seq <= $1 AND c.account_id = $2 AND c.stream = 'messages'
       UNION ALL
       SELECT c.seq, c.stream FROM ${this.t('change_log')} c
       WHERE c.seq <= $1 AND c.account_id = $2 AND c.stream = 'conversations' AND c.conversation_id = ANY ($5::text[])
       ORDER BY seq`,
      [through, a, all.map((k) => k[0]), all.map((k) => k[1]), [...convs.ids]],
    );
  }

  /**
   * The conversations of sender `s` in account `a` (the SQLite group's rule): every conversation a
   * version of which (its row, a change payload above `through`) names the sender
   * ({@link conversationNamesSender}), and those whose row is the marker of an `earlier` erasure of
   * it; with their rows (`raw_text`) and the unpublished `conversations` changes of the account.
   */
  private async senderConversations(
    q: Queryable,
    a: string,
    s: string,
    earlier: ReadonlySet<number>,
    through: number,
  ): Promise<{ rows: Map<string, string | null>; ids: Set<string>; pending: PendingConversation[] }> {
    const needle = senderNeedle(s);
    const rows = new Map<string, string | null>();
    const ids = new Set<string>();
    const candidates = await this.all<{ id: string; raw: string | null }>(
      q,
      `SELECT id, raw_text AS raw FROM ${this.t('conversations')} WHERE account_id = $1 AND (strpos(raw_text, $2) > 0 OR strpos(raw_text, $3::text) > 0)`,
      [a, needle, earlier.size > 0 ? REDACTED_MARK : null],
    );
    for (const r of candidates) {
      if (!conversationBelongsToSender(r.raw, s, earlier)) continue;
      ids.add(r.id);
      rows.set(r.id, r.raw);
    }
    const pending = await this.all<PendingConversation>(
      q,
      `SELECT c.seq, c.conversation_id, coalesce(strpos(coalesce(p.record, p.line), $3) > 0, false) AS named
       FROM ${this.t('change_log')} c JOIN ${this.t('change_payloads')} p ON p.seq = c.seq
       WHERE c.seq > $1 AND c.account_id = $2 AND c.stream = 'conversations' ORDER BY c.seq`,
      [through, a, needle],
    );
    const named = await this.payloads(q, pending.filter((p) => p.named && !ids.has(p.conversation_id)).map((p) => p.seq));
    for (const p of pending) if (named.has(p.seq) && conversationNamesSender(named.get(p.seq) ?? null, s)) ids.add(p.conversation_id);
    const missing = [...ids].filter((id) => !rows.has(id));
    if (missing.length > 0) {
      const more = await this.all<{ id: string; raw: string | null }>(
        q,
        `SELECT id, raw_text AS raw FROM ${this.t('conversations')} WHERE account_id = $1 AND id = ANY ($2::text[])`,
        [a, missing],
      );
      for (const r of more) rows.set(r.id, r.raw);
    }
    return { rows, ids, pending };
  }

  /**
   * The messages of sender `s` in account `a`: every message a version of which (its row, a
   * superseded version, a change payload above `through`) names the sender, and those an `earlier`
   * erasure of it redacted; with their rows (when the mirror has one) and the unpublished changes
   * of the account.
   */
  private async senderKeys(q: Queryable, a: string, s: string, earlier: ReadonlySet<number>, through: number): Promise<{ rows: Map<string, MessageRow>; keys: Set<string>; pending: PendingKey[] }> {
    const needle = senderNeedle(s);
    const rows = new Map<string, MessageRow>();
    const keys = new Set<string>();
    const candidates = await this.all<MessageRow>(
      q,
      `SELECT conversation_id, id, raw_text AS raw FROM ${this.t('messages')}
       WHERE account_id = $1 AND (strpos(raw_text, $2) > 0 OR strpos(raw_text, $3::text) > 0)`,
      [a, needle, earlier.size > 0 ? REDACTED_MARK : null],
    );
    for (const r of candidates) {
      if (!belongsToSender(r.raw, s, earlier)) continue;
      const k = messageKey(r.conversation_id, r.id);
      keys.add(k);
      rows.set(k, r);
    }
    const named = await this.all<{ conversation_id: string; id: string; raw: string }>(
      q,
      `SELECT conversation_id, id, raw_text AS raw FROM ${this.t('message_history')} WHERE account_id = $1 AND strpos(raw_text, $2) > 0`,
      [a, needle],
    );
    for (const h of named) if (namesSender(h.raw, s)) keys.add(messageKey(h.conversation_id, h.id));
    const pending = await this.all<PendingKey>(
      q,
      `SELECT c.seq, c.stream, c.conversation_id, c.record_id, coalesce(strpos(coalesce(p.record, p.line), $3) > 0, false) AS named
       FROM ${this.t('change_log')} c JOIN ${this.t('change_payloads')} p ON p.seq = c.seq
       WHERE c.seq > $1 AND c.account_id = $2 AND c.stream = 'messages' ORDER BY c.seq`,
      [through, a, needle],
    );
    const namedPayloads = await this.payloads(q, pending.filter((p) => p.named).map((p) => p.seq));
    for (const p of pending) if (p.named && namesSender(namedPayloads.get(p.seq) ?? null, s)) keys.add(messageKey(p.conversation_id, p.record_id));
    const missing = [...keys].filter((k) => !rows.has(k)).map((k) => k.split('\0') as [string, string]);
    if (missing.length > 0) {
      const more = await this.all<MessageRow>(
        q,
        `SELECT m.conversation_id, m.id, m.raw_text AS raw FROM ${this.t('messages')} m
         JOIN unnest($2::text[], $3::text[]) AS k(cid, mid) ON m.conversation_id = k.cid AND m.id = k.mid WHERE m.account_id = $1`,
        [a, missing.map((k) => k[0]), missing.map((k) => k[1])],
      );
      for (const r of more) rows.set(messageKey(r.conversation_id, r.id), r);
    }
    return { rows, keys, pending };
  }

  /** The erasures of sender `s` in account `a`. */
  private earlierOf(q: Queryable, a: string, s: string): Promise<{ id: number }[]> {
    return this.ofKind(q, a, 'sender', s);
  }

  /** The erasures of `kind` and `subject` in account `a`. */
  private ofKind(q: Queryable, a: string, kind: ErasureKind, subject: string): Promise<{ id: number }[]> {
    return this.all<{ id: number }>(q, `SELECT id FROM ${this.t('erasures')} WHERE account_id = $1 AND kind = $2 AND subject = $3`, [a, kind, subject]);
  }

  /** The accounts the mirror holds messages of, in code-point order. */
  async messageAccounts(q: Queryable): Promise<string[]> {
    // One probe of the primary key per account (a skip scan); COLLATE "C" keys: code-point order.
    const m = this.t('messages');
    const rows = await this.all<{ account_id: string }>(
      q,
      `WITH RECURSIVE a(id) AS (
         SELECT (SELECT min(account_id) FROM ${m})
         UNION ALL SELECT (SELECT min(account_id) FROM ${m} WHERE account_id > a.id) FROM a WHERE a.id IS NOT NULL)
       SELECT id AS account_id FROM a WHERE id IS NOT NULL`,
    );
    return rows.map((r) => r.account_id);
  }

  /**
   * The messages of account `a` a retention erasure of cutoff day `cutoff` erases (see
   * `expiredRecord`: created before the day, and not redacted by another erasure than one of
   * `own`), with their rows and the unpublished changes of the account.
   */
  private async expiredKeys(q: Queryable, a: string, cutoff: string, through: number, own: ReadonlySet<number>): Promise<{ rows: Map<string, MessageRow>; keys: Set<string>; pending: PendingKey[] }> {
    // String order with a day of margin for UTC offsets; decided in JS (createdBefore). A record
    // jsonb cannot hold (a \u0000, a lone surrogate: `raw` NULL, so `created_at` NULL too) is read
    // from `raw_text`, as SQLite reads every record.
    const candidates = await this.all<MessageRow & { created_at: string | null }>(
      q,
      `SELECT conversation_id, id, raw_text AS raw, created_at FROM ${this.t('messages')}
       WHERE account_id = $1 AND (created_at < $2 OR (raw IS NULL AND raw_text IS NOT NULL))`,
      [a, dayAfter(cutoff)],
    );
    const rows = new Map<string, MessageRow>();
    for (const r of candidates) {
      if (expiredRecord(r.raw, r.created_at ?? createdAtOf(r.raw), cutoff, own)) rows.set(messageKey(r.conversation_id, r.id), r);
    }
    const pending =
      rows.size === 0
        ? []
        : await this.all<PendingKey>(
            q,
            `SELECT c.seq, c.stream, c.conversation_id, c.record_id, false AS named
             FROM ${this.t('change_log')} c JOIN ${this.t('change_payloads')} p ON p.seq = c.seq
             WHERE c.seq > $1 AND c.account_id = $2 AND c.stream = 'messages' ORDER BY c.seq`,
            [through, a],
          );
    return { rows, keys: new Set(rows.keys()), pending };
  }

  /**
   * Sets `archive_done_at` of an erasure when not set yet (one statement).
   *
   * @returns true when set now, false when set before; undefined when there is no such erasure
   */
  async setArchived(q: Queryable, id: number, doneAt: string): Promise<boolean | undefined> {
    const r = await this.all<{ done: boolean }>(
      q,
      `WITH e AS (SELECT id FROM ${this.t('erasures')} WHERE id = $1),
            u AS (UPDATE ${this.t('erasures')} SET archive_done_at = $2 WHERE id = $1 AND archive_done_at IS NULL RETURNING id)
       SELECT EXISTS (SELECT 1 FROM u) AS done FROM e`,
      [id, doneAt],
    );
    return r[0]?.done;
  }

  /**
   * Erases a subject (see `Mirror.eraseSubject`; the request is checked by the caller). Call
   * inside a write transaction holding the account's erasure gate exclusive, or (dry run, which
   * writes and locks nothing) inside a read snapshot.
   *
   * @param now - the erasure's `requested_at`
   */
  async erase(q: Queryable, req: ErasureRequest, now: string, dryRun: boolean): Promise<ErasureResult> {
    // Planning waits from here (it locks this row first): see the module comment. Then, in a
    // statement of its own (a snapshot taken after the lock), the watermark and a planned batch.
    if (!dryRun) await q.query(`SELECT 1 FROM ${this.t('export_state')} WHERE id = 1 FOR UPDATE`);
    const through =
      (
        await this.all<{ n: number }>(
          q,
          `SELECT greatest((SELECT watermark FROM ${this.t('export_state')} WHERE id = 1),
                           (SELECT coalesce(max(last_seq), 0) FROM ${this.t('export_batches')} WHERE published_at IS NULL))::bigint AS n`,
        )
      )[0]?.n ?? 0;
    let erasureId: number | undefined;
    if (!dryRun) {
      const r = await this.all<{ id: number }>(
        q,
        `INSERT INTO ${this.t('erasures')} (id, kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations, published_lines, published_through_seq)
         SELECT coalesce(max(id), 0) + 1, $1, $2, $3, $4, $5, 0, 0, 0, 0, 0, $6 FROM ${this.t('erasures')} RETURNING id`,
        [req.kind, req.accountId, req.subject, req.reason, now, through],
      );
      erasureId = r[0]!.id;
    }
    const id = erasureId ?? 0;
    const a = req.accountId;
    const counts: ErasureCounts = { messages: 0, history: 0, pendingChanges: 0, conversations: 0, publishedLines: 0 };
    /** Records to write: a row's identity and its marker. */
    const messageWrites: { cid: string; id: string; marker: string }[] = [];
    const historyWrites: { seq: number; marker: string }[] = [];
    const payloadWrites: { seq: number; marker: string }[] = [];
    const conversationWrites: { id: string; marker: string }[] = [];
    const open = (record: string | null): record is string => record !== null && redactionOf(record) === undefined;

    if (req.kind === 'conversation') {
      const c = req.subject;
      const rows = await this.all<MessageRow>(q, `SELECT conversation_id, id, raw_text AS raw FROM ${this.t('messages')} WHERE account_id = $1 AND conversation_id = $2`, [a, c]);
      for (const r of rows) if (open(r.raw)) messageWrites.push({ cid: r.conversation_id, id: r.id, marker: redactedMessage(r.raw, id, r.id) });
      const history = await this.all<HistoryRow>(
        q,
        `SELECT replaced_by_seq AS seq, id, raw_text AS raw FROM ${this.t('message_history')} WHERE account_id = $1 AND conversation_id = $2`,
        [a, c],
      );
      for (const h of history) if (open(h.raw)) historyWrites.push({ seq: h.seq, marker: redactedMessage(h.raw, id, h.id) });
      const pending = await this.all<PendingKey>(
        q,
        `SELECT c.seq, c.stream, c.conversation_id, c.record_id, false AS named
         FROM ${this.t('change_log')} c JOIN ${this.t('change_payloads')} p ON p.seq = c.seq
         WHERE c.seq > $1 AND c.account_id = $2 AND c.conversation_id = $3 AND c.stream IN ('messages', 'conversations') ORDER BY c.seq`,
        [through, a, c],
      );
      const payloads = await this.payloads(q, pending.map((p) => p.seq));
      for (const p of pending) {
        const record = payloads.get(p.seq) ?? null;
        if (open(record)) payloadWrites.push({ seq: p.seq, marker: p.stream === 'conversations' ? redactedConversation(c, id) : redactedMessage(record, id, p.record_id) });
      }
      const conv = await this.all<{ raw: string | null }>(q, `SELECT raw_text AS raw FROM ${this.t('conversations')} WHERE account_id = $1 AND id = $2`, [a, c]);
      if (conv[0] && open(conv[0].raw)) {
        counts.conversations = 1;
        if (!dryRun) {
          const marker = redactedConversation(c, id);
          await q.query(`UPDATE ${this.t('conversations')} SET raw = CASE WHEN $4::bool THEN $3::text::jsonb END, raw_text = $3 WHERE account_id = $1 AND id = $2`, [
            a,
            c,
            marker,
            jsonbSafe(marker),
          ]);
        }
      }
      counts.publishedLines = (
        await this.all<{ n: number }>(
          q,
          `SELECT count(*) AS n FROM ${this.t('change_log')} WHERE seq <= $1 AND account_id = $2 AND conversation_id = $3 AND stream IN ('messages', 'conversations')`,
          [through, a, c],
        )
      )[0]!.n;
    } else {
      const s = req.subject;
      // The subject's messages. A sender's: every message a version of which (its row, a
      // superseded version, an unpublished payload) names the sender, and those an earlier erasure
      // of it redacted. A retention cutoff's: every message created before the day.
      const earlier = req.kind === 'sender' ? new Set((await this.earlierOf(q, a, s)).map((r) => r.id).filter((n) => n !== erasureId)) : new Set<number>();
      const { rows, keys, pending } = req.kind === 'retention' ? await this.expiredKeys(q, a, s, through, new Set()) : await this.senderKeys(q, a, s, earlier, through);
      for (const r of rows.values()) if (open(r.raw)) messageWrites.push({ cid: r.conversation_id, id: r.id, marker: redactedMessage(r.raw, id, r.id) });
      const all = [...keys].map((k) => k.split('\0') as [string, string]);
      if (all.length > 0) {
        const history = await this.all<HistoryRow>(
          q,
          `SELECT h.replaced_by_seq AS seq, h.id, h.raw_text AS raw FROM ${this.t('message_history')} h
           JOIN unnest($2::text[], $3::text[]) AS k(cid, mid) ON h.conversation_id = k.cid AND h.id = k.mid WHERE h.account_id = $1`,
          [a, all.map((k) => k[0]), all.map((k) => k[1])],
        );
        for (const h of history) if (open(h.raw)) historyWrites.push({ seq: h.seq, marker: redactedMessage(h.raw, id, h.id) });
        const ofSubject = pending.filter((p) => keys.has(messageKey(p.conversation_id, p.record_id)));
        const payloads = await this.payloads(q, ofSubject.map((p) => p.seq));
        for (const p of ofSubject) {
          const record = payloads.get(p.seq) ?? null;
          if (open(record)) payloadWrites.push({ seq: p.seq, marker: redactedMessage(record, id, p.record_id) });
        }
        counts.publishedLines = (
          await this.all<{ n: number }>(
            q,
            `SELECT count(*) AS n FROM ${this.t('change_log')} c
             JOIN unnest($3::text[], $4::text[]) AS k(cid, mid) ON c.conversation_id = k.cid AND c.record_id = k.mid
             WHERE c.seq <= $1 AND c.account_id = $2 AND c.stream = 'messages'`,
            [through, a, all.map((k) => k[0]), all.map((k) => k[1])],
          )
        )[0]!.n;
      }
      // The sender's conversations: every conversation a version of which (its row, an unpublished
      // payload) names the sender, and those an earlier erasure of it redacted; their rows and
      // unpublished payloads become the conversation's marker. (A retention erasure's: none.)
      const convs = req.kind === 'sender' ? await this.senderConversations(q, a, s, earlier, through) : { rows: new Map<string, string | null>(), ids: new Set<string>(), pending: [] };
      for (const [c, raw] of convs.rows) if (open(raw)) conversationWrites.push({ id: c, marker: redactedConversation(c, id) });
      const ofConversations = convs.pending.filter((p) => convs.ids.has(p.conversation_id));
      const convPayloads = await this.payloads(q, ofConversations.map((p) => p.seq));
      for (const p of ofConversations) if (open(convPayloads.get(p.seq) ?? null)) payloadWrites.push({ seq: p.seq, marker: redactedConversation(p.conversation_id, id) });
      if (convs.ids.size > 0) {
        counts.publishedLines += (
          await this.all<{ n: number }>(
            q,
            `SELECT count(*) AS n FROM ${this.t('change_log')} WHERE seq <= $1 AND account_id = $2 AND stream = 'conversations' AND conversation_id = ANY ($3::text[])`,
            [through, a, [...convs.ids]],
          )
        )[0]!.n;
      }
      counts.conversations = conversationWrites.length;
    }

    counts.messages = messageWrites.length;
    counts.history = historyWrites.length;
    counts.pendingChanges = payloadWrites.length;
    if (erasureId !== undefined) {
      await inChunks(messageWrites, (w) =>
        q.query(
          `UPDATE ${this.t('messages')} m SET raw = CASE WHEN u.ok THEN u.marker::jsonb END, raw_text = u.marker
           FROM unnest($2::text[], $3::text[], $4::text[], $5::bool[]) AS u(cid, mid, marker, ok)
           WHERE m.account_id = $1 AND m.conversation_id = u.cid AND m.id = u.mid`,
          [a, w.map((x) => x.cid), w.map((x) => x.id), w.map((x) => x.marker), w.map((x) => jsonbSafe(x.marker))],
        ),
      );
      await inChunks(historyWrites, (w) =>
        q.query(
          `UPDATE ${this.t('message_history')} h SET raw = CASE WHEN u.ok THEN u.marker::jsonb END, raw_text = u.marker
           FROM unnest($2::bigint[], $3::text[], $4::bool[]) AS u(seq, marker, ok)
           WHERE h.account_id = $1 AND h.replaced_by_seq = u.seq`,
          [a, w.map((x) => x.seq), w.map((x) => x.marker), w.map((x) => jsonbSafe(x.marker))],
        ),
      );
      await inChunks(conversationWrites, (w) =>
        q.query(
          `UPDATE ${this.t('conversations')} c SET raw = CASE WHEN u.ok THEN u.marker::jsonb END, raw_text = u.marker
           FROM unnest($2::text[], $3::text[], $4::bool[]) AS u(id, marker, ok)
           WHERE c.account_id = $1 AND c.id = u.id`,
          [a, w.map((x) => x.id), w.map((x) => x.marker), w.map((x) => jsonbSafe(x.marker))],
        ),
      );
      await inChunks(payloadWrites, (w) =>
        q.query(
          `UPDATE ${this.t('change_payloads')} p SET record = u.marker, line = NULL FROM unnest($1::bigint[], $2::text[]) AS u(seq, marker) WHERE p.seq = u.seq`,
          [w.map((x) => x.seq), w.map((x) => x.marker)],
        ),
      );
      await q.query(
        `UPDATE ${this.t('erasures')} SET messages = $1, history = $2, pending_changes = $3, conversations = $4, published_lines = $5 WHERE id = $6`,
        [counts.messages, counts.history, counts.pendingChanges, counts.conversations, counts.publishedLines, erasureId],
      );
    }
    return { ...counts, erasureId, dryRun, publishedThroughSeq: through };
  }

  /** The payloads (`record`, else the legacy `line`) of `seqs`, by seq. */
  private async payloads(q: Queryable, seqs: readonly number[]): Promise<Map<number, string | null>> {
    if (seqs.length === 0) return new Map();
    const rows = await this.all<{ seq: number; record: string | null; line: string | null }>(
      q,
      `SELECT seq, record, line FROM ${this.t('change_payloads')} WHERE seq = ANY ($1::bigint[])`,
      [seqs],
    );
    return new Map(rows.map((r) => [r.seq, r.record ?? r.line]));
  }
}
