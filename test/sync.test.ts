/**
 * Sync end to end: the real fake API over HTTP, the real ApiClient, a mirror of each engine of the
 * store (the conformance suite: test/engines.ts), real export files. Nothing of ours is mocked.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace, type FakeConversation } from '../src/fake-api/index.js';
import { AuthError, ConfigError, RunError } from '../src/errors.js';
import { ACCOUNT_ID, API_KEY, harnessPool, snapshotFiles, readExportLines, testClock, type Harness, type HarnessOptions } from './helpers.js';
import { sqlGet } from './sql.js';
import { engines } from './engines.js';
import { changeRows, conversationRow, messageRows as rowsOf, mirrorMatchesFake, records, runRow, type MessageRow } from './mirror-reads.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const msgPath = (id: string): string => `/v1/conversations/${id}/messages`;

/** Requests the fake saw for one conversation's messages (optionally only since index `from`). */
function messageRequests(h: Harness, id: string, from = 0) {
  return h.fake.requests.slice(from).filter((r) => r.path === msgPath(id));
}

async function expectExact(h: Harness): Promise<void> {
  const eq = await mirrorMatchesFake(h.mirror, h.fake.workspace);
  expect(eq.ok, eq.detail).toBe(true);
}

/** A conversation's message rows: the live ones by position, then the tombstoned ones. */
function messageRows(h: Harness, conversationId: string): Promise<MessageRow[]> {
  return rowsOf(h.mirror, conversationId);
}

/** Change-log rows of the mirrored records (each run also adds its own `runs` line). */
async function changeCount(h: Harness): Promise<number> {
  return (await changeRows(h.mirror)).filter((c) => c.stream !== 'runs').length;
}

/** Change-log rows of one stream and record, by seq. */
async function opsOf(h: Harness, stream: 'messages' | 'conversations', recordId: string): Promise<string[]> {
  return (await changeRows(h.mirror)).filter((c) => c.stream === stream && c.record_id === recordId).map((c) => c.op);
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  // These tests pin full-refresh behaviour (two listing passes, every page read); incremental sync,
  // the default, has its own tests in incremental.test.ts.
  describe('pagination', () => {
    it('mirrors conversations of 0, 1, 99, 100, 101, 250 and 1200 messages exactly, with the fewest requests', async () => {
      const counts = [0, 1, 99, 100, 101, 250, 1200];
      const ws = FakeWorkspace.fromCounts(counts);
      const h = await start({ workspace: ws });
      const summary = await h.sync({ full: true });

      expect(summary.status).toBe('succeeded');
      await expectExact(h);
      expect(summary.conversations.listed).toBe(counts.length);
      expect(summary.conversations.synced).toBe(counts.length);
      expect(summary.messages.inserted).toBe(counts.reduce((a, b) => a + b, 0));
      expect(summary.messages.restarts).toBe(0);
      expect(summary.listPasses).toBe(2); // the second pass confirms the listing found nothing new
      expect(summary.listConfirmed).toBe(true);

      const convs = ws.list();
      for (const [i, c] of convs.entries()) {
        const n = counts[i]!;
        expect(c.messages.length).toBe(n);
        const rows = await messageRows(h, c.id);
        // positions 0..n-1, in the fake's chronological order
        expect(rows.map((r) => r.position)).toEqual([...Array(n).keys()]);
        expect(rows.map((r) => r.id)).toEqual(c.messages.map((m) => m.id));
        const created = rows.map((r) => (JSON.parse(r.raw) as { created_at: string }).created_at);
        expect([...created].sort()).toEqual(created);
        expect((await h.mirror.crawlState(ACCOUNT_ID, c.id)).messageCount).toBe(n);
        expect((await conversationRow(h.mirror, c.id))!.lastSyncedAt).not.toBeNull();
        const reqs = messageRequests(h, c.id);
        expect(reqs.length, `requests for a conversation of ${n}`).toBe(Math.max(1, Math.ceil(n / 100)));
        expect(reqs.map((r) => r.query['per_page'])).toEqual(reqs.map(() => '100'));
        expect(reqs.map((r) => Number(r.query['page']))).toEqual([...Array(reqs.length).keys()].map((k) => k + 1));
      }
      const listReqs = h.fake.requests.filter((r) => r.path === '/v1/conversations');
      expect(listReqs.length).toBe(2); // one page, listed twice: the confirming pass
      expect(summary.minimumRequests).toBe(1 + 1 + 1 + 1 + 1 + 2 + 3 + 12);
      // Every request: per_page=100, both headers.
      expect(h.fake.requests.every((r) => r.query['per_page'] === '100' && r.apiKey === API_KEY && r.accountId === ACCOUNT_ID)).toBe(true);
      // The minimum plus the confirming pass of the conversation list.
      expect(h.fake.requests.length).toBe(summary.minimumRequests + 1);
      expect(summary.requests).toBe(summary.minimumRequests + 1);
      expect(summary.retries).toBe(0);
      // no crawl left unfinished
      expect((await h.mirror.counts()).checkpoints).toBe(0);
    });

    it('lists more than one page of conversations (250 conversations → 3 list pages)', async () => {
      const ws = FakeWorkspace.fromCounts(Array(250).fill(1));
      const h = await start({ workspace: ws });
      const summary = await h.sync({ full: true });
      await expectExact(h);
      expect(h.fake.requests.filter((r) => r.path === '/v1/conversations').map((r) => r.query['page'])).toEqual(['1', '2', '3', '1', '2', '3']);
      expect(summary.minimumRequests).toBe(3 + 250);
      expect(h.fake.requests.length).toBe(summary.minimumRequests + 3);
    });
  });

  describe('stored rows', () => {
    it('keeps raw exactly as served; attachments NULL when omitted, "[]" when empty', async () => {
      const ws = FakeWorkspace.fromCounts([60, 45], 7);
      const h = await start({ workspace: ws });
      await h.sync();
      let absent = 0;
      let empty = 0;
      let some = 0;
      const conversations = new Map((await records(h.mirror, 'conversations')).map((r) => [r.id, r]));
      for (const c of ws.list()) {
        const rows = new Map((await messageRows(h, c.id)).map((r) => [r.id, r]));
        for (const m of c.messages) {
          const row = rows.get(m.id)!;
          expect(row).toBeDefined();
          expect(JSON.parse(row.raw)).toEqual(m);
          expect(row.raw).toBe(JSON.stringify(m));
          // SQLite only: the derived `attachments` column of the file (PostgreSQL's, jsonb: test/pg-mirror.test.ts).
          const attachments = engine.name === 'sqlite' ? sqlGet<{ a: string | null }>(h.mirror, `SELECT attachments AS a FROM messages WHERE id = ?`, m.id)!.a : undefined;
          if (!('attachments' in m)) {
            absent++;
            if (engine.name === 'sqlite') expect(attachments).toBeNull();
          } else if (m.attachments!.length === 0) {
            empty++;
            if (engine.name === 'sqlite') expect(attachments).toBe('[]');
          } else {
            some++;
            if (engine.name === 'sqlite') expect(JSON.parse(attachments!)).toEqual(m.attachments);
          }
        }
        expect(JSON.parse(conversations.get(c.id)!.raw!)).toEqual(c.data);
      }
      // the seed gives every case, so each branch above was exercised
      expect(absent).toBeGreaterThan(0);
      expect(empty).toBeGreaterThan(0);
      expect(some).toBeGreaterThan(0);
    });
  });

  describe('changes during a crawl', () => {
    it('a conversation moved to the front while the list is paged is still mirrored', async () => {
      const ws = FakeWorkspace.fromCounts(Array(250).fill(2));
      const h = await start({ workspace: ws });
      const mover = ws.list()[230]!.id;
      let fired = false;
      h.fake.beforeServe((req) => {
        if (!fired && req.path === '/v1/conversations' && req.query['page'] === '2') {
          fired = true;
          ws.moveToFront(mover);
        }
      });
      const summary = await h.sync();
      expect(fired).toBe(true);
      expect(summary.status).toBe('succeeded');
      expect(summary.listPasses).toBeGreaterThanOrEqual(2);
      expect(summary.listConfirmed).toBe(true);
      expect(summary.conversations.listed).toBe(250);
      await expectExact(h);
      expect((await messageRows(h, mover)).length).toBe(2);
      // each conversation crawled once despite being listed in several passes
      for (const c of ws.list()) expect(messageRequests(h, c.id).length).toBe(1);
    });

    it('a message deleted from page 1 while page 3 is requested restarts the crawl; the mirror is exact', async () => {
      const ws = FakeWorkspace.fromCounts([250, 3, 5]);
      const h = await start({ workspace: ws });
      const conv = ws.list()[0]!;
      const victim = conv.messages[10]!.id;
      let fired = false;
      h.fake.beforeServe((req) => {
        if (!fired && req.path === msgPath(conv.id) && req.query['page'] === '3') {
          fired = true;
          ws.deleteMessage(conv.id, victim);
        }
      });
      const summary = await h.sync({ full: true });
      expect(fired).toBe(true);
      expect(summary.status).toBe('succeeded');
      expect(summary.messages.restarts).toBeGreaterThanOrEqual(1);
      await expectExact(h);
      const rows = await messageRows(h, conv.id);
      const live = rows.filter((r) => !r.deleted);
      expect(live.map((r) => r.id)).toEqual(conv.messages.map((m) => m.id));
      expect(live.map((r) => r.position)).toEqual([...Array(249).keys()]);
      const v = rows.find((r) => r.id === victim);
      // page 1 was committed before the deletion, so the row exists and is tombstoned, not removed
      expect(v).toBeDefined();
      expect(v!.deleted).toBe(true);
      expect(await opsOf(h, 'messages', victim)).toEqual(['insert', 'delete']);
      // the shifted messages were not reported as changed
      expect((await changeRows(h.mirror)).filter((c) => c.stream === 'messages' && c.op === 'update')).toEqual([]);
      expect((await h.mirror.crawlState(ACCOUNT_ID, conv.id)).messageCount).toBe(249);
    });

    it('a page shorter than total_count implies restarts the crawl; nothing is missed', async () => {
      const ws = FakeWorkspace.fromCounts([250, 4]);
      const h = await start({ workspace: ws });
      const conv = ws.list()[0]!;
      // page 2 as served, minus one message, with unchanged meta (a glitch or a concurrent shift)
      const page2 = conv.messages.slice(100, 200).filter((_, i) => i !== 37);
      const body = JSON.stringify({ data: page2, meta: { current_page: 2, total_pages: 3, total_count: 250 } });
      h.fake.injectFault({ kind: 'status', status: 200, body, match: { path: msgPath(conv.id), page: 2 }, times: 1 });
      const summary = await h.sync();
      expect(summary.status).toBe('succeeded');
      expect(summary.messages.restarts).toBe(1);
      await expectExact(h);
      expect(messageRequests(h, conv.id).map((r) => r.query['page'])).toEqual(['1', '2', '3', '1', '2', '3']);
      expect(summary.minimumRequests).toBe(1 + 3 + 1);
    });

    it('messages appended during a crawl (total_count grows) are paged through', async () => {
      const ws = FakeWorkspace.fromCounts([250, 4]);
      const h = await start({ workspace: ws });
      const conv = ws.list()[0]!;
      let fired = false;
      h.fake.beforeServe((req) => {
        if (!fired && req.path === msgPath(conv.id) && req.query['page'] === '2') {
          fired = true;
          ws.appendMessages(conv.id, 80);
        }
      });
      const summary = await h.sync({ full: true });
      expect(fired).toBe(true);
      expect(summary.status).toBe('succeeded');
      expect(summary.messages.restarts).toBe(0);
      expect(conv.messages.length).toBe(330);
      await expectExact(h);
      expect((await messageRows(h, conv.id)).map((r) => r.position)).toEqual([...Array(330).keys()]);
      expect(messageRequests(h, conv.id).map((r) => r.query['page'])).toEqual(['1', '2', '3', '4']);
    });
  });

  describe('changes between syncs', () => {
    it('a message deleted at the fake is tombstoned, kept, and exported as a delete line', async () => {
      const ws = FakeWorkspace.fromCounts([120, 5]);
      const h = await start({ workspace: ws });
      await h.sync();
      const conv = ws.list()[0]!;
      const victim = conv.messages[50]!;
      ws.deleteMessage(conv.id, victim.id);
      const s2 = await h.sync();
      expect(s2.status).toBe('succeeded');
      expect(s2.messages.deleted).toBe(1);
      await expectExact(h);
      const row = (await messageRows(h, conv.id)).find((r) => r.id === victim.id);
      expect(row).toBeDefined();
      expect(row!.deleted).toBe(true);
      expect(JSON.parse(row!.raw)).toEqual(victim);
      const lines = readExportLines(h.exportDir, 'messages').filter((l) => l.id === victim.id);
      expect(lines.map((l) => l.op)).toEqual(['insert', 'delete']);
      expect(lines[1]!.conversation_id).toBe(conv.id);
      expect(lines[1]!['content']).toBe(victim.content);
    });

    it('a conversation deleted at the fake is tombstoned with its messages after one 404', async () => {
      const ws = FakeWorkspace.fromCounts([30, 150, 2]);
      const h = await start({ workspace: ws });
      await h.sync();
      const gone = ws.list()[1]!;
      const goneIds = gone.messages.map((m) => m.id);
      ws.deleteConversation(gone.id);
      const before = h.fake.requests.length;
      const s2 = await h.sync();
      expect(s2.status).toBe('succeeded');
      expect(s2.failures).toEqual([]);
      expect(s2.conversations.deleted).toBe(1);
      await expectExact(h);
      const reqs = messageRequests(h, gone.id, before);
      expect(reqs.length).toBe(1);
      expect(reqs[0]!.status).toBe(404);
      expect((await conversationRow(h.mirror, gone.id))!.deletedAt).not.toBeNull();
      const rows = await messageRows(h, gone.id);
      expect(rows.length).toBe(150);
      expect(rows.every((r) => r.deleted)).toBe(true);
      const deletes = readExportLines(h.exportDir, 'messages').filter((l) => l.conversation_id === gone.id && l.op === 'delete');
      expect(new Set(deletes.map((l) => l.id))).toEqual(new Set(goneIds));
      expect(deletes.length).toBe(150);
      const convLines = readExportLines(h.exportDir, 'conversations').filter((l) => l.id === gone.id);
      expect(convLines.map((l) => l.op)).toEqual(['insert', 'delete']);
      // a third sync does not ask for it again
      const before3 = h.fake.requests.length;
      const s3 = await h.sync();
      expect(s3.export.lines).toBe(0);
      expect(messageRequests(h, gone.id, before3).length).toBe(0);
    });

    it('a second sync of an unchanged workspace writes no change and no data file: only its own runs line', async () => {
      const ws = FakeWorkspace.fromCounts([0, 3, 130, 260]);
      const h = await start({ workspace: ws });
      const s1 = await h.sync();
      expect(s1.export.lines).toBeGreaterThan(0);
      const files = snapshotFiles(h.exportDir);
      const changes = await changeCount(h);
      const s2 = await h.sync();
      expect(s2.status).toBe('succeeded');
      expect(s2.export.lines).toBe(0);
      expect(s2.export.files).toBe(0);
      expect(s2.messages.inserted + s2.messages.updated + s2.messages.deleted).toBe(0);
      expect(s2.conversations.inserted + s2.conversations.updated).toBe(0);
      expect(await changeCount(h)).toBe(changes);
      const added = [...snapshotFiles(h.exportDir).keys()].filter((p) => !files.has(p));
      expect(added.filter((p) => !p.startsWith('runs/') && !p.startsWith('_ledger/'))).toEqual([]);
      expect(added.filter((p) => p.startsWith('runs/'))).toHaveLength(1);
      for (const [p, bytes] of files) if (p !== 'manifest.json') expect(fs.readFileSync(path.join(h.exportDir, p)).equals(bytes), p).toBe(true);
      await expectExact(h);
    });
  });

  describe('failures', () => {
    it('a conversation that keeps failing is reported by id; the others are mirrored; its mirrored messages survive', async () => {
      const ws = FakeWorkspace.fromCounts([5, 140, 7, 30]);
      const h = await start({ workspace: ws, client: { maxRetries: 2 } });
      const bad = ws.list()[1]!;

      // first run: it has never been mirrored
      h.fake.injectFault({ kind: 'status', status: 503, match: { path: msgPath(bad.id) }, times: Infinity });
      const s1 = await h.sync({ full: true });
      expect(s1.status).toBe('partial');
      expect(s1.failures.map((f) => f.id)).toEqual([bad.id]);
      expect(s1.failures[0]!.code).toBe('HTTP_ERROR');
      expect(s1.conversations.failed).toBe(1);
      expect(messageRequests(h, bad.id).length).toBe(3); // 1 + maxRetries
      for (const c of ws.list().filter((x) => x.id !== bad.id)) {
        expect((await messageRows(h, c.id)).map((r) => r.id)).toEqual(c.messages.map((m) => m.id));
      }
      expect(await messageRows(h, bad.id)).toEqual([]);
      expect(await runRow(h.mirror, s1.runId)).toMatchObject({ status: 'partial', conversations_failed: 1 });
      const rf = (await h.mirror.lastRunFailures()).map((f) => ({ run_id: f['run_id'], conversation_id: f['conversation_id'], code: f['code'], status: f['status'], attempts: f['attempts'] }));
      expect(rf).toEqual([{ run_id: s1.runId, conversation_id: bad.id, code: 'HTTP_ERROR', status: 503, attempts: 3 }]);

      // second run: healthy, everything mirrored
      h.fake.clearFaults();
      const s2 = await h.sync({ full: true });
      expect(s2.status).toBe('succeeded');
      await expectExact(h);

      // third run: it fails again after having been mirrored: nothing of it is tombstoned
      h.fake.injectFault({ kind: 'status', status: 503, match: { path: msgPath(bad.id) }, times: Infinity });
      const changes = await changeCount(h);
      const s3 = await h.sync({ full: true });
      expect(s3.status).toBe('partial');
      expect(s3.failures.map((f) => f.id)).toEqual([bad.id]);
      expect(s3.messages.deleted).toBe(0);
      const rows = await messageRows(h, bad.id);
      expect(rows.length).toBe(140);
      expect(rows.every((r) => !r.deleted)).toBe(true);
      expect((await conversationRow(h.mirror, bad.id))!.deletedAt).toBeNull();
      expect(await changeCount(h)).toBe(changes);
      await expectExact(h);
    });

    it('a page that is not JSON fails that conversation with SCHEMA_ERROR, without retries; the others are fine', async () => {
      const ws = FakeWorkspace.fromCounts([4, 9, 12]);
      const h = await start({ workspace: ws });
      const bad = ws.list()[1]!;
      h.fake.injectFault({ kind: 'status', status: 200, body: '<html>oops</html>', match: { path: msgPath(bad.id) }, times: Infinity });
      const s = await h.sync();
      expect(s.status).toBe('partial');
      expect(s.failures.map((f) => [f.id, f.code])).toEqual([[bad.id, 'SCHEMA_ERROR']]);
      expect(messageRequests(h, bad.id).length).toBe(1);
      expect(await messageRows(h, bad.id)).toEqual([]);
      for (const c of ws.list()) {
        if (c.id !== bad.id) expect((await messageRows(h, c.id)).map((r) => r.id)).toEqual(c.messages.map((m) => m.id));
      }
    });

    it('a page that breaks the documented shape fails with SCHEMA_ERROR', async () => {
      const ws = FakeWorkspace.fromCounts([4, 9]);
      const h = await start({ workspace: ws });
      const bad = ws.list()[0]!;
      const body = JSON.stringify({ data: [{ id: 'msg_1', content: 'x', visibility: 'global', created_at: '2025-01-01T00:00:00.000Z' }], meta: { current_page: 1, total_pages: 1, total_count: 1 } });
      h.fake.injectFault({ kind: 'status', status: 200, body, match: { path: msgPath(bad.id) }, times: Infinity });
      const s = await h.sync();
      expect(s.status).toBe('partial');
      expect(s.failures.map((f) => [f.id, f.code])).toEqual([[bad.id, 'SCHEMA_ERROR']]);
      expect(s.failures[0]!.message).toContain('sender');
      expect(await messageRows(h, bad.id)).toEqual([]);
    });

    it('a wrong API key rejects with AuthError after exactly one request, and the run is recorded failed', async () => {
      const ws = FakeWorkspace.fromCounts([3, 3]);
      const h = await start({ workspace: ws, client: { apiKey: 'wrong' } });
      const err = await h.sync().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(RunError);
      expect((err as RunError).cause).toBeInstanceOf(AuthError);
      expect(h.fake.requests.length).toBe(1);
      expect(h.fake.requests[0]!.status).toBe(401);
      const run = (await h.mirror.lastRuns(1))[0] as { status: string; error: string | null };
      expect(run.status).toBe('failed');
      expect(run.error).toMatch(/401/);
      expect(run.error).not.toContain('wrong');
      expect((await h.mirror.counts()).messages).toBe(0);
    });
  });

  describe('named conversations', () => {
    it('sync({conversationIds}) mirrors exactly that conversation', async () => {
      const ws = FakeWorkspace.fromCounts([10, 205, 3]);
      const h = await start({ workspace: ws });
      const target = ws.list()[1]!;
      const s = await h.sync({ conversationIds: [target.id] });
      expect(s).toMatchObject({ scope: 'conversations', refresh: 'incremental', trigger: 'cli' });
      expect(s.status).toBe('succeeded');
      expect(s.minimumRequests).toBe(3);
      expect(h.fake.requests.every((r) => r.path === msgPath(target.id))).toBe(true);
      expect(h.fake.requests.length).toBe(3);
      expect([...new Set((await records(h.mirror, 'messages')).map((r) => r.conversation_id))]).toEqual([target.id]);
      expect((await messageRows(h, target.id)).map((r) => r.id)).toEqual(target.messages.map((m) => m.id));
      expect((await records(h.mirror, 'conversations')).map((r) => r.id)).toEqual([target.id]);
    });
  });

  describe('checkpoints', () => {
    it('restarts a resumed crawl when earlier pages shifted between runs (delete + append, same total)', async () => {
      const ws = FakeWorkspace.fromCounts([450]);
      const h = await start({ workspace: ws });
      const conv: FakeConversation = ws.list()[0]!;
      h.fake.injectFault({ kind: 'status', status: 400, match: { path: msgPath(conv.id), page: 3 }, times: Infinity });
      expect((await h.sync()).status).toBe('partial');
      h.fake.clearFaults();
      // While we were away: one message of page 1 deleted, one appended. total_count is unchanged,
      // so only the re-read of the last committed page can tell that page 2 now starts one later.
      const gone = conv.messages[10]!.id;
      ws.deleteMessage(conv.id, gone);
      ws.appendMessages(conv.id, 1);
      const s2 = await h.sync();
      expect(s2.status).toBe('succeeded');
      expect(s2.messages.restarts).toBe(1);
      await expectExact(h);
      expect((await messageRows(h, conv.id)).find((r) => r.id === gone)!.deleted).toBe(true);
    });

    it('resumes a failed crawl at the next uncommitted page, without duplicate change-log rows', async () => {
      const ws = FakeWorkspace.fromCounts([1200, 2]);
      const h = await start({ workspace: ws });
      const big: FakeConversation = ws.list()[0]!;
      h.fake.injectFault({ kind: 'status', status: 400, match: { path: msgPath(big.id), page: 3 }, times: Infinity });
      const s1 = await h.sync();
      expect(s1.status).toBe('partial');
      expect(s1.failures.map((f) => f.id)).toEqual([big.id]);
      expect(messageRequests(h, big.id).map((r) => r.query['page'])).toEqual(['1', '2', '3']);
      expect(await h.mirror.loadCheckpoint(ACCOUNT_ID, big.id)).toMatchObject({ nextPage: 3, totalCount: 1200 });
      expect((await messageRows(h, big.id)).length).toBe(200);

      h.fake.clearFaults();
      const before = h.fake.requests.length;
      const s2 = await h.sync();
      expect(s2.status).toBe('succeeded');
      const pages = messageRequests(h, big.id, before).map((r) => Number(r.query['page']));
      // Page 2, the last committed one, is re-read to verify nothing shifted; then paging goes on at 3.
      expect(pages).toEqual([2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
      await expectExact(h);
      expect((await messageRows(h, big.id)).map((r) => r.position)).toEqual([...Array(1200).keys()]);
      expect((await h.mirror.counts()).checkpoints).toBe(0);
      const perMessage = new Map<string, string[]>();
      for (const c of await changeRows(h.mirror)) if (c.stream === 'messages' && c.conversation_id === big.id) perMessage.set(c.record_id, [...(perMessage.get(c.record_id) ?? []), c.op]);
      expect(perMessage.size).toBe(1200);
      expect([...perMessage.values()].every((ops) => ops.join() === 'insert')).toBe(true);
      expect((await h.mirror.crawlState(ACCOUNT_ID, big.id)).messageCount).toBe(1200);
      const lines = readExportLines(h.exportDir, 'messages').filter((l) => l.conversation_id === big.id);
      expect(lines.length).toBe(1200);
    });

    it('a resumed crawl still tombstones messages deleted from its committed pages', async () => {
      const ws = FakeWorkspace.fromCounts([350]);
      const h = await start({ workspace: ws });
      const conv = ws.list()[0]!;
      h.fake.injectFault({ kind: 'status', status: 400, match: { path: msgPath(conv.id), page: 3 }, times: 1 });
      const s1 = await h.sync();
      expect(s1.status).toBe('partial');
      // a message of page 1 (already committed) is deleted: the resumed crawl sees total_count shrink
      const victim = conv.messages[5]!.id;
      ws.deleteMessage(conv.id, victim);
      const s2 = await h.sync();
      expect(s2.status).toBe('succeeded');
      await expectExact(h);
      const v = (await messageRows(h, conv.id)).find((r) => r.id === victim)!;
      expect(v.deleted).toBe(true);
      expect((await messageRows(h, conv.id)).filter((r) => !r.deleted).map((r) => r.position)).toEqual([...Array(349).keys()]);
    });
  });

  describe('review regressions', () => {
    it('a conversation deleted and another added while the list is paged (total unchanged) are both handled', async () => {
      const ws = FakeWorkspace.fromCounts(Array(250).fill(2));
      const h = await start({ workspace: ws });
      const doomed = ws.list()[5]!.id;
      let added: string | undefined;
      h.fake.beforeServe((req) => {
        if (!added && req.path === '/v1/conversations' && req.query['page'] === '2') {
          ws.deleteConversation(doomed);
          added = ws.addConversation(3, 'front').id;
        }
      });
      const s = await h.sync({ full: true });
      expect(added).toBeDefined();
      await expectExact(h);
      expect(s.status).toBe('succeeded');
      expect(s.listConfirmed).toBe(true);
      expect(s.listPasses).toBeGreaterThanOrEqual(2);
      expect((await messageRows(h, added!)).length).toBe(3);
      // Either never mirrored, or mirrored then tombstoned: never live.
      expect(await h.mirror.liveConversationIds(ACCOUNT_ID)).not.toContain(doomed);
    });

    it('a conversation crawled in this run and deleted before the confirming pass is re-checked and tombstoned', async () => {
      const ws = FakeWorkspace.fromCounts([2, 2, 2]);
      const h = await start({ workspace: ws });
      const doomed = ws.list()[1]!.id;
      // Both list passes answer slowly, so the doomed conversation is crawled between them.
      h.fake.injectFault({ kind: 'slow', delayMs: 300, match: { path: '/v1/conversations' }, times: 2 });
      let deleted = false;
      h.fake.beforeServe((req) => {
        if (!deleted && req.path === msgPath(doomed)) {
          deleted = true;
          setTimeout(() => ws.deleteConversation(doomed), 0); // after this request is answered
        }
      });
      const s = await h.sync({ full: true });
      expect(deleted).toBe(true);
      await expectExact(h);
      expect(s.status).toBe('succeeded');
      expect(s.conversations.deleted).toBe(1);
      expect(messageRequests(h, doomed).map((r) => r.status)).toEqual([200, 404]);
      expect((await conversationRow(h.mirror, doomed))!.deletedAt).not.toBeNull();
    });

    it('sync --full ignores a checkpoint and re-reads every page, catching an edit on an early page', async () => {
      const ws = FakeWorkspace.fromCounts([450]);
      const h = await start({ workspace: ws });
      const conv = ws.list()[0]!;
      h.fake.injectFault({ kind: 'status', status: 400, match: { path: msgPath(conv.id), page: 3 }, times: Infinity });
      expect((await h.sync()).status).toBe('partial');
      h.fake.clearFaults();
      const edited = conv.messages[5]!.id;
      ws.editMessage(conv.id, edited, 'edited while the crawl was interrupted');
      const before = h.fake.requests.length;
      const s = await h.sync({ full: true });
      expect(s.status).toBe('succeeded');
      expect(messageRequests(h, conv.id, before).map((r) => Number(r.query['page']))).toEqual([1, 2, 3, 4, 5]);
      await expectExact(h);
      expect(s.messages.updated).toBe(1);
      expect((await changeRows(h.mirror)).filter((c) => c.record_id === edited).map((c) => c.op)).toEqual(['insert', 'update']);
    });

    it('a checkpoint older than 24 h is discarded: the crawl starts at page 1', async () => {
      const ws = FakeWorkspace.fromCounts([450]);
      const clock = testClock({ start: Date.UTC(2026, 0, 15, 12), sleep: 'advance' });
      const h = await start({ workspace: ws, clock });
      const conv = ws.list()[0]!;
      h.fake.injectFault({ kind: 'status', status: 400, match: { path: msgPath(conv.id), page: 3 }, times: Infinity });
      await h.sync();
      h.fake.clearFaults();
      clock.advance(25 * 3600 * 1000);
      const before = h.fake.requests.length;
      expect((await h.sync()).status).toBe('succeeded');
      expect(messageRequests(h, conv.id, before).map((r) => Number(r.query['page']))).toEqual([1, 2, 3, 4, 5]);
      await expectExact(h);
    });

    it('a named conversation that the API does not know fails as NOT_FOUND, and nothing is tombstoned', async () => {
      const ws = FakeWorkspace.fromCounts([2]);
      const h = await start({ workspace: ws });
      const unknown = '00000000-0000-4000-8000-00000000abcd';
      const s = await h.sync({ conversationIds: [unknown] });
      expect(s.status).toBe('partial');
      expect(s.failures.map((f) => [f.id, f.code])).toEqual([[unknown, 'NOT_FOUND']]);
      expect(s.conversations.deleted).toBe(0);
      expect(await records(h.mirror, 'conversations')).toEqual([]);
    });

    it('the conversation list answering 404 (wrong base URL) stops the run with a ConfigError', async () => {
      const ws = FakeWorkspace.fromCounts([2]);
      const h = await start({ workspace: ws, client: { baseUrl: 'http://127.0.0.1:1/unused' } });
      // Point a fresh client at a wrong path prefix of the same fake.
      const { ApiClient } = await import('../src/api/client.js');
      const api = new ApiClient({ baseUrl: `${h.fake.url}/wrong-prefix`, apiKey: API_KEY, accountId: ACCOUNT_ID, maxRps: 0 });
      const { runSync } = await import('../src/run/index.js');
      const err = await runSync({ ...h.deps, api }, { accountId: ACCOUNT_ID, exportDir: h.exportDir }).then(
        () => undefined,
        (e: unknown) => e,
      );
      await api.close();
      expect(err).toBeInstanceOf(RunError);
      expect((err as RunError).cause).toBeInstanceOf(ConfigError);
      expect(String((err as RunError).message)).toMatch(/CONVO_MIRROR_BASE_URL/);
    });
  });
});
