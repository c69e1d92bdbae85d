/**
 * The shapes of a recorded run: how it is asked for ({@link RunOptions}), the run being worked on
 * ({@link RunHandle}), what it did ({@link RunWork}), how it ended ({@link RunOutcome}) and the
 * summary printed by the CLI and stored in `runs` ({@link RunSummary}).
 */
import type { ApiClient, Prefetch, RequestTally } from '../api/client.js';
import type { PublishSettings } from '../export/publisher.js';
import type { RunFailureRecord, RunRefresh, RunScope, RunTrigger } from '../store/mirror.js';
import type { WorkspaceOptions, WorkspaceResult } from '../sync/workspace.js';

/** Options of `runSync`: what to sync, and where and how to publish it ({@link PublishSettings}). */
export interface RunOptions extends Omit<WorkspaceOptions, 'runId'>, PublishSettings {
  /** Sync only these conversations (every page of each); omitted = the whole workspace. */
  conversationIds?: string[] | undefined;
  /**
   * Full refresh: every page of every conversation, no crawl resumed from a checkpoint. Without it,
   * a crawl interrupted in the last 24 h continues from its checkpoint. @defaultValue false
   */
  full?: boolean;
  /** Who asked for the run, recorded in `runs.trigger`. @defaultValue `cli` */
  trigger?: RunTrigger;
  /**
   * The run's first request, sent ahead of it ({@link ApiClient.prefetch}: the run began only once
   * the API had answered it). Its cost is the run's: counted where the run used its answer, else
   * added to the run's figures; released when the sync ends.
   */
  prefetched?: Prefetch | undefined;
}

/** How a run is recorded in `runs` when it starts: what it covers, how deep it reads, who asked. */
export interface RunSpec {
  scope: RunScope;
  refresh: RunRefresh;
  trigger: RunTrigger;
  /** Account the run mirrors (`default` without `X-Account-Id`). */
  accountId: string;
}

/** A recorded run being worked on: its `runs` row and when it started. */
export interface RunHandle extends RunSpec {
  runId: number;
  /** When the run started, epoch ms (a run taken up again keeps its first start when known). */
  startedMs: number;
}

/** Where and how a run publishes its changes. */
export type RunTarget = PublishSettings;

/**
 * What a run did, as its complete step records it. The figures come from request tallies only
 * (`tally`, `messagesServed`): what the API was asked and served in this run, whatever each crawl's
 * outcome. Live progress counters never feed them.
 */
export interface RunWork
  extends Pick<WorkspaceResult, 'listPasses' | 'listConfirmed' | 'conversationsListed' | 'conversationsInserted' | 'conversationsUpdated' | 'crawls'> {
  /** Conversations (and the listing, as `(conversation list)`) that failed, as `run_failures` stores them. */
  failures: RunFailureRecord[];
  /** Everything the run asked the API and was served: the listing and every crawl, every attempt. */
  tally: RequestTally;
  /** Messages served to the run's crawls (every crawl and attempt, whatever its outcome). */
  messagesServed: number;
  /**
   * Conversations the run set out to sync (listed, or named). When the run stops early, those left
   * neither synced nor failed are reported as not synced. @defaultValue conversations crawled + failures
   */
  known?: number;
}

/** Everything the complete step needs to publish and record a run. */
export interface RunOutcome {
  run: RunHandle;
  target: RunTarget;
  /** What the run did (absent when it stopped before doing anything). */
  work?: RunWork | undefined;
  /** The error that stopped the run, if any. */
  fatal?: unknown;
  /** The run was stopped by a shutdown signal (SIGINT/SIGTERM). */
  interrupted?: boolean;
  /** Data files and lines published during the run, before its end; counted in the summary's `export`. */
  publishedDuringRun?: { files: number; lines: number } | undefined;
}

/** Summary of a run, printed by the CLI and stored in `runs`. */
export interface RunSummary {
  runId: number;
  /** `workspace`: every conversation listed; `conversations`: the ones named. */
  scope: RunScope;
  /** `incremental` (new messages only, change signal) or `full` (every page re-read). */
  refresh: RunRefresh;
  /** Who asked for the run: `cli`, `schedule`, `on-demand` (enqueued) or `webhook`. */
  trigger: RunTrigger;
  /** `interrupted` when `signal` aborted the run (SIGINT/SIGTERM); checkpoints let the next run resume. */
  status: 'succeeded' | 'partial' | 'failed' | 'interrupted';
  durationMs: number;
  listPasses: number;
  listConfirmed: boolean;
  conversations: {
    listed: number;
    /** Conversations brought up to date: crawled to their end, or {@link skipped}. */
    synced: number;
    /**
     * Of `synced`, those skipped without a request because their change signal had not moved since
     * their last complete crawl (the text summary shows them apart from the ones crawled).
     * @defaultValue 0
     */
    skipped?: number;
    deleted: number;
    failed: number;
    inserted: number;
    updated: number;
    /** Known conversations left neither synced nor failed, because the run was stopped early. */
    notSynced: number;
  };
  /**
   * Messages: `served` by the API to this run's crawls (every attempt, whatever its outcome; 0 when
   * every conversation was skipped on its change signal); `inserted`, `updated`, `deleted` and
   * crawl `restarts` of the conversations synced.
   */
  messages: { served: number; inserted: number; updated: number; deleted: number; restarts: number };
  /** Requests sent (retries included), retries, and responses answered 429. */
  requests: number;
  retries: number;
  rateLimited: number;
  /**
   * Fewest requests that could have produced this mirror:
   * `ceil(listed/100)` (at least 1 when listing) + Σ `max(1, ceil(messages/100))` per conversation.
   */
  minimumRequests: number;
  /**
   * Export publication. `files` and `lines`: the data files and lines the run published, its
   * progressive publications during the run included (a daemon's workspace run: its final
   * publication's; its conversation jobs publish for the whole daemon). `error` is set when
   * publication failed: nothing of this run was lost (the changes stay in the change log, above
   * the unchanged watermark) and the next run publishes them.
   */
  export: {
    files: number;
    lines: number;
    watermark: number;
    resumed: boolean;
    /**
     * The ledger's chain head once the run ended (its changes and its own `runs` line published):
     * note it to prove later that the archive still holds, unchanged, everything up to it.
     */
    head?: { batch_id: number; hash: string };
    error?: string;
    /**
     * Run lines waiting for publication when the run ended (its own among them) because this run
     * changed nothing (see `PublishSettings.runsHeartbeatMs`): how many, and when (ISO 8601 UTC)
     * the heartbeat makes them due at the latest. Absent when nothing waits.
     */
    held?: { lines: number; until: string };
  };
  failures: { id: string; code: string; message: string }[];
}
