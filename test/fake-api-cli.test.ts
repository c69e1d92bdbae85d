/**
 * The standalone fake says which key it accepts: its own default key is printed in a line a
 * newcomer can copy (and that line, as printed, is enough for `check`); a key that came from the
 * configuration may be a real one and is never printed.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { assertBuilt, cleanEnv, killLeftovers, run, start, waitFor } from './children.js';
import { tempDir } from './helpers.js';

beforeAll(assertBuilt);
afterEach(killLeftovers);

/** Starts `fake-api --port 0` with `env` and returns its first lines once it listens. */
async function fakeOutput(env: NodeJS.ProcessEnv, args: string[] = []): Promise<{ stdout: string; stop: () => void }> {
  const f = start(['fake-api', '--port', '0', '--conversations', '3', ...args], env, 30_000);
  await waitFor(() => /export CONVO_MIRROR_BASE_URL=.*\n/.test(f.stdout), 20_000, 'the fake to print its export line');
  return { stdout: f.stdout, stop: () => f.child.kill('SIGTERM') };
}

/** The variables of the printed `export A=B C=D  # comment` line. */
function exported(stdout: string): Record<string, string> {
  const line = /^ {2}export (.*)$/m.exec(stdout)![1]!.replace(/\s+#.*$/, '');
  return Object.fromEntries(line.split(/\s+/).map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]));
}

describe('fake-api prints the key it accepts', () => {
  it('with no key configured: the export line carries CONVO_MIRROR_API_KEY=demo-key, says it is not a secret, and is enough for check', async () => {
    const env = cleanEnv();
    const fake = await fakeOutput(env);
    expect(fake.stdout).toMatch(/CONVO_MIRROR_API_KEY=demo-key {2}# the key this fake accepts: a fixed demo value, not a secret$/m);
    const vars = exported(fake.stdout);
    expect(vars['CONVO_MIRROR_API_KEY']).toBe('demo-key');
    const dir = tempDir('convo-mirror-fake-key-');
    try {
      const check = await run(['check', '--no-queue'], { ...env, ...vars, CONVO_MIRROR_DB: path.join(dir, 'mirror.sqlite'), CONVO_MIRROR_EXPORT_DIR: path.join(dir, 'exports') }, 20_000);
      expect(check.code, check.stdout + check.stderr).toBe(0);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    fake.stop();
  });

  it('with a configured key: it names where the key came from and never prints it', async () => {
    const secret = 'not-for-output-7f3a9c';
    for (const [env, args] of [
      [{ ...cleanEnv(), CONVO_MIRROR_API_KEY: secret }, []],
      [cleanEnv(), ['--api-key', secret]],
    ] as const) {
      const fake = await fakeOutput(env, [...args]);
      expect(fake.stdout).not.toContain(secret);
      expect(fake.stdout).toMatch(/# it accepts the key you gave it \(--api-key or CONVO_MIRROR_API_KEY; not printed\)$/m);
      expect(exported(fake.stdout)['CONVO_MIRROR_API_KEY']).toBeUndefined();
      fake.stop();
    }
  });
});
