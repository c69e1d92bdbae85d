/**
 * `convo-mirror check`: the connection check that Airbyte and Singer taps offer. With at most two
 * API requests per workspace (the first page of the conversation list, then the first page of one
 * listed conversation's messages, no retries) it proves that the base URL answers, the key is
 * accepted and the account is reachable; then that the mirror file and the export directory can be
 * written (nothing is created: see src/writable.ts); in BullMQ mode, that Redis answers. One line
 * per check with a mark and the reason; `--json` for scripts. It writes nothing and never shows
 * the key.
 */
import type { Command } from 'commander';
import { CONFIG_FIELDS, baseUrlSettingOf, loadConfig, type Config, type Workspace } from '../../config/index.js';
import { redisShown } from '../../config/redis-url.js';
import { checkClientFromConfig, type ApiClient } from '../api/client.js';
import { AuthError, describeError } from '../errors.js';
import { createLogger } from '../logger.js';
import { DEFAULT_ACCOUNT } from '../store/mirror.js';
import { whyNotWritable } from '../writable.js';
import { EXIT, settle, verdictOf, worstExit, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';

/** One check's outcome. */
export interface CheckOutcome {
  /** What was checked: `api`, `messages`, `mirror`, `exports`, `redis` (with several workspaces, `api <account>`). */
  name: string;
  ok: boolean;
  /** What was found, in words: the reason when it failed. Never a key. */
  detail: string;
  /** The exit code this outcome alone calls for ({@link EXIT}): 0 when ok. */
  code: number;
}

/** The longest a check's request may take, ms (CONVO_MIRROR_REQUEST_TIMEOUT when shorter). */
export const CHECK_TIMEOUT_MS = 10_000;

const passed = (name: string, detail: string): CheckOutcome => ({ name, ok: true, detail, code: EXIT.OK });

/** A failed check: its message and exit code from the error ({@link verdictOf}: 2 for configuration, keys and paths). */
function failed(name: string, err: unknown, keyVariable?: string): CheckOutcome {
  // The line says what failed without the "configuration error:" prefix the exit code already carries;
  // a key from a workspaces file is named by its own variable.
  let detail = describeError(err);
  if (err instanceof AuthError && keyVariable !== undefined) detail = detail.replaceAll(CONFIG_FIELDS.apiKey.env, keyVariable);
  return { name, ok: false, detail, code: verdictOf(err).code };
}

/** The first page of the list, then of one listed conversation's messages: at most two requests. */
async function checkApi(api: ApiClient, label: string, keyVariable: string | undefined): Promise<CheckOutcome[]> {
  const list = api.conversations();
  let first;
  try {
    first = (await list.next()).value;
  } catch (err) {
    return [failed(label, err, keyVariable)];
  } finally {
    await list.return(undefined);
  }
  if (!first) return [failed(label, new Error('the conversation list answered nothing'))];
  const total = first.meta.total_count;
  const out = [passed(label, `the API answered; the key is accepted; ${total} conversation${total === 1 ? '' : 's'} in the list`)];
  const sample = first.data[0];
  const messagesLabel = label.replace(/^api/, 'messages');
  if (!sample) return [...out, passed(messagesLabel, 'the list is empty: no conversation to read messages of')];
  const pages = api.messages(sample.id);
  try {
    const page = (await pages.next()).value;
    out.push(passed(messagesLabel, `conversation ${sample.id}: ${page?.meta.total_count ?? 0} messages readable`));
  } catch (err) {
    out.push(failed(messagesLabel, err, keyVariable));
  } finally {
    await pages.return(undefined);
  }
  return out;
}

/** The API checks of one workspace, with a client that fails fast and does not retry. */
async function checkWorkspace(config: Config, workspace: Workspace, several: boolean): Promise<CheckOutcome[]> {
  const label = several ? `api ${workspace.accountId ?? DEFAULT_ACCOUNT}` : 'api';
  const logger = createLogger({ level: 'silent' });
  // At most CHECK_TIMEOUT_MS a request: a check that hangs for the sync's timeout helps nobody.
  const api = checkClientFromConfig({ ...config, ...workspace }, CHECK_TIMEOUT_MS, { logger, baseUrlSetting: baseUrlSettingOf(config, workspace) });
  try {
    return await checkApi(api, label, workspace.keyVariable);
  } finally {
    await api.close();
  }
}

/** Whether `target` can be written, named by its setting. */
function checkPath(name: string, variable: string, target: string, kind: 'file' | 'dir'): CheckOutcome {
  const why = whyNotWritable(target, kind);
  if (why === undefined) return passed(name, `${target} can be written (${variable})`);
  return { name, ok: false, detail: `${variable}: cannot write ${target}: ${why}`, code: EXIT.CONFIG };
}

/** Whether Redis answers a PING on the URL's database (one attempt, a short timeout); writes nothing. */
async function checkRedis(config: Config): Promise<CheckOutcome> {
  const { assertRedisReachable } = await import('../../jobs/queue.js'); // the queue's libraries load only here
  try {
    await assertRedisReachable(config.redisUrl, 2000);
    return passed('redis', `${redisShown(config.redisUrl)} answers PING (${CONFIG_FIELDS.redisUrl.env})`);
  } catch (err) {
    const hint = ': the daemon\'s bullmq scheduler needs it (for sync alone, run check --no-queue; a daemon without Redis: CONVO_MIRROR_SCHEDULER=local)';
    const f = failed('redis', err);
    return { ...f, detail: `${f.detail}${hint}` };
  }
}

/**
 * Runs every check: each workspace's API (in turn), the mirror, the exports, and Redis when the
 * scheduler is `bullmq` and `queue` is true.
 */
export async function runChecks(config: Config, queue: boolean): Promise<CheckOutcome[]> {
  const out: CheckOutcome[] = [];
  for (const w of config.workspaces) out.push(...(await checkWorkspace(config, w, config.workspaces.length > 1)));
  out.push(checkPath('mirror', CONFIG_FIELDS.db.env, config.db, 'file'));
  out.push(checkPath('exports', CONFIG_FIELDS.exportDir.env, config.exportDir, 'dir'));
  if (queue && config.scheduler === 'bullmq') out.push(await checkRedis(config));
  return out;
}

/** Prints the outcomes (a line each, or JSON) and returns the exit code: 0 only when all passed. */
function report(outcomes: readonly CheckOutcome[], json: boolean): number {
  const ok = outcomes.every((o) => o.ok);
  if (json) {
    process.stdout.write(JSON.stringify({ ok, checks: outcomes.map(({ name, ok: passedCheck, detail }) => ({ name, ok: passedCheck, detail })) }, null, 2) + '\n');
  } else {
    for (const o of outcomes) process.stdout.write(`${o.ok ? '✓' : '✗'} ${o.name}: ${o.detail}\n`);
  }
  return worstExit(outcomes.map((o) => o.code));
}

/** Adds `check` to `program`. */
export function addCheckCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('check')
    .description('Check the configuration: the API answers and accepts the key (at most two requests per workspace), the mirror and exports can be written, Redis answers; exit 0 only when all pass')
    .option('--no-queue', 'skip the Redis check (sync alone needs no Redis)')
    .option('--json', 'print {ok, checks: [{name, ok, detail}]} as JSON');
  addConfigFlags(cmd, 'check').action((o) =>
    settle(setExit, async () => {
      let config: Config;
      try {
        config = loadConfig(process.env, configFlagsOf(o, 'check'));
      } catch (err) {
        // With --json, a configuration that cannot be read is a failed check too (scripts read stdout).
        if (o.json !== true) throw err;
        return report([failed('config', err)], true);
      }
      return report(await runChecks(config, o.queue !== false), o.json === true);
    }),
  );
}
