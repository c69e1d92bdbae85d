/**
 * `convo-mirror sync`: one recorded run per configured workspace in this process (src/run/), one
 * after the other into the one mirror, with a progress bar on a terminal, the summaries on stdout
 * and each failure on stderr (labelled `account <id>` when there are several).
 */
import type { Command } from 'commander';
import type { Logger } from 'pino';
import { CONFIG_FIELDS, baseUrlSettingOf, loadConfig, type Config, type Workspace } from '../../config/index.js';
import { apiClientFromConfig } from '../api/client.js';
import { RateLimiterPool } from '../api/rate-limit.js';
import { ConfigError, RunError, StoreError, describeError } from '../errors.js';
import { DEFAULT_ACCOUNT, type Mirror } from '../store/mirror.js';
import { mirrorFileOf } from '../store/open-mirror.js';
import { openMirrorForRuns, runSync, type RunSummary } from '../run/index.js';
import { newProgress } from '../sync/types.js';
import { createLogger } from '../logger.js';
import { startProgress } from '../progress.js';
import { systemClock } from '../clock.js';
import { assertSafeExportDir } from '../export/exporter.js';
import { publishSettingsFromConfig, type PublishSettings } from '../export/publisher.js';
import { assertWitnessDirSetting } from '../export/witness.js';
import { fileModes } from '../private-fs.js';
import { assertWritable } from '../writable.js';
import { EXIT, fail, settle, verdictOf, worstExit, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, conversationIdsFrom } from './flags.js';
import { isTTY, printSummary, reportFailures } from './summary.js';
import { jsonForTerminal } from '../terminal.js';

/** Options of {@link syncWithConfig}. */
export interface SyncCommandOptions {
  config: Config;
  /** Only these conversations (`--conversation`); undefined = the whole workspace. */
  conversationIds?: string[] | undefined;
  /** Full refresh (`--full`). @defaultValue false */
  full?: boolean;
  /** The summary goes out as JSON: no bar, info logs kept. @defaultValue false */
  json?: boolean;
  /** Logger to use instead of one built from the config. */
  logger?: Logger;
}

/** Stops the run on SIGINT/SIGTERM (no new conversations; checkpoints let a re-run resume). */
function abortOnSignals(logger: Logger): { signal: AbortSignal; off: () => void } {
  const abort = new AbortController();
  const onSignal = (sig: NodeJS.Signals) => {
    logger.warn({ signal: sig }, 'stopping: no new conversations; re-run to resume from the checkpoints');
    abort.abort(new Error(`interrupted by ${sig}`));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  return {
    signal: abort.signal,
    off: () => {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    },
  };
}

/** What one `sync` command holds for all its workspaces: logger, signals, the mirror, the limiters. */
interface SyncSession {
  config: Config;
  logger: Logger;
  tty: boolean;
  signals: { signal: AbortSignal; off: () => void };
  /**
   * The mirror, opened (created, when it is new) by the first workspace whose API answered: a
   * sync that ends at first contact touches no file.
   */
  mirror: Mirror | undefined;
  /** One rate limiter per base URL + key, shared by the workspaces' clients. */
  limiters: RateLimiterPool;
  /** Where and how runs publish (the signing key loaded once). */
  target: PublishSettings;
  /**
   * Whether the API has answered anything in this command: fail fast only before that (a later
   * workspace meeting a restarting API retries as any run does).
   */
  answered: boolean;
}

/**
 * Checks the export directory and the paths, loads the signing key and installs the signal
 * handlers; the mirror is opened later ({@link mirrorOf}), once the API has answered.
 * @throws {@link ConfigError} for an unsafe export directory, a path that cannot be written, an unusable key
 */
function openSession(opts: SyncCommandOptions): SyncSession {
  const { config } = opts;
  const tty = isTTY() && !opts.json;
  // On a terminal the bar and the summary tell the story: info lines would break the bar.
  const level = tty && config.logLevel === 'info' ? 'warn' : config.logLevel;
  const logger = opts.logger ?? createLogger({ level, pretty: tty });
  // Before any request or file: an export directory that would hold the mirror (or is /, or a file),
  // and paths that cannot be written (named with the setting and the OS's reason).
  const dbFile = mirrorFileOf(config.db);
  assertSafeExportDir(config.exportDir, dbFile);
  if (dbFile !== undefined) assertWritable(CONFIG_FIELDS.db.env, dbFile, 'file');
  assertWritable(CONFIG_FIELDS.exportDir.env, config.exportDir, 'dir');
  if (config.witnessDir !== undefined) assertWitnessDirSetting(config.witnessDir, config.exportDir);
  const target = publishSettingsFromConfig(config, logger);
  const signals = abortOnSignals(logger);
  return { config, logger, tty, signals, mirror: undefined, target, limiters: new RateLimiterPool(config.maxRps, systemClock), answered: false };
}

/**
 * The session's mirror, opened for writing the first time it is needed (runs a dead process left
 * running are swept). Workspaces are synced one after the other, so it is never opened twice.
 */
async function mirrorOf(session: SyncSession): Promise<Mirror> {
  session.mirror ??= await openMirrorForRuns(session.config.db, fileModes(session.config.groupReadable), session.logger);
  return session.mirror;
}

async function closeSession(session: SyncSession): Promise<void> {
  session.signals.off();
  await session.mirror?.close();
}

/**
 * One recorded run of `workspace` (trigger `cli`) with its own client, into the session's mirror.
 * The run's first request goes out before anything else: when it ends the run before it began (a
 * wrong base URL, a refused key) its error is thrown as it is, and no mirror file, run or ledger
 * record is made for it.
 *
 * @throws the {@link ConfigError} or {@link AuthError} of first contact; the {@link RunError} of a run
 */
async function syncOne(session: SyncSession, workspace: Workspace, opts: SyncCommandOptions, logger: Logger): Promise<RunSummary> {
  const { config, signals } = session;
  // failFast: at first contact, nothing listening, no such host or https against plain HTTP is a
  // configuration error.
  const baseUrlSetting = baseUrlSettingOf(config, workspace);
  const api = apiClientFromConfig({ ...config, ...workspace }, { logger, signal: signals.signal, limiters: session.limiters, failFast: !session.answered, baseUrlSetting });
  const progress = newProgress();
  const stop = startProgress({ progress, stats: api.stats, logger, tty: session.tty });
  try {
    const prefetched = await api.prefetch(opts.conversationIds?.[0]);
    const mirror = await mirrorOf(session);
    return await runSync(
      { api, mirror, logger, clock: systemClock },
      {
        accountId: workspace.accountId ?? DEFAULT_ACCOUNT,
        concurrency: config.concurrency,
        conversationIds: opts.conversationIds,
        full: opts.full ?? false,
        changeFieldSetting: config.changeField,
        ...session.target,
        progress,
        signal: signals.signal,
        prefetched,
      },
    );
  } finally {
    stop();
    if (Object.keys(api.stats.byStatus).length > 0) session.answered = true;
    await api.close();
  }
}

/**
 * Runs `sync` with a built config for one workspace (`opts.workspace`, default the first
 * configured): one recorded run (trigger `cli`), exports published.
 *
 * @returns the run's summary (the caller derives the exit code)
 * @throws the {@link RunError} of a run that could not go on, {@link ConfigError} before any request
 */
export async function syncWithConfig(opts: SyncCommandOptions & { workspace?: Workspace }): Promise<RunSummary> {
  const session = openSession(opts);
  try {
    return await syncOne(session, opts.workspace ?? opts.config.workspaces[0]!, opts, session.logger);
  } finally {
    await closeSession(session);
  }
}

/** How one workspace's sync ended, for a command that syncs several. */
export interface WorkspaceOutcome {
  /** The workspace's account id (`default` without one). */
  accountId: string;
  /** The run's summary; undefined when the run never started (an error before it, or an interruption). */
  summary: RunSummary | undefined;
  /** What stopped the run, if anything (a {@link RunError} carries the summary too). */
  error: unknown;
  /** False when the sync stopped before this workspace's turn (see `notStarted`). */
  started: boolean;
  /** Why it was not started: an interruption (SIGINT/SIGTERM), or an earlier workspace's mirror error. */
  notStarted?: 'interrupted' | 'mirror error';
  /** Its exit code, as one workspace's `sync` would exit. */
  exit: number;
  /** The variable its key came from, when not `CONVO_MIRROR_API_KEY` (a workspaces file entry). */
  keyVariable?: string | undefined;
}

/** Errors after which no further workspace is tried: the one mirror they all share is in question. */
const stopsAll = (err: unknown): boolean => err instanceof StoreError || (err instanceof RunError && err.cause instanceof StoreError);

/**
 * Syncs `workspaces` one after the other into the one mirror and export directory, each its own
 * recorded run with its own client (clients sharing a base URL and key share a rate limiter). A
 * workspace that fails (a 401 for its key, say) fails its own run; the others go on. After a
 * mirror error, or once interrupted, the rest are not started.
 *
 * @param onOutcome - called as each workspace ends (to print as it goes)
 * @throws what opening the mirror or the export directory throws (before any run)
 */
export async function syncWorkspaces(
  opts: SyncCommandOptions & { workspaces: readonly Workspace[]; onOutcome?: (o: WorkspaceOutcome) => void },
): Promise<WorkspaceOutcome[]> {
  const session = openSession(opts);
  const outcomes: WorkspaceOutcome[] = [];
  let stopped: WorkspaceOutcome | undefined;
  try {
    for (const workspace of opts.workspaces) {
      const accountId = workspace.accountId ?? DEFAULT_ACCOUNT;
      const from = workspace.keyVariable !== undefined ? { keyVariable: workspace.keyVariable } : {};
      let outcome: WorkspaceOutcome;
      if (stopped) {
        // The mirror they all share failed: not started, with the exit code of that failure.
        outcome = { accountId, summary: undefined, error: undefined, started: false, notStarted: 'mirror error', exit: stopped.exit };
      } else if (session.signals.signal.aborted) {
        outcome = { accountId, summary: undefined, error: undefined, started: false, notStarted: 'interrupted', exit: EXIT.INTERRUPTED };
      } else {
        try {
          const summary = await syncOne(session, workspace, opts, session.logger.child({ account_id: accountId }));
          outcome = { accountId, summary, error: undefined, started: true, exit: exitOfRun(summary), ...from };
        } catch (err) {
          const summary = err instanceof RunError ? (err.summary as RunSummary) : undefined;
          outcome = { accountId, summary, error: err, started: true, exit: verdictOf(err).code, ...from };
          if (stopsAll(err)) stopped = outcome;
        }
      }
      outcomes.push(outcome);
      opts.onOutcome?.(outcome);
    }
    return outcomes;
  } finally {
    await closeSession(session);
  }
}

/**
 * The configured workspaces `--account` names (all when it names none), in configured order.
 * @throws {@link ConfigError} naming `--account` and an id no workspace has
 */
export function selectWorkspaces(all: readonly Workspace[], accounts: readonly string[] | undefined): readonly Workspace[] {
  if (accounts === undefined || accounts.length === 0) return all;
  const wanted = new Set(accounts.map((a) => a.trim().toLowerCase()));
  for (const a of accounts) {
    if (!all.some((w) => w.accountId?.toLowerCase() === a.trim().toLowerCase())) {
      const known = all.map((w) => w.accountId).filter((id) => id !== undefined);
      throw new ConfigError('--account', `${JSON.stringify(a)} is not a configured workspace (${known.length ? `configured: ${known.join(', ')}` : 'no account id is configured'})`);
    }
  }
  return all.filter((w) => w.accountId !== undefined && wanted.has(w.accountId.toLowerCase()));
}

/** Prints one workspace's outcome as it ends: its summary block, failures and error, each labelled. */
function printOutcome(o: WorkspaceOutcome, json: boolean): void {
  const label = `account ${o.accountId}`;
  if (!o.started) {
    const why = o.notStarted === 'mirror error' ? 'the mirror failed in an earlier workspace (see its error)' : 'the sync was interrupted before this workspace';
    if (!json) process.stdout.write(`${label}: not synced: ${why}\n`);
    return;
  }
  if (o.summary) {
    if (!json) printSummary(o.summary, false, label);
    reportFailures(o.summary, label);
  }
  if (o.error !== undefined) {
    const v = verdictOf(o.error);
    if (v.message !== undefined) fail(v.code, `${label}: ${withKeySource(v.message, o)}`);
  }
}

/**
 * An authentication message names CONVO_MIRROR_API_KEY; for a workspace whose key comes from a
 * workspaces file entry, it names that entry's variable instead.
 */
function withKeySource(message: string, o: WorkspaceOutcome): string {
  if (o.keyVariable === undefined || !/^authentication error:/.test(message)) return message;
  return message.replace(/CONVO_MIRROR_API_KEY/g, `${o.keyVariable} (this workspace's api_key_env)`).replace(/CONVO_MIRROR_ACCOUNT_ID/g, `the account_id of this workspace in CONVO_MIRROR_WORKSPACES`);
}

/** `sync` of several workspaces: each printed as it ends (JSON: one list at the end); the worst exit code. */
async function syncSeveral(opts: SyncCommandOptions, workspaces: readonly Workspace[]): Promise<number> {
  const json = opts.json === true;
  const outcomes = await syncWorkspaces({ ...opts, workspaces, onOutcome: (o) => printOutcome(o, json) });
  if (json) {
    const list = outcomes.map((o) => ({
      account_id: o.accountId,
      started: o.started,
      ...(o.notStarted ? { not_started: o.notStarted } : {}),
      exit_code: o.exit,
      summary: o.summary ?? null,
      error: o.error === undefined ? null : withKeySource(verdictOf(o.error).message ?? describeError(o.error), o),
    }));
    process.stdout.write(jsonForTerminal(list, 2) + '\n');
  }
  return worstExit(outcomes.map((o) => o.exit));
}

/** Exit code of a finished run: 0 succeeded, 130 interrupted, 1 otherwise. */
export function exitOfRun(s: RunSummary): number {
  return s.status === 'succeeded' ? EXIT.OK : s.status === 'interrupted' ? EXIT.INTERRUPTED : EXIT.FAILURES;
}

/** Adds `sync` to `program`. */
export function addSyncCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('sync')
    .description(
      'Incremental sync of every configured workspace (new messages only; --full re-reads every page), or only --conversation IDs; then publish exports',
    )
    .option('--conversation <id...>', 'only these conversations (repeatable)')
    .option('--account <id>', 'only this configured workspace (repeatable)', (v: string, prev: string[] = []) => [...prev, v])
    .option('--full', 'full refresh: re-read every page of every conversation (catches edits and deletions anywhere)')
    .option('--json', 'print the run summary as JSON (with several workspaces, a list of {account_id, exit_code, summary, error})');
  addConfigFlags(cmd, 'sync').action((o) =>
    settle(setExit, async () => {
      const config = loadConfig(process.env, configFlagsOf(o, 'sync'));
      const workspaces = selectWorkspaces(config.workspaces, o.account as string[] | undefined);
      const opts: SyncCommandOptions = { config, conversationIds: conversationIdsFrom(o.conversation), full: o.full, json: o.json };
      if (workspaces.length > 1 && opts.conversationIds !== undefined) {
        throw new ConfigError('--conversation', 'names conversations of one workspace, and several are configured: add --account <id>');
      }
      if (workspaces.length > 1) return syncSeveral(opts, workspaces);
      const s = await syncWithConfig({ ...opts, workspace: workspaces[0]! });
      printSummary(s, o.json === true);
      reportFailures(s);
      return exitOfRun(s);
    }),
  );
}
