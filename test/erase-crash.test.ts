/**
 * `convo-mirror erase` SIGKILLed at each step of an erasure, then restarted (issue 26: "SIGKILL at
 * each step of an erasure (failpoints), then a restart: finished, exact, chain linear"). The built
 * CLI kills its own process at the step `CONVO_MIRROR_CRASH_AT` names (src/cli/crash-point.ts: no
 * handler runs, as after a power cut); the same `erase` run again (or, for one step, a `sync`)
 * finishes the erasure: no byte of the subject's text is left under the export directory, every
 * file the chain lists is there, each record's prev is the one before it, and `verify --deep`
 * passes. A SQLite mirror synced against the in-process fake.
 */
import zlib from 'node:zlib';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ExportFailpoint } from '../src/export/publish-fs.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { openMirror } from '../src/store/open-mirror.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { cliEnv, harnessPool, snapshotFiles } from './helpers.js';

const pool = harnessPool();
afterEach(async () => {
  await killLeftovers();
  await pool.closeAll();
});
beforeAll(assertBuilt);

/** Text only the subject wrote. */
const TEXT = 'Wombat-Kettle-7730 my home address';

const STEPS: ExportFailpoint[] = ['erasure-after-file', 'erasure-before-record', 'erasure-before-mirror', 'erasure-after-record', 'erasure-after-delete'];

describe('erase SIGKILLed at each step, then restarted', () => {
  for (const step of STEPS) {
    const finisher = step === 'erasure-after-record' ? 'sync' : 'erase';
    it(`at ${step}: the next ${finisher} finishes it: the text gone from every file, no file lost, the chain linear, verify --deep intact`, async () => {
      // The subject's text is published twice, in two batches: as written, then as edited.
      const ws = FakeWorkspace.fromCounts([6, 25, 4]);
      const c = ws.list()[1]!;
      const mine = c.messages.find((m) => m.sender.type === 'Customer')!;
      ws.editMessage(c.id, mine.id, TEXT);
      const h = await pool.start({ workspace: ws });
      expect((await h.sync()).status).toBe('succeeded');
      ws.editMessage(c.id, mine.id, `${TEXT}, edited`);
      expect((await h.sync({ full: true })).status).toBe('succeeded');
      await h.mirror.close();
      const env = cliEnv(h.fake, h.dir);
      const args = ['erase', '--sender', mine.sender.id, '--reason', 'DSR-77'];
      const holding = (): string[] =>
        [...snapshotFiles(h.exportDir)].filter(([p, bytes]) => (p.endsWith('.gz') ? zlib.gunzipSync(bytes) : bytes).includes('Wombat-Kettle')).map(([p]) => p);
      expect(holding().length).toBeGreaterThanOrEqual(2);

      const killed = await run(args, { ...env, CONVO_MIRROR_CRASH_AT: step });
      expect(killed.signal, `${killed.stdout}${killed.stderr}`).toBe('SIGKILL');

      const finished = await run(finisher === 'sync' ? ['sync'] : args, env);
      expect(finished.code, finished.stderr).toBe(0);
      // The same erase again finishes the interrupted erasure, and records no second one.
      if (finisher === 'erase') expect(finished.stdout).toMatch(/^mirror: recorded earlier \(.+\), its archive step interrupted: it redacted /m);
      expect(holding()).toEqual([]);
      const v = await run(['verify', '--deep'], env);
      expect(v.code, v.stdout + v.stderr).toBe(0);
      // Two messages files and two conversations files (the conversation whose contact is the sender, listed in both batches).
      expect(v.stdout).toMatch(/^erased: record \d+ .*reason "DSR-77": \d+ lines in 4 files replaced by stubs$/m);
      const mirror = await openMirror(h.dbPath, { readonly: true });
      try {
        const entries = await mirror.ledgerEntries();
        entries.forEach((e, i) => expect(e.prev_hash, `record ${e.batch_id}`).toBe(i === 0 ? null : entries[i - 1]!.hash));
        // One erasure, archived: the one killed, finished by the restart.
        const erasures = await mirror.erasures();
        expect(erasures.length).toBe(1);
        expect(erasures.every((e) => e.archiveDoneAt !== null)).toBe(true);
      } finally {
        await mirror.close();
      }
    });
  }
});
