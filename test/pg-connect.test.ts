/**
 * A PostgreSQL target that cannot be used fails fast, with one line naming CONVO_MIRROR_DB and the
 * URL with its password masked (issue 25, item 6 and Tests): nothing listening (refused), no
 * answer (connect timeout), a refused password (a fake server: trust authentication here accepts
 * any), a missing database, a role without the right to create the mirror's schema. And the
 * schema checks of an open: a read-only open of nothing, a schema newer than the code, a schema
 * holding someone else's tables.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { StoreError } from '../src/errors.js';
import { MirrorDatabaseError } from '../src/store/postgres/connect.js';
import { PostgresMirror } from '../src/store/postgres/mirror.js';
import { PG_SCHEMA_VERSION } from '../src/store/postgres/migrations.js';
import { closedPort, dropSchema, PG_BASE, pgQuery, pgUrl, randomSchema, startFakePg } from './pg.js';

const PASSWORD = `pw-${randomBytes(6).toString('hex')}`;
const schemas: string[] = [];
const roles: string[] = [];
afterAll(async () => {
  for (const s of schemas) await dropSchema(s);
  for (const r of roles) await pgQuery(`DROP ROLE IF EXISTS "${r}"`);
});

/** A schema for one test, dropped at the end. */
function schema(label: string): string {
  const s = randomSchema(label);
  schemas.push(s);
  return s;
}

/** The test server's URL with user `user` and {@link PASSWORD}, and `host:port` / database replaced as given. */
function urlWith(parts: { user?: string; host?: string; port?: number; database?: string; schema: string }): string {
  const u = new URL(PG_BASE);
  u.username = parts.user ?? (u.username || 'postgres');
  u.password = PASSWORD;
  if (parts.host) u.hostname = parts.host;
  if (parts.port) u.port = String(parts.port);
  if (parts.database) u.pathname = `/${parts.database}`;
  return pgUrl(parts.schema, u.href);
}

/** What opening `url` rejects with, checked to be one masked line naming CONVO_MIRROR_DB. */
async function openFailure(url: string, opts: Parameters<typeof PostgresMirror.open>[1] = {}): Promise<MirrorDatabaseError> {
  const err = await PostgresMirror.open(url, opts).then(
    () => {
      throw new Error(`opened ${url}`);
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(MirrorDatabaseError);
  const e = err as MirrorDatabaseError;
  const shown = url.replace(`:${PASSWORD}@`, ':***@');
  expect(e.message.startsWith(`CONVO_MIRROR_DB (${shown}): `)).toBe(true);
  expect(e.message).not.toContain('\n');
  expect(e.message).not.toContain(PASSWORD);
  expect(JSON.stringify(e.context)).not.toContain(PASSWORD);
  return e;
}

describe('a database that cannot be used fails with one line naming CONVO_MIRROR_DB, password masked', () => {
  it('nothing listening: refused', async () => {
    const e = await openFailure(urlWith({ host: '127.0.0.1', port: await closedPort(), schema: schema('refused') }));
    expect(e.code).toBe('DB_UNREACHABLE');
    expect(e.retryable).toBe(true);
    expect(e.message).toMatch(/connection refused/);
  });

  it('a server that never answers: the connect timeout', async () => {
    const fake = await startFakePg({ silent: true });
    try {
      const e = await openFailure(urlWith({ host: '127.0.0.1', port: fake.port, schema: schema('silent') }), { connectTimeoutMs: 300 });
      expect(e.code).toBe('DB_UNREACHABLE');
      expect(e.message).toMatch(/no answer within the connect timeout/);
    } finally {
      await fake.close();
    }
  });

  it('a refused password (SQLSTATE 28P01): the password was sent, and is shown masked', async () => {
    const fake = await startFakePg({ refuse: { code: '28P01', text: 'password authentication failed for user "mirror"' } });
    try {
      const e = await openFailure(urlWith({ user: 'mirror', host: '127.0.0.1', port: fake.port, schema: schema('pw') }));
      expect(fake.passwords).toEqual([PASSWORD]);
      expect(e.code).toBe('DB_AUTH');
      expect(e.retryable).toBe(false);
      expect(e.message).toContain('refused the password of user "mirror" (SQLSTATE 28P01)');
      expect(e.message).toContain('mirror:***@127.0.0.1');
    } finally {
      await fake.close();
    }
  });

  it('a missing database (SQLSTATE 3D000)', async () => {
    const database = `cmtest_nodb_${randomBytes(4).toString('hex')}`;
    const e = await openFailure(urlWith({ database, schema: schema('nodb') }));
    expect(e.code).toBe('DB_MISSING');
    expect(e.message).toContain(`database "${database}" does not exist (SQLSTATE 3D000)`);
  });

  it('a role without CREATE on the database (SQLSTATE 42501 on CREATE SCHEMA)', async () => {
    const role = `cmtest_role_${randomBytes(4).toString('hex')}`;
    roles.push(role);
    await pgQuery(`CREATE ROLE "${role}" LOGIN`);
    const s = schema('noright');
    const database = new URL(PG_BASE).pathname.slice(1);
    const e = await openFailure(urlWith({ user: role, schema: s }));
    expect(e.code).toBe('DB_PRIVILEGE');
    expect(e.message).toContain(`user "${role}" may not create the mirror's schema "${s}" in database "${database}" (SQLSTATE 42501)`);
    expect(e.message).toContain(`GRANT CREATE ON DATABASE "${database}" TO "${role}"`);
    expect(await pgQuery(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [s])).toEqual([]);
  });
});

describe('migration 5 (erasures of kind retention)', () => {
  it('migrates a version 4 schema: its erasures are kept and kind retention is admitted', async () => {
    const s = schema('v4');
    const first = await PostgresMirror.open(pgUrl(s));
    await first.close();
    // Back to version 4: the CHECK of migration 2, and an erasure of then.
    await pgQuery(`ALTER TABLE "${s}".erasures DROP CONSTRAINT erasures_kind_check`);
    await pgQuery(`ALTER TABLE "${s}".erasures ADD CONSTRAINT erasures_kind_check CHECK (kind IN ('sender', 'conversation'))`);
    await pgQuery(`UPDATE "${s}".schema_version SET version = 4`);
    await pgQuery(
      `INSERT INTO "${s}".erasures (id, kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations, published_lines, published_through_seq)
       VALUES (1, 'sender', 'acc', 'cus_1', 'DSR-1', '2026-01-01T00:00:00.000Z', 3, 1, 0, 0, 4, 9)`,
    );
    await expect(pgQuery(`INSERT INTO "${s}".erasures VALUES (2, 'retention', 'acc', '2025-01-01', 'r', 't', 0, 0, 0, 0, 0, 0)`)).rejects.toThrow(/erasures_kind_check/);
    const m = await PostgresMirror.open(pgUrl(s));
    try {
      expect(m.migrated).toBe(PG_SCHEMA_VERSION - 4);
      expect((await m.erasures()).map((e) => [e.id, e.kind, e.subject, e.messages])).toEqual([[1, 'sender', 'cus_1', 3]]);
      expect((await m.eraseSubject({ kind: 'retention', accountId: 'acc', subject: '2025-01-01', reason: 'retention 400d' })).erasureId).toBe(2);
      expect((await m.erasures()).map((e) => e.kind)).toEqual(['sender', 'retention']);
    } finally {
      await m.close();
    }
  });
});

describe('the schema an open finds', () => {
  it('a read-only open creates nothing and says there is no mirror', async () => {
    const s = schema('ro');
    const err = await PostgresMirror.open(pgUrl(s), { readonly: true }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreError);
    expect((err as Error).message).toContain(`no mirror in schema "${s}"`);
    expect(await pgQuery(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [s])).toEqual([]);
  });

  it('a writer creates it at the current version; a read-only open then reads it and writes nothing', async () => {
    const s = schema('rw');
    const writer = await PostgresMirror.open(pgUrl(s));
    try {
      expect(writer.migrated).toBe(PG_SCHEMA_VERSION);
      expect(writer.location).toBe(pgUrl(s));
      expect(await writer.mirrorId()).toMatch(/^[0-9a-f]{32}$/);
    } finally {
      await writer.close();
    }
    const reader = await PostgresMirror.open(pgUrl(s), { readonly: true });
    try {
      expect(reader.access).toBe('shared');
      expect(await reader.exportWatermark()).toBe(0);
      await expect(reader.startRun({ scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: 'a' })).rejects.toThrow(/opened read-only/);
    } finally {
      await reader.close();
    }
  });

  it('a schema newer than the code is refused, and left as it is', async () => {
    const s = schema('newer');
    await (await PostgresMirror.open(pgUrl(s))).close();
    await pgQuery(`UPDATE "${s}".schema_version SET version = $1`, [PG_SCHEMA_VERSION + 1]);
    for (const readonly of [false, true]) {
      const err = await PostgresMirror.open(pgUrl(s), { readonly }).catch((e: unknown) => e);
      expect((err as Error).message).toContain(`has schema version ${PG_SCHEMA_VERSION + 1}, newer than this convo-mirror knows (${PG_SCHEMA_VERSION})`);
    }
    expect(await pgQuery(`SELECT version FROM "${s}".schema_version`)).toEqual([{ version: PG_SCHEMA_VERSION + 1 }]);
  });

  it("a schema holding someone else's tables is refused, and left as it is", async () => {
    const s = schema('other');
    await pgQuery(`CREATE SCHEMA "${s}"`);
    await pgQuery(`CREATE TABLE "${s}".orders (id int)`);
    const err = await PostgresMirror.open(pgUrl(s)).catch((e: unknown) => e);
    expect((err as Error).message).toContain(`schema "${s}" of ${pgUrl(s)} holds tables but no convo-mirror mirror`);
    expect((await pgQuery<{ tablename: string }>(`SELECT tablename FROM pg_tables WHERE schemaname = $1`, [s])).map((r) => r.tablename)).toEqual(['orders']);
  });
});
