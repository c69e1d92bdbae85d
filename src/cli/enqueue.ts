/**
 * `convo-mirror enqueue`: on-demand jobs for the daemon (named conversations, or a workspace sync);
 * prints their ids, and with `--wait` each outcome.
 */
import type { Command } from 'commander';
import { loadConfig, workspacesFileAccounts, type Config } from '../../config/index.js';
import { enqueueJobs, type JobOutcome } from '../../jobs/admin.js';
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
 * The workspace the jobs are for: `--account` (a UUID), else the only configured one (`default`
 * without an account id).
 *
 * @throws {@link ConfigError} naming `--account` when it is not a UUID, or when it is missing and
 *   several workspaces are configured (the account-id list, or the workspaces file, read for its
 *   account ids only); the file's own errors
 */
export function accountFor(config: Config, account: string | undefined): string {
  if (account !== undefined) {
    if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(account.trim())) throw new ConfigError('--account', `must be a workspace's account id, a UUID (got ${JSON.stringify(account).slice(0, 60)})`);
    return account.trim();
  }
  if (config.workspacesFile !== undefined) {
    const ids = workspacesFileAccounts(config);
    if (ids.length === 1) return ids[0]!;
    throw new ConfigError('--account', `is required: CONVO_MIRROR_WORKSPACES lists ${ids.length} workspaces (${ids.join(', ')})`);
  }
  if (config.workspaces.length > 1) throw new ConfigError('--account', `is required: ${config.workspaces.length} workspaces are configured (${config.workspaces.map((w) => w.accountId).join(', ')})`);
  return config.workspaces[0]?.accountId ?? DEFAULT_ACCOUNT;
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
