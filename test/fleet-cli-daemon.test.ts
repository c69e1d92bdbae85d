/**
 * Issue 25, item 2 (several writers): a CLI `sync` and a daemon on one workspace of one PostgreSQL
 * mirror at once end exact, with no duplicate change. A single-writer reference run (the CLI alone
 * on a schema of its own) gives the change log to expect. Then, on a new schema, the daemon's
 * workspace job mirrors the first 100 conversations while the fake holds the rest; a CLI `sync`
 * starts, skips what the daemon did and waits for the advisory lock of a conversation the daemon
 * crawls (seen in pg_locks); then the fake answers and both crawl the same conversations at once. Both end well; the mirror equals the fake; the change log has
 * the reference's rows per stream and op, no message or conversation changed twice; every seq is
 * exported once and `verify --deep` passes.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { conversationLockKey } from '../src/store/postgres/locks.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, start, startDaemon, within } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';
import { NEVER, messagesPath } from './daemon-fixtures.js';
import { advisoryWaiterPair, dropSchema, pgQuery, pgUrl, randomSchema, until } from './pg.js';
import { expectPgMirrorEqualsFake, exportedSeqs } from './fleet-helpers.js';

const prefixes = prefixSequence('fleet-cli');
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

/** The change log's data rows (messages and conversations) per stream and op, e.g. `messages/insert: 600`. */
async function changeCounts(schema: string): Promise<Record<string, number>> {
  const rows = await pgQuery<{ k: string; n: number }>(
    `SELECT stream || '/' || op AS k, count(*)::int AS n FROM "${schema}".change_log WHERE stream <> 'runs' GROUP BY 1 ORDER BY 1`,
  );
  return Object.fromEntries(rows.map((r) => [r.k, r.n]));
}

/** Change-log rows of one record version written twice: the same stream, record and op more than once. */
async function duplicateChanges(schema: string): Promise<string[]> {
  const rows = await pgQuery<{ k: string }>(
    `SELECT stream || '/' || op || '/' || conversation_id || '/' || record_id AS k FROM "${schema}".change_log
      WHERE stream <> 'runs' GROUP BY stream, op, conversation_id, record_id HAVING count(*) > 1`,
  );
  return rows.map((r) => r.k);
}

describe('a CLI sync and a daemon on one PostgreSQL mirror at once', () => {
  it('end exact, with the single writer change log: no change twice, every seq exported once, verify --deep passes', async () => {
    const ws = FakeWorkspace.fromCounts(Array(300).fill(3));
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const envFor = (label: string) => {
      const dir = tempDir(`convo-mirror-fleet-cli-${label}-`);
      dirs.push(dir);
      const schema = randomSchema(`fleet_cli_${label}`);
      schemas.push(schema);
      const env = cliEnv(fake, dir, {
        CONVO_MIRROR_DB: pgUrl(schema),
        REDIS_URL: redisUrl(),
        CONVO_MIRROR_QUEUE_PREFIX: prefixes.next(),
        CONVO_MIRROR_SCHEDULE: NEVER,
        CONVO_MIRROR_FULL_SCHEDULE: NEVER,
        CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS: '2000',
        CONVO_MIRROR_CONCURRENCY: '4',
        LOG_LEVEL: 'info',
      });
      return { schema, env, exportDir: env.CONVO_MIRROR_EXPORT_DIR! };
    };

    // The reference: the CLI alone.
    const ref = envFor('ref');
    const alone = await run(['sync'], ref.env, 60_000);
    expect(alone.code, alone.stderr.slice(-2000)).toBe(0);
    const expected = await changeCounts(ref.schema);
    expect(expected).toEqual({ 'conversations/insert': 300, 'messages/insert': 900 });

    // Both writers at once. The daemon goes first; the fake holds every conversation after the
    // first 100 until the CLI waits for the lock of one the daemon crawls (the 101st): from then on
    // both crawl the same conversations.
    const both = envFor('both');
    const ids = ws.list().map((c) => c.id);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const heldPaths = new RegExp(`^/v1/conversations/(${ids.slice(100).join('|')})/messages$`);
    fake.injectFault({ kind: 'hold', until: held, match: { path: heldPaths }, times: Infinity });
    const daemon = await startDaemon(both.env, [], 120_000);
    const job = start(['enqueue', '--wait', '--timeout', '90000'], both.env, 100_000);
    const synced = async () => (await pgQuery<{ n: number }>(`SELECT count(*)::int AS n FROM "${both.schema}".conversations WHERE last_synced_at IS NOT NULL`))[0]!.n;
    await until(async () => (await synced()) === 100, 'the daemon to mirror the first 100 conversations');
    const cli = start(['sync'], both.env, 100_000);
    await until(() => advisoryWaiterPair(conversationLockKey(both.schema, ACCOUNT_ID, ids[100]!)), 'the CLI to wait for a conversation the daemon crawls');
    release();
    fake.clearFaults();
    const [jobEnd, cliEnd] = await Promise.all([within(job.done, 100_000, 'the daemon job'), within(cli.done, 100_000, 'the CLI sync')]);
    expect(cliEnd.code, cliEnd.stderr.slice(-2000)).toBe(0);
    expect(jobEnd.code, jobEnd.stderr.slice(-2000)).toBe(0);
    daemon.child.kill('SIGTERM');
    expect((await within(daemon.done, 15_000, 'the daemon to stop')).code).toBe(0);

    await expectPgMirrorEqualsFake(both.schema, ws);
    expect(await changeCounts(both.schema), 'changes per stream and op, against the single writer').toEqual(expected);
    expect(await duplicateChanges(both.schema), 'records changed twice').toEqual([]);
    const runs = await pgQuery<{ trigger: string; status: string; synced: number }>(
      `SELECT trigger, status, conversations_synced::int AS synced FROM "${both.schema}".runs ORDER BY id`,
    );
    expect(runs.map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
    const byRun = await pgQuery<{ trigger: string; n: number }>(
      `SELECT r.trigger, count(*)::int AS n FROM "${both.schema}".change_log c JOIN "${both.schema}".runs r ON r.id = c.run_id WHERE c.stream = 'messages' GROUP BY 1 ORDER BY 1`,
    );

    const changedBy = Object.fromEntries(byRun.map((r) => [r.trigger, r.n]));
    expect(changedBy['on-demand'], 'messages the daemon mirrored').toBeGreaterThanOrEqual(300);
    const lastSeq = Number((await pgQuery<{ last: string }>(`SELECT last::text FROM "${both.schema}".change_seq`))[0]!.last);
    expect(exportedSeqs(both.exportDir), 'seqs 1..last, each once').toEqual(Array.from({ length: lastSeq }, (_, i) => i + 1));
    const verified = await run(['verify', '--deep'], both.env, 60_000);
    expect(verified.code, verified.stdout + verified.stderr).toBe(0);
    expect(verified.stdout).toMatch(/ok +deep:/);
    expect(fs.existsSync(path.join(both.exportDir, 'messages'))).toBe(true);
    process.stderr.write(
      `fleet-cli-daemon: CLI sync + daemon at once on 300 conversations: changes ${JSON.stringify(await changeCounts(both.schema))} = single writer's; ` +
        `message changes by run trigger ${JSON.stringify(changedBy)}; runs ${JSON.stringify(runs)}; seqs 1..${lastSeq} once; verify --deep ok\n`,
    );
  }, 240_000);
});
