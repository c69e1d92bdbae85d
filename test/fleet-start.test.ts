/**
 * Issue 25, item 1 (migrations under an advisory lock): two `convo-mirror daemon` processes
 * started at once on a new PostgreSQL schema migrate it once. The test holds the schema's
 * migration lock until both daemons wait for it (so both have read "version 0" and entered the
 * migration), then lets go: one migrates (its log says `migrated the mirror`), the other finds the
 * schema current, and both get ready on the one schema.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import pg from 'pg';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { migrateLockKey } from '../src/store/postgres/locks.js';
import { PG_SCHEMA_VERSION } from '../src/store/postgres/migrations.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, start, waitFor, within, type Started } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { NEVER } from './daemon-fixtures.js';
import { dropSchema, PG_BASE, pgQuery, pgUrl, randomSchema, until } from './pg.js';

const prefixes = prefixSequence('fleet-start');
const schemas: string[] = [];
const dirs: string[] = [];
const fakes: FakeApi[] = [];

beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
});
afterAll(async () => {
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const s of schemas) await dropSchema(s);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** How many backends wait for the advisory lock with the 64-bit key `key` (decimal text). */
async function advisoryWaiters64(key: string): Promise<number> {
  const k = BigInt.asUintN(64, BigInt(key));
  const rows = await pgQuery<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2`,
    [(k >> 32n).toString(), (k & 0xffffffffn).toString()],
  );
  return rows[0]!.n;
}

describe('daemons starting together on a new PostgreSQL schema', () => {
  it('two daemon processes started at once migrate the schema once, and both serve it', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([2]), apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const dir = tempDir('convo-mirror-fleet-start-');
    dirs.push(dir);
    const schema = randomSchema('fleet_start');
    schemas.push(schema);
    const env = cliEnv(fake, dir, {
      CONVO_MIRROR_DB: pgUrl(schema),
      REDIS_URL: redisUrl(),
      CONVO_MIRROR_QUEUE_PREFIX: prefixes.next(),
      CONVO_MIRROR_SCHEDULE: NEVER,
      CONVO_MIRROR_FULL_SCHEDULE: NEVER,
      CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
      LOG_LEVEL: 'info',
    });

    // Hold the migration lock: both daemons read version 0 and queue up behind it.
    const holder = new pg.Client({ connectionString: PG_BASE, application_name: 'convo-mirror-test' });
    await holder.connect();
    let daemons: Started[];
    try {
      await holder.query('SELECT pg_advisory_lock($1::bigint)', [migrateLockKey(schema)]);
      daemons = [start(['daemon'], env, 60_000), start(['daemon'], env, 60_000)];
      await until(async () => (await advisoryWaiters64(migrateLockKey(schema))) === 2, 'both daemons to wait for the migration lock');
      expect(await pgQuery(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [schema]), 'nothing created while the lock is held').toEqual([]);
      await holder.query('SELECT pg_advisory_unlock($1::bigint)', [migrateLockKey(schema)]);
    } finally {
      await holder.end();
    }
    for (const d of daemons) await waitFor(() => d.stderr.includes('"msg":"daemon ready"'), 30_000, `a daemon to be ready; stderr: ${d.stderr.slice(-1000)}`);

    const migratedLines = daemons.map((d) => d.stderr.split('\n').filter((l) => l.includes('"msg":"migrated the mirror"')));
    expect(migratedLines.map((l) => l.length).sort(), 'daemons that logged "migrated the mirror"').toEqual([0, 1]);
    expect(JSON.parse(migratedLines.flat()[0]!)).toMatchObject({ migrations: PG_SCHEMA_VERSION, schema_version: PG_SCHEMA_VERSION });
    expect(await pgQuery(`SELECT version FROM "${schema}".schema_version`)).toEqual([{ version: PG_SCHEMA_VERSION }]);
    expect(await pgQuery(`SELECT count(*)::int AS n FROM "${schema}".mirror_meta`)).toEqual([{ n: 1 }]);

    // Both serve the one mirror: a workspace job enqueued now completes.
    const asked = await within(start(['enqueue', '--wait', '--timeout', '30000'], env, 40_000).done, 45_000, 'enqueue --wait');
    expect(asked.code, asked.stderr).toBe(0);
    for (const d of daemons) d.child.kill('SIGTERM');
    for (const d of daemons) expect((await within(d.done, 15_000, 'a daemon to stop')).code).toBe(0);
    expect(await pgQuery(`SELECT status FROM "${schema}".runs`)).toEqual([{ status: 'succeeded' }]);
  }, 120_000);
});
