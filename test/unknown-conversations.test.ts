/**
 * A webhook (or `enqueue`) for a conversation that does not exist (the API answers 404 and the
 * mirror never had it) completes its job with outcome `not_found`: no run, no change, no ledger
 * record, no failed job in Redis; one log line and a metric. Real Redis, real HTTP to the fake,
 * real SQLite; the daemon runs in this process with its HTTP server.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { daemonFixtures, expectConversationMirrored } from './daemon-fixtures.js';
import { assertBuilt, run, waitFor } from './children.js';
import { cliEnv, withMirror } from './helpers.js';
import { redisUrl } from './redis.js';

const SECRET = `whsec_${Buffer.from('unknown-conversation-webhook-key').toString('base64')}`;
const fx = daemonFixtures('unknown-conv');
afterEach(fx.afterEachTest);
afterAll(fx.afterAllTests);

/** POSTs a signed delivery of `conversationId`; returns the status. */
async function deliver(url: string, id: string, conversationId: string): Promise<number> {
  const body = JSON.stringify({ event: 'conversation.updated', conversation_id: conversationId });
  const at = new Date();
  const res = await fetch(`${url}/webhooks/conversations`, {
    method: 'POST',
    body,
    headers: { 'content-type': 'application/json', 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(SECRET).sign(id, at, body) },
  });
  await res.arrayBuffer();
  return res.status;
}

describe('webhooks for conversations that do not exist', () => {
  it('1,000 of them add no run, no ledger record and no failed job; each completes not_found after one request', async () => {
    const ws = FakeWorkspace.generate({ seed: 71, conversations: 3 });
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const config = fx.daemonConfig(fake, prefix, { CONVO_MIRROR_WEBHOOK_SECRET: SECRET });
    const d = await fx.startDaemon(config, { http: true });
    const queue = fx.queueFor(prefix);
    const N = 1000;
    for (let i = 0; i < N; i += 50) {
      const statuses = await Promise.all(Array.from({ length: 50 }, (_, k) => deliver(d.url!, `msg_ghost_${i + k}`, `ghost-${String(i + k).padStart(4, '0')}`)));
      expect(new Set(statuses)).toEqual(new Set([202]));
    }
    await waitFor(async () => (await queue.getJobCounts('completed')).completed === N, 60_000, `${N} completed jobs`);
    // (The two job schedulers' next runs wait as delayed jobs: not counted here.)
    const counts = await queue.getJobCounts('completed', 'failed', 'waiting', 'active');
    expect(counts).toEqual({ completed: N, failed: 0, waiting: 0, active: 0 });
    const sample = (await queue.getCompleted(0, 0))[0]!;
    expect(sample.returnvalue).toEqual({ outcome: 'not_found', conversationId: sample.data.conversationId, tally: { requests: 1, retries: 0, rateLimited: 0, served: 0 } });
    // One request each, nothing else.
    const asked = fake.requests.filter((r) => r.path.startsWith('/v1/conversations/ghost-'));
    expect(asked).toHaveLength(N);
    expect(new Set(asked.map((r) => r.query['page']))).toEqual(new Set(['1']));
    // Nothing recorded: no run, no change, nothing published (the export directory is not even made).
    await withMirror(config.db, async (m) => {
      expect(await m.lastRuns(5)).toEqual([]);
      expect((await m.counts()).change_log).toBe(0);
      expect(await m.ledgerEntries()).toEqual([]);
    });
    expect(fs.existsSync(path.join(config.exportDir, '_ledger'))).toBe(false);
    const metrics = await (await fetch(`${d.url}/metrics`)).text();
    expect(metrics).toMatch(/^convo_mirror_conversations_not_found_total\{account_id="[^"]+"\} 1000$/m);
    expect(metrics).not.toMatch(/^convo_mirror_runs_total\{/m);
  });

  it('a conversation the mirror never had but the API serves is mirrored, its first page asked once', async () => {
    const ws = FakeWorkspace.generate({ seed: 72, conversations: 3 });
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const config = fx.daemonConfig(fake, prefix, { CONVO_MIRROR_WEBHOOK_SECRET: SECRET });
    const d = await fx.startDaemon(config, { http: true });
    const queue = fx.queueFor(prefix);
    const conv = ws.list().find((c) => c.messages.length > 100) ?? ws.list()[0]!;
    expect(await deliver(d.url!, 'msg_real_1', conv.id)).toBe(202);
    await waitFor(async () => (await queue.getJobCounts('completed')).completed === 1, 15_000, 'the job to complete');
    await expectConversationMirrored(config.db, ws, conv.id);
    const pages = fake.requests.filter((r) => r.path === `/v1/conversations/${conv.id}/messages`).map((r) => r.query['page']);
    expect(pages).toEqual(Array.from({ length: Math.max(1, Math.ceil(conv.messages.length / 100)) }, (_, i) => String(i + 1)));
    await withMirror(config.db, async (m) => expect((await m.lastRuns(5)).map((r) => [r['trigger'], r['status'], r['requests']])).toEqual([['webhook', 'succeeded', pages.length]]));
  });

  it('enqueue --wait for one exits 1 saying it was not found; nothing is recorded', async () => {
    assertBuilt();
    const ws = FakeWorkspace.generate({ seed: 73, conversations: 2 });
    const fake = await fx.fakeApi(ws);
    const prefix = fx.prefix();
    const config = fx.daemonConfig(fake, prefix);
    await fx.startDaemon(config);
    const env = cliEnv(fake, path.dirname(config.db), { REDIS_URL: redisUrl(), CONVO_MIRROR_QUEUE_PREFIX: prefix, LOG_LEVEL: 'silent' });
    const r = await run(['enqueue', '--conversation', 'no-such-conversation', '--wait'], env, 30_000);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/^job \S+: completed: not found \(the API answers 404 and the mirror never had it\); no run recorded$/m);
    await withMirror(config.db, async (m) => expect(await m.lastRuns(5)).toEqual([]));
  });
});
