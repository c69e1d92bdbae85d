/**
 * The archive without noise: the line of a run that changed nothing is held (no batch, no record,
 * no file) until the next publication that carries changes, or until its heartbeat window has
 * ended (24 h windows are UTC days), so a quiet daemon adds one record a day instead of one per
 * tick. Recorded runs in this process against the fake API, an injected clock, real files.
 */
import { afterEach, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { verifyArchive } from '../src/export/verify.js';
import { harnessPool, readExportLines, testClock, type TestClock } from './helpers.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const DAY = 86_400_000;
const TICK = 15 * 60_000;
/** 2026-11-25T00:00:00Z: ticks of the default schedule fall on its quarter hours. */
const MIDNIGHT = Date.parse('2026-11-25T00:00:00.000Z');

async function quietWorkspace(clock: TestClock) {
  const ws = FakeWorkspace.generate({ seed: 5, conversations: 6 });
  const h = await pool.start({ workspace: ws, clock });
  const sync = () => h.sync({ runsHeartbeatMs: DAY, changeFieldSetting: 'auto' });
  return { ws, h, sync };
}

describe('run lines of runs that changed nothing', () => {
  it('20 quiet runs publish nothing; the next run with changes publishes their lines with its own', async () => {
    const clock = testClock({ start: MIDNIGHT + 5 * 60_000 });
    const { ws, h, sync } = await quietWorkspace(clock);
    const first = await sync();
    expect(first.export.held).toBeUndefined();
    const records = (await h.mirror.ledgerEntries()).length;
    const head = await h.mirror.ledgerHead();
    const files = fs.readdirSync(`${h.exportDir}/_ledger`);
    for (let i = 1; i <= 20; i++) {
      clock.advance(TICK);
      const s = await sync();
      expect(s.status).toBe('succeeded');
      expect(s.export.lines).toBe(0);
      expect(s.export.held).toEqual({ lines: i, until: '2026-11-26T00:00:00.000Z' });
      expect(s.export.head).toEqual(head);
    }
    expect(await h.mirror.ledgerEntries()).toHaveLength(records);
    expect(fs.readdirSync(`${h.exportDir}/_ledger`)).toEqual(files);
    expect(await h.mirror.pendingExport()).toEqual({ data: 0, runLines: 20, oldestRunLineAt: expect.stringMatching(/^2026-11-25T00:20:/) });
    // The held lines are in the mirror: verify (and --deep, which replays what waits) is clean.
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);

    // A run that changes something publishes them, then its own line.
    ws.appendMessages(ws.list()[0]!.id, 3);
    clock.advance(TICK);
    const busy = await sync();
    expect(busy.messages.inserted).toBe(3);
    expect(busy.export.held).toBeUndefined();
    expect(await h.mirror.ledgerEntries()).toHaveLength(records + 2);
    expect(await h.mirror.pendingExport()).toEqual({ data: 0, runLines: 0, oldestRunLineAt: undefined });
    expect(readExportLines(h.exportDir, 'runs').map((l) => Number(l.id))).toEqual(Array.from({ length: 22 }, (_, i) => i + 1));
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('a quiet daemon at the default schedule adds one record and one file a day: the first publication after midnight UTC', async () => {
    const clock = testClock({ start: MIDNIGHT });
    const { h, sync } = await quietWorkspace(clock);
    await sync(); // day 1, 00:00: the first sync mirrors everything (its changes and its line: 2 records)
    const afterFirst = (await h.mirror.ledgerEntries()).length;
    const perDay: { records: number; files: string[] }[] = [];
    for (let day = 0; day < 2; day++) {
      const before = (await h.mirror.ledgerEntries()).length;
      const beforeFiles = new Set((await h.mirror.publishedFiles()).map((f) => f.path));
      // The other 95 ticks of the day, then the next day's 00:00 tick.
      for (let t = 0; t < 96; t++) {
        clock.advance(TICK);
        await sync();
      }
      perDay.push({ records: (await h.mirror.ledgerEntries()).length - before, files: (await h.mirror.publishedFiles()).map((f) => f.path).filter((p) => !beforeFiles.has(p)) });
    }
    expect(afterFirst).toBe(2);
    // Day 1's 95 quiet lines go out at day 2's 00:00 tick (the 00:00 line of day 1 went out with
    // its changes); day 2's 96 at day 3's. Each 00:00 tick's own line stays held for its day.
    for (const [i, d] of perDay.entries()) {
      expect(d.records, `day ${i + 1}`).toBe(1);
      expect(d.files, `day ${i + 1}`).toHaveLength(1);
      expect(d.files[0], `day ${i + 1}`).toMatch(new RegExp(`^runs/account=[^/]+/date=2026-11-2${5 + i}/`));
    }
    const lines = readExportLines(h.exportDir, 'runs');
    expect(lines.filter((l) => String(l.synced_at).startsWith('2026-11-25'))).toHaveLength(96);
    expect(lines.filter((l) => String(l.synced_at).startsWith('2026-11-26'))).toHaveLength(96);
    expect((await h.mirror.pendingExport()).runLines).toBe(1);
    expect((await verifyArchive({ exportDir: h.exportDir, mirror: h.mirror, deep: true })).problems).toEqual([]);
  });

  it('with the heartbeat 0, every run publishes its own line as before', async () => {
    const clock = testClock({ start: MIDNIGHT });
    const { h } = await quietWorkspace(clock);
    await h.sync({ runsHeartbeatMs: 0 });
    for (let i = 0; i < 3; i++) {
      clock.advance(TICK);
      const s = await h.sync({ runsHeartbeatMs: 0 });
      expect(s.export.held).toBeUndefined();
      expect((await h.mirror.pendingExport()).runLines).toBe(0);
    }
    expect(await h.mirror.ledgerEntries()).toHaveLength(5);
  });
});
