/**
 * The Redis URL of the job queue (`REDIS_URL`): its parts as every connection uses them, and the one
 * form in which any output shows it (status, the daemon's ready line, enqueue, retry-failed, check,
 * every error naming Redis): `redis://127.0.0.1:6379/5`, always with its port and its database
 * number (`/0` when the URL names none), its user name and password masked as `***@`.
 */

/** The parts of a Redis URL a connection uses. */
export interface RedisTarget {
  /** `rediss://`: TLS. */
  tls: boolean;
  /** Host name or IP address, without the brackets of an IPv6 address. */
  host: string;
  /** @defaultValue 6379 */
  port: number;
  /** Database number (`SELECT`), the URL's path. @defaultValue 0 */
  db: number;
  /** ACL user name, percent-decoded; undefined when the URL has none. */
  username: string | undefined;
  /** Password, percent-decoded; undefined when the URL has none. Never shown. */
  password: string | undefined;
}

/** Default port of Redis. */
export const REDIS_DEFAULT_PORT = 6379;

/** True when the path of the Redis URL `url` is a database number or absent: `/5`, `/` or nothing. */
export function hasDbPath(url: string): boolean {
  const { pathname } = new URL(url);
  return pathname === '' || pathname === '/' || /^\/\d{1,5}$/.test(pathname);
}

/**
 * The parts of a Redis URL (`redis://[user:pass@]host[:port][/db]`, `rediss://` for TLS).
 *
 * @throws TypeError when `url` is not a URL (the configuration validates it first)
 */
export function redisTarget(url: string): RedisTarget {
  const u = new URL(url);
  const db = u.pathname.replace(/^\//, '');
  return {
    tls: u.protocol === 'rediss:',
    host: u.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: Number(u.port || REDIS_DEFAULT_PORT),
    db: db === '' ? 0 : Number(db),
    username: u.username ? decodeURIComponent(u.username) : undefined,
    password: u.password ? decodeURIComponent(u.password) : undefined,
  };
}

/**
 * A Redis URL as every message and log line shows it: scheme, host, port and database number,
 * with `***@` for a user name or password and `?***` for a query: `redis://127.0.0.1:6379/0`,
 * `rediss://***@cache.example.com:6380/5`. Text that is not a URL is masked whole (`***`).
 */
export function redisShown(url: string): string {
  let t: RedisTarget;
  let u: URL;
  try {
    u = new URL(url);
    t = redisTarget(url);
  } catch {
    return '***';
  }
  const host = t.host.includes(':') ? `[${t.host}]` : t.host;
  const user = u.username !== '' || u.password !== '' ? '***@' : '';
  const db = Number.isSafeInteger(t.db) ? String(t.db) : '?';
  return `${t.tls ? 'rediss' : 'redis'}://${user}${host}:${t.port}/${db}${u.search !== '' || u.hash !== '' ? '?***' : ''}`;
}
