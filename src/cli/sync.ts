/**
 * `convo-mirror sync`: one recorded run in this process (src/run/), with a progress bar on a
 * terminal, the summary on stdout and each failure on stderr.
 */
import type { Command } from 'commander';
import type { Logger } from 'pino';
import { loadConfig, type Config } from '../../config/index.js';
import { apiClientFromConfig } from '../api/client.js';
import { Mirror, DEFAULT_ACCOUNT } from '../store/mirror.js';
import { runSync, sweepInterruptedRuns, type RunSummary } from '../run/index.js';
import { newProgress } from '../sync/types.js';
import { createLogger } from '../logger.js';
import { startProgress } from '../progress.js';
import { systemClock } from '../clock.js';
import { assertSafeExportDir } from '../export/exporter.js';
import { fileModes } from '../private-fs.js';
import { EXIT, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, conversationIdsFrom } from './flags.js';
import { isTTY, printSummary, reportFailures } from './summary.js';

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

/** Opens the mirror for writing and marks the runs a dead process left `running` as interrupted. */
function openWriter(config: Config, logger: Logger): Mirror {
  const mirror = Mirror.open(config.db, { modes: fileModes(config.groupReadable) });
  // We hold the writer lock: runs still 'running' belong to a process that died.
  try {
    sweepInterruptedRuns(mirror, logger);
  } catch (err) {
    mirror.close();
    throw err;
  }
  return mirror;
}

/**
 * Runs `sync` with a built config: one recorded run (trigger `cli`), exports published.
 *
 * @returns the run's summary (the caller derives the exit code)
 * @throws the {@link RunError} of a run that could not go on, {@link ConfigError} before any request
 */
export async function syncWithConfig(opts: SyncCommandOptions): Promise<RunSummary> {
  const { config } = opts;
  const tty = isTTY() && !opts.json;
  // On a terminal the bar and the summary tell the story: info lines would break the bar.
  const level = tty && config.logLevel === 'info' ? 'warn' : config.logLevel;
  const logger = opts.logger ?? createLogger({ level, pretty: tty });
  // Before any request or file: an export directory that would hold the mirror (or is /, or a file).
  assertSafeExportDir(config.exportDir, config.db);
  const signals = abortOnSignals(logger);
  let mirror: Mirror;
  try {
    mirror = openWriter(config, logger);
  } catch (err) {
    signals.off();
    throw err;
  }
  const api = apiClientFromConfig(config, { logger, signal: signals.signal });
  const progress = newProgress();
  const stop = startProgress({ progress, stats: api.stats, logger, tty });
  try {
    return await runSync(
      { api, mirror, logger, clock: systemClock },
      {
        accountId: config.accountId ?? DEFAULT_ACCOUNT,
        concurrency: config.concurrency,
        conversationIds: opts.conversationIds,
        full: opts.full ?? false,
        changeFieldSetting: config.changeField,
        exportDir: config.exportDir,
        modes: fileModes(config.groupReadable),
        progress,
        signal: signals.signal,
      },
    );
  } finally {
    stop();
    signals.off();
    await api.close();
    mirror.close();
  }
}

/** Exit code of a finished run: 0 succeeded, 130 interrupted, 1 otherwise. */
export function exitOfRun(s: RunSummary): number {
  return s.status === 'succeeded' ? EXIT.OK : s.status === 'interrupted' ? EXIT.INTERRUPTED : EXIT.FAILURES;
}

/** Adds `sync` to `program`. */
export function addSyncCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('sync')
    .description('Incremental sync of the whole workspace (new messages only; --full re-reads every page), or only --conversation IDs; then publish exports')
    .option('--conversation <id...>', 'only these conversations (repeatable)')
    .option('--full', 'full refresh: re-read every page of every conversation (catches edits and deletions anywhere)')
    .option('--json', 'print the run summary as JSON');
  addConfigFlags(cmd, 'sync').action((o) =>
    settle(setExit, async () => {
      const config = loadConfig(process.env, configFlagsOf(o, 'sync'));
      const s = await syncWithConfig({ config, conversationIds: conversationIdsFrom(o.conversation), full: o.full, json: o.json });
      printSummary(s, o.json === true);
      reportFailures(s);
      return exitOfRun(s);
    }),
  );
}
