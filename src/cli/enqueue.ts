/**
 * `convo-mirror enqueue`: on-demand jobs for the daemon (named conversations, or a workspace sync);
 * prints their ids, and with `--wait` each outcome.
 */
import type { Command } from 'commander';
import { loadConfig, type Config } from '../../config/index.js';
import { enqueueJobs, type JobOutcome } from '../../jobs/admin.js';
import { ConfigError } from '../errors.js';
import { EXIT, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, conversationIdsFrom, queueSettings } from './flags.js';

/** What to enqueue, from the command line. */
interface EnqueueRequest {
  conversationIds?: string[] | undefined;
  full: boolean;
  wait: boolean;
  /** With `wait`, give up after this long, ms. */
  timeoutMs: number;
}

/** Adds the jobs, prints their ids, optionally waits for their outcome; returns the exit code. */
async function enqueue(config: Config, o: EnqueueRequest): Promise<number> {
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
    .option('--full', 'full refresh: re-read every page')
    .option('--wait', 'wait until the jobs finish; exit 0 if all completed, 1 otherwise')
    .option('--timeout <ms>', 'with --wait, give up after this long (ms)', '600000');
  addConfigFlags(cmd, 'enqueue').action((o) =>
    settle(setExit, async () => {
      const config = loadConfig(process.env, configFlagsOf(o, 'enqueue'), { needsApi: false });
      const timeoutMs = timeoutFrom(o.timeout);
      return enqueue(config, { conversationIds: conversationIdsFrom(o.conversation), full: o.full === true, wait: o.wait === true, timeoutMs });
    }),
  );
}
