/**
 * `convo-mirror config [--json]`: the effective settings, one per line, each with where it came
 * from (`flag`, `environment`, `.env`, `default`, or `unset`). Secrets (the API key, the webhook
 * secret, the admin password, a workspaces file's key variables) show only as set or unset; a URL's
 * user info is masked, and so is the password of a PostgreSQL `CONVO_MIRROR_DB`. It requires nothing (no base URL, no key), writes nothing and connects
 * nowhere: no mirror, no directory, no Redis. A malformed value is shown with what is wrong with
 * it, and the exit code is then 2. A setting given but ignored in the configuration chosen (the
 * admin password with the local scheduler...) is shown with why (config/ignored.ts).
 */
import type { Command } from 'commander';
import { CONFIG_FIELDS, flagName, maskUserInfo, settingReport, workspaceKeyVariables, type ConfigFlags, type FieldKey, type SettingReport, type SettingSource } from '../../config/index.js';
import { dbShown } from '../../config/db-url.js';
import { envFileNames } from '../../config/env-file.js';
import { ignoredSettings } from '../../config/ignored.js';
import { ConfigError } from '../errors.js';
import { EXIT, fail, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';

/** One line of the report: a setting, or a key variable a workspaces file names. */
interface Shown {
  env: string;
  source: SettingSource;
  /** Shown only as set or unset. */
  secret: boolean;
  /** The value as written in the environment (numbers and booleans typed); null when unset or malformed. */
  value: string | number | boolean | null;
  /** When malformed: the value given, as it may be shown (undefined for a secret). */
  given?: string | undefined;
  /** When malformed: what is wrong; `blame` is the flag or variable to fix. */
  error?: string | undefined;
  blame?: string | undefined;
  /** When given but ignored in the configuration chosen: why (config/ignored.ts). */
  ignored?: string | undefined;
}

/** A validated value as the environment would hold it: lists comma-separated, URLs masked. */
function shownValue(key: FieldKey, value: unknown): string | number | boolean | null {
  if (value === undefined) return null;
  if (typeof value === 'number' || typeof value === 'boolean') return value;
  if (key === 'listParams') return new URLSearchParams(value as [string, string][]).toString();
  if (Array.isArray(value)) return value.join(',');
  if (key === 'db') return dbShown(String(value));
  return key === 'baseUrl' || key === 'redisUrl' ? maskUserInfo(String(value)) : String(value);
}

function shownOf(r: SettingReport): Shown {
  const blame = r.source === 'flag' ? flagName(CONFIG_FIELDS[r.key]) : r.env;
  return { env: r.env, source: r.source, secret: r.secret, value: shownValue(r.key, r.value), given: r.given, error: r.error, blame: r.error === undefined ? undefined : blame };
}

/**
 * The key variables (`api_key_env`) of the workspaces file, if one is configured and valid, as
 * secret lines (those not already shown); a file that cannot be used sets the error of `files`.
 */
function keyVariableLines(files: Shown, env: NodeJS.ProcessEnv, listed: ReadonlySet<string>): Shown[] {
  if (files.error !== undefined || typeof files.value !== 'string') return [];
  let names: string[];
  try {
    names = workspaceKeyVariables(files.value, files.env);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    Object.assign(files, { error: err.message.slice(err.variable.length + 2), blame: files.source === 'flag' ? flagName(CONFIG_FIELDS.workspacesFile) : files.env });
    return [];
  }
  const fromFile = envFileNames();
  return [...new Set(names)]
    .filter((n) => !listed.has(n))
    .map((n) => {
      const set = env[n] !== undefined && env[n] !== '';
      return { env: n, source: set ? (fromFile.has(n) ? '.env' : 'environment') : 'unset', secret: true, value: null };
    });
}

/** Every setting in table order, then the workspaces file's key variables. */
export function configReport(env: NodeJS.ProcessEnv, flags: ConfigFlags): Shown[] {
  const fromFile = envFileNames();
  const lines = (Object.keys(CONFIG_FIELDS) as FieldKey[]).map((key) => shownOf(settingReport(key, env, flags, fromFile)));
  const files = lines.find((l) => l.env === CONFIG_FIELDS.workspacesFile.env)!;
  for (const s of ignoredSettings(env, flags, fromFile)) {
    const line = lines.find((l) => l.env === CONFIG_FIELDS[s.key].env);
    if (line) line.ignored = s.reason;
  }
  return [...lines, ...keyVariableLines(files, env, new Set(lines.map((l) => l.env)))];
}

/** What a line shows after its name and source: the value, `set`/`unset` for a secret, and an error. */
function textOf(l: Shown): string {
  const isSet = l.source !== 'unset';
  const value = l.secret ? (isSet ? 'set (secret, not shown)' : '') : l.error !== undefined ? (l.given ?? '') : l.value === null ? '' : String(l.value);
  const note = l.error !== undefined ? `(invalid: ${l.error})` : l.ignored !== undefined ? `(ignored: ${l.ignored})` : '';
  return `${value}${note === '' ? '' : `${value === '' ? '' : '  '}${note}`}`;
}

/** The report as text: `NAME  source  value`, names and sources padded into columns. */
export function formatConfig(lines: readonly Shown[]): string {
  const width = Math.max(...lines.map((l) => l.env.length));
  return lines.map((l) => `${l.env.padEnd(width)}  ${l.source.padEnd(11)}  ${textOf(l)}`.trimEnd()).join('\n') + '\n';
}

/**
 * The report as JSON, keyed by variable: `{ value, source }`, or `{ set, source }` for a secret;
 * `error` when malformed; `ignored` (why) when given but ignored in the configuration chosen.
 */
export function configJson(lines: readonly Shown[]): Record<string, Record<string, unknown>> {
  const out: Record<string, Record<string, unknown>> = {};
  for (const l of lines) {
    const shown = l.secret ? { set: l.source !== 'unset' } : { value: l.error !== undefined ? (l.given ?? null) : l.value };
    out[l.env] = { ...shown, source: l.source, ...(l.error === undefined ? {} : { error: l.error }), ...(l.ignored === undefined ? {} : { ignored: l.ignored }) };
  }
  return out;
}

/** Adds `config` to `program`: it takes every configuration flag. */
export function addConfigCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('config')
    .description('Show the effective settings and where each comes from (flag, environment, .env, default); secrets only as set or unset. Writes nothing, connects nowhere')
    .option('--json', 'print as JSON, keyed by variable');
  addConfigFlags(cmd, 'config').action((o: Record<string, unknown>) =>
    settle(setExit, () => {
      const lines = configReport(process.env, configFlagsOf(o, 'config'));
      process.stdout.write(o.json ? JSON.stringify(configJson(lines), null, 2) + '\n' : formatConfig(lines));
      const bad = lines.filter((l) => l.error !== undefined);
      for (const l of bad) fail(EXIT.CONFIG, `configuration error: ${l.blame}: ${l.error}`);
      return bad.length > 0 ? EXIT.CONFIG : EXIT.OK;
    }),
  );
}
