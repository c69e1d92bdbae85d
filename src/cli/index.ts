#!/usr/bin/env -S node --optimize-for-size
/**
 * convo-mirror command line (commander): a thin shell over src/, one module per command in this
 * directory (program.ts lists them; flags.ts generates the configuration flags from config/).
 *
 * Settings come from flags, else the environment, else `./.env`, else their defaults.
 *
 * Exit codes ({@link EXIT}): 0 all synced; 1 some conversations failed after retries (each named on
 * stderr); 2 configuration, authentication or mirror error (nothing retried; the message says what
 * to fix); 130 interrupted.
 */
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { CONFIG_FIELDS, knownVariables, workspaceKeyVariables } from '../../config/index.js';
import { envFileNames, envFileWarnings, loadEnvFile, unknownVariableWarnings } from '../../config/env-file.js';
import { describeError } from '../errors.js';
import { escapeForTerminal } from '../terminal.js';
import { EXIT, exitFor } from './exit.js';
import { buildProgram } from './program.js';

export { EXIT, exitFor, type SetExit } from './exit.js';
export { buildProgram } from './program.js';
export { conversationIdsFrom } from './flags.js';
export { DEMO_ACCOUNT_ID } from './demo.js';
export { readMirrorResult, statusOf, verifyOf, type SnapshotHooks, type StatusResult, type VerifyResult } from './read-only.js';

/**
 * The `api_key_env` variables of the workspaces file given by `--workspaces` in `argv`, else by
 * `CONVO_MIRROR_WORKSPACES`; empty when there is none or it cannot be read (the command that needs
 * it says so).
 */
function keyVariablesOf(argv: readonly string[], env: NodeJS.ProcessEnv): string[] {
  const flag = CONFIG_FIELDS.workspacesFile.flag.split(' ')[0]!;
  const i = argv.indexOf(flag);
  const inline = argv.find((a) => a.startsWith(`${flag}=`));
  const file = i >= 0 ? argv[i + 1] : inline !== undefined ? inline.slice(flag.length + 1) : env[CONFIG_FIELDS.workspacesFile.env];
  if (file === undefined || file.trim() === '') return [];
  try {
    return workspaceKeyVariables(file.trim(), flag);
  } catch {
    return [];
  }
}

/**
 * Before any command: fills `process.env` from `./.env` (the environment wins), then warns once,
 * one line each, about `CONVO_MIRROR_*` variables nothing reads, naming the nearest known one, and
 * about values of `.env` an unquoted `#` cut (config/env-file.ts `envFileWarnings`).
 *
 * @returns undefined to go on; {@link EXIT.CONFIG} when `.env` exists but cannot be used (the
 *   one-line error naming it is printed)
 */
export function prepareEnvironment(argv: readonly string[]): number | undefined {
  try {
    loadEnvFile(process.cwd(), process.env);
  } catch (err) {
    return exitFor(err);
  }
  const keyVariables = keyVariablesOf(argv, process.env);
  const known = knownVariables(keyVariables);
  const secrets = new Set([...Object.values(CONFIG_FIELDS).flatMap((d) => (d.secret === true ? [d.env] : [])), ...keyVariables]);
  const warnings = [...unknownVariableWarnings(process.env, known, envFileNames()), ...envFileWarnings(secrets)];
  for (const line of warnings) process.stderr.write(`convo-mirror: warning: ${line}\n`);
  return undefined;
}

/**
 * Entry point: loads `.env` ({@link prepareEnvironment}), parses argv (node, script, command, ...),
 * runs the command, resolves its exit code.
 */
export async function main(argv: string[]): Promise<number> {
  const early = prepareEnvironment(argv);
  if (early !== undefined) return early;
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
      process.stderr.write(`convo-mirror: ${escapeForTerminal(describeError(err))}\n`);
      process.exitCode = EXIT.FAILURES;
    },
  );
}
