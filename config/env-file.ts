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

/** The `.env` loaded by this process ({@link loadEnvFile}), if any, and the `#` that cut its values. */
let loaded: { file: string; names: ReadonlySet<string>; cuts: readonly HashCut[] } | undefined;

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
  return readEnvFileWithCuts(file)?.values;
}

/** {@link readEnvFile}, with the values an unquoted `#` cut ({@link unquotedHashCuts}). */
function readEnvFileWithCuts(file: string): { values: Record<string, string>; cuts: HashCut[] } | undefined {
  const text = readEnvText(file);
  if (text === undefined) return undefined;
  const values: Record<string, string> = {};
  for (const [name, value] of Object.entries(parseEnv(text))) if (value !== undefined) values[name] = value;
  return { values, cuts: unquotedHashCuts(text, values) };
}

/**
 * A value of a `.env` file that an unquoted `#` cut: `util.parseEnv`, like dotenv (its rule: an
 * unquoted value ends at the first `#`, with or without a space before it), reads everything from
 * that `#` to the end of the line as a comment.
 */
export interface HashCut {
  /** 1-based line of the file. */
  line: number;
  /** The variable, e.g. `CONVO_MIRROR_API_KEY`; never its value. */
  name: string;
  /**
   * True when blank space comes before the `#` (`KEY=value # note`, the usual inline comment); false
   * when the `#` is glued to the value or opens it (`KEY=k3y#Secret`, `KEY=#x`), which is never a comment on purpose.
   */
  spaced: boolean;
}

const QUOTES = ['"', "'", '`'] as const;

/**
 * The unquoted values of the `.env` text `text` that a `#` cut, in file order: each `NAME=value`
 * line whose value does not open with a quote and holds a `#`, when `parsed` (what
 * `util.parseEnv` made of `text`) holds exactly the part before that `#`, so what is reported is
 * what the parser did. Quoted values, which may span lines, are skipped whole. Linear in the
 * text's size; never looks at a value beyond finding the `#`.
 */
export function unquotedHashCuts(text: string, parsed: Readonly<Record<string, string | undefined>>): HashCut[] {
  const lines = text.replace(/\r/g, '').split('\n');
  // For each quote character, the first line at or after i that holds it (lines.length: none), so
  // skipping a quoted value that spans lines costs nothing more than reading those lines once.
  const next = Object.fromEntries(
    QUOTES.map((q) => {
      const at = new Array<number>(lines.length + 1).fill(lines.length);
      for (let i = lines.length - 1; i >= 0; i--) at[i] = lines[i]!.includes(q) ? i : at[i + 1]!;
      return [q, at];
    }),
  ) as Record<(typeof QUOTES)[number], number[]>;
  const out: HashCut[] = [];
  for (let i = 0; i < lines.length; i++) {
    const m = /^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=(\s*)(.*)$/.exec(lines[i]!);
    if (!m) continue;
    const [, name, blank, value] = m as unknown as [string, string, string, string];
    const quote = QUOTES.find((q) => value.startsWith(q));
    if (quote !== undefined) {
      // Closed on this line, or on a later one (a multi-line value): go on after it; never closed: just this line.
      if (!value.slice(1).includes(quote)) {
        const close = next[quote][i + 1]!;
        if (close < lines.length) i = close;
      }
      continue;
    }
    const hash = value.indexOf('#');
    if (hash < 0 || parsed[name]?.trim() !== value.slice(0, hash).trim()) continue;
    out.push({ line: i + 1, name, spaced: hash > 0 ? /\s/.test(value[hash - 1]!) : blank !== '' });
  }
  return out;
}

/**
 * One warning line (without `convo-mirror: warning: `) for each value of the loaded `.env` that
 * an unquoted `#` cut ({@link unquotedHashCuts}) and that this process took (the environment did
 * not set it): always for a `#` glued to the value (`KEY=k3y#Secret`: a cut secret, never a
 * comment on purpose); for a `#` after blank space (`KEY=value # note`, an inline comment) only
 * when the variable is one of `secrets`, whose values may hold spaces and `#`. Names the line and
 * the variable, never the value. E.g. `.env line 4: CONVO_MIRROR_API_KEY's value holds "#"
 * unquoted: everything from it on is read as a comment; quote the value ('...') if the "#" belongs to it`.
 *
 * @param secrets - variables holding secrets (API keys, the webhook secret, the admin password)
 */
export function envFileWarnings(secrets: ReadonlySet<string>): string[] {
  if (loaded === undefined) return [];
  const { names, cuts } = loaded;
  return cuts
    .filter((c) => names.has(c.name) && (!c.spaced || secrets.has(c.name)))
    .map((c) => {
      const what = c.spaced ? `is followed by an unquoted " #"` : `holds "#" unquoted`;
      const fix = c.spaced ? `quote the value ('...') if the "#" belongs to it, or put the comment on a line of its own` : `quote the value ('...') if the "#" belongs to it`;
      return `.env line ${c.line}: ${c.name}'s value ${what}: everything from it on is read as a comment; ${fix}`;
    });
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
  const read = readEnvFileWithCuts(file);
  const names: string[] = [];
  for (const [name, value] of Object.entries(read?.values ?? {})) {
    if (env[name] !== undefined) continue;
    env[name] = value;
    names.push(name);
  }
  loaded = read === undefined ? undefined : { file, names: new Set(names), cuts: read.cuts };
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
