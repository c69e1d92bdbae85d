/**
 * Publication during and after a run: progressive batches during a long run (never splitting a
 * transaction, exactly-once), the runs stream (one line per finished run, its figures, failures and
 * the chain head), and the chain head a run leaves in `runs` and its summary. Real HTTP to the fake,
 * each engine of the store (the conformance suite: test/engines.ts) and real files; time is an
 * injected clock.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { verifyArchive } from '../src/export/verify.js';
import { testClock, type TestClock } from './clock.js';
import { sqlAll, sqlValue } from './sql.js';
import { engines } from './engines.js';
import { changeRows, runRow } from './mirror-reads.js';
import { ACCOUNT_ID, harnessPool, readExportLines, tempDir, type Harness, type HarnessOptions } from './helpers.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { publishChanges } from '../src/export/exporter.js';
import type { Message, Page } from '../src/api/schemas.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

/**
 * A clock that moves 1 ms at every reading (and by every sleep): each write transaction of the
 * mirror reads it once, so rows share a `synced_at` exactly when one transaction wrote them.
 */
function tickingClock(): TestClock {
  const c = testClock({ start: Date.UTC(2026, 0, 15, 12), sleep: 'advance' });
  return Object.assign(c, { now: () => ++c.t });
}

const msgPath = (id: string) => `/v1/conversations/${id}/messages`;

/** The published batches, by id, with their seq ranges (from the files recorded: every seq of a batch is in one of its files). */
async function batchesOf(m: Mirror): Promise<{ id: number; first_seq: number; last_seq: number }[]> {
  const out = new Map<number, { id: number; first_seq: number; last_seq: number }>();
  for (const f of await m.publishedFiles()) {
    const b = out.get(f.batch_id);
    out.set(f.batch_id, { id: f.batch_id, first_seq: Math.min(b?.first_seq ?? Infinity, f.first_seq), last_seq: Math.max(b?.last_seq ?? 0, f.last_seq) });
  }
  return [...out.values()].sort((a, b) => a.id - b.id);
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  describe('progressive publication', () => {
    it('a long run publishes every publishIntervalMs, each batch whole transactions only, every line exactly once', async () => {
      const ws = FakeWorkspace.fromCounts([250, 420, 130, 5, 310, 60]);
      const h = await start({ workspace: ws, clock: tickingClock() });
      const s = await h.sync({ publishIntervalMs: 40, concurrency: 2 });
      expect(s.status).toBe('succeeded');
      const batches = await batchesOf(h.mirror);
      // several batches during the run, then the end's, then the run's own line
      expect(batches.length).toBeGreaterThanOrEqual(4);
      // SQLite only: the run each batch was planned by (no method returns a batch's run).
      if (engine.name === 'sqlite') expect(sqlAll<{ run_id: number | null }>(h.mirror, `SELECT run_id FROM export_batches`).every((b) => b.run_id === s.runId)).toBe(true);
      // contiguous ranges: every seq in exactly one batch
      batches.forEach((b, i) => expect(b.first_seq).toBe(i === 0 ? 1 : batches[i - 1]!.last_seq + 1));
      // no batch boundary splits a transaction (rows of one transaction share their synced_at)
      const syncedAt = new Map((await changeRows(h.mirror)).map((c) => [c.seq, c.synced_at]));
      const at = (seq: number) => syncedAt.get(seq)!;
      for (const b of batches.slice(0, -1)) expect(at(b.last_seq), `batch ${b.id} ends inside a transaction`).not.toBe(at(b.last_seq + 1));
      // exactly once, and the archive replays to the mirror
      const seqs = (['messages', 'conversations', 'runs'] as const).flatMap((st) => readExportLines(h.exportDir, st).map((l) => l.seq)).sort((a, b) => a - b);
      expect(seqs).toEqual([...Array(seqs.length).keys()].map((i) => i + 1));
      const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
      expect(report.problems).toEqual([]);
      expect(report.records).toBe(batches.length);
    });

    it('a long run publishes as soon as publishLines changes wait: bounded batches of whole transactions, every line exactly once', async () => {
      const ws = FakeWorkspace.fromCounts([250, 420, 130, 5, 310, 60]);
      // 500 ms a reading: the count is read at most once a (clock) second, so every other reading
      // at most (each write transaction reads the clock once: its rows share their synced_at).
      const c = testClock({ start: Date.UTC(2026, 0, 15, 12), sleep: 'advance' });
      const h = await start({ workspace: ws, clock: Object.assign(c, { now: () => (c.t += 500) }) });
      const s = await h.sync({ publishLines: 200, concurrency: 2 });
      expect(s.status).toBe('succeeded');
      const batches = await batchesOf(h.mirror);
      const sizes = batches.map((b) => b.last_seq - b.first_seq + 1);
      // 1,181 changes (6 conversations, 1,175 messages) and the run's line: at least three batches
      // went out during the run, each once 200 or more waited; the end published the rest.
      expect(sizes.reduce((a, b) => a + b, 0)).toBe(6 + 1175 + 1);
      // The summary counts every line the run published, not only its end's (the run line comes after).
      expect(s.export.lines).toBe(6 + 1175);
      expect(s.export.files).toBeGreaterThan(batches.length - 1);
      expect(sizes.filter((n) => n >= 200).length, `batch sizes ${sizes.join(', ')}`).toBeGreaterThanOrEqual(3);
      batches.forEach((b, i) => expect(b.first_seq).toBe(i === 0 ? 1 : batches[i - 1]!.last_seq + 1));
      const syncedAt = new Map((await changeRows(h.mirror)).map((r) => [r.seq, r.synced_at]));
      for (const b of batches.slice(0, -1)) expect(syncedAt.get(b.last_seq), `batch ${b.id} ends inside a transaction`).not.toBe(syncedAt.get(b.last_seq + 1));
      const report = await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true });
      expect(report.problems).toEqual([]);
      expect(report.records).toBe(batches.length);
    });

    it('without publishIntervalMs a run publishes its changes once, at the end, then its own line', async () => {
      const ws = FakeWorkspace.fromCounts([250, 420, 130]);
      const h = await start({ workspace: ws, clock: tickingClock() });
      const s = await h.sync();
      expect(await batchesOf(h.mirror)).toHaveLength(2);
      expect(await h.mirror.pendingExportBatch()).toBeUndefined();
      expect(s.export.lines).toBe(3 + 800);
    });
  });

  describe('the runs stream', () => {
    it('one line per finished run: what it did, its failures by conversation and code, and the chain head after its changes', async () => {
      const ws = FakeWorkspace.fromCounts([3, 40, 7]);
      const h = await start({ workspace: ws, client: { maxRetries: 1 } });
      const first = await h.sync();
      const bad = ws.list()[1]!;
      h.fake.injectFault({ kind: 'status', status: 503, match: { path: msgPath(bad.id) }, times: Infinity });
      ws.appendMessages(ws.list()[0]!.id, 2);
      const second = await h.sync({ full: true });
      expect(second.status).toBe('partial');

      const lines = readExportLines(h.exportDir, 'runs') as unknown as Record<string, unknown>[];
      expect(lines.map((l) => [l['id'], l['op'], l['status'], l['scope'], l['refresh'], l['trigger']])).toEqual([
        [String(first.runId), 'insert', 'succeeded', 'workspace', 'incremental', 'cli'],
        [String(second.runId), 'insert', 'partial', 'workspace', 'full', 'cli'],
      ]);
      const line = lines[1]!;
      expect(line['account_id']).toBe(ACCOUNT_ID);
      expect(line['failures']).toEqual([{ conversation_id: bad.id, code: 'HTTP_ERROR', status: 503, attempts: 2 }]);
      expect(line).toMatchObject({
        requests: second.requests,
        retries: second.retries,
        rate_limited: second.rateLimited,
        conversations: { listed: 3, synced: 2, failed: 1 },
        messages: { served: second.messages.served, inserted: 2 },
        export: { files: second.export.files, lines: second.export.lines },
      });
      // the head after the run's changes: the batch before the one holding this line
      const holding = (await h.mirror.publishedFiles()).find((f) => f.stream === 'runs' && f.first_seq === line['seq'])!.batch_id;
      const before = (await h.mirror.ledgerEntries()).find((e) => e.batch_id === holding - 1)!;
      expect(line['ledger_head']).toEqual({ batch_id: before.batch_id, hash: before.hash });
      // the summary and runs carry the head after everything the run published, its own line included
      const head = (await h.mirror.ledgerHead())!;
      expect(head.batch_id).toBe(holding);
      expect(second.export.head).toEqual(head);
      expect(await runRow(h.mirror, second.runId)).toMatchObject({ ledger_batch_id: head.batch_id, ledger_hash: head.hash });
      expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
    });

    it('a run left running by a dead process gets its line (interrupted) when the next process sweeps it, published by the next run', async () => {
      const ws = FakeWorkspace.fromCounts([4]);
      const h = await start({ workspace: ws });
      // The dead process: another writer of the mirror that started a run and went away.
      const gone = await engine.open({ lock: false }, h.dbPath);
      const dead = await gone.startRun({ scope: 'workspace', refresh: 'incremental', trigger: 'schedule', accountId: ACCOUNT_ID });
      await gone.close();
      expect(await h.mirror.markInterruptedRuns()).toBe(1);
      await h.sync();
      const lines = readExportLines(h.exportDir, 'runs') as unknown as Record<string, unknown>[];
      expect(lines.map((l) => [l['id'], l['status'], l['trigger']])).toEqual([
        [String(dead), 'interrupted', 'schedule'],
        [String(dead + 1), 'succeeded', 'cli'],
      ]);
      expect(fs.readdirSync(path.join(h.exportDir, 'runs', `account=${ACCOUNT_ID}`))).toHaveLength(1);
    });
  });

});

// SQLite only: the file's `PRAGMA synchronous` (PostgreSQL's synchronous_commit: test/pg-mirror.test.ts).
describe('group commit and the durable sync point', () => {
  it('pages commit with synchronous=NORMAL; every batch plan commits with FULL before any file of it is written', async () => {
    const events: string[] = [];
    const dir = tempDir();
    const mirror = await openMirror(path.join(dir, 'mirror.sqlite'), { onPlanCommit: (sync) => events.push(`plan synchronous=${sync}`) });
    try {
      expect(sqlValue(mirror, `PRAGMA synchronous`)).toBe(1);
      const exportDir = path.join(dir, 'exports');
      const failpoint = (point: string) => {
        if (point === 'before-rename') events.push('file');
      };
      const page = (conv: string, n: number): Page<Message> => {
        const data = Array.from({ length: n }, (_, i) => ({ id: `${conv}-m${i}`, content: 'hi', visibility: 'global', sender: { id: 'u', name: 'U', type: 'Customer' }, created_at: '2026-01-15T10:00:00Z' }));
        return { page: 1, data: data as Message[], raw: data, meta: { current_page: 1, total_pages: 1, total_count: n } };
      };
      for (const conv of ['c1', 'c2']) {
        await mirror.commitMessagesPage(ACCOUNT_ID, conv, page(conv, 3), null);
        expect(sqlValue(mirror, `PRAGMA synchronous`)).toBe(1);
        await publishChanges(mirror, { exportDir, failpoint });
        expect(sqlValue(mirror, `PRAGMA synchronous`)).toBe(1);
      }
      // A publication interrupted after its plan: the next call resumes the same batch.
      await mirror.commitMessagesPage(ACCOUNT_ID, 'c3', page('c3', 2), null);
      class Crash extends Error {}
      await expect(publishChanges(mirror, { exportDir, failpoint: (p) => { events.push(`crash at ${p}`); throw new Crash(); } })).rejects.toThrow(Crash);
      expect(sqlValue(mirror, `PRAGMA synchronous`)).toBe(1);
      await publishChanges(mirror, { exportDir, failpoint });
      const plans = events.filter((e) => e.startsWith('plan'));
      // 2 batches, the interrupted 3rd, its resumption, and the resumption's look for more (nothing)
      expect(plans.length).toBe(5);
      expect(new Set(plans)).toEqual(new Set(['plan synchronous=2']));
      // Every file comes after a durable plan: none before the first, and each batch's files after its own plan.
      expect(events[0]).toBe('plan synchronous=2');
      expect(events.join(' | ')).toMatch(/^plan synchronous=2( \| (plan synchronous=2|file|crash at before-rename))*$/);
      expect(events.filter((e) => e === 'file').length).toBeGreaterThanOrEqual(3);
    } finally {
      await mirror.close();
    }
  });
});
