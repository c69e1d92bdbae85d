/**
 * Recorded runs: `runs` (start, resume, end and figures) and `run_failures` (the conversations that
 * failed in a run). Each method is one statement or runs inside the caller's transaction.
 */
import type { Db, Statement } from './sqlite.js';
import type { LedgerHead, RunFailureRecord, RunFigures, RunStart } from '../types.js';
import { FIGURE_COLUMNS, runLine, type RunRow } from '../run-line.js';


/** What {@link Runs.finish} binds: the figures given, the end time, the chain head and the run. */
type FinishParams = RunFigures & { ended_at: string; id: number; ledger_batch_id: number | null; ledger_hash: string | null };

/** Typed statements of `runs` and `run_failures`. */
export class Runs {
  private readonly insert: Statement<[mode: string, scope: string, refresh: string, trigger: string, accountId: string, startedAt: string]>;
  private readonly running: Statement<[], { id: number }>;
  private readonly row: Statement<[runId: number], RunRow>;
  private readonly failuresOf: Statement<[runId: number], { conversation_id: string; code: string; status: number | null; attempts: number | null }>;
  private readonly setHead: Statement<[batchId: number | null, hash: string | null, runId: number]>;
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
    this.running = db.prepare(`SELECT id FROM runs WHERE status = 'running' ORDER BY id`);
    this.row = db.prepare(`SELECT * FROM runs WHERE id = ?`);
    this.failuresOf = db.prepare(`SELECT conversation_id, code, status, attempts FROM run_failures WHERE run_id = ? ORDER BY rowid`);
    this.setHead = db.prepare(`UPDATE runs SET ledger_batch_id = ?, ledger_hash = ? WHERE id = ?`);
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

  /** Ids of the runs still `running`, oldest first. */
  runningIds(): number[] {
    return this.running.all().map((r) => r.id);
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
   * Sets the figures given (the keys of `figures` that are `runs` columns; others are ignored),
   * `ended_at` and the chain head (`head`, null before anything was published).
   */
  finish(runId: number, figures: RunFigures, now: string, head: LedgerHead | null): void {
    const cols = FIGURE_COLUMNS.filter((c) => Object.hasOwn(figures, c));
    const key = cols.join(',');
    let st = this.finishers.get(key);
    if (!st) {
      const sets = cols.map((c) => `${c} = @${c}`).join(', ');
      st = this.db.prepare<FinishParams>(
        `UPDATE runs SET ${sets}${sets ? ', ' : ''}ended_at = @ended_at, ledger_batch_id = @ledger_batch_id, ledger_hash = @ledger_hash WHERE id = @id`,
      );
      this.finishers.set(key, st);
    }
    st.run({ ...figures, ended_at: now, id: runId, ledger_batch_id: head?.batch_id ?? null, ledger_hash: head?.hash ?? null });
  }

  /** Sets the chain head a run left (after its runs line was published). */
  setLedgerHead(runId: number, head: LedgerHead | null): void {
    this.setHead.run(head?.batch_id ?? null, head?.hash ?? null, runId);
  }

  /**
   * The record of a run's `runs` change-log row (JSON): what the run was, how it ended, its figures,
   * the conversations that failed (id, error code, HTTP status, attempts) and `ledger_head`, the
   * chain head when it ended (after its changes were published; the batch holding this line comes
   * later). Field order is fixed: it is the export line's. Undefined for an unknown run.
   */
  lineRecord(runId: number, head: LedgerHead | null): { accountId: string; endedAt: string; record: string } | undefined {
    const r = this.row.get(runId);
    if (!r) return undefined;
    return runLine(r, this.failuresOf.all(runId), head);
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
