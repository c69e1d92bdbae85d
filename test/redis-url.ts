/**
 * Redis URLs for tests, read the way the application reads them (`redisConnection` in
 * jobs/queue.ts): host, port, user, password and TLS from the URL, the database from its path
 * (`redis://127.0.0.1:6379/5` is database 5; no path is database 0). A URL built from the test
 * run's one (a proxy in front of it, database 0 of the same server) keeps everything else, so a
 * child given it talks to the same database as the test.
 *
 * Pure functions with no vitest import: test/global-setup.ts uses them in vitest's main process.
 */

/**
 * The database number of `url`, as the application selects it (its path; 0 without one).
 *
 * @throws Error naming the URL's path when it is not a database number
 */
export function redisDb(url: string): number {
  const db = new URL(url).pathname.replace(/^\//, '');
  if (db === '') return 0;
  if (!/^\d{1,5}$/.test(db)) throw new Error(`the Redis URL's path "/${db}" is not a database number`);
  return Number(db);
}

/** `url` with its database replaced by `db` (user, password, host, port and scheme kept). */
export function withRedisDb(url: string, db: number): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

/**
 * `url` reached through `host:port` instead (a TCP proxy in front of the server): user, password,
 * scheme and, above all, the database kept. A proxy URL that dropped the database would send a
 * child to database 0 while the test watches another.
 */
export function redisUrlVia(url: string, port: number, host = '127.0.0.1'): string {
  const u = new URL(url);
  u.hostname = host;
  u.port = String(port);
  // Always explicit, so the child selects the same database even when `url` had no path.
  u.pathname = `/${redisDb(url)}`;
  return u.toString();
}

/** Hides a password in a URL before it goes into a message. */
export function redactRedisUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparseable URL)';
  }
}

/**
 * The first characters of every test queue prefix: `cmtest-<run id>-`. The run id is drawn once
 * per test run (test/global-setup.ts), so runs sharing one Redis never see each other's keys and
 * the global teardown scans only its own run's.
 */
export function runKeyPrefix(runId: string): string {
  if (!/^[0-9a-f]{8}$/.test(runId)) throw new Error(`a test run id is 8 hex digits, got ${JSON.stringify(runId)}`);
  return `cmtest-${runId}-`;
}
