/**
 * The documentation's shell examples are true. Every `sh` block of README.md and docs/*.md is
 * marked on the line before its fence:
 *
 * - `<!-- test: runs against the local fake -->`: run here, every block of a file in order, in one
 *   temporary working directory (so `data/` is the examples' own), against the standalone fake on a
 *   free port. `4010`, `9464` and `9465` (a second daemon's) in the text become free ports (the daemon gets
 *   `CONVO_MIRROR_HTTP_PORT`), a `postgres://` URL becomes the test server's with a new schema
 *   of the file's (`test/pg.ts`; dropped afterwards), `npx convo-mirror` runs the built CLI (a shim first on `PATH`; the
 *   real npx is run once below), and the queue prefix is a random one removed afterwards (one a block exports is put under it). A line
 *   ending in `&` starts in the background and waits for its ready line (the fake's `listening on`,
 *   the daemon's `daemon ready`); `kill -TERM %N` stops the Nth background command of the block and
 *   expects exit 0; `export A=B ...` sets variables for the lines after it (a value in quotes loses
 *   them, as in sh; no spaces inside); every other line runs
 *   in `sh` and must exit 0 within 60 s. Placeholders are filled from earlier output: `<id>` from
 *   the last `conversations` listing, `<id 1>`/`<id 2>` from `fake-api --accounts 2`, `<head>` from
 *   the last `ledger head` printed.
 * - `<!-- test: not run (reason) -->`: not run; the blocks that need your API, Docker, packages
 *   to install or a system group are listed below with their reason.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CLI, ROOT, assertBuilt, closedPort, killLeftovers, runCommand, startCommand, waitFor, within, type Started } from './children.js';
import { cleanupPrefix, randomPrefix, redisUrl } from './redis.js';
import { docBlocks, docFiles, type DocBlock } from './doc-blocks.js';
import { dropSchema, pgUrl, randomSchema } from './pg.js';

const RUN = 'runs against the local fake';
const NOT_RUN = /^not run \((.+)\)$/;

/** The commands of a block: continuation lines joined, comments and blank lines dropped. */
function commandsOf(body: string): string[] {
  return body
    .replace(/\\\n\s*/g, ' ')
    .split('\n')
    .map((l) => l.replace(/\s+#\s.*$/, '').trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
}

/** What earlier output told, for the placeholders. */
interface Seen {
  id?: string;
  accounts: string[];
  head?: string;
}

/** `line` with its ports, PostgreSQL URLs and placeholders filled. @throws when a placeholder has no value yet */
function filled(line: string, ports: { fake: number; http: number; http2: number }, seen: Seen, pg: (url: string) => string): string {
  const value = (name: string, v: string | undefined): string => {
    if (v === undefined) throw new Error(`no value for ${name} yet in: ${line}`);
    return v;
  };
  return line
    .replaceAll('4010', String(ports.fake))
    .replaceAll('9464', String(ports.http))
    .replaceAll('9465', String(ports.http2))
    .replace(/postgres(ql)?:\/\/[^\s'"]+/g, (url) => pg(url))
    .replace(/<id 1>/g, () => value('<id 1>', seen.accounts[0]))
    .replace(/<id 2>/g, () => value('<id 2>', seen.accounts[1]))
    .replace(/<id>/g, () => value('<id>', seen.id))
    .replace(/<head>/g, () => value('<head>', seen.head));
}

/** Updates `seen` from a command's output. */
function learn(seen: Seen, line: string, stdout: string): void {
  const heads = [...stdout.matchAll(/ledger head[: ]+(\d+:[0-9a-f]{64})/g)];
  if (heads.length > 0) seen.head = heads[heads.length - 1]![1];
  if (/\bconversations\b/.test(line) && /^id\s+account/m.test(stdout)) seen.id = stdout.split('\n')[1]!.split(/\s+/)[0];
  const accounts = [...stdout.matchAll(/^ {2}workspace ([0-9a-f-]{36}):/gm)].map((m) => m[1]!);
  if (accounts.length > 0) seen.accounts = accounts;
}

/** A directory with an `npx` that runs the built CLI for `npx convo-mirror` and refuses anything else. */
function npxShim(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-npx-'));
  fs.writeFileSync(
    path.join(dir, 'npx'),
    `#!/bin/sh\nif [ "$1" = convo-mirror ]; then shift; exec "${process.execPath}" "${CLI}" "$@"; fi\n` +
      `echo "npx $1: the documentation's examples run only npx convo-mirror" >&2\nexit 127\n`,
    { mode: 0o755 },
  );
  return dir;
}

const made: string[] = [];
const prefixes: string[] = [];
const schemas: string[] = [];
beforeAll(assertBuilt);
afterAll(async () => {
  await killLeftovers();
  for (const p of prefixes) await cleanupPrefix(redisUrl(), p);
  for (const s of schemas) await dropSchema(s);
  for (const d of made) fs.rmSync(d, { recursive: true, force: true });
});

/** Runs the marked blocks of one file in order (see the module comment); returns what each line printed first. */
async function runFile(file: string, blocks: DocBlock[]): Promise<string[]> {
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-docs-run-'));
  const shim = npxShim();
  made.push(cwd, shim);
  const prefix = randomPrefix('docs');
  prefixes.push(prefix);
  const ports = { fake: await closedPort(), http: await closedPort(), http2: await closedPort() };
  // Each PostgreSQL URL of the file: the test server, with a new schema (the same for every line naming that URL).
  const pgTargets = new Map<string, string>();
  const pg = (url: string): string => {
    let target = pgTargets.get(url);
    if (target === undefined) {
      const schema = randomSchema('docs');
      schemas.push(schema);
      target = pgUrl(schema);
      pgTargets.set(url, target);
    }
    return target;
  };
  const env: NodeJS.ProcessEnv = {
    PATH: `${shim}:${process.env.PATH}`,
    HOME: process.env.HOME,
    CI: 'true',
    CONVO_MIRROR_QUEUE_PREFIX: prefix,
    CONVO_MIRROR_HTTP_PORT: String(ports.http),
    REDIS_URL: redisUrl(),
  };
  const seen: Seen = { accounts: [] };
  const ran: string[] = [];
  // In the working directory; a background command is exec'd, so SIGTERM reaches it (through the npx shim's exec).
  const inDir = (line: string, background = false): string[] => ['/bin/sh', '-c', background ? 'cd "$0" && eval "exec $1"' : 'cd "$0" && eval "$1"', cwd, line];
  for (const block of blocks) {
    const jobs: Started[] = [];
    for (const raw of commandsOf(block.body)) {
      const where = `${block.file}:${block.line}: ${raw}`;
      const line = filled(raw, ports, seen, pg);
      const kill = /^kill -TERM %(\d+)$/.exec(line);
      if (line.startsWith('export ')) {
        for (const pair of line.slice('export '.length).trim().split(/\s+/)) {
          const eq = pair.indexOf('=');
          const name = pair.slice(0, eq);
          const value = pair.slice(eq + 1).replace(/^(['"])(.*)\1$/, '$2');
          // A block's own queue prefix stays under the file's random one (removed afterwards).
          env[name] = name === 'CONVO_MIRROR_QUEUE_PREFIX' ? `${prefix}-${value}` : value;
          if (name === 'CONVO_MIRROR_QUEUE_PREFIX') prefixes.push(env[name]);
        }
      } else if (kill) {
        const job = jobs[Number(kill[1]) - 1];
        expect(job, where).toBeDefined();
        job!.child.kill('SIGTERM');
        const ended = await within(job!.done, 40_000, where);
        expect(ended.code, `${where}\n${ended.stderr.slice(-1500)}`).toBe(0);
      } else if (line.endsWith('&')) {
        const job = startCommand(inDir(line.slice(0, -1).trim(), true), env, 300_000);
        jobs.push(job);
        let exited = false;
        void job.done.then(() => (exited = true), () => (exited = true));
        const ready = /\bfake-api\b/.test(line) ? () => /listening on/.test(job.stdout) : /\bdaemon\b/.test(line) ? () => job.stderr.includes('"msg":"daemon ready"') : undefined;
        expect(ready, `${where}: a background command the test knows how to wait for`).toBeDefined();
        await waitFor(() => ready!() || exited, 30_000, `${where} to be ready`);
        expect(exited, `${where} exited before it was ready:\n${job.stderr.slice(-1500)}`).toBe(false);
        learn(seen, line, job.stdout);
      } else {
        const r = await runCommand(inDir(line), env, 60_000);
        expect(r.code, `${where}\n${r.stdout.slice(-1500)}\n${r.stderr.slice(-1500)}`).toBe(0);
        learn(seen, line, r.stdout);
        ran.push(`${raw.split(/\s+/).slice(0, 3).join(' ')}: ${r.stdout.split('\n')[0]}`);
      }
    }
    // What a block leaves running is stopped before the next one (a reader's shell would end it too).
    for (const job of jobs) if (job.child.exitCode === null && job.child.signalCode === null) job.child.kill('SIGTERM');
    await Promise.all(jobs.map((j) => within(j.done.catch(() => undefined), 40_000, `${block.file}:${block.line}: a background command to stop`)));
  }
  return ran;
}

const all = docFiles().flatMap(docBlocks);
const shell = all.filter((b) => b.lang === 'sh' || b.lang === 'bash' || b.lang === 'shell');

describe('the documentation\'s shell blocks', () => {
  it('each is marked: run against the local fake, or not run with its reason', () => {
    const unmarked = shell.filter((b) => b.marker !== RUN && !NOT_RUN.test(b.marker ?? '')).map((b) => `${b.file}:${b.line}`);
    expect(unmarked, `mark each sh block with <!-- test: ${RUN} --> or <!-- test: not run (reason) --> on the line before it`).toEqual([]);
    expect(shell.filter((b) => b.marker === RUN).length).toBeGreaterThanOrEqual(5);
  });

  // The blocks not run, and why (they need your API, Docker, packages to install, a system group).
  const skipped = shell.filter((b) => NOT_RUN.test(b.marker ?? ''));
  it.each(skipped.map((b) => [`${b.file}:${b.line}`, NOT_RUN.exec(b.marker!)![1]!, b] as const))('%s is not run: %s', (_where, _why, b) => {
    // A block against the fake must be run: only blocks that do not start it may be skipped.
    expect(b.body).not.toMatch(/fake-api/);
  });
});

describe('the shell blocks that run against the local fake run as written', () => {
  const byFile = new Map<string, DocBlock[]>();
  for (const b of shell.filter((x) => x.marker === RUN)) byFile.set(b.file, [...(byFile.get(b.file) ?? []), b]);
  it.each([...byFile.keys()])('%s: every line exits 0', async (file) => {
    const ran = await runFile(file, byFile.get(file)!);
    expect(ran.length).toBeGreaterThan(0);
    if (file === 'README.md') {
      const out = ran.join('\n');
      expect(out).toMatch(/^npx convo-mirror sync: run 1 \(workspace, incremental\) succeeded/m);
      expect(out).toMatch(/^npx convo-mirror conversations: id +account +status/m);
      expect(out).toMatch(/^npx convo-mirror verify: ok {3}database: quick_check ok/m);
    }
  }, 300_000);
});

describe('npx convo-mirror, for real', () => {
  it('runs the package\'s own command from the checkout, without npm link (a private npm cache, offline)', async () => {
    const cache = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-npm-cache-'));
    made.push(cache);
    const npx = execFileSync('sh', ['-c', 'command -v npx'], { encoding: 'utf8' }).trim();
    const version = (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
    const r = await runCommand(['/bin/sh', '-c', 'cd "$0" && exec "$1" convo-mirror --version', ROOT, npx], { PATH: process.env.PATH, HOME: process.env.HOME, npm_config_cache: cache, npm_config_offline: 'true', npm_config_update_notifier: 'false' }, 60_000);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trim()).toBe(version);
  });
});
