#!/usr/bin/env -S node --optimize-for-size
/**
 * convo-mirror command line (commander): a thin shell over src/, one module per command in this
 * directory (program.ts lists them; flags.ts generates the configuration flags from config/).
 *
 * Exit codes ({@link EXIT}): 0 all synced; 1 some conversations failed after retries (each named on
 * stderr); 2 configuration, authentication or mirror error (nothing retried; the message says what
 * to fix); 130 interrupted.
 */
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describeError } from '../errors.js';
import { EXIT } from './exit.js';
import { buildProgram } from './program.js';

export { EXIT, exitFor, type SetExit } from './exit.js';
export { buildProgram } from './program.js';
export { conversationIdsFrom } from './flags.js';
export { DEMO_ACCOUNT_ID } from './demo.js';
export { readMirrorResult, statusOf, verifyOf, type SnapshotHooks, type StatusResult, type VerifyResult } from './read-only.js';

/** Entry point: parses argv (node, script, command, ...), runs the command, resolves its exit code. */
export async function main(argv: string[]): Promise<number> {
  let code: number = EXIT.OK;
  const program = buildProgram((c) => {
    code = c;
  });
  try {
    await program.parseAsync(argv);
  } catch (err) {
    const e = err as { exitCode?: number };
    return e.exitCode ?? EXIT.FAILURES;
  }
  return code;
}

const invokedDirectly = process.argv[1] !== undefined && fs.realpathSync(process.argv[1]) === fs.realpathSync(fileURLToPath(import.meta.url));
if (invokedDirectly) {
  main(process.argv).then(
    (code) => {
      process.exitCode = code;
    },
    (err) => {
      process.stderr.write(`convo-mirror: ${describeError(err)}\n`);
      process.exitCode = EXIT.FAILURES;
    },
  );
}
