/**
 * The SQL the documentation publishes runs and gives the right answers on a real demo archive. Every
 * `sql` block of README.md and docs/*.md is marked on the line before its fence:
 * `<!-- test: duckdb on the demo archive -->` blocks run in DuckDB (@duckdb/node-api) on the
 * export directory of two real `demo` runs, and again on a gzipped one (`.jsonl.gz`), with
 * `data/demo/exports` pointed at them; `<!-- test: sql on the demo mirror -->` blocks run on the
 * demo's SQLite mirror, opened read-only.
 *
 * PostgreSQL (the server of test/pg.ts, which must let its user create roles and databases):
 * `<!-- test: postgres on a mirror -->` blocks run, read-only, on a PostgreSQL mirror of a fake
 * workspace synced in a random schema (then edited, with conversations and messages deleted, and
 * synced in full again, so tombstones exist), with `search_path` set to the schema; their figures
 * are checked against the fake's data. `<!-- test: postgres, as a superuser -->` blocks (roles,
 * databases, grants) run in document order, one statement at a time as psql would, with the names
 * the documentation uses replaced by random ones (the role and database `convo_mirror`, the role
 * `bi`; the schema `convo_mirror` keeps its name inside the random database): first the blocks that
 * grant nothing, then the mirror's own role opens the mirror (default schema) and syncs the fake
 * into it, then the blocks that grant. As the BI role, the mirror queries then run with the role's
 * own settings and give the same figures, and writes are refused. The database and roles are
 * dropped at the end, and the test checks none is left.
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { DuckDBInstance, type DuckDBConnection } from '@duckdb/node-api';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiClient } from '../src/api/client.js';
import { systemClock } from '../src/clock.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { runSync } from '../src/run/index.js';
import { PostgresMirror } from '../src/store/postgres/mirror.js';
import { Database } from '../src/store/sqlite/sqlite.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { ACCOUNT_ID, API_KEY, quietLogger, tempDir } from './helpers.js';
import { DEMO_ACCOUNT_ID } from '../src/cli/demo.js';
import { docBlocks, docFiles, type DocBlock } from './doc-blocks.js';
import { PG_BASE, dropSchema, pgQuery, pgUrl, randomSchema } from './pg.js';

const DUCKDB = 'duckdb on the demo archive';
const SQLITE = 'sql on the demo mirror';
const PG_MIRROR = 'postgres on a mirror';
const PG_SUPERUSER = 'postgres, as a superuser';
const MARKERS = [DUCKDB, SQLITE, PG_MIRROR, PG_SUPERUSER];

const sqlBlocks = docFiles().flatMap(docBlocks).filter((b) => b.lang === 'sql');
const duckBlocks = sqlBlocks.filter((b) => b.marker === DUCKDB);
const sqliteBlocks = sqlBlocks.filter((b) => b.marker === SQLITE);
const pgMirrorBlocks = sqlBlocks.filter((b) => b.marker === PG_MIRROR);
const pgSuperuserBlocks = sqlBlocks.filter((b) => b.marker === PG_SUPERUSER);
const where = (b: DocBlock) => `${b.file}:${b.line}`;

/** The demo's fake: 320 conversations, 36,210 messages (seed 42). */
const DEMO = { conversations: 320, messages: 36210 };

let plain: string;
let gzipped: string;
/** A demo archive in which one customer was erased (`erase --sender`). */
let erased: string;
/** The messages of that customer. */
let erasedCount = 0;
let duck: DuckDBConnection;

beforeAll(async () => {
  assertBuilt();
  plain = tempDir('convo-mirror-recipes-');
  gzipped = tempDir('convo-mirror-recipes-gz-');
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', LOG_LEVEL: 'warn' };
  for (const [dir, extra, runs] of [
    [plain, {}, 2],
    [gzipped, { CONVO_MIRROR_EXPORT_GZIP: 'true' }, 1],
  ] as const) {
    for (let i = 0; i < runs; i++) {
      const r = await run(['demo', '--dir', dir], { ...env, ...extra }, 120_000);
      expect(r.code, r.stderr).toBe(0);
    }
  }
  expect(fs.readdirSync(path.join(gzipped, 'exports', 'messages')).length).toBeGreaterThan(0);
  erased = tempDir('convo-mirror-recipes-erased-');
  expect((await run(['demo', '--dir', erased], env, 120_000)).code).toBe(0);
  const db = new Database(path.join(erased, 'mirror.sqlite'), { readonly: true, fileMustExist: true });
  let subject: { sender: string; n: number };
  try {
    subject = db
      .prepare(`SELECT json_extract(raw, '$.sender.id') AS sender, count(*) AS n FROM messages WHERE json_extract(raw, '$.sender.type') = 'Customer' GROUP BY 1 ORDER BY 2 DESC LIMIT 1`)
      .get() as { sender: string; n: number };
  } finally {
    db.close();
  }
  erasedCount = subject.n;
  const e = await run(
    ['erase', '--db', path.join(erased, 'mirror.sqlite'), '--export-dir', path.join(erased, 'exports'), '--account-id', DEMO_ACCOUNT_ID, '--sender', subject.sender, '--reason', 'DSR-recipes'],
    env,
    120_000,
  );
  expect(e.code, e.stderr).toBe(0);
  duck = await (await DuckDBInstance.create(':memory:')).connect();
}, 240_000);

afterAll(async () => {
  duck?.closeSync();
  await killLeftovers();
  for (const d of [plain, gzipped, erased]) if (d) fs.rmSync(d, { recursive: true, force: true });
});

/** Rows of a DuckDB recipe run on the archive under `demoDir` (its `data/demo/exports` replaced). */
async function duckRows(b: DocBlock, demoDir: string): Promise<Record<string, unknown>[]> {
  expect(b.body, where(b)).toContain("'data/demo/exports/");
  const sql = b.body.replaceAll("'data/demo/exports/", `'${path.join(demoDir, 'exports')}/`);
  const result = await duck.runAndReadAll(sql);
  return result.getRowObjectsJson() as Record<string, unknown>[];
}

describe('the documentation\'s SQL', () => {
  it('every sql block is marked: DuckDB on the demo archive, SQLite on the demo mirror, PostgreSQL on a mirror or as a superuser', () => {
    expect(sqlBlocks.filter((b) => !MARKERS.includes(b.marker ?? '')).map(where), `mark each sql block with one of: ${MARKERS.map((m) => `<!-- test: ${m} -->`).join(', ')}`).toEqual([]);
    expect(duckBlocks.length).toBeGreaterThanOrEqual(3);
    expect(sqliteBlocks.length).toBeGreaterThanOrEqual(1);
    expect(pgMirrorBlocks.length).toBeGreaterThanOrEqual(1);
    expect(pgSuperuserBlocks.length).toBeGreaterThanOrEqual(2);
  });

  it('the DuckDB recipes run on a plain and on a gzipped archive, with the demo\'s figures', async () => {
    for (const b of duckBlocks) {
      for (const dir of [plain, gzipped]) {
        const rows = await duckRows(b, dir);
        const label = `${where(b)} on ${dir === plain ? 'the plain' : 'the gzipped'} archive`;
        expect(rows.length, label).toBeGreaterThan(0);
        if (/FROM read_json\w*\('data\/demo\/exports\/messages\//.test(b.body)) {
          expect(rows.length, label).toBe(DEMO.messages);
          expect(rows.every((r) => r['op'] !== 'delete' && typeof r['content'] === 'string'), label).toBe(true);
        } else if (/conversations\//.test(b.body)) {
          // One row per live conversation, data flattened into columns.
          expect(rows.length, label).toBe(DEMO.conversations);
          expect(new Set(rows.map((r) => `${r['account_id']}/${r['id']}`)).size, label).toBe(DEMO.conversations);
          expect(rows.every((r) => typeof r['status'] === 'string' && r['status'] !== ''), label).toBe(true);
          expect(Object.keys(rows[0]!), label).not.toContain('data');
        } else if (/runs\//.test(b.body)) {
          const runs = rows.reduce((n, r) => n + Number(r['runs']), 0);
          // The plain demo ran twice, but the second run changed nothing: its line waits for the
          // next publication with changes (or the heartbeat), so both archives hold one run line.
          expect(runs, label).toBe(1);
          expect(rows.every((r) => r['status'] === 'succeeded'), label).toBe(true);
        } else {
          throw new Error(`${label}: a recipe this test does not know how to check`);
        }
      }
    }
  });

  it("the view that hides erased messages, on a demo archive with one customer erased: every message but the customer's; the stubs read as rows with no content", async () => {
    const view = duckBlocks.filter((b) => /CREATE OR REPLACE VIEW messages_live/.test(b.body));
    expect(view).toHaveLength(1);
    expect(erasedCount).toBeGreaterThan(0);
    const rows = await duckRows(view[0]!, erased);
    expect(rows.length).toBe(DEMO.messages - erasedCount);
    expect(rows.every((r) => typeof r['content'] === 'string' && r['redacted'] === null)).toBe(true);
    // Without the filter, DuckDB reads the stubs too: one line per erased message, keys and no content.
    const all = await duck.runAndReadAll(
      `SELECT count(*) FILTER (WHERE redacted IS NOT NULL) AS stubs, count(*) FILTER (WHERE redacted IS NOT NULL AND content IS NOT NULL) AS with_content, count(*) AS lines
       FROM read_json('${path.join(erased, 'exports')}/messages/*/*/*.jsonl*', format = 'newline_delimited', hive_partitioning = false, union_by_name = true)`,
    );
    expect(all.getRowObjectsJson()).toEqual([{ stubs: String(erasedCount), with_content: '0', lines: String(DEMO.messages) }]);
  });

  it('the SQLite queries run on the demo mirror, read-only', () => {
    const db = new Database(`file://${path.join(plain, 'mirror.sqlite')}?immutable=1`, { readonly: true, fileMustExist: true });
    try {
      for (const b of sqliteBlocks) {
        const rows = db.prepare(b.body.trim().replace(/;$/, '')).all() as Record<string, unknown>[];
        expect(rows.length, where(b)).toBeGreaterThan(0);
        if (/GROUP BY 1/.test(b.body)) expect(rows.reduce((n, r) => n + Number(r['count(*)']), 0), where(b)).toBe(DEMO.messages);
        if (/FROM runs/.test(b.body)) expect(rows.map((r) => r['status']), where(b)).toEqual(['succeeded', 'succeeded']);
      }
    } finally {
      db.close();
    }
  });
});

// ---------------------------------------------------------------------------------------- PostgreSQL

/** `date` (OID 1082) as its text, `YYYY-MM-DD`: node-postgres would make a local-midnight Date of it. */
const DATE_AS_TEXT: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') => (oid === 1082 ? (v: string) => v : pg.types.getTypeParser(oid, format))) as pg.CustomTypesConfig['getTypeParser'],
};

/** A client of the test server, as `user` (its `password`, if the server asks) in `database` (default: the test database). */
async function pgClient(user?: string, database?: string, password?: string): Promise<pg.Client> {
  const u = new URL(PG_BASE);
  if (user !== undefined) u.username = encodeURIComponent(user);
  if (database !== undefined) u.pathname = `/${database}`;
  const client = new pg.Client({ connectionString: u.href, application_name: 'convo-mirror-test', types: DATE_AS_TEXT, ...(password !== undefined ? { password } : {}) });
  await client.connect();
  return client;
}

/** The statements of a block, one by one, as psql runs them (`-- comment` lines dropped). */
function statementsOf(body: string): string[] {
  return body
    .split('\n')
    .filter((l) => !l.trim().startsWith('--'))
    .join('\n')
    .split(/;\s*(?:\n|$)/)
    .map((x) => x.trim())
    .filter((x) => x !== '');
}

/** The fake workspace the PostgreSQL mirrors are synced from, and what its live data should give. */
const PG_WORKSPACE = { seed: 42, conversations: 40 };

/** Messages and internal notes per (UTC day of the message, conversation status), from the fake's live data. */
function expectedPerDayAndStatus(ws: FakeWorkspace): Map<string, { messages: number; notes: number }> {
  const want = new Map<string, { messages: number; notes: number }>();
  for (const c of ws.list()) {
    for (const m of c.messages) {
      const key = `${new Date(m.created_at).toISOString().slice(0, 10)}|${String(c.data['status'])}`;
      const w = want.get(key) ?? { messages: 0, notes: 0 };
      w.messages++;
      if (m.visibility === 'personal') w.notes++;
      want.set(key, w);
    }
  }
  return want;
}

/** Checks the rows of a `postgres on a mirror` block against the fake's live data; `label` names the block and the role. */
function checkMirrorRows(b: DocBlock, rows: Record<string, unknown>[], ws: FakeWorkspace, label: string): void {
  expect(rows.length, label).toBeGreaterThan(0);
  if (/GROUP BY day, conversation_status/.test(b.body)) {
    const got = new Map(rows.map((r) => [`${String(r['day'])}|${String(r['conversation_status'])}`, { messages: Number(r['messages']), notes: Number(r['internal_notes']) }]));
    const want = expectedPerDayAndStatus(ws);
    expect(got, label).toEqual(want);
    expect([...want.values()].reduce((n, w) => n + w.notes, 0), `${label}: internal notes counted`).toBeGreaterThan(0);
  } else {
    throw new Error(`${label}: a PostgreSQL recipe this test does not know how to check`);
  }
}

/** Runs a `postgres on a mirror` block in a read-only transaction on `client` (with `search_path` set to `schema`, unless undefined). */
async function mirrorRows(client: pg.Client, b: DocBlock, schema?: string): Promise<Record<string, unknown>[]> {
  const statements = statementsOf(b.body);
  expect(statements.length, `${where(b)}: one statement`).toBe(1);
  await client.query('BEGIN TRANSACTION READ ONLY');
  try {
    if (schema !== undefined) await client.query(`SET LOCAL search_path TO "${schema}"`);
    return (await client.query(statements[0]!)).rows as Record<string, unknown>[];
  } finally {
    await client.query('ROLLBACK');
  }
}

describe('the documentation\'s SQL on PostgreSQL', () => {
  const schema = randomSchema('docs');
  const dirs: string[] = [];
  let ws: FakeWorkspace;
  let fake: FakeApi;
  let api: ApiClient;
  let mirror: PostgresMirror | undefined;

  /** Syncs the fake into `m` (a recorded run, published into a temp directory) and checks it succeeded. */
  async function syncInto(m: PostgresMirror, full: boolean): Promise<void> {
    const exportDir = tempDir('convo-mirror-recipes-pg-');
    dirs.push(exportDir);
    const summary = await runSync({ api, mirror: m, logger: quietLogger(), clock: systemClock }, { accountId: ACCOUNT_ID, exportDir, concurrency: 4, full });
    expect(summary.status).toBe('succeeded');
  }

  beforeAll(async () => {
    ws = FakeWorkspace.generate(PG_WORKSPACE);
    fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    api = new ApiClient({ baseUrl: fake.url, apiKey: API_KEY, accountId: ACCOUNT_ID, maxRps: 0, logger: quietLogger(), clock: systemClock });
    mirror = await PostgresMirror.open(pgUrl(schema));
    await syncInto(mirror, false);
    // Then the API changes: two conversations and a few messages deleted, one message edited; a
    // full sync tombstones what went and records the edit.
    const convs = ws.list();
    for (const c of [convs[3]!, convs[17]!]) ws.deleteConversation(c.id);
    for (const c of [convs[5]!, convs[9]!]) ws.deleteMessage(c.id, c.messages[1]!.id);
    ws.editMessage(convs[6]!.id, convs[6]!.messages[0]!.id, 'edited for the recipes');
    await syncInto(mirror, true);
    const tombstones = await pgQuery<{ c: number; m: number }>(
      `SELECT (SELECT count(*) FROM "${schema}".conversations WHERE deleted_at IS NOT NULL)::int AS c,
              (SELECT count(*) FROM "${schema}".messages WHERE deleted_at IS NOT NULL)::int AS m`,
    );
    expect(tombstones[0]!.c, 'tombstoned conversations').toBe(2);
    expect(tombstones[0]!.m, 'tombstoned messages').toBeGreaterThan(2);
  }, 120_000);

  afterAll(async () => {
    await mirror?.close();
    await api?.close();
    await fake?.close();
    await dropSchema(schema);
    for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
  });

  it('the queries run on a PostgreSQL mirror, read-only, with the fake\'s figures', async () => {
    const client = await pgClient();
    try {
      for (const b of pgMirrorBlocks) checkMirrorRows(b, await mirrorRows(client, b, schema), ws, where(b));
    } finally {
      await client.end();
    }
  });

  it('the role, database and grant statements run as a superuser; the BI role then reads the mirror and writes nothing', async () => {
    const admin = await pgClient();
    const r = randomBytes(4).toString('hex');
    const names = { owner: `cmdocs_owner_${r}`, bi: `cmdocs_bi_${r}`, db: `cmdocs_db_${r}` };
    /** A block's text with the documentation's names replaced (see the module comment). */
    const substituted = (b: DocBlock): string => {
      const out = b.body
        .replace(/\bDATABASE convo_mirror\b/g, `DATABASE ${names.db}`)
        .replace(/\b(ROLE|OWNER|AUTHORIZATION) convo_mirror\b/g, `$1 ${names.owner}`)
        .replace(/\bbi\b/g, names.bi);
      const left = out.replace(/\bSCHEMA convo_mirror\b/g, '').replace(/\bsearch_path = convo_mirror\b/g, '');
      if (/\bconvo_mirror\b/.test(left)) throw new Error(`${where(b)}: a use of the name convo_mirror this test does not know how to replace:\n${out}`);
      return out;
    };
    const passwords = new Map<string, string>();
    const opened: pg.Client[] = [];
    let inDb: pg.Client | undefined;
    let owner: PostgresMirror | undefined;
    const runBlock = async (b: DocBlock) => {
      for (const statement of statementsOf(substituted(b))) {
        await (inDb ?? admin).query(statement).catch((err: Error) => {
          throw new Error(`${where(b)}: ${statement}: ${err.message}`);
        });
        const role = /^CREATE ROLE (\w+) .*PASSWORD '([^']*)'/i.exec(statement);
        if (role) passwords.set(role[1]!, role[2]!);
        // Once the database exists, the rest runs connected to it, as a superuser.
        if (/^CREATE DATABASE /i.test(statement)) opened.push((inDb = await pgClient(undefined, names.db)));
      }
    };
    try {
      const superuser = await admin.query<{ rolsuper: boolean }>('SELECT rolsuper FROM pg_roles WHERE rolname = current_user');
      expect(superuser.rows[0]?.rolsuper, `${PG_BASE.replace(/:[^:@/]*@/, ':***@')} must connect as a superuser to run the documentation's role and grant statements`).toBe(true);
      const grants = pgSuperuserBlocks.filter((b) => /\bGRANT\b/.test(b.body));
      for (const b of pgSuperuserBlocks.filter((x) => !grants.includes(x))) await runBlock(b);
      expect(inDb, 'a block creates the database convo_mirror').toBeDefined();

      // The daemons' role opens the mirror (no ?schema=: the default one) and mirrors the fake.
      const ownerUrl = new URL(PG_BASE);
      ownerUrl.username = names.owner;
      const ownerPassword = passwords.get(names.owner);
      if (ownerPassword !== undefined) ownerUrl.password = encodeURIComponent(ownerPassword);
      ownerUrl.pathname = `/${names.db}`;
      owner = await PostgresMirror.open(ownerUrl.href);
      expect(owner.schema).toBe('convo_mirror');
      await syncInto(owner, true);

      for (const b of grants) await runBlock(b);
      // A later version's migration: the daemons' role creates a table after the grants.
      const asOwner = await pgClient(names.owner, names.db, ownerPassword);
      opened.push(asOwner);
      await asOwner.query('CREATE TABLE convo_mirror.later_migration (x integer); INSERT INTO convo_mirror.later_migration VALUES (1)');

      // As the BI role: its own settings, the mirror's figures, and no write of any kind.
      const bi = await pgClient(names.bi, names.db, passwords.get(names.bi));
      opened.push(bi);
      expect((await bi.query('SHOW search_path')).rows[0].search_path).toBe('convo_mirror');
      expect((await bi.query('SHOW default_transaction_read_only')).rows[0].default_transaction_read_only).toBe('on');
      for (const b of pgMirrorBlocks) checkMirrorRows(b, await mirrorRows(bi, b), ws, `${where(b)} as the BI role`);
      expect((await bi.query('SELECT count(*)::int AS n FROM later_migration')).rows[0].n).toBe(1);
      const refused = async (sql: string): Promise<string | undefined> => bi.query(sql).then(() => undefined, (err: { code?: string }) => err.code);
      expect(await refused('DELETE FROM messages'), 'a read-only session').toBe('25006');
      await bi.query('SET default_transaction_read_only = off');
      expect(await refused('DELETE FROM messages'), 'no DELETE right').toBe('42501');
      expect(await refused(`UPDATE conversations SET deleted_at = 'x'`), 'no UPDATE right').toBe('42501');
      expect(await refused('CREATE TABLE convo_mirror.mine (x integer)'), 'no CREATE in the schema').toBe('42501');
      // What the page says of FOR ROLE: default privileges without it would not cover the daemons' later tables.
      await inDb!.query(`ALTER DEFAULT PRIVILEGES FOR ROLE ${names.owner} IN SCHEMA convo_mirror REVOKE SELECT ON TABLES FROM ${names.bi}`);
      await inDb!.query(`ALTER DEFAULT PRIVILEGES IN SCHEMA convo_mirror GRANT SELECT ON TABLES TO ${names.bi}`);
      await asOwner.query('CREATE TABLE convo_mirror.later_without_for_role (x integer)');
      expect(await refused('SELECT * FROM later_without_for_role'), 'default privileges without FOR ROLE').toBe('42501');
    } finally {
      await owner?.close();
      for (const c of opened) await c.end().catch(() => undefined);
      await admin.query(`DROP DATABASE IF EXISTS ${names.db} WITH (FORCE)`);
      await admin.query(`DROP ROLE IF EXISTS ${names.bi}`);
      await admin.query(`DROP ROLE IF EXISTS ${names.owner}`);
      const left = await admin.query<{ roles: number; dbs: number }>(
        `SELECT (SELECT count(*) FROM pg_roles WHERE rolname LIKE $1)::int AS roles, (SELECT count(*) FROM pg_database WHERE datname LIKE $1)::int AS dbs`,
        [`cmdocs\\_%\\_${r}`],
      );
      await admin.end();
      expect(left.rows[0], 'roles and databases of this test left behind').toEqual({ roles: 0, dbs: 0 });
    }
  }, 120_000);
});
