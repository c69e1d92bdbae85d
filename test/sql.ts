/**
 * The one place tests read (or, to inject a fault, write) a mirror's SQLite directly. Everything
 * else goes through the `Mirror`'s methods. The connection is the mirror's own (its private `db`),
 * so reads see its uncommitted state and per-connection pragmas (e.g. `max_page_count`) apply to it.
 */
import type { Mirror } from '../src/store/mirror.js';
import type { SqliteMirror } from '../src/store/sqlite/mirror.js';
import type { Db } from '../src/store/sqlite/sqlite.js';

/**
 * The mirror's own better-sqlite3 connection (test-only escape hatch: `SqliteMirror.db` is
 * private). SQLite only: a mirror of another engine is refused.
 */
export function connectionOf(mirror: Mirror): Db {
  if (mirror.engine !== 'sqlite') throw new Error(`test/sql.ts reads SQLite mirrors only, not a ${mirror.engine} one (${mirror.location})`);
  return (mirror as SqliteMirror as unknown as { db: Db }).db;
}

/** All rows of `query`. */
export function sqlAll<T = Record<string, unknown>>(mirror: Mirror, query: string, ...params: unknown[]): T[] {
  return connectionOf(mirror).prepare(query).all(...params) as T[];
}

/** The first row of `query`, or undefined. */
export function sqlGet<T = Record<string, unknown>>(mirror: Mirror, query: string, ...params: unknown[]): T | undefined {
  return connectionOf(mirror).prepare(query).get(...params) as T | undefined;
}

/** The first column of the first row of `query` (e.g. a `count(*)`). */
export function sqlValue<T = number>(mirror: Mirror, query: string, ...params: unknown[]): T {
  const row = connectionOf(mirror).prepare(query).raw(true).get(...params) as unknown[] | undefined;
  if (!row) throw new Error(`no row for: ${query}`);
  return row[0] as T;
}

/** Runs a write (fault injection: a tampered row, a rolled-back watermark); returns rows changed. */
export function sqlRun(mirror: Mirror, query: string, ...params: unknown[]): number {
  return connectionOf(mirror).prepare(query).run(...params).changes;
}
