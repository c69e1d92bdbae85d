/**
 * The README is true: the commands of its "Try the daemon-free flow" block run as written, read
 * from README.md itself (so the test follows the README), against the standalone fake on a free port
 * instead of 4010. A line ending in `&` starts in the background (the fake: until it says it
 * listens); `export A=B ...` sets variables for the lines after it; every other line must exit 0,
 * and each is bounded to 20 s (the promise for examples against the local fake).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT, assertBuilt, closedPort, killLeftovers, run, startCommand, waitFor, type Started } from './children.js';

/** The shell block that follows `heading` in README.md, one command per line, comments removed. */
function readmeBlock(heading: string): string[] {
  const md = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const at = md.indexOf(heading);
  expect(at, `README.md has "${heading}"`).toBeGreaterThanOrEqual(0);
  const block = /```sh\n([\s\S]*?)```/.exec(md.slice(at))![1]!;
  return block
    .split('\n')
    .map((l) => l.replace(/\s+#.*$/, '').trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
}

/** `node dist/...` as this machine runs it: this Node, the built file under the repository. */
function argvOf(line: string): string[] {
  const words = line.split(/\s+/);
  expect(words[0], line).toBe('node');
  return [process.execPath, path.join(ROOT, words[1]!), ...words.slice(2)];
}

beforeAll(assertBuilt);
afterAll(killLeftovers);

describe('README: the daemon-free flow with the standalone fake', () => {
  it('runs as written: each command exits 0 within 20 s', async () => {
    const lines = readmeBlock('Try the daemon-free flow with the standalone fake');
    expect(lines.length).toBeGreaterThanOrEqual(4);
    const port = String(await closedPort());
    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME, CI: 'true' };
    if (process.env.REDIS_URL) env.REDIS_URL = process.env.REDIS_URL;
    let fake: Started | undefined;
    const ran: string[] = [];
    for (const raw of lines) {
      const line = raw.replaceAll('4010', port);
      if (line.startsWith('export ')) {
        for (const pair of line.slice('export '.length).split(/\s+/)) {
          const eq = pair.indexOf('=');
          env[pair.slice(0, eq)] = pair.slice(eq + 1);
        }
      } else if (line.endsWith('&')) {
        fake = startCommand(argvOf(line.slice(0, -1).trim()), env, 120_000);
        const f = fake;
        await waitFor(() => /listening on/.test(f.stdout), 20_000, 'the fake to listen');
      } else {
        const r = await run(argvOf(line).slice(2), env, 20_000);
        expect(r.code, `${raw}\n${r.stderr}`).toBe(0);
        ran.push(`${line.split(/\s+/)[2]}: ${r.stdout.split('\n')[0]}`);
      }
    }
    expect(fake, 'the block starts the fake').toBeDefined();
    // The sync mirrored the fake's 320 conversations; conversations lists them.
    expect(ran.join('\n')).toMatch(/sync: run 1 \(workspace, incremental\) succeeded/);
    expect(ran.join('\n')).toMatch(/^conversations: id +account +status/m);
  });
});
