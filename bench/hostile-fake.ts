/**
 * A fake API with hostile faults armed, in its own process, for the `--hostile` section of
 * `npm run bench` (bench/run.ts). Built to dist/bench/hostile-fake.js.
 *
 * ```sh
 * node dist/bench/hostile-fake.js --api-key K [--counts 3,3,3] [--huge I:BYTES[:chunked]] [--endless I]
 *   [--runaway I] [--runaway-list]
 * ```
 *
 * - `--counts`: messages per conversation, `FakeWorkspace.fromCounts` (default `3,3,3`); an item
 *   `MxN` stands for N conversations of M messages (`3x20000`).
 * - `--huge I:BYTES[:chunked]`: conversation I (0-based, list order) answers every messages page with
 *   a `huge` body of BYTES bytes, with `content-length` unless `:chunked`.
 * - `--endless I`: conversation I answers with an `endless` body.
 * - `--runaway I`: conversation I's messages never end (`runaway`).
 * - `--runaway-list`: the conversation list never ends (`runaway`).
 * Every option but `--api-key` may repeat; every fault is armed with `times: Infinity`.
 *
 * Prints one JSON line on stdout once listening: `{"url", "ids"}` (conversation ids in list order).
 * On SIGTERM or SIGINT it prints one JSON line of what it saw ({@link HostileReport}), stops every
 * writer, closes and exits 0.
 */
import { FakeWorkspace, startFakeApi, type Fault } from '../src/fake-api/index.js';

/** What the hostile fake saw, printed on SIGTERM. */
export interface HostileReport {
  /** Every request received. */
  requests: number;
  /** Requests of `GET /v1/conversations`. */
  listRequests: number;
  /** Requests of each conversation's messages, by id (armed conversations only). */
  messageRequests: Record<string, number>;
  /** Body bytes written for all requests. */
  bytesSent: number;
  /** Each streamed (`huge`/`endless`) answer: path, bytes written, whether the client hung up. */
  streamed: { path: string; bytesSent: number; closedEarly: boolean }[];
}

function values(name: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < process.argv.length; i++) if (process.argv[i] === name && process.argv[i + 1] !== undefined) out.push(process.argv[i + 1]!);
  return out;
}

async function main(): Promise<void> {
  const apiKey = values('--api-key')[0];
  if (!apiKey) throw new Error('--api-key is required');
  // `3,3,3`, or `3x20000` for 20,000 conversations of 3 messages (items may mix both forms).
  const counts = (values('--counts')[0] ?? '3,3,3').split(',').flatMap((item) => {
    const [m, n] = item.split('x');
    return Array.from({ length: n === undefined ? 1 : Number(n) }, () => Number(m));
  });
  const workspace = FakeWorkspace.fromCounts(counts);
  const ids = workspace.list().map((c) => c.id);
  const idAt = (raw: string): string => {
    const id = ids[Number(raw)];
    if (id === undefined) throw new Error(`no conversation at index ${raw} (${ids.length} conversations)`);
    return id;
  };
  const msgPath = (id: string): string => `/v1/conversations/${encodeURIComponent(id)}/messages`;
  const faults: Fault[] = [];
  /** Conversations with a fault armed; `streaming` those answering `huge` or `endless`. */
  const armed = new Set<string>();
  const streaming = new Set<string>();
  for (const spec of values('--huge')) {
    const [index = '', bytes = '', mode] = spec.split(':');
    const id = idAt(index);
    armed.add(id);
    streaming.add(msgPath(id));
    faults.push({ kind: 'huge', bytes: Number(bytes), contentLength: mode !== 'chunked', match: { path: msgPath(id) }, times: Infinity });
  }
  for (const index of values('--endless')) {
    const id = idAt(index);
    armed.add(id);
    streaming.add(msgPath(id));
    faults.push({ kind: 'endless', match: { path: msgPath(id) }, times: Infinity });
  }
  for (const index of values('--runaway')) {
    const id = idAt(index);
    armed.add(id);
    faults.push({ kind: 'runaway', match: { path: msgPath(id) }, times: Infinity });
  }
  if (process.argv.includes('--runaway-list')) faults.push({ kind: 'runaway', match: { path: '/v1/conversations' }, times: Infinity });

  const fake = await startFakeApi({ workspace, apiKey });
  for (const f of faults) fake.injectFault(f);
  process.stdout.write(JSON.stringify({ url: fake.url, ids }) + '\n');

  let stopping = false;
  const stop = async (): Promise<void> => {
    if (stopping) return;
    stopping = true;
    const report: HostileReport = { requests: fake.requests.length, listRequests: 0, messageRequests: {}, bytesSent: 0, streamed: [] };
    for (const id of armed) report.messageRequests[id] = 0;
    for (const r of fake.requests) {
      report.bytesSent += r.bytesSent;
      if (r.path === '/v1/conversations') report.listRequests++;
      for (const id of armed) if (r.path === msgPath(id)) report.messageRequests[id]! += 1;
      if (streaming.has(r.path)) report.streamed.push({ path: r.path, bytesSent: r.bytesSent, closedEarly: r.closedEarly });
    }
    await fake.close();
    process.stdout.write(JSON.stringify(report) + '\n', () => process.exit(0));
  };
  process.on('SIGTERM', () => void stop());
  process.on('SIGINT', () => void stop());
}

main().catch((err: unknown) => {
  process.stderr.write(`hostile fake failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
