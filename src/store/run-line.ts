/**
 * What both engines' `runs` groups share, so that a run's change-log line is byte for byte the
 * same whichever engine holds the mirror: the figure columns and the run line's record.
 */
import type { LedgerHead, RunFigures } from './types.js';

/** The `runs` columns {@link RunFigures} may set, in the order they are written. */
export const FIGURE_COLUMNS = [
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

/** A `runs` row as the engines read it for {@link runLine}. */
export interface RunRow {
  id: number;
  account_id: string;
  scope: string | null;
  refresh: string | null;
  trigger: string | null;
  started_at: string;
  ended_at: string | null;
  status: string;
  resumes: number;
  list_passes: number;
  conversations_listed: number;
  conversations_synced: number;
  conversations_failed: number;
  conversations_deleted: number;
  conversations_inserted: number;
  conversations_updated: number;
  messages_served: number;
  messages_inserted: number;
  messages_updated: number;
  messages_deleted: number;
  requests: number;
  retries: number;
  rate_limited: number;
  export_lines: number;
  export_files: number;
  error: string | null;
}

/** A failure of a run as its line lists it. */
export interface RunLineFailure {
  conversation_id: string;
  code: string;
  status: number | null;
  attempts: number | null;
}

/**
 * The record of a run's `runs` change-log line (the `runs` export stream), from its row, its
 * failures in recorded order and the chain head it ended on.
 *
 * @returns the account, the end time (the start for a run that has not ended) and the record's JSON
 */
export function runLine(r: RunRow, failures: RunLineFailure[], head: LedgerHead | null): { accountId: string; endedAt: string; record: string } {
  const endedAt = r.ended_at ?? r.started_at;
  const record = {
    account_id: r.account_id,
    id: String(r.id),
    scope: r.scope,
    refresh: r.refresh,
    trigger: r.trigger,
    started_at: r.started_at,
    ended_at: endedAt,
    status: r.status,
    resumes: r.resumes,
    list_passes: r.list_passes,
    conversations: {
      listed: r.conversations_listed,
      synced: r.conversations_synced,
      failed: r.conversations_failed,
      deleted: r.conversations_deleted,
      inserted: r.conversations_inserted,
      updated: r.conversations_updated,
    },
    messages: { served: r.messages_served, inserted: r.messages_inserted, updated: r.messages_updated, deleted: r.messages_deleted },
    requests: r.requests,
    retries: r.retries,
    rate_limited: r.rate_limited,
    export: { files: r.export_files, lines: r.export_lines },
    error: r.error,
    failures: failures.map((f) => ({ conversation_id: f.conversation_id, code: f.code, status: f.status, attempts: f.attempts })),
    ledger_head: head ? { batch_id: head.batch_id, hash: head.hash } : null,
  };
  return { accountId: r.account_id, endedAt, record: JSON.stringify(record) };
}
