/**
 * The bench's publication section (issue 11): the time to publish one batch must not grow with
 * what was published before. Two archives are built with the real exporter (fsyncs included), one
 * of 10 batches and one of 1,000, each batch one conversation page of 100 messages (two data files,
 * one batch record, the manifest pointer); then 30 more batches are published into each,
 * alternately; the figures are the two medians and their ratio.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PER_PAGE } from '../src/api/client.js';
import type { Conversation, Message, Page } from '../src/api/schemas.js';
import { publishChanges } from '../src/export/exporter.js';
import { verifyArchive } from '../src/export/verify.js';
import type { Mirror } from '../src/store/mirror.js';
import { openMirror } from '../src/store/open-mirror.js';

/** Published batches before each measured window. */
const WINDOWS = [10, 1000] as const;
/** Batches measured per window. */
const MEASURED = 30;

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;
const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

function page<T>(items: Record<string, unknown>[]): Page<T> {
  return { page: 1, data: items as unknown as T[], raw: items, meta: { current_page: 1, total_pages: 1, total_count: items.length } };
}

/** One conversation page of 100 messages committed into `mirror` (conversation `c<k>`). */
async function commitBatch(mirror: Mirror, k: number): Promise<void> {
  const id = `c${k}`;
  const messages = Array.from({ length: PER_PAGE }, (_, i) => ({
    id: `m${k}-${i}`,
    content: `message ${i} of conversation ${k}: ${'lorem ipsum '.repeat(8)}`,
    visibility: 'global',
    sender: { id: `u${i % 7}`, name: `User ${i % 7}`, type: i % 2 ? 'Customer' : 'User' },
    created_at: new Date(Date.UTC(2026, 0, 1) + k * 60_000 + i * 1000).toISOString(),
  }));
  await mirror.upsertConversations('bench', page<Conversation>([{ id, subject: `conversation ${k}` }]), null);
  await mirror.commitMessagesPage('bench', id, page<Message>(messages), null);
  await mirror.completeCrawl('bench', id, null);
}

/** An archive being built: a mirror, its export directory, and the batches published so far. */
interface Archive {
  mirror: Mirror;
  exportDir: string;
  published: number;
}

async function openArchive(dir: string, name: string): Promise<Archive> {
  return { mirror: await openMirror(path.join(dir, `${name}.sqlite`)), exportDir: path.join(dir, name), published: 0 };
}

/** Commits and publishes one batch; returns the publication's time (ms). */
async function publishOne(a: Archive): Promise<number> {
  await commitBatch(a.mirror, a.published++);
  const t0 = performance.now();
  await publishChanges(a.mirror, { exportDir: a.exportDir });
  return performance.now() - t0;
}

/**
 * Median publication time (ms) of one batch into an archive of 10 prior batches and into one of
 * 1,000, measured alternately (one batch to each in turn, {@link MEASURED} each) so that the disk's
 * moods weigh on both alike; and `verify` of the larger archive.
 */
export async function publicationSection(results: Record<string, unknown>, rows: [string, string, string][], log: (msg: string) => void): Promise<void> {
  log(`publication: archives of ${WINDOWS.join(' and ')} batches, then ${MEASURED} more into each, alternately…`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-bench-pub-'));
  const archives: Archive[] = [];
  const times = WINDOWS.map((): number[] => []);
  try {
    for (const w of WINDOWS) archives.push(await openArchive(dir, `after-${w}`));
    for (const [i, a] of archives.entries()) {
      while (a.published < WINDOWS[i]!) await publishOne(a);
    }
    for (let k = 0; k < MEASURED; k++) for (const [i, a] of archives.entries()) times[i]!.push(await publishOne(a));
    const big = archives.at(-1)!;
    const v0 = performance.now();
    const report = await verifyArchive({ exportDir: big.exportDir, mirror: big.mirror });
    const verifyMs = performance.now() - v0;
    const [small, large] = times.map((t) => round(median(t), 2));
    const ratio = round(large! / small!, 2);
    results.publication = {
      batchLines: PER_PAGE + 1,
      measured: MEASURED,
      msPerBatchAfter10: small,
      msPerBatchAfter1000: large,
      ratio,
      records: report.records,
      files: report.files,
      verifyMs: round(verifyMs, 0),
      verifyProblems: report.problems.length,
    };
    rows.push(['publication, one batch after 10 batches', `${small} ms`, `median of ${MEASURED}; ${PER_PAGE + 1} lines, 2 files + record + manifest, fsynced`]);
    rows.push(['publication, one batch after 1,000 batches', `${large} ms`, `${ratio}× the above, measured alternately (${ratio <= 1.5 ? 'target flat (≤ 1.5×) met' : 'target flat (≤ 1.5×) MISSED'})`]);
    rows.push(['verify of that archive', `${round(verifyMs / 1000, 2)} s`, `${report.records} records, ${report.files} files, ${report.problems.length} problems`]);
  } finally {
    for (const a of archives) await a.mirror.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
