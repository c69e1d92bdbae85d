/**
 * The store's engines as test fixtures, for the conformance suite: a behaviour test written once
 * runs against each engine with `describe.each(engines)`. Only SQLite for now; the PostgreSQL
 * engine joins with a fixture of the same shape (a fresh schema per target, dropped at cleanup).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Mirror, MirrorOptions } from '../src/store/mirror.js';
import { openMirror } from '../src/store/open-mirror.js';
import { tempDir } from './helpers.js';

/** One engine, as a test uses it. */
export interface EngineFixture {
  /** The engine's name, as `Mirror.engine` says it (and as `describe.each` prints it). */
  name: 'sqlite' | 'postgres';
  /**
   * Opens a mirror (a writer unless `opts.readonly`) at `target`, by default a fresh one
   * ({@link target}); {@link cleanup} closes it if the test did not.
   */
  open(opts?: MirrorOptions, target?: string): Promise<Mirror>;
  /** A fresh, empty target (`CONVO_MIRROR_DB`): a new SQLite file, or a PostgreSQL URL with a new schema. */
  target(): string;
  /** Closes every mirror {@link open} opened and removes every target {@link target} made. */
  cleanup(): Promise<void>;
}

/** SQLite: a new file in a new temp directory per target. */
function sqliteFixture(): EngineFixture {
  const dirs: string[] = [];
  const opened: Mirror[] = [];
  const target = (): string => {
    const d = tempDir('convo-mirror-engine-');
    dirs.push(d);
    return path.join(d, 'mirror.sqlite');
  };
  return {
    name: 'sqlite',
    target,
    async open(opts = {}, at = target()) {
      const m = await openMirror(at, opts);
      opened.push(m);
      return m;
    },
    async cleanup() {
      for (const m of opened.splice(0)) await m.close(); // closing twice is a no-op
      for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
    },
  };
}

/** Every engine the conformance suite runs against. */
export const engines: EngineFixture[] = [sqliteFixture()];
