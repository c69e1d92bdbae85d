/**
 * Failures as a run records them (`run_failures`): plain records `{ id, code, status, attempts,
 * message }`, built from the error where it happened, so they can travel (e.g. in a job's data)
 * and be recorded by whichever step completes the run.
 */
import { HttpError, type ConvoMirrorError } from '../errors.js';
import type { RunFailureRecord } from '../store/mirror.js';
import type { ConversationFailure } from '../sync/workspace.js';

/**
 * A failure as `run_failures` stores it: the error's code (`ERROR` for an untyped one), and for an
 * HTTP failure its status and attempts.
 */
export function failureRecord(f: Pick<ConversationFailure, 'id' | 'error'>): RunFailureRecord {
  const err = f.error;
  return {
    id: f.id,
    code: (err as Partial<ConvoMirrorError>).code ?? 'ERROR',
    status: err instanceof HttpError ? (err.status ?? null) : null,
    attempts: err instanceof HttpError ? err.attempts : null,
    message: err.message,
  };
}

/**
 * The message a failed job leaves behind (BullMQ keeps only the message): `[CODE] message`, so the
 * code survives even where the record does not. See {@link parseFailureMessage}.
 */
export function failureMessage(code: string, message: string): string {
  return `[${code}] ${message}`;
}

/**
 * A failure known only by the message a job left (a job failed by an older version, which did not
 * keep the record): the code of a `[CODE] message` form, else `ERROR`; no status, no attempts.
 */
export function parseFailureMessage(id: string, reason: string): RunFailureRecord {
  const m = reason.match(/^\[([A-Z_]+)\] ([\s\S]*)$/);
  return { id, code: m?.[1] ?? 'ERROR', status: null, attempts: null, message: m?.[2] ?? reason };
}
