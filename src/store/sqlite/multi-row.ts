/**
 * Multi-row statements: a page's rows written (or looked up) in a few calls into SQLite instead of
 * one per row, with a bounded set of prepared statements. Used by the message and change-log
 * tables (messages.ts, change-log.ts), which give the SQL.
 */
import type { Db, Statement } from './sqlite.js';

/**
 * The row counts multi-row statements are prepared for, largest first. A page's rows go in a few
 * statements (calls into SQLite, not rows, were most of a page commit's cost: one per row before),
 * and each kind of statement is prepared at most this many times (each costs memory: every count
 * from 1 to 100 took 12 MiB for the four kinds).
 */
export const STATEMENT_ROWS = [100, 64, 32, 16, 8, 4, 2, 1] as const;

/** {@link STATEMENT_ROWS} smallest first: the first count at least as large as an IN list pads it. */
const ASCENDING_ROWS = [...STATEMENT_ROWS].reverse();

/** Rows one multi-row statement takes at most. */
export const ROWS_PER_STATEMENT = STATEMENT_ROWS[0];

/**
 * Prepared multi-row statements, one per count of {@link STATEMENT_ROWS}: `make(n)` builds the SQL
 * of `n` rows (or of an `IN` list of `n` values).
 */
export class MultiRowStatements<R = unknown> {
  private readonly byCount = new Map<number, Statement<unknown[], R>>();
  constructor(
    private readonly db: Db,
    private readonly make: (rows: number) => string,
  ) {}

  /** The statement of `rows` rows, one of {@link STATEMENT_ROWS}. */
  private of(rows: number): Statement<unknown[], R> {
    let stmt = this.byCount.get(rows);
    if (!stmt) {
      if (!(STATEMENT_ROWS as readonly number[]).includes(rows)) throw new RangeError(`no multi-row statement of ${rows} rows (${STATEMENT_ROWS.join(', ')})`);
      stmt = this.db.prepare<unknown[], R>(this.make(rows));
      this.byCount.set(rows, stmt);
    }
    return stmt;
  }

  /** Runs the statement over `rows` (each a row's values in column order), in pieces of the prepared counts, in order. */
  run(rows: readonly (readonly unknown[])[]): void {
    for (let i = 0; i < rows.length; ) {
      const size = STATEMENT_ROWS.find((n) => n <= rows.length - i)!;
      this.of(size).run(rows.slice(i, i + size).flat());
      i += size;
    }
  }

  /**
   * Runs a query whose `IN` list takes `values` (1 to {@link ROWS_PER_STATEMENT}, after the
   * `leading` parameters) in one call: the list is padded to a prepared count by repeating its
   * first value, which an `IN` list ignores.
   *
   * @throws RangeError when `values` is empty or longer than {@link ROWS_PER_STATEMENT}
   */
  all(leading: readonly unknown[], values: readonly unknown[]): R[] {
    if (values.length < 1 || values.length > ROWS_PER_STATEMENT) throw new RangeError(`an IN list of 1 to ${ROWS_PER_STATEMENT} values, not ${values.length}`);
    const size = ASCENDING_ROWS.find((n) => n >= values.length)!;
    const padded = values.concat(Array<unknown>(size - values.length).fill(values[0]));
    return this.of(size).all(...leading, ...padded);
  }
}

/** `(?, ?, …)` repeated `rows` times, comma-separated: the VALUES of a multi-row INSERT of `columns` columns. */
export const valuesList = (rows: number, columns: number): string => Array(rows).fill(`(${Array(columns).fill('?').join(', ')})`).join(', ');

