/**
 * `convo-mirror daemon`: the schedules of every configured workspace (or those `--account` names)
 * and a worker for scheduled, on-demand and webhook jobs (jobs/), until SIGTERM/SIGINT, then a
 * graceful shutdown.
 */
import type { Command } from 'commander';
import { loadConfig, type Config } from '../../config/index.js';
import { envFileNames } from '../../config/env-file.js';
import { ignoredSettings, ignoredWarning } from '../../config/ignored.js';
import { selectWorkspaces } from './sync.js';
import { createLogger } from '../logger.js';
import { EXIT, exitFor, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { isTTY } from './summary.js';

/** Resolves on the first SIGTERM or SIGINT; `signal()` tells which. */
function stopOnSignals(): { stop: Promise<void>; signal: () => NodeJS.Signals | undefined } {
  let stopSignal: NodeJS.Signals | undefined;
  const stop = new Promise<void>((resolve) => {
    const onSignal = (sig: NodeJS.Signals) => {
      stopSignal = sig;
      resolve();
    };
    process.once('SIGTERM', onSignal);
    process.once('SIGINT', onSignal);
  });
  return { stop, signal: () => stopSignal };
}

/** Adds `daemon` to `program`. */
export function addDaemonCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('daemon')
    .description(
      'Run the sync daemon: schedules (regular and full) for every configured workspace, a worker for scheduled, on-demand and webhook jobs, an HTTP server (health, metrics, webhooks, dashboard), graceful shutdown on SIGTERM/SIGINT',
    );
  cmd.option('--account <id>', 'only this configured workspace (repeatable); daemons sharing one Redis each own some workspaces, with their own mirror and queue prefix', (v: string, prev: string[] = []) => [...prev, v]);
  addConfigFlags(cmd, 'daemon').action((o) =>
    settle(setExit, async () => {
      const flags = configFlagsOf(o, 'daemon');
      const loaded = loadConfig(process.env, flags);
      const config: Config = Object.freeze({ ...loaded, workspaces: selectWorkspaces(loaded.workspaces, o.account as string[] | undefined) });
      const logger = createLogger({ level: config.logLevel, pretty: isTTY() });
      // Once, at start: a setting given but ignored here (the admin password with the local scheduler...).
      for (const s of ignoredSettings(process.env, flags, envFileNames())) logger.warn({ setting: s.name }, ignoredWarning(s));
      const { stop, signal } = stopOnSignals();
      const { runDaemon } = await import('../../jobs/daemon.js');
      const exit = await runDaemon({ config, logger, stop });
      logger.info({ signal: signal(), shutdown_ms: exit.shutdownMs, forced: exit.forced }, 'exiting');
      return exit.fatal ? exitFor(exit.fatal) : EXIT.OK;
    }),
  );
}
