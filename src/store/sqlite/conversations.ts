/**
 * The `conversations` table: listing pages upserted, stand-ins for conversations synced by id,
 * revivals, tombstones, and the baseline a complete crawl leaves (message count, change signal).
 * Methods that change rows append their change-log rows and expect to run inside the caller's
 * transaction; none opens one itself.
 */
import type { Db, Statement } from './sqlite.js';
import type { Conversation, Page } from '../../api/schemas.js';
import type { ChangeLog } from './change-log.js';
import { signalOf, zeroCounts } from '../values.js';
import { REDACTED_MARK, redactedConversation } from '../redaction.js';
import type { ChangeOp, ConversationFilter, ConversationListing, ConversationSummary, CrawlState, WriteCounts } from '../types.js';

type Key = [accountId: string, id: string];
interface StoredConversation {
  raw: string | null;
  deleted_at: string | null;
}
interface CrawlStateRow {
  message_count: number | null;
  crawled_signal: string | null;
  raw: string | null;
}


/** Bound parameters of {@link LIST_SQL} and {@link COUNT_SQL}. */
interface ListParams {
  accounts: string | null;
  statuses: string | null;
  since: number | null;
  deleted: 0 | 1;
}
interface ListRow {
  account_id: string;
  id: string;
  status: string | number | null;
  updated_at: string | number | null;
  last_synced_at: string | null;
  deleted_at: string | null;
  /** `[live messages, of which redacted]` (JSON): one search of the messages for both. */
  messages: string;
  erased: number;
}

/**
 * The conversations matching a filter, with their served status and update time and the update
 * time in seconds since the epoch (`updated_s`: NULL when it is not an ISO 8601 text SQLite reads).
 * Parameters: `@accounts`, `@statuses` (JSON arrays, or NULL for any), `@since` (seconds, or NULL),
 * `@deleted` (1: tombstoned ones too).
 */
const MATCHING_SQL = `
  WITH served AS (
    SELECT account_id, id, deleted_at, last_synced_at, coalesce(instr(raw, '${REDACTED_MARK}') > 0, 0) AS erased,
      json_extract(raw, '$.status') AS status,
      coalesce(json_extract(raw, '$.updated_at'), json_extract(raw, '$.last_activity_at'), json_extract(raw, '$.last_message_at')) AS updated_at
    FROM conversations
    WHERE (@deleted = 1 OR deleted_at IS NULL)
      AND (@accounts IS NULL OR lower(account_id) IN (SELECT lower(value) FROM json_each(@accounts)))
  ), timed AS (
    SELECT *, CASE WHEN updated_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*' THEN unixepoch(updated_at, 'subsec') END AS updated_s
    FROM served
    WHERE @statuses IS NULL OR CAST(status AS TEXT) IN (SELECT value FROM json_each(@statuses))
  ), matching AS (
    SELECT * FROM timed WHERE @since IS NULL OR updated_s >= @since
  )`;

/**
 * One page of {@link MATCHING_SQL}, newest update first (no readable time last, then by account
 * and id), `@limit` rows (-1 = all), each with its live message count and how many of those an
 * erasure redacted (`messages`: the JSON pair `[live, redacted]`): one statement, whose correlated
 * count is one search of the messages' primary key index per listed row (never a scan of
 * `messages`); the page is materialized first, so only listed rows are counted. A row is redacted
 * when its record holds {@link REDACTED_MARK}.
 */
export const LIST_CONVERSATIONS_SQL = `${MATCHING_SQL},
  page AS MATERIALIZED (
    SELECT * FROM matching ORDER BY updated_s DESC NULLS LAST, account_id, id LIMIT @limit
  )
  SELECT p.account_id, p.id, p.status, p.updated_at, p.last_synced_at, p.deleted_at, p.erased,
    (SELECT json_array(count(*), total(instr(m.raw, '${REDACTED_MARK}') > 0))
     FROM messages m WHERE m.account_id = p.account_id AND m.conversation_id = p.id AND m.deleted_at IS NULL) AS messages
  FROM page p
  ORDER BY p.updated_s DESC NULLS LAST, p.account_id, p.id`;

/** How many conversations {@link MATCHING_SQL} matches. */
const COUNT_SQL = `${MATCHING_SQL} SELECT count(*) AS n FROM matching`;

/** A served JSON scalar as text (SQLite hands numbers back as numbers); null stays null. */
const asText = (v: string | number | null): string | null => (v === null ? null : String(v));

/** Typed statements and row logic of `conversations`. */
export class Conversations {
  private readonly get: Statement<Key, StoredConversation>;
  private readonly upsert: Statement<{ account_id: string; id: string; raw: string; now: string }>;
  private readonly insert: Statement<[accountId: string, id: string, raw: string, firstSeenAt: string, updatedAt: string]>;
  private readonly revive: Statement<[updatedAt: string, ...Key]>;
  private readonly markDeleted: Statement<[deletedAt: string, ...Key]>;
  private readonly finish: Statement<[messageCount: number, lastSyncedAt: string, ...Key]>;
  private readonly setSignal: Statement<[signal: string | null, ...Key]>;
  private readonly stateOf: Statement<Key, CrawlStateRow>;
  private readonly live: Statement<[accountId: string], { id: string }>;
  private readonly unsettled: Statement<[accountId: string], { id: string }>;
  private readonly liveCount: Statement<[accountId: string], { n: number }>;
  private readonly listPage: Statement<[ListParams & { limit: number }], ListRow>;
  private readonly listCount: Statement<[ListParams], { n: number }>;

  constructor(
    db: Db,
    private readonly changes: ChangeLog,
  ) {
    this.get = db.prepare(`SELECT raw, deleted_at FROM conversations WHERE account_id = ? AND id = ?`);
    this.upsert = db.prepare(`
      INSERT INTO conversations (account_id, id, raw, first_seen_at, updated_at)
      VALUES (@account_id, @id, @raw, @now, @now)
      ON CONFLICT (account_id, id) DO UPDATE SET raw = excluded.raw, updated_at = excluded.updated_at, deleted_at = NULL,
        -- a conversation back from a tombstone gets a full crawl, whatever its change signal says
        message_count = CASE WHEN conversations.deleted_at IS NULL THEN conversations.message_count END,
        crawled_signal = CASE WHEN conversations.deleted_at IS NULL THEN conversations.crawled_signal END
      WHERE conversations.raw IS NOT excluded.raw OR conversations.deleted_at IS NOT NULL`);
    this.insert = db.prepare(`INSERT INTO conversations (account_id, id, raw, first_seen_at, updated_at) VALUES (?, ?, ?, ?, ?)`);
    this.revive = db.prepare(
      `UPDATE conversations SET deleted_at = NULL, message_count = NULL, crawled_signal = NULL, updated_at = ? WHERE account_id = ? AND id = ?`,
    );
    this.markDeleted = db.prepare(`UPDATE conversations SET deleted_at = ? WHERE account_id = ? AND id = ? AND deleted_at IS NULL`);
    this.finish = db.prepare(`UPDATE conversations SET message_count = ?, last_synced_at = ? WHERE account_id = ? AND id = ?`);
    this.setSignal = db.prepare(`UPDATE conversations SET crawled_signal = ? WHERE account_id = ? AND id = ?`);
    this.stateOf = db.prepare(`SELECT message_count, crawled_signal, raw FROM conversations WHERE account_id = ? AND id = ? AND deleted_at IS NULL`);
    this.live = db.prepare(`SELECT id FROM conversations WHERE account_id = ? AND deleted_at IS NULL ORDER BY id`);
    this.unsettled = db.prepare(
      `SELECT id FROM conversations WHERE account_id = ? AND deleted_at IS NULL AND (crawled_signal IS NULL OR message_count IS NULL) ORDER BY id`,
    );
    this.liveCount = db.prepare(`SELECT count(*) AS n FROM conversations WHERE account_id = ? AND deleted_at IS NULL`);
    this.listPage = db.prepare(LIST_CONVERSATIONS_SQL);
    this.listCount = db.prepare(COUNT_SQL);
  }

  private logChange(op: ChangeOp, accountId: string, id: string, now: string, runId: number | null, record: string): void {
    this.changes.append({ stream: 'conversations', op, account_id: accountId, conversation_id: id, record_id: id, synced_at: now, run_id: runId, record });
  }

  /** Upserts one listing page (see `Mirror.upsertConversations`); call inside a transaction. */
  upsertPage(accountId: string, page: Page<Conversation>, runId: number | null, now: string): WriteCounts {
    const counts = zeroCounts();
    page.raw.forEach((obj, i) => {
      const id = page.data[i]!.id;
      const raw = JSON.stringify(obj);
      const prev = this.get.get(accountId, id);
      if (prev && prev.raw === raw && prev.deleted_at === null) {
        counts.unchanged++;
        return;
      }
      this.upsert.run({ account_id: accountId, id, raw, now });
      const op = !prev || prev.raw === null || prev.deleted_at !== null ? 'insert' : 'update';
      if (op === 'insert') counts.inserted++;
      else counts.updated++;
      this.logChange(op, accountId, id, now, runId, raw);
    });
    return counts;
  }

  /**
   * Makes sure a conversation whose messages are being committed has a live row, and that the
   * exports know it. One synced by id (never listed) gets `raw` `{"id": ...}` (the only field we
   * know) with an `insert` change; the next listing replaces it with the object as served (an
   * `update`). A tombstoned one is revived with an `insert` change carrying its last known `raw`,
   * and its crawl baseline (`message_count`, `crawled_signal`) is cleared. Call inside a transaction.
   *
   * @param erasure - the erasure covering the conversation, if any: a stand-in is then its
   *   redaction marker (`{"id": ..., "redacted": {"erasure": N}}`) instead
   */
  ensure(accountId: string, conversationId: string, now: string, runId: number | null, erasure?: number): void {
    const prev = this.get.get(accountId, conversationId);
    if (prev && prev.deleted_at === null) return;
    const standIn = erasure === undefined ? JSON.stringify({ id: conversationId }) : redactedConversation(conversationId, erasure);
    if (prev) {
      this.revive.run(now, accountId, conversationId);
      this.logChange('insert', accountId, conversationId, now, runId, prev.raw ?? standIn);
      return;
    }
    this.insert.run(accountId, conversationId, standIn, now, now);
    this.logChange('insert', accountId, conversationId, now, runId, standIn);
  }

  /**
   * Tombstones a live conversation, with a `delete` change when it was ever listed (a stand-in
   * never exported a listed object). Call inside a transaction.
   *
   * @returns whether a live conversation was tombstoned
   */
  tombstone(accountId: string, conversationId: string, now: string, runId: number | null): boolean {
    const prev = this.get.get(accountId, conversationId);
    if (!prev || prev.deleted_at !== null) return false;
    this.markDeleted.run(now, accountId, conversationId);
    if (prev.raw !== null) this.logChange('delete', accountId, conversationId, now, runId, prev.raw);
    return true;
  }

  /**
   * Records a complete crawl: `message_count`, `last_synced_at`, and (with `changeField`) the
   * signal the conversation showed as the next incremental sync's baseline.
   */
  finishCrawl(accountId: string, conversationId: string, messageCount: number, now: string, changeField?: string): void {
    this.finish.run(messageCount, now, accountId, conversationId);
    if (changeField) this.setSignal.run(signalOf(this.get.get(accountId, conversationId)?.raw ?? null, changeField), accountId, conversationId);
  }

  /** Clears the change signal of the last crawl (`crawled_signal = NULL`); nothing for an unknown id. */
  forgetSignal(accountId: string, conversationId: string): void {
    this.setSignal.run(null, accountId, conversationId);
  }

  /** Whether a row (live or tombstoned) exists. */
  has(accountId: string, conversationId: string): boolean {
    return this.get.get(accountId, conversationId) !== undefined;
  }

  /** What the last complete crawl of a live conversation left (all null when none, or not live). */
  crawlState(accountId: string, conversationId: string): CrawlState {
    const r = this.stateOf.get(accountId, conversationId);
    return { messageCount: r?.message_count ?? null, crawledSignal: r?.crawled_signal ?? null, raw: r?.raw ?? null };
  }

  /** Ids of live conversations, sorted. */
  liveIds(accountId: string): string[] {
    return this.live.all(accountId).map((r) => r.id);
  }

  /** Ids of live conversations not in `shown`, sorted; read row by row (the others are never kept). */
  liveIdsNotIn(accountId: string, shown: ReadonlySet<string>): string[] {
    const out: string[] = [];
    for (const r of this.live.iterate(accountId)) if (!shown.has(r.id)) out.push(r.id);
    return out;
  }

  /**
   * Ids of live conversations with no completed crawl at a known change signal (never crawled to
   * the end, or their last crawl failed and forgot its baseline), sorted.
   */
  unsettledIds(accountId: string): string[] {
    return this.unsettled.all(accountId).map((r) => r.id);
  }

  /** How many conversations of the account are live. */
  countLive(accountId: string): number {
    return this.liveCount.get(accountId)?.n ?? 0;
  }

  /**
   * The conversations `filter` matches, newest served update first (see
   * {@link ConversationSummary.updatedAt}; those without a readable time last, then by account and
   * id), with their live message counts, and how many match in all. Two statements (the page, the
   * total): run it inside one read transaction for a consistent pair (`Mirror.listConversations`).
   *
   * @throws RangeError when `filter.limit` is not a whole number >= 0
   */
  list(filter: ConversationFilter): ConversationListing {
    const limit = filter.limit;
    if (limit !== undefined && (!Number.isSafeInteger(limit) || limit < 0)) throw new RangeError(`limit must be a whole number >= 0, got ${limit}`);
    const params: ListParams = {
      accounts: filter.accountIds?.length ? JSON.stringify(filter.accountIds) : null,
      statuses: filter.statuses?.length ? JSON.stringify(filter.statuses) : null,
      since: filter.sinceMs === undefined ? null : filter.sinceMs / 1000,
      deleted: filter.includeDeleted ? 1 : 0,
    };
    const rows = this.listPage.all({ ...params, limit: limit ?? -1 }).map((r): ConversationSummary => {
      const [messages, erasedMessages] = JSON.parse(r.messages) as [number, number];
      return {
        accountId: r.account_id,
        id: r.id,
        status: asText(r.status),
        updatedAt: asText(r.updated_at),
        messages,
        erasedMessages,
        erased: r.erased !== 0,
        lastSyncedAt: r.last_synced_at,
        deletedAt: r.deleted_at,
      };
    });
    return { rows, total: this.listCount.get(params)?.n ?? 0 };
  }
}
