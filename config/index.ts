/**
 * convo-mirror configuration: parsed once with zod from the environment, overridable by command-line
 * flags, frozen, and passed down. This is the only module that reads `process.env` (design: config/).
 *
 * A missing or malformed value throws {@link ConfigError} naming the variable; the CLI turns that
 * into a one-line message and exit code 2.
 */
import { z } from 'zod';
import { CronExpressionParser } from 'cron-parser';
import { ConfigError } from '../src/errors.js';

/** Log levels accepted by `LOG_LEVEL` / `--log-level` (pino's). */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The frozen configuration handed to every command. */
export interface Config {
  /** The spec's `{base_url}`; `/v1/...` paths are appended. No trailing slash. Undefined only for commands that make no API call. */
  readonly baseUrl: string | undefined;
  /** Sent as `X-Api-Key` (spec 5). Never logged. Undefined only for commands that make no API call. */
  readonly apiKey: string | undefined;
  /** Workspace UUID sent as `X-Account-Id` (spec 5, multi-workspace context); undefined when not configured. */
  readonly accountId: string | undefined;
  /** Path of the SQLite mirror. @defaultValue `data/mirror.sqlite` */
  readonly db: string;
  /** Root directory of the JSONL change exports. @defaultValue `data/exports` */
  readonly exportDir: string;
  /** Conversations crawled in parallel. @defaultValue 4 */
  readonly concurrency: number;
  /** Cap on requests per second across the whole process; 0 = no cap. @defaultValue 10 */
  readonly maxRps: number;
  /** Per-request timeout in ms (headers and body). @defaultValue 30000 */
  readonly requestTimeoutMs: number;
  /** Retries per request after the first attempt, for transient failures. @defaultValue 6 */
  readonly maxRetries: number;
  /** pino log level. @defaultValue `info` */
  readonly logLevel: LogLevel;
  /** Redis for the daemon's queue (`redis://` or `rediss://`). @defaultValue `redis://127.0.0.1:6379` */
  readonly redisUrl: string;
  /** Cron of the regular workspace sync. @defaultValue `*\/15 * * * *` */
  readonly schedule: string;
  /** Cron of the full refresh (every page of every conversation). @defaultValue `0 3 * * *` */
  readonly fullSchedule: string;
  /** IANA time zone of both crons. @defaultValue `UTC` */
  readonly tz: string;
  /** How long the daemon lets running jobs finish after SIGTERM/SIGINT, ms. @defaultValue 30000 */
  readonly shutdownTimeoutMs: number;
  /** Prefix of the BullMQ keys in Redis (one prefix per mirror). @defaultValue `convo-mirror` */
  readonly queuePrefix: string;
  /** Attempts of a job before it is kept as failed (dead letter). @defaultValue 5 */
  readonly jobAttempts: number;
  /** Lock of an active job, ms: a worker that dies loses its jobs to another after about this long. @defaultValue 30000 */
  readonly jobLockMs: number;
  /**
   * Largest response body read from the API, bytes; a larger one is aborted as soon as the cap is
   * crossed and fails that conversation (or the listing). @defaultValue 33554432 (32 MiB)
   */
  readonly maxResponseBytes: number;
  /**
   * Create files 0640 and directories 0750 (owner and group may read) instead of 0600 and 0700.
   * @defaultValue false
   */
  readonly groupReadable: boolean;
  /**
   * Change signal of incremental syncs: `auto` (detect `updated_at`, `last_activity_at`, ... on the
   * first list page), `none` (never skip a conversation), or a field of the conversation object.
   * @defaultValue `auto`
   */
  readonly changeField: string;
}

/** Flags as parsed by the CLI (commander gives strings, or numbers where it coerces). Undefined = not given. */
export type ConfigFlags = Partial<Record<keyof Config, string | number | boolean | undefined>>;

interface FieldDef {
  env: string;
  flag: string;
  schema: z.ZodType;
  defaultValue?: unknown;
}

const uuid = z
  .string()
  .regex(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i, 'must be a UUID (spec 5: X-Account-Id is a UUID)');

const intFrom = (min: number, max: number) =>
  z.coerce
    .number({ error: 'must be a number' })
    .int('must be a whole number')
    .min(min, `must be at least ${min}`)
    .max(max, `must be at most ${max}`);

/** Field table: env variable, flag, validation and default, one place for all of them. */
export const CONFIG_FIELDS: Record<keyof Config, FieldDef> = {
  baseUrl: {
    env: 'CONVO_MIRROR_BASE_URL',
    flag: '--base-url',
    schema: z
      .string()
      .trim()
      .refine((s) => URL.canParse(s), 'must be an absolute http(s) URL, e.g. https://support.example.com/api')
      .refine((s) => /^https?:\/\//i.test(s), 'must use http or https')
      // Credentials in the URL would be sent nowhere (we never use them) yet end up in logs: refuse.
      .refine((s) => !URL.canParse(s) || (new URL(s).username === '' && new URL(s).password === ''), 'must not carry a user name or password (put the key in CONVO_MIRROR_API_KEY)')
      .refine((s) => !URL.canParse(s) || (new URL(s).search === '' && !s.includes('?')), 'must not carry a query string (paths /v1/... are appended to it)')
      .refine((s) => !URL.canParse(s) || (new URL(s).hash === '' && !s.includes('#')), 'must not carry a fragment (#...)')
      .transform((s) => s.replace(/\/+$/, '')),
  },
  apiKey: {
    env: 'CONVO_MIRROR_API_KEY',
    flag: '--api-key',
    schema: z
      .string()
      .trim()
      .min(1, 'must not be empty')
      // Sent as a header value: CR, LF, other control characters or non-ASCII are a paste error
      // (and would be refused by the HTTP stack, or worse, split the header).
      .regex(/^[\x20-\x7e]+$/, 'must be printable ASCII: it holds a control character (CR, LF, tab...) or a non-ASCII character'),
  },
  accountId: { env: 'CONVO_MIRROR_ACCOUNT_ID', flag: '--account-id', schema: uuid },
  db: { env: 'CONVO_MIRROR_DB', flag: '--db', schema: z.string().min(1, 'must not be empty'), defaultValue: 'data/mirror.sqlite' },
  exportDir: {
    env: 'CONVO_MIRROR_EXPORT_DIR',
    flag: '--export-dir',
    schema: z.string().min(1, 'must not be empty'),
    defaultValue: 'data/exports',
  },
  concurrency: { env: 'CONVO_MIRROR_CONCURRENCY', flag: '--concurrency', schema: intFrom(1, 64), defaultValue: 4 },
  maxRps: {
    env: 'CONVO_MIRROR_MAX_RPS',
    flag: '--max-rps',
    schema: z.coerce
      .number({ error: 'must be a number' })
      .refine((n) => n === 0 || n >= 0.1, 'must be 0 (no cap) or at least 0.1 requests per second')
      .refine((n) => n <= 10_000, 'must be at most 10000'),
    defaultValue: 10,
  },
  requestTimeoutMs: {
    env: 'CONVO_MIRROR_REQUEST_TIMEOUT_MS',
    flag: '--request-timeout',
    schema: intFrom(100, 600_000),
    defaultValue: 30_000,
  },
  maxRetries: { env: 'CONVO_MIRROR_MAX_RETRIES', flag: '--max-retries', schema: intFrom(0, 20), defaultValue: 6 },
  logLevel: { env: 'LOG_LEVEL', flag: '--log-level', schema: z.enum(LOG_LEVELS, { error: `must be one of ${LOG_LEVELS.join(', ')}` }), defaultValue: 'info' },
  redisUrl: {
    env: 'REDIS_URL',
    flag: '--redis-url',
    schema: z
      .string()
      .trim()
      .refine((s) => /^rediss?:\/\/[^\s]+$/.test(s) && URL.canParse(s), 'must be a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379'),
    defaultValue: 'redis://127.0.0.1:6379',
  },
  schedule: { env: 'CONVO_MIRROR_SCHEDULE', flag: '--schedule', schema: cron(), defaultValue: '*/15 * * * *' },
  fullSchedule: { env: 'CONVO_MIRROR_FULL_SCHEDULE', flag: '--full-schedule', schema: cron(), defaultValue: '0 3 * * *' },
  tz: {
    env: 'CONVO_MIRROR_TZ',
    flag: '--tz',
    schema: z.string().trim().refine(isTimeZone, 'must be an IANA time zone such as UTC or Europe/Paris'),
    defaultValue: 'UTC',
  },
  shutdownTimeoutMs: { env: 'CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS', flag: '--shutdown-timeout', schema: intFrom(0, 3_600_000), defaultValue: 30_000 },
  queuePrefix: {
    env: 'CONVO_MIRROR_QUEUE_PREFIX',
    flag: '--queue-prefix',
    schema: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, 'must be 1-64 letters, digits, dots, dashes or underscores'),
    defaultValue: 'convo-mirror',
  },
  jobAttempts: { env: 'CONVO_MIRROR_JOB_ATTEMPTS', flag: '--job-attempts', schema: intFrom(1, 100), defaultValue: 5 },
  jobLockMs: { env: 'CONVO_MIRROR_JOB_LOCK_MS', flag: '--job-lock', schema: intFrom(1000, 3_600_000), defaultValue: 30_000 },
  maxResponseBytes: {
    env: 'CONVO_MIRROR_MAX_RESPONSE_BYTES',
    flag: '--max-response-bytes',
    schema: intFrom(65_536, 1_073_741_824),
    defaultValue: 32 * 1024 * 1024,
  },
  groupReadable: {
    env: 'CONVO_MIRROR_GROUP_READABLE',
    flag: '--group-readable',
    schema: z
      .union([z.boolean(), z.enum(['true', 'false', '1', '0', 'yes', 'no'], { error: 'must be true or false' })])
      .transform((v) => v === true || v === 'true' || v === '1' || v === 'yes'),
    defaultValue: false,
  },
  changeField: {
    env: 'CONVO_MIRROR_CHANGE_FIELD',
    flag: '--change-field',
    schema: z.string().trim().regex(/^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/, 'must be auto, none, or a field name of the conversation object'),
    defaultValue: 'auto',
  },
};

/**
 * A URL (or text meant as one) with everything from after the scheme up to the LAST `@` masked,
 * and any query or fragment, parseable or not, so a password or token typed into it is never
 * printed, even one holding `/`, `?`, `#` or `@`.
 */
export function maskUserInfo(text: string): string {
  const at = text.lastIndexOf('@');
  const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(text);
  const masked = at < 0 ? text : `${scheme ? scheme[0] : ''}***${text.slice(at)}`;
  // A query or fragment may carry a token too.
  return masked.replace(/([?#])[\s\S]*$/, '$1***');
}

function cron() {
  return z
    .string()
    .trim()
    .refine((expr) => {
      try {
        CronExpressionParser.parse(expr, { tz: 'UTC' });
        return expr.split(/\s+/).length >= 5;
      } catch {
        return false;
      }
    }, 'must be a cron expression such as "*/15 * * * *" (minute hour day month weekday)');
}

function isTimeZone(tz: string): boolean {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: tz });
    return true;
  } catch {
    return false;
  }
}

/** Options of {@link loadConfig}. */
export interface LoadConfigOptions {
  /** Require `baseUrl` and `apiKey` (every command that calls the API). @defaultValue true */
  needsApi?: boolean;
}

/**
 * Builds the configuration: flag, else environment variable, else default; validates each value.
 *
 * @param env - usually `process.env`
 * @param flags - values from the command line; they win over `env`
 * @throws {@link ConfigError} naming the variable (and flag) of the first missing or malformed value
 */
export function loadConfig(env: NodeJS.ProcessEnv, flags: ConfigFlags = {}, opts: LoadConfigOptions = {}): Config {
  const needsApi = opts.needsApi ?? true;
  const out: Record<string, unknown> = {};
  for (const [key, def] of Object.entries(CONFIG_FIELDS) as [keyof Config, FieldDef][]) {
    const fromFlag = flags[key];
    const fromEnv = env[def.env];
    const raw = fromFlag !== undefined ? fromFlag : fromEnv !== undefined && fromEnv !== '' ? fromEnv : undefined;
    const name = fromFlag !== undefined ? `${def.flag}` : def.env;
    if (typeof raw === 'string' && raw.trim() === '') {
      // A blank value would coerce to 0 (e.g. "no rate cap"): refuse it rather than guess.
      throw new ConfigError(name, 'must not be blank');
    }
    if (raw === undefined) {
      if (def.defaultValue !== undefined) {
        out[key] = def.defaultValue;
        continue;
      }
      if (needsApi && (key === 'baseUrl' || key === 'apiKey')) {
        throw new ConfigError(def.env, `is required (set it in the environment or pass ${def.flag})`);
      }
      out[key] = undefined;
      continue;
    }
    const parsed = def.schema.safeParse(raw);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]?.message ?? 'is invalid';
      // Never echo secrets: the API key, a Redis URL (it may carry a password), or a base URL's
      // user info (shown with it masked).
      const shown = key === 'apiKey' || key === 'redisUrl' ? '' : ` (got ${JSON.stringify(key === 'baseUrl' ? maskUserInfo(String(raw)) : String(raw)).slice(0, 80)})`;
      throw new ConfigError(name, `${issue}${shown}`);
    }
    out[key] = parsed.data;
  }
  return Object.freeze(out) as unknown as Config;
}
