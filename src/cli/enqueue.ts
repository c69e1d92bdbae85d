/**
 * `convo-mirror enqueue`: on-demand jobs for the daemon (named conversations, or a workspace sync);
 * prints their ids, and with `--wait` each outcome.
 */
import type { Command } from 'commander';
import { loadConfig, workspacesFileAccounts, type Config } from '../../config/index.js';
import type { JobOutcome } from '../../jobs/admin.js';
import { ConfigError } from '../errors.js';
import { DEFAULT_ACCOUNT } from '../store/mirror.js';
import { EXIT, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, conversationIdsFrom, queueSettings, requireBullmq } from './flags.js';

/** What to enqueue, from the command line. */
interface EnqueueRequest {
  /** The workspace's account id (`default` without `X-Account-Id`). */
  accountId: string;
  conversationIds?: string[] | undefined;
  full: boolean;
  wait: boolean;
  /** With `wait`, give up after this long, ms. */
  timeoutMs: number;
}

/** Adds the jobs, prints their ids, optionally waits for their outcome; returns the exit code. */
async function enqueue(config: Config, o: EnqueueRequest): Promise<number> {
  const { enqueueJobs } = await import('../../jobs/admin.js'); // the queue's libraries load only here
  const ok = await enqueueJobs(queueSettings(config), {
    accountId: o.accountId,
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
    .description('Queue on-demand jobs for the daemon: named conversations, or a workspace sync; print their ids')
    .option('--conversation <id...>', 'conversations to sync now (repeatable); without it, the whole workspace')
    .option('--account <id>', 'the workspace (its account id) the jobs are for; needed when several are configured')
    .option('--full', 'full refresh: re-read every page')
    .option('--wait', 'wait until the jobs finish; exit 0 if all completed, 1 otherwise')
    .option('--timeout <ms>', 'with --wait, give up after this long (ms)', '600000');
  addConfigFlags(cmd, 'enqueue').action((o) =>
    settle(setExit, async () => {
      const config = loadConfig(process.env, configFlagsOf(o, 'enqueue'), { needsApi: false });
      requireBullmq(config, 'enqueue');
      const timeoutMs = timeoutFrom(o.timeout);
      return enqueue(config, { accountId: accountFor(config, o.account as string | undefined), conversationIds: conversationIdsFrom(o.conversation), full: o.full === true, wait: o.wait === true, timeoutMs });
    }),
  );
}
