/**
 * The change log (transactional outbox) on PostgreSQL: one `change_log` row per insert, update or
 * delete of a message or conversation and one per end of a run, with its payload in
 * `change_payloads`, written in the same transaction as the change (the SQLite group:
 * src/store/change-log.ts).
 *
 * Seqs are gapless and handed out in COMMIT order (issue 25, item 2). A sequence would hand them
 * out in call order: a transaction that took seq 7 and commits after the one that took seq 8
 * lets a publisher reading "every seq up to the max" publish 8 and skip 7 for ever. Here a writing
 * transaction collects its changes in a {@link ChangeBuffer} and allocates their seqs at its END,
 * in one statement ({@link ChangeLog.flush}) that moves the one-row counter `change_seq`
 * (`UPDATE … SET last = last + n RETURNING`) and inserts the change rows, their payloads and the
 * `message_history` rows that name a seq; the transaction then commits at once. The counter's row
 * lock is held from that UPDATE until COMMIT, so:
 *
 * - a later transaction's UPDATE waits until the earlier one has committed (or rolled back), then
 *   reads the committed `last`: seqs are allocated in commit order;
 * - PostgreSQL makes a transaction visible before it releases its locks, so any snapshot that sees
 *   seq n sees every seq below it: a reader of `(watermark, max(seq)]` never skips one;
 * - a rollback takes the counter back with it: no gap.
 *
 * The cost: transactions that append changes serialize on the counter for the time between their
 * flush and their commit (one statement and the commit); those that append nothing never touch it.
 */
import type { ChangeOp, ChangeStream, ExportChange } from '../types.js';
import type { RunChanges } from '../mirror.js';
import { qualify, type Queryable } from './db.js';

/** A change to append: a change-log row's facts (its seq comes at the flush). */
export type NewChange = Pick<ExportChange, 'stream' | 'op' | 'account_id' | 'conversation_id' | 'record_id' | 'synced_at'> & {
  run_id: number | null;
  /** The record as served (JSON text, byte-exact). */
  record: string;
};

/** A superseded message version, kept in `message_history` with the seq of the change that replaced it. */
export interface NewHistory {
  /** Index in the buffer of the `update` change that replaced it. */
  change: number;
  account_id: string;
  conversation_id: string;
  id: string;
  /** The superseded version as served (JSON text). */
  raw: string;
  valid_from: string;
  valid_to: string;
}

/**
 * A JSON text `jsonb` cannot hold: one with a `\u0000` escape or a surrogate escape (JSON.stringify
 * escapes lone surrogates only). Such a record keeps `raw` NULL and only its `raw_text`.
 */
const JSONB_UNSAFE = /(?:^|[^\\])(?:\\\\)*\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})/;

/** Whether PostgreSQL's `jsonb` can hold the JSON text `text` (see {@link JSONB_UNSAFE}). */
export const jsonbSafe = (text: string): boolean => !JSONB_UNSAFE.test(text);

/** The changes (and superseded versions) one transaction appends, in order, until its flush. */
export class ChangeBuffer {
  readonly changes: NewChange[] = [];
  readonly history: NewHistory[] = [];

  /** Appends a change; returns its index in the buffer. */
  add(change: NewChange): number {
    return this.changes.push(change) - 1;
  }

  /** Keeps a superseded version, tied to the buffered `update` change `h.change`. */
  addHistory(h: NewHistory): void {
    this.history.push(h);
  }
}

/** The change log's statements in the mirror's schema. */
export class ChangeLog {
  private readonly flushSql: string;
  private readonly ofRunSql: string;
  private readonly runLoggedSql: string;

  constructor(schema: string) {
    const t = (name: string) => qualify(schema, name);
    this.flushSql = `
      WITH seq AS (
        UPDATE ${t('change_seq')} SET last = last + $1::bigint WHERE id = 1 RETURNING last - $1::bigint AS base
      ), input AS (
        SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[])
          WITH ORDINALITY AS u(stream, op, account_id, conversation_id, record_id, synced_at, run_id, record, k)
      ), logged AS (
        INSERT INTO ${t('change_log')} (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id)
        SELECT seq.base + input.k, input.stream, input.op, input.account_id, input.conversation_id, input.record_id, input.synced_at, input.run_id
        FROM input, seq
      ), payloads AS (
        INSERT INTO ${t('change_payloads')} (seq, record) SELECT seq.base + input.k, input.record FROM input, seq
      ), history AS (
        INSERT INTO ${t('message_history')} (account_id, conversation_id, id, raw, raw_text, valid_from, valid_to, replaced_by_seq)
        SELECT h.account_id, h.conversation_id, h.id, CASE WHEN h.ok THEN h.raw_text::jsonb END, h.raw_text, h.valid_from, h.valid_to, seq.base + h.k
        FROM unnest($10::bigint[], $11::text[], $12::text[], $13::text[], $14::text[], $15::bool[], $16::text[], $17::text[])
          AS h(k, account_id, conversation_id, id, raw_text, ok, valid_from, valid_to), seq
      )
      SELECT base FROM seq`;
    this.ofRunSql = `SELECT stream, op, count(*)::int AS n FROM ${t('change_log')}
                     WHERE run_id = $1 AND stream IN ('messages', 'conversations') GROUP BY stream, op`;
    this.runLoggedSql = `SELECT EXISTS (SELECT 1 FROM ${t('change_log')} WHERE run_id = $1 AND stream = 'runs') AS logged`;
  }

  /**
   * Allocates the seqs of `buf`'s changes (consecutive, in buffer order) and writes them, their
   * payloads and their `message_history` rows, in one statement. Call as the last statement of
   * the transaction, just before COMMIT: from here until the commit, every other appending
   * transaction waits (see the module comment). Nothing happens (no lock) for an empty buffer.
   *
   * @returns the seqs, in buffer order
   */
  async flush(q: Queryable, buf: ChangeBuffer): Promise<number[]> {
    const n = buf.changes.length;
    if (n === 0) return [];
    const c = buf.changes;
    const h = buf.history;
    const r = await q.query<{ base: number }>(this.flushSql, [
      n,
      c.map((x) => x.stream),
      c.map((x) => x.op),
      c.map((x) => x.account_id),
      c.map((x) => x.conversation_id),
      c.map((x) => x.record_id),
      c.map((x) => x.synced_at),
      c.map((x) => x.run_id),
      c.map((x) => x.record),
      h.map((x) => x.change + 1),
      h.map((x) => x.account_id),
      h.map((x) => x.conversation_id),
      h.map((x) => x.id),
      h.map((x) => x.raw),
      h.map((x) => jsonbSafe(x.raw)),
      h.map((x) => x.valid_from),
      h.map((x) => x.valid_to),
    ]);
    const base = Number(r.rows[0]!.base);
    return c.map((_, i) => base + i + 1);
  }

  /**
   * What run `runId` changed, counted from its committed change-log rows (see the SQLite group's
   * `changesOfRun`).
   */
  async changesOfRun(q: Queryable, runId: number): Promise<RunChanges> {
    const out: RunChanges = { messages: { inserted: 0, updated: 0, deleted: 0 }, conversations: { inserted: 0, updated: 0, deleted: 0 } };
    const key = { insert: 'inserted', update: 'updated', delete: 'deleted' } as const;
    const r = await q.query<{ stream: Exclude<ChangeStream, 'runs'>; op: ChangeOp; n: number }>(this.ofRunSql, [runId]);
    for (const row of r.rows) out[row.stream][key[row.op]] = row.n;
    return out;
  }

  /**
   * Buffers the `runs` row of a run that just ended: `insert` the first time, `update` when the
   * run has a `runs` row already (committed, or earlier in `buf`). Call inside the transaction
   * that records the end.
   *
   * @param record - the run's record (JSON), see `Runs.lineRecord`
   * @param endedAt - when it ended: the row's `synced_at` (and so its export partition's day)
   */
  async appendRun(q: Queryable, buf: ChangeBuffer, runId: number, accountId: string, record: string, endedAt: string): Promise<void> {
    const buffered = buf.changes.some((c) => c.stream === 'runs' && c.run_id === runId);
    const logged = buffered || (await q.query<{ logged: boolean }>(this.runLoggedSql, [runId])).rows[0]!.logged;
    buf.add({ stream: 'runs', op: logged ? 'update' : 'insert', account_id: accountId, conversation_id: '', record_id: String(runId), synced_at: endedAt, run_id: runId, record });
  }
}
