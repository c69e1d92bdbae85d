/**
 * Export safety: where an export directory may be, the reserved temp directory and what publication
 * may delete, file and directory modes whatever the umask, foreign manifests, and `verify` trusting
 * nothing on disk. Real files in temp dirs, real SQLite, the real fake over HTTP; no mocks.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import {
  assertSafeExportDir,
  MANIFEST,
  publishChanges,
  manifestOf,
  renderManifest,
  TEMP_DIR,
  verifyExports,
  type Manifest,
} from '../src/export/exporter.js';
import { syncWorkspace } from '../src/sync/workspace.js';
import { ConfigError, ExportError } from '../src/errors.js';
import { GROUP_READABLE_MODES } from '../src/private-fs.js';
import { ACCOUNT_ID, frozenClock, harnessPool, ledgerFiles, linesMerkleRoot, syncThenCrashPublication, tempDir, type Harness, type HarnessOptions } from './helpers.js';

const pool = harnessPool();
const dirs: string[] = [];
afterEach(async () => {
  await pool.closeAll();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});
const start = (opts: HarnessOptions): Promise<Harness> => pool.start(opts);

/** A temp dir removed after the test, realpath'd (the OS temp dir may itself be a symlink). */
function scratch(): string {
  const d = fs.realpathSync(tempDir('convo-mirror-safety-'));
  dirs.push(d);
  return d;
}

/** The ConfigError thrown by `f`, asserted to name CONVO_MIRROR_EXPORT_DIR on one line. */
function configError(f: () => void): ConfigError {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    const e = err as ConfigError;
    expect(e.variable).toBe('CONVO_MIRROR_EXPORT_DIR');
    expect(e.message).toMatch(/^CONVO_MIRROR_EXPORT_DIR: /);
    expect(e.message).not.toContain('\n');
    return e;
  }
  throw new Error('expected a ConfigError, nothing was thrown');
}

/** {@link configError} of an async `f`: the ConfigError it rejects with. */
async function rejectsWithConfigError(f: () => Promise<unknown>): Promise<ConfigError> {
  try {
    await f();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    const e = err as ConfigError;
    expect(e.variable).toBe('CONVO_MIRROR_EXPORT_DIR');
    expect(e.message).toMatch(/^CONVO_MIRROR_EXPORT_DIR: /);
    expect(e.message).not.toContain('\n');
    return e;
  }
  throw new Error('expected a ConfigError, nothing was thrown');
}

/** `<d>/data/mirror.sqlite` (an empty file is enough: the check never opens it). */
function dbIn(d: string): string {
  fs.mkdirSync(path.join(d, 'data'));
  const db = path.join(d, 'data', 'mirror.sqlite');
  fs.writeFileSync(db, '');
  return db;
}

/** Runs `f` with `dir` as the current directory (vitest runs test files in forked processes). */
function inDir<T>(dir: string, f: () => T): T {
  const before = process.cwd();
  process.chdir(dir);
  try {
    return f();
  } finally {
    process.chdir(before);
  }
}

describe('assertSafeExportDir', () => {
  it('accepts the default layout, a sibling directory, a directory still to be created and a name that merely shares a prefix', () => {
    const d = scratch();
    const db = dbIn(d);
    assertSafeExportDir(path.join(d, 'data', 'exports'), db); // missing: fine
    fs.mkdirSync(path.join(d, 'data', 'exports'));
    assertSafeExportDir(path.join(d, 'data', 'exports'), db); // existing: fine
    assertSafeExportDir(path.join(d, 'exports'), db);
    assertSafeExportDir(path.join(d, 'data', 'exports', 'a', 'b'), db);
    assertSafeExportDir(path.join(d, 'dat'), db);
    assertSafeExportDir(path.join(d, 'data-exports'), db);
    assertSafeExportDir(path.join(d, 'data', 'mirror.sqlite-exports'), db);
    inDir(d, () => assertSafeExportDir('data/exports', 'data/mirror.sqlite'));
    // no database file: only the directory itself is checked
    assertSafeExportDir(path.join(d, 'x'), ':memory:');
  });

  it('refuses the filesystem root, also spelled with ..', () => {
    const d = scratch();
    const db = dbIn(d);
    expect(configError(() => assertSafeExportDir('/', db)).message).toMatch(/export directory \/ is a filesystem root/);
    const up = path.join(d, ...d.split(path.sep).filter(Boolean).map(() => '..'));
    expect(configError(() => assertSafeExportDir(`${d}/../../../../../../../../..`, db)).message).toMatch(/is a filesystem root/);
    expect(configError(() => assertSafeExportDir(up, ':memory:')).message).toMatch(/is a filesystem root/);
  });

  it('refuses an existing file, and a path below a file', () => {
    const d = scratch();
    const db = dbIn(d);
    const file = path.join(d, 'notes.txt');
    fs.writeFileSync(file, 'mine');
    expect(configError(() => assertSafeExportDir(file, db)).message).toBe(
      `CONVO_MIRROR_EXPORT_DIR: the export directory ${file} exists and is not a directory`,
    );
    expect(configError(() => assertSafeExportDir(path.join(file, 'exports'), db)).message).toMatch(/cannot be created: .*notes\.txt is not a directory/);
    expect(fs.readFileSync(file, 'utf8')).toBe('mine');
  });

  it('refuses the database file itself, and a path below it', () => {
    const d = scratch();
    const db = dbIn(d);
    expect(configError(() => assertSafeExportDir(db, db)).message).toMatch(/is the mirror database .*mirror\.sqlite itself/);
    expect(configError(() => assertSafeExportDir(path.join(db, 'x'), db)).message).toMatch(/lies below the path of the mirror database/);
  });

  it("refuses the database's own directory and every ancestor of it", () => {
    const d = scratch();
    const db = dbIn(d);
    const own = configError(() => assertSafeExportDir(path.join(d, 'data'), db)).message;
    expect(own).toBe(
      `CONVO_MIRROR_EXPORT_DIR: the export directory ${path.join(d, 'data')} is the directory of the mirror database ${db}, ` +
        `which would sit inside the export tree; choose a subdirectory such as ${path.join(d, 'data', 'exports')}`,
    );
    expect(configError(() => assertSafeExportDir(d, db)).message).toMatch(/contains the mirror database/);
    expect(configError(() => assertSafeExportDir(path.dirname(d), db)).message).toMatch(/contains the mirror database/);
    // the database still to be created (Mirror.open creates it): same answer
    const later = path.join(d, 'later', 'mirror.sqlite');
    expect(configError(() => assertSafeExportDir(path.join(d, 'later'), later)).message).toMatch(/is the directory of the mirror database/);
  });

  it('refuses . and data/.. with a relative database path', () => {
    const d = scratch();
    dbIn(d);
    inDir(d, () => {
      expect(configError(() => assertSafeExportDir('.', 'data/mirror.sqlite')).message).toMatch(/export directory \. \(.*\) contains the mirror database data\/mirror\.sqlite/);
      expect(configError(() => assertSafeExportDir('data', 'data/mirror.sqlite')).message).toMatch(/is the directory of the mirror database/);
      expect(configError(() => assertSafeExportDir('data/exports/..', 'data/mirror.sqlite')).message).toMatch(/is the directory of the mirror database/);
      expect(configError(() => assertSafeExportDir('./data/', './data/mirror.sqlite')).message).toMatch(/is the directory of the mirror database/);
    });
  });

  it("refuses a symlink pointing at the database's directory, and a database reached through a symlink", () => {
    const d = scratch();
    const db = dbIn(d);
    fs.symlinkSync(path.join(d, 'data'), path.join(d, 'link'));
    expect(configError(() => assertSafeExportDir(path.join(d, 'link'), db)).message).toMatch(
      new RegExp(`export directory ${path.join(d, 'link')} \\(${path.join(d, 'data')}\\) is the directory of the mirror database`),
    );
    // `..` after a symlink goes up from the link's target, as the kernel does (not path.join's way):
    // d/l2 -> d/x/y/z, so d/l2/../../../data is d/data (lexically it would be far above d)
    fs.mkdirSync(path.join(d, 'x', 'y', 'z'), { recursive: true });
    fs.symlinkSync(path.join(d, 'x', 'y', 'z'), path.join(d, 'l2'));
    expect(configError(() => assertSafeExportDir(`${d}/l2/../../../data`, db)).message).toMatch(/is the directory of the mirror database/);
    expect(configError(() => assertSafeExportDir(`${d}/l2/../../..`, db)).message).toMatch(/contains the mirror database/);
    assertSafeExportDir(`${d}/l2/../../../data/exports`, db);
    // the database named through a symlinked directory
    expect(configError(() => assertSafeExportDir(path.join(d, 'data'), path.join(d, 'link', 'mirror.sqlite'))).message).toMatch(
      /is the directory of the mirror database/,
    );
    // a database file that is a symlink: both its directory and its target's directory are refused
    fs.mkdirSync(path.join(d, 'named'));
    fs.symlinkSync(db, path.join(d, 'named', 'mirror.sqlite'));
    expect(configError(() => assertSafeExportDir(path.join(d, 'named'), path.join(d, 'named', 'mirror.sqlite'))).message).toMatch(/is the directory/);
    expect(configError(() => assertSafeExportDir(path.join(d, 'data'), path.join(d, 'named', 'mirror.sqlite'))).message).toMatch(/is the directory/);
    assertSafeExportDir(path.join(d, 'named', 'exports'), path.join(d, 'named', 'mirror.sqlite'));
  });

  it('is checked first by publishChanges, which then writes nothing', async () => {
    const h = await start({ workspace: FakeWorkspace.fromCounts([3]) });
    const before = fs.readdirSync(h.dir).sort();
    await rejectsWithConfigError(() => publishChanges(h.mirror, { exportDir: h.dir }));
    await rejectsWithConfigError(() => publishChanges(h.mirror, { exportDir: path.join(h.dir, '.') }));
    expect(fs.readdirSync(h.dir).sort()).toEqual(before);
    expect(fs.existsSync(path.join(h.dir, MANIFEST))).toBe(false);
  });
});

/** Every entry below `dir` that is not a directory (symlinks not followed), relative, sorted. */
function entries(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(path.join(d, e.name), r);
      else out.push(r);
    }
  };
  if (fs.existsSync(dir)) walk(dir, '');
  return out.sort();
}

const jsonl = (dir: string) => new Map(entries(dir).filter((p) => p.endsWith('.jsonl')).map((p) => [p, fs.readFileSync(path.join(dir, p))]));

describe('temp files live only in .convo-mirror-tmp/', () => {
  it('every temp file of a publication is in .convo-mirror-tmp/, renamed from there into place', async () => {
    const ws = FakeWorkspace.fromCounts([30, 7]);
    const h = await start({ workspace: ws });
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    const seen: { file: string; temps: string[] }[] = [];
    await publishChanges(h.mirror, {
      exportDir: h.exportDir,
      maxLinesPerFile: 10,
      failpoint: (point, file) => {
        if (point === 'before-rename') seen.push({ file: path.relative(h.exportDir, file), temps: entries(h.exportDir).filter((p) => !p.endsWith('.jsonl') && p !== MANIFEST && !p.startsWith('_ledger/')) });
      },
    });
    const published = [...jsonl(h.exportDir).keys()];
    const record = `_ledger/${String((await h.mirror.ledgerHead())!.batch_id).padStart(12, '0')}.json`;
    expect(seen.map((s) => s.file)).toEqual([...published.filter((p) => p.startsWith('conversations/')), ...published.filter((p) => p.startsWith('messages/')), record, MANIFEST]);
    for (const s of seen) {
      expect(s.temps.length, s.file).toBe(1);
      expect(s.temps[0]!.startsWith(`${TEMP_DIR}/`), s.temps[0]).toBe(true);
      expect(path.basename(s.temps[0]!)).toMatch(/^(?:(?:messages|conversations)-\d+-\d+|ledger-\d+|manifest\.json)\.\d+\.tmp$/);
    }
    expect(entries(path.join(h.exportDir, TEMP_DIR))).toEqual([]);
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });

  it('a crash before a rename leaves the temp file in .convo-mirror-tmp/ only; verify reports it; the next publication removes it and publishes the same bytes', async () => {
    const ws = FakeWorkspace.fromCounts([30, 7]);
    const h = await start({ workspace: ws });
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    class Crash extends Error {}
    let renamed = 0;
    await expect(publishChanges(h.mirror, {
        exportDir: h.exportDir,
        failpoint: (point) => {
          if (point === 'before-rename' && ++renamed === 2) throw new Crash('killed');
        },
      })).rejects.toThrow(Crash);
    const left = entries(path.join(h.exportDir, TEMP_DIR));
    expect(left).toHaveLength(1);
    expect(left[0]).toMatch(/^messages-1-\d+\.\d+\.tmp$/);
    expect(entries(h.exportDir).filter((p) => p.endsWith('.tmp'))).toEqual([`${TEMP_DIR}/${left[0]}`]);
    expect(await verifyExports(h.mirror, h.exportDir)).toContainEqual(expect.objectContaining({ path: `${TEMP_DIR}/${left[0]}`, problem: 'temp' }));

    const res = await publishChanges(h.mirror, { exportDir: h.exportDir });
    expect(res.resumed).toBe(true);
    expect(entries(path.join(h.exportDir, TEMP_DIR))).toEqual([]);
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });

  it('a foreign file in .convo-mirror-tmp/ is not removed (verify reports it), and a .convo-mirror-tmp that is not a directory is refused', async () => {
    const ws = FakeWorkspace.fromCounts([4]);
    const h = await start({ workspace: ws });
    await h.sync();
    const foreign = path.join(h.exportDir, TEMP_DIR, 'notes.txt');
    fs.writeFileSync(foreign, 'mine');
    fs.mkdirSync(path.join(h.exportDir, TEMP_DIR, 'messages-1-1.42.tmp')); // our name, but a directory
    await publishChanges(h.mirror, { exportDir: h.exportDir });
    expect(fs.readFileSync(foreign, 'utf8')).toBe('mine');
    expect(fs.statSync(path.join(h.exportDir, TEMP_DIR, 'messages-1-1.42.tmp')).isDirectory()).toBe(true);
    expect((await verifyExports(h.mirror, h.exportDir)).map((p) => [p.path, p.problem])).toEqual([
      [`${TEMP_DIR}/messages-1-1.42.tmp`, 'temp'],
      [`${TEMP_DIR}/notes.txt`, 'temp'],
    ]);

    // .convo-mirror-tmp as a symlink to somewhere else: never written through
    fs.rmSync(path.join(h.exportDir, TEMP_DIR), { recursive: true });
    const elsewhere = scratch();
    fs.symlinkSync(elsewhere, path.join(h.exportDir, TEMP_DIR));
    await expect(publishChanges(h.mirror, { exportDir: h.exportDir })).rejects.toThrowError(
      new RegExp(`${path.join(h.exportDir, TEMP_DIR)} is not a directory \\(symbolic link\\).*reserved for convo-mirror's temp files`),
    );
    expect(fs.readdirSync(elsewhere)).toEqual([]);
  });
});

/**
 * Runs `f` (synchronous, so nothing else runs meanwhile) under `mask`. Vitest 4 runs test files in
 * forked child processes (the default pool, `forks`), where process.umask(mask) is allowed; worker
 * threads would throw ERR_WORKER_UNSUPPORTED_OPERATION here.
 */
async function withUmask<T>(mask: number, f: () => T | Promise<T>): Promise<T> {
  const before = process.umask(mask);
  try {
    return await f();
  } finally {
    process.umask(before);
  }
}

const modeOf = (p: string) => fs.lstatSync(p).mode & 0o7777;

/** Modes of every directory and file below `root` (itself excluded), relative path → mode. */
function modesBelow(root: string): Map<string, number> {
  const out = new Map<string, number>();
  const walk = (rel: string) => {
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      out.set(r, modeOf(path.join(root, r)));
      if (e.isDirectory()) walk(r);
    }
  };
  walk('');
  return out;
}

describe('modes of what publication creates, whatever the umask', () => {
  for (const [name, modes, expected] of [
    ['private (default)', undefined, { file: 0o400, dir: 0o700 }],
    ['GROUP_READABLE_MODES', GROUP_READABLE_MODES, { file: 0o440, dir: 0o750 }],
  ] as const) {
    for (const mask of [0, 0o777]) {
      it(`${name}, umask ${mask.toString(8).padStart(4, '0')}: published files read-only ${expected.file.toString(8)}, directories ${expected.dir.toString(8)}, the export root and its missing parents included`, async () => {
        const ws = FakeWorkspace.fromCounts([12, 3]);
        const h = await start({ workspace: ws });
        await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
        const root = path.join(h.dir, 'new-parent', 'exports');
        const res = await withUmask(mask, () => publishChanges(h.mirror, { exportDir: root, ...(modes ? { modes } : {}) }));
        expect(res.files.length).toBeGreaterThan(1);
        expect(modeOf(path.join(h.dir, 'new-parent'))).toBe(expected.dir);
        expect(modeOf(root)).toBe(expected.dir);
        const below = modesBelow(root);
        expect(below.get(TEMP_DIR)).toBe(expected.dir);
        expect(below.get(MANIFEST)).toBe(expected.file);
        for (const f of res.files) expect(below.get(f.path), f.path).toBe(expected.file);
        for (const [p, m] of below) {
          const isDir = fs.lstatSync(path.join(root, p)).isDirectory();
          expect(m, p).toBe(isDir ? expected.dir : expected.file);
        }
        expect([...below.keys()].filter((p) => fs.lstatSync(path.join(root, p)).isDirectory()).length).toBeGreaterThanOrEqual(7);
      });
    }
  }

  it('leaves an existing export root and existing partition directories as they are', async () => {
    const ws = FakeWorkspace.fromCounts([5]);
    const h = await start({ workspace: ws });
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    fs.mkdirSync(path.join(h.exportDir, 'messages'), { recursive: true });
    fs.chmodSync(h.exportDir, 0o755);
    fs.chmodSync(path.join(h.exportDir, 'messages'), 0o711);
    await withUmask(0, () => publishChanges(h.mirror, { exportDir: h.exportDir }));
    expect(modeOf(h.exportDir)).toBe(0o755);
    expect(modeOf(path.join(h.exportDir, 'messages'))).toBe(0o711);
    expect(modeOf(path.join(h.exportDir, 'conversations'))).toBe(0o700);
    expect(modeOf(path.join(h.exportDir, TEMP_DIR))).toBe(0o700);
    expect(modeOf(path.join(h.exportDir, MANIFEST))).toBe(0o400);
  });
});

describe('a manifest.json convo-mirror did not write is never overwritten', () => {
  const garbage: [string, (file: string) => void, RegExp][] = [
    ['not JSON', (f) => fs.writeFileSync(f, 'my shopping list\n'), /is not a convo-mirror manifest \(not JSON\)/],
    ['JSON of another program', (f) => fs.writeFileSync(f, '{"name":"my-app","version":"1.0.0"}\n'), /is not a convo-mirror manifest \(format absent, expected "convo-mirror-exports"\)/],
    ['a JSON array', (f) => fs.writeFileSync(f, '[]'), /is not a convo-mirror manifest \(format absent/],
    ['another format', (f) => fs.writeFileSync(f, '{"format":"other-exports","mirror_id":"x"}'), /format "other-exports"/],
    ['a newer manifest version', (f) => fs.writeFileSync(f, '{"format":"convo-mirror-exports","version":4}'), /manifest version 4, which this convo-mirror does not know \(it writes 3\)/],
    ['a directory', (f) => fs.mkdirSync(f), /is not a regular file \(directory\)/],
    ['a symlink', (f) => fs.symlinkSync(path.join(path.dirname(f), 'README'), f), /is not a regular file \(symbolic link\)/],
  ];
  for (const [what, make, why] of garbage) {
    it(`refuses a manifest.json that is ${what}, before writing anything`, async () => {
      const h = await start({ workspace: FakeWorkspace.fromCounts([6, 2]) });
      await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
      fs.mkdirSync(h.exportDir);
      fs.writeFileSync(path.join(h.exportDir, 'README'), 'exports of the BI team\n');
      const file = path.join(h.exportDir, MANIFEST);
      make(file);
      const before = fs.lstatSync(file).isFile() ? fs.readFileSync(file) : undefined;
      let err: unknown;
      try {
        await publishChanges(h.mirror, { exportDir: h.exportDir });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ExportError);
      expect((err as Error).message).toMatch(why);
      expect((err as Error).message).toContain(`${file} `);
      expect((err as Error).message).toMatch(/move it away, or choose another CONVO_MIRROR_EXPORT_DIR$/);
      if (before) expect(fs.readFileSync(file).equals(before)).toBe(true);
      expect(fs.readdirSync(h.exportDir).sort()).toEqual(['README', MANIFEST]);
      expect((await h.mirror.counts()).export_watermark).toBe(0);
    });
  }

  it('a sync over a garbage manifest fails with that error, and the manifest keeps its bytes', async () => {
    const h = await start({ workspace: FakeWorkspace.fromCounts([6]) });
    await h.sync();
    const file = path.join(h.exportDir, MANIFEST);
    fs.writeFileSync(file, '{ truncated');
    await expect(h.sync()).rejects.toThrowError(new RegExp(`${file} is not a convo-mirror manifest \\(not JSON\\)`));
    expect(fs.readFileSync(file, 'utf8')).toBe('{ truncated');
    const runs = (await h.mirror.lastRuns(10)) as { status: string }[];
    expect(runs.map((r) => r.status).reverse()).toEqual(['succeeded', 'failed']);
  });

  it('a missing manifest is rewritten from the mirror, byte for byte (at the same time); files of others beside it are left alone', async () => {
    const clock = frozenClock(Date.UTC(2026, 10, 25, 10));
    const h = await start({ workspace: FakeWorkspace.fromCounts([6, 130]), clock });
    fs.mkdirSync(h.exportDir);
    fs.writeFileSync(path.join(h.exportDir, 'README'), 'exports of the BI team\n');
    await h.sync();
    const file = path.join(h.exportDir, MANIFEST);
    const bytes = fs.readFileSync(file);
    fs.rmSync(file);
    const res = await publishChanges(h.mirror, { exportDir: h.exportDir, clock });
    expect(res.files).toEqual([]);
    expect(fs.readFileSync(file).equals(bytes)).toBe(true);
    expect(fs.readFileSync(path.join(h.exportDir, 'README'), 'utf8')).toBe('exports of the BI team\n');
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });
});

describe('verifyExports trusts nothing on disk', () => {
  /** A mirror with several published batches, several partitions, and its intact exports. */
  async function published(): Promise<Harness> {
    const ws = FakeWorkspace.fromCounts([30, 120, 4]);
    const h = await start({ workspace: ws });
    await h.sync();
    const c = ws.list()[1]!;
    ws.appendMessages(c.id, 3);
    ws.editMessage(c.id, c.messages[110]!.id, 'edited');
    await h.sync();
    expect((await h.mirror.publishedFiles()).filter((f) => f.stream !== 'runs')).toHaveLength(4);
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
    return h;
  }
  const manifestFile = (h: Harness) => path.join(h.exportDir, MANIFEST);
  const readManifest = (h: Harness) => JSON.parse(fs.readFileSync(manifestFile(h), 'utf8')) as Manifest;
  const writeManifest = (h: Harness, m: unknown) => fs.writeFileSync(manifestFile(h), JSON.stringify(m, null, 2) + '\n');
  const firstMessagesFile = (h: Harness) => ledgerFiles(h.exportDir).find((f) => f.stream === 'messages')!.path;

  it('nothing published and no export directory, or an empty one: no problem', async () => {
    const h = await start({ workspace: FakeWorkspace.fromCounts([3]) });
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
    fs.mkdirSync(h.exportDir);
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });

  it('published, then the whole export directory gone: one problem saying so', async () => {
    const h = await published();
    fs.rmSync(h.exportDir, { recursive: true });
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([{ path: MANIFEST, problem: 'missing', detail: `${h.exportDir} does not exist` }]);
  });

  it('a deleted manifest', async () => {
    const h = await published();
    fs.rmSync(manifestFile(h));
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([{ path: MANIFEST, problem: 'missing' }]);
  });

  it('a garbage manifest', async () => {
    const h = await published();
    fs.writeFileSync(manifestFile(h), 'my shopping list\n');
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([{ path: MANIFEST, problem: 'manifest', detail: 'not JSON' }]);
  });

  it('a manifest pointing at an older head, another watermark, an old version, a malformed time, or only reformatted', async () => {
    const h = await published();
    const good = readManifest(h);
    const head = `${good.head!.batch_id}:${good.head!.hash}`;
    const older = (await h.mirror.ledgerEntries())[0]!;
    const expected = `head ${head} with watermark ${good.watermark}, as the mirror records`;
    const cases: [unknown, Record<string, unknown>][] = [
      [{ ...good, head: { batch_id: older.batch_id, hash: older.hash, record: older.path } }, { found: `head ${older.batch_id}:${older.hash} with watermark ${good.watermark}`, expected }],
      [{ ...good, watermark: good.watermark - 10 }, { found: `head ${head} with watermark ${good.watermark - 10}`, expected }],
      [{ ...good, version: 1 }, { detail: 'version 1, written before the ledger: the next sync rewrites it as version 3' }],
      [{ ...good, version: 7 }, { detail: 'version 7, which this convo-mirror does not know (it writes 3)' }],
      [{ ...good, signed_at: 'yesterday' }, { detail: 'signed_at: an ISO 8601 UTC time such as 2026-11-25T10:00:00.000Z' }],
      [{ ...good, head: { ...good.head, record: '_ledger/x.json' } }, { detail: `head.record "_ledger/x.json" is not the record of batch ${good.head!.batch_id} (${good.head!.record})` }],
    ];
    for (const [m, said] of cases) {
      writeManifest(h, m);
      expect(await verifyExports(h.mirror, h.exportDir), JSON.stringify(said)).toEqual([{ path: MANIFEST, problem: 'manifest', ...said }]);
    }
    // A version 2 manifest (before heads were signed) pointing at the head is read, and accepted.
    const { signed_at: _t, ...v2 } = { ...good, version: 2 };
    writeManifest(h, v2);
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
    fs.writeFileSync(manifestFile(h), JSON.stringify(good) + '\n');
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([{ path: MANIFEST, problem: 'manifest', detail: 'its content is well formed but its bytes are not the canonical rendering (edited by hand?)' }]);
    // and the exact bytes again: intact
    fs.writeFileSync(manifestFile(h), renderManifest(manifestOf(await h.mirror.mirrorId(), await h.mirror.ledgerHead(), await h.mirror.exportWatermark(), good.signed_at)));
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });

  it('a removed data file, and a byte appended to another', async () => {
    const h = await published();
    const [a, b] = ledgerFiles(h.exportDir);
    fs.rmSync(path.join(h.exportDir, a!.path));
    fs.appendFileSync(path.join(h.exportDir, b!.path), 'x');
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([
      { path: a!.path, problem: 'missing' },
      { path: b!.path, problem: 'size', found: b!.bytes + 1, expected: b!.bytes },
      { path: b!.path, problem: 'sha256', found: expect.stringMatching(/^[0-9a-f]{64}$/), expected: b!.sha256 },
      // the bytes after the last LF are one more line
      {
        path: b!.path,
        problem: 'merkle_root',
        found: linesMerkleRoot(fs.readFileSync(path.join(h.exportDir, b!.path))),
        expected: b!.merkle_root,
        detail: expect.stringMatching(new RegExp(`^the Merkle tree hash of its ${b!.lines + 1} lines is not the one the record of batch \\d+ \\(_ledger/\\d{12}\\.json\\) commits to`)),
      },
    ]);
    fs.appendFileSync(path.join(h.exportDir, b!.path), '\n');
    expect((await verifyExports(h.mirror, h.exportDir)).map((p) => p.problem)).toEqual(['missing', 'size', 'sha256', 'lines', 'merkle_root']);
  });

  it('an unlisted notes.txt, dotfile and .tmp file in messages/…, but not a README or .tmp file at the root', async () => {
    const h = await published();
    const dir = path.dirname(firstMessagesFile(h));
    fs.writeFileSync(path.join(h.exportDir, dir, 'notes.txt'), 'mine');
    fs.writeFileSync(path.join(h.exportDir, dir, '.hidden'), '');
    fs.writeFileSync(path.join(h.exportDir, 'messages', '.x.jsonl.123.tmp'), '');
    fs.writeFileSync(path.join(h.exportDir, 'README'), 'exports of the BI team\n');
    fs.writeFileSync(path.join(h.exportDir, '.x.jsonl.123.tmp'), '');
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([
      { path: 'messages/.x.jsonl.123.tmp', problem: 'unlisted' },
      { path: `${dir}/.hidden`, problem: 'unlisted' },
      { path: `${dir}/notes.txt`, problem: 'unlisted' },
    ]);
    // publication leaves all of them alone
    await publishChanges(h.mirror, { exportDir: h.exportDir });
    for (const p of [`${dir}/notes.txt`, `${dir}/.hidden`, 'messages/.x.jsonl.123.tmp', 'README', '.x.jsonl.123.tmp']) {
      expect(fs.existsSync(path.join(h.exportDir, p)), p).toBe(true);
    }
  });

  it('a symlink in a partition is unlisted and never followed; a recorded file replaced by a symlink to identical bytes is not trusted', async () => {
    const h = await published();
    const outside = scratch();
    const rel = firstMessagesFile(h);
    const dir = path.dirname(rel);
    // a symlink out of the export directory, to a file and to a directory
    fs.writeFileSync(path.join(outside, 'secret.jsonl'), 'x\n');
    fs.symlinkSync(path.join(outside, 'secret.jsonl'), path.join(h.exportDir, dir, 'link.jsonl'));
    fs.symlinkSync(outside, path.join(h.exportDir, 'conversations', 'elsewhere'));
    // the recorded file moved out and symlinked back: same bytes, not a regular file
    fs.renameSync(path.join(h.exportDir, rel), path.join(outside, 'copy.jsonl'));
    fs.symlinkSync(path.join(outside, 'copy.jsonl'), path.join(h.exportDir, rel));
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([
      { path: rel, problem: 'not-regular', detail: 'symbolic link, expected a regular file' },
      { path: `${dir}/link.jsonl`, problem: 'unlisted', detail: 'symbolic link, not followed' },
      { path: 'conversations/elsewhere', problem: 'unlisted', detail: 'symbolic link, not followed' },
    ]);
  });

  it('a partition directory replaced by a symlink to a copy: its files are not trusted, the symlink is unlisted', async () => {
    const h = await published();
    const rel = firstMessagesFile(h);
    const account = rel.split('/').slice(0, 2).join('/');
    const outside = scratch();
    fs.cpSync(path.join(h.exportDir, account), path.join(outside, 'copy'), { recursive: true });
    fs.rmSync(path.join(h.exportDir, account), { recursive: true });
    fs.symlinkSync(path.join(outside, 'copy'), path.join(h.exportDir, account));
    const found = await verifyExports(h.mirror, h.exportDir);
    const messages = ledgerFiles(h.exportDir).filter((f) => f.stream === 'messages');
    expect(found).toEqual([
      ...messages.map((f) => ({ path: f.path, problem: 'not-regular', detail: `reached through the symbolic link ${account}, not followed` })),
      { path: account, problem: 'unlisted', detail: 'symbolic link, not followed' },
    ]);
  });

  it('a publication interrupted after its files and record, before the mirror recorded it: verify says so; the next sync completes it', async () => {
    const ws = FakeWorkspace.fromCounts([10]);
    const h = await start({ workspace: ws });
    await h.sync();
    ws.appendMessages(ws.list()[0]!.id, 2);
    const pending = (await syncThenCrashPublication(h)).id;
    // The manifest is written only after the mirror records the batch: it still shows the head before.
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([
      { path: `_ledger/${String(pending).padStart(12, '0')}.json`, problem: 'mirror', detail: 'left by an interrupted publication; the next sync records it' },
    ]);
    await h.sync();
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });

  it('a publication interrupted after the mirror recorded it, before the manifest: verify says the manifest is behind; the next sync publishes the head', async () => {
    const ws = FakeWorkspace.fromCounts([10]);
    const h = await start({ workspace: ws });
    await h.sync();
    ws.appendMessages(ws.list()[0]!.id, 2);
    await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
    class Crash extends Error {}
    await expect(publishChanges(h.mirror, { exportDir: h.exportDir, failpoint: (p) => { if (p === 'before-head') throw new Crash(); } })).rejects.toThrow(Crash);
    expect(await h.mirror.pendingExportBatch()).toBeUndefined();
    const recorded = (await h.mirror.ledgerHead())!.batch_id;
    expect(recorded).toBeGreaterThan(1);
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([
      { path: MANIFEST, problem: 'manifest', found: expect.stringMatching(new RegExp(`^head ${recorded - 1}:[0-9a-f]{64} with watermark \\d+$`)), expected: expect.stringMatching(new RegExp(`^head ${recorded}:[0-9a-f]{64} with watermark \\d+, as the mirror records$`)) },
    ]);
    await h.sync();
    expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
  });
});
