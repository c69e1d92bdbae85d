/** The commander program: one module per command, registered in the order help lists them. */
import { Command } from 'commander';
import { EXIT, type SetExit } from './exit.js';
import { addSyncCommand } from './sync.js';
import { addStatusCommand } from './status.js';
import { addVerifyCommand } from './verify.js';
import { addKeygenCommand } from './keygen.js';
import { addDaemonCommand } from './daemon.js';
import { addEnqueueCommand } from './enqueue.js';
import { addRetryFailedCommand } from './retry-failed.js';
import { addFakeApiCommand } from './fake-api.js';
import { addDemoCommand } from './demo.js';
import { addDemoDaemonCommand } from './demo-daemon.js';

/** Every command, in help order. */
const COMMANDS: readonly ((program: Command, setExit: SetExit) => void)[] = [
  addSyncCommand,
  addStatusCommand,
  addVerifyCommand,
  addKeygenCommand,
  addDaemonCommand,
  addEnqueueCommand,
  addRetryFailedCommand,
  addFakeApiCommand,
  addDemoCommand,
  addDemoDaemonCommand,
];

/**
 * Builds the commander program. A command's action reports its exit code through `setExit`;
 * commander's own usage errors (unknown option, missing argument) are thrown with `exitCode` 2.
 */
export function buildProgram(setExit: SetExit): Command {
  const program = new Command('convo-mirror')
    .description('Mirror a customer-support system\'s conversation history into SQLite and JSONL change exports.')
    .showHelpAfterError()
    .exitOverride((err) => {
      // commander's own usage errors (unknown option, missing argument): exit 2 like config errors.
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.exitCode === 0) throw err;
      throw Object.assign(err, { exitCode: EXIT.CONFIG });
    });
  for (const add of COMMANDS) add(program, setExit);
  return program;
}
