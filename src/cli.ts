#!/usr/bin/env node
/**
 * convo-mirror command line (commander): a thin shell over src/ (design: src/cli.ts).
 *
 * Exit codes: 0 all synced; 1 some conversations failed after retries (each named on stderr);
 * 2 configuration or authentication error (nothing retried; the message says what to fix).
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { Command, Option } from 'commander';
import type { Logger } from 'pino';
import { loadConfig, type Config, type ConfigFlags } from '../config/index.js';
import { apiClientFromConfig } from './api/client.js';
import { Mirror, DEFAULT_ACCOUNT } from './store/mirror.js';
import { runSync, sweepInterruptedRuns, type RunSummary } from './run/index.js';
import { newProgress } from './sync/types.js';
import { LIST_FAILURE_ID } from './sync/workspace.js';
import { createLogger } from './logger.js';
import { startProgress } from './progress.js';
import { systemClock } from './clock.js';
import { AuthError, ConfigError, MirrorUnusableError, RunError, StoreError, describeError } from './errors.js';
import { assertSafeExportDir, verifyExports } from './export/exporter.js';
import { fileModes } from './private-fs.js';
import { FakeWorkspace, startFakeApi } from './fake-api/index.js';
import { runDaemon } from '../jobs/daemon.js';
import { enqueueJobs, queueStatus, retryFailed, type JobOutcome, type QueueStatus } from '../jobs/admin.js';

/** Exit codes of every command. */
export const EXIT = { OK: 0, FAILURES: 1, CONFIG: 2, INTERRUPTED: 130 } as const;

/** Account id the demo's fake workspace requires in `X-Account-Id` (fixed, so re-runs match). */
export const DEMO_ACCOUNT_ID = '0b7e6d52-4c1f-4e8a-9d3b-5a2f1c8e7d60';

const isTTY = () => process.stderr.isTTY === true;

/** Adds the shared configuration flags (see config/ for env names and defaults). */
function withConfigFlags(cmd: Command, api: boolean): Command {
  if (api) {
    cmd
      .option('--base-url <url>', 'API base URL, the spec\'s {base_url} (env CONVO_MIRROR_BASE_URL)')
      .option('--api-key <key>', 'API key sent as X-Api-Key (env CONVO_MIRROR_API_KEY; prefer the env: flags show in ps)')
      .option('--account-id <uuid>', 'workspace sent as X-Account-Id (env CONVO_MIRROR_ACCOUNT_ID)')
      .option('--concurrency <n>', 'conversations in flight (env CONVO_MIRROR_CONCURRENCY, default 4)')
      .option('--max-rps <n>', 'requests per second cap for the process, 0 = none (env CONVO_MIRROR_MAX_RPS, default 10)')
      .option('--request-timeout <ms>', 'per-request timeout in ms (env CONVO_MIRROR_REQUEST_TIMEOUT_MS, default 30000)')
      .option('--max-retries <n>', 'retries per request for transient failures (env CONVO_MIRROR_MAX_RETRIES, default 6)')
      .option('--change-field <field>', 'change signal of incremental syncs: auto, none or a field name (env CONVO_MIRROR_CHANGE_FIELD, default auto)')
      .option('--max-response-bytes <n>', 'largest API response read, bytes; larger ones fail that conversation (env CONVO_MIRROR_MAX_RESPONSE_BYTES, default 33554432 = 32 MiB)')
      .option('--group-readable', 'create files 0640 and directories 0750 instead of 0600 and 0700 (env CONVO_MIRROR_GROUP_READABLE, default false)');
  } else {
    cmd.option('--account-id <uuid>', 'workspace (env CONVO_MIRROR_ACCOUNT_ID)');
  }
  return cmd
    .option('--db <path>', 'SQLite mirror (env CONVO_MIRROR_DB, default data/mirror.sqlite)')
    .option('--export-dir <dir>', 'JSONL exports (env CONVO_MIRROR_EXPORT_DIR, default data/exports)')
    .option('--log-level <level>', 'fatal|error|warn|info|debug|trace|silent (env LOG_LEVEL, default info)');
}

/** Adds the queue flags (Redis, prefix, job policy) and, for the daemon, the schedule flags. */
function withQueueFlags(cmd: Command, daemon: boolean): Command {
  cmd
    .option('--redis-url <url>', 'Redis of the job queue (env REDIS_URL, default redis://127.0.0.1:6379)')
    .option('--queue-prefix <prefix>', 'BullMQ key prefix, one per mirror (env CONVO_MIRROR_QUEUE_PREFIX, default convo-mirror)')
    .option('--job-attempts <n>', 'attempts before a job is kept as failed (env CONVO_MIRROR_JOB_ATTEMPTS, default 5)');
  if (daemon) {
    cmd
      .option('--schedule <cron>', 'regular sync (env CONVO_MIRROR_SCHEDULE, default "*/15 * * * *")')
      .option('--full-schedule <cron>', 'full refresh (env CONVO_MIRROR_FULL_SCHEDULE, default "0 3 * * *")')
      .option('--tz <zone>', 'time zone of the crons (env CONVO_MIRROR_TZ, default UTC)')
      .option('--shutdown-timeout <ms>', 'grace period for running jobs on SIGTERM/SIGINT, ms (env CONVO_MIRROR_SHUTDOWN_TIMEOUT_MS, default 30000)')
      .option('--job-lock <ms>', 'job lock; a dead worker\'s job is picked up again after about this long (env CONVO_MIRROR_JOB_LOCK_MS, default 30000)');
  }
  return cmd;
}

function flagsOf(o: Record<string, unknown>): ConfigFlags {
  return {
    redisUrl: o.redisUrl as string | undefined,
    queuePrefix: o.queuePrefix as string | undefined,
    jobAttempts: o.jobAttempts as string | undefined,
    schedule: o.schedule as string | undefined,
    fullSchedule: o.fullSchedule as string | undefined,
    tz: o.tz as string | undefined,
    shutdownTimeoutMs: o.shutdownTimeout as string | undefined,
    jobLockMs: o.jobLock as string | undefined,
    changeField: o.changeField as string | undefined,
    maxResponseBytes: o.maxResponseBytes as string | undefined,
    groupReadable: o.groupReadable as boolean | undefined,
    baseUrl: o.baseUrl as string | undefined,
    apiKey: o.apiKey as string | undefined,
    accountId: o.accountId as string | undefined,
    db: o.db as string | undefined,
    exportDir: o.exportDir as string | undefined,
    concurrency: o.concurrency as string | undefined,
    maxRps: o.maxRps as string | undefined,
    requestTimeoutMs: o.requestTimeout as string | undefined,
    maxRetries: o.maxRetries as string | undefined,
    logLevel: o.logLevel as string | undefined,
  };
}

/**
 * Conversation ids given on the command line: each must be non-empty and usable as one path
 * segment (`.` and `..` would be normalized out of `/v1/conversations/:id/messages`).
 *
 * @throws {@link ConfigError} naming `--conversation` and the id
 */
export function conversationIdsFrom(ids: string[] | undefined): string[] | undefined {
  if (ids === undefined) return undefined;
  for (const id of ids) {
    if (id.trim() === '') throw new ConfigError('--conversation', 'must not be empty');
    if (id === '.' || id === '..') throw new ConfigError('--conversation', `${JSON.stringify(id)} is not a conversation id`);
  }
  return ids;
}

/** Prints a one-line error to stderr and sets the exit code. */
function fail(code: number, message: string): number {
  process.stderr.write(`convo-mirror: ${message}\n`);
  return code;
}

/** Maps an error to its exit code and one-line message (after the run's summary, if it has one). */
function exitFor(err: unknown): number {
  if (err instanceof RunError) {
    const s = err.summary as RunSummary;
    printSummary(s, false);
    reportFailures(s);
    // Already named among the failures (a conversation list that ran past its own total): once is enough.
    if (s.failures.some((f) => f.message === describeError(err.cause)) && !(err.cause instanceof ConfigError || err.cause instanceof AuthError || err.cause instanceof StoreError)) {
      return EXIT.FAILURES;
    }
    return exitFor(err.cause);
  }
  if (err instanceof ConfigError) return fail(EXIT.CONFIG, `configuration error: ${err.message}`);
  if (err instanceof AuthError) return fail(EXIT.CONFIG, `authentication error: ${err.message}`);
  if (err instanceof StoreError) return fail(EXIT.CONFIG, `mirror error: ${err.message}`);
  return fail(EXIT.FAILURES, `error: ${describeError(err)}`);
}

/** Failpoints of the read-only commands' computations, for tests. */
export interface SnapshotHooks {
  /**
   * Called after each computation on a read-only open, before {@link Mirror.snapshotChanged} is
   * asked (attempt 1, 2, 3).
   */
  onSnapshot?: (attempt: number, mirror: Mirror) => void;
}

/** What `status` reports from the mirror (the queue is read apart). */
export interface StatusResult {
  counts: Record<string, number>;
  runs: Record<string, unknown>[];
  failures: Record<string, unknown>[];
}

/** What `verify` found. */
export interface VerifyResult {
  /** Absolute path of the mirror. */
  file: string;
  /** quick_check problems, and the database error that stopped the export check, if any. */
  dbProblems: string[];
  /** Export files that do not match their records. */
  problems: { path: string; problem: string; detail?: string | undefined }[];
  /** Published files and lines recorded. */
  files: { n: number; l: number };
}

/** Computes {@link StatusResult} from a read-only mirror. */
export function statusOf(mirror: Mirror): StatusResult {
  return { counts: mirror.counts(), runs: mirror.lastRuns(5), failures: mirror.lastRunFailures() };
}

/** Computes {@link VerifyResult}: the database first (the export records are only as good as it is), then the exports. */
export function verifyOf(mirror: Mirror, exportDir: string): VerifyResult {
  const dbProblems = mirror.quickCheck();
  let problems: VerifyResult['problems'] = [];
  let files = { n: 0, l: 0 };
  try {
    problems = verifyExports(mirror, exportDir);
    const totals = mirror.exportTotals();
    files = { n: totals.files, l: totals.lines };
  } catch (err) {
    // The mirror's own reads turn a damaged page into MirrorUnusableError: a finding, not a crash.
    if (!(err instanceof MirrorUnusableError)) throw err;
    dbProblems.push(describeError(err.cause));
  }
  return { file: mirror.file, dbProblems, problems, files };
}

/**
 * Computes a read-only command's whole result on an existing mirror with
 * {@link Mirror.readConsistent}: a result read from a file a writer changed meanwhile is thrown
 * away and computed again (at most 3 attempts), so a writer that starts mid-way cannot make a
 * healthy mirror look damaged.
 */
export function readMirrorResult<R>(file: string, compute: (mirror: Mirror) => R, hooks: SnapshotHooks = {}): R {
  return Mirror.readConsistent(file, compute, hooks.onSnapshot ? { onSnapshot: hooks.onSnapshot } : {});
}

/**
 * Runs a read-only command (`status`, `verify`) on an existing mirror, without the writer lock:
 * `compute` builds the whole result on a consistent read-only snapshot ({@link readMirrorResult}),
 * then `print` (after the mirror is closed) writes it and returns the exit code. A missing mirror is
 * a configuration error (exit 2) and is not created.
 */
async function withExistingMirror<R>(
  o: Record<string, unknown>,
  setExit: (code: number) => void,
  compute: (mirror: Mirror, config: Config) => R,
  print: (result: R, config: Config) => number | Promise<number>,
): Promise<void> {
  try {
    const config = loadConfig(process.env, flagsOf(o), { needsApi: false });
    if (!fs.existsSync(config.db)) {
      setExit(fail(EXIT.CONFIG, `no mirror at ${config.db} (CONVO_MIRROR_DB); run convo-mirror sync first`));
      return;
    }
    // Read-only: no lock, no WAL switch, no migration, no file created beside it (an auditor's copy, a backup).
    // The read is synchronous: with a listener installed, Ctrl-C or SIGTERM waits for it to end, so
    // a private copy of the mirror (a -wal with no live writer) is always removed.
    let interrupted: NodeJS.Signals | undefined;
    const onSignal = (sig: NodeJS.Signals) => (interrupted ??= sig);
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    let result: R;
    try {
      result = readMirrorResult(config.db, (mirror) => compute(mirror, config));
    } finally {
      // A signal that came during the synchronous read is delivered on the next turn of the loop.
      await new Promise((resolve) => setImmediate(resolve));
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    }
    if (interrupted) {
      setExit(fail(EXIT.INTERRUPTED, `interrupted by ${interrupted}`));
      return;
    }
    setExit(await print(result, config));
  } catch (err) {
    setExit(exitFor(err));
  }
}

interface SyncCommandOptions {
  config: Config;
  conversationIds?: string[] | undefined;
  full?: boolean;
  json?: boolean;
  /** Extra text to print after the summary (demo). */
  logger?: Logger;
}

/** Runs `sync` with a built config; returns the summary (exit code derived by the caller). */
async function doSync(opts: SyncCommandOptions): Promise<RunSummary> {
  const { config } = opts;
  const tty = isTTY() && !opts.json;
  // On a terminal the bar and the summary tell the story: info lines would break the bar.
  const level = tty && config.logLevel === 'info' ? 'warn' : config.logLevel;
  const logger = opts.logger ?? createLogger({ level, pretty: tty });
  const abort = new AbortController();
  const onSignal = (sig: NodeJS.Signals) => {
    logger.warn({ signal: sig }, 'stopping: no new conversations; re-run to resume from the checkpoints');
    abort.abort(new Error(`interrupted by ${sig}`));
  };
  // Before any request or file: an export directory that would hold the mirror (or is /, or a file).
  assertSafeExportDir(config.exportDir, config.db);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const mirror = Mirror.open(config.db, { modes: fileModes(config.groupReadable) });
  // We hold the writer lock: runs still 'running' belong to a process that died.
  try {
    sweepInterruptedRuns(mirror, logger);
  } catch (err) {
    mirror.close();
    throw err;
  }
  const api = apiClientFromConfig(config, { logger, signal: abort.signal });
  const progress = newProgress();
  const stop = startProgress({ progress, stats: api.stats, logger, tty });
  try {
    return await runSync(
      { api, mirror, logger, clock: systemClock },
      {
        accountId: config.accountId ?? DEFAULT_ACCOUNT,
        concurrency: config.concurrency,
        conversationIds: opts.conversationIds,
        full: opts.full ?? false,
        changeFieldSetting: config.changeField,
        exportDir: config.exportDir,
        modes: fileModes(config.groupReadable),
        progress,
        signal: abort.signal,
      },
    );
  } finally {
    stop();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await api.close();
    mirror.close();
  }
}

function printSummary(s: RunSummary, json: boolean): void {
  if (json) {
    process.stdout.write(JSON.stringify(s, null, 2) + '\n');
    return;
  }
  const c = s.conversations;
  const m = s.messages;
  const lines = [
    `run ${s.runId} (${s.scope === 'conversations' ? 'named conversations' : 'workspace'}, ${s.refresh === 'full' ? 'full refresh' : 'incremental'}) ${s.status} in ${(s.durationMs / 1000).toFixed(1)} s`,
    `  conversations: ${c.synced} synced, ${c.deleted} tombstoned, ${c.failed} failed` +
      (c.notSynced ? `, ${c.notSynced} not synced (the run stopped early)` : '') +
      (s.scope === 'workspace' ? ` (${c.listed} listed in ${s.listPasses} pass${s.listPasses === 1 ? '' : 'es'}${s.listConfirmed ? '' : ', listing NOT confirmed complete'})` : ''),
    `  messages: ${m.served} served; ${m.inserted} inserted, ${m.updated} updated, ${m.deleted} tombstoned` + (m.restarts ? `; ${m.restarts} crawl restarts` : ''),
    `  requests: ${s.requests} (a full crawl needs at least ${s.minimumRequests}), ${s.retries} retries, ${s.rateLimited} answered 429`,
    s.export.error !== undefined
      ? `  exports: publication FAILED (${s.export.error}); ` +
        `${s.export.lines ? `${s.export.lines} lines in ${s.export.files} files were published before it; ` : ''}` +
        'every committed change stays in the change log and the next run publishes it'
      : s.export.lines === 0
        ? `  exports: no new lines: nothing changed since the last publication (watermark ${s.export.watermark})`
        : `  exports: ${s.export.lines} new lines in ${s.export.files} files (watermark ${s.export.watermark})`,
  ];
  process.stdout.write(lines.join('\n') + '\n');
}

function reportFailures(s: RunSummary): void {
  for (const f of s.failures) {
    const what = f.id === LIST_FAILURE_ID ? 'conversation list' : `conversation ${f.id}`;
    process.stderr.write(`failed: ${what}: [${f.code}] ${f.message}\n`);
  }
}

function formatQueueStatus(q: QueueStatus): string[] {
  if ('error' in q) return [`queue: unavailable (${q.error})`];
  const out = [`queue ${q.prefix} on ${q.redis}: ` + Object.entries(q.counts).map(([k, v]) => `${k} ${v}`).join(', ')];
  out.push('schedulers:');
  if (q.schedulers.length === 0) out.push('  none (start convo-mirror daemon)');
  for (const s of q.schedulers) out.push(`  ${s.id}: ${s.pattern} (${s.tz ?? 'UTC'}), next run ${s.next ?? 'unknown'}`);
  if (q.failed.length) {
    out.push('failed jobs (dead letter; convo-mirror retry-failed re-queues them):');
    for (const f of q.failed) out.push(`  ${f.id} ${f.name}${f.conversation_id ? ` ${f.conversation_id}` : ''} after ${f.attempts} attempts at ${f.failed_at}: ${f.reason}`);
  }
  return out;
}

/** `enqueue`: adds jobs, prints ids, optionally waits for their outcome. */
async function enqueueCommand(config: Config, o: { conversationIds?: string[] | undefined; full: boolean; wait: boolean; timeoutMs: number }): Promise<number> {
  const ok = await enqueueJobs(queueSettings(config), {
    conversationIds: o.conversationIds,
    full: o.full,
    policy: { attempts: config.jobAttempts },
    onQueued: (ids) => {
      for (const id of ids) process.stdout.write(`${id}\n`);
    },
    ...(o.wait ? { wait: { timeoutMs: o.timeoutMs, onOutcome: (j: JobOutcome) => void process.stderr.write(`job ${j.id}: ${j.message}\n`) } } : {}),
  });
  return ok ? EXIT.OK : EXIT.FAILURES;
}

/** Where the queue lives, from the configuration. */
const queueSettings = (config: Config) => ({ redisUrl: config.redisUrl, prefix: config.queuePrefix });

/** Builds the commander program. `run` resolves the process exit code. */
export function buildProgram(setExit: (code: number) => void): Command {
  const program = new Command('convo-mirror')
    .description('Mirror a customer-support system\'s conversation history into SQLite and JSONL change exports.')
    .showHelpAfterError()
    .exitOverride((err) => {
      // commander's own usage errors (unknown option, missing argument): exit 2 like config errors.
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.exitCode === 0) throw err;
      throw Object.assign(err, { exitCode: EXIT.CONFIG });
    });

  withConfigFlags(
    program
      .command('sync')
      .description('Incremental sync of the whole workspace (new messages only; --full re-reads every page), or only --conversation IDs; then publish exports')
      .option('--conversation <id...>', 'only these conversations (repeatable)')
      .option('--full', 'full refresh: re-read every page of every conversation (catches edits and deletions anywhere)')
      .option('--json', 'print the run summary as JSON'),
    true,
  ).action(async (o) => {
    try {
      const config = loadConfig(process.env, flagsOf(o));
      const s = await doSync({ config, conversationIds: conversationIdsFrom(o.conversation), full: o.full, json: o.json });
      printSummary(s, o.json === true);
      reportFailures(s);
      setExit(s.status === 'succeeded' ? EXIT.OK : s.status === 'interrupted' ? EXIT.INTERRUPTED : EXIT.FAILURES);
    } catch (err) {
      setExit(exitFor(err));
    }
  });

  withQueueFlags(
    withConfigFlags(
      program
        .command('status')
        .description('Show counts per table, the last runs and their failures, the export watermark, and the job queue (counts, schedulers, failed jobs)')
        .option('--json', 'print as JSON'),
      false,
    ),
    false,
  ).action(async (o) =>
    withExistingMirror(o, setExit, statusOf, async ({ counts, runs, failures }, config) => {
      const queue = await queueStatus(queueSettings(config));
      if (o.json) {
        process.stdout.write(JSON.stringify({ db: config.db, counts, runs, failures, queue }, null, 2) + '\n');
      } else {
        const out: string[] = [`mirror ${config.db}`];
        for (const [k, v] of Object.entries(counts)) out.push(`  ${k.padEnd(26)} ${v}`);
        out.push('last runs:');
        for (const r of runs) {
          out.push(
            `  #${r.id} ${r.scope ?? r.mode}${r.refresh ? ` ${r.refresh}` : ''}${r.trigger ? ` (${r.trigger})` : ''} ${r.status} started ${r.started_at}${r.ended_at ? ` ended ${r.ended_at}` : ''}: ` +
              `${r.conversations_synced} conversations, +${r.messages_inserted} ~${r.messages_updated} -${r.messages_deleted} messages, ` +
              `${r.requests} requests, ${r.retries} retries, ${r.conversations_failed} failed, ${r.export_lines} export lines` +
              (r.error ? `; error: ${r.error}` : ''),
          );
        }
        if (failures.length) {
          out.push('failures of the last run:');
          for (const f of failures) out.push(`  ${f.conversation_id}: [${f.code}] ${f.message}`);
        }
        out.push(...formatQueueStatus(queue));
        process.stdout.write(out.join('\n') + '\n');
      }
      return EXIT.OK;
    }),
  );

  withConfigFlags(
    program
      .command('verify')
      .description('Check the mirror database (PRAGMA quick_check), the manifest, and every published export file against its recorded size, line count and SHA-256; report unlisted files'),
    false,
  ).action((o) =>
    withExistingMirror(
      o,
      setExit,
      (mirror, config) => verifyOf(mirror, config.exportDir),
      ({ file, dbProblems, problems, files }, config) => {
        for (const p of dbProblems) process.stderr.write(`problem: database ${file}: ${p}\n`);
        for (const p of problems) process.stderr.write(`problem: ${p.path}: ${p.problem}${p.detail ? ` (${p.detail})` : ''}\n`);
        const n = dbProblems.length + problems.length;
        process.stdout.write(
          n === 0
            ? `exports intact: ${files.n} files, ${files.l} lines; database: quick_check ok\n`
            : `${n} problem${n === 1 ? '' : 's'}: ${dbProblems.length ? `the database ${file} is damaged (restore a backup, or rebuild with sync --full into a new file)` : 'database: quick_check ok'}` +
                `${problems.length ? `; ${problems.length} in ${config.exportDir}` : ''}\n`,
        );
        return n === 0 ? EXIT.OK : EXIT.FAILURES;
      },
    ),
  );

  withQueueFlags(
    withConfigFlags(
      program
        .command('daemon')
        .description('Run the sync daemon: job schedulers (regular and full), a worker for on-demand and scheduled jobs, graceful shutdown on SIGTERM/SIGINT'),
      true,
    ),
    true,
  ).action(async (o) => {
    try {
      const config = loadConfig(process.env, flagsOf(o));
      const logger = createLogger({ level: config.logLevel, pretty: isTTY() });
      let stopSignal: NodeJS.Signals | undefined;
      const stop = new Promise<void>((resolve) => {
        const onSignal = (sig: NodeJS.Signals) => {
          stopSignal = sig;
          resolve();
        };
        process.once('SIGTERM', onSignal);
        process.once('SIGINT', onSignal);
      });
      const exit = await runDaemon({ config, logger, stop });
      logger.info({ signal: stopSignal, shutdown_ms: exit.shutdownMs, forced: exit.forced }, 'exiting');
      setExit(exit.fatal ? exitFor(exit.fatal) : EXIT.OK);
    } catch (err) {
      setExit(exitFor(err));
    }
  });

  withQueueFlags(
    program
      .command('enqueue')
      .description('Queue on-demand jobs for the daemon: named conversations, or a workspace sync; print their ids')
      .option('--conversation <id...>', 'conversations to sync now (repeatable); without it, the whole workspace')
      .option('--full', 'full refresh: re-read every page')
      .option('--wait', 'wait until the jobs finish; exit 0 if all completed, 1 otherwise')
      .option('--timeout <ms>', 'with --wait, give up after this long (ms)', '600000')
      .option('--log-level <level>', 'log level (env LOG_LEVEL, default info)'),
    false,
  ).action(async (o) => {
    try {
      const config = loadConfig(process.env, flagsOf(o), { needsApi: false });
      const timeoutMs = Number(o.timeout);
      if (!Number.isInteger(timeoutMs) || timeoutMs < 1) throw new ConfigError('--timeout', `must be a whole number of ms (got ${JSON.stringify(String(o.timeout))})`);
      setExit(await enqueueCommand(config, { conversationIds: conversationIdsFrom(o.conversation), full: o.full === true, wait: o.wait === true, timeoutMs }));
    } catch (err) {
      setExit(exitFor(err));
    }
  });

  withQueueFlags(
    program.command('retry-failed').description('Re-queue every failed job kept by the queue (the dead letter list shown by status)').option('--log-level <level>', 'log level'),
    false,
  ).action(async (o) => {
    try {
      const config = loadConfig(process.env, flagsOf(o), { needsApi: false });
      const ids = await retryFailed(queueSettings(config));
      process.stdout.write(`re-queued ${ids.length} failed job${ids.length === 1 ? '' : 's'}${ids.length ? `: ${ids.join(', ')}` : ''}\n`);
      setExit(EXIT.OK);
    } catch (err) {
      setExit(exitFor(err));
    }
  });

  program
    .command('fake-api')
    .description('Run the fake support API (seeded workspace) on 127.0.0.1, for trying convo-mirror out')
    .addOption(new Option('--port <n>', 'port').default('4010'))
    .addOption(new Option('--host <host>', 'address to listen on').default('127.0.0.1'))
    .addOption(new Option('--seed <n>', 'random seed of the workspace').default('42'))
    .addOption(new Option('--conversations <n>', 'conversations to generate').default('320'))
    .option('--api-key <key>', 'key the fake accepts (default: env CONVO_MIRROR_API_KEY, else "demo-key")')
    .option('--account-id <uuid>', 'require this X-Account-Id (default: env CONVO_MIRROR_ACCOUNT_ID, else none)')
    .option('--rate-limit <rps>', 'answer 429 (Retry-After, RateLimit-* headers) above this many requests per sliding second (default: no limit)')
    .option('--no-rate-limit-headers', 'with --rate-limit, serve no RateLimit-* headers (clients learn from 429s alone)')
    .action(async (o) => {
      let apiKey: string;
      let rateLimit: { rps: number; headers: boolean } | undefined;
      if (o.rateLimit !== undefined) {
        const rps = Number(o.rateLimit);
        if (!(Number.isFinite(rps) && rps >= 1)) {
          process.stderr.write(`--rate-limit: must be a number of requests per second >= 1, got ${JSON.stringify(o.rateLimit)}\n`);
          setExit(EXIT.CONFIG);
          return;
        }
        rateLimit = { rps, headers: o.rateLimitHeaders !== false };
      }
      let accountId: string | undefined;
      try {
        const config = loadConfig(process.env, { apiKey: o.apiKey, accountId: o.accountId }, { needsApi: false });
        apiKey = config.apiKey ?? 'demo-key';
        accountId = config.accountId;
      } catch (err) {
        setExit(exitFor(err));
        return;
      }
      const workspace = FakeWorkspace.generate({ seed: Number(o.seed), conversations: Number(o.conversations) });
      const fake = await startFakeApi({ workspace, apiKey, ...(accountId ? { accountId } : {}), ...(rateLimit ? { rateLimit } : {}), host: o.host, port: Number(o.port) });
      const t = workspace.totals();
      process.stdout.write(
        `fake API listening on ${fake.url} (${t.conversations} conversations, ${t.messages} messages` +
          `${rateLimit ? `, limited to ${rateLimit.rps} requests/s${rateLimit.headers ? '' : ' without RateLimit headers'}` : ''})\n` +
          `  export CONVO_MIRROR_BASE_URL=${fake.url}  # and CONVO_MIRROR_API_KEY to the key it accepts\n`,
      );
      await new Promise<void>((resolve) => {
        const stop = () => resolve();
        process.once('SIGINT', stop);
        process.once('SIGTERM', stop);
      });
      await fake.close();
      setExit(EXIT.OK);
    });

  program
    .command('demo')
    .description('Start the fake API in-process, sync it into data/demo/, and print a summary checked against the fake')
    .addOption(new Option('--dir <dir>', 'where the demo mirror and exports go').default('data/demo'))
    .addOption(new Option('--seed <n>', 'random seed of the workspace').default('42'))
    .addOption(new Option('--conversations <n>', 'conversations to generate').default('320'))
    .addOption(new Option('--concurrency <n>', 'conversations in flight').default('8'))
    .addOption(new Option('--max-rps <n>', 'request cap (the fake is local, so none by default)').default('0'))
    .option('--log-level <level>', 'log level (env LOG_LEVEL, default info)')
    .action(async (o) => {
      try {
        const workspace = FakeWorkspace.generate({ seed: Number(o.seed), conversations: Number(o.conversations) });
        const apiKey = crypto.randomBytes(16).toString('hex');
        const fake = await startFakeApi({ workspace, apiKey, accountId: DEMO_ACCOUNT_ID });
        try {
          const config = loadConfig(
            {},
            {
              baseUrl: fake.url,
              apiKey,
              accountId: DEMO_ACCOUNT_ID,
              db: path.join(o.dir, 'mirror.sqlite'),
              exportDir: path.join(o.dir, 'exports'),
              concurrency: o.concurrency,
              maxRps: o.maxRps,
              logLevel: loadConfig(process.env, { logLevel: o.logLevel }, { needsApi: false }).logLevel,
            },
          );
          const t = workspace.totals();
          process.stdout.write(`demo: fake API on ${fake.url} serving ${t.conversations} conversations and ${t.messages} messages\n`);
          const s = await doSync({ config });
          printSummary(s, false);
          reportFailures(s);
          const mirror = Mirror.open(config.db, { readonly: true });
          let live: { conversations: number; messages: number };
          try {
            live = mirror.liveCounts(DEMO_ACCOUNT_ID);
          } finally {
            mirror.close();
          }
          const equal = live.conversations === t.conversations && live.messages === t.messages;
          process.stdout.write(
            `\n  fake:   ${t.conversations} conversations, ${t.messages} messages\n` +
              `  mirror: ${live.conversations} conversations, ${live.messages} messages  ${equal ? '(equal)' : '(MISMATCH)'}\n` +
              `  mirror file: ${config.db}   exports: ${config.exportDir}\n` +
              `  try: sqlite3 ${config.db} 'select count(*) from messages'\n`,
          );
          setExit(equal && s.status === 'succeeded' ? EXIT.OK : EXIT.FAILURES);
        } finally {
          await fake.close();
        }
      } catch (err) {
        setExit(exitFor(err));
      }
    });

  return program;
}

/** Entry point: parses argv, runs the command, exits with its code. */
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
