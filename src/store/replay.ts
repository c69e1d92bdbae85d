/**
 * The scratch database of `verify --deep`: every export line replayed (the last line of each key
 * wins, by seq), the mirror's rows projected into line form, and the queries that compare them.
 * An anonymous temporary SQLite database (SQLite deletes it on close; it spills to a file in the
 * temp directory when large), so the replay costs disk, not memory.
 */
import { Database, type Db, type Statement } from './sqlite/sqlite.js';

/** A stream of the change log. */
type Stream = 'messages' | 'conversations' | 'runs';

/**
 * The body of a line an erasure replaced by its stub: it says only that the version was erased, so
 * it matches a mirror row or history version that holds a redaction marker (`erased`), and nothing else.
 */
export const ERASED_BODY = '\u0000erased';

/** One export line as replayed. */
export interface ReplayLine {
  seq: number;
  stream: Stream;
  account_id: string;
  /** The conversation (a conversation's own id; `''` for a run). */
  conversation_id: string;
  id: string;
  op: string;
  /** `lineBody` of the line. */
  body: string;
}

/** A mirror row in line form. */
export interface LiveRow {
  stream: Stream;
  account_id: string;
  conversation_id: string;
  id: string;
  /** Tombstoned (its last line must be a delete). */
  deleted: boolean;
  /** `lineBody` of the line it would be exported as; null: compare nothing (a run still running). */
  body: string | null;
  /** Its record is a redaction marker (an erasure redacted it): a stub ({@link ERASED_BODY}) matches it. @defaultValue false */
  erased?: boolean;
}

/** A difference between the replay and the mirror. */
export interface Difference {
  kind: 'differs' | 'not-in-mirror' | 'not-exported' | 'deleted' | 'not-deleted' | 'history-missing' | 'history-differs' | 'history-unexported';
  stream: string;
  account_id: string;
  conversation_id: string;
  id: string;
  /** The line's seq (for history: the update's). */
  seq: number | null;
}

const LATEST = `latest AS (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY stream, account_id, conversation_id, id ORDER BY seq DESC) AS rn FROM lines) WHERE rn = 1)`;
const KEY = `stream, account_id, conversation_id, id`;

/** The scratch database; {@link close} it. */
export class Replay {
  private readonly db: Db;
  private readonly insertLine: Statement<ReplayLine>;
  private readonly insertLive: Statement<Omit<LiveRow, 'erased'> & { deletedInt: number; erasedInt: number }>;
  private readonly insertHistory: Statement<[seq: number, accountId: string, conversationId: string, id: string, body: string, erased: number]>;

  constructor() {
    this.db = new Database('');
    this.db.exec(`
      CREATE TABLE lines (seq INTEGER PRIMARY KEY, stream TEXT, account_id TEXT, conversation_id TEXT, id TEXT, op TEXT, body TEXT);
      CREATE INDEX lines_by_key ON lines (${KEY}, seq);
      CREATE TABLE live (stream TEXT, account_id TEXT, conversation_id TEXT, id TEXT, deleted INTEGER, body TEXT, erased INTEGER, PRIMARY KEY (${KEY}));
      CREATE TABLE history (seq INTEGER, account_id TEXT, conversation_id TEXT, id TEXT, body TEXT, erased INTEGER);
      CREATE INDEX history_by_seq ON history (seq);
      CREATE TABLE expired (stream TEXT, account_id TEXT, first_seq INTEGER, last_seq INTEGER);`);
    this.insertLine = this.db.prepare(`INSERT OR IGNORE INTO lines (seq, ${KEY}, op, body) VALUES (@seq, @stream, @account_id, @conversation_id, @id, @op, @body)`);
    this.insertLive = this.db.prepare(`INSERT OR REPLACE INTO live (${KEY}, deleted, body, erased) VALUES (@stream, @account_id, @conversation_id, @id, @deletedInt, @body, @erasedInt)`);
    this.insertHistory = this.db.prepare(`INSERT INTO history (seq, account_id, conversation_id, id, body, erased) VALUES (?, ?, ?, ?, ?, ?)`);
  }

  /** Runs `f` in one transaction (bulk inserts). */
  batch<T>(f: () => T): T {
    return this.db.transaction(f)();
  }

  /**
   * Runs the async `f` in one transaction (bulk inserts while reading an async source, such as the
   * mirror's streams); rolled back when `f` rejects. Nothing else may use the replay until it settles.
   */
  async batchAsync<T>(f: () => Promise<T>): Promise<T> {
    this.db.exec('BEGIN');
    try {
      const result = await f();
      this.db.exec('COMMIT');
      return result;
    } catch (err) {
      if (this.db.inTransaction) this.db.exec('ROLLBACK');
      throw err;
    }
  }

  /** Adds a line; false when its seq is already there (a line exported twice). */
  addLine(l: ReplayLine): boolean {
    return this.insertLine.run(l).changes === 1;
  }

  addLive(r: LiveRow): void {
    const { erased, ...row } = r;
    this.insertLive.run({ ...row, deletedInt: r.deleted ? 1 : 0, erasedInt: erased === true ? 1 : 0 });
  }

  /**
   * Adds a `message_history` row in line form: the version the update `seq` replaced (`erased`:
   * it holds a redaction marker, which a stub matches).
   */
  addHistory(seq: number, accountId: string, conversationId: string, id: string, body: string, erased = false): void {
    this.insertHistory.run(seq, accountId, conversationId, id, body, erased ? 1 : 0);
  }

  /**
   * Adds the seq range of a file a retention record expired (its lines are gone): a seq in it is
   * not a gap, a history row replaced at a seq in it needs no line, and a mirror row of its stream
   * and account needs no line (its lines may all have expired).
   */
  addExpired(stream: Stream, accountId: string, firstSeq: number, lastSeq: number): void {
    this.db.prepare(`INSERT INTO expired (stream, account_id, first_seq, last_seq) VALUES (?, ?, ?, ?)`).run(stream, accountId, firstSeq, lastSeq);
  }

  /** Ranges of seq in `[1, upTo]` that no line holds and no expired file's range covers, at most `limit`. */
  gaps(upTo: number, limit: number): { from: number; to: number }[] {
    return this.db
      .prepare<{ upTo: number }, { from: number; to: number }>(
        `SELECT coalesce(prev, 0) + 1 AS "from", lo - 1 AS "to" FROM (
           SELECT lo, max(hi) OVER (ORDER BY lo, hi ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM (
             SELECT seq AS lo, seq AS hi FROM lines WHERE seq <= @upTo
             UNION ALL SELECT first_seq, min(last_seq, @upTo) FROM expired WHERE first_seq <= @upTo
             UNION ALL SELECT @upTo + 1, @upTo + 1))
         WHERE lo > coalesce(prev, 0) + 1 ORDER BY lo LIMIT ${Math.max(1, Math.floor(limit))}`,
      )
      .all({ upTo });
  }

  /**
   * The differences between the replay and the mirror, in seq order where there is a line, at most
   * `limit`, and how many there are in all.
   */
  differences(limit: number): { first: Difference[]; total: number } {
    const sql = `WITH ${LATEST},
      upd AS (SELECT seq, ${KEY}, op, lag(body) OVER (PARTITION BY ${KEY} ORDER BY seq) AS prev FROM lines),
      d AS (
        SELECT CASE WHEN m.stream IS NULL THEN 'not-in-mirror'
                    WHEN l.op = 'delete' AND m.deleted = 0 THEN 'not-deleted'
                    WHEN l.op <> 'delete' AND m.deleted = 1 THEN 'deleted'
                    ELSE 'differs' END AS kind, l.stream, l.account_id, l.conversation_id, l.id, l.seq
        FROM latest l LEFT JOIN live m USING (${KEY})
        WHERE m.stream IS NULL OR (m.body IS NOT NULL AND ((m.body IS NOT l.body AND NOT (l.body = @erased AND m.erased = 1)) OR m.deleted <> (l.op = 'delete')))
        UNION ALL
        SELECT 'not-exported', m.stream, m.account_id, m.conversation_id, m.id, NULL
        FROM live m LEFT JOIN latest l USING (${KEY}) WHERE l.seq IS NULL AND m.stream <> 'runs'
          AND NOT EXISTS (SELECT 1 FROM expired e WHERE e.stream = m.stream AND e.account_id = m.account_id)
        UNION ALL
        SELECT CASE WHEN h.seq IS NULL THEN 'history-missing' ELSE 'history-differs' END, 'messages', u.account_id, u.conversation_id, u.id, u.seq
        FROM upd u LEFT JOIN history h ON h.seq = u.seq
        WHERE u.stream = 'messages' AND u.op = 'update'
          AND NOT (u.prev IS NULL AND EXISTS (SELECT 1 FROM expired e WHERE e.stream = 'messages' AND e.account_id = u.account_id AND e.last_seq < u.seq))
          AND (h.seq IS NULL OR (h.body IS NOT u.prev AND NOT (u.prev = @erased AND h.erased = 1)) OR h.account_id IS NOT u.account_id OR h.conversation_id IS NOT u.conversation_id OR h.id IS NOT u.id)
        UNION ALL
        SELECT 'history-unexported', 'messages', h.account_id, h.conversation_id, h.id, h.seq
        FROM history h LEFT JOIN lines l ON l.seq = h.seq AND l.stream = 'messages' AND l.op = 'update' WHERE l.seq IS NULL
          AND NOT EXISTS (SELECT 1 FROM expired e WHERE e.stream = 'messages' AND e.account_id = h.account_id AND h.seq BETWEEN e.first_seq AND e.last_seq))`;
    const first = this.db.prepare<{ erased: string }, Difference>(`${sql} SELECT * FROM d ORDER BY seq IS NULL, seq, stream, account_id, conversation_id, id LIMIT ${Math.max(1, limit)}`).all({ erased: ERASED_BODY });
    const total = this.db.prepare<{ erased: string }, { n: number }>(`${sql} SELECT count(*) AS n FROM d`).get({ erased: ERASED_BODY })?.n ?? 0;
    return { first, total };
  }

  close(): void {
    this.db.close();
  }
}
