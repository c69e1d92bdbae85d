/**
 * Child processes of the CLI for tests: spawned with a time limit, tracked so a test that fails
 * midway never leaves one running, plus small bounded waiting helpers.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The built CLI, as package.json's `bin` names it (`npm test` builds it first). */
export const CLI = path.resolve(ROOT, (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { bin: Record<string, string> }).bin['convo-mirror']!);

/** Throws a clear error when the CLI has not been built. */
export function assertBuilt(): void {
  if (!fs.existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build" first (npm test does it)`);
}

/** How a child ended. */
export interface Ran {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** Wall time from spawn to close, ms. */
  ms: number;
}

/** A running child. */
export interface Started {
  child: ChildProcess;
  /** Output so far. */
  readonly stdout: string;
  readonly stderr: string;
  /** Resolves when the child closes; rejects (after SIGKILLing it) when it outlives its time limit. */
  done: Promise<Ran>;
}

/**
 * The working directory of every child: an empty directory of its own, so the CLI finds no `.env`
 * (the one in a developer's checkout would change what the tests see) and relative default paths
 * land nowhere that matters.
 */
export const CHILD_CWD = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-cwd-'));
// Enterable by the other users some tests run the CLI as (setpriv): it stays empty.
fs.chmodSync(CHILD_CWD, 0o711);
process.once('exit', () => fs.rmSync(CHILD_CWD, { recursive: true, force: true }));

/** Children still running; {@link killLeftovers} SIGKILLs them (call it in afterEach). */
const live = new Set<ChildProcess>();

/** Spawns `node dist/src/cli/index.js ...args`; `timeoutMs` bounds its life. */
export function start(args: string[], env: NodeJS.ProcessEnv, timeoutMs = 20_000): Started {
  return startCommand([process.execPath, CLI, ...args], env, timeoutMs);
}

/**
 * Spawns any command (e.g. the CLI under `sh -c 'umask …'` or `setpriv`), tracked like {@link start};
 * `timeoutMs` bounds its life.
 */
export function startCommand(argv: string[], env: NodeJS.ProcessEnv, timeoutMs = 20_000): Started {
  const t0 = Date.now();
  const label = argv[1] === CLI ? `convo-mirror ${argv.slice(2).join(' ')}` : argv.join(' ');
  // A neutral working directory: a developer's `.env` in the checkout must not reach the children.
  const child = spawn(argv[0]!, argv.slice(1), { env, cwd: CHILD_CWD, stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => (stdout += d));
  child.stderr!.on('data', (d) => (stderr += d));
  const done = new Promise<Ran>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${label} did not exit within ${timeoutMs} ms; stderr tail: ${stderr.slice(-1500)}`));
    }, timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      live.delete(child);
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      live.delete(child);
      resolve({ code, signal, stdout, stderr, ms: Date.now() - t0 });
    });
  });
  done.catch(() => {}); // observed by the test that awaits it; never an unhandled rejection
  return {
    child,
    get stdout() {
      return stdout;
    },
    get stderr() {
      return stderr;
    },
    done,
  };
}

/** Spawns the CLI and waits for it to end. */
export const run = (args: string[], env: NodeJS.ProcessEnv, timeoutMs?: number): Promise<Ran> => start(args, env, timeoutMs).done;

/** Spawns any command and waits for it to end. */
export const runCommand = (argv: string[], env: NodeJS.ProcessEnv, timeoutMs?: number): Promise<Ran> => startCommand(argv, env, timeoutMs).done;

/**
 * Starts `convo-mirror daemon` (its env must log at info level or below) and waits (bounded) for
 * its "daemon ready" log line.
 *
 * @throws when it exits or takes more than 15 s to get ready
 */
export async function startDaemon(env: NodeJS.ProcessEnv, args: string[] = [], timeoutMs = 40_000): Promise<Started> {
  const d = start(['daemon', ...args], env, timeoutMs);
  let exited: Ran | undefined;
  void d.done.then((r) => (exited = r), () => {});
  await waitFor(() => d.stderr.includes('"msg":"daemon ready"') || exited !== undefined, 15_000, 'the daemon to be ready');
  if (exited) throw new Error(`the daemon exited (${exited.code ?? exited.signal}) before it was ready: ${exited.stderr.slice(-1500)}`);
  return d;
}

/** SIGKILLs every child a test left running and waits (bounded) for them to go. */
export async function killLeftovers(): Promise<void> {
  const left = [...live];
  for (const c of left) c.kill('SIGKILL');
  await Promise.all(
    left.map((c) => (c.exitCode !== null || c.signalCode !== null ? undefined : within(new Promise((r) => c.once('close', r)), 5000, 'killing a leftover child'))),
  );
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `pred` every `everyMs` (default 25 ms); rejects naming `what` after `timeoutMs`. */
export async function waitFor(pred: () => boolean | Promise<boolean>, timeoutMs: number, what: string, everyMs = 25): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await pred())) {
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** Resolves with `p`, or rejects naming `what` when it takes longer than `ms`. */
export async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} took longer than ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** A port on 127.0.0.1 where nothing listens now (bound, then closed): a closed port, or one to listen on. */
export async function closedPort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return port;
}

/** This process's environment without any setting of ours (nor LOG_LEVEL, REDIS_URL), plus `extra`. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of Object.keys(env)) if (name.toUpperCase().startsWith('CONVO_MIRROR_') || name === 'LOG_LEVEL' || name === 'REDIS_URL') delete env[name];
  return { ...env, ...extra };
}

/** Runs `convo-mirror ...args` with `dir` as its working directory (the spawn of {@link runCommand}, via sh for the cd). */
export function runIn(dir: string, args: string[], env: NodeJS.ProcessEnv): Promise<Ran> {
  return runCommand(['/bin/sh', '-c', 'cd "$0" && exec "$@"', dir, process.execPath, CLI, ...args], env);
}

/**
 * Working directories for CLI children, each removed by `cleanup` (call it in afterEach); `make`
 * writes `dotenv`, when given, to the new directory's `.env`.
 */
export function workDirs(prefix: string): { make(dotenv?: string): string; cleanup(): void } {
  const dirs: string[] = [];
  return {
    make(dotenv) {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
      dirs.push(dir);
      if (dotenv !== undefined) fs.writeFileSync(path.join(dir, '.env'), dotenv);
      return dir;
    },
    cleanup() {
      for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
    },
  };
}
