/**
 * What the daemon (jobs/daemon.ts) asks of its engine, the part that holds the schedules and the
 * queue: BullMQ on Redis (jobs/bullmq-engine.ts) or in-process (jobs/local-engine.ts). Both run the
 * same src/run steps under the same mirror, metrics, HTTP server and shutdown.
 */
import type { FastifyPluginAsync } from 'fastify';
import type { Logger } from 'pino';
import type { Config, Workspace } from '../config/index.js';
import type { ApiClient } from '../src/api/client.js';
import type { Clock } from '../src/clock.js';
import type { RunSummary, RunTarget } from '../src/run/index.js';
import type { ReadinessCheck } from '../src/server/index.js';
import type { Mirror } from '../src/store/mirror.js';
import type { ConversationJobResult, EraseJobResult } from './queue.js';
import type { NotFoundJobResult } from './conversation-job.js';

/** One workspace the daemon mirrors, with what it was built with at start-up. */
export interface DaemonWorkspace {
  /** Its account id (`default` without `X-Account-Id`): in job data, metrics labels and logs. */
  accountId: string;
  workspace: Workspace;
  /** Its client (the rate limiter shared with every workspace of the same base URL and key). */
  api: ApiClient;
  /** The daemon's logger with `account_id`. */
  logger: Logger;
}

/** What every engine is built from. */
export interface EngineContext {
  config: Config;
  logger: Logger;
  mirror: Mirror;
  workspaces: readonly DaemonWorkspace[];
  clock: Clock;
  /** Where and how runs publish (export directory, modes, gzip, signing key, progressive interval). */
  target: RunTarget;
  /** Aborted at the end of the shutdown grace period: cuts running jobs short. */
  signal: AbortSignal;
  /** Called with an error after which no job can succeed (an unusable mirror): the daemon stops. */
  onFatal: (err: Error) => void;
  /** Called with every finished run and its account (the metrics). */
  onRunFinished: (summary: RunSummary, accountId: string) => void;
  /** Called when an on-demand job's conversation does not exist (no run recorded), with its account (the metrics). */
  onNotFound?: ((accountId: string) => void) | undefined;
  /** Called when an `erase` job's erasure is recorded in the mirror, with its kind and account (the metrics). */
  onErasure?: ((kind: 'sender' | 'conversation', accountId: string) => void) | undefined;
}

/** The schedules and the queue of a daemon. */
export interface DaemonEngine {
  name: 'bullmq' | 'local';
  /** Checks of `/readyz` beyond the mirror's (e.g. Redis answers a PING). */
  checks: ReadinessCheck[];
  /** Routes of the HTTP server beyond health, readiness, metrics and webhooks (the dashboard). */
  plugins: FastifyPluginAsync[];
  /** Jobs by state, for `convo_mirror_queue_jobs{state}`. */
  jobCounts(): Promise<Record<string, number>>;
  /**
   * Queues a webhook's sync of one conversation of a configured workspace (its run's trigger is
   * `webhook`), deduplicated per conversation as `enqueue --conversation` is. @returns the job id
   */
  enqueueConversation(accountId: string, conversationId: string): Promise<string>;
  /** Told of a 429's wait (ms) when every workspace shares one key: BullMQ pauses its whole queue. */
  rateLimit?(ms: number): void;
  /** Registers the schedules and starts taking jobs. */
  start(): Promise<void>;
  /** Fields of the `daemon ready` log line. */
  describe(): Record<string, unknown>;
  /**
   * No new jobs; running ones get `graceMs` (ms) to end; then `abort()` is called (they stop at
   * their last committed page and put themselves back) and they get `abortWaitMs` more. Returns by
   * `graceMs + abortWaitMs` whatever happens (never waiting on a Redis that is away).
   *
   * @returns whether running jobs had to be cut short, and how many had not ended when it gave up
   *   on them (they are picked up again from their checkpoints, as after a crash)
   */
  stop(graceMs: number, abort: () => void, abortWaitMs: number): Promise<EngineStopped>;
  /**
   * Releases connections (after `stop`, or after a failed start) within `waitMs` (ms): what has not
   * closed by then is cut, never waited for.
   */
  close(waitMs: number): Promise<void>;
}

/** What {@link DaemonEngine.stop} reports. */
export interface EngineStopped {
  /** Running jobs had to be aborted at the grace period's end. */
  forced: boolean;
  /** Jobs still running when the engine gave up waiting for them (0 when all ended). */
  abandoned: number;
}

/** The figures of a job's return value, for its `job completed` line. */
export function jobFigures(value: unknown): Record<string, unknown> {
  const v = value as Partial<RunSummary> & Partial<ConversationJobResult> & Partial<NotFoundJobResult>;
  if (v?.outcome === 'not_found') return { conversation_id: v.conversationId, outcome: v.outcome };
  if ((value as Partial<EraseJobResult> | undefined)?.outcome === 'erased') {
    // Never the subject: the result does not carry it.
    const e = value as EraseJobResult;
    return { outcome: e.outcome, erasure: e.erasureId, kind: e.kind, messages: e.messages, published_lines: e.publishedLines, archive: e.archive };
  }
  if (v?.result) return { conversation_id: v.result.id, status: v.result.status, inserted: v.result.inserted, updated: v.result.updated, deleted: v.result.deleted, pages: v.result.pages };
  if (v?.runId !== undefined) return { run: v.runId, status: v.status, conversations: v.conversations, messages: v.messages, requests: v.requests, export_lines: v.export?.lines };
  return {};
}
