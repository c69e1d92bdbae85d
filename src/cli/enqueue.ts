/**
 * `convo-mirror enqueue`: on-demand jobs for the daemon (named conversations, a workspace sync, or
 * an erasure: `--erase-sender ID` / `--erase-conversation ID` with `--reason TEXT`);
 * prints their ids, and with `--wait` each outcome; a wait that cannot end (no daemon serves the
 * queue, `--timeout`) stops with exit 3, the jobs left queued.
 */
import type { Command } from 'commander';
import { CONFIG_FIELDS, loadConfig, workspacesFileAccounts, type Config } from '../../config/index.js';
import { redisShown } from '../../config/redis-url.js';
import type { JobOutcome, UnfinishedJob } from '../../jobs/admin.js';
import { ConfigError, describeError } from '../errors.js';
import { createLogger } from '../logger.js';
import { DEFAULT_ACCOUNT } from '../store/mirror.js';
import { EXIT, fail, settle, worstExit, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, conversationIdsFrom, queueSettings, requireBullmq } from './flags.js';
import { escapeForTerminal } from '../terminal.js';

/** `--timeout` when not given: 10 minutes, ms. */
export const DEFAULT_WAIT_TIMEOUT_MS = 600_000;

/** What to enqueue, from the command line. */
interface EnqueueRequest {
  /** The workspace's account id (`default` without `X-Account-Id`). */
  accountId: string;
  conversationIds?: string[] | undefined;
  /** An erasure instead of syncs ({@link eraseFlags}). */
  erase?: { kind: 'sender' | 'conversation'; subject: string; reason: string } | undefined;
  full: boolean;
  wait: boolean;
  /** With `wait`, give up after this long, ms. */
  timeoutMs: number;
}

/**
 * Adds the jobs, prints their ids, optionally waits for their outcome; returns the exit code: 0 all
 * completed, 1 any failed, 3 (with a one-line message) the wait stopped early, no worker serving the
 * queue or `--timeout` passed: the jobs stay queued.
 */
async function enqueue(config: Config, o: EnqueueRequest): Promise<number> {
  // The queue's libraries load only here.
  const [{ enqueueJobs }, { jobPolicyOf }] = await Promise.all([import('../../jobs/admin.js'), import('../../jobs/queue.js')]);
  const result = await enqueueJobs(queueSettings(config), {
    accountId: o.accountId,
    conversationIds: o.conversationIds,
    erase: o.erase,
    full: o.full,
    policy: jobPolicyOf(config),
    onQueued: (ids) => {
      for (const id of ids) process.stdout.write(`${escapeForTerminal(id)}\n`);
    },
    // A failed job's reason is whatever the worker's error said: escaped for the terminal.
    ...(o.wait ? { wait: { timeoutMs: o.timeoutMs, onOutcome: (j: JobOutcome) => void process.stderr.write(escapeForTerminal(`job ${j.id}: ${j.message}`) + '\n') } } : {}),
  }).catch((err: unknown) => {
    debugLog(config, err);
    throw err;
  });
  const code = result.ok ? EXIT.OK : EXIT.FAILURES;
  if (!result.unfinished) return code;
  const { reason, jobs } = result.unfinished;
  fail(EXIT.UNFINISHED, reason === 'no-worker' ? noWorkerMessage(config, jobs) : timeoutMessage(o.timeoutMs, jobs));
  return worstExit([code, EXIT.UNFINISHED]);
}

/**
 * Logs at debug level the library's own error behind `err` (its message and code only: ioredis
 * errors carry the command, and AUTH's arguments are the password). The user reads the one line.
 */
function debugLog(config: Config, err: unknown): void {
  const cause = err instanceof Error && err.cause !== undefined ? err.cause : err;
  const code = (cause as { code?: unknown } | undefined)?.code;
  createLogger({ level: config.logLevel }).debug({ error: describeError(cause), ...(typeof code === 'string' ? { code } : {}) }, 'enqueue failed');
}

/** `job 12 (waiting) stays`, `job 12 (waiting) and job 13 (active) stay`. */
function jobsStay(jobs: readonly UnfinishedJob[]): string {
  const named = jobs.map((j) => `job ${j.id} (${j.state})`);
  const list = named.length > 1 ? `${named.slice(0, -1).join(', ')} and ${named.at(-1)!}` : named.join('');
  return `${list} ${named.length > 1 ? 'stay' : 'stays'}`;
}

/**
 * The one line when no worker serves the queue: the prefix, the Redis URL (user and password
 * masked), and what to start; the jobs stay queued.
 */
export function noWorkerMessage(config: Pick<Config, 'queuePrefix' | 'redisUrl'>, jobs: readonly UnfinishedJob[]): string {
  const where = `queue prefix "${config.queuePrefix}" on ${redisShown(config.redisUrl)}`;
  const settings = `${CONFIG_FIELDS.redisUrl.env} and ${CONFIG_FIELDS.queuePrefix.env}`;
  return `no worker serves ${where} (no convo-mirror daemon is running there): ${jobsStay(jobs)} queued; start convo-mirror daemon with the same ${settings} to run them`;
}

/** The one line when `--timeout` passed: each unfinished job with its state; they stay queued. */
export function timeoutMessage(timeoutMs: number, jobs: readonly UnfinishedJob[]): string {
  return `gave up waiting after ${timeoutMs} ms (--timeout): ${jobsStay(jobs)} queued, not finished; convo-mirror status shows the queue`;
}

/**
 * The workspace the jobs are for: `--account`, in its configured spelling, else the only configured
 * one (`default` without an account id). The workspaces are the account-id list's, or the
 * workspaces file's (read for its account ids only).
 *
 * @throws {@link ConfigError} naming `--account` when it is not a configured workspace, or when it
 *   is missing and several are configured; the workspaces file's own errors
 */
export function accountFor(config: Config, account: string | undefined): string {
  const configured = config.workspacesFile !== undefined ? workspacesFileAccounts(config) : config.workspaces.map((w) => w.accountId ?? DEFAULT_ACCOUNT);
  if (account !== undefined) {
    const wanted = account.trim().toLowerCase();
    // The configured spelling, so the job's deduplication key is the one the daemon and webhooks use.
    const found = configured.find((a) => a.toLowerCase() === wanted);
    if (found !== undefined) return found;
    throw new ConfigError('--account', `${JSON.stringify(account).slice(0, 60)} is not a configured workspace (configured: ${configured.join(', ')})`);
  }
  if (configured.length === 1) return configured[0]!;
  throw new ConfigError('--account', `is required: ${configured.length} workspaces are configured (${configured.join(', ')})`);
}

/**
 * The erasure `enqueue` is asked for: `--erase-sender ID` or `--erase-conversation ID` (one of
 * them), with `--reason TEXT` (not blank), and neither `--conversation` nor `--full`; undefined
 * without either flag.
 *
 * @throws {@link ConfigError} naming the flag
 */
export function eraseFlags(o: { eraseSender?: string; eraseConversation?: string; reason?: string; conversation?: unknown; full?: boolean }): EnqueueRequest['erase'] {
  if (o.eraseSender === undefined && o.eraseConversation === undefined) {
    if (o.reason !== undefined) throw new ConfigError('--reason', 'goes with --erase-sender ID or --erase-conversation ID');
    return undefined;
  }
  if (o.eraseSender !== undefined && o.eraseConversation !== undefined) throw new ConfigError('--erase-sender', 'give one of --erase-sender ID and --erase-conversation ID, not both');
  const kind = o.eraseSender !== undefined ? 'sender' : 'conversation';
  if (o.conversation !== undefined || o.full === true) throw new ConfigError(`--erase-${kind}`, 'queues an erasure: it takes neither --conversation nor --full');
  const subject = (o.eraseSender ?? o.eraseConversation)!;
  if (subject.trim() === '') throw new ConfigError(`--erase-${kind}`, 'must not be empty');
  if (o.reason === undefined || o.reason.trim() === '') throw new ConfigError('--reason', 'is required: why the subject is erased (e.g. the ticket reference of the request); the erasure record in the archive carries it');
  return { kind, subject, reason: o.reason };
}

/** `--timeout` in ms. @throws {@link ConfigError} unless a whole number >= 1 */
function timeoutFrom(raw: unknown): number {
  const timeoutMs = Number(raw);
  if (!Number.isInteger(timeoutMs) || timeoutMs < 1) throw new ConfigError('--timeout', `must be a whole number of ms (got ${JSON.stringify(String(raw))})`);
  return timeoutMs;
}

/** Adds `enqueue` to `program`. */
export function addEnqueueCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('enqueue')
    .description('Queue on-demand jobs for the daemon: named conversations, a workspace sync, or an erasure (--erase-sender, --erase-conversation); print their ids')
    .option('--conversation <id...>', 'conversations to sync now (repeatable); without it, the whole workspace')
    .option('--account <id>', 'the workspace (its account id) the jobs are for; needed when several are configured')
    .option('--full', 'full refresh: re-read every page')
    .option('--erase-sender <id>', "queue an erasure of a sender (a customer's or a user's sender id) in every conversation of the workspace, as convo-mirror erase --sender does; needs --reason")
    .option('--erase-conversation <id>', 'queue an erasure of a conversation (its messages and its own object), as convo-mirror erase --conversation does; needs --reason')
    .option('--reason <text>', 'with --erase-sender or --erase-conversation (required): why, e.g. the ticket reference; the erasure record in the archive carries it')
    .option('--wait', 'wait until the jobs finish: exit 0 if all completed, 1 if any failed, 3 if no daemon serves the queue or --timeout passes (the jobs stay queued)')
    .option('--timeout <ms>', `with --wait, give up after this long, ms (default ${DEFAULT_WAIT_TIMEOUT_MS}, 10 minutes)`);
  addConfigFlags(cmd, 'enqueue').action((o) =>
    settle(setExit, async () => {
      const erase = eraseFlags(o as Parameters<typeof eraseFlags>[0]);
      const config = loadConfig(process.env, configFlagsOf(o, 'enqueue'), { needsApi: false });
      requireBullmq(config, 'enqueue');
      const timeoutMs = timeoutFrom(o.timeout ?? DEFAULT_WAIT_TIMEOUT_MS);
      return enqueue(config, { accountId: accountFor(config, o.account as string | undefined), conversationIds: conversationIdsFrom(o.conversation), erase, full: o.full === true, wait: o.wait === true, timeoutMs });
    }),
  );
}
