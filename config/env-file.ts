/**
 * The `.env` file of the working directory, and the check for misspelt `CONVO_MIRROR_*` variables.
 *
 * Precedence: command-line flags > process environment > `.env` > default. `.env` only fills the
 * variables the environment does not have; which ones it filled is remembered for
 * `convo-mirror config`. No function here prints a value read from `.env` or the environment.
 */
import fs from 'node:fs';
import path from 'node:path';
import { parseEnv } from 'node:util';
import { ConfigError } from '../src/errors.js';
import { osReason } from '../src/writable.js';

/** Largest `.env` read, bytes: a settings file is a few KiB; anything bigger is not one. */
export const ENV_FILE_MAX_BYTES = 1024 * 1024;

/** Prefix of convo-mirror's own variables (`LOG_LEVEL` and `REDIS_URL` are the two without it). */
const PREFIX = 'CONVO_MIRROR_';

/**
 * `CONVO_MIRROR_*` variables the code reads besides the settings of `CONFIG_FIELDS`:
 * `CONVO_MIRROR_BENCH_RSS_FILE` (bench/rss-probe.ts, set by the benchmark for its CLI children).
 */
export const OTHER_KNOWN_VARIABLES: readonly string[] = ['CONVO_MIRROR_BENCH_RSS_FILE'];

/** The `.env` loaded by this process ({@link loadEnvFile}), if any. */
let loaded: { file: string; names: ReadonlySet<string> } | undefined;

/** The variables this process took from `.env` (those the environment did not set); empty when none. */
export function envFileNames(): ReadonlySet<string> {
  return loaded?.names ?? new Set();
}

/** Reads at most `max + 1` bytes of the open file `fd`. */
function readCapped(fd: number, max: number): Buffer {
  const buf = Buffer.allocUnsafe(max + 1);
  let n = 0;
  for (;;) {
    const got = fs.readSync(fd, buf, n, buf.length - n, null);
    if (got === 0 || (n += got) === buf.length) return buf.subarray(0, n);
  }
}

/**
 * The text of `file`, read with a byte cap ({@link ENV_FILE_MAX_BYTES}); undefined when it does
 * not exist. Opened non-blocking, so a FIFO named `.env` cannot hang the command.
 *
 * @throws {@link ConfigError} naming the file: a directory, not a regular file, unreadable (with
 *   the OS's reason, e.g. `permission denied`), larger than the cap, or not UTF-8
 */
function readEnvText(file: string): string | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new ConfigError(file, `cannot be read: ${osReason(err)}`);
  }
  try {
    const st = fs.fstatSync(fd);
    if (st.isDirectory()) throw new ConfigError(file, 'cannot be read: is a directory');
    if (!st.isFile()) throw new ConfigError(file, 'cannot be read: is not a regular file');
    const bytes = readCapped(fd, ENV_FILE_MAX_BYTES);
    if (bytes.length > ENV_FILE_MAX_BYTES) throw new ConfigError(file, `is larger than ${ENV_FILE_MAX_BYTES / 1024 / 1024} MiB: a .env file holds a few settings (NAME=value lines)`);
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    if (err instanceof TypeError) throw new ConfigError(file, 'is not UTF-8 text');
    throw new ConfigError(file, `cannot be read: ${osReason(err)}`);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * The variables of the `.env` file `file` (Node's `util.parseEnv`: `NAME=value` lines, `#`
 * comments, quotes, an optional `export `); undefined when the file does not exist.
 *
 * @throws {@link ConfigError} naming the file when it exists but cannot be used (see {@link readEnvText});
 *   never shows its content
 */
export function readEnvFile(file: string): Record<string, string> | undefined {
  const text = readEnvText(file);
  if (text === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(parseEnv(text))) if (value !== undefined) out[name] = value;
  return out;
}

/**
 * Loads `<dir>/.env` into `env` (usually `process.env`): each of its variables that `env` does not
 * have (the environment wins, even when set to an empty string). Remembers which ones it set
 * ({@link envFileNames}). A missing file is not an error.
 *
 * @returns the variables set from the file, sorted; empty when there is no file
 * @throws {@link ConfigError} naming the file (absolute path) when it exists but cannot be used
 */
export function loadEnvFile(dir: string, env: NodeJS.ProcessEnv): string[] {
  const file = path.resolve(dir, '.env');
  const values = readEnvFile(file);
  const names: string[] = [];
  for (const [name, value] of Object.entries(values ?? {})) {
    if (env[name] !== undefined) continue;
    env[name] = value;
    names.push(name);
  }
  loaded = values === undefined ? undefined : { file, names: new Set(names) };
  return names.sort();
}

/**
 * Edit distance between `a` and `b` (optimal string alignment: insertions, deletions,
 * substitutions and swaps of two neighbours each cost 1), so `KYE` is 1 away from `KEY`.
 */
export function editDistance(a: string, b: string): number {
  // d[i][j] = distance between a[0..i) and b[0..j); rows kept: two before and the current one.
  let prev2: number[] = [];
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, prev2[j - 2]! + 1);
      cur.push(d);
    }
    prev2 = prev;
    prev = cur;
  }
  return prev[b.length]!;
}

/**
 * The known name nearest to `name` (compared upper-cased), or undefined when none is close: at
 * most a third of the part after `CONVO_MIRROR_` may differ (at least one edit is allowed). Ties
 * go to the first in `known`.
 */
export function nearestName(name: string, known: readonly string[]): string | undefined {
  const upper = name.toUpperCase();
  const allowed = Math.max(1, Math.floor((upper.length - PREFIX.length) / 3));
  let best: { name: string; d: number } | undefined;
  for (const k of known) {
    const d = editDistance(upper, k);
    if (d <= allowed && (best === undefined || d < best.d)) best = { name: k, d };
  }
  return best?.name;
}

/** A variable that looks like one of ours but that nothing reads, and the nearest known name. */
export interface UnknownVariable {
  name: string;
  /** The nearest known name, when one is close enough ({@link nearestName}). */
  suggestion: string | undefined;
}

/**
 * The variables of `env` whose name starts with `CONVO_MIRROR_` (in any case) and is not in
 * `known`, sorted by name. Values are never looked at.
 */
export function unknownVariables(env: NodeJS.ProcessEnv, known: readonly string[]): UnknownVariable[] {
  const knownSet = new Set(known);
  return Object.keys(env)
    .filter((name) => name.toUpperCase().startsWith(PREFIX) && !knownSet.has(name))
    .sort()
    .map((name) => ({ name, suggestion: nearestName(name, known) }));
}

/**
 * One warning line (without `convo-mirror: warning: `) per unknown `CONVO_MIRROR_*` variable of
 * `env` ({@link unknownVariables}), saying when it came from `.env`; never a value. E.g.
 * `CONVO_MIRROR_API_KYE is not a setting; did you mean CONVO_MIRROR_API_KEY?`.
 *
 * @param fromEnvFile - the variables taken from `.env` ({@link envFileNames})
 */
export function unknownVariableWarnings(env: NodeJS.ProcessEnv, known: readonly string[], fromEnvFile: ReadonlySet<string>): string[] {
  return unknownVariables(env, known).map(({ name, suggestion }) => {
    const where = fromEnvFile.has(name) ? ' (from .env)' : '';
    return `${name}${where} is not a setting${suggestion === undefined ? ' (ignored)' : `; did you mean ${suggestion}?`}`;
  });
}
