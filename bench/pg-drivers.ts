/**
 * `node dist/bench/pg-drivers.js`: node-postgres (`pg`) against Postgres.js (`postgres`) on the
 * PostgreSQL engine's hot path, one page commit (issue 25: "measure both on a page commit"). Not
 * part of `npm run bench`: it chose the driver, and stays to re-check that choice on new versions.
 *
 * A page commit is one transaction on one connection:
 * 1. upsert 100 message rows (`raw` jsonb, about 1 KB each) from arrays (`unnest`), skipping
 *    unchanged rows (`ON CONFLICT ... DO UPDATE ... WHERE raw IS DISTINCT FROM excluded.raw`),
 *    returning which rows were inserted or changed;
 * 2. allocate their change-log seqs from a counter row (`UPDATE counter SET last = last + n RETURNING last`);
 * 3. append one change-log row per changed message (text payload, the served JSON);
 * 4. save the conversation's checkpoint (insert, or update of the same row on its next pages).
 * Page k is page `k % 10` of conversation `k / 10`, so nine checkpoint writes in ten update a row.
 *
 * Drivers: `pg` with unnamed statements (its default), `pg` with named prepared statements, and
 * `postgres` with tagged templates (prepared, its default). Each run starts from empty tables,
 * commits `--warmup` pages unmeasured, then `--commits` pages measured: commits/s (wall) and CPU
 * µs per commit of this process (`process.cpuUsage()`, user + system; the server's CPU is not
 * included). Then it reads the run's change log back in seq order through a cursor (pg-cursor /
 * `.cursor()`, 1,000 rows a batch), as the exporter does: rows/s and CPU µs per row. `--rounds`
 * rounds alternate the drivers' order; the table gives each figure's median and range. Every run
 * checks what it wrote (row counts, seqs 1..n without a gap) before its figures count.
 *
 * The tables live in their own schema (`bench_drivers_<random>`), dropped at the end.
 *
 * Flags: `--dsn URL` (default env CONVO_MIRROR_TEST_PG, else postgres://postgres@127.0.0.1:5432/test),
 * `--commits N` (default 400), `--warmup N` (default 50), `--rounds N` (default 3), `--only pg,pg-named,postgres`
 * (some of the drivers), `--out FILE` (default bench/results/pg-drivers.json).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import Cursor from 'pg-cursor';
import postgres from 'postgres';
import { maskUserInfo } from '../config/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
/** Repository root (this file runs from dist/bench/). */
const root = path.resolve(here, '..', '..');

function argValue(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}
function wholeArg(name: string, dflt: number, min: number): number {
  const raw = argValue(name);
  const n = raw === undefined ? dflt : Number(raw);
  if (!(Number.isInteger(n) && n >= min)) throw new Error(`${name}: must be a whole number >= ${min}, got ${JSON.stringify(raw)}`);
  return n;
}
const dsn = argValue('--dsn') ?? process.env.CONVO_MIRROR_TEST_PG ?? 'postgres://postgres@127.0.0.1:5432/test';
const commits = wholeArg('--commits', 400, 1);
const warmup = wholeArg('--warmup', 50, 0);
const rounds = wholeArg('--rounds', 3, 1);
const outFile = path.resolve(argValue('--out') ?? path.join(root, 'bench', 'results', 'pg-drivers.json'));

/** Rows per page (the API's per_page). */
const PER_PAGE = 100;
/** Pages per conversation: page k is page k % PAGES of conversation floor(k / PAGES). */
const PAGES = 10;
/** Rows per cursor read. */
const CURSOR_BATCH = 1000;
const ACCOUNT = 'bench';
const schema = `bench_drivers_${crypto.randomBytes(6).toString('hex')}`;

// ------------------------------------------------------------------ the page data

/** One page as the engine would commit it: parallel arrays (unnest's input) and the checkpoint. */
interface PageData {
  conversationId: string;
  page: number;
  ids: string[];
  positions: number[];
  /** The served JSON of each message (about 1 KB). */
  raws: string[];
  now: string;
}

const WORDS = 'the customer asked about an invoice refund shipping delay account password reset order tracking number please thanks regards'.split(' ');
/** Deterministic filler text of about `n` characters. */
function text(seed: number, n: number): string {
  let s = '';
  for (let i = 0; s.length < n; i++) s += `${WORDS[(seed * 31 + i * 7) % WORDS.length]} `;
  return s.slice(0, n);
}

/**
 * The served JSON of page `p`'s 100 messages (about 1 KB each). Every conversation's page `p`
 * reuses them, so the measured process holds a few MB of pages, not the whole run's (whose
 * garbage collection would be charged to the drivers).
 */
function pageRaws(p: number): string[] {
  return Array.from({ length: PER_PAGE }, (_, i) => {
    const position = p * PER_PAGE + i;
    return JSON.stringify({
      id: `m-${position}`,
      content: text(position, 720),
      visibility: i % 5 === 0 ? 'personal' : 'global',
      sender: { id: `u${i % 7}`, name: `Agent ${i % 7}`, type: i % 2 ? 'Customer' : 'User', email: `agent${i % 7}@example.com` },
      attachments: i % 4 === 0 ? [{ id: `a${position}`, name: 'screenshot.png', size: 48213, url: `https://files.example.com/a${position}` }] : [],
      created_at: new Date(Date.UTC(2026, 0, 1) + position * 1000).toISOString(),
    });
  });
}
const RAWS = Array.from({ length: PAGES }, (_, p) => pageRaws(p));

/** Page `k` (see the header): 100 messages, each about 1 KB of JSON. */
function pageData(k: number): PageData {
  const conversationId = `c${Math.floor(k / PAGES)}`;
  const page = k % PAGES;
  const positions = Array.from({ length: PER_PAGE }, (_, i) => page * PER_PAGE + i);
  const ids = positions.map((position) => `m-${conversationId}-${position}`);
  return { conversationId, page, ids, positions, raws: RAWS[page]!, now: new Date(Date.UTC(2026, 5, 1) + k).toISOString() };
}

// ------------------------------------------------------------------ SQL (both drivers, same text)

const DDL = `
  CREATE SCHEMA ${schema};
  CREATE TABLE ${schema}.messages (
    account_id text NOT NULL, conversation_id text NOT NULL, id text NOT NULL,
    position integer NOT NULL, raw jsonb NOT NULL,
    first_seen_at text NOT NULL, updated_at text NOT NULL, deleted_at text,
    PRIMARY KEY (account_id, conversation_id, id)
  );
  CREATE TABLE ${schema}.counter (id integer PRIMARY KEY CHECK (id = 1), last bigint NOT NULL);
  CREATE TABLE ${schema}.change_log (
    seq bigint PRIMARY KEY, stream text NOT NULL, op text NOT NULL, account_id text NOT NULL,
    conversation_id text NOT NULL, record_id text NOT NULL, synced_at text NOT NULL, run_id bigint,
    record text NOT NULL
  );
  CREATE TABLE ${schema}.checkpoints (
    account_id text NOT NULL, conversation_id text NOT NULL, next_page integer NOT NULL,
    total_count integer NOT NULL, crawl_started_at text NOT NULL, run_id bigint, updated_at text NOT NULL,
    PRIMARY KEY (account_id, conversation_id)
  );`;
const RESET = `TRUNCATE messages, change_log, checkpoints; DELETE FROM counter; INSERT INTO counter (id, last) VALUES (1, 0)`;

/** $1 account, $2 conversation, $3 ids, $4 positions, $5 raws, $6 now. Returns the inserted or changed rows. */
const UPSERT = `INSERT INTO messages AS m (account_id, conversation_id, id, position, raw, first_seen_at, updated_at)
  SELECT $1, $2, u.id, u.position, u.raw::jsonb, $6, $6 FROM unnest($3::text[], $4::int[], $5::text[]) AS u (id, position, raw)
  ON CONFLICT (account_id, conversation_id, id) DO UPDATE
    SET raw = excluded.raw, position = excluded.position, updated_at = excluded.updated_at, deleted_at = NULL
    WHERE m.raw IS DISTINCT FROM excluded.raw OR m.position IS DISTINCT FROM excluded.position OR m.deleted_at IS NOT NULL
  RETURNING m.id, (m.xmax = 0) AS inserted`;
/** $1 how many seqs. Returns the last one allocated. */
const ALLOCATE = `UPDATE counter SET last = last + $1 WHERE id = 1 RETURNING last`;
/** $1 first seq, $2 account, $3 conversation, $4 synced_at, $5 ops, $6 record ids, $7 records. */
const APPEND = `INSERT INTO change_log (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, record)
  SELECT $1::bigint + u.ord - 1, 'messages', u.op, $2, $3, u.record_id, $4, NULL, u.record
  FROM unnest($5::text[], $6::text[], $7::text[]) WITH ORDINALITY AS u (op, record_id, record, ord)`;
/** $1 account, $2 conversation, $3 next page, $4 total count, $5 now. */
const CHECKPOINT = `INSERT INTO checkpoints (account_id, conversation_id, next_page, total_count, crawl_started_at, run_id, updated_at)
  VALUES ($1, $2, $3, $4, $5, NULL, $5)
  ON CONFLICT (account_id, conversation_id) DO UPDATE
    SET next_page = excluded.next_page, total_count = excluded.total_count, updated_at = excluded.updated_at`;
/** The change log in seq order, as the exporter reads it. */
const STREAM = `SELECT seq, op, conversation_id, record_id, record FROM change_log ORDER BY seq`;

/** What a page commit appends to the change log, from the upsert's returned rows. */
function changes(p: PageData, returned: { id: string; inserted: boolean }[]): { ops: string[]; recordIds: string[]; records: string[] } {
  const rawOf = new Map(p.ids.map((id, i) => [id, p.raws[i]!]));
  return {
    ops: returned.map((r) => (r.inserted ? 'insert' : 'update')),
    recordIds: returned.map((r) => r.id),
    records: returned.map((r) => rawOf.get(r.id)!),
  };
}

// ------------------------------------------------------------------ the drivers

interface Driver {
  name: string;
  /** Commits one page; returns the change-log rows it appended. */
  commit(p: PageData): Promise<number>;
  /** Reads the whole change log through a cursor; returns the rows read (checks seq order). */
  stream(): Promise<number>;
  close(): Promise<void>;
}

/** Both drivers' connections use the benchmark's schema. */
const searchPath = `-c search_path=${schema}`;

async function pgDriver(named: boolean): Promise<Driver> {
  const client = new pg.Client({ connectionString: dsn, options: searchPath });
  await client.connect();
  const q = <R extends pg.QueryResultRow>(name: string, text: string, values: unknown[]) =>
    client.query<R>(named ? { name, text, values } : { text, values });
  return {
    name: named ? 'pg (named prepared)' : 'pg',
    async commit(p) {
      await client.query('BEGIN');
      try {
        const up = await q<{ id: string; inserted: boolean }>('upsert', UPSERT, [ACCOUNT, p.conversationId, p.ids, p.positions, p.raws, p.now]);
        const c = changes(p, up.rows);
        if (c.ops.length > 0) {
          const last = Number((await q<{ last: string }>('allocate', ALLOCATE, [c.ops.length])).rows[0]!.last);
          await q('append', APPEND, [last - c.ops.length + 1, ACCOUNT, p.conversationId, p.now, c.ops, c.recordIds, c.records]);
        }
        await q('checkpoint', CHECKPOINT, [ACCOUNT, p.conversationId, p.page + 1, PAGES * PER_PAGE, p.now]);
        await client.query('COMMIT');
        return c.ops.length;
      } catch (err) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw err;
      }
    },
    async stream() {
      const cursor = client.query(new Cursor<{ seq: string }>(STREAM));
      let n = 0;
      try {
        for (let rows = await cursor.read(CURSOR_BATCH); rows.length > 0; rows = await cursor.read(CURSOR_BATCH)) {
          for (const r of rows) if (Number(r.seq) !== ++n) throw new Error(`pg-cursor: seq ${r.seq} where ${n} was expected`);
        }
      } finally {
        await cursor.close();
      }
      return n;
    },
    close: () => client.end(),
  };
}

async function postgresDriver(): Promise<Driver> {
  const sql = postgres(dsn, { max: 1, onnotice: () => undefined, connection: { search_path: schema } });
  return {
    name: 'postgres',
    async commit(p) {
      return sql.begin(async (tx) => {
        const up = await tx<{ id: string; inserted: boolean }[]>`INSERT INTO messages AS m (account_id, conversation_id, id, position, raw, first_seen_at, updated_at)
          SELECT ${ACCOUNT}, ${p.conversationId}, u.id, u.position, u.raw::jsonb, ${p.now}, ${p.now} FROM unnest(${p.ids}::text[], ${p.positions}::int[], ${p.raws}::text[]) AS u (id, position, raw)
          ON CONFLICT (account_id, conversation_id, id) DO UPDATE
            SET raw = excluded.raw, position = excluded.position, updated_at = excluded.updated_at, deleted_at = NULL
            WHERE m.raw IS DISTINCT FROM excluded.raw OR m.position IS DISTINCT FROM excluded.position OR m.deleted_at IS NOT NULL
          RETURNING m.id, (m.xmax = 0) AS inserted`;
        const c = changes(p, up);
        if (c.ops.length > 0) {
          const [row] = await tx<{ last: string }[]>`UPDATE counter SET last = last + ${c.ops.length} WHERE id = 1 RETURNING last`;
          const first = Number(row!.last) - c.ops.length + 1;
          await tx`INSERT INTO change_log (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, record)
            SELECT ${first}::bigint + u.ord - 1, 'messages', u.op, ${ACCOUNT}, ${p.conversationId}, u.record_id, ${p.now}, NULL, u.record
            FROM unnest(${c.ops}::text[], ${c.recordIds}::text[], ${c.records}::text[]) WITH ORDINALITY AS u (op, record_id, record, ord)`;
        }
        await tx`INSERT INTO checkpoints (account_id, conversation_id, next_page, total_count, crawl_started_at, run_id, updated_at)
          VALUES (${ACCOUNT}, ${p.conversationId}, ${p.page + 1}, ${PAGES * PER_PAGE}, ${p.now}, NULL, ${p.now})
          ON CONFLICT (account_id, conversation_id) DO UPDATE
            SET next_page = excluded.next_page, total_count = excluded.total_count, updated_at = excluded.updated_at`;
        return c.ops.length;
      });
    },
    async stream() {
      let n = 0;
      for await (const rows of sql<{ seq: string }[]>`SELECT seq, op, conversation_id, record_id, record FROM change_log ORDER BY seq`.cursor(CURSOR_BATCH)) {
        for (const r of rows) if (Number(r.seq) !== ++n) throw new Error(`postgres cursor: seq ${r.seq} where ${n} was expected`);
      }
      return n;
    },
    close: () => sql.end({ timeout: 5 }),
  };
}

// ------------------------------------------------------------------ measuring

interface RunFigures {
  driver: string;
  round: number;
  commitsPerSec: number;
  cpuUsPerCommit: number;
  streamRowsPerSec: number;
  cpuUsPerStreamRow: number;
}

const cpuUs = (): number => {
  const u = process.cpuUsage();
  return u.user + u.system;
};
const gc = (globalThis as { gc?: () => void }).gc;
/** Set by Ctrl-C: the current run stops at its next commit, and the schema is still dropped. */
let interrupted = false;
process.once('SIGINT', () => {
  interrupted = true;
});
const stopIfInterrupted = (): void => {
  if (interrupted) throw new Error('interrupted');
};

/** One driver's run on empty tables: warm-up, measured commits, the stream read, then the check. */
async function run(admin: pg.Client, make: () => Promise<Driver>, round: number): Promise<RunFigures> {
  await admin.query(RESET);
  const driver = await make();
  try {
    const pages = Array.from({ length: warmup + commits }, (_, k) => pageData(k));
    let appended = 0;
    for (let k = 0; k < warmup; k++) {
      stopIfInterrupted();
      appended += await driver.commit(pages[k]!);
    }
    gc?.();
    const c0 = cpuUs();
    const t0 = process.hrtime.bigint();
    for (let k = warmup; k < warmup + commits; k++) {
      if (k % 50 === 0) stopIfInterrupted();
      appended += await driver.commit(pages[k]!);
    }
    const wallNs = Number(process.hrtime.bigint() - t0);
    const cpu = cpuUs() - c0;

    gc?.();
    const s0 = cpuUs();
    const st0 = process.hrtime.bigint();
    const streamed = await driver.stream();
    const streamNs = Number(process.hrtime.bigint() - st0);
    const streamCpu = cpuUs() - s0;

    const rows = warmup + commits;
    const expected = rows * PER_PAGE;
    const check = (
      await admin.query<{ messages: string; changes: string; max_seq: string; checkpoints: string; counter: string }>(
        `SELECT (SELECT count(*) FROM messages) AS messages, (SELECT count(*) FROM change_log) AS changes,
                (SELECT max(seq) FROM change_log) AS max_seq, (SELECT count(*) FROM checkpoints) AS checkpoints,
                (SELECT last FROM counter) AS counter`,
      )
    ).rows[0]!;
    const got = [check.messages, check.changes, check.max_seq, check.counter, appended, streamed].map(Number);
    if (got.some((x) => x !== expected) || Number(check.checkpoints) !== Math.ceil(rows / PAGES)) {
      throw new Error(`${driver.name}: wrote ${JSON.stringify(check)}, appended ${appended}, streamed ${streamed}; expected ${expected} rows and ${Math.ceil(rows / PAGES)} checkpoints`);
    }
    return {
      driver: driver.name,
      round,
      commitsPerSec: commits / (wallNs / 1e9),
      cpuUsPerCommit: cpu / commits,
      streamRowsPerSec: streamed / (streamNs / 1e9),
      cpuUsPerStreamRow: streamCpu / streamed,
    };
  } finally {
    await driver.close();
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
/** `median [min-max]`, `d` decimals. */
function spread(xs: number[], d: number): string {
  const f = (x: number) => x.toFixed(d);
  return xs.length === 1 ? f(xs[0]!) : `${f(median(xs))} [${f(Math.min(...xs))}-${f(Math.max(...xs))}]`;
}
const versionOf = (pkg: string): string =>
  (JSON.parse(fs.readFileSync(path.join(root, 'node_modules', pkg, 'package.json'), 'utf8')) as { version: string }).version;

async function main(): Promise<void> {
  const admin = new pg.Client({ connectionString: dsn, options: searchPath });
  try {
    await admin.connect();
  } catch (err) {
    throw new Error(`cannot connect to ${maskUserInfo(dsn)} (--dsn, or CONVO_MIRROR_TEST_PG): ${(err as Error).message}`);
  }
  const server = (await admin.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
  const avgRaw = pageData(0).raws.reduce((a, r) => a + Buffer.byteLength(r), 0) / PER_PAGE;
  process.stdout.write(
    `page commit: ${PER_PAGE} message upserts (raw jsonb, ${Math.round(avgRaw)} bytes on average) + ${PER_PAGE} change-log rows + counter seq + checkpoint, one transaction\n` +
      `PostgreSQL ${server} at ${maskUserInfo(dsn)}, schema ${schema}; node ${process.version}, pg ${versionOf('pg')}, pg-cursor ${versionOf('pg-cursor')}, postgres ${versionOf('postgres')}\n` +
      `${rounds} rounds of ${warmup} warm-up + ${commits} measured commits per driver, order alternating${gc ? '' : ' (run with node --expose-gc to collect garbage between runs)'}; ` +
      `${os.cpus().length} CPUs, load average ${os.loadavg()[0]!.toFixed(2)} (the figures are only comparable within one run)\n`,
  );
  const all: [string, () => Promise<Driver>][] = [['pg', () => pgDriver(false)], ['pg-named', () => pgDriver(true)], ['postgres', () => postgresDriver()]];
  const only = argValue('--only')?.split(',');
  const unknown = only?.filter((n) => !all.some(([name]) => name === n));
  if (unknown?.length) throw new Error(`--only: unknown driver ${unknown.join(', ')} (known: ${all.map(([n]) => n).join(', ')})`);
  const drivers = all.filter(([name]) => only === undefined || only.includes(name)).map(([, make]) => make);
  const figures: RunFigures[] = [];
  try {
    await admin.query(DDL);
    for (let r = 1; r <= rounds; r++) {
      const order = r % 2 === 1 ? drivers : [...drivers].reverse();
      for (const make of order) {
        const f = await run(admin, make, r);
        figures.push(f);
        process.stdout.write(`  round ${r} ${f.driver.padEnd(20)} ${f.commitsPerSec.toFixed(0).padStart(6)} commits/s ${f.cpuUsPerCommit.toFixed(0).padStart(6)} CPU µs/commit   stream ${f.streamRowsPerSec.toFixed(0).padStart(7)} rows/s ${f.cpuUsPerStreamRow.toFixed(2).padStart(6)} CPU µs/row\n`);
      }
    }
  } finally {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch((err: Error) => process.stderr.write(`could not drop schema ${schema}: ${err.message}\n`));
    await admin.end();
  }

  const names = [...new Set(figures.map((f) => f.driver))];
  const rows = names.map((name) => {
    const mine = figures.filter((f) => f.driver === name);
    return [name, spread(mine.map((f) => f.commitsPerSec), 0), spread(mine.map((f) => f.cpuUsPerCommit), 0), spread(mine.map((f) => f.streamRowsPerSec), 0), spread(mine.map((f) => f.cpuUsPerStreamRow), 2)];
  });
  const header = ['driver', 'commits/s', 'CPU µs/commit', 'stream rows/s', 'CPU µs/row'];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  process.stdout.write(`\nmedian [min-max] over ${rounds} rounds; load average at the end ${os.loadavg()[0]!.toFixed(2)}\n${line(header)}\n${rows.map(line).join('\n')}\n`);

  fs.mkdirSync(path.dirname(outFile), { recursive: true });
  fs.writeFileSync(
    outFile,
    `${JSON.stringify({ at: new Date().toISOString(), server, node: process.version, cpus: os.cpus().length, loadAverage: os.loadavg()[0], versions: { pg: versionOf('pg'), 'pg-cursor': versionOf('pg-cursor'), postgres: versionOf('postgres') }, perPage: PER_PAGE, avgRawBytes: Math.round(avgRaw), warmup, commits, rounds, figures }, null, 2)}\n`,
  );
  process.stdout.write(`written to ${outFile}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
