/**
 * The daemon's archive: a long workspace run of the BullMQ engine (its conversations crawled by
 * child jobs) reaches the exports progressively, every `CONVO_MIRROR_PUBLISH_INTERVAL_MS`, and
 * signs its batch records with `CONVO_MIRROR_SIGNING_KEY_FILE`; the archive verifies (deep, with the
 * public key). Real Redis with a random prefix, the real fake over HTTP, the daemon in this process.
 */
import path from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { Job } from 'bullmq';
import { enqueueWorkspace } from '../jobs/queue.js';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { generateKeyPair, loadPublicKey } from '../src/export/signing.js';
import { verifyArchive } from '../src/export/verify.js';
import type { RunSummary } from '../src/run/index.js';
import { waitFor } from './children.js';
import { daemonFixtures } from './daemon-fixtures.js';
import { ACCOUNT_ID, tempDir, withMirror } from './helpers.js';
import { sqlAll } from './sql.js';

const fx = daemonFixtures('daemon-pub');
afterEach(fx.afterEachTest);
afterAll(fx.afterAllTests);

describe('the daemon publishes progressively and signs', () => {
  it('a workspace run longer than the publish interval publishes during its crawls (batches of no run), then at its end; signed; verify --deep passes', async () => {
    const ws = FakeWorkspace.fromCounts([30, 120, 5, 60, 80, 10, 45, 70]);
    const fake = await fx.fakeApi(ws);
    // Each messages request takes at least 400 ms: with one job at a time the crawls last more than
    // 3 s, so an interval of 1 s must publish during them.
    fake.injectFault({ kind: 'slow', delayMs: 400, match: { path: /\/messages$/ }, times: Infinity });
    const keys = tempDir();
    generateKeyPair(path.join(keys, 'k.key'), path.join(keys, 'k.pub'));
    const prefix = fx.prefix();
    const d = await fx.startDaemon(
      fx.daemonConfig(fake, prefix, { CONVO_MIRROR_CONCURRENCY: '1', CONVO_MIRROR_PUBLISH_INTERVAL_MS: '1000', CONVO_MIRROR_SIGNING_KEY_FILE: path.join(keys, 'k.key') }),
    );
    const queue = fx.queueFor(prefix);
    const id = await enqueueWorkspace(queue, { accountId: ACCOUNT_ID, policy: { attempts: 1 } });
    await waitFor(async () => (await (await Job.fromId(queue, id))?.getState()) === 'completed', 30_000, 'the workspace job to complete');
    const summary = (await Job.fromId(queue, id))!.returnvalue as RunSummary;
    expect(summary.status).toBe('succeeded');
    const batches = await withMirror(d.config.db, (m) => sqlAll<{ id: number; run_id: number | null }>(m, `SELECT id, run_id FROM export_batches ORDER BY id`));
    // progressive batches (planned by the daemon's publisher, of no run) came before the run's own
    // (its remaining changes, if any were left, and its runs line)
    const progressive = batches.filter((b) => b.run_id === null);
    expect(progressive.length).toBeGreaterThanOrEqual(1);
    expect(batches.at(-1)!.run_id).toBe(summary.runId);
    expect(batches.filter((b) => b.run_id !== null && b.run_id !== summary.runId)).toEqual([]);
    expect(Math.max(...progressive.map((b) => b.id))).toBeLessThan(batches.at(-1)!.id);
    await d.stop();
    const report = await withMirror(d.config.db, (m) => verifyArchive({ exportDir: d.config.exportDir, mirror: m, deep: true, publicKey: loadPublicKey(path.join(keys, 'k.pub')) }));
    expect(report.problems).toEqual([]);
    expect(report.signed).toBe(batches.length);
  });
});
