/**
 * Runs of a fleet on one PostgreSQL mirror (issue 25): every writer holds an owner lock (a session
 * advisory lock keyed by the schema and its random instance id) and stamps its runs with its id; a
 * sweep (`markInterruptedRuns`) marks `interrupted` only the running runs whose owner's lock no
 * session holds. Shown with two and three mirrors on one schema: a live writer's run is left alone,
 * a closed writer's run is swept (with its change-log row), a writer whose lock session is lost is
 * swept in the gap (held open by a failpoint) and takes its lock and its run back, a resumed run
 * becomes its resumer's. And the streamed reads (`verify --deep`'s and the exporter's) fail with
 * one clean error, not a crash, when their backend is terminated mid-stream.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import pg from 'pg';
import type { Message, Page } from '../src/api/schemas.js';
import { advisoryHeld64Sql, ownerLockKey, ownerLockKeySql, ownerLockPrefix } from '../src/store/postgres/locks.js';
import { PostgresMirror, type PostgresMirrorOptions } from '../src/store/postgres/mirror.js';
import { randomInstanceId, type OwnerLockEvent } from '../src/store/postgres/owner-lock.js';
import { dropSchema, PG_BASE, pgQuery, pgUrl, randomSchema, until } from './pg.js';

const schema = randomSchema('owners');
const RUN = { scope: 'workspace', refresh: 'full', trigger: 'schedule', accountId: 'acct' } as const;

/** Mirrors opened by the current test, closed after it. */
let opened: PostgresMirror[] = [];
async function open(opts: PostgresMirrorOptions = {}): Promise<PostgresMirror> {
  const m = await PostgresMirror.open(pgUrl(schema), opts);
  opened.push(m);
  return m;
}
afterEach(async () => {
  for (const m of opened) await m.close();
  opened = [];
});
// Each test starts with no run left running by a writer that is gone (an earlier test's).
beforeEach(async () => {
  const sweeper = await PostgresMirror.open(pgUrl(schema));
  await sweeper.markInterruptedRuns();
  await sweeper.close();
});
afterAll(() => dropSchema(schema));

/** A run's owner as decimal text (null for none). */
async function ownerOf(runId: number): Promise<string | null> {
  const rows = await pgQuery<{ owner: string | null }>(`SELECT owner::text AS owner FROM "${schema}".runs WHERE id = $1`, [runId]);
  return rows[0]!.owner;
}

/** Whether some session holds the owner lock of instance `id`. */
async function ownerLockHeld(id: string): Promise<boolean> {
  const rows = await pgQuery<{ held: boolean }>(`SELECT ${advisoryHeld64Sql('$1::bigint')} AS held`, [ownerLockKey(schema, id)]);
  return rows[0]!.held;
}

/** The `runs` change-log rows of a run, as the exporter reads them. */
async function runLines(m: PostgresMirror, runId: number): Promise<{ op: string; status: unknown }[]> {
  const out: { op: string; status: unknown }[] = [];
  for await (const c of m.changesOf({ first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER })) {
    if (c.stream === 'runs' && c.record_id === String(runId)) out.push({ op: c.op, status: (JSON.parse(c.record!) as { status: unknown }).status });
  }
  return out;
}

/** A promise and its resolver. */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

describe('the owner lock', () => {
  it('the server computes the key the code computes, and pg_locks shows a bigint key as classid/objid with objsubid 1', async () => {
    const ids = ['0', '1', '-1', '9223372036854775807', '-9223372036854775808', randomInstanceId(), randomInstanceId()];
    for (const id of ids) {
      const rows = await pgQuery<{ k: string }>(`SELECT ${ownerLockKeySql('$1', '$2::bigint')}::text AS k`, [ownerLockPrefix(schema), id]);
      expect({ id, k: rows[0]!.k }).toEqual({ id, k: ownerLockKey(schema, id) });
    }
    // A negative key (high bit set) and a positive one; the int4 pair with the same halves is another lock.
    const holder = new pg.Client({ connectionString: PG_BASE, application_name: 'convo-mirror-test' });
    await holder.connect();
    try {
      for (const key of [ownerLockKey(schema, '1'), '4294967297', '-8070450532247928831']) {
        const held = async (k: string) => (await pgQuery<{ h: boolean }>(`SELECT ${advisoryHeld64Sql('$1::bigint')} AS h`, [k]))[0]!.h;
        expect(await held(key)).toBe(false);
        await holder.query('SELECT pg_advisory_lock($1::bigint)', [key]);
        expect(await held(key)).toBe(true);
        expect(await held((BigInt(key) + 1n).toString())).toBe(false);
        await holder.query('SELECT pg_advisory_unlock($1::bigint)', [key]);
        const k = BigInt.asUintN(64, BigInt(key));
        const pair = [Number(BigInt.asIntN(32, k >> 32n)), Number(BigInt.asIntN(32, k & 0xffffffffn))];
        await holder.query('SELECT pg_advisory_lock($1::int4, $2::int4)', pair);
        expect(await held(key)).toBe(false);
        await holder.query('SELECT pg_advisory_unlock($1::int4, $2::int4)', pair);
      }
    } finally {
      await holder.end();
    }
  });

  it('each writer holds its own from open to close; a read-only open has none', async () => {
    const a = await open();
    const b = await open();
    expect(a.instanceId).toMatch(/^-?\d+$/);
    expect(b.instanceId).not.toBe(a.instanceId);
    expect(await ownerLockHeld(a.instanceId!)).toBe(true);
    expect(await ownerLockHeld(b.instanceId!)).toBe(true);
    const r = await open({ readonly: true });
    expect(r.instanceId).toBeUndefined();
    await a.close();
    expect(await ownerLockHeld(a.instanceId!)).toBe(false);
    expect(await ownerLockHeld(b.instanceId!)).toBe(true);
  });
});

describe('markInterruptedRuns on a mirror shared by several writers', () => {
  it("leaves a live writer's run running, and never marks this writer's own", async () => {
    const a = await open();
    const b = await open();
    const id = await a.startRun(RUN);
    expect(await ownerOf(id)).toBe(a.instanceId);
    expect(await b.markInterruptedRuns()).toBe(0);
    expect(await a.markInterruptedRuns()).toBe(0);
    expect(await b.runStatus(id)).toBe('running');
    expect(await runLines(b, id)).toEqual([]);
  });

  it('marks the run of a writer closed without finishing it interrupted, with its runs change-log row, once', async () => {
    const a = await open();
    const b = await open();
    const c = await open();
    const id = await a.startRun(RUN);
    const live = await b.startRun(RUN);
    await a.close();
    expect(await b.markInterruptedRuns()).toBe(1);
    expect(await b.runStatus(id)).toBe('interrupted');
    expect(await b.runStatus(live)).toBe('running');
    expect(await runLines(b, id)).toEqual([{ op: 'insert', status: 'interrupted' }]);
    expect(await b.markInterruptedRuns()).toBe(0);
    expect(await c.markInterruptedRuns()).toBe(0);

    // Two sweeps at once mark a dead writer's run once.
    const d = await open();
    const orphan = await d.startRun(RUN);
    await d.close();
    const [n1, n2] = await Promise.all([b.markInterruptedRuns(), c.markInterruptedRuns()]);
    expect(n1 + n2).toBe(1);
    expect(await runLines(b, orphan)).toEqual([{ op: 'insert', status: 'interrupted' }]);
  });

  it('marks the runs of a writer whose lock session was lost while it is lost; the writer takes the lock again and resumes its run', async () => {
    const events: OwnerLockEvent[] = [];
    const entered = deferred();
    const gate = deferred();
    const a = await open({
      onOwnerLock: (e) => void events.push(e),
      hooks: {
        beforeOwnerRetake: async () => {
          entered.resolve();
          await gate.promise;
        },
      },
    });
    try {
      const b = await open();
      const id = await a.startRun(RUN);
      const k = BigInt.asUintN(64, BigInt(ownerLockKey(schema, a.instanceId!)));
      const holders = await pgQuery<{ pid: number }>(
        `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2`,
        [(k >> 32n).toString(), (k & 0xffffffffn).toString()],
      );
      expect(holders).toHaveLength(1);
      await pgQuery('SELECT pg_terminate_backend($1)', [holders[0]!.pid]);
      await entered.promise; // a noticed the loss and waits at the failpoint: the gap is open

      expect(events.map((e) => e.event)).toEqual(['lost']);
      expect(events[0]).toMatchObject({ error: { code: 'OWNER_LOCK_LOST' } });
      expect(await ownerLockHeld(a.instanceId!)).toBe(false);
      expect(await a.markInterruptedRuns()).toBe(0); // its own: never
      expect(await b.markInterruptedRuns()).toBe(1);
      expect(await runLines(b, id)).toEqual([{ op: 'insert', status: 'interrupted' }]);

      gate.resolve();
      await until(() => ownerLockHeld(a.instanceId!), "a's owner lock taken again");
      await until(async () => events.some((e) => e.event === 'retaken'), 'the retaken event');
      expect(events.map((e) => e.event)).toEqual(['lost', 'retaken']);
      expect(await a.resumeRun(id)).toBe('resumed');
      expect(await ownerOf(id)).toBe(a.instanceId);
      expect(await b.markInterruptedRuns()).toBe(0);
      expect(await b.runStatus(id)).toBe('running');
    } finally {
      gate.resolve(); // a failed expectation must not leave the retake (and the close) waiting
    }
  });

  it('a run resumed by another writer becomes its own, swept only once that writer is gone', async () => {
    const a = await open();
    const b = await open();
    const c = await open();
    const id = await a.startRun(RUN);
    await a.close();
    expect(await b.markInterruptedRuns()).toBe(1);
    expect(await b.resumeRun(id)).toBe('resumed');
    expect(await ownerOf(id)).toBe(b.instanceId);
    expect(await c.markInterruptedRuns()).toBe(0);
    expect(await c.runStatus(id)).toBe('running');
    await b.close();
    expect(await c.markInterruptedRuns()).toBe(1);
    expect(await runLines(c, id)).toEqual([
      { op: 'insert', status: 'interrupted' },
      { op: 'update', status: 'interrupted' },
    ]);
  });

  it('a running run whose writer is gone is taken over by the writer that takes it up (no sweep marks it); a live writer keeps its run', async () => {
    const a = await open();
    const b = await open();
    const c = await open();
    const id = await a.startRun(RUN);
    await a.close();
    expect(await b.resumeRun(id)).toBe('running');
    expect(await ownerOf(id)).toBe(b.instanceId);
    expect(await c.markInterruptedRuns()).toBe(0);
    expect(await c.runStatus(id)).toBe('running');

    const other = await c.startRun(RUN);
    expect(await b.resumeRun(other)).toBe('running');
    expect(await ownerOf(other)).toBe(c.instanceId);
  });
});

describe('a streamed read whose backend is terminated mid-stream fails with one clean error, not a crash', () => {
  const uncaught: unknown[] = [];
  const onUncaught = (err: unknown) => void uncaught.push(err);
  const total = 1200; // more than one read of the stream (1,000 rows)

  beforeAll(async () => {
    process.on('uncaughtException', onUncaught);
    const m = await PostgresMirror.open(pgUrl(schema));
    try {
      for (let p = 0; p < total / 100; p++) {
        const objs = Array.from({ length: 100 }, (_, i) => ({ id: `m${String(p * 100 + i).padStart(5, '0')}`, content: 'x', created_at: '2026-01-15T10:00:00Z' }));
        const page = { page: p + 1, data: objs, raw: objs, meta: { total_count: total, page: p + 1, per_page: 100, total_pages: total / 100 } } as unknown as Page<Message>;
        await m.commitMessagesPage('acct', 'c1', page, null);
      }
    } finally {
      await m.close();
    }
  });
  afterAll(() => void process.off('uncaughtException', onUncaught));

  /**
   * A read-only open (as `verify --deep`) with one connection: the stream gets the client the
   * open's `SELECT 1` used, which nothing has checked out before (so no earlier checkout gave it
   * an 'error' listener).
   */
  const reader = () => open({ readonly: true, poolMax: 1 });

  /** Terminates the one backend (not ours) holding a lock on the mirror's `table` (the stream's), and waits until it is gone. */
  async function terminateStreamOf(table: string): Promise<void> {
    const pids = await pgQuery<{ pid: number }>(
      `SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'relation' AND relation = to_regclass($1) AND pid <> pg_backend_pid()`,
      [`"${schema}".${table}`],
    );
    expect(pids).toHaveLength(1);
    await pgQuery('SELECT pg_terminate_backend($1)', [pids[0]!.pid]);
    await until(async () => (await pgQuery('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pids[0]!.pid])).length === 0, 'the backend gone');
  }

  /** Reads `it` to its end; how many items it gave. */
  async function drain(it: AsyncIterator<unknown>): Promise<number> {
    let n = 0;
    while (!(await it.next()).done) n++;
    return n;
  }

  /** What reading `it` to its end rejects with. */
  const failureOf = (it: AsyncIterator<unknown>) =>
    drain(it).then(
      (n) => new Error(`read ${n} more`),
      (e: unknown) => e,
    );

  it('verify --deep reads (streamRows): a read after the loss, or a reader that stops after it', async () => {
    const m = await reader();
    const it = m.auditRecords('messages')[Symbol.asyncIterator]();
    expect((await it.next()).done).toBe(false);
    await terminateStreamOf('messages');
    const err = await failureOf(it);
    expect(err).toMatchObject({ code: 'DB_UNREACHABLE' });
    expect((err as Error).message).toMatch(/^CONVO_MIRROR_DB \(.*\): the connection was lost/);
    // The mirror goes on with a new connection.
    expect(await drain(m.auditRecords('messages')[Symbol.asyncIterator]())).toBe(total);

    // A reader that stops after the loss is not left waiting for the cursor's close.
    const again = m.auditRecords('messages')[Symbol.asyncIterator]();
    expect((await again.next()).done).toBe(false);
    await terminateStreamOf('messages');
    await pgQuery('SELECT 1');
    await again.return!(undefined);
    expect(await drain(m.auditRecords('messages')[Symbol.asyncIterator]())).toBe(total);
    expect(uncaught).toEqual([]);
  });

  it("the exporter's reads (chunksBetween)", async () => {
    const m = await reader();
    const it = m.changeChunksOf({ first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER })[Symbol.asyncIterator]();
    expect((await it.next()).done).toBe(false);
    await terminateStreamOf('change_log');
    const err = await failureOf(it);
    expect(err).toMatchObject({ code: 'DB_UNREACHABLE' });
    expect((err as Error).message).toMatch(/^CONVO_MIRROR_DB \(.*\): the connection was lost/);
    let rows = 0;
    for await (const chunk of m.changeChunksOf({ first_seq: 1, last_seq: Number.MAX_SAFE_INTEGER })) rows += chunk.length;
    expect(rows).toBe((await m.counts()).change_log);
    expect(rows).toBeGreaterThan(total);
    await pgQuery('SELECT 1');
    expect(uncaught).toEqual([]);
  });
});
