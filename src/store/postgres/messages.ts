/**
 * Message crawls on PostgreSQL: the `messages` table (upserts, positions, tombstones),
 * `message_history` (written with the change-log flush, which knows the seqs) and a crawl's
 * progress (`checkpoints`, `crawl_pages`). The SQLite group (src/store/messages.ts) ported rule for
 * rule. Methods that change rows buffer their changes in the caller's {@link ChangeBuffer} and run
 * inside the caller's transaction, after `Conversations.ensure` or `Conversations.lock` locked the
 * conversation's row: every write to one conversation's messages is serialized by that lock, so a
 * decision made on the rows read stays true until the commit.
 */
import { PER_PAGE, type Message, type Page } from '../../api/schemas.js';
import type { Checkpoint, WriteCounts } from '../mirror.js';
import type { ChangeOp } from '../types.js';
import { jsonbSafe, type ChangeBuffer } from './change-log.js';
import { storedText, zeroCounts } from './conversations.js';
import { qualify, type Queryable } from './db.js';

interface StoredMessage {
  id: string;
  raw_text: string;
  position: number;
  deleted_at: string | null;
  updated_at: string;
}

/** The `messages`, `checkpoints` and `crawl_pages` statements of the mirror in `schema`. */
export class Messages {
  private readonly t: (name: string) => string;

  constructor(schema: string) {
    this.t = (name) => qualify(schema, name);
  }

  private logChange(buf: ChangeBuffer, op: ChangeOp, accountId: string, conversationId: string, id: string, now: string, runId: number | null, record: string): number {
    return buf.add({ stream: 'messages', op, account_id: accountId, conversation_id: conversationId, record_id: id, synced_at: now, run_id: runId, record });
  }

  /**
   * Writes one page's messages, its ids and the checkpoint (see `Mirror.commitMessagesPage`); the
   * conversation's row must be live and locked. Call inside a transaction.
   *
   * One read of the stored rows of the page's ids, then the page applied message by message in
   * memory with the SQLite engine's rules: unchanged rows are not written; a moved position alone
   * is written but is no change of the record; an insert or update buffers its change; an update
   * keeps the superseded version for `message_history`. A page that repeats an id applies each
   * occurrence seeing the one before. Then one multi-row upsert of the rows as the page leaves
   * them, the page's ids and the checkpoint.
   *
   * Positions are `(page - 1) * 100 + index` (spec 4.1).
   */
  async commitPage(q: Queryable, buf: ChangeBuffer, accountId: string, conversationId: string, page: Page<Message>, runId: number | null, now: string): Promise<WriteCounts> {
    const offset = (page.page - 1) * PER_PAGE;
    const ids = page.data.map((m) => m.id);
    const read = await q.query<StoredMessage>(
      `SELECT id, raw_text, position, deleted_at, updated_at FROM ${this.t('messages')}
       WHERE account_id = $1 AND conversation_id = $2 AND id = ANY ($3::text[])`,
      [accountId, conversationId, ids],
    );
    /** Each id's row as the page leaves it (by stored id). */
    const state = new Map<string, StoredMessage>(read.rows.map((r) => [r.id, r]));
    /** The rows to write: id, position, raw, updated_at (first_seen_at is `now` for a new row). */
    const writes = new Map<string, { id: string; position: number; raw: string; updated_at: string }>();
    const counts = zeroCounts();
    ids.forEach((id, i) => {
      const key = storedText(id);
      const raw = JSON.stringify(page.raw[i]);
      const position = offset + i;
      const prev = state.get(key);
      if (prev && prev.raw_text === raw && prev.deleted_at === null) {
        // Only the position moved (an earlier message was deleted): written, but no change of the record.
        if (prev.position !== position) {
          writes.set(key, { id, position, raw, updated_at: prev.updated_at });
          state.set(key, { ...prev, position });
        }
        counts.unchanged++;
        return;
      }
      const op: ChangeOp = !prev || prev.deleted_at !== null ? 'insert' : 'update';
      const change = this.logChange(buf, op, accountId, conversationId, id, now, runId, raw);
      if (op === 'update') {
        buf.addHistory({ change, account_id: accountId, conversation_id: conversationId, id: prev!.id, raw: prev!.raw_text, valid_from: prev!.updated_at, valid_to: now });
      }
      counts[op === 'insert' ? 'inserted' : 'updated']++;
      writes.set(key, { id, position, raw, updated_at: now });
      state.set(key, { id: key, raw_text: raw, position, deleted_at: null, updated_at: now });
    });
    // One statement: the rows as the page leaves them (none when nothing changed), the page's ids
    // and the checkpoint.
    const w = [...writes.values()];
    await q.query(
      `WITH upsert AS (
         INSERT INTO ${this.t('messages')} (account_id, conversation_id, id, position, raw, raw_text, first_seen_at, updated_at)
         SELECT $1, $2, u.id, u.position, CASE WHEN u.ok THEN u.raw_text::jsonb END, u.raw_text, $3, u.updated_at
         FROM unnest($4::text[], $5::int[], $6::text[], $7::bool[], $8::text[]) AS u(id, position, raw_text, ok, updated_at)
         ON CONFLICT (account_id, conversation_id, id) DO UPDATE SET
           position = excluded.position, raw = excluded.raw, raw_text = excluded.raw_text, updated_at = excluded.updated_at, deleted_at = NULL
       ), page AS (
         INSERT INTO ${this.t('crawl_pages')} (account_id, conversation_id, page, ids) VALUES ($1, $2, $9, $10::text[])
         ON CONFLICT (account_id, conversation_id, page) DO UPDATE SET ids = excluded.ids
       )
       INSERT INTO ${this.t('checkpoints')} (account_id, conversation_id, next_page, total_count, crawl_started_at, run_id, updated_at)
       VALUES ($1, $2, $9 + 1, $11, $3, $12, $3)
       ON CONFLICT (account_id, conversation_id) DO UPDATE SET next_page = excluded.next_page,
         total_count = excluded.total_count, run_id = excluded.run_id, updated_at = excluded.updated_at`,
      [
        accountId,
        conversationId,
        now,
        w.map((r) => r.id),
        w.map((r) => r.position),
        w.map((r) => r.raw),
        w.map((r) => jsonbSafe(r.raw)),
        w.map((r) => r.updated_at),
        page.page,
        ids,
        page.meta.total_count,
        runId,
      ],
    );
    return counts;
  }

  /** Tombstones `messages` (in id order) with `delete` changes carrying their last version; returns how many. */
  private async tombstoneAll(q: Queryable, buf: ChangeBuffer, accountId: string, conversationId: string, messages: { id: string; raw_text: string }[], now: string, runId: number | null): Promise<number> {
    if (messages.length === 0) return 0;
    await q.query(`UPDATE ${this.t('messages')} SET deleted_at = $1 WHERE account_id = $2 AND conversation_id = $3 AND id = ANY ($4::text[])`, [
      now,
      accountId,
      conversationId,
      messages.map((m) => m.id),
    ]);
    for (const m of messages) this.logChange(buf, 'delete', accountId, conversationId, m.id, now, runId, m.raw_text);
    return messages.length;
  }

  /** Tombstones the live messages no page of the current crawl served; returns how many. Call inside a transaction. */
  async tombstoneUnseen(q: Queryable, buf: ChangeBuffer, accountId: string, conversationId: string, now: string, runId: number | null): Promise<number> {
    const r = await q.query<{ id: string; raw_text: string }>(
      `SELECT m.id, m.raw_text FROM ${this.t('messages')} m
       WHERE m.account_id = $1 AND m.conversation_id = $2 AND m.deleted_at IS NULL
         AND NOT EXISTS (SELECT 1 FROM ${this.t('crawl_pages')} c WHERE c.account_id = $1 AND c.conversation_id = $2 AND m.id = ANY (c.ids))
       ORDER BY m.id`,
      [accountId, conversationId],
    );
    return this.tombstoneAll(q, buf, accountId, conversationId, r.rows, now, runId);
  }

  /** Tombstones every live message of a conversation; returns how many. Call inside a transaction. */
  async tombstoneLive(q: Queryable, buf: ChangeBuffer, accountId: string, conversationId: string, now: string, runId: number | null): Promise<number> {
    const r = await q.query<{ id: string; raw_text: string }>(
      `SELECT id, raw_text FROM ${this.t('messages')} WHERE account_id = $1 AND conversation_id = $2 AND deleted_at IS NULL ORDER BY id`,
      [accountId, conversationId],
    );
    return this.tombstoneAll(q, buf, accountId, conversationId, r.rows, now, runId);
  }

  /** Distinct message ids the pages of the current crawl served. */
  async seenCount(q: Queryable, accountId: string, conversationId: string): Promise<number> {
    const r = await q.query<{ n: number }>(
      `SELECT count(DISTINCT i)::int AS n FROM ${this.t('crawl_pages')} c CROSS JOIN LATERAL unnest(c.ids) AS i
       WHERE c.account_id = $1 AND c.conversation_id = $2`,
      [accountId, conversationId],
    );
    return r.rows[0]?.n ?? 0;
  }

  /** Forgets a crawl's checkpoint and seen ids. */
  async clearCrawl(q: Queryable, accountId: string, conversationId: string): Promise<void> {
    await q.query(
      `WITH cp AS (DELETE FROM ${this.t('checkpoints')} WHERE account_id = $1 AND conversation_id = $2)
       DELETE FROM ${this.t('crawl_pages')} WHERE account_id = $1 AND conversation_id = $2`,
      [accountId, conversationId],
    );
  }

  /** The committed checkpoint of an unfinished crawl, if any (see `Mirror.loadCheckpoint`). */
  async loadCheckpoint(q: Queryable, accountId: string, conversationId: string): Promise<Checkpoint | undefined> {
    const cp = await q.query<{ next_page: number; total_count: number; updated_at: string; run_id: number | null }>(
      `SELECT next_page, total_count, updated_at, run_id FROM ${this.t('checkpoints')} WHERE account_id = $1 AND conversation_id = $2`,
      [accountId, conversationId],
    );
    const row = cp.rows[0];
    if (!row) return undefined;
    const pages = await q.query<{ page: number; ids: string[] }>(
      `SELECT page, ids FROM ${this.t('crawl_pages')} WHERE account_id = $1 AND conversation_id = $2 ORDER BY page`,
      [accountId, conversationId],
    );
    const seenIds = new Set<string>();
    let lastPageIds: string[] = [];
    for (const p of pages.rows) {
      for (const id of p.ids) seenIds.add(id);
      if (p.page === row.next_page - 1) lastPageIds = p.ids;
    }
    return { nextPage: row.next_page, totalCount: row.total_count, seenIds, lastPageIds, updatedAt: Date.parse(row.updated_at), runId: row.run_id };
  }

  /**
   * Starts an incremental crawl (see `Mirror.seedIncrementalCrawl`): clears the crawl state, then
   * records the live messages before `beforePosition` as its page 0. Call inside a transaction.
   */
  async seedIncremental(q: Queryable, accountId: string, conversationId: string, beforePosition: number): Promise<string[]> {
    await this.clearCrawl(q, accountId, conversationId);
    const r = await q.query<{ id: string }>(
      `SELECT id FROM ${this.t('messages')} WHERE account_id = $1 AND conversation_id = $2 AND position < $3 AND deleted_at IS NULL ORDER BY position, id`,
      [accountId, conversationId, beforePosition],
    );
    const ids = r.rows.map((row) => row.id);
    await q.query(`INSERT INTO ${this.t('crawl_pages')} (account_id, conversation_id, page, ids) VALUES ($1, $2, 0, $3::text[])`, [accountId, conversationId, ids]);
    return ids;
  }

  /** Id of the live message at `position` (0-based, chronological), if any. */
  async idAt(q: Queryable, accountId: string, conversationId: string, position: number): Promise<string | undefined> {
    const r = await q.query<{ id: string }>(
      `SELECT id FROM ${this.t('messages')} WHERE account_id = $1 AND conversation_id = $2 AND position = $3 AND deleted_at IS NULL ORDER BY id LIMIT 1`,
      [accountId, conversationId, position],
    );
    return r.rows[0]?.id;
  }

  /** How many messages of the account are live. */
  async countLive(q: Queryable, accountId: string): Promise<number> {
    const r = await q.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${this.t('messages')} WHERE account_id = $1 AND deleted_at IS NULL`, [accountId]);
    return r.rows[0]?.n ?? 0;
  }
}
