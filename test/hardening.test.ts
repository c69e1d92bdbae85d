/**
 * Issue 8, the sync's side of "nothing lost": a 404 is evidence, not proof, of a deletion; a
 * conversation that comes back after a tombstone is crawled in full; a run stopped early (401, a
 * full or damaged mirror) still says what it committed. Real fake API over HTTP, real SQLite in
 * temp dirs, real export files; nothing of ours is mocked.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { AuthError, MirrorUnusableError, RunError } from '../src/errors.js';
import type { RunSummary } from '../src/run/index.js';
import { ACCOUNT_ID, harnessPool, mirrorEqualsFake, readExportLines, replay, type Harness, type HarnessOptions } from './helpers.js';
import { sqlAll, sqlGet, sqlRun, sqlValue } from './sql.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());
const start = (opts: HarnessOptions): Promise<Harness> => pool.start(opts);

const msgPath = (id: string): string => `/v1/conversations/${id}/messages`;

function expectExact(h: Harness): void {
  const eq = mirrorEqualsFake(h.mirror, h.fake.workspace);
  expect(eq.ok, eq.detail).toBe(true);
}

/** Live messages and the tombstone of one conversation in the mirror. */
function rowsOf(h: Harness, id: string): { liveMessages: number; deadMessages: number; conversationDeleted: boolean } {
  const m = sqlGet<{ live: number | null; dead: number | null }>(
    h.mirror,
    `SELECT sum(deleted_at IS NULL) AS live, sum(deleted_at IS NOT NULL) AS dead FROM messages WHERE account_id = ? AND conversation_id = ?`,
    ACCOUNT_ID,
    id,
  )!;
  const c = sqlGet<{ deleted_at: string | null }>(h.mirror, `SELECT deleted_at FROM conversations WHERE account_id = ? AND id = ?`, ACCOUNT_ID, id);
  return { liveMessages: m.live ?? 0, deadMessages: m.dead ?? 0, conversationDeleted: c?.deleted_at != null };
}

/** The exports replayed equal the mirror's live messages (no line lost, none duplicated). */
async function expectExportsReplayToMirror(h: Harness): Promise<void> {
  const lines = readExportLines(h.exportDir, 'messages');
  expect(new Set(lines.map((l) => l.seq)).size).toBe(lines.length);
  const live = replay(lines, 'messages');
  expect(live.size).toBe((await h.mirror.counts()).messages);
}

async function rejected(p: Promise<RunSummary>): Promise<RunError<RunSummary>> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RunError);
  return err as RunError<RunSummary>;
}

describe('a 404 is not proof of a deletion', () => {
  it('listed conversations answering 404 fail, keep every row, and the next incremental sync asks them again', async () => {
    const ws = FakeWorkspace.fromCounts([120, 3, 40, 7, 250]);
    const h = await start({ workspace: ws });
    expect((await h.sync()).status).toBe('succeeded');
    const flaky = [ws.list()[0]!.id, ws.list()[2]!.id, ws.list()[4]!.id];
    for (const id of flaky) h.fake.injectFault({ kind: 'status', status: 404, match: { path: msgPath(id) }, times: Infinity });

    const s = await h.sync({ full: true });
    expect(s.status).toBe('partial');
    expect(s.listConfirmed).toBe(true);
    expect(s.conversations.deleted).toBe(0);
    expect(s.messages.deleted).toBe(0);
    expect(s.failures.map((f) => f.id).sort()).toEqual([...flaky].sort());
    expect(new Set(s.failures.map((f) => f.code))).toEqual(new Set(['LISTED_BUT_NOT_FOUND']));
    for (const id of flaky) {
      expect(rowsOf(h, id)).toEqual({ liveMessages: ws.get(id)!.messages.length, deadMessages: 0, conversationDeleted: false });
    }
    expect(readExportLines(h.exportDir, 'messages').filter((l) => l.op === 'delete')).toEqual([]);
    expect(readExportLines(h.exportDir, 'conversations').filter((l) => l.op === 'delete')).toEqual([]);
    const recorded = sqlAll<{ conversation_id: string; code: string }>(h.mirror, `SELECT conversation_id, code FROM run_failures WHERE run_id = ?`, s.runId);
    expect(recorded.map((r) => r.conversation_id).sort()).toEqual([...flaky].sort());

    // Disarmed: a plain incremental sync asks each failed conversation again (whatever its change
    // signal says) and leaves the mirror exact.
    h.fake.clearFaults();
    const before = h.fake.requests.length;
    const s3 = await h.sync();
    expect(s3.status).toBe('succeeded');
    for (const id of flaky) expect(h.fake.requests.slice(before).some((r) => r.path === msgPath(id) && r.status === 200)).toBe(true);
    expectExact(h);
    await expectExportsReplayToMirror(h);
  });

  it('a conversation gone from the complete listing and answering 404 is tombstoned', async () => {
    const ws = FakeWorkspace.fromCounts([5, 6, 7]);
    const h = await start({ workspace: ws });
    await h.sync();
    const gone = ws.list()[1]!.id;
    ws.deleteConversation(gone);
    const s = await h.sync();
    expect(s.status).toBe('succeeded');
    expect(s.conversations.deleted).toBe(1);
    expect(rowsOf(h, gone)).toEqual({ liveMessages: 0, deadMessages: 6, conversationDeleted: true });
    expectExact(h);
  });

  it('a named conversation answering 404 is a failure, never a tombstone', async () => {
    const ws = FakeWorkspace.fromCounts([5, 6]);
    const h = await start({ workspace: ws });
    await h.sync();
    const id = ws.list()[0]!.id;
    h.fake.injectFault({ kind: 'status', status: 404, match: { path: msgPath(id) }, times: Infinity });
    const s = await h.sync({ conversationIds: [id] });
    expect(s.status).toBe('partial');
    expect(s.failures.map((f) => [f.id, f.code])).toEqual([[id, 'LISTED_BUT_NOT_FOUND']]);
    expect(rowsOf(h, id)).toEqual({ liveMessages: 5, deadMessages: 0, conversationDeleted: false });
  });

  it('a listing that failed part-way tombstones nothing, not even what its first page no longer shows', async () => {
    const ws = FakeWorkspace.fromCounts(Array(150).fill(2));
    const h = await start({ workspace: ws });
    await h.sync();
    // The last conversation is deleted: it answers 404, and it was on page 2, not page 1.
    const gone = ws.list()[149]!.id;
    ws.deleteConversation(gone);
    // Page 1 answers, page 2 never does: the pass is partial, so its absence proves nothing.
    h.fake.injectFault({ kind: 'status', status: 400, match: { path: '/v1/conversations', page: 2 }, times: Infinity });
    const s = await h.sync({ full: true });
    expect(s.listConfirmed).toBe(false);
    expect(h.fake.requests.some((r) => r.path === '/v1/conversations' && r.query['page'] === '1' && r.status === 200)).toBe(true);
    expect(s.conversations.deleted).toBe(0);
    expect(rowsOf(h, gone)).toEqual({ liveMessages: 2, deadMessages: 0, conversationDeleted: false });
  });
});

describe('a conversation that comes back after a tombstone', () => {
  it('gets a full crawl on the next incremental sync, whatever its change signal says', async () => {
    const ws = FakeWorkspace.fromCounts([150, 4, 9]);
    const h = await start({ workspace: ws });
    await h.sync();
    const back = ws.list()[0]!;
    ws.deleteConversation(back.id);
    expect((await h.sync()).conversations.deleted).toBe(1);
    expect(rowsOf(h, back.id)).toEqual({ liveMessages: 0, deadMessages: 150, conversationDeleted: true });

    // It comes back exactly as it was: same id, same messages, same last_activity_at (the change
    // signal the tombstoned row still remembers).
    ws.restoreConversation(back, 'back');
    const before = h.fake.requests.length;
    const s = await h.sync();
    expect(s.status).toBe('succeeded');
    expect(h.fake.requests.slice(before).filter((r) => r.path === msgPath(back.id)).map((r) => Number(r.query['page']))).toEqual([1, 2]);
    expect(rowsOf(h, back.id)).toEqual({ liveMessages: 150, deadMessages: 0, conversationDeleted: false });
    expectExact(h);
    await expectExportsReplayToMirror(h);
  });

  it('named by id, it is revived with its messages', async () => {
    const ws = FakeWorkspace.fromCounts([3, 4]);
    const h = await start({ workspace: ws });
    await h.sync();
    const back = ws.list()[1]!;
    ws.deleteConversation(back.id);
    await h.sync();
    ws.restoreConversation(back);
    const s = await h.sync({ conversationIds: [back.id] });
    expect(s.status).toBe('succeeded');
    expect(rowsOf(h, back.id)).toEqual({ liveMessages: 4, deadMessages: 0, conversationDeleted: false });
    const convLines = replay(readExportLines(h.exportDir, 'conversations'), 'conversations');
    expect(convLines.has(`${ACCOUNT_ID}/${back.id}`)).toBe(true);
  });
});

describe('a run stopped early still tells what it committed', () => {
  it('a 401 in the middle of a run: the summary counts the conversations and messages committed before it', async () => {
    const ws = FakeWorkspace.fromCounts(Array(12).fill(30));
    const h = await start({ workspace: ws, client: {} });
    let served = 0;
    h.fake.beforeServe((req) => {
      if (req.path.endsWith('/messages') && ++served === 6) {
        h.fake.injectFault({ kind: 'status', status: 401, times: Infinity });
      }
    });
    const err = await rejected(h.sync({ concurrency: 1 }));
    expect(err.cause).toBeInstanceOf(AuthError);
    const s = err.summary;
    expect(s.status).toBe('failed');
    expect(s.conversations.synced).toBe(5);
    expect(s.messages.inserted).toBe(150);
    expect(s.conversations.notSynced).toBeGreaterThan(0);
    expect(s.export.lines).toBeGreaterThanOrEqual(150);
    const run = sqlGet(h.mirror, `SELECT status, conversations_synced, messages_inserted FROM runs WHERE id = ?`, s.runId);
    expect(run).toEqual({ status: 'failed', conversations_synced: 5, messages_inserted: 150 });
  });

  it('a full mirror stops the run at once with the summary and a MirrorUnusableError, not per-conversation failures', async () => {
    const ws = FakeWorkspace.fromCounts(Array(6).fill(20));
    const h = await start({ workspace: ws });
    await h.sync();
    for (const c of ws.list()) ws.appendMessages(c.id, 400);
    // SQLite's own cap on the file's pages: the next page that needs room fails with SQLITE_FULL,
    // exactly as on a full disk.
    const pages = sqlValue(h.mirror, `PRAGMA page_count`);
    sqlRun(h.mirror, `PRAGMA max_page_count = ${pages}`);
    const err = await rejected(h.sync({ concurrency: 1 }));
    expect(err.cause).toBeInstanceOf(MirrorUnusableError);
    expect((err.cause as MirrorUnusableError).sqliteCode).toBe('SQLITE_FULL');
    expect(err.summary.status).toBe('failed');
    expect(err.summary.failures).toEqual([]);
    expect(err.message).toMatch(/disk is full/);
  });
});

describe('a server that never stops serving pages', () => {
  it('a conversation that never ends is stopped at the same bound every run: the bound does not grow from a checkpoint', async () => {
    const ws = FakeWorkspace.fromCounts([3, 4]);
    const h = await start({ workspace: ws });
    const endless = ws.list()[0]!.id;
    h.fake.injectFault({ kind: 'runaway', match: { path: msgPath(endless) }, times: Infinity });
    const perRun: number[] = [];
    for (let run = 0; run < 3; run++) {
      const before = h.fake.requests.length;
      const s = await h.sync();
      expect(s.failures.map((f) => [f.id, f.code])).toEqual([[endless, 'PAGE_RUNAWAY']]);
      perRun.push(h.fake.requests.slice(before).filter((r) => r.path === msgPath(endless)).length);
    }
    // Its first page says 2 pages: ceil(2 * 1.1) + 10 = 13 pages, run after run.
    expect(perRun).toEqual([13, 13, 13]);
    expect(await h.mirror.loadCheckpoint(ACCOUNT_ID, endless)).toBeUndefined();
  });

  it('a list that never ends stores and crawls nothing beyond the pages its first page declared', async () => {
    const ws = FakeWorkspace.fromCounts([3, 4]);
    const h = await start({ workspace: ws });
    await h.sync();
    h.fake.injectFault({ kind: 'runaway', match: { path: '/v1/conversations' }, times: Infinity });
    const err = await rejected(h.sync({ full: true }));
    // The list fails as a runaway; the invented conversations of its first two pages that were
    // crawled before the run stopped answer 404 and fail too (listed, so never tombstoned).
    expect(err.summary.failures.filter((f) => f.code === 'PAGE_RUNAWAY').map((f) => f.id)).toEqual(['(conversation list)']);
    expect(new Set(err.summary.failures.filter((f) => f.code !== 'PAGE_RUNAWAY').map((f) => f.code))).toEqual(new Set(['LISTED_BUT_NOT_FOUND']));
    // The runaway list's first page declared 2 pages (200 conversations): nothing past them is kept.
    const { conversations, conversations_tombstoned } = await h.mirror.counts();
    expect(conversations! + conversations_tombstoned!).toBeLessThanOrEqual(2 + 200);
    expect(conversations_tombstoned).toBe(0);
  });
});
