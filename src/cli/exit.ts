/**
 * Exit codes of every command, and the mapping of an error to its code and one-line message.
 *
 * 0 all synced; 1 some conversations failed after retries (each named on stderr); 2 configuration,
 * authentication or mirror error (nothing retried; the message says what to fix); 130 interrupted.
 * A command that syncs several workspaces exits with the worst of theirs ({@link worstExit}).
 */
import { AuthError, ConfigError, RunError, StoreError, describeError } from '../errors.js';
import type { RunSummary } from '../run/index.js';
import { printSummary, reportFailures } from './summary.js';
import { escapeForTerminal } from '../terminal.js';

/**
 * Exit codes of every command, one meaning each:
 * - 0 `OK`: done, nothing failed;
 * - 1 `FAILURES`: finished, but something failed (conversations after retries, a check, a job);
 * - 2 `CONFIG`: configuration or usage: a setting, flag, path, key or account to fix; nothing was retried;
 * - 3 `UNFINISHED`: gave up waiting on something outside (no worker on the queue, a `--timeout`):
 *   what was asked may still happen later;
 * - 130 `INTERRUPTED`: stopped by SIGINT or SIGTERM.
 */
export const EXIT = { OK: 0, FAILURES: 1, CONFIG: 2, UNFINISHED: 3, INTERRUPTED: 130 } as const;

/** Sets the process exit code of the command being run (the program's caller owns the process). */
export type SetExit = (code: number) => void;

/**
 * Prints `convo-mirror: <message>` to stderr, escaped for the terminal (a message may quote an id
 * or an error from the API or Redis), and returns `code`.
 */
export function fail(code: number, message: string): number {
  process.stderr.write(`convo-mirror: ${escapeForTerminal(message)}\n`);
  return code;
}

/** An error's exit code and its one-line message (without `convo-mirror: `). */
export interface ErrorVerdict {
  code: number;
  /** Undefined when a run's error is already named among its failures (printed once is enough). */
  message: string | undefined;
}

/** The exit code and message of an error, printing nothing (see {@link exitFor}). */
export function verdictOf(err: unknown): ErrorVerdict {
  if (err instanceof RunError) {
    const s = err.summary as RunSummary;
    // Already named among the failures (a conversation list that ran past its own total): once is enough.
    const fatal = err.cause instanceof ConfigError || err.cause instanceof AuthError || err.cause instanceof StoreError;
    if (!fatal && s.failures.some((f) => f.message === describeError(err.cause))) return { code: EXIT.FAILURES, message: undefined };
    return verdictOf(err.cause);
  }
  if (err instanceof ConfigError) return { code: EXIT.CONFIG, message: `configuration error: ${err.message}` };
  if (err instanceof AuthError) return { code: EXIT.CONFIG, message: `authentication error: ${err.message}` };
  if (err instanceof StoreError) return { code: EXIT.CONFIG, message: `mirror error: ${err.message}` };
  return { code: EXIT.FAILURES, message: `error: ${describeError(err)}` };
}

/**
 * A run stopped by a configuration or key error before it mirrored anything (nothing listening, a
 * refused key): its summary would be all zeros, so the one line naming the setting is enough (the
 * run stays recorded in the mirror).
 */
function stoppedAtFirstContact(err: RunError): boolean {
  const s = err.summary as RunSummary;
  const fatal = err.cause instanceof ConfigError || err.cause instanceof AuthError;
  return fatal && s.messages.served === 0 && s.conversations.synced === 0 && s.conversations.listed === 0;
}

/**
 * Maps an error to its exit code and one-line message. A {@link RunError} prints the run's summary
 * and failures first, then is judged by its cause.
 *
 * @param label - with several workspaces, `account <id>`: prefixes the summary, failures and message
 */
export function exitFor(err: unknown, label?: string): number {
  if (err instanceof RunError && !stoppedAtFirstContact(err)) {
    const s = err.summary as RunSummary;
    printSummary(s, false, label);
    reportFailures(s, label);
  }
  const v = verdictOf(err);
  if (v.message !== undefined) fail(v.code, label === undefined ? v.message : `${label}: ${v.message}`);
  return v.code;
}

/**
 * Exit codes from worst to best, for several workspaces synced by one command: a configuration,
 * authentication or mirror error (2) needs fixing before anything else; failed conversations (1)
 * need a re-run; an interruption (130) was asked for; 0 is all synced.
 */
export const EXIT_ORDER: readonly number[] = [EXIT.CONFIG, EXIT.FAILURES, EXIT.UNFINISHED, EXIT.INTERRUPTED, EXIT.OK];

/** The worst of `codes` by {@link EXIT_ORDER} (an unknown code counts as 1); 0 for none. */
export function worstExit(codes: readonly number[]): number {
  const rank = (c: number) => {
    const i = EXIT_ORDER.indexOf(c);
    return i < 0 ? EXIT_ORDER.indexOf(EXIT.FAILURES) : i;
  };
  return codes.reduce((worst, c) => (rank(c) < rank(worst) ? c : worst), EXIT.OK as number);
}

/** Runs a command's body, setting the exit code it returns or the one {@link exitFor} gives its error. */
export async function settle(setExit: SetExit, body: () => Promise<number> | number): Promise<void> {
  try {
    setExit(await body());
  } catch (err) {
    setExit(exitFor(err));
  }
}
