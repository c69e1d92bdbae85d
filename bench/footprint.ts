/**
 * The bench's cost-proportional-to-change sections (issue 12), measured the same way before and
 * after its work:
 * - {@link storageFootprint}: database bytes per live message (page count × page size, after a WAL
 *   checkpoint, over live messages) against the raw JSON bytes per message, and what `change_log`
 *   keeps of exported lines;
 * - {@link listingSection}: an incremental sync of a workspace of 20,000 conversations listed
 *   newest activity first, 20 of them changed (new messages, moved to the front): requests (list
 *   pages and crawls) and wall time.
 * The database is read directly with better-sqlite3 (read-only): the bench looks at the file, not
 * through the mirror.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { Logger } from 'pino';
import { ApiClient } from '../src/api/client.js';
import { systemClock } from '../src/clock.js';
import { FakeWorkspace, startFakeApi } from '../src/fake-api/index.js';
import { runSync } from '../src/run/index.js';
import { openMirror } from '../src/store/open-mirror.js';

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;

/** What the database costs per live message, and how much of it the change log's exported lines take. */
export interface StorageFootprint {
  dbBytes: number;
  liveMessages: number;
  dbBytesPerMessage: number;
  rawBytesPerMessage: number;
  dbOverRaw: number;
  /** Bytes of `change_log.record` and `line` kept for rows already published. */
  publishedChangeLogPayloadBytes: number;
}

/** Measures the mirror at `dbPath` (closed): checkpoints its WAL first, then reads it read-only. */
export function storageFootprint(dbPath: string): StorageFootprint {
  const w = new Database(dbPath);
  w.pragma('wal_checkpoint(TRUNCATE)');
  w.close();
  const db = new Database(dbPath, { readonly: true });
  try {
    const one = <T>(sql: string): T => db.prepare(sql).get() as T;
    const pageBytes = one<{ n: number }>(`SELECT (SELECT page_count FROM pragma_page_count()) * (SELECT page_size FROM pragma_page_size()) AS n`).n;
    const m = one<{ n: number; raw: number }>(`SELECT count(*) AS n, coalesce(sum(length(CAST(raw AS BLOB))), 0) AS raw FROM messages WHERE deleted_at IS NULL`);
    // Schema 8 keeps payloads in change_payloads (pruned once published); older ones in change_log.
    const payloadTable = one<{ n: number }>(`SELECT count(*) AS n FROM sqlite_master WHERE name = 'change_payloads'`).n > 0 ? 'change_payloads' : 'change_log';
    const payload = one<{ b: number }>(
      `SELECT coalesce(sum(length(CAST(coalesce(record, '') AS BLOB)) + length(CAST(coalesce(line, '') AS BLOB))), 0) AS b
       FROM ${payloadTable} WHERE seq <= (SELECT watermark FROM export_state WHERE id = 1)`,
    ).b;
    const perMessage = m.n > 0 ? pageBytes / m.n : 0;
    const rawPer = m.n > 0 ? m.raw / m.n : 0;
    return {
      dbBytes: pageBytes,
      liveMessages: m.n,
      dbBytesPerMessage: round(perMessage, 0),
      rawBytesPerMessage: round(rawPer, 0),
      dbOverRaw: rawPer > 0 ? round(perMessage / rawPer, 2) : 0,
      publishedChangeLogPayloadBytes: payload,
    };
  } finally {
    db.close();
  }
}

/** Conversations of the listing section's workspace, and how many change between the two syncs. */
const LISTING_CONVERSATIONS = 20_000;
const LISTING_CHANGED = 20;

/**
 * An incremental sync after 20 of 20,000 conversations changed, in a list ordered by activity
 * (newest first; a changed conversation moves to the front). The fake runs in this process.
 */
export async function listingSection(results: Record<string, unknown>, rows: [string, string, string][], log: (msg: string) => void, logger: Logger): Promise<void> {
  log(`listing: ${LISTING_CONVERSATIONS} conversations ordered by activity, ${LISTING_CHANGED} changed…`);
  const ws = FakeWorkspace.fromCounts(Array.from({ length: LISTING_CONVERSATIONS }, () => 2), 11);
  ws.reverse(); // fromCounts ticks forward: newest activity first
  const fake = await startFakeApi({ workspace: ws, apiKey: 'bench-listing-key' });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-bench-listing-'));
  const mirror = await openMirror(path.join(dir, 'mirror.sqlite'));
  const api = new ApiClient({ baseUrl: fake.url, apiKey: 'bench-listing-key', maxRps: 0, connections: 16, logger });
  const deps = { api, mirror, logger, clock: systemClock };
  const opts = { accountId: 'default', exportDir: path.join(dir, 'exports'), concurrency: 8 };
  try {
    await runSync(deps, opts);
    const list = ws.list();
    for (let i = 0; i < LISTING_CHANGED; i++) {
      const c = list[Math.floor(((i + 0.5) * list.length) / LISTING_CHANGED)]!;
      ws.appendMessages(c.id, 1);
      ws.moveToFront(c.id);
    }
    const before = fake.requests.length;
    const t0 = performance.now();
    const s = await runSync(deps, opts);
    const wallMs = performance.now() - t0;
    const seen = fake.requests.slice(before);
    const listRequests = seen.filter((r) => r.path === '/v1/conversations').length;
    const crawlRequests = seen.length - listRequests;
    results.listing = {
      conversations: LISTING_CONVERSATIONS,
      changed: LISTING_CHANGED,
      requests: s.requests,
      listRequests,
      crawlRequests,
      wallMs: round(wallMs, 0),
      messagesInserted: s.messages.inserted,
      target: 3 + LISTING_CHANGED,
    };
    const met = s.requests <= 3 + LISTING_CHANGED;
    rows.push([
      `incremental, ${LISTING_CHANGED} of ${LISTING_CONVERSATIONS} changed (activity order)`,
      `${s.requests} requests, ${round(wallMs / 1000, 2)} s`,
      `${listRequests} list pages + ${crawlRequests} crawl requests; ${s.messages.inserted} new messages; target ≤ ${3 + LISTING_CHANGED} ${met ? 'met' : 'MISSED'}`,
    ]);
  } finally {
    await api.close();
    await mirror.close();
    await fake.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
