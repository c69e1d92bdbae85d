/**
 * CONVO_MIRROR_WITNESS_DIR at start-up: `check` shows it as a line of its own, and `sync` refuses
 * a witness directory it could not append to (missing, or inside the export directory, where it
 * would witness nothing) before any request or file. The built CLI against the fake API.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run } from './children.js';

beforeAll(assertBuilt);
afterEach(killLeftovers);

describe('CONVO_MIRROR_WITNESS_DIR at start-up', () => {
  let fake: FakeApi;
  beforeAll(async () => {
    fake = await startFakeApi({ workspace: FakeWorkspace.generate({ seed: 3, conversations: 2 }), apiKey: API_KEY, accountId: '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10' });
  });
  afterAll(async () => fake.close());

  it('check: a line of its own, passing for a usable directory and naming the setting otherwise', async () => {
    const dir = tempDir();
    const witness = tempDir('convo-mirror-witness-');
    const ok = await run(['check', '--no-queue'], cliEnv(fake, dir, { CONVO_MIRROR_WITNESS_DIR: witness }));
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toContain(`✓ witness: ${witness} can be appended to (CONVO_MIRROR_WITNESS_DIR)`);
    const missing = await run(['check', '--no-queue'], cliEnv(fake, dir, { CONVO_MIRROR_WITNESS_DIR: path.join(witness, 'not-mounted') }));
    expect(missing.code).toBe(2);
    expect(missing.stdout).toMatch(/^✗ witness: CONVO_MIRROR_WITNESS_DIR: the witness directory .*not-mounted does not exist/m);
    fs.mkdirSync(path.join(dir, 'exports', 'heads'), { recursive: true });
    const inside = await run(['check', '--no-queue'], cliEnv(fake, dir, { CONVO_MIRROR_WITNESS_DIR: path.join(dir, 'exports', 'heads') }));
    expect(inside.code).toBe(2);
    expect(inside.stdout).toMatch(/^✗ witness: CONVO_MIRROR_WITNESS_DIR: the witness directory .* is inside the export directory /m);
  });

  it('sync: a missing witness directory is one line naming the setting, before any request or file', async () => {
    const dir = tempDir();
    fake.requests.length = 0;
    const r = await run(['sync'], cliEnv(fake, dir, { CONVO_MIRROR_WITNESS_DIR: path.join(dir, 'nope') }));
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/CONVO_MIRROR_WITNESS_DIR: the witness directory .*nope does not exist/);
    expect(fake.requests).toHaveLength(0);
    expect(fs.readdirSync(dir)).toEqual([]);
  });

  it('daemon: a witness directory inside the export directory stops it at start-up, one line naming the setting', async () => {
    const dir = tempDir();
    fs.mkdirSync(path.join(dir, 'exports', 'witness'), { recursive: true });
    fake.requests.length = 0;
    const r = await run(['daemon', '--scheduler', 'local'], cliEnv(fake, dir, { CONVO_MIRROR_WITNESS_DIR: path.join(dir, 'exports', 'witness') }));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/CONVO_MIRROR_WITNESS_DIR: the witness directory .* is inside the export directory /);
    expect(fake.requests).toHaveLength(0);
    expect(fs.existsSync(path.join(dir, 'mirror.sqlite'))).toBe(false);
  });
});
