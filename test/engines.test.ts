/**
 * The engine fixtures of the conformance suite (test/engines.ts) themselves: a target given back
 * at cleanup and handed out again (a PostgreSQL schema emptied for the next test) is a mirror as
 * fresh as a new one: nothing of the earlier test reads back, and ids, seqs and the chain start over.
 */
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { publishChanges } from '../src/export/exporter.js';
import type { Mirror } from '../src/store/mirror.js';
import { engines } from './engines.js';
import type { Clock } from '../src/clock.js';
import { ACCOUNT_ID, tempDir, testClock } from './helpers.js';
import { changeRows, records } from './mirror-reads.js';

const msg = (id: string) => ({ id, content: `text of ${id}`, visibility: 'public', sender: { id: 'u1', name: 'Ana', type: 'agent' }, created_at: '2026-01-01T00:00:00Z' });
const messages = (ids: string[]): Page<Message> => {
  const objs = ids.map(msg);
  return { page: 1, data: objs as unknown as Message[], raw: objs, meta: { current_page: 1, total_pages: 1, total_count: ids.length } };
};
const conversations = (ids: string[]): Page<Conversation> => {
  const objs = ids.map((id) => ({ id }));
  return { page: 1, data: objs as unknown as Conversation[], raw: objs, meta: { current_page: 1, total_pages: 1, total_count: ids.length } };
};

/** What a test can read of a mirror as a whole (its id aside). */
async function state(m: Mirror) {
  return {
    counts: await m.counts(),
    changes: await changeRows(m),
    messages: await records(m, 'messages'),
    conversations: await records(m, 'conversations'),
    runs: await m.lastRuns(10),
    ledger: await m.ledgerEntries(),
    head: await m.ledgerHead(),
    files: await m.publishedFiles(),
    pending: await m.pendingExportBatch(),
    watermark: await m.exportWatermark(),
    listOrder: await m.listOrder(ACCOUNT_ID),
    checkpoint: await m.loadCheckpoint(ACCOUNT_ID, 'c2'),
    quickCheck: await m.quickCheck(),
  };
}

/** Writes a bit of everything: runs, pages, a checkpoint, a publication, a list order. */
async function use(m: Mirror, clock?: Clock): Promise<void> {
  const run = await m.startRun({ scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: ACCOUNT_ID });
  await m.upsertConversations(ACCOUNT_ID, conversations(['c1', 'c2']), run);
  await m.commitMessagesPage(ACCOUNT_ID, 'c1', messages(['m1', 'm2']), run);
  await m.completeCrawl(ACCOUNT_ID, 'c1', run);
  await m.commitMessagesPage(ACCOUNT_ID, 'c2', messages(['m3']), run);
  await m.recordFailures(run, [{ id: 'c2', code: 'HTTP_ERROR', status: 503, attempts: 3, message: 'boom' }]);
  await m.finishRun(run, { status: 'partial' });
  await m.recordListOrder(ACCOUNT_ID, { field: 'updated_at', ordered: true, newest: null, at: '2026-01-01T00:00:00.000Z' });
  await publishChanges(m, { exportDir: path.join(tempDir(), 'exports'), ...(clock ? { clock } : {}) });
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  let used: { target: string; id: string } | undefined;

  it('a target used by a test, written to and published from', async () => {
    const target = engine.target();
    const m = await engine.open({}, target);
    await use(m);
    expect((await state(m)).counts.change_log).toBeGreaterThan(0);
    used = { target, id: await m.mirrorId() };
  });

  it('is, handed out again after cleanup, as fresh as a new mirror: the same state, its own id, ids and seqs from 1', async () => {
    expect(used).toBeDefined();
    const again = engine.target();
    // PostgreSQL reuses the schema the last test gave back; SQLite makes a new file.
    if (engine.name === 'postgres') expect(again).toBe(used!.target);
    else expect(again).not.toBe(used!.target);
    const clock = testClock({ start: Date.UTC(2026, 0, 15, 12) });
    const reused = await engine.open({ clock }, again);
    const fresh = await engine.open({ clock }, engine.absentTarget());
    expect(await state(reused)).toEqual(await state(fresh));
    expect(await reused.mirrorId()).not.toBe(used!.id);
    // Ids and seqs start over: the same writes give the same rows.
    await use(reused, clock);
    await use(fresh, clock);
    const a = await state(reused);
    const b = await state(fresh);
    // Apart from what holds the mirror's own id (the ledger's hashes) and PostgreSQL's writer instance (a run's owner).
    const stable = (s: typeof a) => ({ ...s, runs: s.runs.map(({ owner: _o, ...r }) => r), ledger: s.ledger.map((e) => ({ ...e, hash: '', prev_hash: '' })), head: s.head?.batch_id });
    expect(stable(a)).toEqual(stable(b));
    expect(a.runs.map((r) => r['id'])).toEqual([1]);
    expect(a.changes[0]!.seq).toBe(1);
  });
});
