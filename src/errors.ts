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
  constructor(variable: string, message: string) {
    super('CONFIG_ERROR', `${variable}: ${message}`, { context: { variable } });
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

  constructor(message: string, details: HttpErrorDetails, opts: { cause?: unknown; code?: string } = {}) {
    super(opts.code ?? 'HTTP_ERROR', message, {
      context: { method: details.method, path: details.path, status: details.status, attempts: details.attempts },
      cause: opts.cause,
      retryable: HttpError.isRetryableStatus(details.status),
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

/** A conversation asked for by id does not exist at the API (404) and was never mirrored. */
export class NotFoundError extends ConvoMirrorError {
  constructor(message: string, context: Record<string, unknown>) {
    super('NOT_FOUND', message, { context, retryable: false });
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
  constructor(message: string, context: Record<string, unknown>, cause?: unknown) {
    super('STORE_ERROR', message, { context, cause, retryable: false });
  }
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
