/**
 * The daemon's Prometheus metrics: the one module that imports prom-client. Counters are recorded
 * as things happen ({@link Metrics.onResponse} per API attempt, {@link Metrics.onRunFinished} per
 * finished run); gauges of the mirror and the queue are read at scrape time from injected
 * functions, so this module knows nothing of SQLite or BullMQ.
 *
 * Everything lives in the instance's own {@link Registry} (never prom-client's global one), with
 * prom-client's default process metrics (`process_cpu_seconds_total`, `nodejs_heap_size_used_bytes`...).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Logger } from 'pino';
import type { AttemptEvent } from '../api/client.js';
import type { RunSummary } from '../run/index.js';

/** Buckets of `convo_mirror_run_duration_seconds`, seconds: from a quick incremental run to a long full refresh. */
export const RUN_DURATION_BUCKETS = [1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400] as const;

/** Default of {@link MetricsOptions.collectTimeoutMs}: 1000 ms. */
export const DEFAULT_COLLECT_TIMEOUT_MS = 1000;

/** One database connection pool, counted now (the shape of the store's `PoolStats`). */
export interface DbPoolFigures {
  /** The pool's name, e.g. `queries` or `locks`. */
  pool: string;
  /** Connections open. */
  total: number;
  /** Open connections not checked out. */
  idle: number;
  /** Callers waiting for a connection. */
  waiting: number;
  /** Connections at most. */
  max: number;
}

/** Options of {@link Metrics}. */
export interface MetricsOptions {
  /**
   * What waits for publication, read at each scrape: changes of messages and conversations
   * (`convo_mirror_export_lag_changes`) and run lines (`convo_mirror_export_held_run_lines`). A
   * throw (or rejection, or a read slower than `collectTimeoutMs`) makes both samples `NaN` for that
   * scrape and counts a collect error. Without it the gauges read 0.
   */
  exportLag?: () => { changes: number; runLines: number } | Promise<{ changes: number; runLines: number }>;
  /**
   * Jobs of the queue by state (`convo_mirror_queue_jobs{state}`), read at each scrape, e.g.
   * BullMQ's `queue.getJobCounts()`. Bounded by `collectTimeoutMs`; a failure or a timeout leaves
   * the gauge without samples for that scrape and counts a collect error.
   */
  queueJobCounts?: () => Promise<Record<string, number>>;
  /**
   * The mirror's database connection pools now (`convo_mirror_db_pool_connections{pool,state}` and
   * `convo_mirror_db_pool_max{pool}`), read at each scrape from counters in memory (e.g.
   * `Mirror.poolStats()`); undefined (an engine without pools, SQLite) or absent: no samples.
   */
  dbPools?: () => readonly DbPoolFigures[] | undefined;
  /** Longest wait for `exportLag` or `queueJobCounts` at a scrape, ms. @defaultValue 1000 */
  collectTimeoutMs?: number;
  /** Time source of `convo_mirror_last_success_timestamp_seconds`, epoch ms. @defaultValue `Date.now` */
  now?: () => number;
  /** Where a failed collection is logged (debug). */
  logger?: Logger | undefined;
  /** Add prom-client's default process metrics. @defaultValue true */
  processMetrics?: boolean;
}

/**
 * The daemon's metrics. Metric names and labels:
 *
 * - `convo_mirror_api_requests_total{account_id,status}`: API attempts sent, each retry counted,
 *   by HTTP status (`"200"`, `"503"`...), or `"error"` when the attempt got no status.
 * - `convo_mirror_api_retries_total{account_id}`: attempts that were retries.
 * - `convo_mirror_api_rate_limited_total{account_id}`: attempts answered 429.
 * - `convo_mirror_messages_total{account_id,op}`: messages inserted / updated / deleted (tombstoned)
 *   by finished runs (`op` = `insert`, `update`, `delete`).
 * - `convo_mirror_conversations_failed_total{account_id}`: conversations that failed in finished runs.
 * - `convo_mirror_runs_total{account_id,status}`: finished runs by status (`succeeded`, `partial`, `failed`).
 * - `convo_mirror_run_duration_seconds{account_id,refresh}`: histogram of finished runs' durations.
 * - `convo_mirror_last_success_timestamp_seconds{account_id}`: when the last run with status
 *   `succeeded` finished, Unix seconds (absent until one has).
 * - `convo_mirror_export_lag_changes`: changes of messages and conversations not yet published (at
 *   scrape time; `NaN` when the mirror could not be read). Run lines are not counted: the line of a
 *   run that changed nothing waits for the next changes or the heartbeat, by design.
 * - `convo_mirror_export_held_run_lines`: run lines waiting for publication (same scrape).
 * - `convo_mirror_conversations_not_found_total{account_id}`: on-demand jobs (a webhook's, or
 *   `enqueue`'s) for a conversation the API answers 404 and the mirror never had: completed without
 *   a run.
 * - `convo_mirror_erasures_total{account_id,kind}`: erasures `erase` jobs of this process recorded
 *   in the mirror (`kind` = `sender`, `conversation`); never labelled by subject.
 * - `convo_mirror_queue_jobs{state}`: jobs in the queue by state (at scrape time).
 * - `convo_mirror_db_pool_connections{pool,state}`: the PostgreSQL mirror's connections by pool
 *   (`queries`, `locks`) and state: `total` open, `idle` among them, `waiting` callers waiting for
 *   one (at scrape time; absent for a SQLite mirror).
 * - `convo_mirror_db_pool_max{pool}`: connections each pool may open at most.
 * - `convo_mirror_collect_errors_total{collector}`: scrapes where `export_lag`, `queue_jobs` or
 *   `db_pool` could not be read.
 */
export class Metrics {
  /** Runs already counted (the last 10,000), so a run reported twice is counted once. */
  private readonly counted = new Set<number>();
  /** This instance's registry (pass it nowhere else; {@link Metrics.render} exposes it). */
  readonly registry = new Registry();
  private readonly now: () => number;
  private readonly requests: Counter<'account_id' | 'status'>;
  private readonly retries: Counter<'account_id'>;
  private readonly rateLimited: Counter<'account_id'>;
  private readonly messages: Counter<'account_id' | 'op'>;
  private readonly conversationsFailed: Counter<'account_id'>;
  private readonly runs: Counter<'account_id' | 'status'>;
  private readonly runDuration: Histogram<'account_id' | 'refresh'>;
  private readonly lastSuccess: Gauge<'account_id'>;
  private readonly exportLag: Gauge;
  private readonly heldRunLines: Gauge;
  private readonly notFound: Counter<'account_id'>;
  private readonly erasures: Counter<'account_id' | 'kind'>;
  private readonly queueJobs: Gauge<'state'>;
  private readonly collectErrors: Counter<'collector'>;
  private readonly dbPoolConnections: Gauge<'pool' | 'state'>;
  private readonly dbPoolMax: Gauge<'pool'>;

  constructor(private readonly o: MetricsOptions = {}) {
    const registers = [this.registry];
    this.now = o.now ?? Date.now;
    if (o.processMetrics !== false) collectDefaultMetrics({ register: this.registry });
    this.requests = new Counter({ name: 'convo_mirror_api_requests_total', help: 'API attempts sent (each retry counts), by HTTP status or "error" without one', labelNames: ['account_id', 'status'], registers });
    this.retries = new Counter({ name: 'convo_mirror_api_retries_total', help: 'API attempts that were retries', labelNames: ['account_id'], registers });
    this.rateLimited = new Counter({ name: 'convo_mirror_api_rate_limited_total', help: 'API attempts answered 429', labelNames: ['account_id'], registers });
    this.messages = new Counter({ name: 'convo_mirror_messages_total', help: 'Messages inserted, updated or deleted (tombstoned) by finished runs', labelNames: ['account_id', 'op'], registers });
    this.conversationsFailed = new Counter({ name: 'convo_mirror_conversations_failed_total', help: 'Conversations that failed in finished runs', labelNames: ['account_id'], registers });
    this.runs = new Counter({ name: 'convo_mirror_runs_total', help: 'Finished runs by status', labelNames: ['account_id', 'status'], registers });
    this.runDuration = new Histogram({ name: 'convo_mirror_run_duration_seconds', help: 'Duration of finished runs, seconds', labelNames: ['account_id', 'refresh'], buckets: [...RUN_DURATION_BUCKETS], registers });
    this.lastSuccess = new Gauge({ name: 'convo_mirror_last_success_timestamp_seconds', help: 'When the last run with status succeeded finished, Unix seconds', labelNames: ['account_id'], registers });
    this.exportLag = new Gauge({ name: 'convo_mirror_export_lag_changes', help: 'Changes of messages and conversations not yet published to the exports', registers });
    this.heldRunLines = new Gauge({ name: 'convo_mirror_export_held_run_lines', help: 'Run lines waiting for the next publication with changes, or the heartbeat', registers });
    this.notFound = new Counter({ name: 'convo_mirror_conversations_not_found_total', help: 'On-demand jobs for a conversation the API answers 404 and the mirror never had (no run recorded)', labelNames: ['account_id'], registers });
    this.erasures = new Counter({ name: 'convo_mirror_erasures_total', help: 'Erasures this process recorded in the mirror (erase jobs), by kind: sender or conversation', labelNames: ['account_id', 'kind'], registers });
    this.queueJobs = new Gauge({ name: 'convo_mirror_queue_jobs', help: 'Jobs in the queue by state', labelNames: ['state'], registers });
    this.dbPoolConnections = new Gauge({ name: 'convo_mirror_db_pool_connections', help: "The mirror database's connections by pool and state: total open, idle, waiting callers", labelNames: ['pool', 'state'], registers });
    this.dbPoolMax = new Gauge({ name: 'convo_mirror_db_pool_max', help: "Connections each of the mirror database's pools may open at most", labelNames: ['pool'], registers });
    this.collectErrors = new Counter({ name: 'convo_mirror_collect_errors_total', help: 'Scrapes where a gauge read at scrape time could not be read', labelNames: ['collector'], registers });
  }

  /**
   * Records one API attempt: `status` undefined = no HTTP status (network error, timeout), counted
   * as `status="error"`; `retry` = it was a retry; `rateLimited` = it was answered 429.
   */
  onResponse(accountId: string, status: number | undefined, retry: boolean, rateLimited: boolean): void {
    this.requests.inc({ account_id: accountId, status: status === undefined ? 'error' : String(status) });
    if (retry) this.retries.inc({ account_id: accountId });
    if (rateLimited) this.rateLimited.inc({ account_id: accountId });
  }

  /** The {@link ApiClientOptions.onAttempt} hook of a client serving `accountId`. */
  attemptHook(accountId: string): (e: AttemptEvent) => void {
    return (e) => this.onResponse(accountId, e.status, e.retry, e.status === 429);
  }

  /**
   * Records a finished run of `accountId` from its summary: messages by op, failed conversations,
   * the run's status and duration, and, for status `succeeded`, the time of its success (now).
   */
  onRunFinished(s: RunSummary, accountId: string): void {
    // A finish step retried after it recorded its run reports the run again: count it once.
    if (this.counted.has(s.runId)) return;
    this.counted.add(s.runId);
    if (this.counted.size > 10_000) this.counted.delete(this.counted.values().next().value!);
    const account = { account_id: accountId };
    const ops = { insert: s.messages.inserted, update: s.messages.updated, delete: s.messages.deleted };
    for (const [op, n] of Object.entries(ops)) this.messages.inc({ ...account, op }, n);
    this.conversationsFailed.inc(account, s.conversations.failed);
    this.runs.inc({ ...account, status: s.status });
    this.runDuration.observe({ ...account, refresh: s.refresh }, Math.max(0, s.durationMs) / 1000);
    if (s.status === 'succeeded') this.lastSuccess.set(account, this.now() / 1000);
  }

  /** Counts an on-demand job of `accountId` whose conversation does not exist (no run recorded). */
  onNotFound(accountId: string): void {
    this.notFound.inc({ account_id: accountId });
  }

  /** Counts an erasure of `accountId` an `erase` job recorded in the mirror (its kind, never its subject). */
  onErasure(kind: 'sender' | 'conversation', accountId: string): void {
    this.erasures.inc({ account_id: accountId, kind });
  }

  /** The Content-Type of {@link Metrics.render}'s text (Prometheus text exposition 0.0.4). */
  get contentType(): string {
    return this.registry.contentType;
  }

  /**
   * Every metric in the Prometheus text exposition format. The gauges of the mirror and the queue
   * are read first (the queue bounded by `collectTimeoutMs`), so a failed read shows in this very
   * scrape's `convo_mirror_collect_errors_total`.
   */
  async render(): Promise<string> {
    await this.readSources();
    return this.registry.metrics();
  }

  /** Reads the export lag, the queue's job counts and the database pools into their gauges. Never throws. */
  private async readSources(): Promise<void> {
    const { exportLag, queueJobCounts, dbPools } = this.o;
    if (dbPools) {
      this.dbPoolConnections.reset();
      this.dbPoolMax.reset();
      try {
        for (const p of dbPools() ?? []) {
          for (const state of ['total', 'idle', 'waiting'] as const) this.dbPoolConnections.set({ pool: p.pool, state }, p[state]);
          this.dbPoolMax.set({ pool: p.pool }, p.max);
        }
      } catch (err) {
        this.collectFailed('db_pool', err);
      }
    }
    if (exportLag) {
      try {
        const lag = await withTimeout(Promise.resolve().then(exportLag), this.o.collectTimeoutMs ?? DEFAULT_COLLECT_TIMEOUT_MS, 'reading the export lag');
        this.exportLag.set(lag.changes);
        this.heldRunLines.set(lag.runLines);
      } catch (err) {
        // Unknown, and said so: a gauge without labels always has a sample; never a stale or made-up value.
        this.exportLag.set(Number.NaN);
        this.heldRunLines.set(Number.NaN);
        this.collectFailed('export_lag', err);
      }
    }
    if (queueJobCounts) {
      this.queueJobs.reset();
      try {
        const counts = await withTimeout(queueJobCounts(), this.o.collectTimeoutMs ?? DEFAULT_COLLECT_TIMEOUT_MS, 'reading the queue');
        for (const [state, n] of Object.entries(counts)) this.queueJobs.set({ state }, n);
      } catch (err) {
        this.collectFailed('queue_jobs', err);
      }
    }
  }

  private collectFailed(collector: string, err: unknown): void {
    this.collectErrors.inc({ collector });
    this.o.logger?.debug({ collector, err: err instanceof Error ? err.message : String(err) }, 'metric not collected');
  }
}

/**
 * `p`, or a rejection naming `what` after `ms` (the timer never keeps the process alive).
 *
 * @throws Error `<what> timed out after <ms> ms`
 */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
    timer.unref();
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
