/**
 * `convo-mirror daemon`: job schedulers, a worker for scheduled and on-demand jobs (jobs/), until
 * SIGTERM/SIGINT, then a graceful shutdown.
 */
import type { Command } from 'commander';
import { loadConfig } from '../../config/index.js';
import { ConfigError } from '../errors.js';
import { runDaemon } from '../../jobs/daemon.js';
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
    .description('Run the sync daemon: job schedulers (regular and full), a worker for on-demand and scheduled jobs, graceful shutdown on SIGTERM/SIGINT');
  addConfigFlags(cmd, 'daemon').action((o) =>
    settle(setExit, async () => {
      const config = loadConfig(process.env, configFlagsOf(o, 'daemon'));
      if (config.workspaces.length > 1) {
        // Never mirror some of the configured workspaces silently.
        throw new ConfigError(
          config.workspacesFile !== undefined ? 'CONVO_MIRROR_WORKSPACES' : 'CONVO_MIRROR_ACCOUNT_ID',
          `names ${config.workspaces.length} workspaces, but the daemon mirrors one workspace for now: run one daemon per workspace (each with its own --account-id, which wins over CONVO_MIRROR_WORKSPACES in the environment, its own CONVO_MIRROR_DB and CONVO_MIRROR_QUEUE_PREFIX), or use convo-mirror sync, which mirrors them all`,
        );
      }
      const logger = createLogger({ level: config.logLevel, pretty: isTTY() });
      const { stop, signal } = stopOnSignals();
      const exit = await runDaemon({ config, logger, stop });
      logger.info({ signal: signal(), shutdown_ms: exit.shutdownMs, forced: exit.forced }, 'exiting');
      return exit.fatal ? exitFor(exit.fatal) : EXIT.OK;
    }),
  );
}
