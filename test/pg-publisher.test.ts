/**
 * Exactly-once publication across processes on PostgreSQL (issue 25 item 4): one publisher at a
 * time (the publisher lock), and a publisher that stalls past losing its lock (a GC pause, a frozen
 * VM: here a failpoint that waits while the test ends the lock's session) publishes nothing when it
 * wakes: the ledger head moves only by compare-and-set, and the head, witness line and manifest are
 * written only after the mirror recorded the batch. The chain stays linear and `verify` passes.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { publishChanges, type ExportResult } from '../src/export/exporter.js';
import { PUBLISH_LINES_CHECK_MS, Publisher } from '../src/export/publisher.js';
import { verifyArchive } from '../src/export/verify.js';
import { witnessFile } from '../src/export/witness.js';
import type { LedgerHead } from '../src/store/mirror.js';
import { PostgresMirror } from '../src/store/postgres/mirror.js';
import { publisherLockKey } from '../src/store/postgres/publisher-lock.js';
import { testClock } from './clock.js';
import { dropSchema, pgQuery, pgUrl, randomSchema, until } from './pg.js';

const ACCOUNT = 'acct-1';
const schemas: string[] = [];
const dirs: string[] = [];
let open: PostgresMirror[] = [];

function page<T>(objs: Record<string, unknown>[]): Page<T> {
  return { page: 1, data: objs as T[], raw: objs, meta: { total_count: objs.length, page: 1, per_page: 100, total_pages: 1 } } as unknown as Page<T>;
}

/** Mirrors conversation `c` with messages `ids` (new content each call, so each call changes something). */
async function change(m: PostgresMirror, c: string, ids: string[], content: string): Promise<void> {
  await m.upsertConversations(ACCOUNT, page<Conversation>([{ id: c, status: 'open', updated_at: '2026-11-27T00:00:00Z', message_count: ids.length }]), null);
  await m.commitMessagesPage(ACCOUNT, c, page<Message>(ids.map((id) => ({ id, content, visibility: 'public', sender: { id: 'u1', name: 'Ann', type: 'agent' }, created_at: '2026-11-27T00:00:00Z' }))), null);
}

/** The backend pid holding the mirror's publisher lock, if any. */
async function publisherPid(schema: string): Promise<number | undefined> {
  const key = BigInt(publisherLockKey(schema));
  const u = BigInt.asUintN(64, key);
  const rows = await pgQuery<{ pid: number }>(
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
    [String(u >> 32n), String(u & 0xffffffffn)],
  );
  return rows[0]?.pid;
}

/** The ledger entries' chain: each record's prev is the one before it. */
function assertLinear(entries: { batch_id: number; hash: string; prev_hash: string | null }[]): void {
  entries.forEach((e, i) => expect(e.prev_hash, `record ${e.batch_id}`).toBe(i === 0 ? null : entries[i - 1]!.hash));
}

beforeEach(() => {
  open = [];
});
afterEach(async () => {
  await Promise.allSettled(open.map((m) => m.close()));
});
afterAll(async () => {
  for (const s of schemas) await dropSchema(s);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

async function twoPublishers(): Promise<{ a: PostgresMirror; b: PostgresMirror; schema: string; exportDir: string; witnessDir: string }> {
  const schema = randomSchema('pub');
  schemas.push(schema);
  const clock = testClock({ start: Date.UTC(2026, 10, 27, 1) });
  const a = await PostgresMirror.open(pgUrl(schema), { clock });
  const b = await PostgresMirror.open(pgUrl(schema), { clock });
  open.push(a, b);
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'cm-pg-pub-'));
  dirs.push(root);
  const witnessDir = path.join(root, 'witness');
  fs.mkdirSync(witnessDir);
  return { a, b, schema, exportDir: path.join(root, 'exports'), witnessDir };
}

describe('the publisher lock and the fenced head (PostgreSQL)', () => {
  it('one publisher at a time: while one holds the lock, another waits, then publishes nothing twice', async () => {
    const { a, b, exportDir } = await twoPublishers();
    await change(a, 'c1', ['m1', 'm2'], 'hello');
    const held = (await a.tryPublisherLock())!;
    expect(held).toBeDefined();
    expect(await b.tryPublisherLock()).toBeUndefined();
    // B gives up after its wait: nothing published, the changes stay for the next publication.
    const busy = await publishChanges(b, { exportDir, publisherWaitMs: 0 });
    expect(busy.busy).toBe('busy');
    expect(busy.files).toEqual([]);
    expect(await b.unexportedChanges()).toBeGreaterThan(0);
    await held.release();
    const res = await publishChanges(b, { exportDir });
    expect(res.busy).toBeUndefined();
    expect(res.head?.batch_id).toBe(1);
    expect((await publishChanges(a, { exportDir })).files).toEqual([]);
    assertLinear(await a.ledgerEntries());
  });

  it("a run's progressive publication never waits for another process' publication: it leaves its changes to it", async () => {
    const { a, b, exportDir } = await twoPublishers();
    const clock = testClock({ start: Date.UTC(2026, 10, 27, 1) });
    const publisher = new Publisher(b, { exportDir, publishLines: 5 }, { clock, runId: null });
    await change(b, 'c1', ['m1', 'm2', 'm3', 'm4', 'm5', 'm6'], 'hello');
    clock.t += PUBLISH_LINES_CHECK_MS;
    const held = (await a.tryPublisherLock())!;
    // Due (7 changes wait), but A publishes: B returns at once, without a single poll.
    const busy = await publisher.maybePublish();
    expect(busy?.busy).toBe('busy');
    expect(clock.sleeps).toEqual([]);
    expect(await b.unexportedChanges()).toBe(7);
    await held.release();
    // Not due again before the next count, then due.
    expect(await publisher.maybePublish()).toBeUndefined();
    clock.t += PUBLISH_LINES_CHECK_MS;
    expect((await publisher.maybePublish())?.lines).toBe(7);
    expect(await b.unexportedChanges()).toBe(0);
  });

  for (const point of ['before-ledger', 'before-record'] as const) {
    it(`a publisher paused at ${point} after losing its lock publishes nothing when it wakes; the chain stays linear and verify passes`, async () => {
      const { a, b, schema, exportDir, witnessDir } = await twoPublishers();
      await change(a, 'c1', ['m1', 'm2'], 'first');
      await publishChanges(a, { exportDir, witnessDir });
      await change(a, 'c1', ['m1', 'm2', 'm3'], 'second');

      let wake!: () => void;
      const asleep = new Promise<void>((resolve) => (wake = resolve));
      let paused = false;
      const stalled: Promise<ExportResult> = publishChanges(a, {
        exportDir,
        witnessDir,
        failpoint: async (p) => {
          if (p !== point) return;
          paused = true;
          await asleep; // the stall: the lock's session ends meanwhile
        },
      });
      await until(async () => paused, `publisher A reaching ${point}`);
      const pid = await publisherPid(schema);
      expect(pid).toBeDefined();
      await pgQuery('SELECT pg_terminate_backend($1)', [pid]);
      await until(async () => (await publisherPid(schema)) === undefined, 'the lock released with its session');

      // B takes over: publishes the batch A had planned, then one more.
      const manifest = path.join(exportDir, 'manifest.json');
      const first = await publishChanges(b, { exportDir, witnessDir });
      expect(first.resumed).toBe(true);
      await change(b, 'c2', ['n1'], 'third');
      const second = await publishChanges(b, { exportDir, witnessDir });
      const headAfterB: LedgerHead = second.head!;
      expect(headAfterB.batch_id).toBe(3);
      const manifestAfterB = fs.readFileSync(manifest);
      const entriesAfterB = await b.ledgerEntries();

      wake();
      const woke = await stalled;
      expect(woke.busy).toBe('fenced');
      expect(woke.files).toEqual([]);
      // Nothing moved: the head, the ledger, the manifest, the witness; the chain is linear.
      expect(await a.ledgerHead()).toEqual(headAfterB);
      expect(await a.ledgerEntries()).toEqual(entriesAfterB);
      assertLinear(entriesAfterB);
      expect(entriesAfterB.map((e) => e.batch_id)).toEqual([1, 2, 3]);
      expect(fs.readFileSync(manifest).equals(manifestAfterB)).toBe(true);
      expect(fs.readdirSync(path.join(exportDir, '_ledger')).sort()).toEqual(['000000000001.json', '000000000002.json', '000000000003.json']);
      const witnessed = fs.readFileSync(witnessFile(witnessDir, await a.mirrorId()), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as { head: LedgerHead | null });
      expect(witnessed.map((w) => w.head?.batch_id)).toEqual([1, 2, 3]);
      // Every seq exported once.
      const seqs: number[] = [];
      for (const f of await a.publishedFiles()) {
        for (const line of fs.readFileSync(path.join(exportDir, f.path), 'utf8').split('\n').filter(Boolean)) seqs.push((JSON.parse(line) as { seq: number }).seq);
      }
      expect([...seqs].sort((x, y) => x - y)).toEqual(Array.from({ length: seqs.length }, (_, i) => i + 1));
      const report = await verifyArchive({ exportDir, mirror: a, witnessDir, deep: true });
      expect(report.problems).toEqual([]);
    });
  }
});
