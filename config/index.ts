/**
 * convo-mirror configuration: parsed once with zod from the environment, overridable by command-line
 * flags, frozen, and passed down. This is the only module that reads `process.env` (design: config/).
 * The CLI first fills the environment from `.env` (env-file.ts: flags > environment > `.env` > default).
 *
 * A missing or malformed value throws {@link ConfigError} naming the variable; the CLI turns that
 * into a one-line message and exit code 2.
 */
import fs from 'node:fs';
import { isIP } from 'node:net';
import { z } from 'zod';
import { CronExpressionParser } from 'cron-parser';
import { ConfigError } from '../src/errors.js';
import { OTHER_KNOWN_VARIABLES } from './env-file.js';
import { durationSetting } from './duration.js';
import { retentionSetting, type RetentionPolicy } from './retention.js';
import { hasDbPath } from './redis-url.js';
import { dbProblem, dbShown } from './db-url.js';

/** Log levels accepted by `LOG_LEVEL` / `--log-level` (pino's). */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** The frozen configuration handed to every command. */
export interface Config {
  /** The spec's `{base_url}`; `/v1/...` paths are appended. No trailing slash. Undefined only for commands that make no API call. */
  readonly baseUrl: string | undefined;
  /** Sent as `X-Api-Key` (spec 5). Never logged. Undefined only for commands that make no API call. */
  readonly apiKey: string | undefined;
  /**
   * Workspace UUID sent as `X-Account-Id` (spec 5, multi-workspace context); undefined when not
   * configured. With several workspaces, the first of {@link Config.workspaces} (read
   * `workspaces` to mirror them all).
   */
  readonly accountId: string | undefined;
  /**
   * Path of the workspaces file (`CONVO_MIRROR_WORKSPACES`, `--workspaces`): a JSON list of
   * `{ account_id, base_url?, api_key_env, schedule?, full_schedule? }`; undefined when not given.
   * Resolved into {@link Config.workspaces}.
   */
  readonly workspacesFile: string | undefined;
  /**
   * Every workspace to mirror, in the order configured: from the workspaces file, else one per
   * UUID of `CONVO_MIRROR_ACCOUNT_ID` (all with `CONVO_MIRROR_BASE_URL` and `CONVO_MIRROR_API_KEY`),
   * else the single workspace of the key (`accountId` undefined). Never empty.
   */
  readonly workspaces: readonly Workspace[];
  /** The mirror: a SQLite file path, or a PostgreSQL URL `postgres://user@host:port/db?schema=NAME` (also `postgresql://`). @defaultValue `data/mirror.sqlite` */
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
  /**
   * How long the daemon lets running jobs finish after SIGTERM/SIGINT, ms; the shutdown then takes
   * at most 5 s more (jobs put back, connections closed), so the default ends within 25 s, inside
   * Kubernetes' default 30 s before SIGKILL. @defaultValue 20000
   */
  readonly shutdownTimeoutMs: number;
  /** Prefix of the BullMQ keys in Redis (one prefix per mirror). @defaultValue `convo-mirror` */
  readonly queuePrefix: string;
  /** Attempts of a job before it is kept as failed (dead letter). @defaultValue 5 */
  readonly jobAttempts: number;
  /**
   * How long Redis keeps a failed job (the dead letters `status` lists and `retry-failed`
   * re-queues), ms. @defaultValue 604800000 (7 days)
   */
  readonly failedJobsMaxAgeMs: number;
  /** Most failed jobs Redis keeps (the oldest go first). @defaultValue 1000 */
  readonly failedJobsMaxCount: number;
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
   * Write new export batches as `.jsonl.gz` with deterministic bytes (`CONVO_MIRROR_EXPORT_GZIP`,
   * `--gzip`). @defaultValue false
   */
  readonly exportGzip: boolean;
  /**
   * During a run, publish the changes committed so far every this many ms (and at the end), so a
   * long backfill reaches the exports progressively. @defaultValue 300000 (5 minutes)
   */
  readonly publishIntervalMs: number;
  readonly publishLines: number;
  /**
   * The line of a run that changed nothing (no message or conversation changed) waits for the next
   * publication that carries changes, or until the heartbeat window it fell in has ended: windows
   * are multiples of this many ms since the epoch, so the default, 24 h, publishes a quiet day's
   * run lines once, at the first publication after midnight UTC. 0: every run's line is published
   * when the run ends. @defaultValue 86400000 (24 h)
   */
  readonly runsHeartbeatMs: number;
  /**
   * Ed25519 private key (PEM) that signs every batch record of the ledger
   * (`CONVO_MIRROR_SIGNING_KEY_FILE`); undefined: records are unsigned. `convo-mirror keygen` makes one.
   */
  readonly signingKeyFile: string | undefined;
  /**
   * The head witness's directory (`CONVO_MIRROR_WITNESS_DIR`, `--witness-dir`): another disk or
   * mount, which must exist; every publication that moves the chain head appends the signed head to
   * `<dir>/<mirror id>.heads.jsonl` there, for `verify --witness`. Undefined: no witness.
   */
  readonly witnessDir: string | undefined;
  /**
   * How long the archive keeps published export files, by their date partition
   * (`CONVO_MIRROR_RETENTION`, `--retention`: `400d`, `52w`, `7y`, or per stream
   * `messages=400d,runs=7y`; see config/retention.ts): each publication expires the older files
   * by a retention record in the ledger, then deletes them. Undefined (`none`): keep everything.
   * @defaultValue undefined (keep everything)
   */
  readonly retention: RetentionPolicy | undefined;
  /**
   * Also expire messages in the mirror (`CONVO_MIRROR_PRUNE_MIRROR`, `--prune-mirror`): each
   * publication erases, by a retention erasure, every message created before the `messages`
   * stream's cutoff (src/export/retention.ts `pruneMirror`). Needs {@link retention} to limit
   * `messages`. @defaultValue false
   */
  readonly pruneMirror: boolean;
  /**
   * Extra query parameters of every `GET /v1/conversations` request (`CONVO_MIRROR_LIST_PARAMS`,
   * `--list-params`, e.g. `sort=last_activity_at&order=desc`), for APIs that need them to sort the
   * list; in the order given, after `page` and `per_page`. @defaultValue none
   */
  readonly listParams: readonly (readonly [string, string])[];
  /**
   * Change signal of incremental syncs: `auto` (detect `updated_at`, `last_activity_at`, ... on the
   * first list page), `none` (never skip a conversation), or a field of the conversation object.
   * @defaultValue `auto`
   */
  readonly changeField: string;
  /** Interface the daemon's HTTP server (health, readiness, metrics) binds. @defaultValue `127.0.0.1` */
  readonly httpHost: string;
  /** Port of the daemon's HTTP server; 0 = no server. @defaultValue 9464 */
  readonly httpPort: number;
  /**
   * Where the daemon's schedules and queue live: `bullmq` (Redis; the way to scale out, and what
   * `enqueue` / `retry-failed` talk to) or `local` (node-cron and an in-process queue, no Redis).
   * @defaultValue `bullmq`
   */
  readonly scheduler: 'bullmq' | 'local';
  /**
   * Standard Webhooks signing secret of `POST /webhooks/conversations` (`whsec_` + base64); the
   * route exists only when it is set. Never logged.
   */
  readonly webhookSecret: string | undefined;
  /**
   * JSON pointers (RFC 6901) tried in order to find the conversation id in a webhook's body; the
   * first that resolves to a non-empty string wins.
   * @defaultValue `/conversation_id`, `/conversation/id`, `/data/conversation_id`, `/data/conversation/id`
   */
  readonly webhookIdPointers: readonly string[];
  /**
   * Password of the queue dashboard (`/admin/queues`, HTTP basic auth, user `admin`); the dashboard
   * exists only when it is set (and only in BullMQ mode). Never logged.
   */
  readonly adminPassword: string | undefined;
}

/**
 * One workspace to mirror (spec 1 and 5: a user may belong to several accounts, selected with
 * `X-Account-Id`). Its `apiKey` is never serialized: `JSON.stringify` shows `[redacted]`.
 */
export interface Workspace {
  /** Sent as `X-Account-Id`; the account its rows are kept under. Undefined: no header, rows under `default`. */
  readonly accountId: string | undefined;
  /** The spec's `{base_url}`, no trailing slash. Undefined only for commands that make no API call. */
  readonly baseUrl: string | undefined;
  /** Sent as `X-Api-Key`. Undefined only for commands that make no API call. Never logged. */
  readonly apiKey: string | undefined;
  /**
   * The environment variable its key came from (a workspaces file's `api_key_env`), for messages;
   * undefined: `CONVO_MIRROR_API_KEY`. Never the key.
   */
  readonly keyVariable?: string | undefined;
  /** Cron of this workspace's regular sync. @defaultValue {@link Config.schedule} */
  readonly schedule: string;
  /** Cron of this workspace's full refresh. @defaultValue {@link Config.fullSchedule} */
  readonly fullSchedule: string;
}

/** The configuration keys that are settings of their own (every key but the derived `workspaces`). */
export type FieldKey = Exclude<keyof Config, 'workspaces'>;

/** Flags as parsed by the CLI (commander gives strings, or numbers where it coerces). Undefined = not given. */
export type ConfigFlags = Partial<Record<keyof Config, string | number | boolean | undefined>>;

/** Commands that take configuration flags (`fake-api` and `demo` have their own). */
export type ConfigCommand = 'sync' | 'status' | 'verify' | 'erase' | 'daemon' | 'enqueue' | 'retry-failed' | 'check' | 'conversations' | 'config' | 'backup';

/** Commands that call the API. */
const API: readonly ConfigCommand[] = ['sync', 'daemon', 'check', 'config'];
/** Commands that open the mirror and its exports. */
const MIRROR: readonly ConfigCommand[] = ['sync', 'status', 'verify', 'erase', 'daemon', 'check', 'conversations', 'config'];
/** Commands that open the mirror and write it or its exports, or name the workspace (`conversations` only reads the mirror and takes `--account`). */
const MIRROR_WORK: readonly ConfigCommand[] = MIRROR.filter((c) => c !== 'conversations');
/** Commands that reach the job queue. */
const QUEUE: readonly ConfigCommand[] = ['status', 'daemon', 'enqueue', 'retry-failed', 'check', 'config'];
/** Every command that takes configuration flags. */
const EVERY: readonly ConfigCommand[] = ['sync', 'status', 'verify', 'erase', 'daemon', 'enqueue', 'retry-failed', 'check', 'conversations', 'config', 'backup'];
/** Commands that publish to the archive: they sign records and witness heads (`erase` publishes its erasure records). */
const PUBLISH: readonly ConfigCommand[] = [...API, 'erase'];

/**
 * One configuration field: where it comes from (flag, env), how it is validated, its default, and
 * how the CLI shows it. src/cli/flags.ts generates every command's options (help text
 * `<help> (env <ENV>, default <default>[; <note>])`) and the flags → {@link ConfigFlags} mapping
 * from this, so a field is declared once.
 */
export interface FieldDef {
  /** Environment variable, e.g. `CONVO_MIRROR_BASE_URL`. */
  env: string;
  /** Command-line flag as commander declares it: `--base-url <url>`, or `--group-readable` for a switch. */
  flag: string;
  /** Validation (and coercion) of the raw string, or boolean for a switch. */
  schema: z.ZodType;
  /** Value when neither flag nor env is given; absent = undefined (or required, for baseUrl/apiKey). */
  defaultValue?: unknown;
  /** One line of help, without the env and default (they are appended). */
  help: string;
  /** The default as help shows it, when `String(defaultValue)` is not the best way to say it. */
  shownDefault?: string;
  /** Appended after the env (and default) in help, e.g. a caution. */
  helpNote?: string;
  /** Commands that take the flag. */
  commands: readonly ConfigCommand[];
  /** A secret (key, password, signing secret): its value is never echoed in an error. */
  secret?: boolean;
}

const uuid = z
  .string()
  .regex(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i, 'must be a UUID (spec 5: X-Account-Id is a UUID)');

/**
 * `CONVO_MIRROR_ACCOUNT_ID`: one UUID, or a comma-separated list of them (spaces around commas
 * allowed); a UUID listed twice (compared case-insensitively) is refused. Parses to the list.
 */
function accountIdList() {
  return z.string().transform((s, ctx) => {
    const ids = s.split(',').map((p) => p.trim());
    const seen = new Set<string>();
    for (const [i, id] of ids.entries()) {
      const where = ids.length > 1 ? `item ${i + 1} of the list ` : '';
      if (!uuid.safeParse(id).success) {
        ctx.addIssue({ code: 'custom', message: `${where}must be a UUID (spec 5: X-Account-Id is a UUID)` });
        return z.NEVER;
      }
      if (seen.has(id.toLowerCase())) {
        ctx.addIssue({ code: 'custom', message: `lists ${id} twice: name each workspace once` });
        return z.NEVER;
      }
      seen.add(id.toLowerCase());
    }
    return ids;
  });
}

const intFrom = (min: number, max: number) =>
  z.coerce
    .number({ error: 'must be a number' })
    .int('must be a whole number')
    .min(min, `must be at least ${min}`)
    .max(max, `must be at most ${max}`);

/**
 * Field table: env variable, flag, validation, default, help and the commands that take it, one
 * place for all of them. The order is the order of the flags in every command's help.
 */
export const CONFIG_FIELDS: Record<FieldKey, FieldDef> = {
  baseUrl: {
    env: 'CONVO_MIRROR_BASE_URL',
    flag: '--base-url <url>',
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
    help: "API base URL, the spec's {base_url}",
    commands: API,
  },
  apiKey: {
    env: 'CONVO_MIRROR_API_KEY',
    flag: '--api-key <key>',
    schema: z
      .string()
      .trim()
      .min(1, 'must not be empty')
      // Sent as a header value: CR, LF, other control characters or non-ASCII are a paste error
      // (and would be refused by the HTTP stack, or worse, split the header).
      .regex(/^[\x20-\x7e]+$/, 'must be printable ASCII: it holds a control character (CR, LF, tab...) or a non-ASCII character'),
    help: 'API key sent as X-Api-Key',
    helpNote: 'prefer the env: flags show in ps',
    commands: API,
    secret: true,
  },
  accountId: {
    env: 'CONVO_MIRROR_ACCOUNT_ID',
    flag: '--account-id <uuid>',
    schema: accountIdList(),
    help: 'workspace: the X-Account-Id sent, and the account the rows are kept under; a comma-separated list mirrors several workspaces with one key',
    commands: MIRROR_WORK,
  },
  workspacesFile: {
    env: 'CONVO_MIRROR_WORKSPACES',
    flag: '--workspaces <file>',
    schema: z.string().trim().min(1, 'must not be empty'),
    help: 'JSON file listing the workspaces, each with its account_id, api_key_env (the variable holding its key) and optional base_url',
    helpNote: 'instead of --account-id',
    commands: ['sync', 'erase', 'daemon', 'check'],
  },
  concurrency: {
    env: 'CONVO_MIRROR_CONCURRENCY',
    flag: '--concurrency <n>',
    schema: intFrom(1, 64),
    defaultValue: 4,
    help: 'conversations in flight',
    commands: API,
  },
  maxRps: {
    env: 'CONVO_MIRROR_MAX_RPS',
    flag: '--max-rps <n>',
    schema: z.coerce
      .number({ error: 'must be a number' })
      .refine((n) => n === 0 || n >= 0.1, 'must be 0 (no cap) or at least 0.1 requests per second')
      .refine((n) => n <= 10_000, 'must be at most 10000'),
    defaultValue: 10,
    help: 'requests per second cap per base URL and key (shared by the fleet with the BullMQ daemon), 0 = none',
    commands: API,
  },
  requestTimeoutMs: {
    env: 'CONVO_MIRROR_REQUEST_TIMEOUT_MS',
    flag: '--request-timeout <ms>',
    schema: intFrom(100, 600_000),
    defaultValue: 30_000,
    help: 'per-request timeout in ms',
    commands: API,
  },
  maxRetries: {
    env: 'CONVO_MIRROR_MAX_RETRIES',
    flag: '--max-retries <n>',
    schema: intFrom(0, 20),
    defaultValue: 6,
    help: 'retries per request for transient failures',
    commands: API,
  },
  listParams: {
    env: 'CONVO_MIRROR_LIST_PARAMS',
    flag: '--list-params <query>',
    schema: listParamsSchema(),
    defaultValue: [],
    shownDefault: 'none',
    help: 'extra query parameters of the conversation list requests, e.g. sort=last_activity_at&order=desc',
    commands: API,
  },
  changeField: {
    env: 'CONVO_MIRROR_CHANGE_FIELD',
    flag: '--change-field <field>',
    schema: z.string().trim().regex(/^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/, 'must be auto, none, or a field name of the conversation object'),
    defaultValue: 'auto',
    help: 'change signal of incremental syncs: auto, none or a field name',
    commands: API,
  },
  maxResponseBytes: {
    env: 'CONVO_MIRROR_MAX_RESPONSE_BYTES',
    flag: '--max-response-bytes <n>',
    schema: intFrom(65_536, 1_073_741_824),
    defaultValue: 32 * 1024 * 1024,
    help: 'largest API response read, bytes; larger ones fail that conversation',
    shownDefault: '33554432 = 32 MiB',
    commands: API,
  },
  groupReadable: {
    env: 'CONVO_MIRROR_GROUP_READABLE',
    flag: '--group-readable',
    schema: booleanSetting(),
    defaultValue: false,
    help: 'create files 0640 and directories 0750 instead of 0600 and 0700',
    commands: [...PUBLISH, 'backup'],
  },
  exportGzip: {
    env: 'CONVO_MIRROR_EXPORT_GZIP',
    flag: '--gzip',
    schema: booleanSetting(),
    defaultValue: false,
    help: 'write new export files as .jsonl.gz (deterministic bytes)',
    commands: API,
  },
  publishIntervalMs: {
    env: 'CONVO_MIRROR_PUBLISH_INTERVAL_MS',
    flag: '--publish-interval <ms>',
    schema: intFrom(1000, 86_400_000),
    defaultValue: 300_000,
    shownDefault: '300000 = 5 minutes',
    help: 'during a run, publish the changes committed so far this often (and at the end), ms',
    commands: API,
  },
  publishLines: {
    env: 'CONVO_MIRROR_PUBLISH_LINES',
    flag: '--publish-lines <n>',
    schema: intFrom(0, 100_000_000),
    defaultValue: 10_000,
    shownDefault: '10000; 0 = by time only',
    help: 'during a run, also publish as soon as this many changes wait to be exported (counted at most once a second)',
    commands: API,
  },
  runsHeartbeatMs: {
    env: 'CONVO_MIRROR_RUNS_HEARTBEAT',
    flag: '--runs-heartbeat <duration>',
    schema: durationSetting(0, 7 * 86_400_000),
    defaultValue: 86_400_000,
    shownDefault: '24h',
    help: "a run that changed nothing publishes its line with the next changes, or once this window (24h: a UTC day) has ended; 0s = at once",
    commands: API,
  },
  signingKeyFile: {
    env: 'CONVO_MIRROR_SIGNING_KEY_FILE',
    flag: '--signing-key-file <file>',
    schema: z.string().trim().min(1, 'must not be empty'),
    help: 'Ed25519 private key (PEM) that signs every ledger record; convo-mirror keygen makes one',
    commands: PUBLISH,
  },
  witnessDir: {
    env: 'CONVO_MIRROR_WITNESS_DIR',
    flag: '--witness-dir <dir>',
    schema: z.string().trim().min(1, 'must not be empty'),
    help: 'existing directory on another disk or mount where each new signed head is appended (<mirror id>.heads.jsonl), for verify --witness',
    commands: PUBLISH,
  },
  retention: {
    env: 'CONVO_MIRROR_RETENTION',
    flag: '--retention <policy>',
    schema: retentionSetting(),
    shownDefault: 'none = keep everything',
    help: 'delete published export files whose date partition is older than this (400d, 52w, 7y; or messages=400d,runs=7y), after a retention record in the ledger lists them',
    commands: PUBLISH,
  },
  pruneMirror: {
    env: 'CONVO_MIRROR_PRUNE_MIRROR',
    flag: '--prune-mirror',
    schema: booleanSetting(),
    defaultValue: false,
    help: "also erase from the mirror every message created before the retention policy's messages cutoff (a retention erasure, recorded in the ledger)",
    commands: PUBLISH,
  },
  db: {
    env: 'CONVO_MIRROR_DB',
    flag: '--db <path>',
    schema: z
      .string()
      .min(1, 'must not be empty')
      .superRefine((value, ctx) => {
        const problem = dbProblem(value);
        if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
      }),
    defaultValue: 'data/mirror.sqlite',
    help: 'SQLite mirror file, or a PostgreSQL URL postgres://user@host:port/db?schema=NAME',
    commands: [...MIRROR, 'backup'],
  },
  exportDir: {
    env: 'CONVO_MIRROR_EXPORT_DIR',
    flag: '--export-dir <dir>',
    schema: z.string().min(1, 'must not be empty'),
    defaultValue: 'data/exports',
    help: 'JSONL exports',
    commands: MIRROR_WORK,
  },
  logLevel: {
    env: 'LOG_LEVEL',
    flag: '--log-level <level>',
    schema: z.enum(LOG_LEVELS, { error: `must be one of ${LOG_LEVELS.join(', ')}` }),
    defaultValue: 'info',
    help: LOG_LEVELS.join('|'),
    commands: EVERY,
  },
  redisUrl: {
    env: 'REDIS_URL',
    flag: '--redis-url <url>',
    schema: z
      .string()
      .trim()
      .refine((s) => /^rediss?:\/\/[^\s]+$/.test(s) && URL.canParse(s), 'must be a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379')
      // What the connections use is what the messages show (config/redis-url.ts): a path that is not a
      // database number, or a query the queue's connections would ignore, is refused rather than guessed at.
      .refine((s) => !URL.canParse(s) || hasDbPath(s), 'the path after the host must be a database number, e.g. redis://127.0.0.1:6379/5')
      .refine((s) => !URL.canParse(s) || (new URL(s).search === '' && new URL(s).hash === '' && !s.includes('?') && !s.includes('#')), 'must not carry a query string or fragment: convo-mirror reads the user, password, host, port and database number only (write a ? or # of the password as %3F or %23)'),
    defaultValue: 'redis://127.0.0.1:6379',
    help: 'Redis of the job queue',
    commands: QUEUE,
  },
  queuePrefix: {
    env: 'CONVO_MIRROR_QUEUE_PREFIX',
    flag: '--queue-prefix <prefix>',
    schema: z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, 'must be 1-64 letters, digits, dots, dashes or underscores'),
    defaultValue: 'convo-mirror',
    help: 'BullMQ key prefix, one per mirror',
    commands: QUEUE,
  },
  jobAttempts: {
    env: 'CONVO_MIRROR_JOB_ATTEMPTS',
    flag: '--job-attempts <n>',
    schema: intFrom(1, 100),
    defaultValue: 5,
    help: 'attempts before a job is kept as failed',
    commands: QUEUE,
  },
  failedJobsMaxAgeMs: {
    env: 'CONVO_MIRROR_FAILED_JOBS_MAX_AGE',
    flag: '--failed-jobs-max-age <duration>',
    schema: durationSetting(60_000, 365 * 86_400_000),
    defaultValue: 7 * 86_400_000,
    shownDefault: '7d',
    help: 'how long Redis keeps a failed job (a dead letter status lists and retry-failed re-queues)',
    commands: ['daemon', 'enqueue'],
  },
  failedJobsMaxCount: {
    env: 'CONVO_MIRROR_FAILED_JOBS_MAX_COUNT',
    flag: '--failed-jobs-max-count <n>',
    schema: intFrom(1, 1_000_000),
    defaultValue: 1000,
    help: 'most failed jobs Redis keeps; the oldest go first',
    commands: ['daemon', 'enqueue'],
  },
  schedule: { env: 'CONVO_MIRROR_SCHEDULE', flag: '--schedule <cron>', schema: cron(), defaultValue: '*/15 * * * *', help: 'regular sync', commands: ['daemon'] },
  fullSchedule: { env: 'CONVO_MIRROR_FULL_SCHEDULE', flag: '--full-schedule <cron>', schema: cron(), defaultValue: '0 3 * * *', help: 'full refresh', commands: ['daemon'] },
  tz: {
    env: 'CONVO_MIRROR_TZ',
    flag: '--tz <zone>',
    schema: z.string().trim().refine(isTimeZone, 'must be an IANA time zone such as UTC or Europe/Paris'),
    defaultValue: 'UTC',
    help: 'time zone of the crons',
    commands: ['daemon'],
  },
  shutdownTimeoutMs: {
    env: 'CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS',
    flag: '--shutdown-timeout <ms>',
    schema: intFrom(0, 3_600_000),
    defaultValue: 20_000,
    help: 'grace period for running jobs on SIGTERM/SIGINT, ms; the shutdown then takes at most 5 s more',
    commands: ['daemon'],
  },
  jobLockMs: {
    env: 'CONVO_MIRROR_JOB_LOCK_MS',
    flag: '--job-lock <ms>',
    schema: intFrom(1000, 3_600_000),
    defaultValue: 30_000,
    help: "job lock; a dead worker's job is picked up again after about this long",
    commands: ['daemon'],
  },
  httpHost: {
    env: 'CONVO_MIRROR_HTTP_HOST',
    flag: '--http-host <host>',
    schema: z
      .string()
      .trim()
      .refine((s) => isIP(s) !== 0 || /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/.test(s), 'must be an IP address or a host name, e.g. 127.0.0.1, 0.0.0.0 or ::1'),
    defaultValue: '127.0.0.1',
    help: 'interface of the HTTP server (health, readiness, metrics)',
    commands: ['daemon'],
  },
  httpPort: {
    env: 'CONVO_MIRROR_HTTP_PORT',
    flag: '--http-port <port>',
    schema: intFrom(0, 65_535),
    defaultValue: 9464,
    help: 'port of the HTTP server, 0 = no server',
    commands: ['daemon'],
  },
  scheduler: {
    env: 'CONVO_MIRROR_SCHEDULER',
    flag: '--scheduler <mode>',
    schema: z.enum(['bullmq', 'local'], { error: 'must be bullmq (Redis) or local (in-process, no Redis)' }),
    defaultValue: 'bullmq',
    help: 'bullmq: schedules and queue in Redis (scales out; enqueue and retry-failed need it); local: node-cron and an in-process queue, no Redis',
    commands: ['daemon', 'enqueue', 'retry-failed', 'check'],
  },
  webhookSecret: {
    env: 'CONVO_MIRROR_WEBHOOK_SECRET',
    flag: '--webhook-secret <secret>',
    schema: z
      .string()
      .trim()
      .regex(/^whsec_[A-Za-z0-9+/]{16,}={0,2}$/, 'must be a Standard Webhooks secret: whsec_ followed by base64 (at least 16 characters)')
      .refine((s) => Buffer.from(s.slice('whsec_'.length), 'base64').length >= 16, 'must decode to at least 16 bytes (whsec_ + base64 of 16 to 64 random bytes)'),
    help: 'Standard Webhooks secret of POST /webhooks/conversations; without it the route does not exist',
    helpNote: 'prefer the env: flags show in ps',
    commands: ['daemon'],
    secret: true,
  },
  webhookIdPointers: {
    env: 'CONVO_MIRROR_WEBHOOK_ID_POINTERS',
    flag: '--webhook-id-pointers <list>',
    schema: jsonPointerList(),
    defaultValue: ['/conversation_id', '/conversation/id', '/data/conversation_id', '/data/conversation/id'],
    shownDefault: '/conversation_id,/conversation/id,/data/conversation_id,/data/conversation/id',
    help: "comma-separated JSON pointers to the conversation id in a webhook's body, tried in order",
    commands: ['daemon'],
  },
  adminPassword: {
    env: 'CONVO_MIRROR_ADMIN_PASSWORD',
    flag: '--admin-password <password>',
    schema: z.string().min(12, 'must be at least 12 characters').max(256, 'must be at most 256 characters').regex(/^[\x20-\x7e]+$/, 'must be printable ASCII'),
    help: 'password of the queue dashboard /admin/queues (user admin, basic auth; BullMQ mode); without it the dashboard does not exist',
    helpNote: 'prefer the env: flags show in ps',
    commands: ['daemon'],
    secret: true,
  },
};

/**
 * A query string of extra list parameters (`a=1&b=2`, a leading `?` allowed): its pairs in order.
 * `page` and `per_page` are convo-mirror's own and are refused, as are empty names and characters
 * outside printable ASCII.
 */
function listParamsSchema() {
  return z.string().transform((s, ctx) => {
    const text = s.trim().replace(/^\?/, '');
    if (text === '') return [] as [string, string][];
    if (!/^[\x21-\x7e]+$/.test(text)) {
      ctx.addIssue({ code: 'custom', message: 'must be a query string of printable ASCII without spaces, e.g. sort=last_activity_at&order=desc' });
      return z.NEVER;
    }
    const pairs = [...new URLSearchParams(text)];
    const bad = pairs.find(([k]) => k === '' || k === 'page' || k === 'per_page');
    if (bad) {
      ctx.addIssue({ code: 'custom', message: bad[0] === '' ? 'holds a parameter without a name' : `must not set ${bad[0]}: convo-mirror pages with page and per_page=100 itself` });
      return z.NEVER;
    }
    return pairs;
  });
}

/** A yes/no setting: a flag's `true`, or `true`/`false`/`1`/`0`/`yes`/`no` from the environment. */
function booleanSetting() {
  return z
    .union([z.boolean(), z.enum(['true', 'false', '1', '0', 'yes', 'no'], { error: 'must be true or false' })])
    .transform((v) => v === true || v === 'true' || v === '1' || v === 'yes');
}

/**
 * A comma-separated list of JSON pointers (RFC 6901: empty, or `/`-separated tokens with `~0` and
 * `~1` escapes); parses to the list.
 */
function jsonPointerList() {
  return z.string().transform((s, ctx) => {
    const list = s.split(',').map((p) => p.trim());
    for (const [i, p] of list.entries()) {
      if (!p.startsWith('/') || /~[^01]|~$/.test(p)) {
        ctx.addIssue({ code: 'custom', message: `item ${i + 1} must be a JSON pointer such as /data/conversation_id (it starts with /; ~ only as ~0 or ~1)` });
        return z.NEVER;
      }
    }
    return list;
  });
}

/** The flag's name without its value placeholder: `--base-url <url>` → `--base-url`. */
export function flagName(def: Pick<FieldDef, 'flag'>): string {
  return def.flag.split(' ')[0]!;
}

/**
 * A URL (or text meant as one) with everything from after the scheme up to the LAST `@` masked,
 * and any query or fragment, parseable or not, so a password or token typed into it is never
 * printed, even one holding `/`, `?`, `#` or `@`.
 */
export function maskUserInfo(text: string): string {
  const at = text.lastIndexOf('@');
  const scheme = text.match(/^[A-Za-z][A-Za-z0-9+.-]*:\/\//);
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
  /**
   * Require `baseUrl` and `apiKey` (every command that calls the API): with a workspaces file,
   * each workspace's base URL and the variable holding its key. @defaultValue true
   */
  needsApi?: boolean;
}

/** The raw value of a field (flag, else non-empty env) and the name to blame for it (flag or env). */
function rawOf(key: FieldKey, env: NodeJS.ProcessEnv, flags: ConfigFlags): { raw: unknown; name: string } {
  const def = CONFIG_FIELDS[key];
  const fromFlag = flags[key];
  const fromEnv = env[def.env];
  const raw = fromFlag !== undefined ? fromFlag : fromEnv !== undefined && fromEnv !== '' ? fromEnv : undefined;
  return { raw, name: fromFlag !== undefined ? flagName(def) : def.env };
}

/** A given raw value of a field, validated: the parsed value, or what is wrong (one line, never the value). */
function parseField(key: FieldKey, raw: unknown): { ok: true; value: unknown } | { ok: false; issue: string } {
  // A blank value would coerce to 0 (e.g. "no rate cap"): refuse it rather than guess.
  if (typeof raw === 'string' && raw.trim() === '') return { ok: false, issue: 'must not be blank' };
  const parsed = CONFIG_FIELDS[key].schema.safeParse(raw);
  return parsed.success ? { ok: true, value: parsed.data } : { ok: false, issue: parsed.error.issues[0]?.message ?? 'is invalid' };
}

/**
 * One field's value: validated raw value, else its default, else undefined.
 * @throws {@link ConfigError} naming the flag or variable; `required` and absent: naming the variable
 */
function fieldValue(key: FieldKey, env: NodeJS.ProcessEnv, flags: ConfigFlags, required: boolean): unknown {
  const def = CONFIG_FIELDS[key];
  const { raw, name } = rawOf(key, env, flags);
  if (typeof raw === 'string' && raw.trim() === '') throw new ConfigError(name, 'must not be blank');
  if (raw === undefined) {
    if (def.defaultValue !== undefined) return def.defaultValue;
    if (required) throw new ConfigError(def.env, `is required (set it in the environment or pass ${flagName(def)})`);
    return undefined;
  }
  const parsed = parseField(key, raw);
  if (!parsed.ok) {
    const issue = parsed.issue;
    // Never echo secrets: the fields marked secret, a Redis URL (it may carry a password), or a base URL's
    // user info (shown with it masked).
    const shown = def.secret === true || key === 'redisUrl' ? '' : ` (got ${JSON.stringify(shownGiven(key, String(raw))).slice(0, 80)})`;
    throw new ConfigError(name, `${issue}${shown}`);
  }
  return parsed.value;
}

/**
 * A given value of a non-secret field as a message or `config` may show it: a base or Redis URL
 * with its user info, query and fragment masked ({@link maskUserInfo}); `CONVO_MIRROR_DB` with a
 * PostgreSQL URL's password masked ({@link dbShown}); anything else as given.
 */
function shownGiven(key: FieldKey, raw: string): string {
  if (key === 'baseUrl' || key === 'redisUrl') return maskUserInfo(raw);
  if (key === 'db') return dbShown(raw);
  return raw;
}

/** Where a setting's value comes from, as `convo-mirror config` says it; `unset` when from nowhere. */
export type SettingSource = 'flag' | 'environment' | '.env' | 'default' | 'unset';

/** One setting as `convo-mirror config` reports it ({@link settingReport}). */
export interface SettingReport {
  key: FieldKey;
  /** Its environment variable, e.g. `CONVO_MIRROR_DB`. */
  env: string;
  source: SettingSource;
  /** A secret (`secret: true` in {@link CONFIG_FIELDS}): show only whether it is set, never its value. */
  secret: boolean;
  /** The validated value (or the default); undefined when unset or malformed. */
  value: unknown;
  /**
   * When malformed: the value given as it may be shown (a URL's user info, query and fragment
   * masked); undefined for a secret.
   */
  given?: string | undefined;
  /** When malformed: what is wrong, one line, e.g. `must be a number`; never the value. */
  error?: string | undefined;
}

/**
 * The setting `key`: its validated value, where it came from, or what is wrong with it. Never
 * throws, never requires anything (the base URL and key are optional here).
 *
 * @param fromEnvFile - the variables `env` took from `.env` (their source is `.env`, not `environment`)
 */
export function settingReport(key: FieldKey, env: NodeJS.ProcessEnv, flags: ConfigFlags, fromEnvFile: ReadonlySet<string>): SettingReport {
  const def = CONFIG_FIELDS[key];
  const { raw } = rawOf(key, env, flags);
  const base = { key, env: def.env, secret: def.secret === true };
  if (raw === undefined) return { ...base, source: def.defaultValue === undefined ? 'unset' : 'default', value: def.defaultValue };
  const source: SettingSource = flags[key] !== undefined ? 'flag' : fromEnvFile.has(def.env) ? '.env' : 'environment';
  const parsed = parseField(key, raw);
  if (parsed.ok) return { ...base, source, value: parsed.value };
  const given = def.secret === true ? undefined : shownGiven(key, String(raw));
  return { ...base, source, value: undefined, given, error: parsed.issue };
}

/**
 * The variables a workspaces file names for its keys (`api_key_env`), in the file's order; the
 * keys themselves are not read.
 *
 * @param name - the variable or flag that named the file, for errors
 * @throws {@link ConfigError} as {@link loadConfig} for an unreadable or malformed file
 */
export function workspaceKeyVariables(file: string, name: string): string[] {
  const defaults = { baseUrl: undefined, schedule: CONFIG_FIELDS.schedule.defaultValue as string, fullSchedule: CONFIG_FIELDS.fullSchedule.defaultValue as string };
  return readWorkspacesFile(file, name, {}, defaults, false).map((w) => w.keyVariable!);
}

/**
 * Every `CONVO_MIRROR_*` variable convo-mirror reads: the settings of {@link CONFIG_FIELDS} in
 * table order, then {@link OTHER_KNOWN_VARIABLES}, then `keyVariables` (a workspaces file's
 * `api_key_env` names) that have the prefix. For the misspelt-variable warning.
 */
export function knownVariables(keyVariables: readonly string[] = []): string[] {
  const all = [...Object.values(CONFIG_FIELDS).map((d) => d.env), ...OTHER_KNOWN_VARIABLES, ...keyVariables];
  return [...new Set(all.filter((n) => n.startsWith('CONVO_MIRROR_')))];
}

/**
 * Builds the configuration: flag, else environment variable, else default; validates each value;
 * then resolves the workspaces ({@link Config.workspaces}): from the workspaces file (read here,
 * once), else one per UUID of the account-id list, else the key's own workspace. `accountId`,
 * `baseUrl` and `apiKey` are then those of the first workspace.
 *
 * @param env - usually `process.env`; the only environment read, the workspaces' key variables included
 * @param flags - values from the command line; they win over `env`
 * @throws {@link ConfigError} naming the variable (and flag) of the first missing or malformed
 *   value; for the workspaces file, naming the file and the entry (`[1].base_url`), or the variable
 *   an entry names for its key when it is unset or empty. No error shows a key.
 */
export function loadConfig(env: NodeJS.ProcessEnv, flags: ConfigFlags = {}, opts: LoadConfigOptions = {}): Config {
  const needsApi = opts.needsApi ?? true;
  // With a workspaces file, each entry names its key (and may carry its base URL).
  const viaFile = rawOf('workspacesFile', env, flags).raw !== undefined;
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(CONFIG_FIELDS) as FieldKey[]) {
    out[key] = fieldValue(key, env, flags, needsApi && !viaFile && (key === 'baseUrl' || key === 'apiKey'));
  }
  const workspaces = resolveWorkspaces(out, env, flags, needsApi);
  if (out.pruneMirror === true && (out.retention as RetentionPolicy | undefined)?.streams.messages === undefined) {
    const given = flags.pruneMirror !== undefined ? flagName(CONFIG_FIELDS.pruneMirror) : CONFIG_FIELDS.pruneMirror.env;
    throw new ConfigError(given, `needs a retention policy that limits messages (CONVO_MIRROR_RETENTION, e.g. 400d or messages=400d): it expires messages by that limit`);
  }
  const first = workspaces[0]!;
  return Object.freeze({ ...out, accountId: first.accountId, baseUrl: first.baseUrl, apiKey: first.apiKey, workspaces: Object.freeze(workspaces) }) as unknown as Config;
}

/**
 * The setting that holds a workspace's base URL, for messages: `CONVO_MIRROR_BASE_URL`, or with a
 * workspaces file, the file and the workspace (whose entry's `base_url` wins over the variable).
 */
export function baseUrlSettingOf(config: Pick<Config, 'workspacesFile'>, workspace: Pick<Workspace, 'accountId'>): string {
  if (config.workspacesFile === undefined) return CONFIG_FIELDS.baseUrl.env;
  return `${CONFIG_FIELDS.workspacesFile.env} (${config.workspacesFile}, workspace ${workspace.accountId ?? 'default'}: its base_url, else ${CONFIG_FIELDS.baseUrl.env})`;
}

/** A frozen {@link Workspace} whose `JSON.stringify` (pino's too) shows the key as `[redacted]`. */
function workspaceOf(w: Workspace): Workspace {
  const shown = { ...w, apiKey: w.apiKey === undefined ? undefined : '[redacted]' };
  return Object.freeze(Object.defineProperty({ ...w }, 'toJSON', { value: () => shown, enumerable: false }));
}

/**
 * The workspaces of the validated fields `out`: the file's, else the account-id list's, else the
 * key's own workspace.
 * @throws {@link ConfigError} when both the account-id list and a workspaces file are given
 */
function resolveWorkspaces(out: Record<string, unknown>, env: NodeJS.ProcessEnv, flags: ConfigFlags, needsApi: boolean): Workspace[] {
  const ids = out['accountId'] as string[] | undefined;
  const file = out['workspacesFile'] as string | undefined;
  const defaults = { baseUrl: out['baseUrl'] as string | undefined, schedule: out['schedule'] as string, fullSchedule: out['fullSchedule'] as string };
  // Commands that make no API call (status, verify, enqueue...) never need the file: one that is
  // not mounted where they run must not stop them.
  if (file !== undefined && needsApi) {
    const fileName = rawOf('workspacesFile', env, flags).name;
    const idsName = rawOf('accountId', env, flags).name;
    const fileFromFlag = flags.workspacesFile !== undefined;
    const idsFromFlag = flags.accountId !== undefined;
    // Given in different places, the command line wins over the environment; given together, refused.
    if (ids === undefined || (fileFromFlag && !idsFromFlag)) return readWorkspacesFile(file, fileName, env, defaults, needsApi);
    if (!idsFromFlag || fileFromFlag) {
      throw new ConfigError(fileName, `cannot be combined with ${idsName}: list every workspace (account_id) in the file, or give only the account ids`);
    }
  }
  const apiKey = out['apiKey'] as string | undefined;
  return (ids ?? [undefined]).map((accountId) => workspaceOf({ accountId, apiKey, ...defaults }));
}

/**
 * The account ids a workspaces file lists, in order, for commands that only need to name a
 * workspace (`enqueue`): the file is read and validated, but no key variable is required.
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_WORKSPACES, the file and the entry, as {@link loadConfig}
 */
export function workspacesFileAccounts(config: Pick<Config, 'workspacesFile' | 'baseUrl' | 'schedule' | 'fullSchedule'>): string[] {
  if (config.workspacesFile === undefined) return [];
  const defaults = { baseUrl: config.baseUrl, schedule: config.schedule, fullSchedule: config.fullSchedule };
  return readWorkspacesFile(config.workspacesFile, CONFIG_FIELDS.workspacesFile.env, {}, defaults, false).map((w) => w.accountId!);
}

/** One entry of the workspaces file, as written (snake_case, as in `config/workspaces.example.json`). */
interface WorkspaceEntry {
  account_id: string;
  base_url?: string | undefined;
  api_key_env: string;
  schedule?: string | undefined;
  full_schedule?: string | undefined;
}

/** The workspaces file: a non-empty JSON list of entries; unknown keys refused. */
function workspacesFileSchema(): z.ZodType<WorkspaceEntry[]> {
  const entry = z.strictObject({
    account_id: uuid,
    base_url: (CONFIG_FIELDS.baseUrl.schema as z.ZodType<string>).optional(),
    api_key_env: z
      .string({ error: 'must be the name of the environment variable holding the key, e.g. "ACME_API_KEY"' })
      .regex(/^[A-Z_][A-Z0-9_]{0,127}$/, 'must be the name of an environment variable (upper-case letters, digits, _) holding the key, never the key itself'),
    schedule: cron().optional(),
    full_schedule: cron().optional(),
  });
  return z.array(entry, { error: 'must be a JSON list of workspaces' }).min(1, 'must list at least one workspace');
}

/**
 * Reads and validates the workspaces file at `file` (once), then each entry's key from the
 * variable it names.
 *
 * @param name - the variable or flag that named the file, for errors
 * @throws {@link ConfigError} naming `name`, the file and the entry (`[index].field`) for an
 *   unreadable file, bad JSON, a bad or duplicate entry, or an entry without base URL; naming the
 *   key's variable (and the entry) when it is unset, empty or malformed. Never shows a key, nor the
 *   file's text.
 */
function readWorkspacesFile(
  file: string,
  name: string,
  env: NodeJS.ProcessEnv,
  defaults: { baseUrl: string | undefined; schedule: string; fullSchedule: string },
  needsApi: boolean,
): Workspace[] {
  const fail = (what: string): never => {
    throw new ConfigError(name, `${file}: ${what}`);
  };
  let text = '';
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    fail(`cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
  }
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    // V8's message quotes the text: keep only the position.
    const at = /position (\d+)/.exec((err as Error).message);
    fail(`is not valid JSON${at ? ` (at position ${at[1]})` : ''}`);
  }
  const parsed = workspacesFileSchema().safeParse(data);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const where = issue.path.map((p) => (typeof p === 'number' ? `[${p}]` : `.${String(p)}`)).join('');
    fail(`${where ? `${where}: ` : ''}${issue.message}`);
  }
  const entries = parsed.data!;
  const seen = new Map<string, number>();
  return entries.map((e, i) => {
    const dup = seen.get(e.account_id.toLowerCase());
    if (dup !== undefined) fail(`[${i}].account_id: ${e.account_id} is listed twice (also at [${dup}]): name each workspace once`);
    seen.set(e.account_id.toLowerCase(), i);
    const entry = `workspace ${e.account_id} ([${i}] of ${file})`;
    const baseUrl = e.base_url ?? defaults.baseUrl;
    if (baseUrl === undefined && needsApi) fail(`[${i}]: has no base_url and ${CONFIG_FIELDS.baseUrl.env} is not set`);
    return workspaceOf({
      accountId: e.account_id,
      baseUrl,
      apiKey: keyOf(e.api_key_env, env, entry, needsApi),
      keyVariable: e.api_key_env,
      schedule: e.schedule ?? defaults.schedule,
      fullSchedule: e.full_schedule ?? defaults.fullSchedule,
    });
  });
}

/**
 * The API key held by the variable `variable`, validated like `CONVO_MIRROR_API_KEY`.
 * @throws {@link ConfigError} naming `variable` and `entry` when it is unset or empty (and
 *   `required`) or malformed; never shows the value
 */
function keyOf(variable: string, env: NodeJS.ProcessEnv, entry: string, required: boolean): string | undefined {
  const raw = env[variable];
  if (raw === undefined || raw.trim() === '') {
    if (!required) return undefined;
    throw new ConfigError(variable, `is not set or empty: it must hold the API key of ${entry}`);
  }
  const parsed = CONFIG_FIELDS.apiKey.schema.safeParse(raw);
  if (!parsed.success) throw new ConfigError(variable, `${parsed.error.issues[0]?.message ?? 'is invalid'} (the API key of ${entry})`);
  return parsed.data as string;
}
