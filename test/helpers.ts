/**
 * Shared test utilities: real temp dirs, the real fake API over HTTP, real SQLite. Nothing of ours
 * is mocked (design habit 9).
 */
import { LEDGER_DIR, type LedgerRecord, type RecordFile } from '../src/export/ledger.js';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { ServerResponse } from 'node:http';
import { pino, type Logger } from 'pino';
import { ApiClient, type ApiClientOptions } from '../src/api/client.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror, readConsistent } from '../src/store/open-mirror.js';
import { systemClock, type Clock } from '../src/clock.js';
import { FakeWorkspace, startFakeApi, type FakeApi, type FakeApiOptions } from '../src/fake-api/index.js';
import { runSync, type RunOptions, type RunSummary } from '../src/run/index.js';
import type { SyncDeps } from '../src/sync/types.js';
import { sqlAll } from './sql.js';
import { publishChanges, type ExportFailpoint } from '../src/export/exporter.js';
import { syncWorkspace } from '../src/sync/workspace.js';
import type { EngineFixture } from './engines.js';

export const API_KEY = 'test-key-5f0c1d2e';
export const ACCOUNT_ID = '3d6f0a52-8c1e-4b7a-9f20-6e5d4c3b2a10';

/** A fresh temp directory, removed by the returned cleanup. */
export function tempDir(prefix = 'convo-mirror-test-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** A logger that discards everything (set TEST_LOG=debug to see logs). */
export function quietLogger(): Logger {
  return pino({ level: process.env.TEST_LOG ?? 'silent' });
}

/** Everything a sync test needs: fake API, client, mirror, dirs. */
export interface Harness {
  fake: FakeApi;
  api: ApiClient;
  mirror: Mirror;
  deps: SyncDeps;
  dir: string;
  /** The mirror's target (`CONVO_MIRROR_DB`): its SQLite file, or with `opts.engine` postgres its URL. */
  dbPath: string;
  exportDir: string;
  /** Runs a recorded sync with the harness's mirror and exports. */
  sync(opts?: Partial<RunOptions>): Promise<RunSummary>;
  close(): Promise<void>;
}

/** Options of {@link harness}. */
export interface HarnessOptions {
  workspace: FakeWorkspace;
  /** Require X-Account-Id at the fake and send it from the client. @defaultValue true */
  withAccount?: boolean;
  client?: Partial<ApiClientOptions>;
  fake?: Partial<FakeApiOptions>;
  clock?: Clock;
  /**
   * The engine of the mirror (test/engines.ts): a fresh target of it, opened through the fixture
   * (so the fixture's `cleanup` closes and gives it back). @defaultValue a SQLite file in the harness's temp dir
   */
  engine?: EngineFixture;
}

/** Starts the fake API on a free 127.0.0.1 port and opens a mirror (by default in a temp dir). */
export async function harness(opts: HarnessOptions): Promise<Harness> {
  const withAccount = opts.withAccount ?? true;
  const fake = await startFakeApi({ workspace: opts.workspace, apiKey: API_KEY, ...(withAccount ? { accountId: ACCOUNT_ID } : {}), ...opts.fake });
  const dir = tempDir();
  const dbPath = opts.engine ? opts.engine.target() : path.join(dir, 'mirror.sqlite');
  const exportDir = path.join(dir, 'exports');
  const clock = opts.clock ?? systemClock;
  const logger = quietLogger();
  const api = new ApiClient({
    baseUrl: fake.url,
    apiKey: API_KEY,
    accountId: withAccount ? ACCOUNT_ID : undefined,
    maxRps: 0,
    backoff: { baseMs: 5, maxMs: 20 },
    clock,
    logger,
    ...opts.client,
  });
  const mirror = opts.engine ? await opts.engine.open({ clock }, dbPath) : await openMirror(dbPath, { clock });
  const deps: SyncDeps = { api, mirror, logger, clock };
  return {
    fake,
    api,
    mirror,
    deps,
    dir,
    dbPath,
    exportDir,
    sync: (o = {}) => runSync(deps, { accountId: withAccount ? ACCOUNT_ID : 'default', exportDir, concurrency: 4, ...o }),
    close: async () => {
      await api.close();
      await mirror.close();
      await fake.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A message row of the mirror, as compared with the fake. */
export interface MirroredMessage {
  conversation_id: string;
  id: string;
  position: number;
  raw: string;
}

/** Live messages in the mirror, keyed `conversation_id/id` → served JSON. */
export function liveMessages(mirror: Mirror, accountId = ACCOUNT_ID): Map<string, string> {
  const rows = sqlAll<MirroredMessage>(mirror, `SELECT conversation_id, id, raw FROM messages WHERE account_id = ? AND deleted_at IS NULL`, accountId);
  return new Map(rows.map((r) => [`${r.conversation_id}/${r.id}`, r.raw]));
}

/** What the fake serves now, keyed like {@link liveMessages}. */
export function fakeMessages(ws: FakeWorkspace): Map<string, string> {
  const out = new Map<string, string>();
  for (const c of ws.list()) for (const m of c.messages) out.set(`${c.id}/${m.id}`, JSON.stringify(m));
  return out;
}

/** Asserts-by-value helper: the mirror's live messages and conversations equal the fake's. */
export function mirrorEqualsFake(mirror: Mirror, ws: FakeWorkspace, accountId = ACCOUNT_ID): { ok: boolean; detail: string } {
  const a = liveMessages(mirror, accountId);
  const b = fakeMessages(ws);
  const missing = [...b.keys()].filter((k) => a.get(k) !== b.get(k));
  const extra = [...a.keys()].filter((k) => !b.has(k));
  const convs = new Map(
    sqlAll<{ id: string; raw: string }>(mirror, `SELECT id, raw FROM conversations WHERE account_id = ? AND deleted_at IS NULL`, accountId).map((r) => [r.id, r.raw]),
  );
  const fakeConvs = new Map(ws.list().map((c) => [c.id, JSON.stringify(c.data)]));
  const convMissing = [...fakeConvs.keys()].filter((id) => convs.get(id) !== fakeConvs.get(id));
  const convExtra = [...convs.keys()].filter((id) => !fakeConvs.has(id));
  const ok = missing.length === 0 && extra.length === 0 && convMissing.length === 0 && convExtra.length === 0;
  return {
    ok,
    detail: `messages missing/different ${missing.length} ${missing.slice(0, 3).join(',')}; extra ${extra.length} ${extra.slice(0, 3).join(',')}; conversations missing/different ${convMissing.length}, extra ${convExtra.length}`,
  };
}

/** One parsed export line. */
export interface ExportLine {
  seq: number;
  op: 'insert' | 'update' | 'delete';
  account_id: string;
  conversation_id?: string;
  id: string;
  [k: string]: unknown;
}

/** Reads every `.jsonl` under the export dir's stream folder, sorted by seq. */
export function readExportLines(exportDir: string, stream: 'messages' | 'conversations' | 'runs'): ExportLine[] {
  const out: ExportLine[] = [];
  const walk = (d: string) => {
    if (!fs.existsSync(d)) return;
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.jsonl')) {
        for (const line of fs.readFileSync(p, 'utf8').split('\n')) if (line) out.push(JSON.parse(line) as ExportLine);
      }
    }
  };
  walk(path.join(exportDir, stream));
  return out.sort((x, y) => x.seq - y.seq);
}

/**
 * Replays exported lines by seq, last op per key: the live set of keys `conversation_id/id`
 * (messages) or `id` (conversations) with the last line of each.
 */
export function replay(lines: ExportLine[], stream: 'messages' | 'conversations'): Map<string, ExportLine> {
  const live = new Map<string, ExportLine>();
  for (const l of lines) {
    const key = stream === 'messages' ? `${l.account_id}/${l.conversation_id}/${l.id}` : `${l.account_id}/${l.id}`;
    if (l.op === 'delete') live.delete(key);
    else live.set(key, l);
  }
  return live;
}

/** Every file the ledger's batch records in `<exportDir>/_ledger/` list, genesis first (records parsed, not verified). */
export function ledgerFiles(exportDir: string): RecordFile[] {
  const dir = path.join(exportDir, LEDGER_DIR);
  if (!fs.existsSync(dir)) return [];
  return fs
    .readdirSync(dir)
    .filter((n) => n.endsWith('.json'))
    .sort()
    .flatMap((n) => (JSON.parse(fs.readFileSync(path.join(dir, n), 'utf8')) as LedgerRecord).files);
}

/**
 * The Merkle tree hash (RFC 6962 §2.1, hex) of a file content's lines, written out from the RFC
 * apart from src/export/merkle.ts, to check it: each line without its LF is a leaf
 * `SHA-256(0x00 || line)`; `n > 1` leaves split at the largest power of two below `n`, node
 * `SHA-256(0x01 || left || right)`; no line: `SHA-256("")`. Bytes after the last LF are a last line.
 */
export function linesMerkleRoot(content: Buffer): string {
  const sha = (...parts: Buffer[]) => crypto.createHash('sha256').update(Buffer.concat(parts)).digest();
  const lines: Buffer[] = [];
  let from = 0;
  for (let lf = content.indexOf(10); lf !== -1; lf = content.indexOf(10, from)) {
    lines.push(content.subarray(from, lf));
    from = lf + 1;
  }
  if (from < content.length) lines.push(content.subarray(from));
  const mth = (leaves: Buffer[]): Buffer => {
    if (leaves.length === 0) return sha();
    if (leaves.length === 1) return sha(Buffer.from([0]), leaves[0]!);
    let k = 1;
    while (k * 2 < leaves.length) k *= 2;
    return sha(Buffer.from([1]), mth(leaves.slice(0, k)), mth(leaves.slice(k)));
  };
  return mth(lines).toString('hex');
}

/** Every file under `dir`, relative `/`-separated path → bytes (empty when `dir` is missing). */
export function snapshotFiles(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const walk = (d: string, rel: string) => {
    if (!fs.existsSync(d)) return;
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(path.join(d, e.name), r);
      else out.set(r, fs.readFileSync(path.join(d, e.name)));
    }
  };
  walk(dir, '');
  return out;
}

/**
 * Environment for a CLI child process against `fake`, with its mirror and exports in `dir`.
 * `extra` overrides; an `undefined` value removes the variable.
 */
export function cliEnv(fake: FakeApi, dir: string, extra: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    CI: 'true',
    CONVO_MIRROR_BASE_URL: fake.url,
    CONVO_MIRROR_API_KEY: API_KEY,
    CONVO_MIRROR_ACCOUNT_ID: ACCOUNT_ID,
    CONVO_MIRROR_DB: path.join(dir, 'mirror.sqlite'),
    CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports'),
    CONVO_MIRROR_MAX_RPS: '0',
    CONVO_MIRROR_MAX_RETRIES: '2',
    // A daemon child gets no HTTP server unless a test asks for one (9464 would clash between tests).
    CONVO_MIRROR_HTTP_PORT: '0',
    LOG_LEVEL: 'info',
  };
  for (const [k, v] of Object.entries(extra)) {
    if (v === undefined) delete env[k];
    else env[k] = v;
  }
  return env;
}

/** Runs `f` on the mirror at `dbPath` opened without the writer lock (a writer may hold it). */
export async function withMirror<T>(dbPath: string, f: (m: Mirror) => T | Promise<T>): Promise<T> {
  const m = await openMirror(dbPath, { lock: false });
  try {
    return await f(m);
  } finally {
    await m.close();
  }
}

/**
 * Harnesses for one test file: `start` opens one and remembers it; call `closeAll` in afterEach.
 */
export function harnessPool(): { start(opts: HarnessOptions): Promise<Harness>; closeAll(): Promise<void> } {
  const open: Harness[] = [];
  return {
    async start(opts) {
      const h = await harness(opts);
      open.push(h);
      return h;
    },
    async closeAll() {
      await Promise.all(open.splice(0).map((h) => h.close()));
    },
  };
}

export { frozenClock, testClock, type TestClock } from './clock.js';

/** One entry of {@link snapshotEntries}: a file's bytes (null for a directory), mtime and mode. */
export interface EntrySnapshot {
  bytes: Buffer | null;
  mtimeMs: number;
  mode: number;
}

/** Every entry of `d` (recursively, `d` itself as '.'): relative path → bytes (files), mtime, mode. */
export function snapshotEntries(d: string): Map<string, EntrySnapshot> {
  const out = new Map<string, EntrySnapshot>();
  const walk = (p: string, rel: string) => {
    for (const e of fs.readdirSync(p, { withFileTypes: true })) {
      const abs = path.join(p, e.name);
      const r = rel ? `${rel}/${e.name}` : e.name;
      const st = fs.statSync(abs);
      out.set(r, { bytes: e.isFile() ? fs.readFileSync(abs) : null, mtimeMs: st.mtimeMs, mode: st.mode });
      if (e.isDirectory()) walk(abs, r);
    }
  };
  const st = fs.statSync(d);
  out.set('.', { bytes: null, mtimeMs: st.mtimeMs, mode: st.mode });
  walk(d, '');
  return out;
}

/** Writes `body` as JSON with its length (for small test servers). */
export function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** Every value of an async generator. */
export async function collect<T>(gen: AsyncGenerator<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of gen) out.push(x);
  return out;
}

/** The rejection of `p`; fails the test when `p` resolves. */
export async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected the promise to reject, but it resolved');
}

/** What {@link syncThenCrashPublication}'s failpoint throws: a crash at that point. */
export class PublicationCrash extends Error {}

/**
 * Commits what changed in the fake (a sync without publication), then publishes until `point`,
 * where the failpoint throws {@link PublicationCrash} (nothing is cleaned up: the state a crash
 * there leaves). Returns the batch left planned and unpublished.
 */
export async function syncThenCrashPublication(h: Harness, point: ExportFailpoint = 'before-record'): Promise<{ id: number; first_seq: number; last_seq: number }> {
  await syncWorkspace(h.deps, { accountId: ACCOUNT_ID, runId: null });
  const crash = (p: ExportFailpoint): void => {
    if (p === point) throw new PublicationCrash(`crashed at ${point}`);
  };
  let thrown: unknown;
  try {
    await publishChanges(h.mirror, { exportDir: h.exportDir, failpoint: crash });
  } catch (err) {
    thrown = err;
  }
  if (!(thrown instanceof PublicationCrash)) throw new Error(`the publication did not reach its ${point} failpoint: ${String(thrown)}`);
  // The batch left planned and unpublished, as the next plan resumes it (that changes nothing).
  const batch = (await h.mirror.pendingExportBatch()) === undefined ? undefined : await h.mirror.planExportBatch(null, new Date(0).toISOString());
  if (!batch?.resumed) throw new Error('no batch was left planned');
  return { id: batch.id, first_seq: batch.first_seq, last_seq: batch.last_seq };
}
