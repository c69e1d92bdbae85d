/**
 * What keeps several writers of one PostgreSQL mirror apart: processes starting together migrate
 * once (the second waits for the migration lock, then finds nothing to do), and the session
 * advisory locks per conversation and per workspace listing (a second holder waits for the first,
 * other keys do not; a lock is released when its function throws; closing a mirror cancels its
 * waits). Each "process" is a mirror of its own (its own pools).
 */
import { afterAll, describe, expect, it } from 'vitest';
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
