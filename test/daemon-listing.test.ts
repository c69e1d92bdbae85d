/**
 * The BullMQ daemon's list step stops early on an ordered list, as `sync` does: a workspace job
 * after a complete one reads 3 list pages of 10, crawls the conversations that changed and the one
 * whose last crawl failed, and the mirror equals the fake. Real Redis with a random prefix, the
 * real fake over HTTP, the daemon in this process.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { Job, type Queue } from 'bullmq';
import { enqueueWorkspace } from '../jobs/queue.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import type { RunSummary } from '../src/run/index.js';
import { waitFor } from './children.js';
import { daemonFixtures, messagesPath } from './daemon-fixtures.js';
import { ACCOUNT_ID, mirrorEqualsFake, withMirror } from './helpers.js';

const fx = daemonFixtures('daemon-list');
afterEach(fx.afterEachTest);
afterAll(fx.afterAllTests);

async function workspaceRun(queue: Queue): Promise<RunSummary> {
  const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } });
  await waitFor(async () => ['completed', 'failed'].includes((await (await Job.fromId(queue, id))?.getState()) ?? ''), 30_000, 'the workspace job to end');
  return (await Job.fromId(queue, id))!.returnvalue as RunSummary;
}

describe('the daemon lists an ordered list as sync does', () => {
  it('the second workspace job stops its listing early, and still crawls what changed and what failed before', async () => {
    const ws = FakeWorkspace.fromCounts(Array.from({ length: 1000 }, () => 1), 3);
    ws.reverse(); // newest activity first
    const fake = await fx.fakeApi(ws);
    const failing = ws.list()[700]!;
    fake.injectFault({ kind: 'status', status: 400, match: { path: messagesPath(failing.id) }, times: 1 });
    const prefix = fx.prefix();
    const d = await fx.startDaemon(fx.daemonConfig(fake, prefix, { CONVO_MIRROR_CONCURRENCY: '4' }));
    const queue = fx.queueFor(prefix);
    const first = await workspaceRun(queue);
    expect(first.failures.map((f) => f.id)).toEqual([failing.id]);
    const bumped = ws.list()[500]!;
    ws.appendMessages(bumped.id, 2);
    ws.moveToFront(bumped.id);
    const before = fake.requests.length;
    const second = await workspaceRun(queue);
    expect(second.status).toBe('succeeded');
    const seen = fake.requests.slice(before);
    expect(seen.filter((r) => r.path === '/v1/conversations')).toHaveLength(3);
    expect(seen.filter((r) => r.path.endsWith('/messages')).map((r) => r.path).sort()).toEqual([messagesPath(bumped.id), messagesPath(failing.id)].sort());
    await d.stop();
    await withMirror(d.config.db, (m) => {
      const eq = mirrorEqualsFake(m, ws);
      expect(eq.ok, eq.detail).toBe(true);
    });
  });
});
