/**
 * The daemon's start-up check of its workspaces (jobs/startup-check.ts), against the fake API over
 * real HTTP: a workspace that answers passes; one whose key is refused is unusable (by workspace);
 * none usable stops the start; a transient failure makes /readyz's check fail with the reason and
 * is tried again until it passes. Only the re-check interval is shortened; progress is polled.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../config/index.js';
import { WorkspaceChecks } from '../jobs/startup-check.js';
import { AuthError, ConfigError } from '../src/errors.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../src/fake-api/index.js';
import { API_KEY, quietLogger } from './helpers.js';
import { waitFor } from './children.js';

const A = '0b7e6d52-4c1f-4e8a-9d3b-5a2f1c8e7d60';
const B = '6a1f3c2e-9b4d-4e8f-8a7c-1d2e3f4a5b6c';
const OTHER_KEY = 'other-key-3c9d1e2f';

const fakes: FakeApi[] = [];
const checks: WorkspaceChecks[] = [];
afterEach(async () => {
  for (const c of checks.splice(0)) c.stop();
  await Promise.all(fakes.splice(0).map((f) => f.close()));
});

async function twoWorkspaces(): Promise<FakeApi> {
  const f = await startFakeApi({ workspaces: { [A]: { workspace: FakeWorkspace.fromCounts([2]), apiKey: API_KEY }, [B]: { workspace: FakeWorkspace.fromCounts([1]), apiKey: OTHER_KEY } } });
  fakes.push(f);
  return f;
}

function checksFor(f: FakeApi, accounts: string, key = API_KEY, recheckMs = 20): WorkspaceChecks {
  const config = loadConfig({ CONVO_MIRROR_BASE_URL: f.url, CONVO_MIRROR_API_KEY: key, CONVO_MIRROR_ACCOUNT_ID: accounts, CONVO_MIRROR_MAX_RPS: '0' });
  const c = new WorkspaceChecks(config, quietLogger(), undefined, undefined, recheckMs);
  checks.push(c);
  return c;
}

describe('the daemon start-up check', () => {
  it('one request per workspace; a refused workspace is unusable, by name, while the other passes and makes the daemon ready', async () => {
    const f = await twoWorkspaces();
    const c = checksFor(f, `${A},${B}`);
    await c.initial();
    expect(c.states.map((s) => [s.accountId, s.state])).toEqual([
      [A, 'passed'],
      [B, 'unusable'],
    ]);
    expect(c.states[1]!.detail).toMatch(/answered 403.*CONVO_MIRROR_ACCOUNT_ID/);
    expect(() => c.assertReady()).not.toThrow();
    expect(f.requests.map((r) => r.path)).toEqual(['/v1/conversations', '/v1/conversations']);
  });

  it('none usable: the only workspace throws its own error; several throw one ConfigError naming each', async () => {
    const f = await twoWorkspaces();
    await expect(checksFor(f, A, 'wrong-key-0123').initial()).rejects.toBeInstanceOf(AuthError);
    const both = checksFor(f, `${A},${B}`, 'wrong-key-0123');
    const err = await both.initial().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message).toMatch(new RegExp(`^CONVO_MIRROR_ACCOUNT_ID: no workspace can be mirrored: account ${A}: .*401.*; account ${B}: .*401`));
    expect((err as Error).message).not.toContain('wrong-key-0123');
  });

  it('a transient failure (503) is not ready, with the reason, and is tried again until it passes', async () => {
    const f = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY, accountId: A });
    fakes.push(f);
    f.injectFault({ kind: 'status', status: 503, match: { path: '/v1/conversations' }, times: 2 });
    const c = checksFor(f, A);
    await c.initial();
    expect(c.states[0]!.state).toBe('failing');
    expect(() => c.assertReady()).toThrow(new RegExp(`^account ${A}: GET /v1/conversations\\?page=1&per_page=100: answered 503`));
    await waitFor(() => c.states[0]!.state === 'passed', 5_000, 'the re-check to pass');
    expect(() => c.assertReady()).not.toThrow();
    expect(f.requests.map((r) => r.status)).toEqual([503, 503, 200]);
  });

  it('a re-check that finds nothing listening leaves the workspace failing (the API may be restarting), not unusable', async () => {
    const f = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY, accountId: A });
    f.injectFault({ kind: 'status', status: 503, match: { path: '/v1/conversations' }, times: 1 });
    const c = checksFor(f, A);
    await c.initial();
    await f.close();
    await waitFor(() => /nothing is listening/.test(c.states[0]!.detail), 5_000, 'a re-check against the closed port');
    expect(c.states[0]!.state).toBe('failing');
  });

  it('stop() during the first check ends it at once: nothing usable is claimed, nothing is logged as failed', async () => {
    const f = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: API_KEY, accountId: A });
    fakes.push(f);
    f.injectFault({ kind: 'slow', delayMs: 20_000, match: { path: '/v1/conversations' }, times: 1 });
    const c = checksFor(f, A);
    const first = c.initial();
    await waitFor(() => f.requests.length === 1, 5_000, 'the check request to arrive');
    c.stop();
    await first;
    expect(c.states[0]!.state).toBe('pending');
    expect(() => c.assertReady()).toThrow(/not checked yet/);
  });
});
