/**
 * A sync that ends at first contact leaves nothing behind: a wrong base URL, a refused key or a
 * workspace the key may not read is answered before the mirror is opened, so no mirror file is
 * created, no run is recorded, nothing is published and the ledger gains no record. The built CLI
 * against the fake API in this process, real files in temp dirs.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { API_KEY, cliEnv, snapshotEntries, tempDir, withMirror } from './helpers.js';
import { assertBuilt, closedPort, killLeftovers, run } from './children.js';

beforeAll(assertBuilt);

/**
 * Every entry under `dir` with its mode, and each file's bytes and mtime. Directories' own mtimes
 * are left out: the start-up check that a path can be written creates and removes a probe file.
 */
function filesOf(dir: string): Map<string, unknown> {
  return new Map([...snapshotEntries(dir)].map(([rel, e]) => [rel, e.bytes === null ? { mode: e.mode } : e]));
}
afterEach(killLeftovers);

describe('sync: first contact before anything is touched', () => {
  let fake: FakeApi;
  let ws: FakeWorkspace;
  /** A web portal where the API was expected: 200 and HTML for every path. */
  let portal: { url: string; close: () => Promise<void> };
  beforeAll(async () => {
    ws = FakeWorkspace.generate({ seed: 24, conversations: 12 });
    fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10' });
    const server = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>Help center</title>'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    portal = { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
  });
  afterAll(async () => {
    await fake.close();
    await portal.close();
  });

  /** The first-contact mistakes a newcomer makes, each with the setting its one line names. */
  const mistakes = async (): Promise<{ what: string; env: Record<string, string>; names: RegExp }[]> => [
    { what: 'nothing listening', env: { CONVO_MIRROR_BASE_URL: `http://127.0.0.1:${await closedPort()}` }, names: /CONVO_MIRROR_BASE_URL.*nothing is listening/ },
    { what: 'https against plain HTTP', env: { CONVO_MIRROR_BASE_URL: fake.url.replace('http:', 'https:') }, names: /CONVO_MIRROR_BASE_URL.*plain HTTP/ },
    { what: 'a wrong path', env: { CONVO_MIRROR_BASE_URL: `${fake.url}/api` }, names: /CONVO_MIRROR_BASE_URL.*answered 404/ },
    { what: 'a refused key', env: { CONVO_MIRROR_API_KEY: 'typo-in-the-key' }, names: /authentication error: .*CONVO_MIRROR_API_KEY/ },
    { what: 'a workspace the key may not read', env: { CONVO_MIRROR_ACCOUNT_ID: '7a1c9e04-2b3d-4f5e-8a6b-1c2d3e4f5a6b' }, names: /authentication error: .*CONVO_MIRROR_ACCOUNT_ID/ },
    { what: 'a web page at the base URL', env: { CONVO_MIRROR_BASE_URL: portal.url }, names: /CONVO_MIRROR_BASE_URL: .*not JSON.*is the base URL the API's/ },
  ];

  it('on a new machine: exit 2, one line naming the setting, and no file at all', async () => {
    for (const m of await mistakes()) {
      const dir = tempDir();
      fake.requests.length = 0;
      const r = await run(['sync'], cliEnv(fake, dir, m.env));
      expect(r.code, `${m.what}: ${r.stderr}`).toBe(2);
      expect(r.stdout, m.what).toBe('');
      expect(r.stderr.trim().split('\n'), m.what).toHaveLength(1);
      expect(r.stderr, m.what).toMatch(m.names);
      expect(fs.readdirSync(dir), m.what).toEqual([]);
    }
  });

  it('on a live mirror: six mistakes change no byte of the mirror or the archive, and record no run', async () => {
    const dir = tempDir();
    const first = await run(['sync'], cliEnv(fake, dir));
    expect(first.code, first.stderr).toBe(0);
    const before = filesOf(dir);
    const head = await withMirror(path.join(dir, 'mirror.sqlite'), (mirror) => mirror.ledgerHead());
    for (const m of await mistakes()) {
      const r = await run(['sync'], cliEnv(fake, dir, m.env));
      expect(r.code, `${m.what}: ${r.stderr}`).toBe(2);
      expect(r.stderr, m.what).toMatch(m.names);
    }
    // The named-conversation form too.
    const named = await run(['sync', '--conversation', ws.list()[0]!.id], cliEnv(fake, dir, { CONVO_MIRROR_API_KEY: 'typo-in-the-key' }));
    expect(named.code, named.stderr).toBe(2);
    expect(filesOf(dir)).toEqual(before);
    await withMirror(path.join(dir, 'mirror.sqlite'), async (mirror) => {
      expect((await mirror.lastRuns(10)).map((r) => r['status'])).toEqual(['succeeded']);
      expect(await mirror.ledgerHead()).toEqual(head);
    });
  });

  it('a run that began costs no extra request: the first request of the listing is the one sent ahead', async () => {
    const dir = tempDir();
    fake.requests.length = 0;
    const r = await run(['sync', '--json'], cliEnv(fake, dir));
    expect(r.code, r.stderr).toBe(0);
    const summary = JSON.parse(r.stdout) as { requests: number; minimumRequests: number };
    expect(summary.requests).toBe(summary.minimumRequests);
    expect(fake.requests).toHaveLength(summary.requests);
    expect(fake.requests.filter((q) => q.path === '/v1/conversations' && q.query['page'] === '1')).toHaveLength(1);
  });

  it('sync --conversation of a long conversation counts the page-1 request it did not use', async () => {
    const dir = tempDir();
    const long = ws.list().find((c) => c.messages.length > 100)!;
    expect(long, 'the seeded workspace has a conversation of more than 100 messages').toBeDefined();
    expect((await run(['sync', '--conversation', long.id], cliEnv(fake, dir))).code).toBe(0);
    // The second crawl starts from the page of the last known message, not page 1.
    fake.requests.length = 0;
    const r = await run(['sync', '--conversation', long.id, '--json'], cliEnv(fake, dir));
    expect(r.code, r.stderr).toBe(0);
    const summary = JSON.parse(r.stdout) as { requests: number };
    expect(fake.requests.map((q) => q.query['page'])).toEqual(['1', String(Math.ceil(long.messages.length / 100))]);
    expect(summary.requests).toBe(2);
  });
});
