/**
 * The PostgreSQL runs, export-ledger, audit and status groups against real PostgreSQL (one random
 * schema for the file, dropped at the end), compared with the SQLite groups where they must agree
 * byte for byte, and the fencing of issue 25 item 4: the publisher lock, the compare-and-set of
 * the ledger head, and planning safe against concurrent planners.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type pg from 'pg';
import { Database } from '../src/store/sqlite/sqlite.js';
import { migrate } from '../src/store/sqlite/schema.js';
import { Runs as SqliteRuns } from '../src/store/sqlite/runs.js';
import { ExportLedger as SqliteLedger } from '../src/store/sqlite/export-ledger.js';
import { StoreError } from '../src/errors.js';
import type { ExportChange, LedgerEntry, LedgerHead, PublishedFile } from '../src/store/types.js';
import { qualify } from '../src/store/postgres/db.js';
import { Runs } from '../src/store/postgres/runs.js';
import { ExportLedger, LedgerFencedError } from '../src/store/postgres/export-ledger.js';
import { AuditReads } from '../src/store/postgres/audit.js';
import { COUNT_NAMES, MirrorStatus } from '../src/store/postgres/status.js';
import { publisherLockKey, tryPublisherLock } from '../src/store/postgres/publisher-lock.js';
import { appendChanges, createSchema, dropSchema, inTransaction, randomSchema, testPool, waitUntilBlocked, type TestChange } from './pg-ledger-helpers.js';

const schema = randomSchema();
let pool: pg.Pool;
const t = (table: string) => qualify(schema, table);
const runs = new Runs(schema);
const ledger = new ExportLedger(schema);
const audit = new AuditReads(schema);
const status = new MirrorStatus(schema);

beforeAll(async () => {
  pool = testPool(12);
  await createSchema(pool, schema);
});

afterAll(async () => {
  await dropSchema(pool, schema);
  await pool.end();
});

/** Empties every table of the schema and restarts its identities (each test starts from a new mirror). */
async function reset(): Promise<void> {
  const tables = ['runs', 'run_failures', 'export_batches', 'export_files', 'ledger', 'ledger_head', 'conversations', 'messages', 'message_history', 'change_log', 'change_payloads', 'checkpoints', 'erasures'];
  await pool.query(`TRUNCATE ${tables.map(t).join(', ')} RESTART IDENTITY`);
  await pool.query(`INSERT INTO ${t('ledger_head')} (id, batch_id, hash) VALUES (1, NULL, NULL)`);
  await pool.query(`UPDATE ${t('export_state')} SET watermark = 0`);
}

/** A SQLite mirror's database at the current schema version, in memory. */
function sqliteDb() {
  const db = new Database(':memory:');
  migrate(db, ':memory:');
  return db;
}

/** Every row of the ledger's tables (and the payload count), to show a refused call changed nothing. */
async function ledgerState(): Promise<unknown> {
  const out: Record<string, unknown> = {};
  for (const table of ['export_state', 'export_batches', 'export_files', 'ledger', 'ledger_head']) out[table] = (await pool.query(`SELECT * FROM ${t(table)} ORDER BY 1`)).rows;
  out.payloads = (await pool.query(`SELECT count(*)::int AS n FROM ${t('change_payloads')}`)).rows[0].n;
  return out;
}

const T0 = '2026-03-01T12:00:00.000Z';
const T1 = '2026-03-01T12:05:00.000Z';
const T2 = '2026-03-01T12:09:00.000Z';

/** A message change of `account` on `day` (YYYY-MM-DD). */
const change = (account: string, day: string, id: string, record = `{"id":"${id}","content":"text of ${id}"}`): TestChange => ({
  stream: 'messages',
  account_id: account,
  conversation_id: 'c1',
  record_id: id,
  synced_at: `${day}T10:00:00.000Z`,
  record,
});

/** A ledger entry for `batch` chaining on `prev`. */
const entryOf = (batchId: number, prev: LedgerHead | undefined, hash = `h${batchId}`): LedgerEntry => ({
  batch_id: batchId,
  hash,
  prev_hash: prev?.hash ?? null,
  path: `_ledger/${String(batchId).padStart(12, '0')}.json`,
  files: 1,
  lines: 1,
  key_id: null,
});

const fileOf = (batchId: number, first: number, last: number): PublishedFile => ({
  path: `messages/A/2026-03-01/${first}.jsonl`,
  stream: 'messages',
  account_id: 'A',
  date: '2026-03-01',
  first_seq: first,
  last_seq: last,
  lines: last - first + 1,
  bytes: 100,
  sha256: 'ab'.repeat(32),
  batch_id: batchId,
});

/** Plans a batch in its own transaction. */
const plan = (gzip = false, runId: number | null = null) => inTransaction(pool, (c) => ledger.plan(c, runId, T0, gzip));

/** Records a batch in its own transaction. */
const record = (batch: { id: number; first_seq: number; last_seq: number }, expected: LedgerHead | undefined, hash?: string) =>
  inTransaction(pool, (c) => ledger.record(c, batch, [fileOf(batch.id, batch.first_seq, batch.last_seq)], entryOf(batch.id, expected, hash), T1, expected));

describe('runs', () => {
  beforeEach(reset);

  it('start, fail, interrupt, resume and finish round-trip like the SQLite group: the same run records byte for byte, the same rows', async () => {
    const db = sqliteDb();
    const lite = new SqliteRuns(db);
    const start = { scope: 'workspace', refresh: 'incremental', trigger: 'schedule', accountId: 'acct' } as const;
    const failures = [
      { id: 'c9', code: 'HTTP_ERROR', status: 503, attempts: 4, message: 'GET /v1/conversations/c9/messages answered 503' },
      { id: 'c2', code: 'SCHEMA_ERROR', status: null, attempts: null, message: 'bad page' },
    ];
    const head = { batch_id: 3, hash: 'f'.repeat(64) };

    const id = await runs.start(pool, start, T0);
    expect(lite.start(start, T0)).toBe(id);
    expect(await runs.status(pool, id)).toBe('running');
    expect(await runs.runningIds(pool)).toEqual(lite.runningIds());
    expect(await runs.resume(pool, id)).toBe('running');

    await inTransaction(pool, (c) => runs.recordFailures(c, id, failures, T1));
    lite.recordFailures(id, failures, T1);
    // Recording again replaces (a retried finish step keeps one row per failure).
    await inTransaction(pool, (c) => runs.recordFailures(c, id, failures, T1));
    lite.recordFailures(id, failures, T1);

    await runs.finish(pool, id, { status: 'interrupted' }, T1, null);
    lite.finish(id, { status: 'interrupted' }, T1, null);
    expect(await runs.lineRecord(pool, id, null)).toEqual(lite.lineRecord(id, null));

    expect(await runs.resume(pool, id)).toBe('resumed');
    expect(lite.resume(id)).toBe('resumed');
    expect(await runs.resume(pool, id)).toBe('running');
    const figures = { status: 'partial', list_passes: 1, conversations_listed: 12, conversations_failed: 2, messages_served: 340, requests: 17, retries: 3, error: 'two conversations failed' } as const;
    await runs.finish(pool, id, figures, T2, head);
    lite.finish(id, figures, T2, head);
    expect(await runs.resume(pool, id)).toBe('ended');
    expect(await runs.resume(pool, 999)).toBe('ended');
    expect(await runs.status(pool, 999)).toBeUndefined();

    const pgLine = await runs.lineRecord(pool, id, head);
    expect(pgLine!.record).toBe(lite.lineRecord(id, head)!.record); // byte for byte: it is an export line
    expect(JSON.parse(pgLine!.record)).toMatchObject({ id: String(id), status: 'partial', resumes: 1, requests: 17, failures: [{ conversation_id: 'c9', status: 503 }, { conversation_id: 'c2', status: null }] });
    expect(await runs.lineRecord(pool, 999, null)).toBeUndefined();

    await runs.setLedgerHead(pool, id, { batch_id: 4, hash: 'e'.repeat(64) });
    lite.setLedgerHead(id, { batch_id: 4, hash: 'e'.repeat(64) });
    const second = await runs.start(pool, { ...start, scope: 'conversations', trigger: 'webhook' }, T2);
    lite.start({ ...start, scope: 'conversations', trigger: 'webhook' }, T2);
    // Every column, in SQLite's order, numbers as numbers.
    const pgRows = await runs.last(pool, 5);
    const liteRows = lite.last(5);
    expect(pgRows.map((r) => Object.keys(r))).toEqual(liteRows.map((r) => Object.keys(r)));
    expect(pgRows).toEqual(liteRows);
    expect(pgRows[0]!.id).toBe(second);
    expect(await runs.lastFailures(pool)).toEqual(lite.lastFailures());
    expect(await runs.runningIds(pool)).toEqual([second]);
    db.close();
  });

  it('two processes resuming one interrupted run at once resume it once', async () => {
    const id = await runs.start(pool, { scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: 'acct' }, T0);
    await runs.finish(pool, id, { status: 'interrupted' }, T1, null);
    const a = await pool.connect();
    const b = await pool.connect();
    try {
      await a.query('BEGIN');
      await b.query('BEGIN');
      expect(await runs.resume(a, id)).toBe('resumed');
      const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
      const second = runs.resume(b, id);
      await waitUntilBlocked(pool, bPid);
      await a.query('COMMIT');
      expect(await second).toBe('running');
      await b.query('COMMIT');
    } finally {
      a.release();
      b.release();
    }
    expect((await runs.last(pool, 1))[0]).toMatchObject({ status: 'running', resumes: 1 });
  });
});

describe('status and audit', () => {
  beforeEach(reset);

  it('counts every row kind as the SQLite group names them, in its order; mirror id and meta', async () => {
    await pool.query(`INSERT INTO ${t('conversations')} (account_id, id, raw_text, deleted_at) VALUES ('A', 'c1', '{"id":"c1"}', NULL), ('A', 'c2', NULL, NULL), ('B', 'c3', '{"id":"c3"}', $1)`, [T0]);
    await pool.query(
      `INSERT INTO ${t('messages')} (account_id, conversation_id, id, raw_text, deleted_at) VALUES ('A', 'c1', 'm1', '{}', NULL), ('A', 'c1', 'm2', $2, NULL), ('A', 'c1', 'm3', '{}', $1), ('B', 'c3', 'm4', '{}', NULL)`,
      [T0, '{"id":"m2","created_at":null,"redacted":{"erasure":1}}'],
    );
    await pool.query(
      `INSERT INTO ${t('erasures')} (id, kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations, published_lines, published_through_seq)
       VALUES (1, 'sender', 'A', 'u1', 'T-1', $1, 1, 0, 0, 0, 0, 0)`,
      [T0],
    );
    await pool.query(`INSERT INTO ${t('message_history')} (account_id, conversation_id, id, raw_text, replaced_by_seq) VALUES ('A', 'c1', 'm1', '{}', 4)`);
    await pool.query(`INSERT INTO ${t('checkpoints')} (account_id, conversation_id) VALUES ('A', 'c1')`);
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1'), change('A', '2026-03-01', 'm2'), change('A', '2026-03-01', 'm3')]);
    await runs.start(pool, { scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: 'A' }, T0);
    await appendChanges(pool, schema, [{ stream: 'runs', account_id: 'A', conversation_id: '', record_id: '1', synced_at: T1, record: '{}' }]);
    await pool.query(`UPDATE ${t('export_state')} SET watermark = 2`);

    const counts = await status.counts(pool);
    expect(Object.keys(counts)).toEqual([...COUNT_NAMES]);
    expect(counts).toEqual({
      conversations: 2,
      conversations_tombstoned: 1,
      messages: 3,
      messages_tombstoned: 1,
      message_history: 1,
      change_log: 4,
      export_watermark: 2,
      unexported_changes: 2,
      unexported_run_lines: 1,
      export_files: 0,
      ledger_records: 0,
      checkpoints: 1,
      runs: 1,
      erasures: 1,
      erasures_pending: 1,
      retention_erasures: 0,
      messages_erased: 1,
      conversations_erased: 0,
    });
    expect(await ledger.unexported(pool)).toBe(2);
    expect(await ledger.waiting(pool)).toEqual({ data: 1, runLines: 1, oldestRunLineAt: T1 });

    expect(await status.mirrorId(pool)).toMatch(/^[0-9a-f]{32}$/);
    expect(await status.meta(pool, 'list_order:A')).toBeUndefined();
    await status.setMeta(pool, 'list_order:A', '{"a":1}');
    await status.setMeta(pool, 'list_order:A', '{"a":2}');
    expect(await status.meta(pool, 'list_order:A')).toBe('{"a":2}');
  });

  it('streams every record row byte for byte as served (raw_text, not jsonb\'s text; tombstones as 1), history and runs; a reader that stops early gives its client back', async () => {
    const n = 2500; // more than one read of the cursor
    // As served: "id" after "zeta", and 1.50 as written; jsonb would give {"id": ..., "zeta": 1.5}.
    const served = (id: string) => `{"zeta":1.50,"id":"${id}"}`;
    await pool.query(
      `INSERT INTO ${t('messages')} (account_id, conversation_id, id, raw, raw_text, deleted_at)
       SELECT 'A', 'c1', k, r::jsonb, r, CASE WHEN i % 10 = 0 THEN $1 END
       FROM generate_series(1, $2::int) i, LATERAL (SELECT 'm' || lpad(i::text, 5, '0') AS k) k, LATERAL (SELECT '{"zeta":1.50,"id":"' || k || '"}' AS r) r`,
      [T0, n],
    );
    await pool.query(`INSERT INTO ${t('conversations')} (account_id, id, raw, raw_text, deleted_at) VALUES ('A', 'c1', $2::text::jsonb, $2::text, NULL), ('A', 'c0', NULL, NULL, $1)`, [T0, served('c1')]);
    await pool.query(
      `INSERT INTO ${t('message_history')} (account_id, conversation_id, id, raw, raw_text, replaced_by_seq) VALUES ('A', 'c1', 'm00001', $1::text::jsonb, $1::text, 9), ('A', 'c1', 'm00002', $2::text::jsonb, $2::text, 7)`,
      [served('m00001'), served('m00002')],
    );
    await runs.start(pool, { scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: 'A' }, T0);
    expect((await pool.query(`SELECT raw::text AS j FROM ${t('messages')} WHERE id = 'm00001'`)).rows[0].j).toBe('{"id": "m00001", "zeta": 1.50}');

    const messages = [];
    for await (const r of audit.records(pool, 'messages')) messages.push(r);
    expect(messages).toHaveLength(n);
    expect(messages[0]).toEqual({ account_id: 'A', conversation_id: 'c1', id: 'm00001', raw: served('m00001'), deleted: 0 });
    expect(messages[9]!.deleted).toBe(1);
    expect(messages.map((m) => m.id)).toEqual([...messages.map((m) => m.id)].sort());
    const conversations = [];
    for await (const r of audit.records(pool, 'conversations')) conversations.push(r);
    expect(conversations).toEqual([
      { account_id: 'A', conversation_id: 'c0', id: 'c0', raw: null, deleted: 1 },
      { account_id: 'A', conversation_id: 'c1', id: 'c1', raw: served('c1'), deleted: 0 },
    ]);
    const history = [];
    for await (const h of audit.history(pool)) history.push(h);
    expect(history.map((h) => [h.seq, h.id, h.raw])).toEqual([
      [7, 'm00002', served('m00002')],
      [9, 'm00001', served('m00001')],
    ]);
    expect(await audit.runs(pool)).toEqual([{ id: 1, status: 'running' }]);

    for await (const r of audit.records(pool, 'messages')) {
      expect(r.id).toBe('m00001');
      break;
    }
    expect(pool.idleCount).toBe(pool.totalCount);
    expect(pool.waitingCount).toBe(0);
  });
});

describe('reading a batch for export', () => {
  beforeEach(reset);

  /** The same change-log rows and payloads in a SQLite mirror. */
  function sqliteWith(rows: { seq: number; c: TestChange }[]) {
    const db = sqliteDb();
    const log = db.prepare(`INSERT INTO change_log (seq, stream, op, account_id, conversation_id, record_id, synced_at) VALUES (?, ?, ?, ?, ?, ?, ?)`);
    const payload = db.prepare(`INSERT INTO change_payloads (seq, record) VALUES (?, ?)`);
    db.transaction(() => {
      for (const { seq, c } of rows) {
        log.run(seq, c.stream, c.op ?? 'insert', c.account_id, c.conversation_id, c.record_id, c.synced_at);
        payload.run(seq, c.record);
      }
    })();
    return db;
  }

  async function pgChunks(first: number, last: number): Promise<ExportChange[][]> {
    const out: ExportChange[][] = [];
    for await (const chunk of ledger.chunksBetween(pool, first, last)) out.push(chunk);
    return out;
  }

  /** Chunks as text: every field in its order, so key order counts too. */
  const shown = (chunks: ExportChange[][]) => chunks.map((c) => c.map((r) => JSON.stringify(r)));

  it('gives the SQLite reader\'s rows and chunks exactly: file order across interleaved accounts, days, seq gaps, partitions longer than a read, and code-unit order of account ids', async () => {
    const rows: { seq: number; c: TestChange }[] = [];
    const add = async (cs: TestChange[], gap = 0) => {
      const seqs = await appendChanges(pool, schema, cs, gap);
      seqs.forEach((seq, i) => rows.push({ seq, c: cs[i]! }));
    };
    const ids = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => `${prefix}${String(i).padStart(4, '0')}`);
    // Account ids whose order differs between UTF-16 code units and code points (an astral
    // character sorts before U+FF5E by code unit, after it by code point).
    const astral = 'acct-\u{1F600}';
    const bmp = 'acct-\uFF5E';
    await add(ids('x', 60).map((id) => change('A', '2026-03-01', id)));
    await add(ids('y', 40).map((id) => change('B', '2026-03-01', id)));
    await add(ids('z', 30).map((id) => change('A', '2026-03-01', id)));
    await add([change(bmp, '2026-03-01', 'u1'), change(astral, '2026-03-01', 'u2')], 100);
    await add(ids('p', 1500).map((id) => change('A', '2026-03-01', id)));
    await add([{ stream: 'conversations', account_id: 'A', conversation_id: 'c1', record_id: 'c1', synced_at: '2026-03-01T10:00:00.000Z', record: '{"id":"c1"}' }]);
    await add(ids('w', 20).map((id) => change('B', '2026-03-02', id)));
    await add(ids('v', 10).map((id) => change('A', '2026-03-02', id)));
    const db = sqliteWith(rows);
    const lite = new SqliteLedger(db);
    const top = rows[rows.length - 1]!.seq;

    for (const [first, last] of [
      [1, top],
      [75, top - 5],
      [500, 700],
      [1, Number.MAX_SAFE_INTEGER],
    ] as const) {
      const mine = await pgChunks(first, last);
      expect(shown(mine)).toEqual(shown([...lite.chunksBetween(first, last)]));
    }
    const all = (await pgChunks(1, top)).flat();
    expect(all).toHaveLength(rows.length);
    expect(all.findIndex((r) => r.account_id === astral)).toBeLessThan(all.findIndex((r) => r.account_id === bmp));
    expect(await pgChunks(top + 1, top + 10)).toEqual([]);
    db.close();
  });

  it('reads at most 8 MiB of payload at once (one larger record alone), chunked as SQLite chunks it', async () => {
    const big = (id: string, mib: number) => change('A', '2026-03-01', id, JSON.stringify({ id, content: 'x'.repeat(mib * 1024 * 1024) }));
    const cs = [...Array.from({ length: 20 }, (_, i) => big(`b${String(i).padStart(2, '0')}`, 1)), big('huge', 9), change('A', '2026-03-01', 'small')];
    const seqs = await appendChanges(pool, schema, cs);
    const chunks = await pgChunks(1, seqs[seqs.length - 1]!);
    const bytes = (c: ExportChange[]) => c.reduce((n, r) => n + Buffer.byteLength(r.record ?? ''), 0);
    for (const c of chunks) expect(c.length === 1 || bytes(c) <= 8 * 1024 * 1024, `${c.length} rows, ${bytes(c)} bytes`).toBe(true);
    expect(chunks.flat().map((r) => r.record_id)).toEqual(cs.map((c) => c.record_id));
    const db = sqliteWith(seqs.map((seq, i) => ({ seq, c: cs[i]! })));
    expect(chunks.map((c) => c.length)).toEqual([...new SqliteLedger(db).chunksBetween(1, seqs[seqs.length - 1]!)].map((c) => c.length));
    expect(chunks.map((c) => c.length)).toContain(1); // the 9 MiB record
    db.close();
  });

  it('an open-ended read gives the rows there were when it started, whatever is committed while it runs; a reader that stops early gives its client back', async () => {
    const before = await appendChanges(pool, schema, [
      ...Array.from({ length: 1500 }, (_, i) => change('A', '2026-03-01', `a${i}`)),
      ...Array.from({ length: 10 }, (_, i) => change('B', '2026-03-01', `b${i}`)),
    ]);
    const seen: number[] = [];
    let committed = 0;
    for await (const chunk of ledger.chunksBetween(pool, 1, Number.MAX_SAFE_INTEGER)) {
      seen.push(...chunk.map((r) => r.seq));
      if (committed === 0) committed = (await appendChanges(pool, schema, [change('A', '2026-03-01', 'late-a'), change('B', '2026-03-01', 'late-b')])).length;
    }
    expect(committed).toBe(2);
    expect(seen.sort((a, b) => a - b)).toEqual(before);

    for await (const chunk of ledger.chunksBetween(pool, 1, Number.MAX_SAFE_INTEGER)) {
      expect(chunk).toHaveLength(1000);
      break;
    }
    expect(pool.idleCount).toBe(pool.totalCount);
    expect(pool.waitingCount).toBe(0);
  });
});

describe('planning a batch', () => {
  beforeEach(reset);

  it('plans (watermark, max(seq)], returns the pending batch (its gzip kept) until it is recorded, then plans what came after', async () => {
    expect(await plan()).toBeUndefined();
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1'), change('A', '2026-03-01', 'm2')]);
    const run = await runs.start(pool, { scope: 'workspace', refresh: 'full', trigger: 'cli', accountId: 'A' }, T0);
    const first = await plan(true, run);
    expect(first).toEqual({ id: 1, first_seq: 1, last_seq: 2, planned_at: T0, run_id: run, gzip: true, resumed: false });
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm3')]);
    expect(await plan(false)).toEqual({ ...first, resumed: true });
    expect(await ledger.pendingBatch(pool)).toBe(1);
    await record(first!, undefined);
    expect(await ledger.pendingBatch(pool)).toBeUndefined();
    expect(await ledger.watermark(pool)).toBe(2);
    expect(await plan()).toMatchObject({ id: 2, first_seq: 3, last_seq: 3, gzip: false, resumed: false });
  });

  it('a planner that comes while another plans waits for its commit, then returns that batch: one batch', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1')]);
    const a = await pool.connect();
    const b = await pool.connect();
    try {
      await a.query('BEGIN');
      await b.query('BEGIN');
      const planned = await ledger.plan(a, null, T0, false);
      expect(planned).toMatchObject({ id: 1, resumed: false });
      const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
      const second = ledger.plan(b, null, T1, true);
      await waitUntilBlocked(pool, bPid); // on export_state's row lock
      await appendChanges(pool, schema, [change('A', '2026-03-01', 'm2')]); // committed meanwhile: not in either plan
      await a.query('COMMIT');
      expect(await second).toEqual({ ...planned, resumed: true });
      await b.query('COMMIT');
    } finally {
      a.release();
      b.release();
    }
    expect((await pool.query(`SELECT id, first_seq, last_seq FROM ${t('export_batches')}`)).rows).toEqual([{ id: '1', first_seq: '1', last_seq: '1' }]);
  });

  it('planners at once plan one batch between them', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1'), change('A', '2026-03-01', 'm2')]);
    const plans = await Promise.all(Array.from({ length: 6 }, () => plan()));
    expect(new Set(plans.map((p) => p!.id)).size).toBe(1);
    expect(plans.filter((p) => !p!.resumed)).toHaveLength(1);
    expect(Number((await pool.query(`SELECT count(*) FROM ${t('export_batches')}`)).rows[0].count)).toBe(1);
  });

  it('the database refuses a second pending batch and a batch over seqs another batch covers', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1'), change('A', '2026-03-01', 'm2'), change('A', '2026-03-01', 'm3')]);
    await plan();
    const insert = (first: number, last: number, publishedAt: string | null) =>
      pool.query(`INSERT INTO ${t('export_batches')} (first_seq, last_seq, planned_at, published_at) VALUES ($1, $2, $3, $4)`, [first, last, T0, publishedAt]);
    await expect(insert(4, 5, null)).rejects.toMatchObject({ code: '23505', constraint: 'export_batches_one_pending' });
    await expect(insert(3, 4, T1)).rejects.toMatchObject({ code: '23P01', constraint: 'export_batches_disjoint' });
    await insert(4, 5, T1); // disjoint and published: accepted
  });
});

describe('recording a publication: the head moves only by compare-and-set', () => {
  beforeEach(reset);

  it('records files, entry, watermark and prunes payloads; a stale head is refused with LEDGER_FENCED and nothing changes', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1'), change('A', '2026-03-01', 'm2')]);
    const b1 = (await plan())!;
    expect(await ledger.head(pool)).toBeUndefined();
    await record(b1, undefined);
    const h1 = { batch_id: 1, hash: 'h1' };
    expect(await ledger.head(pool)).toEqual(h1);
    expect(await ledger.ledgerEntries(pool)).toEqual([entryOf(1, undefined)]);
    expect(await ledger.publishedFiles(pool)).toEqual([fileOf(1, 1, 2)]);
    expect(await ledger.totals(pool)).toEqual({ files: 1, lines: 2, everPublished: true });
    expect(await ledger.genesis(pool)).toBeUndefined();

    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm3')]);
    const b2 = (await plan())!;
    const before = await ledgerState();
    // A publisher that planned on no head (it read the head before batch 1 was recorded).
    const stale = record(b2, undefined, 'h2-stale');
    await expect(stale).rejects.toBeInstanceOf(LedgerFencedError);
    await expect(stale).rejects.toBeInstanceOf(StoreError);
    await expect(stale).rejects.toMatchObject({ code: 'LEDGER_FENCED', retryable: false, context: { expected: 'none', current: '1:h1', batch_id: 2 } });
    // One that planned on a head that never was.
    await expect(record(b2, { batch_id: 1, hash: 'other' })).rejects.toMatchObject({ code: 'LEDGER_FENCED' });
    expect(await ledgerState()).toEqual(before);

    await record(b2, h1);
    expect(await ledger.head(pool)).toEqual({ batch_id: 2, hash: 'h2' });
    expect(await ledger.watermark(pool)).toBe(3);
    expect(Number((await pool.query(`SELECT count(*) FROM ${t('change_payloads')}`)).rows[0].count)).toBe(0);
    // The same batch again, even on the right head: not pending any more.
    await expect(record(b2, { batch_id: 2, hash: 'h2' }, 'h2-again')).rejects.toMatchObject({ code: 'LEDGER_FENCED' });
  });

  it('an entry that does not chain on the head it names is a StoreError, not a fence', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1')]);
    const b1 = (await plan())!;
    const err = await inTransaction(pool, (c) => ledger.record(c, b1, [], entryOf(1, { batch_id: 0, hash: 'x' }), T1, undefined)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreError);
    expect(err).not.toBeInstanceOf(LedgerFencedError);
  });

  it('two publishers recording one batch on one head at once: the second waits, then is fenced; the chain stays linear', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1')]);
    await record((await plan())!, undefined);
    const h1 = { batch_id: 1, hash: 'h1' };
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm2')]);
    const b2 = (await plan())!;
    const a = await pool.connect();
    const b = await pool.connect();
    try {
      await a.query('BEGIN');
      await b.query('BEGIN');
      await ledger.record(a, b2, [fileOf(2, 2, 2)], entryOf(2, h1, 'h2-a'), T1, h1);
      const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
      const late = ledger.record(b, b2, [fileOf(2, 2, 2)], entryOf(2, h1, 'h2-b'), T2, h1).catch((e: unknown) => e);
      await waitUntilBlocked(pool, bPid); // on ledger_head's row lock
      await a.query('COMMIT');
      expect(await late).toMatchObject({ code: 'LEDGER_FENCED', context: { current: '2:h2-a' } });
      await b.query('ROLLBACK');
    } finally {
      a.release();
      b.release();
    }
    const entries = await ledger.ledgerEntries(pool);
    expect(entries.map((e) => [e.batch_id, e.hash, e.prev_hash])).toEqual([
      [1, 'h1', null],
      [2, 'h2-a', 'h1'],
    ]);
  });

  it('the database itself refuses a second record of a batch and a second successor of a record', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1')]);
    await record((await plan())!, undefined);
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm2')]);
    await record((await plan())!, { batch_id: 1, hash: 'h1' });
    const insert = (batchId: number, hash: string, prev: string) =>
      pool.query(`INSERT INTO ${t('ledger')} (batch_id, hash, prev_hash, path, files, lines, published_at) VALUES ($1, $2, $3, 'x', 0, 0, $4)`, [batchId, hash, prev, T2]);
    await expect(insert(2, 'h2-twice', 'h1')).rejects.toMatchObject({ code: '23505' }); // batch 2 again
    await expect(insert(3, 'h3-fork', 'h1')).rejects.toMatchObject({ code: '23505' }); // a fork after h1
    // And the head points at a recorded entry.
    await expect(pool.query(`UPDATE ${t('ledger_head')} SET batch_id = 9, hash = 'h9'`)).rejects.toMatchObject({ code: '23503' });
  });

  it('the genesis record of a carried-over export directory moves the head from none, once', async () => {
    await pool.query(`INSERT INTO ${t('export_batches')} (first_seq, last_seq, planned_at, published_at) VALUES (1, 5, $1, $2)`, [T0, T1]);
    await pool.query(`UPDATE ${t('export_state')} SET watermark = 5`);
    await pool.query(`INSERT INTO ${t('export_files')} (path, batch_id, stream, account_id, date, first_seq, last_seq, lines, bytes, sha256, published_at)
                      VALUES ('messages/A/2026-03-01/1.jsonl', 1, 'messages', 'A', '2026-03-01', 1, 5, 5, 10, 'ab', $1)`, [T1]);
    expect(await ledger.genesis(pool)).toEqual({ batch_id: 1, published_at: T1, last_seq: 5 });
    const genesis = entryOf(1, undefined, 'g');
    await inTransaction(pool, (c) => ledger.recordGenesis(c, genesis, T2, undefined));
    expect(await ledger.head(pool)).toEqual({ batch_id: 1, hash: 'g' });
    expect(await ledger.genesis(pool)).toBeUndefined();
    await expect(inTransaction(pool, (c) => ledger.recordGenesis(c, { ...genesis, hash: 'g2' }, T2, undefined))).rejects.toMatchObject({ code: 'LEDGER_FENCED' });
  });
});

describe('the publisher lock', () => {
  beforeEach(reset);

  it('two publishers trying at once: one gets it; once released, the other can', async () => {
    const [a, b] = await Promise.all([tryPublisherLock(pool, schema), tryPublisherLock(pool, schema)]);
    const won = [a, b].filter((l) => l !== undefined);
    expect(won).toHaveLength(1);
    const lock = won[0]!;
    expect(lock.lost).toBe(false);
    expect(await lock.held()).toBe(true);
    expect(lock.key).toBe(publisherLockKey(schema));
    expect(await tryPublisherLock(pool, schema)).toBeUndefined();
    // Another mirror's publisher is not in the way.
    const other = await tryPublisherLock(pool, `${schema}_other`);
    expect(other).toBeDefined();
    await other!.release();
    await lock.release();
    await lock.release(); // idempotent
    expect(await lock.held()).toBe(false);
    const next = await tryPublisherLock(pool, schema);
    expect(next).toBeDefined();
    await next!.release();
    expect(pool.idleCount).toBe(pool.totalCount);
  });

  it('a lock whose session is killed is lost, and another publisher takes it', async () => {
    const lock = (await tryPublisherLock(pool, schema))!;
    expect(lock).toBeDefined();
    const killed = await pool.query(`SELECT pg_terminate_backend($1, 30000) AS ok`, [lock.pid]);
    expect(killed.rows[0].ok).toBe(true);
    await lock.whenLost;
    expect(lock.lost).toBe(true);
    expect(await lock.held()).toBe(false);
    const next = await tryPublisherLock(pool, schema);
    expect(next).toBeDefined();
    expect(next!.pid).not.toBe(lock.pid);
    await lock.release(); // never throws; the dead client is destroyed
    await next!.release();
    expect((await pool.query('SELECT 1 AS one')).rows[0].one).toBe(1);
  });

  it('a publisher that stalls past losing its lock records nothing when it wakes: the batch is recorded once, the chain stays linear', async () => {
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm1')]);
    await record((await plan())!, undefined);
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm2'), change('A', '2026-03-01', 'm3')]);

    // Publisher A: takes the lock, plans batch 2 on head 1 ... and stalls; its session is ended.
    const lockA = (await tryPublisherLock(pool, schema))!;
    const planA = (await plan())!;
    const headA = await ledger.head(pool);
    await pool.query(`SELECT pg_terminate_backend($1, 30000)`, [lockA.pid]);
    await lockA.whenLost;

    // Publisher B: takes the lock, finds A's batch pending, publishes and records it.
    const lockB = (await tryPublisherLock(pool, schema))!;
    expect(lockB).toBeDefined();
    const planB = (await plan())!;
    expect(planB).toEqual({ ...planA, resumed: true });
    await record(planB, await ledger.head(pool), 'h2-b');
    await appendChanges(pool, schema, [change('A', '2026-03-01', 'm4')]);
    const b3 = (await plan())!;
    await record(b3, await ledger.head(pool), 'h3-b');
    await lockB.release();

    // A wakes up and records what it planned, on the head it read.
    const before = await ledgerState();
    await expect(record(planA, headA, 'h2-a')).rejects.toMatchObject({ code: 'LEDGER_FENCED', context: { expected: '1:h1', current: '3:h3-b' } });
    expect(await ledgerState()).toEqual(before);
    const entries = await ledger.ledgerEntries(pool);
    expect(entries.map((e) => e.batch_id)).toEqual([1, 2, 3]);
    entries.forEach((e, i) => expect(e.prev_hash).toBe(i === 0 ? null : entries[i - 1]!.hash));
    await lockA.release();
  });
});
