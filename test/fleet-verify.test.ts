/**
 * Issue 25, item 4: `verify --deep` through the CLI on a PostgreSQL mirror
 * (`CONVO_MIRROR_DB=postgres://...`). After a CLI `sync`, every check passes; a message changed in
 * the database only then fails the deep check, its one `problem:` line naming it, with exit 1. The URL carries a password
 * (the test server trusts every client, so any is accepted): no output shows it.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { dropSchema, PG_BASE, pgQuery, pgUrl, randomSchema } from './pg.js';
import { expectPgMirrorEqualsFake } from './fleet-helpers.js';

const schema = randomSchema('fleet_verify');
const dirs: string[] = [];
const fakes: FakeApi[] = [];
const PASSWORD = 'pw-9f3a1c77e2';

beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await Promise.allSettled(fakes.splice(0).map((f) => f.close()));
});
afterAll(async () => {
  await dropSchema(schema);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('verify --deep on a PostgreSQL mirror, through the CLI', () => {
  it('passes after a sync; a message changed in the database fails the deep check, naming it; the password never shows', async () => {
    const ws = FakeWorkspace.fromCounts([3, 5, 2, 7]);
    const fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
    fakes.push(fake);
    const dir = tempDir('convo-mirror-fleet-verify-');
    dirs.push(dir);
    const base = new URL(PG_BASE);
    base.password = PASSWORD;
    const env = cliEnv(fake, dir, { CONVO_MIRROR_DB: pgUrl(schema, base.href) });
    const outputs: string[] = [];
    const cli = async (args: string[]) => {
      const r = await run(args, env, 60_000);
      outputs.push(r.stdout, r.stderr);
      return r;
    };

    const synced = await cli(['sync']);
    expect(synced.code, synced.stderr).toBe(0);
    await expectPgMirrorEqualsFake(schema, ws);
    const ok = await cli(['verify', '--deep']);
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/^ok +deep: every export line replayed in seq order matches the mirror/m);
    expect(ok.stdout).toMatch(/^ok +mirror: /m);
    expect(ok.stdout).toMatch(/^archive intact: /m);

    // A message changed in the database only (raw and its byte-exact text alike).
    const victim = ws.list()[3]!.messages[4]!;
    const forged = JSON.stringify({ ...victim, content: 'changed in the database only' });
    await pgQuery(`UPDATE "${schema}".messages SET raw = $1::jsonb, raw_text = $1 WHERE id = $2`, [forged, victim.id]);
    const bad = await cli(['verify', '--deep']);
    expect(bad.code, bad.stdout + bad.stderr).toBe(1);
    const fail = bad.stdout.split('\n').filter((l) => l.startsWith('FAIL'));
    expect(fail.length, bad.stdout).toBeGreaterThan(0);
    expect(fail.every((l) => /^FAIL +deep:/.test(l)), bad.stdout).toBe(true);
    const problems = bad.stderr.split('\n').filter((l) => l.startsWith('problem: '));
    expect(problems.length, bad.stderr).toBe(1);
    expect(problems[0], 'the problem line names the message').toContain(victim.id);
    // Without --deep the archive and the ledger still agree: only the deep check reads the rows.
    const shallow = await cli(['verify']);
    expect(shallow.code, shallow.stdout + shallow.stderr).toBe(0);

    expect(outputs.filter((o) => o.includes(PASSWORD)), 'outputs showing the password').toEqual([]);
    expect(ok.stdout, 'the database line names the masked URL').toMatch(/^ok +database: .*postgres:\/\/postgres:\*+@127\.0\.0\.1:5432\/test\?schema=/m);
    expect(ok.stdout, "PostgreSQL's own check, not SQLite's name for it").toMatch(/^ok +database: consistency check ok \(/m);
  }, 120_000);
});
