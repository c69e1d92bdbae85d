/**
 * The PostgreSQL target of `CONVO_MIRROR_DB`: `postgres://user[:password]@host[:port]/db?schema=NAME`
 * (also `postgresql://`). Pure: no connection, no environment.
 *
 * `schema` is ours (the PostgreSQL schema that holds one mirror); it is taken out of the URL
 * handed to node-postgres, and every other query parameter (`sslmode`, `host`, …) is left for it.
 * The one form any output shows the target in ({@link PostgresTarget.shown}) has the password
 * masked, in the user info and in any `password` query parameter.
 */
import { ConfigError } from '../src/errors.js';

/** The setting the target comes from, named by every message about it. */
export const DB_SETTING = 'CONVO_MIRROR_DB';

/** The schema a mirror lives in when the URL names none. */
export const DEFAULT_PG_SCHEMA = 'convo_mirror';

/**
 * What a schema name must look like: lower-case letters, digits and `_`, not starting with a
 * digit, at most 63 characters (PostgreSQL's identifier limit). Such a name never needs quoting
 * rules beyond `"…"`, and is the same whichever way a tool folds case.
 */
export const PG_SCHEMA_PATTERN = /^[a-z_][a-z0-9_]{0,62}$/;

/** A parsed PostgreSQL target. */
export interface PostgresTarget {
  /** The URL for node-postgres: the value without its `schema` query parameter. */
  url: string;
  /** The schema that holds the mirror. @defaultValue {@link DEFAULT_PG_SCHEMA} */
  schema: string;
  /** The value as any output shows it: the password (user info and `password=` parameters) as `***`. */
  shown: string;
}

/** Whether `s` is a PostgreSQL URL (`postgres://` or `postgresql://`, any case) rather than a SQLite file path. */
export function isPostgresUrl(s: string): boolean {
  return /^postgres(ql)?:\/\//i.test(s.trim());
}

/** Query parameters whose value is a secret (masked in {@link PostgresTarget.shown}). */
const SECRET_PARAM = /password/i;

/** Decodes a query component as a form does (`+` is a space); undefined when it is not valid percent-encoding. */
function decodeComponent(s: string): string | undefined {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}

/**
 * Parses a PostgreSQL target (see the module comment).
 *
 * @param value - the setting's value, e.g. `postgres://mirror:secret@db:5432/support?schema=acme`
 * @returns the URL for node-postgres, the schema, and the masked form
 * @throws {@link ConfigError} naming `CONVO_MIRROR_DB` (one line, never the password) when the value
 *   is not a `postgres://` or `postgresql://` URL, has no database name, or its `schema` is empty,
 *   given twice, or not a plain lower-case identifier ({@link PG_SCHEMA_PATTERN})
 */
export function parsePostgresTarget(value: string): PostgresTarget {
  const trimmed = value.trim();
  if (!isPostgresUrl(trimmed)) {
    throw new ConfigError(DB_SETTING, 'is not a PostgreSQL URL: it must start with postgres:// or postgresql://');
  }
  let u: URL;
  try {
    u = new URL(trimmed);
  } catch {
    throw new ConfigError(DB_SETTING, 'is not a valid URL: expected postgres://user[:password]@host[:port]/database[?schema=NAME]');
  }
  // The query, parameter by parameter as written (URLSearchParams would re-encode the others).
  const params = u.search.replace(/^\?/, '').split('&').filter((p) => p !== '');
  const schemas: string[] = [];
  const kept: string[] = [];
  const shownParams: string[] = [];
  for (const p of params) {
    const eq = p.indexOf('=');
    const key = decodeComponent(eq === -1 ? p : p.slice(0, eq));
    const val = eq === -1 ? '' : p.slice(eq + 1);
    if (key === 'schema') {
      const decoded = decodeComponent(val);
      if (decoded === undefined) throw new ConfigError(DB_SETTING, 'its schema parameter is not valid percent-encoding');
      schemas.push(decoded);
      shownParams.push(p);
      continue;
    }
    kept.push(p);
    shownParams.push(key !== undefined && SECRET_PARAM.test(key) ? `${p.slice(0, eq === -1 ? p.length : eq)}=***` : p);
  }
  if (schemas.length > 1) throw new ConfigError(DB_SETTING, 'names the schema more than once (?schema= given twice)');
  const schema = schemas[0] ?? DEFAULT_PG_SCHEMA;
  if (!PG_SCHEMA_PATTERN.test(schema)) {
    throw new ConfigError(
      DB_SETTING,
      `schema ${JSON.stringify(schema.slice(0, 80))} is not a plain identifier: use 1 to 63 lower-case letters, digits and _, not starting with a digit`,
    );
  }
  if (u.pathname.replace(/^\//, '') === '') {
    throw new ConfigError(DB_SETTING, 'names no database: expected postgres://user@host:port/DATABASE');
  }
  const search = (list: string[]): string => (list.length > 0 ? `?${list.join('&')}` : '');
  const url = new URL(u.href);
  url.search = search(kept);
  const shown = new URL(u.href);
  if (shown.password !== '') shown.password = '***';
  shown.search = search(shownParams);
  shown.hash = '';
  return { url: url.href, schema, shown: shown.href };
}

/**
 * A value of `CONVO_MIRROR_DB` as any output may show it: a SQLite path as given; a PostgreSQL URL
 * in its masked form ({@link PostgresTarget.shown}); a PostgreSQL URL that does not parse with
 * everything from the scheme up to its last `@`, and any query or fragment, masked (a password
 * typed into it, however malformed, is never shown).
 */
export function dbShown(value: string): string {
  if (!isPostgresUrl(value)) return value;
  try {
    return parsePostgresTarget(value).shown;
  } catch {
    const text = value.trim();
    const at = text.lastIndexOf('@');
    const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(text)?.[0] ?? '';
    return (at < 0 ? text : `${scheme}***${text.slice(at)}`).replace(/([?#])[\s\S]*$/, '$1***');
  }
}

/**
 * Why `value` cannot be `CONVO_MIRROR_DB`, one line without the setting's name, or undefined when
 * it can: a PostgreSQL URL must parse ({@link parsePostgresTarget}); any other value is a SQLite
 * path, checked when it is opened.
 */
export function dbProblem(value: string): string | undefined {
  if (!isPostgresUrl(value)) return undefined;
  try {
    parsePostgresTarget(value);
    return undefined;
  } catch (err) {
    if (err instanceof ConfigError) return err.message.slice(err.variable.length + 2);
    throw err;
  }
}
