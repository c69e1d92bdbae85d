/**
 * The bench's publication section (issue 11): the time to publish one batch must not grow with
 * what was published before. A mirror gets 1,010+ batches, each one conversation page of 100
 * messages (two data files, one batch record, the manifest pointer), published one by one with the
 * real exporter (fsyncs included); the figures are the median publication time of the 10 batches
 * after 10 prior batches and of the 10 after 1,000 prior batches, and their ratio.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PER_PAGE } from '../src/api/client.js';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { publishChanges } from '../src/export/exporter.js';
import { verifyArchive } from '../src/export/verify.js';
import { Mirror } from '../src/store/mirror.js';

/** Published batches before each measured window. */
const WINDOWS = [10, 1000] as const;
/** Batches measured per window. */
const MEASURED = 10;

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;
const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

function page<T>(items: Record<string, unknown>[]): Page<T> {
  return { page: 1, data: items as unknown as T[], raw: items, meta: { current_page: 1, total_pages: 1, total_count: items.length } };
}

/** One conversation page of 100 messages committed into `mirror` (conversation `c<k>`). */
function commitBatch(mirror: Mirror, k: number): void {
  const id = `c${k}`;
  const messages = Array.from({ length: PER_PAGE }, (_, i) => ({
    id: `m${k}-${i}`,
    content: `message ${i} of conversation ${k}: ${'lorem ipsum '.repeat(8)}`,
    visibility: 'global',
    sender: { id: `u${i % 7}`, name: `User ${i % 7}`, type: i % 2 ? 'Customer' : 'User' },
    created_at: new Date(Date.UTC(2026, 0, 1) + k * 60_000 + i * 1000).toISOString(),
  }));
  mirror.upsertConversations('bench', page<Conversation>([{ id, subject: `conversation ${k}` }]), null);
  mirror.commitMessagesPage('bench', id, page<Message>(messages), null);
  mirror.completeCrawl('bench', id, null);
}

/** Median publication time (ms) of one batch after `WINDOWS[i]` prior batches, and the whole archive's figures. */
export function publicationSection(results: Record<string, unknown>, rows: [string, string, string][], log: (msg: string) => void): void {
  log(`publication: ${WINDOWS.at(-1)! + MEASURED} batches, one by one…`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-bench-pub-'));
  const mirror = Mirror.open(path.join(dir, 'mirror.sqlite'));
  const exportDir = path.join(dir, 'exports');
  const times = new Map<number, number[]>(WINDOWS.map((w) => [w, []]));
  try {
    let published = 0;
    for (const w of WINDOWS) {
      while (published < w) {
        commitBatch(mirror, published);
        publishChanges(mirror, { exportDir });
        published++;
      }
      for (let i = 0; i < MEASURED; i++, published++) {
        commitBatch(mirror, published);
        const t0 = performance.now();
        publishChanges(mirror, { exportDir });
        times.get(w)!.push(performance.now() - t0);
      }
    }
    const v0 = performance.now();
    const report = verifyArchive({ exportDir, mirror });
    const verifyMs = performance.now() - v0;
    const [small, big] = WINDOWS.map((w) => round(median(times.get(w)!), 2));
    const ratio = round(big! / small!, 2);
    results.publication = {
      batchLines: PER_PAGE + 1,
      msPerBatchAfter10: small,
      msPerBatchAfter1000: big,
      ratio,
      records: report.records,
      files: report.files,
      verifyMs: round(verifyMs, 0),
      verifyProblems: report.problems.length,
    };
    rows.push(['publication, one batch after 10 batches', `${small} ms`, `median of ${MEASURED}; ${PER_PAGE + 1} lines, 2 files + record + manifest, fsynced`]);
    rows.push(['publication, one batch after 1,000 batches', `${big} ms`, `${ratio}× the above (${ratio <= 1.5 ? 'target flat (≤ 1.5×) met' : 'target flat (≤ 1.5×) MISSED'})`]);
    rows.push(['verify of that archive', `${round(verifyMs / 1000, 2)} s`, `${report.records} records, ${report.files} files, ${report.problems.length} problems`]);
  } finally {
    mirror.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
