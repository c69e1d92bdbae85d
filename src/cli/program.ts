/** The commander program: one module per command, registered in the order help lists them. */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { EXIT, type SetExit } from './exit.js';
import { addSyncCommand } from './sync.js';
import { addCheckCommand } from './check.js';
import { addStatusCommand } from './status.js';
import { addConversationsCommand } from './conversations.js';
import { addVerifyCommand } from './verify.js';
import { addEraseCommand } from './erase.js';
import { addBackupCommand } from './backup.js';
import { addKeygenCommand } from './keygen.js';
import { addDaemonCommand } from './daemon.js';
import { addEnqueueCommand } from './enqueue.js';
import { addRetryFailedCommand } from './retry-failed.js';
import { addConfigCommand } from './config.js';
import { addFakeApiCommand } from './fake-api.js';
import { addDemoCommand } from './demo.js';
import { addDemoDaemonCommand } from './demo-daemon.js';

/** Every command, in help order. */
const COMMANDS: readonly ((program: Command, setExit: SetExit) => void)[] = [
  addCheckCommand,
  addSyncCommand,
  addStatusCommand,
  addConversationsCommand,
  addVerifyCommand,
  addEraseCommand,
  addBackupCommand,
  addKeygenCommand,
  addDaemonCommand,
  addEnqueueCommand,
  addRetryFailedCommand,
  addConfigCommand,
  addFakeApiCommand,
  addDemoCommand,
  addDemoDaemonCommand,
];

/** The version in convo-mirror's package.json, found upwards from this file (src/cli or dist/src/cli). */
export function packageVersion(): string {
  for (let dir = path.dirname(fileURLToPath(import.meta.url)); ; dir = path.dirname(dir)) {
    const file = path.join(dir, 'package.json');
    if (fs.existsSync(file)) {
      const pkg = JSON.parse(fs.readFileSync(file, 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'convo-mirror' && pkg.version) return pkg.version;
    }
    if (path.dirname(dir) === dir) return 'unknown';
  }
}

/**
 * Builds the commander program. A command's action reports its exit code through `setExit`;
 * commander's own usage errors (unknown option, missing argument) are thrown with `exitCode` 2.
 */
export function buildProgram(setExit: SetExit): Command {
  const program = new Command('convo-mirror')
    .description('Mirror a customer-support system\'s conversation history into SQLite and JSONL change exports.')
    .version(packageVersion(), '-V, --version', 'print the version')
    // A usage error is three lines at most: the error, commander's nearest match, this pointer.
    .showHelpAfterError('(convo-mirror --help lists the commands; convo-mirror <command> --help their options)')
    .exitOverride((err) => {
      // commander's own usage errors (unknown option, missing argument): exit 2 like config errors.
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.exitCode === 0) throw err;
      throw Object.assign(err, { exitCode: EXIT.CONFIG });
    });
  for (const add of COMMANDS) add(program, setExit);
  return program;
}
