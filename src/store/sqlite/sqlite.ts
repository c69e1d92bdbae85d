/**
 * The only module of src/ that imports better-sqlite3.
 *
 * Read-only opens of a mirror with no `-wal` file use a URI filename (`?immutable=1`), so that
 * SQLite creates nothing beside the file (a plain read-only connection to a WAL database creates
 * `-wal` and `-shm` and leaves them behind). better-sqlite3 accepts URI filenames only when
 * `SQLITE_USE_URI=1` is in the environment when its native addon loads, which happens lazily at the
 * first `new Database(...)`: importing this module sets it (unless the environment already sets
 * it) before any connection can be opened.
 *
 * With URIs on, a filename starting with `file:` is a URI. Callers therefore always pass absolute
 * paths (`path.resolve`), which never start with `file:`, and build URIs with {@link sqliteUri}.
 */
import Database from 'better-sqlite3';

process.env.SQLITE_USE_URI ??= '1';

export { Database };
export type { Database as Db, Statement } from 'better-sqlite3';

/**
 * A SQLite URI for the absolute path `absPath` with the query `params`, e.g.
 * `sqliteUri('/data/m.sqlite', { immutable: '1' })` → `file:///data/m.sqlite?immutable=1`.
 * Every path segment is percent-encoded, so `?`, `#`, `%` and spaces in names are safe.
 *
 * @throws TypeError when `absPath` is not absolute
 */
export function sqliteUri(absPath: string, params: Record<string, string>): string {
  if (!absPath.startsWith('/')) throw new TypeError(`sqliteUri needs an absolute POSIX path, got ${absPath}`);
  const query = new URLSearchParams(params).toString();
  return `file://${absPath.split('/').map(encodeURIComponent).join('/')}${query ? `?${query}` : ''}`;
}
