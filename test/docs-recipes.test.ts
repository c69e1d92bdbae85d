/**
 * The SQL the documentation publishes runs and gives the right answers on a real demo archive. Every
 * `sql` block of README.md and docs/*.md is marked on the line before its fence:
 * `<!-- test: duckdb on the demo archive -->` blocks run in DuckDB (@duckdb/node-api) on the
 * export directory of two real `demo` runs, and again on a gzipped one (`.jsonl.gz`), with
 * `data/demo/exports` pointed at them; `<!-- test: sql on the demo mirror -->` blocks run on the
 * demo's SQLite mirror, opened read-only.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DuckDBInstance, type DuckDBConnection } from '@duckdb/node-api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Database } from '../src/store/sqlite/sqlite.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { tempDir } from './helpers.js';
import { docBlocks, docFiles, type DocBlock } from './doc-blocks.js';

const DUCKDB = 'duckdb on the demo archive';
const SQLITE = 'sql on the demo mirror';

const sqlBlocks = docFiles().flatMap(docBlocks).filter((b) => b.lang === 'sql');
const duckBlocks = sqlBlocks.filter((b) => b.marker === DUCKDB);
const sqliteBlocks = sqlBlocks.filter((b) => b.marker === SQLITE);
const where = (b: DocBlock) => `${b.file}:${b.line}`;

/** The demo's fake: 320 conversations, 36,210 messages (seed 42). */
const DEMO = { conversations: 320, messages: 36210 };

let plain: string;
let gzipped: string;
let duck: DuckDBConnection;

beforeAll(async () => {
  assertBuilt();
  plain = tempDir('convo-mirror-recipes-');
  gzipped = tempDir('convo-mirror-recipes-gz-');
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true', LOG_LEVEL: 'warn' };
  for (const [dir, extra, runs] of [
    [plain, {}, 2],
    [gzipped, { CONVO_MIRROR_EXPORT_GZIP: 'true' }, 1],
  ] as const) {
    for (let i = 0; i < runs; i++) {
      const r = await run(['demo', '--dir', dir], { ...env, ...extra }, 120_000);
      expect(r.code, r.stderr).toBe(0);
    }
  }
  expect(fs.readdirSync(path.join(gzipped, 'exports', 'messages')).length).toBeGreaterThan(0);
  duck = await (await DuckDBInstance.create(':memory:')).connect();
}, 240_000);

afterAll(async () => {
  duck?.closeSync();
  await killLeftovers();
  for (const d of [plain, gzipped]) if (d) fs.rmSync(d, { recursive: true, force: true });
});

/** Rows of a DuckDB recipe run on the archive under `demoDir` (its `data/demo/exports` replaced). */
async function duckRows(b: DocBlock, demoDir: string): Promise<Record<string, unknown>[]> {
  expect(b.body, where(b)).toContain("'data/demo/exports/");
  const sql = b.body.replaceAll("'data/demo/exports/", `'${path.join(demoDir, 'exports')}/`);
  const result = await duck.runAndReadAll(sql);
  return result.getRowObjectsJson() as Record<string, unknown>[];
}

describe('the documentation\'s SQL', () => {
  it('every sql block is marked: DuckDB on the demo archive, or SQLite on the demo mirror', () => {
    expect(sqlBlocks.filter((b) => b.marker !== DUCKDB && b.marker !== SQLITE).map(where)).toEqual([]);
    expect(duckBlocks.length).toBeGreaterThanOrEqual(3);
    expect(sqliteBlocks.length).toBeGreaterThanOrEqual(1);
  });

  it('the DuckDB recipes run on a plain and on a gzipped archive, with the demo\'s figures', async () => {
    for (const b of duckBlocks) {
      for (const dir of [plain, gzipped]) {
        const rows = await duckRows(b, dir);
        const label = `${where(b)} on ${dir === plain ? 'the plain' : 'the gzipped'} archive`;
        expect(rows.length, label).toBeGreaterThan(0);
        if (/FROM read_json\w*\('data\/demo\/exports\/messages\//.test(b.body)) {
          expect(rows.length, label).toBe(DEMO.messages);
          expect(rows.every((r) => r['op'] !== 'delete' && typeof r['content'] === 'string'), label).toBe(true);
        } else if (/conversations\//.test(b.body)) {
          // One row per live conversation, data flattened into columns.
          expect(rows.length, label).toBe(DEMO.conversations);
          expect(new Set(rows.map((r) => `${r['account_id']}/${r['id']}`)).size, label).toBe(DEMO.conversations);
          expect(rows.every((r) => typeof r['status'] === 'string' && r['status'] !== ''), label).toBe(true);
          expect(Object.keys(rows[0]!), label).not.toContain('data');
        } else if (/runs\//.test(b.body)) {
          const runs = rows.reduce((n, r) => n + Number(r['runs']), 0);
          // The plain demo ran twice, but the second run changed nothing: its line waits for the
          // next publication with changes (or the heartbeat), so both archives hold one run line.
          expect(runs, label).toBe(1);
          expect(rows.every((r) => r['status'] === 'succeeded'), label).toBe(true);
        } else {
          throw new Error(`${label}: a recipe this test does not know how to check`);
        }
      }
    }
  });

  it('the SQLite queries run on the demo mirror, read-only', () => {
    const db = new Database(`file://${path.join(plain, 'mirror.sqlite')}?immutable=1`, { readonly: true, fileMustExist: true });
    try {
      for (const b of sqliteBlocks) {
        const rows = db.prepare(b.body.trim().replace(/;$/, '')).all() as Record<string, unknown>[];
        expect(rows.length, where(b)).toBeGreaterThan(0);
        if (/GROUP BY 1/.test(b.body)) expect(rows.reduce((n, r) => n + Number(r['count(*)']), 0), where(b)).toBe(DEMO.messages);
        if (/FROM runs/.test(b.body)) expect(rows.map((r) => r['status']), where(b)).toEqual(['succeeded', 'succeeded']);
      }
    } finally {
      db.close();
    }
  });
});
