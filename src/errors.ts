/**
 * The typed error hierarchy of convo-mirror (design habit 4).
 *
 * Every error carries a stable `code`, a `context` object safe to log (paths and ids, never headers
 * or the API key) and, where there was one, the underlying `cause`. The class decides retry:
 * {@link ConvoMirrorError.retryable} is true only for transient failures.
 */
export class ConvoMirrorError extends Error {
  /** Stable machine-readable code, e.g. `HTTP_ERROR`, `AUTH_ERROR`, `SCHEMA_ERROR`. */
  readonly code: string;
  /** Loggable context: method, path, status, conversation id, field... Never secrets. */
  readonly context: Record<string, unknown>;
  /** Whether a retry of the same operation may succeed. */
  readonly retryable: boolean;

  constructor(
    code: string,
    message: string,
    opts: { context?: Record<string, unknown>; cause?: unknown; retryable?: boolean } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = code;
    this.context = opts.context ?? {};
    this.retryable = opts.retryable ?? false;
  }
}

/** A configuration value is missing or malformed. Exit code 2. */
export class ConfigError extends ConvoMirrorError {
  /** The environment variable (or flag) at fault, e.g. `CONVO_MIRROR_BASE_URL`. */
  readonly variable: string;
  /**
   * @param variable - the environment variable (or flag) at fault
   * @param message - what is wrong with it and how to fix it; never the value of a secret
   * @param cause - the error that revealed it, e.g. the {@link NotFoundError} of the conversation list
   */
  constructor(variable: string, message: string, cause?: unknown) {
    super('CONFIG_ERROR', `${variable}: ${message}`, { context: { variable }, cause });
    this.variable = variable;
  }
}

/** Shape of an HTTP failure: what was asked, what came back, how many tries it took. */
export interface HttpErrorDetails {
  method: string;
  /** Request path with query string, relative to the base URL (never includes headers or the key). */
  path: string;
  /** HTTP status, or `undefined` for a network error or timeout. */
  status?: number;
  /** Attempts made, including the first. */
  attempts: number;
  /** Server-supplied delay in ms (from `Retry-After`), when present. */
  retryAfterMs?: number;
}

/**
 * An HTTP request failed: a non-2xx status, a network error or a timeout.
 * Retryable for network errors, timeouts, 408, 429 and 5xx; never for other 4xx or redirects.
 */
export class HttpError extends ConvoMirrorError {
  readonly method: string;
  readonly path: string;
  readonly status: number | undefined;
  attempts: number;
  readonly retryAfterMs: number | undefined;

  /**
   * @param opts - `code` (default `HTTP_ERROR`), `retryable` (default from the status, see
   *   {@link HttpError.isRetryableStatus}), `cause`, and `context`: loggable fields added to
   *   method, path, status and attempts (e.g. `conversation_id`)
   */
  constructor(
    message: string,
    details: HttpErrorDetails,
    opts: { cause?: unknown; code?: string; retryable?: boolean; context?: Record<string, unknown> } = {},
  ) {
    super(opts.code ?? 'HTTP_ERROR', message, {
      context: { ...opts.context, method: details.method, path: details.path, status: details.status, attempts: details.attempts },
      cause: opts.cause,
      retryable: opts.retryable ?? HttpError.isRetryableStatus(details.status),
    });
    this.method = details.method;
    this.path = details.path;
    this.status = details.status;
    this.attempts = details.attempts;
    this.retryAfterMs = details.retryAfterMs;
  }

  /** Network errors and timeouts (`undefined`), 408, 429 and 5xx are transient. */
  static isRetryableStatus(status: number | undefined): boolean {
    return status === undefined || status === 408 || status === 429 || (status >= 500 && status <= 599);
  }
}

/**
 * The API refused our credentials: 401 (bad or missing `X-Api-Key`) or 403 (the key may not use the
 * `X-Account-Id` workspace). Never retried; the CLI exits 2.
 */
export class AuthError extends HttpError {
  constructor(details: HttpErrorDetails) {
    const hint =
      details.status === 403
        ? 'the API key is not allowed to read this workspace: check CONVO_MIRROR_ACCOUNT_ID (X-Account-Id) and the key'
        : 'the API rejected the API key: check CONVO_MIRROR_API_KEY (X-Api-Key)';
    // 401/403 are not retryable statuses, so `retryable` is false.
    super(`${details.method} ${details.path} answered ${details.status}: ${hint}`, details, { code: 'AUTH_ERROR' });
  }
}

/** A response that is not JSON or does not match the documented shape (spec 2.1-2.3). Not retried. */
export class SchemaError extends ConvoMirrorError {
  constructor(message: string, context: Record<string, unknown>, cause?: unknown) {
    super('SCHEMA_ERROR', message, { context, cause, retryable: false });
  }
}

/**
 * The API answered 404 (code `NOT_FOUND`, not retried). Thrown by the client for any 404 of a
 * request it sends; the sync re-throws it for a conversation never mirrored, with a message naming
 * the conversation and saying nothing was mirrored. (A 404 of the conversation list is a wrong base
 * URL: the client turns it into a {@link ConfigError}.)
 */
export class NotFoundError extends HttpError {
  /**
   * @param message - what was not found
   * @param details - the request (method, path, attempts); `status` is always 404
   * @param opts - `code` (default `NOT_FOUND`), `retryable` (default false), extra `context`, `cause`
   */
  constructor(
    message: string,
    details: HttpErrorDetails,
    opts: { code?: string; retryable?: boolean; context?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(message, { ...details, status: 404 }, { code: opts.code ?? 'NOT_FOUND', retryable: opts.retryable ?? false, context: opts.context, cause: opts.cause });
  }
}

/**
 * A conversation that the listing still shows (or the mirror holds) answered 404 on its messages
 * (code `LISTED_BUT_NOT_FOUND`). The two answers contradict each other, so this is a failure of that
 * conversation, never a deletion: nothing of it is tombstoned, and the next run (or job attempt)
 * asks again. Retryable. Carries the request of the client's {@link NotFoundError} (its `cause`).
 */
export class ListedButNotFoundError extends NotFoundError {
  /**
   * @param notFound - the client's error for the 404 (its method, path and attempts are kept)
   * @param why - why the 404 is not taken as a deletion, e.g. `the conversation list shows it`
   */
  constructor(conversationId: string, notFound: NotFoundError, why = 'the conversation list shows it') {
    super(
      `conversation ${conversationId}: GET ${notFound.path} answered 404 although ${why}; ` +
        'treated as a failure, not a deletion (nothing was tombstoned); the next run asks again',
      notFound,
      { code: 'LISTED_BUT_NOT_FOUND', retryable: true, context: { conversation_id: conversationId }, cause: notFound },
    );
  }
}

/**
 * The API answered 429 (code `HTTP_ERROR`, like any other status; retryable). The client waits
 * `Retry-After` (capped) before the next attempt and slows its request rate.
 */
export class RateLimitedError extends HttpError {
  constructor(message: string, details: HttpErrorDetails) {
    super(message, { ...details, status: 429 }, { retryable: true });
  }
}

/**
 * The API answered a 3xx (code `HTTP_ERROR`, not retried). Redirects are never followed: the API
 * key must not leave the configured origin.
 */
export class RedirectRefusedError extends HttpError {
  constructor(message: string, details: HttpErrorDetails) {
    super(message, details, { retryable: false });
  }
}

/**
 * A response body larger than the configured cap (`CONVO_MIRROR_MAX_RESPONSE_BYTES`); the read was
 * aborted as soon as the cap was crossed. Not retried: the same request would return the same body.
 */
export class ResponseTooLargeError extends HttpError {
  /** The cap that was crossed, bytes. */
  readonly limitBytes: number;
  constructor(message: string, details: HttpErrorDetails & { limitBytes: number }) {
    super(message, details, { code: 'RESPONSE_TOO_LARGE', retryable: false });
    this.limitBytes = details.limitBytes;
  }
}

/**
 * The API kept serving pages beyond what its own first `meta.total_count` / `meta.total_pages`
 * allowed for (plus slack), so the crawl or listing pass was stopped. Not retried.
 */
export class PageRunawayError extends ConvoMirrorError {
  constructor(message: string, context: Record<string, unknown>) {
    super('PAGE_RUNAWAY', message, { context, retryable: false });
  }
}

/** The listing or a conversation's pages kept shifting beyond the bounded number of restarts. */
export class DriftError extends ConvoMirrorError {
  constructor(message: string, context: Record<string, unknown>) {
    super('DRIFT_ERROR', message, { context, retryable: true });
  }
}

/** A failure in the local SQLite mirror (open, migrate, write). */
export class StoreError extends ConvoMirrorError {
  constructor(message: string, context: Record<string, unknown>, cause?: unknown, code = 'STORE_ERROR') {
    super(code, message, { context, cause, retryable: false });
  }
}

/**
 * The SQLite mirror is damaged (`SQLITE_CORRUPT`, `SQLITE_NOTADB`) or cannot be written at all
 * (disk full, I/O error, read-only file). Every later write would fail the same way, so the whole
 * run stops (exit 2) instead of failing conversation after conversation.
 */
export class MirrorUnusableError extends StoreError {
  /** SQLite's error code, e.g. `SQLITE_CORRUPT`, `SQLITE_NOTADB`, `SQLITE_FULL`. */
  readonly sqliteCode: string;
  constructor(file: string, sqliteCode: string, cause?: unknown) {
    const damaged = isCorruptionCode(sqliteCode);
    const message = damaged
      ? `the mirror ${file} is damaged (${sqliteCode}: ${describeError(cause)}); nothing more was written. ` +
        'Recover by restoring a backup of it, or rebuild it: point CONVO_MIRROR_DB at a new file (and CONVO_MIRROR_EXPORT_DIR at a new directory) and run convo-mirror sync --full'
      : `the mirror ${file} cannot be written (${sqliteCode}: ${describeError(cause)}); ` +
        (sqliteCode === 'SQLITE_FULL' ? 'the disk is full: free space, then run convo-mirror sync again (it resumes)' : 'check the disk and the file, then run convo-mirror sync again (it resumes)');
    super(message, { file, sqlite_code: sqliteCode }, cause, damaged ? 'MIRROR_CORRUPT' : 'MIRROR_UNWRITABLE');
    this.sqliteCode = sqliteCode;
  }
}

/** SQLite result codes that mean the database file itself is damaged. */
export function isCorruptionCode(code: string | undefined): boolean {
  return code !== undefined && (code === 'SQLITE_NOTADB' || code.startsWith('SQLITE_CORRUPT'));
}

/**
 * SQLite result codes after which no write to the mirror can succeed: corruption, a full disk,
 * I/O errors, a read-only or unopenable file.
 */
export function isUnusableMirrorCode(code: string | undefined): boolean {
  if (code === undefined) return false;
  return (
    isCorruptionCode(code) ||
    code === 'SQLITE_FULL' ||
    code.startsWith('SQLITE_IOERR') ||
    code.startsWith('SQLITE_READONLY') ||
    code.startsWith('SQLITE_CANTOPEN')
  );
}

/**
 * Turns a better-sqlite3 error whose code makes the mirror unusable into a
 * {@link MirrorUnusableError} naming `file`; returns anything else unchanged.
 */
export function asMirrorError(err: unknown, file: string): unknown {
  if (err instanceof MirrorUnusableError) return err;
  const code = (err as { code?: unknown } | null)?.code;
  if (err instanceof Error && err.name === 'SqliteError' && typeof code === 'string' && isUnusableMirrorCode(code)) {
    return new MirrorUnusableError(file, code, err);
  }
  return err;
}

/** A failure publishing export files. */
export class ExportError extends ConvoMirrorError {
  constructor(message: string, context: Record<string, unknown>, cause?: unknown) {
    super('EXPORT_ERROR', message, { context, cause, retryable: false });
  }
}

/**
 * A recorded run ended on a fatal error (bad credentials, wrong base URL, export failure). Carries
 * the run's summary so callers can still report what was done; `cause` is the fatal error, whose
 * class decides the exit code or whether a job is retried.
 */
export class RunError<S = unknown> extends ConvoMirrorError {
  readonly summary: S;
  constructor(summary: S, cause: unknown) {
    const c = cause as Partial<ConvoMirrorError>;
    super(c.code ?? 'RUN_FAILED', describeError(cause), { cause, context: c.context ?? {}, retryable: c.retryable ?? false });
    this.summary = summary;
  }
}

/** One-line description of any thrown value, safe for logs. */
export function describeError(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}
