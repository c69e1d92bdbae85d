/**
 * Incremental sync (the default): one request per unchanged conversation, the boundary check and
 * its fallback to a full crawl, change-signal skipping, and what only --full sees. Real HTTP to
 * the fake, into each engine of the store (the conformance suite: test/engines.ts).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { harnessPool, readExportLines, type Harness, type HarnessOptions } from './helpers.js';
import { engines } from './engines.js';
import { historyRows, liveIdsByPosition, mirrorMatchesFake, opsOf } from './mirror-reads.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());
const msgPath = (id: string) => `/v1/conversations/${id}/messages`;
const pagesAsked = (h: Harness, id: string, from: number) => h.fake.requests.slice(from).filter((r) => r.path === msgPath(id)).map((r) => Number(r.query['page']));
async function expectExact(h: Harness): Promise<void> {
  const eq = await mirrorMatchesFake(h.mirror, h.fake.workspace);
  expect(eq.ok, eq.detail).toBe(true);
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  describe('incremental sync', () => {
    it('costs exactly one message request per unchanged conversation (no change signal), at the page of the last known message', async () => {
      const counts = [0, 1, 99, 100, 101, 250];
      const ws = FakeWorkspace.fromCounts(counts);
      const h = await start({ workspace: ws });
      await h.sync();
      const before = h.fake.requests.length;
      const s = await h.sync({ changeFieldSetting: 'none' });
      expect(s.export.lines).toBe(0);
      ws.list().forEach((c, i) => {
        const n = counts[i]!;
        expect(pagesAsked(h, c.id, before), `conversation of ${n}`).toEqual([n === 0 ? 1 : Math.floor((n - 1) / 100) + 1]);
      });
      const listRequests = h.fake.requests.slice(before).filter((r) => r.path === '/v1/conversations').length;
      expect(s.requests).toBe(listRequests + counts.length);
      await expectExact(h);
    });

    it('new messages are fetched from the last known page on, and exported once', async () => {
      const ws = FakeWorkspace.fromCounts([250, 3]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[0]!;
      const added = ws.appendMessages(c.id, 60);
      const before = h.fake.requests.length;
      const s = await h.sync();
      expect(pagesAsked(h, c.id, before)).toEqual([3, 4]);
      expect(s.messages.inserted).toBe(60);
      await expectExact(h);
      const inserts = readExportLines(h.exportDir, 'messages').filter((l) => l.op === 'insert' && l.conversation_id === c.id);
      expect(inserts).toHaveLength(310);
      expect(new Set(inserts.map((l) => l.id)).size).toBe(310);
      expect(inserts.slice(-60).map((l) => l.id)).toEqual(added.map((m) => m.id));
    });

    it('a deletion in an early page fails the boundary check: full crawl of that conversation, exact mirror, a delete line', async () => {
      const ws = FakeWorkspace.fromCounts([250]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[0]!;
      const gone = c.messages[5]!.id;
      ws.deleteMessage(c.id, gone);
      ws.appendMessages(c.id, 1); // same total_count: only the boundary check can tell
      const before = h.fake.requests.length;
      const s = await h.sync();
      expect(pagesAsked(h, c.id, before)).toEqual([3, 1, 2, 3]);
      expect(s.messages.restarts).toBe(1);
      await expectExact(h);
      expect(await opsOf(h.mirror, gone)).toEqual(['insert', 'delete']);
    });

    it('an insertion in an early page fails the boundary check too: full crawl, exact mirror, positions renumbered', async () => {
      const ws = FakeWorkspace.fromCounts([250]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[0]!;
      // Move the last message to the front: every later position shifts by one, total unchanged.
      // (Done behind the fake's bookkeeping, so its activity signal does not move: sync without one.)
      const last = c.messages.pop()!;
      c.messages.unshift(last);
      const before = h.fake.requests.length;
      await h.sync({ changeFieldSetting: 'none' });
      expect(pagesAsked(h, c.id, before)).toEqual([3, 1, 2, 3]);
      await expectExact(h);
      expect(await liveIdsByPosition(h.mirror, c.id)).toEqual(c.messages.map((m) => m.id));
    });

    it('an edit in an early page moves nothing: the incremental sync does not see it, --full does (one update line, one history row)', async () => {
      const ws = FakeWorkspace.fromCounts([250]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[0]!;
      const edited = c.messages[7]!.id;
      const original = c.messages[7]!.content;
      expect(original).not.toBe('edited on page 1');
      ws.editMessage(c.id, edited, 'edited on page 1');
      const inc = await h.sync({ changeFieldSetting: 'none' });
      expect(inc.messages.updated).toBe(0);
      expect((await mirrorMatchesFake(h.mirror, ws)).ok).toBe(false);
      const full = await h.sync({ full: true });
      expect(full.messages.updated).toBe(1);
      await expectExact(h);
      const lines = readExportLines(h.exportDir, 'messages').filter((l) => l.id === edited);
      expect(lines.map((l) => [l.op, l['content']])).toEqual([
        ['insert', original],
        ['update', 'edited on page 1'],
      ]);
      const history = (await historyRows(h.mirror)).filter((r) => r.id === edited);
      expect(history).toHaveLength(1);
      expect((JSON.parse(history[0]!.raw) as { content: string }).content).toBe(original);
    });

    it('change signal on: unchanged conversations cost no message request; a moved signal is crawled', async () => {
      const ws = FakeWorkspace.fromCounts([30, 40, 50]);
      const h = await start({ workspace: ws });
      await h.sync();
      const [a, b] = ws.list();
      ws.appendMessages(b!.id, 2); // moves b's last_activity_at / messages_count
      const before = h.fake.requests.length;
      const s = await h.sync({ changeFieldSetting: 'auto' });
      const asked = h.fake.requests.slice(before).filter((r) => r.path.endsWith('/messages')).map((r) => r.path);
      expect(asked).toEqual([msgPath(b!.id)]);
      expect(pagesAsked(h, a!.id, before)).toEqual([]);
      expect(s.messages.inserted).toBe(2);
      await expectExact(h);
    });

    it('change signal off (none): every conversation costs one request even when nothing moved', async () => {
      const ws = FakeWorkspace.fromCounts([30, 40, 50]);
      const h = await start({ workspace: ws });
      await h.sync();
      const before = h.fake.requests.length;
      await h.sync({ changeFieldSetting: 'none' });
      expect(h.fake.requests.slice(before).filter((r) => r.path.endsWith('/messages'))).toHaveLength(3);
    });
  });

  describe('change-signal baseline', () => {
    it('a full sync records the signal, so the first incremental sync after it skips every unchanged conversation', async () => {
      const ws = FakeWorkspace.fromCounts([30, 140, 5]);
      const h = await start({ workspace: ws });
      const full = await h.sync({ full: true });
      expect(full.refresh).toBe('full');
      const before = h.fake.requests.length;
      const inc = await h.sync();
      expect(inc.refresh).toBe('incremental');
      expect(h.fake.requests.slice(before).filter((r) => r.path.endsWith('/messages'))).toEqual([]);
      // A full sync never skips, even with the signal unmoved.
      const again = h.fake.requests.length;
      await h.sync({ full: true });
      expect(h.fake.requests.slice(again).filter((r) => r.path.endsWith('/messages'))).toHaveLength(1 + 2 + 1);
    });
  });

  describe('listing in incremental syncs', () => {
    it('one consistent pass suffices; a pass that saw an id twice (reordering) is confirmed by another', async () => {
      const ws = FakeWorkspace.fromCounts(Array(250).fill(1));
      const h = await start({ workspace: ws });
      await h.sync({ full: true });
      const quiet = await h.sync();
      expect(quiet.listPasses).toBe(1);
      expect(quiet.listConfirmed).toBe(true);
      // A conversation jumps to the front while page 2 is read: page 2 repeats an id of page 1.
      const mover = ws.list()[150]!.id;
      let fired = false;
      h.fake.beforeServe((req) => {
        if (!fired && req.path === '/v1/conversations' && req.query['page'] === '2') {
          fired = true;
          ws.moveToFront(mover);
        }
      });
      const busy = await h.sync();
      expect(fired).toBe(true);
      // Pass 1 saw a duplicate and missed the mover (it jumped behind the read); pass 2 finds it (a new
      // id), pass 3 confirms nothing else is missing.
      expect(busy.listPasses).toBe(3);
      expect(busy.listConfirmed).toBe(true);
      await expectExact(h);
    });
  });
});
