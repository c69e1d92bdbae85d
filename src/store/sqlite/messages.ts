/**
 * Message crawls: the `messages` table (upserts, positions, tombstones), `message_history` (the
 * superseded versions of edited messages), and a crawl's progress (`checkpoints`, `crawl_pages`).
 * Methods that change rows append their change-log rows and expect to run inside the caller's
 * transaction; none opens one itself.
 */
import type { Db, Statement } from './sqlite.js';
import { PER_PAGE, type Message, type Page } from '../../api/schemas.js';
import type { ChangeLog, NewChange } from './change-log.js';
import { MultiRowStatements, ROWS_PER_STATEMENT, valuesList } from './multi-row.js';

/** A lone UTF-16 surrogate: SQLite stores it as bytes that read back as U+FFFD, so such an id is not looked up by its text read back. */
const LONE_SURROGATE = /\p{Cs}/u;
import { zeroCounts } from '../values.js';
import type { ChangeOp, Checkpoint, WriteCounts } from '../types.js';

type Crawl = [accountId: string, conversationId: string];
type MessageKey = [accountId: string, conversationId: string, id: string];

interface StoredMessage {
  id: string;
  raw: string;
  position: number;
  deleted_at: string | null;
  updated_at: string;
}

/** The columns of one message as written by an upsert (the rest are generated from `raw`). */
interface MessageRow {
  account_id: string;
  conversation_id: string;
  id: string;
  position: number;
  raw: string;
  now: string;
}

interface CheckpointRow {
  next_page: number;
  total_count: number;
  updated_at: string;
  run_id: number | null;
}

/** Typed statements of the message tables. */
class MessageStatements {
  readonly get: Statement<MessageKey, StoredMessage>;
  readonly upsert: Statement<MessageRow>;
  readonly insertHistory: Statement<[...MessageKey, raw: string, validFrom: string, validTo: string, replacedBySeq: number]>;
  readonly unseenLive: Statement<{ account_id: string; conversation_id: string }, { id: string; raw: string }>;
  readonly live: Statement<Crawl, { id: string; raw: string }>;
  readonly markDeleted: Statement<[deletedAt: string, ...MessageKey]>;
  readonly idAt: Statement<[...Crawl, position: number], { id: string }>;
  readonly idsBefore: Statement<[...Crawl, position: number], { id: string }>;
  readonly liveCount: Statement<[accountId: string], { n: number }>;
  /** The stored rows of up to {@link ROWS_PER_STATEMENT} ids of one conversation: `(account, conversation, ...ids)`. */
  readonly getMany: MultiRowStatements<StoredMessage>;
  /**
   * Writes up to {@link ROWS_PER_STATEMENT} rows whose values the caller decided, 7 per row:
   * account, conversation, id, position, raw, first_seen_at (kept by an existing row), updated_at.
   */
  readonly writeMany: MultiRowStatements;

  constructor(db: Db) {
    this.get = db.prepare(`SELECT id, raw, position, deleted_at, updated_at FROM messages WHERE account_id = ? AND conversation_id = ? AND id = ?`);
    this.getMany = new MultiRowStatements(
      db,
      (n) => `SELECT id, raw, position, deleted_at, updated_at FROM messages
              WHERE account_id = ? AND conversation_id = ? AND id IN (${Array(n).fill('?').join(', ')})`,
    );
    this.writeMany = new MultiRowStatements(
      db,
      (n) => `INSERT INTO messages (account_id, conversation_id, id, position, raw, first_seen_at, updated_at) VALUES ${valuesList(n, 7)}
              ON CONFLICT (account_id, conversation_id, id) DO UPDATE SET
                position = excluded.position, raw = excluded.raw, updated_at = excluded.updated_at, deleted_at = NULL`,
    );
    this.upsert = db.prepare(`
      INSERT INTO messages (account_id, conversation_id, id, position, raw, first_seen_at, updated_at, deleted_at)
      VALUES (@account_id, @conversation_id, @id, @position, @raw, @now, @now, NULL)
      ON CONFLICT (account_id, conversation_id, id) DO UPDATE SET
        position = excluded.position, raw = excluded.raw,
        updated_at = CASE WHEN messages.raw IS NOT excluded.raw OR messages.deleted_at IS NOT NULL
                          THEN excluded.updated_at ELSE messages.updated_at END,
        deleted_at = NULL
      WHERE messages.raw IS NOT excluded.raw OR messages.position IS NOT excluded.position OR messages.deleted_at IS NOT NULL`);
    this.insertHistory = db.prepare(`INSERT INTO message_history (account_id, conversation_id, id, raw, valid_from, valid_to, replaced_by_seq)
                                     VALUES (?, ?, ?, ?, ?, ?, ?)`);
    this.unseenLive = db.prepare(`
      SELECT id, raw FROM messages
      WHERE account_id = @account_id AND conversation_id = @conversation_id AND deleted_at IS NULL
        AND id NOT IN (SELECT j.value FROM crawl_pages c, json_each(c.ids) j
                       WHERE c.account_id = @account_id AND c.conversation_id = @conversation_id)`);
    this.live = db.prepare(`SELECT id, raw FROM messages WHERE account_id = ? AND conversation_id = ? AND deleted_at IS NULL`);
    this.markDeleted = db.prepare(`UPDATE messages SET deleted_at = ? WHERE account_id = ? AND conversation_id = ? AND id = ?`);
    this.idAt = db.prepare(`SELECT id FROM messages WHERE account_id = ? AND conversation_id = ? AND position = ? AND deleted_at IS NULL LIMIT 1`);
    this.idsBefore = db.prepare(
      `SELECT id FROM messages WHERE account_id = ? AND conversation_id = ? AND position < ? AND deleted_at IS NULL ORDER BY position`,
    );
    this.liveCount = db.prepare(`SELECT count(*) AS n FROM messages WHERE account_id = ? AND deleted_at IS NULL`);
  }
}

/** Typed statements of a crawl's progress. */
class CrawlStatements {
  readonly getCheckpoint: Statement<Crawl, CheckpointRow>;
  readonly saveCheckpoint: Statement<[...Crawl, nextPage: number, totalCount: number, startedAt: string, runId: number | null, updatedAt: string]>;
  readonly clearCheckpoint: Statement<Crawl>;
  readonly pages: Statement<Crawl, { page: number; ids: string }>;
  readonly savePage: Statement<[...Crawl, page: number, ids: string]>;
  readonly clearPages: Statement<Crawl>;
  readonly seenCount: Statement<Crawl, { n: number }>;

  constructor(db: Db) {
    this.getCheckpoint = db.prepare(`SELECT next_page, total_count, updated_at, run_id FROM checkpoints WHERE account_id = ? AND conversation_id = ?`);
    this.saveCheckpoint = db.prepare(`
      INSERT INTO checkpoints (account_id, conversation_id, next_page, total_count, crawl_started_at, run_id, updated_at)
      VALUES (?, ?, ?, ?, ?, ?, ?)
      ON CONFLICT (account_id, conversation_id) DO UPDATE SET next_page = excluded.next_page,
        total_count = excluded.total_count, run_id = excluded.run_id, updated_at = excluded.updated_at`);
    this.clearCheckpoint = db.prepare(`DELETE FROM checkpoints WHERE account_id = ? AND conversation_id = ?`);
    this.pages = db.prepare(`SELECT page, ids FROM crawl_pages WHERE account_id = ? AND conversation_id = ? ORDER BY page`);
    this.savePage = db.prepare(`INSERT OR REPLACE INTO crawl_pages (account_id, conversation_id, page, ids) VALUES (?, ?, ?, ?)`);
    this.clearPages = db.prepare(`DELETE FROM crawl_pages WHERE account_id = ? AND conversation_id = ?`);
    this.seenCount = db.prepare(
      `SELECT count(DISTINCT j.value) AS n FROM crawl_pages c, json_each(c.ids) j WHERE c.account_id = ? AND c.conversation_id = ?`,
    );
  }
}

/** Typed statements and row logic of message crawls. */
export class Messages {
  private readonly m: MessageStatements;
  private readonly c: CrawlStatements;

  constructor(
    db: Db,
    private readonly changes: ChangeLog,
  ) {
    this.m = new MessageStatements(db);
    this.c = new CrawlStatements(db);
  }

  private logChange(op: ChangeOp, accountId: string, conversationId: string, id: string, now: string, runId: number | null, record: string): number {
    return this.changes.append({ stream: 'messages', op, account_id: accountId, conversation_id: conversationId, record_id: id, synced_at: now, run_id: runId, record });
  }

  /**
   * Writes one page's messages, its ids and the checkpoint (see `Mirror.commitMessagesPage`); the
   * conversation must have a live row. Call inside a transaction.
   *
   * The page is written set-wise: one read of the stored rows of its ids, one multi-row upsert of
   * the rows that changed, one multi-row append of their changes (a handful of calls into SQLite
   * per page instead of four per message). A page that repeats an id is written one message at a
   * time instead, each seeing the one before, as the upsert of one message always did; so is a
   * page with an id holding a lone surrogate (its stored row reads back under another id).
   */
  commitPage(accountId: string, conversationId: string, page: Page<Message>, runId: number | null, now: string): WriteCounts {
    const offset = (page.page - 1) * PER_PAGE;
    const ids = page.data.map((m) => m.id);
    let counts: WriteCounts;
    if (new Set(ids).size === ids.length && !ids.some((id) => LONE_SURROGATE.test(id))) {
      counts = this.upsertPage(accountId, conversationId, ids, page.raw, offset, runId, now);
    } else {
      counts = zeroCounts();
      ids.forEach((id, i) => counts[this.upsertOne(accountId, conversationId, id, page.raw[i]!, offset + i, runId, now)]++);
    }
    this.c.savePage.run(accountId, conversationId, page.page, JSON.stringify(ids));
    this.c.saveCheckpoint.run(accountId, conversationId, page.page + 1, page.meta.total_count, now, runId, now);
    return counts;
  }

  /** The stored rows of `ids` (distinct) of one conversation, by id. */
  private stored(accountId: string, conversationId: string, ids: readonly string[]): Map<string, StoredMessage> {
    const out = new Map<string, StoredMessage>();
    for (let from = 0; from < ids.length; from += ROWS_PER_STATEMENT) {
      const chunk = ids.slice(from, from + ROWS_PER_STATEMENT);
      for (const row of this.m.getMany.all([accountId, conversationId], chunk)) out.set(row.id, row);
    }
    return out;
  }

  /**
   * Upserts a page's served messages (distinct `ids`, `objs` in the same order) with the rules of
   * {@link upsertOne}, set-wise: unchanged rows are not written, a moved position alone is written
   * but is no change, an insert or update appends its change, an update keeps the superseded
   * version in `message_history`.
   */
  private upsertPage(
    accountId: string,
    conversationId: string,
    ids: readonly string[],
    objs: readonly Record<string, unknown>[],
    offset: number,
    runId: number | null,
    now: string,
  ): WriteCounts {
    const counts = zeroCounts();
    const prevById = this.stored(accountId, conversationId, ids);
    const rows: unknown[][] = [];
    const changes: NewChange[] = [];
    const superseded: (StoredMessage | undefined)[] = [];
    ids.forEach((id, i) => {
      const raw = JSON.stringify(objs[i]);
      const position = offset + i;
      const prev = prevById.get(id);
      if (prev && prev.raw === raw && prev.deleted_at === null) {
        // Only the position moved (an earlier message was deleted): written, but no change of the record.
        if (prev.position !== position) rows.push([accountId, conversationId, id, position, raw, now, prev.updated_at]);
        counts.unchanged++;
        return;
      }
      rows.push([accountId, conversationId, id, position, raw, now, now]);
      const op: ChangeOp = !prev || prev.deleted_at !== null ? 'insert' : 'update';
      changes.push({ stream: 'messages', op, account_id: accountId, conversation_id: conversationId, record_id: id, synced_at: now, run_id: runId, record: raw });
      superseded.push(op === 'update' ? prev : undefined);
      counts[op === 'insert' ? 'inserted' : 'updated']++;
    });
    this.m.writeMany.run(rows);
    const seqs = this.changes.appendAll(changes);
    superseded.forEach((prev, k) => {
      if (prev) this.m.insertHistory.run(accountId, conversationId, prev.id, prev.raw, prev.updated_at, now, seqs[k]!);
    });
    return counts;
  }

  /**
   * Upserts one served message: skipped when unchanged; a moved position alone is written but is
   * no change of the record; an edit keeps the superseded version in `message_history`.
   */
  private upsertOne(
    accountId: string,
    conversationId: string,
    id: string,
    obj: Record<string, unknown>,
    position: number,
    runId: number | null,
    now: string,
  ): 'inserted' | 'updated' | 'unchanged' {
    const raw = JSON.stringify(obj);
    const prev = this.m.get.get(accountId, conversationId, id);
    if (prev && prev.raw === raw && prev.position === position && prev.deleted_at === null) return 'unchanged';
    this.m.upsert.run({ account_id: accountId, conversation_id: conversationId, id, position, raw, now });
    // Only the position moved (an earlier message was deleted): not a change of the record.
    if (prev && prev.raw === raw && prev.deleted_at === null) return 'unchanged';
    if (!prev || prev.deleted_at !== null) {
      this.logChange('insert', accountId, conversationId, id, now, runId, raw);
      return 'inserted';
    }
    const seq = this.logChange('update', accountId, conversationId, id, now, runId, raw);
    this.m.insertHistory.run(accountId, conversationId, id, prev.raw, prev.updated_at, now, seq);
    return 'updated';
  }

  /** Tombstones `messages` with `delete` changes carrying their last version; returns how many. */
  private tombstoneAll(accountId: string, conversationId: string, messages: { id: string; raw: string }[], now: string, runId: number | null): number {
    for (const msg of messages) {
      this.m.markDeleted.run(now, accountId, conversationId, msg.id);
      this.logChange('delete', accountId, conversationId, msg.id, now, runId, msg.raw);
    }
    return messages.length;
  }

  /** Tombstones the live messages no page of the current crawl served; returns how many. Call inside a transaction. */
  tombstoneUnseen(accountId: string, conversationId: string, now: string, runId: number | null): number {
    return this.tombstoneAll(accountId, conversationId, this.m.unseenLive.all({ account_id: accountId, conversation_id: conversationId }), now, runId);
  }

  /** Tombstones every live message of a conversation; returns how many. Call inside a transaction. */
  tombstoneLive(accountId: string, conversationId: string, now: string, runId: number | null): number {
    return this.tombstoneAll(accountId, conversationId, this.m.live.all(accountId, conversationId), now, runId);
  }

  /** Distinct message ids the pages of the current crawl served. */
  seenCount(accountId: string, conversationId: string): number {
    return this.c.seenCount.get(accountId, conversationId)?.n ?? 0;
  }

  /** Forgets a crawl's checkpoint and seen ids. */
  clearCrawl(accountId: string, conversationId: string): void {
    this.c.clearCheckpoint.run(accountId, conversationId);
    this.c.clearPages.run(accountId, conversationId);
  }

  /** The committed checkpoint of an unfinished crawl, if any (see `Mirror.loadCheckpoint`). */
  loadCheckpoint(accountId: string, conversationId: string): Checkpoint | undefined {
    const cp = this.c.getCheckpoint.get(accountId, conversationId);
    if (!cp) return undefined;
    const seenIds = new Set<string>();
    let lastPageIds: string[] = [];
    for (const row of this.c.pages.all(accountId, conversationId)) {
      const ids = JSON.parse(row.ids) as string[];
      for (const id of ids) seenIds.add(id);
      if (row.page === cp.next_page - 1) lastPageIds = ids;
    }
    return { nextPage: cp.next_page, totalCount: cp.total_count, seenIds, lastPageIds, updatedAt: Date.parse(cp.updated_at), runId: cp.run_id };
  }

  /**
   * Starts an incremental crawl (see `Mirror.seedIncrementalCrawl`): clears the crawl state, then
   * records the live messages before `beforePosition` as its page 0. Call inside a transaction.
   */
  seedIncremental(accountId: string, conversationId: string, beforePosition: number): string[] {
    this.clearCrawl(accountId, conversationId);
    const ids = this.m.idsBefore.all(accountId, conversationId, beforePosition).map((r) => r.id);
    this.c.savePage.run(accountId, conversationId, 0, JSON.stringify(ids));
    return ids;
  }

  /** Id of the live message at `position` (0-based, chronological), if any. */
  idAt(accountId: string, conversationId: string, position: number): string | undefined {
    return this.m.idAt.get(accountId, conversationId, position)?.id;
  }

  /** How many messages of the account are live. */
  countLive(accountId: string): number {
    return this.m.liveCount.get(accountId)?.n ?? 0;
  }
}
