/**
 * The `conversations` table on PostgreSQL: listing pages upserted, stand-ins for conversations
 * synced by id, revivals, tombstones, and the baseline a complete crawl leaves (the SQLite group:
 * src/store/conversations.ts, whose rules this ports one for one). Methods that change rows buffer
 * their changes in the caller's {@link ChangeBuffer} and run inside the caller's transaction.
 *
 * Several processes write one mirror, so a row is read `FOR UPDATE` before it is changed: the
 * decision (insert, update, unchanged, revive) is made on the row as it stands and nobody changes
 * it before the commit. A row that does not exist yet cannot be locked: two writers may both
 * insert it, and the second fails with a unique violation (SQLSTATE 23505), on which the
 * engine's transaction runner runs the whole transaction again (it then sees the row).
 */
import type { Conversation, Page } from '../../api/schemas.js';
import type { ConversationFilter, ConversationListing, ConversationSummary, CrawlState, WriteCounts } from '../mirror.js';
import { signalOf } from '../mirror.js';
import type { ChangeOp } from '../types.js';
import { jsonbSafe, type ChangeBuffer } from './change-log.js';
import { qualify, type Queryable } from './db.js';
import { REDACTED_MARK, redactedConversation } from '../redaction.js';

/** Row counts starting at zero. */
export const zeroCounts = (): WriteCounts => ({ inserted: 0, updated: 0, unchanged: 0, deleted: 0 });

/** A lone UTF-16 surrogate: it reaches PostgreSQL as U+FFFD (UTF-8 has no lone surrogates). */
const LONE_SURROGATE = /\p{Cs}/u;
/** The text PostgreSQL stores (and gives back) for `s`: lone surrogates become U+FFFD. */
export const storedText = (s: string): string => (LONE_SURROGATE.test(s) ? Buffer.from(s, 'utf8').toString('utf8') : s);

interface StoredConversation {
  id: string;
  raw_text: string | null;
  deleted_at: string | null;
}

/** Bound parameters of the listing queries, in order: $1 deleted too, $2 accounts, $3 statuses, $4 since (s). */
type ListParams = [deleted: boolean, accounts: string[] | null, statuses: string[] | null, since: number | null];

/** The `conversations` statements of the mirror in `schema`. */
export class Conversations {
  private readonly t: (name: string) => string;
  private readonly matchingSql: string;

  constructor(schema: string) {
    this.t = (name) => qualify(schema, name);
    // As the SQLite group's MATCHING_SQL: the served status and update time, and the update time
    // in seconds since the epoch (NULL when it is not an ISO 8601 time; iso_epoch never throws).
    this.matchingSql = `
      WITH served AS (
        SELECT account_id, id, deleted_at, last_synced_at, coalesce(strpos(raw_text, '${REDACTED_MARK}') > 0, false) AS erased, raw->>'status' AS status,
          coalesce(raw->>'updated_at', raw->>'last_activity_at', raw->>'last_message_at') AS updated_at
        FROM ${this.t('conversations')}
        WHERE ($1::bool OR deleted_at IS NULL)
          AND ($2::text[] IS NULL OR lower(account_id) IN (SELECT lower(a) FROM unnest($2::text[]) a))
      ), timed AS (
        SELECT *, ${this.t('iso_epoch')}(updated_at) AS updated_s FROM served
        WHERE $3::text[] IS NULL OR status = ANY ($3::text[])
      ), matching AS (
        SELECT * FROM timed WHERE $4::numeric IS NULL OR updated_s >= $4::numeric
      )`;
  }

  /** The stored rows of `ids` of one account, locked until the transaction ends, by stored id. */
  private async lockRows(q: Queryable, accountId: string, ids: readonly string[]): Promise<Map<string, StoredConversation>> {
    const r = await q.query<StoredConversation>(
      `SELECT id, raw_text, deleted_at FROM ${this.t('conversations')} WHERE account_id = $1 AND id = ANY ($2::text[]) ORDER BY id FOR UPDATE`,
      [accountId, ids],
    );
    return new Map(r.rows.map((row) => [row.id, row]));
  }

  /** The row of one conversation, locked until the transaction ends; undefined when there is none. */
  async lock(q: Queryable, accountId: string, conversationId: string): Promise<StoredConversation | undefined> {
    const r = await q.query<StoredConversation>(
      `SELECT id, raw_text, deleted_at FROM ${this.t('conversations')} WHERE account_id = $1 AND id = $2 FOR UPDATE`,
      [accountId, conversationId],
    );
    return r.rows[0];
  }

  private logChange(buf: ChangeBuffer, op: ChangeOp, accountId: string, id: string, now: string, runId: number | null, record: string): void {
    buf.add({ stream: 'conversations', op, account_id: accountId, conversation_id: id, record_id: id, synced_at: now, run_id: runId, record });
  }

  /**
   * Upserts one listing page (see `Mirror.upsertConversations`): unchanged rows are not written; a
   * new or tombstoned one is an `insert` (a tombstoned one revived with no crawl baseline), a
   * changed one an `update`. A page that lists an id twice is applied in order, each seeing the
   * one before, as SQLite's row-by-row upsert does. Call inside a transaction.
   */
  async upsertPage(q: Queryable, buf: ChangeBuffer, accountId: string, page: Page<Conversation>, runId: number | null, now: string): Promise<WriteCounts> {
    const counts = zeroCounts();
    const ids = page.data.map((c) => c.id);
    const stored = await this.lockRows(q, accountId, ids);
    /** Each id's row as this page leaves it: `fresh` ids are inserted, the others updated. */
    const rows = new Map<string, { id: string; raw: string; fresh: boolean; revive: boolean }>();
    const state = new Map<string, { raw: string | null; live: boolean }>();
    page.raw.forEach((obj, i) => {
      const id = page.data[i]!.id;
      const key = storedText(id);
      const raw = JSON.stringify(obj);
      const row = stored.get(key);
      const prev = state.get(key) ?? (row ? { raw: row.raw_text, live: row.deleted_at === null } : undefined);
      if (prev && prev.raw === raw && prev.live) {
        counts.unchanged++;
        return;
      }
      const op = !prev || prev.raw === null || !prev.live ? 'insert' : 'update';
      counts[op === 'insert' ? 'inserted' : 'updated']++;
      this.logChange(buf, op, accountId, id, now, runId, raw);
      const written = rows.get(key);
      rows.set(key, { id, raw, fresh: written ? written.fresh : !row, revive: written ? written.revive : row !== undefined && row.deleted_at !== null });
      state.set(key, { raw, live: true });
    });
    const fresh = [...rows.values()].filter((r) => r.fresh);
    const known = [...rows.values()].filter((r) => !r.fresh);
    if (fresh.length > 0) {
      // No ON CONFLICT: a row another writer inserted meanwhile is a unique violation, and the
      // transaction runs again seeing it (see the module comment).
      await q.query(
        `INSERT INTO ${this.t('conversations')} (account_id, id, raw, raw_text, first_seen_at, updated_at)
         SELECT $1, u.id, CASE WHEN u.ok THEN u.raw_text::jsonb END, u.raw_text, $2, $2
         FROM unnest($3::text[], $4::text[], $5::bool[]) AS u(id, raw_text, ok)`,
        [accountId, now, fresh.map((r) => r.id), fresh.map((r) => r.raw), fresh.map((r) => jsonbSafe(r.raw))],
      );
    }
    if (known.length > 0) {
      // A conversation back from a tombstone gets a full crawl, whatever its change signal says.
      await q.query(
        `UPDATE ${this.t('conversations')} c SET raw = CASE WHEN u.ok THEN u.raw_text::jsonb END, raw_text = u.raw_text,
           updated_at = $2, deleted_at = NULL,
           message_count = CASE WHEN u.revive THEN NULL ELSE c.message_count END,
           crawled_signal = CASE WHEN u.revive THEN NULL ELSE c.crawled_signal END
         FROM unnest($3::text[], $4::text[], $5::bool[], $6::bool[]) AS u(id, raw_text, ok, revive)
         WHERE c.account_id = $1 AND c.id = u.id`,
        [accountId, now, known.map((r) => r.id), known.map((r) => r.raw), known.map((r) => jsonbSafe(r.raw)), known.map((r) => r.revive)],
      );
    }
    return counts;
  }

  /**
   * Makes sure a conversation whose messages are being committed has a live row, and locks it
   * until the transaction ends (so every write to one conversation's messages is serialized). One
   * synced by id (never listed) gets the stand-in `{"id": ...}` with an `insert` change; a
   * tombstoned one is revived with an `insert` change carrying its last known record, and its
   * crawl baseline cleared (see the SQLite group's `ensure`). Call inside a transaction.
   *
   * @param erasure - the erasure covering the conversation, if any: a stand-in is then its
   *   redaction marker instead
   */
  async ensure(q: Queryable, buf: ChangeBuffer, accountId: string, conversationId: string, now: string, runId: number | null, erasure?: number): Promise<void> {
    const prev = await this.lock(q, accountId, conversationId);
    if (prev && prev.deleted_at === null) return;
    const standIn = erasure === undefined ? JSON.stringify({ id: conversationId }) : redactedConversation(conversationId, erasure);
    if (prev) {
      await q.query(
        `UPDATE ${this.t('conversations')} SET deleted_at = NULL, message_count = NULL, crawled_signal = NULL, updated_at = $1 WHERE account_id = $2 AND id = $3`,
        [now, accountId, conversationId],
      );
      this.logChange(buf, 'insert', accountId, conversationId, now, runId, prev.raw_text ?? standIn);
      return;
    }
    await q.query(
      `INSERT INTO ${this.t('conversations')} (account_id, id, raw, raw_text, first_seen_at, updated_at)
       VALUES ($1, $2, CASE WHEN $5::bool THEN $3::text::jsonb END, $3, $4, $4)`,
      [accountId, conversationId, standIn, now, jsonbSafe(standIn)],
    );
    this.logChange(buf, 'insert', accountId, conversationId, now, runId, standIn);
  }

  /**
   * Tombstones a live conversation, with a `delete` change when it was ever listed (a stand-in
   * never exported a listed object). Call inside a transaction.
   *
   * @returns whether a live conversation was tombstoned
   */
  async tombstone(q: Queryable, buf: ChangeBuffer, accountId: string, conversationId: string, now: string, runId: number | null): Promise<boolean> {
    const prev = await this.lock(q, accountId, conversationId);
    if (!prev || prev.deleted_at !== null) return false;
    await q.query(`UPDATE ${this.t('conversations')} SET deleted_at = $1 WHERE account_id = $2 AND id = $3 AND deleted_at IS NULL`, [now, accountId, conversationId]);
    if (prev.raw_text !== null) this.logChange(buf, 'delete', accountId, conversationId, now, runId, prev.raw_text);
    return true;
  }

  /**
   * Records a complete crawl: `message_count`, `last_synced_at`, and (with `changeField`) the
   * signal the conversation showed as the next incremental sync's baseline.
   */
  async finishCrawl(q: Queryable, accountId: string, conversationId: string, messageCount: number, now: string, changeField?: string): Promise<void> {
    const r = await q.query<{ raw_text: string | null }>(
      `UPDATE ${this.t('conversations')} SET message_count = $1, last_synced_at = $2 WHERE account_id = $3 AND id = $4 RETURNING raw_text`,
      [messageCount, now, accountId, conversationId],
    );
    if (changeField) await this.forgetSignal(q, accountId, conversationId, signalOf(r.rows[0]?.raw_text ?? null, changeField));
  }

  /** Sets the change signal of the last crawl (NULL by default: forgotten); nothing for an unknown id. */
  async forgetSignal(q: Queryable, accountId: string, conversationId: string, signal: string | null = null): Promise<void> {
    await q.query(`UPDATE ${this.t('conversations')} SET crawled_signal = $1 WHERE account_id = $2 AND id = $3`, [signal, accountId, conversationId]);
  }

  /** Whether a row (live or tombstoned) exists. */
  async has(q: Queryable, accountId: string, conversationId: string): Promise<boolean> {
    const r = await q.query(`SELECT 1 FROM ${this.t('conversations')} WHERE account_id = $1 AND id = $2`, [accountId, conversationId]);
    return r.rowCount !== null && r.rowCount > 0;
  }

  /** What the last complete crawl of a live conversation left (all null when none, or not live). */
  async crawlState(q: Queryable, accountId: string, conversationId: string): Promise<CrawlState> {
    const r = await q.query<{ message_count: number | null; crawled_signal: string | null; raw_text: string | null }>(
      `SELECT message_count, crawled_signal, raw_text FROM ${this.t('conversations')} WHERE account_id = $1 AND id = $2 AND deleted_at IS NULL`,
      [accountId, conversationId],
    );
    const row = r.rows[0];
    return { messageCount: row?.message_count ?? null, crawledSignal: row?.crawled_signal ?? null, raw: row?.raw_text ?? null };
  }

  /** Ids of live conversations, sorted (by code point). */
  async liveIds(q: Queryable, accountId: string): Promise<string[]> {
    const r = await q.query<{ id: string }>(`SELECT id FROM ${this.t('conversations')} WHERE account_id = $1 AND deleted_at IS NULL ORDER BY id`, [accountId]);
    return r.rows.map((row) => row.id);
  }

  /** Ids of live conversations not in `shown`, sorted; only those are read. */
  async liveIdsNotIn(q: Queryable, accountId: string, shown: ReadonlySet<string>): Promise<string[]> {
    const r = await q.query<{ id: string }>(
      `SELECT id FROM ${this.t('conversations')} WHERE account_id = $1 AND deleted_at IS NULL AND NOT (id = ANY ($2::text[])) ORDER BY id`,
      [accountId, [...shown]],
    );
    return r.rows.map((row) => row.id);
  }

  /** Ids of live conversations with no completed crawl at a known change signal, sorted. */
  async unsettledIds(q: Queryable, accountId: string): Promise<string[]> {
    const r = await q.query<{ id: string }>(
      `SELECT id FROM ${this.t('conversations')} WHERE account_id = $1 AND deleted_at IS NULL AND (crawled_signal IS NULL OR message_count IS NULL) ORDER BY id`,
      [accountId],
    );
    return r.rows.map((row) => row.id);
  }

  /** How many conversations of the account are live. */
  async countLive(q: Queryable, accountId: string): Promise<number> {
    const r = await q.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${this.t('conversations')} WHERE account_id = $1 AND deleted_at IS NULL`, [accountId]);
    return r.rows[0]?.n ?? 0;
  }

  /**
   * The conversations `filter` matches, newest served update first (those without a readable time
   * last, then by account and id), with their live message counts, and how many match in all (see
   * the SQLite group's `list`). Two statements: run it in one transaction (REPEATABLE READ) for a
   * consistent pair.
   *
   * @throws RangeError when `filter.limit` is not a whole number >= 0
   */
  async list(q: Queryable, filter: ConversationFilter): Promise<ConversationListing> {
    const limit = filter.limit;
    if (limit !== undefined && (!Number.isSafeInteger(limit) || limit < 0)) throw new RangeError(`limit must be a whole number >= 0, got ${limit}`);
    const params: ListParams = [
      filter.includeDeleted === true,
      filter.accountIds?.length ? [...filter.accountIds] : null,
      filter.statuses?.length ? [...filter.statuses] : null,
      filter.sinceMs === undefined ? null : filter.sinceMs / 1000,
    ];
    const page = await q.query<{
      account_id: string;
      id: string;
      status: string | null;
      updated_at: string | null;
      last_synced_at: string | null;
      deleted_at: string | null;
      erased: boolean;
      messages: number;
      erased_messages: number;
    }>(
      `${this.matchingSql},
      page AS MATERIALIZED (
        SELECT * FROM matching ORDER BY updated_s DESC NULLS LAST, account_id, id LIMIT $5
      )
      SELECT p.account_id, p.id, p.status, p.updated_at, p.last_synced_at, p.deleted_at, p.erased, n.messages, n.erased_messages
      FROM page p
      CROSS JOIN LATERAL (
        SELECT count(*)::int AS messages, (count(*) FILTER (WHERE strpos(m.raw_text, '${REDACTED_MARK}') > 0))::int AS erased_messages
        FROM ${this.t('messages')} m WHERE m.account_id = p.account_id AND m.conversation_id = p.id AND m.deleted_at IS NULL
      ) n
      ORDER BY p.updated_s DESC NULLS LAST, p.account_id, p.id`,
      [...params, limit ?? null],
    );
    const rows = page.rows.map(
      (r): ConversationSummary => ({
        accountId: r.account_id,
        id: r.id,
        status: r.status,
        updatedAt: r.updated_at,
        messages: r.messages,
        erasedMessages: r.erased_messages,
        erased: r.erased,
        lastSyncedAt: r.last_synced_at,
        deletedAt: r.deleted_at,
      }),
    );
    const total = await q.query<{ n: number }>(`${this.matchingSql} SELECT count(*)::int AS n FROM matching`, params);
    return { rows, total: total.rows[0]?.n ?? 0 };
  }
}
