/**
 * Ids a terminal would interpret, through the built CLI as a user runs it: the fake API serves a
 * conversation whose id holds U+202E (RIGHT-TO-LEFT OVERRIDE), U+0085 (NEL, a C1 line break) and
 * ESC (an ANSI sequence), with real HTTP, real SQLite in a temp dir and the test run's real Redis
 * (a failed job naming it, failed by a worker in this process with a reason holding U+009B, CSI).
 * `sync`'s failure lines, `status`, `conversations`, `enqueue --wait` and `retry-failed` must print
 * them only as visible `\u{...}` escapes, and every `--json` must parse to the very same id with
 * those code points written `\uXXXX`. Assertions are on the bytes the child wrote.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { UnrecoverableError, Worker, type Job } from 'bullmq';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { QUEUE_NAME, redisConnection } from '../jobs/queue.js';
import { unsafeCharOf } from '../src/terminal.js';
import { ACCOUNT_ID, API_KEY, cliEnv, tempDir } from './helpers.js';
import { assertBuilt, killLeftovers, run, type Ran } from './children.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';

/** The hostile id: a Trojan Source reversal, a C1 line break, an ANSI clear-screen, and ordinary non-Latin text. */
const EVIL = 'conv-\u202egnp.exe-\u0085-\u001b[2J-李伟🤖';
/** How it must look on a terminal. */
const SHOWN = 'conv-\\u{202E}gnp.exe-\\u{0085}-\\u{001B}[2J-李伟🤖';
/** How it must look inside `--json`: each code point escaped, the rest as JSON.stringify writes it. */
const IN_JSON = 'conv-\\u202egnp.exe-\\u0085-\\u001b[2J-李伟🤖';
/** The failed job's reason: a CSI (C1) clear-screen. */
const REASON = 'refused: \u009b2J for this conversation';

const prefixes = prefixSequence('terminal-cli');
const dirs: string[] = [];
let fake: FakeApi;
let env: NodeJS.ProcessEnv;
let dir: string;

/** No code point a terminal would interpret anywhere in what the child wrote (newlines aside). */
function expectSafe(r: Ran, what: string): void {
  for (const [stream, text] of [['stdout', r.stdout], ['stderr', r.stderr]] as const) {
    for (const line of text.split('\n')) expect(unsafeCharOf(line), `${what} ${stream}: ${JSON.stringify(line)}`).toBeUndefined();
  }
}

beforeAll(async () => {
  assertBuilt();
  const ws = FakeWorkspace.fromCounts([3, 2, 4]);
  // Seed the hostile id: the first conversation, served under it.
  const first = ws.list()[0]!;
  ws.deleteConversation(first.id);
  ws.restoreConversation({ ...first, id: EVIL, data: { ...first.data, id: EVIL } });
  fake = await startFakeApi({ workspace: ws, apiKey: API_KEY, accountId: ACCOUNT_ID });
  dir = tempDir('convo-mirror-terminal-');
  dirs.push(dir);
  // LOG_LEVEL info: the run's log lines on stderr are checked too.
  env = cliEnv(fake, dir, { LOG_LEVEL: 'info', REDIS_URL: redisUrl(), CONVO_MIRROR_QUEUE_PREFIX: prefixes.next(), CONVO_MIRROR_JOB_ATTEMPTS: '1' });
});
afterEach(killLeftovers);
afterAll(async () => {
  await fake?.close();
  for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

describe('a conversation id holding U+202E, U+0085 and ESC', () => {
  it('sync names its failure escaped; status shows it escaped and --json keeps the same id, \\u-escaped', async () => {
    // Its messages answer 422 (a permanent error): the run fails that conversation.
    fake.injectFault({ kind: 'status', status: 422, body: '{"error":"no"}', match: { path: /%E2%80%AE.*\/messages$/i }, times: Infinity });
    const sync = await run(['sync'], env);
    expect(sync.code, sync.stderr).toBe(1);
    expectSafe(sync, 'sync');
    expect(sync.stderr).toContain(`failed: conversation ${SHOWN}: [`);
    // The run's own log line names it too, as JSON with the same value.
    const logged = sync.stderr.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as { conversation_id?: string });
    expect(logged.some((l) => l.conversation_id === EVIL)).toBe(true);

    const json = await run(['sync', '--json'], { ...env, CONVO_MIRROR_DB: path.join(dir, 'second.sqlite'), CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'second-exports') });
    fake.clearFaults();
    expect(json.code, json.stderr).toBe(1);
    expectSafe(json, 'sync --json');
    expect((JSON.parse(json.stdout) as { failures: { id: string }[] }).failures.map((f) => f.id)).toEqual([EVIL]);
    expect(json.stdout).toContain(`"id": "${IN_JSON}"`);

    const status = await run(['status'], env);
    expect(status.code, status.stderr).toBe(0);
    expectSafe(status, 'status');
    expect(status.stdout).toContain(`failures of the last run:\n  ${SHOWN}: [`);

    const statusJson = await run(['status', '--json'], env);
    expect(statusJson.code, statusJson.stderr).toBe(0);
    expectSafe(statusJson, 'status --json');
    const parsed = JSON.parse(statusJson.stdout) as { failures: { conversation_id: string }[] };
    expect(parsed.failures.map((f) => f.conversation_id)).toEqual([EVIL]);
    expect(statusJson.stdout).toContain(`"conversation_id": "${IN_JSON}"`);
  });

  it('conversations lists it escaped; --json parses to the same id', async () => {
    const sync = await run(['sync'], env);
    expect(sync.code, sync.stderr).toBe(0);
    const table = await run(['conversations'], env);
    expect(table.code, table.stderr).toBe(0);
    expectSafe(table, 'conversations');
    expect(table.stdout.split('\n').filter((l) => l.startsWith(`${SHOWN} `))).toHaveLength(1);

    const json = await run(['conversations', '--json'], env);
    expect(json.code, json.stderr).toBe(0);
    expectSafe(json, 'conversations --json');
    expect((JSON.parse(json.stdout) as { id: string }[]).map((c) => c.id)).toContain(EVIL);
    expect(json.stdout).toContain(`"id": "${IN_JSON}"`);
  });

  it('a failed job naming it: enqueue --wait prints the reason escaped; status shows the dead letter escaped, --json the same values; retry-failed re-queues it', async () => {
    const connection = redisConnection(redisUrl());
    const worker = new Worker(
      QUEUE_NAME,
      async (job: Job) => {
        throw new UnrecoverableError(REASON);
      },
      { connection, prefix: env.CONVO_MIRROR_QUEUE_PREFIX! },
    );
    let enqueue: Ran;
    try {
      await worker.waitUntilReady();
      enqueue = await run(['enqueue', '--conversation', EVIL, '--wait', '--timeout', '20000'], env, 30_000);
    } finally {
      await worker.close();
    }
    expect(enqueue.code, enqueue.stderr).toBe(1);
    expectSafe(enqueue, 'enqueue');
    const jobId = enqueue.stdout.trim();
    expect(jobId).toMatch(/^\d+$/);
    expect(enqueue.stderr).toContain(`job ${jobId}: refused: \\u{009B}2J for this conversation`);

    const status = await run(['status'], env);
    expect(status.code, status.stderr).toBe(0);
    expectSafe(status, 'status');
    expect(status.stdout).toMatch(new RegExp(`\\n  ${jobId} sync-conversation ${SHOWN.replace(/[\\[\]{}()|.*+?^$]/g, '\\$&')} after 1 attempts at [^:]+:\\d\\d:\\d\\d\\.\\d+Z: refused: \\\\u\\{009B\\}2J for this conversation\\n`));

    const json = await run(['status', '--json'], env);
    expect(json.code, json.stderr).toBe(0);
    expectSafe(json, 'status --json');
    const failed = (JSON.parse(json.stdout) as { queue: { failed: { id: string; conversation_id: string; reason: string }[] } }).queue.failed;
    expect(failed).toEqual([expect.objectContaining({ id: jobId, conversation_id: EVIL, reason: REASON })]);
    expect(json.stdout).toContain('"reason": "refused: \\u009b2J for this conversation"');

    const retry = await run(['retry-failed'], env);
    expect(retry.code, retry.stderr).toBe(0);
    expectSafe(retry, 'retry-failed');
    expect(retry.stdout).toBe(`re-queued 1 failed job: ${jobId}\n`);
  });
});
