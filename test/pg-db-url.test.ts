/**
 * config/db-url.ts: which values are PostgreSQL targets, the schema parameter (ours: default,
 * validation, taken out of the URL node-postgres gets), and the masked form every output shows.
 * Pure unit tests.
 */
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../src/errors.js';
import { DEFAULT_PG_SCHEMA, isPostgresUrl, parsePostgresTarget } from '../config/db-url.js';

/** The message of what `f` throws, checking it is a one-line ConfigError naming CONVO_MIRROR_DB. */
function failure(f: () => unknown): string {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    const message = (err as Error).message;
    expect(message.startsWith('CONVO_MIRROR_DB: ')).toBe(true);
    expect(message).not.toContain('\n');
    return message;
  }
  throw new Error('did not throw');
}

describe('isPostgresUrl', () => {
  it('takes postgres:// and postgresql:// in any case, and nothing else', () => {
    for (const s of ['postgres://h/db', 'postgresql://u@h:5432/db', 'POSTGRES://h/db', '  postgresql://h/db']) expect(isPostgresUrl(s)).toBe(true);
    for (const s of ['./mirror.sqlite', '/data/postgres://x', 'postgres:/h/db', 'file:postgres://h', 'pg://h/db', 'mysql://h/db']) expect(isPostgresUrl(s)).toBe(false);
  });
});

describe('parsePostgresTarget', () => {
  it('defaults the schema and hands the URL over unchanged', () => {
    const t = parsePostgresTarget('postgres://mirror@db.example:5432/support');
    expect(t).toEqual({ url: 'postgres://mirror@db.example:5432/support', schema: DEFAULT_PG_SCHEMA, shown: 'postgres://mirror@db.example:5432/support' });
  });

  it('takes the schema out of the URL for node-postgres, keeping every other parameter as written', () => {
    const t = parsePostgresTarget('postgresql://mirror@db:5432/support?sslmode=require&schema=acme_eu&application_name=a%20b');
    expect(t.schema).toBe('acme_eu');
    expect(t.url).toBe('postgresql://mirror@db:5432/support?sslmode=require&application_name=a%20b');
    expect(t.shown).toBe('postgresql://mirror@db:5432/support?sslmode=require&schema=acme_eu&application_name=a%20b');
  });

  it('masks the password in the user info and in password parameters, and never shows it anywhere', () => {
    const t = parsePostgresTarget('postgres://bob:s3cr%40t-pw@db:5432/support?schema=acme&password=other-pw&sslpassword=third-pw');
    expect(t.shown).toBe('postgres://bob:***@db:5432/support?schema=acme&password=***&sslpassword=***');
    for (const secret of ['s3cr', 'other-pw', 'third-pw']) expect(t.shown).not.toContain(secret);
    // node-postgres gets them all.
    expect(t.url).toBe('postgres://bob:s3cr%40t-pw@db:5432/support?password=other-pw&sslpassword=third-pw');
  });

  it('accepts a socket directory as a host parameter', () => {
    const t = parsePostgresTarget('postgres:///support?host=/var/run/postgresql&schema=s1');
    expect(t).toMatchObject({ url: 'postgres:///support?host=/var/run/postgresql', schema: 's1' });
  });

  it('refuses a bad schema with one line naming the setting, never the password', () => {
    const bad = ['Acme', '1abc', 'a-b', 'a b', '', 'x'.repeat(64), 'drop"table'];
    for (const s of bad) {
      const m = failure(() => parsePostgresTarget(`postgres://u:hunter2@h/db?schema=${encodeURIComponent(s)}`));
      expect(m).toContain('schema');
      expect(m).not.toContain('hunter2');
    }
    expect(parsePostgresTarget(`postgres://h/db?schema=${'x'.repeat(63)}`).schema).toHaveLength(63);
    expect(failure(() => parsePostgresTarget('postgres://h/db?schema=a&schema=b'))).toContain('more than once');
  });

  it('refuses what is not a usable PostgreSQL URL', () => {
    expect(failure(() => parsePostgresTarget('/data/mirror.sqlite'))).toContain('postgres://');
    expect(failure(() => parsePostgresTarget('postgres://u:hunter2@h:99999/db'))).not.toContain('hunter2');
    expect(failure(() => parsePostgresTarget('postgres://u:hunter2@h:5432/'))).toContain('no database');
  });
});
