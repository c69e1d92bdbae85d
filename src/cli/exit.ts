/**
 * Exit codes of every command, and the mapping of an error to its code and one-line message.
 *
 * 0 all synced; 1 some conversations failed after retries (each named on stderr); 2 configuration,
 * authentication or mirror error (nothing retried; the message says what to fix); 130 interrupted.
 */
import { AuthError, ConfigError, RunError, StoreError, describeError } from '../errors.js';
import type { RunSummary } from '../run/index.js';
import { printSummary, reportFailures } from './summary.js';

/** Exit codes of every command. */
export const EXIT = { OK: 0, FAILURES: 1, CONFIG: 2, INTERRUPTED: 130 } as const;

/** Sets the process exit code of the command being run (the program's caller owns the process). */
export type SetExit = (code: number) => void;

/** Prints `convo-mirror: <message>` to stderr and returns `code`. */
export function fail(code: number, message: string): number {
  process.stderr.write(`convo-mirror: ${message}\n`);
  return code;
}

/**
 * Maps an error to its exit code and one-line message. A {@link RunError} prints the run's summary
 * and failures first, then is judged by its cause.
 */
export function exitFor(err: unknown): number {
  if (err instanceof RunError) {
    const s = err.summary as RunSummary;
    printSummary(s, false);
    reportFailures(s);
    // Already named among the failures (a conversation list that ran past its own total): once is enough.
    const fatal = err.cause instanceof ConfigError || err.cause instanceof AuthError || err.cause instanceof StoreError;
    if (!fatal && s.failures.some((f) => f.message === describeError(err.cause))) return EXIT.FAILURES;
    return exitFor(err.cause);
  }
  if (err instanceof ConfigError) return fail(EXIT.CONFIG, `configuration error: ${err.message}`);
  if (err instanceof AuthError) return fail(EXIT.CONFIG, `authentication error: ${err.message}`);
  if (err instanceof StoreError) return fail(EXIT.CONFIG, `mirror error: ${err.message}`);
  return fail(EXIT.FAILURES, `error: ${describeError(err)}`);
}

/** Runs a command's body, setting the exit code it returns or the one {@link exitFor} gives its error. */
export async function settle(setExit: SetExit, body: () => Promise<number> | number): Promise<void> {
  try {
    setExit(await body());
  } catch (err) {
    setExit(exitFor(err));
  }
}
