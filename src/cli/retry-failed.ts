/** `convo-mirror retry-failed`: re-queues every failed job the queue keeps (the dead letters). */
import type { Command } from 'commander';
import { loadConfig } from '../../config/index.js';
import { EXIT, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, queueSettings, requireBullmq } from './flags.js';
import { escapeForTerminal } from '../terminal.js';

/** Adds `retry-failed` to `program`. */
export function addRetryFailedCommand(program: Command, setExit: SetExit): void {
  const cmd = program.command('retry-failed').description('Re-queue every failed job kept by the queue (the dead letter list shown by status)');
  addConfigFlags(cmd, 'retry-failed').action((o) =>
    settle(setExit, async () => {
      const config = loadConfig(process.env, configFlagsOf(o, 'retry-failed'), { needsApi: false });
      requireBullmq(config, 'retry-failed');
      const { retryFailed } = await import('../../jobs/admin.js'); // the queue's libraries load only here
      const ids = await retryFailed(queueSettings(config));
      process.stdout.write(escapeForTerminal(`re-queued ${ids.length} failed job${ids.length === 1 ? '' : 's'}${ids.length ? `: ${ids.join(', ')}` : ''}`) + '\n');
      return EXIT.OK;
    }),
  );
}
