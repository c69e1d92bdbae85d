/**
 * Multi-row statements (src/store/sqlite/multi-row.ts) on a real in-memory SQLite: rows go in pieces of
 * the prepared counts, in order; an IN list is padded, not truncated; no other count is prepared.
 * SQLite only: a helper of the SQLite engine's own statements, below the Mirror interface (what
 * page commits do on every engine is in mirror.test.ts's conformance suite).
 */
import { describe, expect, it } from 'vitest';
import { Database } from '../src/store/sqlite/sqlite.js';
import { MultiRowStatements, ROWS_PER_STATEMENT, STATEMENT_ROWS, valuesList } from '../src/store/sqlite/multi-row.js';

function table() {
  const db = new Database(':memory:');
  db.exec('CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)');
  const made: number[] = [];
  const insert = new MultiRowStatements(db, (n) => {
    made.push(n);
    return `INSERT INTO t (k, v) VALUES ${valuesList(n, 2)}`;
  });
  const select = new MultiRowStatements<{ k: number; v: string }>(db, (n) => `SELECT k, v FROM t WHERE v >= ? AND k IN (${Array(n).fill('?').join(', ')}) ORDER BY k`);
  return { db, insert, select, made };
}

describe('MultiRowStatements', () => {
  it('writes every row in order, in pieces of the prepared counts only', () => {
    const { db, insert, made } = table();
    let next = 0;
    for (const n of [0, 1, 3, 46, 99, 100, 101, 257]) {
      const rows = Array.from({ length: n }, () => [next, `v${next++}`]);
      insert.run(rows);
    }
    expect(db.prepare('SELECT k FROM t ORDER BY rowid').pluck().all()).toEqual(Array.from({ length: next }, (_, i) => i));
    expect(made.every((n) => (STATEMENT_ROWS as readonly number[]).includes(n))).toBe(true);
    expect(new Set(made).size).toBe(made.length); // each count prepared once
  });

  it('answers an IN list of any length up to the maximum in one call, padding it with its first value', () => {
    const { insert, select } = table();
    insert.run(Array.from({ length: 150 }, (_, i) => [i, 'x']));
    for (const n of [1, 2, 3, 17, 64, 65, 100]) {
      const keys = Array.from({ length: n }, (_, i) => 149 - i);
      expect(select.all(['x'], keys).map((r) => r.k)).toEqual([...keys].sort((a, b) => a - b));
    }
    expect(() => select.all(['x'], [])).toThrow(RangeError);
    expect(() => select.all(['x'], Array(ROWS_PER_STATEMENT + 1).fill(1))).toThrow(RangeError);
  });
});
