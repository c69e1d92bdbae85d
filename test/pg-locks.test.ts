/**
 * What keeps several writers of one PostgreSQL mirror apart: processes starting together migrate
 * once (the second waits for the migration lock, then finds nothing to do), and the session
 * advisory locks per conversation and per workspace listing (a second holder waits for the first,
 * other keys do not; a lock is released when its function throws; closing a mirror cancels its
 * waits). Each "process" is a mirror of its own (its own pools).
 */
import { afterAll, describe, expect, it } from 'vitest';
import type { Message, Page } from '../src/api/schemas.js';
import { MirrorDatabaseError } from '../src/store/postgres/connect.js';
import { PostgresMirror } from '../src/store/postgres/mirror.js';
import { conversationLockKey, listingLockKey, migrateLockKey } from '../src/store/postgres/locks.js';
import { PG_SCHEMA_VERSION } from '../src/store/postgres/migrations.js';
import { advisoryWaiter64, advisoryWaiterPair, dropSchema, pgQuery, pgUrl, randomSchema, until } from './pg.js';

const schemas: string[] = [];
const mirrors: PostgresMirror[] = [];
afterAll(async () => {
  await Promise.all(mirrors.map((m) => m.close()));
  for (const s of schemas) await dropSchema(s);
});

function schema(label: string): string {
  const s = randomSchema(label);
  schemas.push(s);
  return s;
}

async function open(s: string, opts: Parameters<typeof PostgresMirror.open>[1] = {}): Promise<PostgresMirror> {
  const m = await PostgresMirror.open(pgUrl(s), opts);
  mirrors.push(m);
  return m;
}

/** A gate a test opens by hand. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

describe('migrations', () => {
  it('two processes opening a new schema at once migrate it once: the second waits for the lock, then finds it current', async () => {
    const s = schema('migrate');
    const reached = gate();
    const release = gate();
    const first = open(s, {
      hooks: {
        onMigrationLocked: async () => {
          reached.open();
          await release.wait;
        },
      },
    });
    await reached.wait;
    const second = open(s);
    await until(() => advisoryWaiter64(migrateLockKey(s)), 'the second open to wait for the migration lock');
    // The first holds the lock and has not created anything yet.
    expect(await pgQuery(`SELECT 1 FROM pg_namespace WHERE nspname = $1`, [s])).toEqual([]);
    release.open();
    const [a, b] = await Promise.all([first, second]);
    expect([a.migrated, b.migrated]).toEqual([PG_SCHEMA_VERSION, 0]);
    expect(await pgQuery(`SELECT version FROM "${s}".schema_version`)).toEqual([{ version: PG_SCHEMA_VERSION }]);
    // Both work on the one schema.
    await a.recordListOrder('acct', { field: 'updated_at', ordered: true, newest: null, at: '2026-01-01T00:00:00.000Z' });
    expect(await b.listOrder('acct')).toMatchObject({ field: 'updated_at', ordered: true });
    expect(await a.mirrorId()).toBe(await b.mirrorId());
  });

  it('three opens racing without a failpoint: one migrates', async () => {
    const s = schema('race');
    const all = await Promise.all([open(s), open(s), open(s)]);
    expect(all.map((m) => m.migrated).sort()).toEqual([0, 0, PG_SCHEMA_VERSION]);
  });
});

describe('advisory locks per conversation and per listing', () => {
  it('a second writer of one conversation waits for the first; another conversation and the listing do not', async () => {
    const s = schema('conv');
    const daemon = await open(s);
    const cli = await open(s);
    const order: string[] = [];
    const inside = gate();
    const release = gate();
    const held = daemon.withConversationLock('acct', 'c1', async () => {
      order.push('daemon in');
      inside.open();
      await release.wait;
      order.push('daemon out');
      return 'daemon';
    });
    await inside.wait;
    const waiting = cli.withConversationLock('acct', 'c1', async () => {
      order.push('cli in');
      return 'cli';
    });
    await until(() => advisoryWaiterPair(conversationLockKey(s, 'acct', 'c1')), 'the CLI to wait for the conversation lock');
    // Other keys are free meanwhile.
    expect(await cli.withConversationLock('acct', 'c2', async () => 'other conversation')).toBe('other conversation');
    expect(await cli.withConversationLock('other-acct', 'c1', async () => 'other account')).toBe('other account');
    expect(await cli.withListingLock('acct', async () => 'listing')).toBe('listing');
    expect(order).toEqual(['daemon in']);
    release.open();
    expect(await Promise.all([held, waiting])).toEqual(['daemon', 'cli']);
    expect(order).toEqual(['daemon in', 'daemon out', 'cli in']);
  });

  it('two listings of one workspace: the second waits; a lock is released when its function throws', async () => {
    const s = schema('listing');
    const a = await open(s);
    const b = await open(s);
    const inside = gate();
    const release = gate();
    const first = a.withListingLock('acct', async () => {
      inside.open();
      await release.wait;
      throw new Error('listing failed');
    });
    await inside.wait;
    let ran = false;
    const second = b.withListingLock('acct', async () => {
      ran = true;
    });
    await until(() => advisoryWaiterPair(listingLockKey(s, 'acct')), 'the second listing to wait');
    expect(ran).toBe(false);
    release.open();
    await expect(first).rejects.toThrow('listing failed');
    await second;
    expect(ran).toBe(true);
    // Released in the same process too: taken again at once.
    expect(await a.withListingLock('acct', async () => 'again')).toBe('again');
  });

  it('closing a mirror cancels its waits for a lock', async () => {
    const s = schema('close');
    const holder = await open(s);
    const waiter = await PostgresMirror.open(pgUrl(s));
    const inside = gate();
    const release = gate();
    const held = holder.withConversationLock('acct', 'c1', async () => {
      inside.open();
      await release.wait;
    });
    await inside.wait;
    const waiting = waiter.withConversationLock('acct', 'c1', async () => 'ran').catch((err: unknown) => err);
    await until(() => advisoryWaiterPair(conversationLockKey(s, 'acct', 'c1')), 'the waiter to wait');
    try {
      await waiter.close();
      expect(String(await waiting)).toMatch(/closed while waiting for a lock/);
    } finally {
      release.open();
      await held;
    }
    expect(await advisoryWaiterPair(conversationLockKey(s, 'acct', 'c1'))).toBe(false);
  });
});

/** The backend holding the advisory lock with the int4 pair `key`. */
async function lockHolder(key: [number, number]): Promise<number | undefined> {
  const rows = await pgQuery<{ pid: number }>(
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid::bigint = $1 AND objid::bigint = $2`,
    [key[0] >>> 0, key[1] >>> 0],
  );
  return rows[0]?.pid;
}

describe('a connection lost under a lock or a transaction', () => {
  it('the lock goes with its session: no crash, the function ends, another writer takes it', async () => {
    const s = schema('lost');
    const a = await open(s);
    const b = await open(s);
    const key = conversationLockKey(s, 'acct', 'c1');
    const inside = gate();
    const release = gate();
    const held = a.withConversationLock('acct', 'c1', async () => {
      inside.open();
      await release.wait;
      return 'done';
    });
    await inside.wait;
    const pid = await lockHolder(key);
    expect(pid).toBeTypeOf('number');
    await pgQuery('SELECT pg_terminate_backend($1)', [pid]);
    // Free at once for another writer, while the first still runs.
    expect(await b.withConversationLock('acct', 'c1', async () => 'taken')).toBe('taken');
    release.open();
    expect(await held).toBe('done');
    // The first mirror goes on with a new connection.
    expect(await a.withConversationLock('acct', 'c1', async () => 'again')).toBe('again');
  });

  it('a page whose connection is lost before its commit fails with DB_UNREACHABLE and leaves nothing; the mirror goes on', async () => {
    const s = schema('lostx');
    const reached = gate();
    const release = gate();
    let armed = true;
    const m = await open(s, {
      hooks: {
        beforeCommit: async () => {
          if (!armed) return;
          armed = false;
          reached.open();
          await release.wait;
        },
      },
    });
    const data = [{ id: 'm1', content: 'x', visibility: 'public', sender: { id: 'u', name: 'U', type: 'agent' }, created_at: '2026-01-01T00:00:00Z' }];
    const page = { page: 1, data, raw: data, meta: { total_count: 1, page: 1, per_page: 100, total_pages: 1 } } as unknown as Page<Message>;
    const commit = m.commitMessagesPage('acct', 'c1', page, null).catch((err: unknown) => err);
    await reached.wait;
    // The backend of the held transaction: the one holding the change-log counter's row.
    const rows = await pgQuery<{ pid: number }>(
      `SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = $1 AND c.relname = 'change_seq' AND l.mode = 'RowExclusiveLock' AND l.granted`,
      [s],
    );
    try {
      expect(rows).toHaveLength(1);
      await pgQuery('SELECT pg_terminate_backend($1)', [rows[0]!.pid]);
    } finally {
      release.open();
    }
    const err = await commit;
    expect(err).toBeInstanceOf(MirrorDatabaseError);
    expect((err as MirrorDatabaseError).code).toBe('DB_UNREACHABLE');
    expect((err as Error).message).toMatch(/^CONVO_MIRROR_DB \(postgres:\/\/[^)]*\): the connection was lost/);
    expect(await m.hasConversation('acct', 'c1')).toBe(false);
    expect(await m.commitMessagesPage('acct', 'c1', page, null)).toMatchObject({ inserted: 1 });
  });
});
