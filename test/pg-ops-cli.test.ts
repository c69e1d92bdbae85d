/**
 * Operating a PostgreSQL mirror from the CLI (issue 25, items 3 and 6, and the Tests line "a wrong
 * DSN, a refused password, a missing database and a role without CREATE each fail fast with one
 * line naming CONVO_MIRROR_DB (password masked)"): the built CLI in child processes against the
 * fake API in this process and the real PostgreSQL. `sync`, `daemon` and `check` against a target
 * that cannot be used each exit 2 with one line naming CONVO_MIRROR_DB, its password masked and
 * nowhere in what they print, creating nothing (no schema, no database, no file), and a malformed
 * URL fails before any request. `config`, `status` and `check` show a usable target masked, and
 * `check` reports the server, the schema's version and the role's rights, naming the GRANT that
 * fixes a missing one.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import { Writable } from 'node:stream';
import { createLogger } from '../src/logger.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { PG_SCHEMA_VERSION } from '../src/store/postgres/migrations.js';
import { API_KEY, ACCOUNT_ID, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, type Ran } from './children.js';
import { closedPort, dropSchema, PG_BASE, pgQuery, pgUrl, randomSchema, startFakePg, type FakePg } from './pg.js';
import { cleanupPrefix, randomPrefix, redisUrl } from './redis.js';

const PASSWORD = `pw-${randomBytes(6).toString('hex')}`;
const prefix = randomPrefix('pg-ops-cli');
const schemas: string[] = [];
const roles: string[] = [];
const dirs: string[] = [];
let fake: FakeApi;
let refusing: FakePg;

beforeAll(async () => {
  assertBuilt();
  fake = await startFakeApi({ workspace: FakeWorkspace.generate({ seed: 25, conversations: 6 }), apiKey: API_KEY, accountId: ACCOUNT_ID });
  refusing = await startFakePg({ refuse: { code: '28P01', text: 'password authentication failed for user "mirror"' } });
});
afterEach(killLeftovers);
afterAll(async () => {
  await fake?.close();
  await refusing?.close();
  for (const s of schemas) await dropSchema(s);
  for (const r of roles) {
    await pgQuery(`DROP OWNED BY "${r}"`).catch(() => undefined);
    await pgQuery(`DROP ROLE IF EXISTS "${r}"`);
  }
  await cleanupPrefix(redisUrl(), prefix);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** A schema for one test, dropped at the end. */
function schema(label: string): string {
  const s = randomSchema(label);
  schemas.push(s);
  return s;
}

/** A LOGIN role for one test (dropped at the end, with its grants). */
async function role(): Promise<string> {
  const r = `cmtest_role_${randomBytes(4).toString('hex')}`;
  roles.push(r);
  await pgQuery(`CREATE ROLE "${r}" LOGIN`);
  return r;
}

/** The test server's URL with {@link PASSWORD} (trust authentication ignores it), and the parts given replaced. */
function urlWith(parts: { schema: string; user?: string; host?: string; port?: number; database?: string }): string {
  const u = new URL(PG_BASE);
  u.username = parts.user ?? (u.username || 'postgres');
  u.password = PASSWORD;
  if (parts.host) u.hostname = parts.host;
  if (parts.port) u.port = String(parts.port);
  if (parts.database) u.pathname = `/${parts.database}`;
  return pgUrl(parts.schema, u.href);
}

/** `url` as every output must show it. */
const masked = (url: string): string => url.replace(`:${PASSWORD}@`, ':***@');

/** A fresh empty directory and the CLI's environment with CONVO_MIRROR_DB = `db`, exports in that directory. */
function envFor(db: string, extra: Record<string, string> = {}): { env: NodeJS.ProcessEnv; dir: string } {
  const dir = tempDir('convo-mirror-pg-ops-');
  dirs.push(dir);
  const env = cliEnv(fake, dir, {
    CONVO_MIRROR_DB: db,
    REDIS_URL: redisUrl(),
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    CONVO_MIRROR_SCHEDULE: '0 0 1 1 *',
    CONVO_MIRROR_FULL_SCHEDULE: '0 0 1 1 *',
    ...extra,
  });
  return { env, dir };
}

/** What a user reads: never the password. */
function expectNoPassword(...outs: Ran[]): void {
  for (const r of outs) expect(r.stdout + r.stderr).not.toContain(PASSWORD);
}

/** Whether a schema of that name exists. */
async function schemaExists(s: string): Promise<boolean> {
  return (await pgQuery(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [s])).length > 0;
}

/**
 * `sync`, `daemon` and `check` against `db`: each exits 2 with one line naming CONVO_MIRROR_DB and
 * the masked URL (the line `check` prints for the mirror), the password nowhere; returns the three
 * lines' reasons (after `CONVO_MIRROR_DB (<masked>): `).
 */
async function expectOneLineEach(db: string): Promise<{ reasons: string[]; dirs: string[] }> {
  const head = `CONVO_MIRROR_DB (${masked(db)}): `;
  const reasons: string[] = [];
  const used: string[] = [];
  for (const command of [['sync'], ['daemon'], ['check', '--no-queue']]) {
    const { env, dir } = envFor(db);
    used.push(dir);
    const r = await run(command, env);
    expectNoPassword(r);
    expect(r.code, `${command[0]}: ${r.stdout}${r.stderr}`).toBe(2);
    if (command[0] === 'check') {
      const lines = r.stdout.trim().split('\n');
      const named = lines.filter((l) => l.includes('CONVO_MIRROR_DB'));
      expect(named).toHaveLength(1);
      expect(named[0]!.startsWith(`✗ mirror: ${head}`), named[0]).toBe(true);
      // The API was checked; the exports were; nothing else about the database.
      expect(lines.map((l) => l.split(':')[0])).toEqual(['✓ api', '✓ messages', '✗ mirror', '✓ exports']);
      reasons.push(named[0]!.slice(`✗ mirror: ${head}`.length));
    } else {
      expect(r.stdout).toBe('');
      const lines = r.stderr.trim().split('\n');
      expect(lines, r.stderr).toHaveLength(1);
      expect(lines[0]!.startsWith(`convo-mirror: mirror error: ${head}`), lines[0]).toBe(true);
      reasons.push(lines[0]!.slice(`convo-mirror: mirror error: ${head}`.length));
    }
  }
  return { reasons, dirs: used };
}

describe('a PostgreSQL target that cannot be used: sync, daemon and check each exit 2 with one line naming CONVO_MIRROR_DB, password masked, creating nothing', () => {
  it('nothing listening (refused)', async () => {
    const s = schema('refused');
    const { reasons, dirs: used } = await expectOneLineEach(urlWith({ schema: s, host: '127.0.0.1', port: await closedPort() }));
    for (const r of reasons) expect(r).toMatch(/^cannot connect to 127\.0\.0\.1:\d+: connection refused/);
    for (const d of used) expect(fs.readdirSync(d)).toEqual([]);
  });

  it('a refused password (the password was sent, and is shown masked)', async () => {
    const s = schema('pw');
    const before = refusing.passwords.length;
    const { reasons, dirs: used } = await expectOneLineEach(urlWith({ schema: s, user: 'mirror', host: '127.0.0.1', port: refusing.port }));
    expect(refusing.passwords.slice(before)).toEqual([PASSWORD, PASSWORD, PASSWORD]);
    for (const r of reasons) expect(r).toBe('the server refused the password of user "mirror" (SQLSTATE 28P01): check the user and password');
    for (const d of used) expect(fs.readdirSync(d)).toEqual([]);
  });

  it('a missing database', async () => {
    const s = schema('nodb');
    const database = `cmtest_nodb_${randomBytes(4).toString('hex')}`;
    const { reasons, dirs: used } = await expectOneLineEach(urlWith({ schema: s, database }));
    for (const r of reasons) expect(r).toBe(`database "${database}" does not exist (SQLSTATE 3D000): create it or fix the URL's database name`);
    expect(await pgQuery(`SELECT 1 FROM pg_database WHERE datname = $1`, [database])).toEqual([]);
    for (const d of used) expect(fs.readdirSync(d)).toEqual([]);
  });

  it('a role without CREATE on the database: the schema is not created; check says so before sync tries', async () => {
    const r = await role();
    const s = schema('nocreate');
    const database = new URL(PG_BASE).pathname.slice(1);
    const db = urlWith({ schema: s, user: r });
    const head = `CONVO_MIRROR_DB (${masked(db)}): `;
    const grant = `GRANT CREATE ON DATABASE "${database}" TO "${r}", or create the schema with that user as its owner`;
    for (const command of ['sync', 'daemon']) {
      const { env, dir } = envFor(db);
      const ran = await run([command], env);
      expectNoPassword(ran);
      expect(ran.code).toBe(2);
      expect(ran.stderr.trim().split('\n')).toEqual([
        `convo-mirror: mirror error: ${head}user "${r}" may not create the mirror's schema "${s}" in database "${database}" (SQLSTATE 42501): ${grant}`,
      ]);
      expect(fs.readdirSync(dir)).toEqual([]);
    }
    // check connects fine: the lack of the right is its rights line.
    const { env } = envFor(db);
    const checked = await run(['check', '--no-queue'], env);
    expectNoPassword(checked);
    expect(checked.code).toBe(2);
    const lines = checked.stdout.trim().split('\n');
    expect(lines.map((l) => l.split(':')[0])).toEqual(['✓ api', '✓ messages', '✓ mirror', '✓ schema', '✗ rights', '✓ exports']);
    expect(lines[3]).toBe(`✓ schema: "${s}" does not exist yet: the first sync or daemon creates it at version ${PG_SCHEMA_VERSION}`);
    expect(lines[4]).toBe(`✗ rights: user "${r}" may not create the mirror's schema "${s}" in database "${database}": ${grant}`);
    expect(await schemaExists(s)).toBe(false);
  });

  it('a malformed URL (no database): sync, daemon, check and config name CONVO_MIRROR_DB, masked, before any request', async () => {
    const db = `postgres://mirror:${PASSWORD}@127.0.0.1:5432?schema=${schema('nodbname')}`;
    const line = 'convo-mirror: configuration error: CONVO_MIRROR_DB: names no database: expected postgres://user@host:port/DATABASE (got "postgres://***@127.0.0.1:5432?***")';
    const before = fake.requests.length;
    for (const command of [['sync'], ['daemon'], ['check', '--no-queue'], ['config']]) {
      const { env, dir } = envFor(db);
      const r = await run(command, env);
      expectNoPassword(r);
      expect(r.code, command[0]).toBe(2);
      const errors = r.stderr.trim().split('\n');
      if (command[0] === 'config') {
        expect(errors).toEqual(['convo-mirror: configuration error: CONVO_MIRROR_DB: names no database: expected postgres://user@host:port/DATABASE']);
        expect(r.stdout).toMatch(/^CONVO_MIRROR_DB +environment +postgres:\/\/\*\*\*@127\.0\.0\.1:5432\?\*\*\* +\(invalid: names no database/m);
      } else {
        expect(errors).toEqual([line]);
      }
      expect(fs.readdirSync(dir)).toEqual([]);
    }
    expect(fake.requests.length - before, 'requests sent to the API').toBe(0);
  });
});

describe('a usable PostgreSQL target: config, status and check show it masked; check reports the server, the schema and the rights', () => {
  it('before the first sync, after it, a newer schema; and a role whose rights fall short, each with its GRANT', async () => {
    const s = schema('usable');
    const db = urlWith({ schema: s });
    const shown = masked(db);
    const user = (await pgQuery<{ u: string }>('SELECT current_user AS u'))[0]!.u;
    const database = new URL(PG_BASE).pathname.slice(1);
    const { env } = envFor(db);

    // Before the first sync: the schema would be created; check creates nothing.
    const first = await run(['check', '--no-queue'], env);
    expect(first.code, first.stdout).toBe(0);
    const firstLines = first.stdout.trim().split('\n');
    expect(firstLines.map((l) => l.split(':')[0])).toEqual(['✓ api', '✓ messages', '✓ mirror', '✓ schema', '✓ rights', '✓ exports']);
    expect(firstLines[2]).toMatch(new RegExp(`^✓ mirror: PostgreSQL \\d+\\.\\d+.* at ${escape(shown)} answers; user "${user}", database "${database}" \\(CONVO_MIRROR_DB\\)$`));
    expect(firstLines[3]).toBe(`✓ schema: "${s}" does not exist yet: the first sync or daemon creates it at version ${PG_SCHEMA_VERSION}`);
    expect(firstLines[4]).toBe(`✓ rights: user "${user}" may create schema "${s}" (CREATE on database "${database}")`);
    expect(await schemaExists(s)).toBe(false);
    const json = await run(['check', '--no-queue', '--json'], env);
    expect((JSON.parse(json.stdout) as { checks: { name: string }[] }).checks.map((c) => c.name)).toEqual(['api', 'messages', 'mirror', 'schema', 'rights', 'exports']);

    const synced = await run(['sync'], env);
    expect(synced.code, synced.stderr).toBe(0);

    const second = await run(['check', '--no-queue'], env);
    expect(second.code, second.stdout).toBe(0);
    const secondLines = second.stdout.trim().split('\n');
    expect(secondLines[3]).toBe(`✓ schema: "${s}" is at version ${PG_SCHEMA_VERSION}, current`);
    expect(secondLines[4]).toMatch(new RegExp(`^✓ rights: user "${user}" has USAGE and CREATE on schema "${s}", owned by "${user}", and SELECT, INSERT, UPDATE, DELETE on its \\d+ tables$`));

    // status and config show the target masked.
    const status = await run(['status'], env);
    expect(status.code, status.stderr).toBe(0);
    expect(status.stdout.split('\n')[0]).toBe(`mirror ${shown}`);
    const statusJson = await run(['status', '--json'], env);
    expect((JSON.parse(statusJson.stdout) as { db: string }).db).toBe(shown);
    const config = await run(['config'], env);
    expect(config.code).toBe(0);
    expect(config.stdout).toMatch(new RegExp(`^CONVO_MIRROR_DB +environment +${escape(shown)}$`, 'm'));
    const configJson = await run(['config', '--json'], env);
    expect((JSON.parse(configJson.stdout) as Record<string, { value: string }>).CONVO_MIRROR_DB!.value).toBe(shown);
    expectNoPassword(first, json, synced, second, status, statusJson, config, configJson);

    // A schema newer than the code.
    await pgQuery(`UPDATE "${s}".schema_version SET version = $1`, [PG_SCHEMA_VERSION + 1]);
    const newer = await run(['check', '--no-queue'], env);
    expect(newer.code).toBe(2);
    expect(newer.stdout).toContain(`✗ schema: "${s}" is at version ${PG_SCHEMA_VERSION + 1}, newer than this convo-mirror knows (${PG_SCHEMA_VERSION}): upgrade convo-mirror\n`);
    await pgQuery(`UPDATE "${s}".schema_version SET version = $1`, [PG_SCHEMA_VERSION]);

    // Another role: no USAGE on the schema, then USAGE and SELECT only, then every right a writer needs.
    const r = await role();
    const { env: roleEnv } = envFor(urlWith({ schema: s, user: r }));
    const rightsLine = async (): Promise<{ code: number | null; line: string }> => {
      const ran = await run(['check', '--no-queue'], roleEnv);
      expectNoPassword(ran);
      return { code: ran.code, line: ran.stdout.split('\n').find((l) => l.includes(' rights: '))! };
    };
    expect(await rightsLine()).toEqual({ code: 2, line: `✗ rights: user "${r}" lacks USAGE on schema "${s}", owned by "${user}": GRANT USAGE ON SCHEMA "${s}" TO "${r}"` });
    await pgQuery(`GRANT USAGE ON SCHEMA "${s}" TO "${r}"`);
    await pgQuery(`GRANT SELECT ON ALL TABLES IN SCHEMA "${s}" TO "${r}"`);
    const partial = await rightsLine();
    expect(partial.code).toBe(2);
    expect(partial.line).toMatch(
      new RegExp(`^✗ rights: user "${r}" lacks INSERT, UPDATE, DELETE on \\d+ tables of schema "${s}" \\(change_log, change_payloads, change_seq, checkpoints, conversations and \\d+ more\\): GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "${s}" TO "${r}"$`),
    );
    await pgQuery(`GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "${s}" TO "${r}"`);
    expect(await rightsLine()).toMatchObject({ code: 0, line: expect.stringMatching(new RegExp(`^✓ rights: user "${r}" has USAGE on schema "${s}", owned by "${user}", and SELECT, INSERT, UPDATE, DELETE on its \\d+ tables$`)) as unknown });
  });
});

describe('logs', () => {
  it('a logged config.db shows a PostgreSQL target masked (a SQLite path as it is); the API key stays redacted', () => {
    const lines: string[] = [];
    const logger = createLogger({ level: 'info', destination: new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }) });
    const db = urlWith({ schema: 'cmtest_logged' });
    logger.info({ config: { db, apiKey: API_KEY } }, 'configured');
    logger.info({ config: { db: '/var/lib/mirror.sqlite' } }, 'configured');
    const [pg, sqlite] = lines.map((l) => JSON.parse(l) as { config: { db: string; apiKey?: string } });
    expect(pg!.config).toEqual({ db: masked(db), apiKey: '[redacted]' });
    expect(sqlite!.config.db).toBe('/var/lib/mirror.sqlite');
    expect(lines.join('')).not.toContain(PASSWORD);
  });
});

/** `s` as a literal in a RegExp. */
function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
