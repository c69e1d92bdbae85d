import type { Logger } from 'pino';
import type { ApiClient, RequestTally } from '../api/client.js';
import type { Mirror } from '../store/mirror.js';
import type { Clock } from '../clock.js';

/** Dependencies of the sync processors, built once at start-up and passed down (design habit 3). */
export interface SyncDeps {
  api: ApiClient;
  mirror: Mirror;
  logger: Logger;
  clock: Clock;
  /**
   * Runs a crawl of one conversation (key `<account id>/<conversation id>`) alone: runs that
   * overlap in one process (a webhook's and a scheduled one, say) never crawl one conversation at
   * once. Absent: the caller guarantees it (a BullMQ job holds the daemon's mutex for its crawl,
   * and `sync` crawls each conversation once).
   */
  crawlLock?: <T>(key: string, task: () => Promise<T>) => Promise<T>;
  /**
   * Called after each transaction the sync commits (a list page, a message page, a completed crawl,
   * a tombstone), and awaited before the crawl or listing that committed it goes on: the run layer
   * publishes progressively from it. Must not throw or reject.
   */
  afterCommit?: () => void | Promise<void>;
}

/** Live counters a progress bar or log line reads while a sync runs. */
export interface SyncProgress {
  /** Conversations known so far (listed, plus mirrored ones being re-checked). */
  conversationsTotal: number;
  /** Conversations finished (synced, tombstoned or failed). */
  conversationsDone: number;
  conversationsFailed: number;
  /** Messages served by the API in this run. */
  messagesServed: number;
  messagesInserted: number;
  messagesUpdated: number;
  messagesDeleted: number;
}

/** A fresh zeroed {@link SyncProgress}. */
export function newProgress(): SyncProgress {
  return {
    conversationsTotal: 0,
    conversationsDone: 0,
    conversationsFailed: 0,
    messagesServed: 0,
    messagesInserted: 0,
    messagesUpdated: 0,
    messagesDeleted: 0,
  };
}

/** Options shared by the sync processors. */
export interface SyncOptions {
  /** Account id the mirror rows belong to (`default` when no `X-Account-Id`). */
  accountId: string;
  /** Run recorded on change-log rows; null outside a recorded run. */
  runId: number | null;
  /** Crawl restarts allowed per conversation when its pages shift under us. @defaultValue 5 */
  maxRestarts?: number;
  /** Counters to update while running. */
  progress?: SyncProgress;
  /**
   * Continue unfinished crawls from their checkpoint: `true` any recent one; `'same-run'` only one
   * committed by `runId` (a retried job of a full refresh); `false` never (every crawl starts at
   * page 1). @defaultValue true
   */
  resume?: boolean | 'same-run';
  /**
   * Incremental crawl: a conversation whose last crawl completed with n messages is fetched from the
   * page holding its last known message (one request when nothing changed), after a boundary check;
   * `false` crawls every page from page 1. @defaultValue false
   */
  incremental?: boolean;
  /**
   * Field of the conversation object used as a change signal (e.g. `last_activity_at`): with
   * `incremental`, a conversation whose signal has not moved since its last complete crawl is
   * skipped without a request. Undefined: never skip.
   */
  changeField?: string | undefined;
  /**
   * The conversation is gone from a complete (confirmed) listing of this run: a 404 on its messages
   * then means it was deleted, and it is tombstoned with its messages. Without it a 404 is a
   * failure (`ListedButNotFoundError`) and nothing is tombstoned: a listing that still shows a
   * conversation contradicts the 404. @defaultValue false
   */
  unlisted?: boolean;
  /** The conversation was named by the caller (`sync --conversation`), not found by a listing. @defaultValue false */
  named?: boolean;
  /** Checkpoints older than this (ms) are discarded and the crawl starts over. @defaultValue 86400000 (24 h) */
  checkpointMaxAgeMs?: number;
  /** Stops taking new conversations when aborted. */
  signal?: AbortSignal | undefined;
  /**
   * Counters the crawl adds its requests and served messages to (its result's `tally`); pass one to
   * keep the figures of a crawl that fails. @defaultValue a fresh tally
   */
  tally?: RequestTally;
}
