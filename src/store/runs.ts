/**
 * Recorded runs: `runs` (start, resume, end and figures) and `run_failures` (the conversations that
 * failed in a run). Each method is one statement or runs inside the caller's transaction.
 */
import type { Db, Statement } from './sqlite.js';
import type { RunFailureRecord, RunFigures, RunStart } from './types.js';

/** The `runs` columns {@link RunFigures} may set, in the order they are written. */
const FIGURE_COLUMNS = [
  'status',
  'list_passes',
  'conversations_listed',
  'conversations_synced',
  'conversations_failed',
  'conversations_deleted',
  'conversations_inserted',
  'conversations_updated',
  'messages_served',
  'messages_inserted',
  'messages_updated',
  'messages_deleted',
  'requests',
  'retries',
  'rate_limited',
  'export_lines',
  'export_files',
  'error',
] as const satisfies readonly (keyof RunFigures)[];

/** What {@link Runs.finish} binds: the figures given, the end time and the run. */
type FinishParams = RunFigures & { ended_at: string; id: number };

/** Typed statements of `runs` and `run_failures`. */
export class Runs {
  private readonly insert: Statement<[mode: string, scope: string, refresh: string, trigger: string, accountId: string, startedAt: string]>;
  private readonly interruptRunning: Statement<[endedAt: string]>;
  private readonly statusOf: Statement<[runId: number], { status: string }>;
  private readonly resumeInterrupted: Statement<[runId: number]>;
  private readonly deleteFailures: Statement<[runId: number]>;
  private readonly insertFailure: Statement<
    [runId: number, conversationId: string, code: string, status: number | null, attempts: number | null, message: string, at: string]
  >;
  private readonly newest: Statement<[limit: number], Record<string, unknown>>;
  private readonly newestFailures: Statement<[], Record<string, unknown>>;
  /** `UPDATE runs` statements by the figure columns they set (one per shape of figures). */
  private readonly finishers = new Map<string, Statement<FinishParams>>();

  constructor(private readonly db: Db) {
    this.insert = db.prepare(`INSERT INTO runs (mode, scope, refresh, trigger, account_id, started_at, status) VALUES (?, ?, ?, ?, ?, ?, 'running')`);
    this.interruptRunning = db.prepare(`UPDATE runs SET status = 'interrupted', ended_at = coalesce(ended_at, ?) WHERE status = 'running'`);
    this.statusOf = db.prepare(`SELECT status FROM runs WHERE id = ?`);
    this.resumeInterrupted = db.prepare(
      `UPDATE runs SET status = 'running', ended_at = NULL, error = NULL, resumes = resumes + 1 WHERE id = ? AND status = 'interrupted'`,
    );
    this.deleteFailures = db.prepare(`DELETE FROM run_failures WHERE run_id = ?`);
    this.insertFailure = db.prepare(`INSERT INTO run_failures (run_id, conversation_id, code, status, attempts, message, at) VALUES (?, ?, ?, ?, ?, ?, ?)`);
    this.newest = db.prepare(`SELECT * FROM runs ORDER BY id DESC LIMIT ?`);
    this.newestFailures = db.prepare(
      `SELECT run_id, conversation_id, code, status, attempts, message, at FROM run_failures
       WHERE run_id = (SELECT max(id) FROM runs WHERE status <> 'running') ORDER BY at`,
    );
  }

  /** Inserts a `running` run (legacy `mode` = scope); returns its id. */
  start(run: RunStart, now: string): number {
    return Number(this.insert.run(run.scope, run.scope, run.refresh, run.trigger, run.accountId, now).lastInsertRowid);
  }

  /** Marks every `running` run `interrupted`; returns how many. */
  markInterrupted(now: string): number {
    return this.interruptRunning.run(now).changes;
  }

  /** See `Mirror.resumeRun`; call inside a transaction. */
  resume(runId: number): 'running' | 'resumed' | 'ended' {
    const status = this.status(runId);
    if (status === 'running') return 'running';
    if (status !== 'interrupted') return 'ended';
    this.resumeInterrupted.run(runId);
    return 'resumed';
  }

  /** A run's status; undefined for an unknown id. */
  status(runId: number): string | undefined {
    return this.statusOf.get(runId)?.status;
  }

  /**
   * Sets the figures given (the keys of `figures` that are `runs` columns; others are ignored) and
   * `ended_at`.
   */
  finish(runId: number, figures: RunFigures, now: string): void {
    const cols = FIGURE_COLUMNS.filter((c) => Object.hasOwn(figures, c));
    const key = cols.join(',');
    let st = this.finishers.get(key);
    if (!st) {
      const sets = cols.map((c) => `${c} = @${c}`).join(', ');
      st = this.db.prepare<FinishParams>(`UPDATE runs SET ${sets}${sets ? ', ' : ''}ended_at = @ended_at WHERE id = @id`);
      this.finishers.set(key, st);
    }
    st.run({ ...figures, ended_at: now, id: runId });
  }

  /** Replaces the failures recorded for a run; call inside a transaction. */
  recordFailures(runId: number, failures: RunFailureRecord[], now: string): void {
    this.deleteFailures.run(runId);
    for (const f of failures) this.insertFailure.run(runId, f.id, f.code, f.status, f.attempts, f.message, now);
  }

  /** The last `limit` runs, newest first (every column). */
  last(limit: number): Record<string, unknown>[] {
    return this.newest.all(limit);
  }

  /** Failures of the newest finished run. */
  lastFailures(): Record<string, unknown>[] {
    return this.newestFailures.all();
  }
}
