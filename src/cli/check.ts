/**
 * `convo-mirror check`: the connection check that Airbyte and Singer taps offer, and a check of
 * everything else a run needs. With at most two API requests per workspace (the first page of the
 * conversation list, then the first page of one listed conversation's messages, no retries) it
 * proves that the base URL answers, the key is accepted and the account is reachable; then that the
 * workspaces file reads, the signing key loads, the mirror file and the export directory can be
 * written (nothing is created: see src/writable.ts), or for a PostgreSQL mirror that the database
 * answers, the state of the mirror's schema and the role's rights there (reads only); in BullMQ mode, that Redis answers on its
 * database; with `--daemon`, that the daemon's HTTP address can be listened on. One line per check
 * with a mark (✓ passed, ! passed with a warning, ✗ failed) and the reason; `--json` for scripts.
 * It writes nothing and never shows a secret. Settings given but ignored are warned about on stderr.
 *
 * Each check is one entry of {@link CHECKS}: adding a check is adding a function there.
 */
import path from 'node:path';
import type { Command } from 'commander';
import { CONFIG_FIELDS, baseUrlSettingOf, loadConfig, type Config, type ConfigFlags, type Workspace } from '../../config/index.js';
import { envFileNames } from '../../config/env-file.js';
import { ignoredSettings, ignoredWarning } from '../../config/ignored.js';
import { redisShown } from '../../config/redis-url.js';
import { checkClientFromConfig, type ApiClient } from '../api/client.js';
import { AuthError, ConfigError, describeError } from '../errors.js';
import { assertSafeExportDir } from '../export/paths.js';
import { loadSigningKey } from '../export/signing.js';
import { witnessDirProblem } from '../export/witness.js';
import { createLogger } from '../logger.js';
import { listenAddress, tryListen } from '../server/listen.js';
import { DEFAULT_ACCOUNT } from '../store/mirror.js';
import { inspectPostgres, mirrorFileOf, WRITER_TABLE_PRIVILEGES, type PostgresInspection } from '../store/open-mirror.js';
import { whyNotWritable } from '../writable.js';
import { EXIT, settle, verdictOf, worstExit, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { escapeForTerminal, jsonForTerminal } from '../terminal.js';
import { selectWorkspaces } from './sync.js';

/** One check's outcome: one line of output. */
export interface CheckOutcome {
  /**
   * What was checked: `workspaces`, `api`, `messages` (with several workspaces, `api <account>`,
   * `messages <account>`), `signing key`, `mirror` (with a PostgreSQL mirror also `schema` and
   * `rights`), `exports`, `redis`, `http`.
   */
  name: string;
  /** True when it passed, with or without a {@link CheckOutcome.warning}. */
  ok: boolean;
  /** Passed, but with something to fix (e.g. a signing key readable by others): marked `!`. */
  warning?: boolean;
  /** What was found, in words: the reason when it failed. Never a secret. */
  detail: string;
  /** The exit code this outcome alone calls for ({@link EXIT}): 0 when ok. */
  code: number;
}

/** What every check reads. */
export interface CheckContext {
  config: Config;
  /** Check Redis in BullMQ mode (`--no-queue`: false). */
  queue: boolean;
  /** Check what the daemon needs besides (`--daemon`): its HTTP address. */
  daemon: boolean;
  /**
   * Why the API's settings cannot be used (a base URL or key missing, a workspaces file or a key
   * variable it names that cannot be used), when they cannot: the API checks report it instead of
   * calling. `config` was then loaded without them.
   */
  apiSettings?: ConfigError | undefined;
}

/** One check: the lines it reports; none when it does not apply to this configuration. */
export type Check = (ctx: CheckContext) => readonly CheckOutcome[] | Promise<readonly CheckOutcome[]>;

/** The longest a check's request may take, ms (CONVO_MIRROR_REQUEST_TIMEOUT when shorter). */
export const CHECK_TIMEOUT_MS = 10_000;

const passed = (name: string, detail: string): CheckOutcome => ({ name, ok: true, detail, code: EXIT.OK });

/** A failed check: its message and exit code from the error ({@link verdictOf}: 2 for configuration, keys and paths). */
function failed(name: string, err: unknown, keyVariable?: string): CheckOutcome {
  // The line says what failed without the "configuration error:" prefix the exit code already carries;
  // a key from a workspaces file is named by its own variable.
  let detail = describeError(err);
  if (err instanceof AuthError && keyVariable !== undefined) detail = detail.replaceAll(CONFIG_FIELDS.apiKey.env, keyVariable);
  return { name, ok: false, detail, code: verdictOf(err).code };
}

/** The first page of the list, then of one listed conversation's messages: at most two requests. */
async function checkApi(api: ApiClient, label: string, keyVariable: string | undefined): Promise<CheckOutcome[]> {
  const list = api.conversations();
  let first;
  try {
    first = (await list.next()).value;
  } catch (err) {
    return [failed(label, err, keyVariable)];
  } finally {
    await list.return(undefined);
  }
  if (!first) return [failed(label, new Error('the conversation list answered nothing'))];
  const total = first.meta.total_count;
  const out = [passed(label, `the API answered; the key is accepted; ${total} conversation${total === 1 ? '' : 's'} in the list`)];
  const sample = first.data[0];
  const messagesLabel = label.replace(/^api/, 'messages');
  if (!sample) return [...out, passed(messagesLabel, 'the list is empty: no conversation to read messages of')];
  const pages = api.messages(sample.id);
  try {
    const page = (await pages.next()).value;
    out.push(passed(messagesLabel, `conversation ${sample.id}: ${page?.meta.total_count ?? 0} messages readable`));
  } catch (err) {
    out.push(failed(messagesLabel, err, keyVariable));
  } finally {
    await pages.return(undefined);
  }
  return out;
}

/** The API checks of one workspace, with a client that fails fast and does not retry. */
async function checkWorkspace(config: Config, workspace: Workspace, several: boolean): Promise<CheckOutcome[]> {
  const label = several ? `api ${workspace.accountId ?? DEFAULT_ACCOUNT}` : 'api';
  const logger = createLogger({ level: 'silent' });
  // At most CHECK_TIMEOUT_MS a request: a check that hangs for the sync's timeout helps nobody.
  const api = checkClientFromConfig({ ...config, ...workspace }, CHECK_TIMEOUT_MS, { logger, baseUrlSetting: baseUrlSettingOf(config, workspace) });
  try {
    return await checkApi(api, label, workspace.keyVariable);
  } finally {
    await api.close();
  }
}

/** The workspaces file, when one is set: it reads, and how many workspaces it lists. */
const checkWorkspacesFile: Check = ({ config, apiSettings }) => {
  if (config.workspacesFile === undefined) return [];
  if (apiSettings !== undefined) return [failed('workspaces', apiSettings)];
  const n = config.workspaces.length;
  return [passed('workspaces', `${config.workspacesFile} lists ${n} workspace${n === 1 ? '' : 's'} (${CONFIG_FIELDS.workspacesFile.env})`)];
};

/** Each workspace's API, in turn; or why the API's settings cannot be used. */
const checkApis: Check = async ({ config, apiSettings }) => {
  if (apiSettings !== undefined) return config.workspacesFile === undefined ? [failed('api', apiSettings)] : []; // the workspaces line said why
  const out: CheckOutcome[] = [];
  for (const w of config.workspaces) out.push(...(await checkWorkspace(config, w, config.workspaces.length > 1)));
  return out;
};

/**
 * The signing key, when one is set: present, readable, an unencrypted Ed25519 private key (what
 * `sync` and the daemon load at start); one readable by others passes with a warning.
 */
const checkSigningKey: Check = ({ config }) => {
  if (config.signingKeyFile === undefined) return [];
  try {
    const key = loadSigningKey(config.signingKeyFile);
    const found = `${key.file}: an Ed25519 private key, key id ${key.keyId} (${CONFIG_FIELDS.signingKeyFile.env})`;
    if (key.warning === undefined) return [passed('signing key', found)];
    // The warning names the file the line already names: "it can be read or written by others...".
    const warning = key.warning.startsWith(`${key.file} `) ? `it ${key.warning.slice(key.file.length + 1)}` : key.warning;
    return [{ ...passed('signing key', `${found}; but ${warning}`), warning: true }];
  } catch (err) {
    return [failed('signing key', err)];
  }
};

/** Whether `target` can be written, named by its setting. */
function checkPath(name: string, variable: string, target: string, kind: 'file' | 'dir'): CheckOutcome {
  const why = whyNotWritable(target, kind);
  if (why === undefined) return passed(name, `${target} can be written (${variable})`);
  return { name, ok: false, detail: `${variable}: cannot write ${target}: ${why}`, code: EXIT.CONFIG };
}

/**
 * The mirror: a SQLite file can be written; a PostgreSQL database is checked by
 * {@link checkPostgres}.
 */
const checkMirror: Check = ({ config }) => (mirrorFileOf(config.db) === undefined ? checkPostgres(config.db) : [checkPath('mirror', CONFIG_FIELDS.db.env, config.db, 'file')]);

/** An identifier as SQL quotes it. */
const ident = (s: string): string => `"${s.replace(/"/g, '""')}"`;

/**
 * A PostgreSQL mirror (reads only, nothing created): `mirror`, the server answers and takes the
 * credentials; `schema`, the mirror's schema is current, or will be created or migrated by the
 * first writer, or cannot be used (newer than this code, someone else's tables); `rights`, the
 * role may do what a writer will do there: create the schema (CREATE on the database) when it is
 * missing; else USAGE on it, CREATE on it when a migration is pending, and SELECT, INSERT, UPDATE,
 * DELETE on its tables. A failure names the GRANT that fixes it.
 */
async function checkPostgres(target: string): Promise<CheckOutcome[]> {
  let found: PostgresInspection;
  try {
    found = await inspectPostgres(target);
  } catch (err) {
    return [failed('mirror', err)];
  }
  const { schema, user, database, state, rights, currentVersion } = found;
  const env = CONFIG_FIELDS.db.env;
  const out = [passed('mirror', `PostgreSQL ${found.serverVersion} at ${found.shown} answers; user ${ident(user)}, database ${ident(database)} (${env})`)];
  const bad = (name: string, detail: string): CheckOutcome => ({ name, ok: false, detail, code: EXIT.CONFIG });
  const s = ident(schema);
  // The schema.
  if (!state.schemaExists) out.push(passed('schema', `${s} does not exist yet: the first sync or daemon creates it at version ${currentVersion}`));
  else if (!found.versionRead) out.push(bad('schema', `${s} exists, but user ${ident(user)} may not read its version (see rights)`));
  else if (state.version > currentVersion) out.push(bad('schema', `${s} is at version ${state.version}, newer than this convo-mirror knows (${currentVersion}): upgrade convo-mirror`));
  else if (state.version === 0 && state.tables > 0) out.push(bad('schema', `${s} holds tables but no convo-mirror mirror: point ${env} at another schema (?schema=NAME)`));
  else if (state.version === currentVersion) out.push(passed('schema', `${s} is at version ${state.version}, current`));
  else out.push(passed('schema', `${s} is at version ${state.version} of ${currentVersion}: the first sync or daemon migrates it`));
  // The rights a writer needs there.
  const u = ident(user);
  if (!state.schemaExists) {
    out.push(
      rights.createOnDatabase
        ? passed('rights', `user ${u} may create schema ${s} (CREATE on database ${ident(database)})`)
        : bad('rights', `user ${u} may not create the mirror's schema ${s} in database ${ident(database)}: GRANT CREATE ON DATABASE ${ident(database)} TO ${u}, or create the schema with that user as its owner`),
    );
    return out;
  }
  const owner = rights.schemaOwner !== undefined ? `, owned by ${ident(rights.schemaOwner)}` : '';
  if (rights.usageOnSchema !== true) {
    out.push(bad('rights', `user ${u} lacks USAGE on schema ${s}${owner}: GRANT USAGE ON SCHEMA ${s} TO ${u}`));
    return out;
  }
  const migrates = found.versionRead && state.version < currentVersion;
  if (migrates && rights.createOnSchema !== true) {
    out.push(bad('rights', `user ${u} lacks CREATE on schema ${s}${owner}, which migrating it needs: GRANT CREATE ON SCHEMA ${s} TO ${u}, or run the first sync as the owner`));
    return out;
  }
  if (rights.tablesLacking.length > 0) {
    const n = rights.tablesLacking.length;
    const list = rights.tablesLacking.slice(0, 5).join(', ') + (n > 5 ? ` and ${n - 5} more` : '');
    out.push(
      bad('rights', `user ${u} lacks ${rights.privilegesLacking.join(', ')} on ${n} table${n === 1 ? '' : 's'} of schema ${s} (${list}): GRANT ${WRITER_TABLE_PRIVILEGES.join(', ')} ON ALL TABLES IN SCHEMA ${s} TO ${u}`),
    );
    return out;
  }
  const create = rights.createOnSchema === true ? ' and CREATE' : '';
  out.push(passed('rights', `user ${u} has USAGE${create} on schema ${s}${owner}, and ${WRITER_TABLE_PRIVILEGES.join(', ')} on its ${rights.tables} tables`));
  return out;
}

/** The export directory: not the mirror's own directory (nor a root), and writable. */
const checkExports: Check = ({ config }) => {
  try {
    assertSafeExportDir(config.exportDir, mirrorFileOf(config.db));
  } catch (err) {
    return [failed('exports', err)];
  }
  return [checkPath('exports', CONFIG_FIELDS.exportDir.env, config.exportDir, 'dir')];
};

/** The head witness's directory, when one is set: it exists, can be written, and lies outside the export directory. */
const checkWitness: Check = ({ config }) => {
  if (config.witnessDir === undefined) return [];
  const why = witnessDirProblem(config.witnessDir, undefined, config.exportDir);
  if (why === undefined) return [passed('witness', `${path.resolve(config.witnessDir)} can be appended to (${CONFIG_FIELDS.witnessDir.env})`)];
  return [{ name: 'witness', ok: false, detail: why, code: EXIT.CONFIG }];
};

/** In BullMQ mode (unless `--no-queue`): Redis answers a PING on the URL's database (one attempt, a short timeout); writes nothing. */
const checkRedis: Check = async ({ config, queue }) => {
  if (!queue || config.scheduler !== 'bullmq') return [];
  const { assertRedisReachable } = await import('../../jobs/queue.js'); // the queue's libraries load only here
  try {
    await assertRedisReachable(config.redisUrl, 2000);
    return [passed('redis', `${redisShown(config.redisUrl)} answers PING (${CONFIG_FIELDS.redisUrl.env})`)];
  } catch (err) {
    const hint = ": the daemon's bullmq scheduler needs it (for sync alone, run check --no-queue; a daemon without Redis: CONVO_MIRROR_SCHEDULER=local)";
    const f = failed('redis', err);
    return [{ ...f, detail: `${f.detail}${hint}` }];
  }
};

/** With `--daemon`: the HTTP server's address can be listened on now (bound, then released at once). */
const checkHttp: Check = async ({ config, daemon }) => {
  if (!daemon) return [];
  if (config.httpPort === 0) return [passed('http', `no HTTP server (${CONFIG_FIELDS.httpPort.env}=0)`)];
  try {
    await tryListen(config.httpHost, config.httpPort);
    return [passed('http', `${listenAddress(config.httpHost, config.httpPort)} can be listened on (${CONFIG_FIELDS.httpHost.env}, ${CONFIG_FIELDS.httpPort.env})`)];
  } catch (err) {
    return [failed('http', err)];
  }
};

/** Every check, in the order their lines print. */
export const CHECKS: readonly Check[] = [checkWorkspacesFile, checkApis, checkSigningKey, checkMirror, checkExports, checkWitness, checkRedis, checkHttp];

/** Runs every check of {@link CHECKS} in turn. */
export async function runChecks(ctx: CheckContext): Promise<CheckOutcome[]> {
  const out: CheckOutcome[] = [];
  for (const check of CHECKS) out.push(...(await check(ctx)));
  return out;
}

/**
 * The configuration to check. When the API's settings cannot be used (a base URL or key missing,
 * a workspaces file or the key variable it names that cannot be used) but the rest can, the rest
 * is checked and the API's problem is reported as a line of its own.
 *
 * @throws {@link ConfigError} for any other setting, as {@link loadConfig}; naming `--account` for
 *   an account no workspace has
 */
function configToCheck(flags: ConfigFlags, accounts: string[] | undefined): Pick<CheckContext, 'config' | 'apiSettings'> {
  let loaded: Config;
  try {
    loaded = loadConfig(process.env, flags);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    // The same settings without the API's: if they load, the API's were the problem.
    let rest: Config;
    try {
      rest = loadConfig(process.env, flags, { needsApi: false });
    } catch {
      throw err;
    }
    return { config: rest, apiSettings: err };
  }
  return { config: Object.freeze({ ...loaded, workspaces: selectWorkspaces(loaded.workspaces, accounts) }) };
}

/** Prints the outcomes (a line each, or JSON) and returns the exit code: 0 only when all passed. */
function report(outcomes: readonly CheckOutcome[], json: boolean): number {
  const ok = outcomes.every((o) => o.ok);
  if (json) {
    const checks = outcomes.map(({ name, ok: passedCheck, warning, detail }) => ({ name, ok: passedCheck, ...(warning ? { warning: true } : {}), detail }));
    process.stdout.write(jsonForTerminal({ ok, checks }, 2) + '\n');
  } else {
    // A detail may quote what the API or Redis answered: escaped for the terminal.
    for (const o of outcomes) process.stdout.write(`${o.ok ? (o.warning ? '!' : '✓') : '✗'} ${o.name}: ${escapeForTerminal(o.detail)}\n`);
  }
  return worstExit(outcomes.map((o) => o.code));
}

/** Adds `check` to `program`. */
export function addCheckCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('check')
    .description(
      'Check the configuration: the API answers and accepts the key (at most two requests per workspace), the workspaces file reads, the signing key loads, the mirror and exports can be written (a PostgreSQL mirror: the database answers, its schema version, the rights of its user), Redis answers; with --daemon, the HTTP port can be listened on. Writes nothing; exit 0 only when all pass',
    )
    .option('--daemon', "also check what the daemon needs: its HTTP address (CONVO_MIRROR_HTTP_HOST, CONVO_MIRROR_HTTP_PORT) can be listened on; check takes the daemon's flags")
    .option('--account <id>', 'only this configured workspace (repeatable), as sync and daemon take it', (v: string, prev: string[] = []) => [...prev, v])
    .option('--no-queue', 'skip the Redis check (sync alone needs no Redis)')
    .option('--json', 'print {ok, checks: [{name, ok, warning?, detail}]} as JSON');
  addConfigFlags(cmd, 'check').action((o) =>
    settle(setExit, async () => {
      const flags = configFlagsOf(o, 'check');
      let loaded: Pick<CheckContext, 'config' | 'apiSettings'>;
      try {
        loaded = configToCheck(flags, o.account as string[] | undefined);
      } catch (err) {
        // With --json, a configuration that cannot be read is a failed check too (scripts read stdout).
        if (o.json !== true) throw err;
        return report([failed('config', err)], true);
      }
      for (const s of ignoredSettings(process.env, flags, envFileNames())) process.stderr.write(`convo-mirror: warning: ${ignoredWarning(s)}\n`);
      return report(await runChecks({ ...loaded, queue: o.queue !== false, daemon: o.daemon === true }), o.json === true);
    }),
  );
}
