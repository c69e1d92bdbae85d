/**
 * The store's engines as test fixtures, for the conformance suite: a behaviour test written once
 * runs against each engine with `describe.each(engines)`, and calls `engine.cleanup()` in its
 * `afterEach`.
 *
 * - SQLite: a new file in a new temp directory per target, removed at cleanup.
 * - PostgreSQL (the server of test/pg.ts): schemas `cmtest_<file>_<random>_<n>`, made lazily (the
 *   first open of a target migrates it) and reused: at cleanup a schema used by the test is emptied
 *   back to the state a fresh migration leaves (every table emptied, identities restarted, the
 *   rows the migration seeds put back, a new mirror id), which costs milliseconds where a new
 *   schema costs a migration. So a test file holds as many schemas as its busiest test uses at
 *   once (usually one); every one is dropped in `afterAll`.
 */
import fs from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { afterAll, expect } from 'vitest';
import type { Mirror, MirrorOptions } from '../src/store/mirror.js';
import { openMirror } from '../src/store/open-mirror.js';
import { tempDir } from './helpers.js';
import { dropSchema, PG_BASE, pgUrl, randomSchema } from './pg.js';

/** One engine, as a test uses it. */
export interface EngineFixture {
  /** The engine's name, as `Mirror.engine` says it (and as `describe.each` prints it). */
  name: 'sqlite' | 'postgres';
  /**
   * Opens a mirror (a writer unless `opts.readonly`) at `target`, by default a fresh one
   * ({@link target}); {@link cleanup} closes it if the test did not. Options that concern one
   * engine only (`lock`, `modes`, the SQLite hooks) are ignored by the other, as `openMirror` does.
   */
  open(opts?: MirrorOptions, target?: string): Promise<Mirror>;
  /**
   * A fresh, empty target (`CONVO_MIRROR_DB`): a new SQLite file, or a PostgreSQL URL with an
   * empty schema, which may be one an earlier test used (emptied) that holds an empty mirror.
   */
  target(): string;
  /** A target where nothing exists yet (no file; no schema), for what opening a missing mirror does. */
  absentTarget(): string;
  /** Whether anything exists at `target` (the SQLite file; the PostgreSQL schema). */
  exists(target: string): Promise<boolean>;
  /**
   * What a message about `target` names: the SQLite file's path; the PostgreSQL schema's name
   * (messages show the URL masked, and the schema in it).
   */
  named(target: string): string;
  /**
   * Closes every mirror {@link open} opened and gives back every target {@link target} made (the
   * files removed; the schemas emptied for the next test, or dropped). Call in `afterEach`.
   */
  cleanup(): Promise<void>;
}

/** SQLite: a new file in a new temp directory per target. */
function sqliteFixture(): EngineFixture {
  const dirs: string[] = [];
  const opened: Mirror[] = [];
  const target = (): string => {
    const d = tempDir('convo-mirror-engine-');
    dirs.push(d);
    return path.join(d, 'mirror.sqlite');
  };
  return {
    name: 'sqlite',
    target,
    absentTarget: target,
    async open(opts = {}, at = target()) {
      const m = await openMirror(at, opts);
      opened.push(m);
      if (m.engine !== 'sqlite') throw new Error(`the sqlite fixture opened a ${m.engine} mirror at ${at}`);
      return m;
    },
    exists: (at) => Promise.resolve(fs.existsSync(at)),
    named: (at) => at,
    async cleanup() {
      for (const m of opened.splice(0)) await m.close(); // closing twice is a no-op
      for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
    },
  };
}

/** The schema of a PostgreSQL target URL. */
function schemaOf(target: string): string {
  const s = new URL(target).searchParams.get('schema');
  if (!s) throw new Error(`no schema in ${target}`);
  return s;
}

/** Runs `f` on one connection of its own to the test server. */
async function withClient<T>(f: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: PG_BASE, application_name: 'convo-mirror-test' });
  await c.connect();
  try {
    return await f(c);
  } finally {
    await c.end();
  }
}

/** The rows a fresh migration leaves, by table (only tables that have some). */
type Seed = Map<string, unknown[]>;

/** Tables of `schema` but `schema_version`, referencing tables before those they reference. */
async function tablesOf(c: pg.Client, schema: string): Promise<string[]> {
  const tables = (await c.query<{ t: string }>(`SELECT tablename AS t FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_version' ORDER BY 1`, [schema])).rows.map((r) => r.t);
  const refs = (
    await c.query<{ child: string; parent: string }>(
      `SELECT ch.relname AS child, pa.relname AS parent FROM pg_constraint k
       JOIN pg_class ch ON ch.oid = k.conrelid JOIN pg_class pa ON pa.oid = k.confrelid
       JOIN pg_namespace n ON n.oid = ch.relnamespace
       WHERE k.contype = 'f' AND n.nspname = $1 AND ch.relname <> pa.relname`,
      [schema],
    )
  ).rows;
  const out: string[] = [];
  const visit = (t: string, path: string[]): void => {
    if (out.includes(t)) return;
    if (path.includes(t)) throw new Error(`foreign keys in a cycle in ${schema}: ${[...path, t].join(' -> ')}`);
    for (const r of refs) if (r.parent === t) visit(r.child, [...path, t]);
    out.push(t);
  };
  for (const t of tables) visit(t, []);
  return out;
}

/** Reads the rows of every table of a freshly migrated `schema` that has some. */
async function readSeed(c: pg.Client, schema: string): Promise<Seed> {
  const seed: Seed = new Map();
  for (const t of await tablesOf(c, schema)) {
    const rows = (await c.query(`SELECT * FROM "${schema}"."${t}"`)).rows;
    if (rows.length > 0) seed.set(t, rows);
  }
  return seed;
}

/**
 * Empties `schema` back to `seed` in one transaction: every table emptied (referencing tables
 * first), every sequence (the identities) restarted, the seeded rows put back, and a new mirror id
 * (a fresh migration draws one).
 */
async function resetSchema(c: pg.Client, schema: string, seed: Seed): Promise<void> {
  const q = (t: string) => `"${schema}"."${t}"`;
  const tables = await tablesOf(c, schema);
  const sequences = (await c.query<{ s: string }>(`SELECT sequencename AS s FROM pg_sequences WHERE schemaname = $1`, [schema])).rows.map((r) => r.s);
  await c.query('BEGIN');
  try {
    for (const t of tables) await c.query(`DELETE FROM ${q(t)}`);
    for (const s of sequences) await c.query(`ALTER SEQUENCE ${q(s)} RESTART`);
    for (const t of [...tables].reverse()) {
      const rows = seed.get(t);
      if (rows) await c.query(`INSERT INTO ${q(t)} SELECT * FROM json_populate_recordset(NULL::${q(t)}, $1::json)`, [JSON.stringify(rows)]);
    }
    await c.query(`UPDATE ${q('mirror_meta')} SET value = md5(gen_random_uuid()::text || gen_random_uuid()::text) WHERE key = 'mirror_id'`);
    await c.query('COMMIT');
  } catch (err) {
    await c.query('ROLLBACK');
    throw err;
  }
}

/** Schemas of this test file (module state: vitest loads this module once per test file). */
const pgSchemas: string[] = [];

/**
 * PostgreSQL: schemas `cmtest_<file>_<random>_<n>` of the test server, reused across the file's
 * tests (see the module comment).
 */
function postgresFixture(): EngineFixture {
  let base: string | undefined;
  /** Schemas no test holds, emptied (or never created). */
  const free: string[] = [];
  /** Schemas handed out to the running test. */
  const used: string[] = [];
  /** Schemas whose first open (the migration) went through {@link open}: their seed was read or is known. */
  const pristine = new Set<string>();
  let seed: Seed | undefined;
  const opened: Mirror[] = [];

  /** A schema name never handed out before in this file (registered for the drop in `afterAll`). */
  const newSchema = (): string => {
    if (base === undefined) {
      const file = path.basename(expect.getState().testPath ?? 'pg', '.test.ts');
      base = randomSchema(file.slice(0, 12));
    }
    const schema = `${base}_${pgSchemas.length}`;
    pgSchemas.push(schema);
    return schema;
  };
  const target = (): string => {
    const schema = free.pop() ?? newSchema();
    used.push(schema);
    return pgUrl(schema);
  };
  const absentTarget = (): string => {
    const schema = newSchema();
    used.push(schema);
    return pgUrl(schema);
  };

  const exists = async (at: string): Promise<boolean> =>
    (await withClient((c) => c.query(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [schemaOf(at)]))).rowCount === 1;

  return {
    name: 'postgres',
    target,
    absentTarget,
    exists,
    async open(opts = {}, at = target()) {
      const schema = schemaOf(at);
      const fresh = !(await exists(at));
      const m = await openMirror(at, opts);
      opened.push(m);
      if (m.engine !== 'postgres') throw new Error(`the postgres fixture opened a ${m.engine} mirror at ${at}`);
      if (fresh && !opts.readonly) {
        pristine.add(schema);
        // The rows a migration seeds, read once per file before any test wrote (the same DDL seeds every schema alike).
        seed ??= await withClient((c) => readSeed(c, schema));
      }
      return m;
    },
    named: schemaOf,
    async cleanup() {
      for (const m of opened.splice(0)) await m.close(); // closing twice is a no-op
      const schemas = used.splice(0);
      if (schemas.length === 0) return;
      await withClient(async (c) => {
        for (const s of schemas) {
          const present = (await c.query(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [s])).rowCount === 1;
          if (!present) {
            free.push(s);
          } else if (seed !== undefined && pristine.has(s)) {
            await resetSchema(c, s, seed);
            free.push(s);
          } else {
            // Migrated by an open of its own (not through `open`): its state is unknown; never reused.
            await c.query(`DROP SCHEMA "${s}" CASCADE`);
          }
        }
      });
    },
  };
}

afterAll(async () => {
  for (const s of pgSchemas.splice(0)) await dropSchema(s);
});

/** Every engine the conformance suite runs against. */
export const engines: EngineFixture[] = [sqliteFixture(), postgresFixture()];
