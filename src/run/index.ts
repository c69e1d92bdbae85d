/**
 * runSync: one recorded run = sync (workspace or named conversations) + export publication, with
 * its start, end, status, counts, requests, retries and failures stored in `runs`/`run_failures`,
 * so every run is provable after the fact.
 */
import type { Logger } from 'pino';
import { HttpError, RunError, describeError, type ConvoMirrorError } from '../errors.js';
import type { Mirror, RunFailureRecord, RunRefresh, RunScope, RunTrigger } from '../store/mirror.js';
import { publishChanges, type ExportResult } from '../export/exporter.js';
import type { FileModes } from '../private-fs.js';
import { LIST_FAILURE_ID, syncConversations, syncWorkspace, type ConversationFailure, type WorkspaceOptions, type WorkspaceResult } from '../sync/workspace.js';
import { newProgress, type SyncDeps, type SyncProgress } from '../sync/types.js';
import { PER_PAGE, addTally, newTally, type RequestTally } from '../api/client.js';

/** Options of {@link runSync}. */
export interface RunOptions extends Omit<WorkspaceOptions, 'runId'> {
  /** Sync only these conversations (every page of each); omitted = the whole workspace. */
  conversationIds?: string[] | undefined;
  /**
   * Full refresh: every page of every conversation, no crawl resumed from a checkpoint. Without it,
   * a crawl interrupted in the last 24 h continues from its checkpoint. @defaultValue false
   */
  full?: boolean;
  /** Root directory of the JSONL exports. */
  exportDir: string;
  /** Modes of the export files and directories created. @defaultValue PRIVATE_MODES (0600/0700) */
  modes?: FileModes | undefined;
  /** Who asked for the run, recorded in `runs.trigger`. @defaultValue `cli` */
  trigger?: RunTrigger;
}

/**
 * Marks the runs a dead process left `running` as `interrupted`. Call once at process start-up,
 * right after opening the mirror for writing (the writer lock is then ours, so no live process can
 * own a running run), and never while runs of this process are in flight.
 *
 * @returns how many runs were marked
 * @throws {@link MirrorUnusableError} when the mirror cannot be written
 */
export function sweepInterruptedRuns(mirror: Mirror, logger: Logger): number {
  const n = mirror.markInterruptedRuns();
  if (n) logger.warn({ runs: n }, 'runs left running by a dead process marked interrupted');
  return n;
}

/**
 * A failure as `run_failures` stores it: the error's code (`ERROR` for an untyped one), and for an
 * HTTP failure its status and attempts.
 */
export function failureRecord(f: ConversationFailure): RunFailureRecord {
  const err = f.error;
  return {
    id: f.id,
    code: (err as Partial<ConvoMirrorError>).code ?? 'ERROR',
    status: err instanceof HttpError ? (err.status ?? null) : null,
    attempts: err instanceof HttpError ? err.attempts : null,
    message: err.message,
  };
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
    synced: number;
    deleted: number;
    failed: number;
    inserted: number;
    updated: number;
    /** Known conversations left neither synced nor failed, because the run was stopped early. */
    notSynced: number;
  };
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
   * Export publication. `error` is set when publication failed: nothing of this run was lost (the
   * changes stay in the change log, above the unchanged watermark) and the next run publishes them.
   */
  export: { files: number; lines: number; watermark: number; resumed: boolean; error?: string };
  failures: { id: string; code: string; message: string }[];
}

/**
 * Runs one recorded sync and publishes its changes.
 *
 * @throws {@link RunError} (with the run's summary; its `cause` is the {@link AuthError},
 *   {@link ConfigError} or {@link ExportError} that stopped the run). The run is recorded as failed;
 *   whatever was committed before the error is still exported.
 */
export async function runSync(deps: SyncDeps, opts: RunOptions): Promise<RunSummary> {
  const started = deps.clock.now();
  const scope: RunScope = opts.conversationIds && opts.conversationIds.length > 0 ? 'conversations' : 'workspace';
  const refresh: RunRefresh = opts.full ? 'full' : 'incremental';
  const trigger = opts.trigger ?? 'cli';
  const runId = deps.mirror.startRun({ scope, refresh, trigger, accountId: opts.accountId });
  const log = deps.logger.child({ run: runId });
  const progress = opts.progress ?? newProgress();
  const reqBefore = { ...deps.api.stats };
  log.info({ scope, refresh, trigger, account_id: opts.accountId }, 'run started');

  let result: WorkspaceResult | undefined;
  let fatal: unknown;
  try {
    // A full refresh re-reads every page: no crawl continues from a checkpoint.
    // The default sync is incremental; --full re-reads every page and uses no change signal.
    const wsOpts = {
      ...opts,
      runId,
      progress,
      logger: log,
      resume: opts.resume ?? !opts.full,
      incremental: opts.incremental ?? !opts.full,
      // A full refresh never skips, but still records each conversation's signal as the baseline
      // the next incremental sync compares with.
      changeFieldSetting: opts.changeFieldSetting ?? 'auto',
      // A full refresh confirms the listing with a second pass; an incremental one settles for one
      // consistent pass (a conversation list drift hid is new, and the next sync finds it).
      confirmListing: opts.confirmListing ?? opts.full === true,
    };
    const d = { ...deps, logger: log };
    result = scope === 'workspace' ? await syncWorkspace(d, wsOpts) : await syncConversations(d, opts.conversationIds!, wsOpts);
    // Stopped early (credentials, configuration, unusable mirror, runaway list): the result still
    // says what was committed before, and the summary shows it.
    fatal = result.fatal;
  } catch (err) {
    fatal = err;
  }

  const stats = deps.api.stats;
  return completeRun(deps, {
    runId,
    scope,
    trigger,
    startedMs: started,
    accountId: opts.accountId,
    exportDir: opts.exportDir,
    modes: opts.modes,
    result,
    fatal,
    interrupted: opts.signal?.aborted === true,
    full: opts.full === true,
    progress,
    tally: { requests: stats.requests - reqBefore.requests, retries: stats.retries - reqBefore.retries, rateLimited: stats.rateLimited - reqBefore.rateLimited, served: 0 },
  });
}

/** Everything {@link completeRun} needs to publish and record a run. */
export interface RunOutcome {
  runId: number;
  scope: RunScope;
  trigger: RunTrigger;
  /** When the run started, epoch ms. */
  startedMs: number;
  accountId: string;
  exportDir: string;
  /** Modes of the export files and directories created. @defaultValue PRIVATE_MODES (0600/0700) */
  modes?: FileModes | undefined;
  /** What the sync did (absent when it stopped before producing anything). */
  result?: WorkspaceResult | undefined;
  /** The error that stopped the run, if any. */
  fatal?: unknown;
  /** The run was stopped by a shutdown signal. */
  interrupted?: boolean;
  /** Every page re-read (no incremental crawl, no change signal). @defaultValue false */
  full?: boolean;
  /** Live counters of the run; derived from `result` when absent. */
  progress?: SyncProgress;
  /** Requests of the run; derived from the listing's and the conversations' tallies when absent. */
  tally?: RequestTally;
}

/**
 * Finishes a recorded run: publishes the exports, records failures and figures in `runs` and
 * `run_failures`, and returns the summary. Shared by `sync` and the daemon's workspace jobs.
 * Whatever fails here (publication, or recording into a full or damaged mirror), the summary is
 * still built and carried by the error, so the caller can always print it.
 *
 * @throws {@link RunError} carrying the summary when `fatal` is set, publication fails, or the run
 *   cannot be recorded (its cause is then the store's error, e.g. {@link MirrorUnusableError})
 */
export function completeRun(deps: SyncDeps, o: RunOutcome): RunSummary {
  const { runId, scope } = o;
  const log = deps.logger.child({ run: runId });
  let exported: ExportResult | undefined;
  let exportError: unknown;
  try {
    exported = publishChanges(deps.mirror, { exportDir: o.exportDir, runId, clock: deps.clock, logger: log, ...(o.modes ? { modes: o.modes } : {}) });
  } catch (err) {
    exportError = err; // a damaged mirror arrives as MirrorUnusableError (the store converts it)
  }
  const result = o.result;
  const fatal = o.fatal;
  const results = result?.results ?? [];
  const failures = result?.failures ?? [];
  const progress: SyncProgress = o.progress ?? {
    ...newProgress(),
    messagesServed: results.reduce((n, r) => n + r.messageCount, 0),
    messagesInserted: results.reduce((n, r) => n + r.inserted, 0),
    messagesUpdated: results.reduce((n, r) => n + r.updated, 0),
    messagesDeleted: results.reduce((n, r) => n + r.deleted, 0),
  };
  const tally: RequestTally =
    o.tally ??
    [result?.listingTally ?? newTally(), ...results.map((r) => r.tally)].reduce(addTally, newTally());
  let storeError: unknown;
  try {
    deps.mirror.recordFailures(runId, failures.map(failureRecord));
  } catch (err) {
    storeError = err;
  }
  const listed = result?.conversationsListed ?? 0;
  const minimumRequests =
    (scope === 'workspace' ? Math.max(1, Math.ceil(listed / PER_PAGE)) : 0) +
    results.reduce((n, r) => n + Math.max(1, Math.ceil(r.messageCount / PER_PAGE)), 0);
  const status: RunSummary['status'] =
    fatal || exportError || storeError ? 'failed' : o.interrupted ? 'interrupted' : failures.length > 0 ? 'partial' : 'succeeded';
  const summary: RunSummary = {
    runId,
    scope,
    refresh: o.full ? 'full' : 'incremental',
    trigger: o.trigger,
    status,
    durationMs: deps.clock.now() - o.startedMs,
    listPasses: result?.listPasses ?? 0,
    listConfirmed: result?.listConfirmed ?? false,
    conversations: {
      listed,
      synced: results.filter((r) => r.status === 'synced').length,
      deleted: results.filter((r) => r.status === 'deleted').length,
      failed: failures.filter((f) => f.id !== LIST_FAILURE_ID).length,
      inserted: result?.conversationsInserted ?? 0,
      updated: result?.conversationsUpdated ?? 0,
      notSynced: fatal && o.progress ? Math.max(0, o.progress.conversationsTotal - results.length - failures.filter((f) => f.id !== LIST_FAILURE_ID).length) : 0,
    },
    messages: {
      served: progress.messagesServed,
      inserted: progress.messagesInserted,
      updated: progress.messagesUpdated,
      deleted: progress.messagesDeleted,
      restarts: results.reduce((n, r) => n + r.restarts, 0),
    },
    requests: tally.requests,
    retries: tally.retries,
    rateLimited: tally.rateLimited,
    minimumRequests,
    export: {
      files: exported?.files.length ?? 0,
      lines: exported?.lines ?? 0,
      watermark: exported?.watermark ?? 0,
      resumed: exported?.resumed ?? false,
      ...(exportError ? { error: describeError(exportError) } : {}),
    },
    failures: failures.map((f) => ({ id: f.id, code: (f.error as ConvoMirrorError).code ?? 'ERROR', message: f.error.message })),
  };
  let firstError = fatal ?? exportError ?? storeError;
  const record = () => deps.mirror.finishRun(runId, {
    status,
    list_passes: summary.listPasses,
    conversations_listed: listed,
    conversations_synced: summary.conversations.synced,
    conversations_failed: summary.conversations.failed,
    conversations_deleted: summary.conversations.deleted,
    conversations_inserted: summary.conversations.inserted,
    conversations_updated: summary.conversations.updated,
    messages_served: summary.messages.served,
    messages_inserted: summary.messages.inserted,
    messages_updated: summary.messages.updated,
    messages_deleted: summary.messages.deleted,
    requests: summary.requests,
    retries: summary.retries,
    rate_limited: summary.rateLimited,
    export_lines: summary.export.lines,
    export_files: summary.export.files,
    error: firstError ? describeError(firstError) : null,
  });
  try {
    record();
  } catch (err) {
    // A full disk or a damaged mirror: the run cannot be recorded, but the summary is still told.
    log.error({ err: describeError(err) }, 'could not record the run in the mirror');
    firstError ??= err;
    if (summary.status !== 'failed') summary.status = 'failed';
  }
  log.info(
    { status, duration_ms: summary.durationMs, requests: summary.requests, minimum_requests: minimumRequests, export_lines: summary.export.lines },
    'run finished',
  );
  if (firstError) throw new RunError(summary, firstError);
  return summary;
}

