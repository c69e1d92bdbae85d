/**
 * `convo-mirror conversations` as a user runs it: the built CLI (a child process) on a mirror that
 * the built CLI's `sync` made from the fake API in this process (two workspaces, real HTTP, real
 * SQLite in a temp dir). The expected ids, statuses, times and message counts are the fake's own.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { LIST_CONVERSATIONS_SQL } from '../src/store/sqlite/conversations.js';
import type { Message, Page } from '../src/api/schemas.js';
import { API_KEY, cliEnv, snapshotEntries, tempDir as newTempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, type Ran } from './children.js';
import { connectionOf, sqlRun } from './sql.js';

/** Temp directories of this file, removed at the end. */
const dirs: string[] = [];
function tempDir(): string {
  const d = newTempDir();
  dirs.push(d);
  return d;
}

const A = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';
const B = '7a1c9e04-2b3d-4f5e-8a6b-1c2d3e4f5a6b';

/** A conversation as `conversations --json` prints it. */
interface Listed {
  id: string;
  account_id: string;
  status: string | null;
  updated_at: string | null;
  messages: number;
  last_synced_at: string | null;
  deleted_at: string | null;
}

let fake: FakeApi;
let tenants: Record<string, FakeWorkspace>;
let dir: string;
let env: NodeJS.ProcessEnv;
/** A TCP server standing in for Redis: the command must never connect to it. */
let redis: net.Server;
let redisConnections = 0;
/** A conversation deleted upstream (tombstoned by the full sync) and one that lost a message. */
let gone: { account: string; id: string };
let trimmed: { account: string; id: string };

/** A conversation as the fake serves it, in the keys of {@link Listed}. */
interface Served {
  id: string;
  account_id: string;
  status: string;
  updated_at: string;
  messages: number;
}

/** What the fake serves now, in the order the command must list it (newest update first). */
function expected(): Served[] {
  const rows = Object.entries(tenants).flatMap(([account, ws]) =>
    ws.list().map((c) => ({
      id: c.id,
      account_id: account,
      status: c.data['status'] as string,
      updated_at: (c.data['updated_at'] ?? c.data['last_activity_at']) as string,
      messages: c.messages.length,
    })),
  );
  const key = (r: { updated_at: string }) => Date.parse(r.updated_at);
  return rows.sort((x, y) => key(y) - key(x) || (x.account_id < y.account_id ? -1 : x.account_id > y.account_id ? 1 : x.id < y.id ? -1 : 1));
}

const conversations = (args: string[], e: NodeJS.ProcessEnv = env): Promise<Ran> => run(['conversations', ...args], e);

async function listed(args: string[]): Promise<Listed[]> {
  const r = await conversations(['--json', ...args]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as Listed[];
}

const ids = (rows: { account_id: string; id: string }[]) => rows.map((r) => `${r.account_id}/${r.id}`);

beforeAll(async () => {
  assertBuilt();
  tenants = { [A]: FakeWorkspace.generate({ seed: 21, conversations: 40 }), [B]: FakeWorkspace.generate({ seed: 22, conversations: 30 }) };
  // One conversation serves an updated_at (with an offset): it wins over last_activity_at, and is the newest.
  tenants[B]!.list()[7]!.data['updated_at'] = '2031-01-01T01:00:00.000+02:00';
  fake = await startFakeApi({ workspaces: { [A]: { workspace: tenants[A]!, apiKey: API_KEY }, [B]: { workspace: tenants[B]!, apiKey: API_KEY } } });
  redis = net.createServer((s) => {
    redisConnections++;
    s.destroy();
  });
  await new Promise<void>((resolve) => redis.listen(0, '127.0.0.1', resolve));
  dir = tempDir();
  env = cliEnv(fake, dir, { CONVO_MIRROR_ACCOUNT_ID: `${A},${B}`, REDIS_URL: `redis://127.0.0.1:${(redis.address() as net.AddressInfo).port}`, LOG_LEVEL: 'warn' });
  const first = await run(['sync'], env);
  expect(first.code, first.stderr).toBe(0);
  // Upstream deletions, mirrored by a full refresh: a tombstoned conversation, a tombstoned message.
  const a = tenants[A]!.list();
  gone = { account: A, id: a[5]!.id };
  tenants[A]!.deleteConversation(gone.id);
  const withMessages = a.find((c) => c.id !== gone.id && c.messages.length > 3)!;
  trimmed = { account: A, id: withMessages.id };
  tenants[A]!.deleteMessage(trimmed.id, withMessages.messages[1]!.id);
  const full = await run(['sync', '--full'], env);
  expect(full.code, full.stderr).toBe(0);
}, 60_000);

afterEach(killLeftovers);
afterAll(async () => {
  await fake?.close();
  await new Promise((resolve) => redis?.close(resolve));
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('convo-mirror conversations', () => {
  it('--limit 0 --json lists every live conversation of every account, newest update first, with the live message counts', async () => {
    const rows = await listed(['--limit', '0']);
    const want = expected();
    expect(ids(rows)).toEqual(ids(want));
    expect(rows.map(({ id, account_id, status, updated_at, messages }) => ({ id, account_id, status, updated_at, messages }))).toEqual(want);
    expect(rows[0]!.updated_at).toBe('2031-01-01T01:00:00.000+02:00');
    expect(ids(rows)).not.toContain(`${gone.account}/${gone.id}`);
    // The message deleted upstream is still a (tombstoned) row of the mirror: it is not counted.
    expect(rows.find((r) => r.id === trimmed.id)!.messages).toBe(tenants[A]!.get(trimmed.id)!.messages.length);
    for (const r of rows) {
      expect(Object.keys(r)).toEqual(['id', 'account_id', 'status', 'updated_at', 'messages', 'last_synced_at', 'deleted_at']);
      expect(r.last_synced_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      expect(r.deleted_at).toBeNull();
    }
  });

  it('lists 50 by default: an aligned table ending with how many more there are; --json notes them on stderr', async () => {
    const want = expected();
    const r = await conversations([]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines).toHaveLength(1 + 50 + 1);
    const [header, ...rest] = lines;
    expect(header!.split(/\s{2,}/)).toEqual(['id', 'account', 'status', 'updated', 'messages', 'last synced']);
    expect(rest.pop()).toBe(`${want.length - 50} more not shown (${want.length} in all; --limit 0 lists them all)`);
    rest.forEach((line, i) => {
      const [id, account, status, updated, messages, synced] = line.split(/\s+/);
      expect({ id, account_id: account, status, updated_at: updated, messages: Number(messages) }).toEqual(want[i]);
      expect(synced).toMatch(/^\d{4}-\d\d-\d\dT/);
      // Aligned: each cell starts under its header (the message count ends under its header).
      expect(line.indexOf(` ${status!} `) + 1).toBe(header!.indexOf('status'));
      expect(line.indexOf(updated!)).toBe(header!.indexOf('updated'));
      expect(line.indexOf(` ${messages!}  `) + 1 + messages!.length).toBe(header!.indexOf('messages') + 'messages'.length);
    });
    const json = await conversations(['--json']);
    expect(json.code, json.stderr).toBe(0);
    expect(ids(JSON.parse(json.stdout) as Listed[])).toEqual(ids(want.slice(0, 50)));
    expect(json.stderr).toBe(`convo-mirror: ${want.length - 50} more not shown (${want.length} in all; --limit 0 lists them all)\n`);
  });

  it('--limit N lists the N newest; a whole list has no "more" line', async () => {
    const want = expected();
    expect(ids(await listed(['--limit', '3']))).toEqual(ids(want.slice(0, 3)));
    const all = await conversations(['--limit', String(want.length)]);
    expect(all.code, all.stderr).toBe(0);
    expect(all.stdout.trimEnd().split('\n')).toHaveLength(1 + want.length);
    expect(all.stdout).not.toMatch(/more not shown/);
  });

  it('--status keeps the conversations with that status (repeatable: any of them)', async () => {
    const want = expected();
    const open = await listed(['--status', 'open', '--limit', '0']);
    expect(open.length).toBeGreaterThan(0);
    expect(ids(open)).toEqual(ids(want.filter((c) => c.status === 'open')));
    const either = await listed(['--status', 'open', '--status', 'resolved', '--limit', '0']);
    expect(ids(either)).toEqual(ids(want.filter((c) => c.status === 'open' || c.status === 'resolved')));
    expect(await listed(['--status', 'no-such-status'])).toEqual([]);
    const none = await conversations(['--status', 'no-such-status']);
    expect(none.stdout).toBe('no conversations match\n');
  });

  it('--since keeps updated_at >= the time, whatever its zone; a date is midnight UTC', async () => {
    const want = expected();
    const mid = want[Math.floor(want.length / 2)]!;
    const t = Date.parse(mid.updated_at);
    // The same instant written at +02:00: it is included (>=), and exactly the newer ones with it.
    const local = new Date(t + 2 * 3_600_000).toISOString().replace('Z', '+02:00');
    const since = await listed(['--since', local, '--limit', '0']);
    expect(ids(since)).toEqual(ids(want.filter((c) => Date.parse(c.updated_at) >= t)));
    expect(ids(since)).toContain(`${mid.account_id}/${mid.id}`);
    const after = await listed(['--since', new Date(t + 1).toISOString(), '--limit', '0']);
    expect(ids(after)).not.toContain(`${mid.account_id}/${mid.id}`);
    const day = mid.updated_at.slice(0, 10);
    const fromDay = await listed(['--since', day, '--limit', '0']);
    expect(ids(fromDay)).toEqual(ids(want.filter((c) => Date.parse(c.updated_at) >= Date.parse(`${day}T00:00:00Z`))));
  });

  it('--account keeps that account (repeatable); --deleted and --include-deleted add the tombstoned', async () => {
    const want = expected();
    expect(ids(await listed(['--account', B, '--limit', '0']))).toEqual(ids(want.filter((c) => c.account_id === B)));
    expect(ids(await listed(['--account', B.toUpperCase(), '--account', A, '--limit', '0']))).toEqual(ids(want));
    expect(await listed(['--account', 'default'])).toEqual([]);
    for (const flag of ['--deleted', '--include-deleted']) {
      const rows = await listed([flag, '--limit', '0']);
      const tomb = rows.filter((r) => r.deleted_at !== null);
      expect(tomb.map((r) => r.id)).toEqual([gone.id]);
      expect(tomb[0]!.messages).toBe(0); // its messages were tombstoned with it
      expect(ids(rows.filter((r) => r.deleted_at === null))).toEqual(ids(want));
    }
    const plain = await conversations(['--deleted', '--account', A, '--limit', '0']);
    expect(plain.stdout.split('\n')[0]!.split(/\s{2,}/)).toEqual(['id', 'account', 'status', 'updated', 'messages', 'last synced', 'deleted']);
    expect(plain.stdout).toMatch(new RegExp(`^${gone.id} .* \\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z$`, 'm'));
  });

  it('a malformed --since or --limit exits 2 with one line naming the flag', async () => {
    for (const bad of ['yesterday', '2025-02-30', '2025-06-01T12:00:00', '2025-06-01T24:00:00Z', '2025-6-1', '']) {
      const r = await conversations(['--since', bad]);
      expect(r.code, bad).toBe(2);
      expect(r.stdout).toBe('');
      expect(r.stderr.trimEnd().split('\n'), bad).toHaveLength(1);
      expect(r.stderr).toMatch(/^convo-mirror: .*--since: must be an ISO 8601 date/);
    }
    for (const bad of ['-1', '1.5', 'lots', '']) {
      const r = await conversations([`--limit=${bad}`]);
      expect(r.code, bad).toBe(2);
      expect(r.stdout).toBe('');
      expect(r.stderr.trimEnd().split('\n'), bad).toHaveLength(1);
      expect(r.stderr).toMatch(/^convo-mirror: .*--limit: must be a whole number >= 0/);
    }
  });

  it('a missing mirror exits 2 with one line naming CONVO_MIRROR_DB and the path, and creates nothing; --db overrides it', async () => {
    const empty = tempDir();
    const missing = path.join(empty, 'nope.sqlite');
    const r = await conversations([], { ...env, CONVO_MIRROR_DB: missing });
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain('CONVO_MIRROR_DB');
    expect(r.stderr).toContain(missing);
    expect(fs.readdirSync(empty)).toEqual([]);
    const viaFlag = await conversations(['--json', '--limit', '1', '--db', env.CONVO_MIRROR_DB!], { ...env, CONVO_MIRROR_DB: missing });
    expect(viaFlag.code, viaFlag.stderr).toBe(0);
    expect(ids(JSON.parse(viaFlag.stdout) as Listed[])).toEqual(ids(expected().slice(0, 1)));
  });

  it('writes nothing (no byte, mtime or entry of the mirror directory changes) and never connects to Redis', async () => {
    const before = snapshotEntries(dir);
    expect([...before.keys()]).toContain('mirror.sqlite');
    for (const args of [[], ['--json', '--limit', '0'], ['--deleted', '--status', 'open'], ['--since', '2025-03-01']]) {
      const r = await conversations(args);
      expect(r.code, r.stderr).toBe(0);
    }
    const after = snapshotEntries(dir);
    expect([...after.keys()].sort()).toEqual([...before.keys()].sort());
    for (const [rel, b] of before) {
      const a = after.get(rel)!;
      expect(a.bytes === null ? null : a.bytes.equals(b.bytes!), rel).toBe(b.bytes === null ? null : true);
      expect(a.mtimeMs, rel).toBe(b.mtimeMs);
    }
    expect(redisConnections).toBe(0);
  });

  it('next to a live writer: reads its committed -wal, and neither the file nor the -wal changes', async () => {
    const copy = tempDir();
    fs.cpSync(dir, copy, { recursive: true });
    const db = path.join(copy, 'mirror.sqlite');
    const writer = await openMirror(db);
    try {
      sqlRun(writer, 'PRAGMA wal_autocheckpoint = 0');
      const target = expected()[0]!;
      await writer.commitMessagesPage(target.account_id, target.id, extraPage(target.id, 3), null);
      const walBefore = fs.readFileSync(`${db}-wal`);
      const fileBefore = fs.readFileSync(db);
      expect(walBefore.length).toBeGreaterThan(0);
      const r = await conversations(['--json', '--limit', '1'], { ...env, CONVO_MIRROR_DB: db });
      expect(r.code, r.stderr).toBe(0);
      expect((JSON.parse(r.stdout) as Listed[])[0]).toMatchObject({ id: target.id, messages: target.messages + 3 });
      expect(fs.readFileSync(`${db}-wal`).equals(walBefore)).toBe(true);
      expect(fs.readFileSync(db).equals(fileBefore)).toBe(true);
    } finally {
      await writer.close();
    }
  });

  it('counts messages with one statement that searches the messages primary key index (EXPLAIN QUERY PLAN)', async () => {
    const m = await openMirror(env.CONVO_MIRROR_DB!, { readonly: true });
    try {
      const params = { accounts: null, statuses: null, since: null, deleted: 0, limit: 50 };
      const plan = connectionOf(m)
        .prepare(`EXPLAIN QUERY PLAN ${LIST_CONVERSATIONS_SQL}`)
        .all(params)
        .map((r) => (r as { detail: string }).detail);
      expect(plan).toContain('SEARCH m USING INDEX sqlite_autoindex_messages_1 (account_id=? AND conversation_id=?)');
      expect(plan.filter((d) => /\b(SCAN|SEARCH) (m|messages)\b/.test(d))).toHaveLength(1);
      expect(plan.filter((d) => /SCAN (m|messages)\b/.test(d))).toEqual([]);
    } finally {
      await m.close();
    }
  });
});

/** A page of `n` new messages (page 99, so no stored position moves). */
function extraPage(conversationId: string, n: number): Page<Message> {
  const data: Message[] = Array.from({ length: n }, (_, i) => ({
    id: `extra-${conversationId.slice(0, 8)}-${i}`,
    content: `late message ${i}`,
    visibility: 'global',
    sender: { id: 'cus_late', name: 'Late Customer', type: 'Customer' },
    created_at: new Date(Date.UTC(2032, 0, 1) + i * 1000).toISOString(),
  }));
  return { page: 99, data, raw: data.map((d) => ({ ...d })), meta: { current_page: 99, total_pages: 99, total_count: 9800 + n } };
}
