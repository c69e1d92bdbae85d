/**
 * What the commands print: the run summary (stdout), the failures (stderr), the mirror's status
 * and the queue's.
 */
import type { RunSummary } from '../run/index.js';
import { LIST_FAILURE_ID } from '../sync/workspace.js';
import type { QueueStatus } from '../../jobs/admin.js';
import type { StatusResult } from './read-only.js';
import { escapeForTerminal, jsonForTerminal } from '../terminal.js';

/** Whether stderr is a terminal (a progress bar and pretty logs instead of JSON lines). */
export const isTTY = (): boolean => process.stderr.isTTY === true;

/** The run's summary lines, e.g. `run 3 (workspace, incremental) succeeded in 1.2 s`. */
export function summaryLines(s: RunSummary): string[] {
  const c = s.conversations;
  const m = s.messages;
  return [
    `run ${s.runId} (${s.scope === 'conversations' ? 'named conversations' : 'workspace'}, ${s.refresh === 'full' ? 'full refresh' : 'incremental'}) ${s.status} in ${(s.durationMs / 1000).toFixed(1)} s`,
    `  conversations: ${conversationsSynced(c)}, ${c.deleted} tombstoned, ${c.failed} failed` +
      (c.notSynced ? `, ${c.notSynced} not synced (the run stopped early)` : '') +
      (s.scope === 'workspace' ? ` (${c.listed} listed in ${s.listPasses} pass${s.listPasses === 1 ? '' : 'es'}${s.listConfirmed ? '' : ', listing NOT confirmed complete'})` : ''),
    `  messages: ${m.served} served; ${m.inserted} inserted, ${m.updated} updated, ${m.deleted} tombstoned` + (m.restarts ? `; ${m.restarts} crawl restarts` : ''),
    `  requests: ${s.requests} (a full crawl needs at least ${s.minimumRequests}), ${s.retries} retries, ${s.rateLimited} answered 429`,
    exportLine(s.export, s.status === 'succeeded'),
  ];
}

/**
 * `N synced`, and `M skipped (change signal unmoved)` apart when there are any: "synced" counts only
 * the conversations the run asked the API about.
 */
function conversationsSynced(c: RunSummary['conversations']): string {
  const skipped = c.skipped ?? 0;
  return `${c.synced - skipped} synced` + (skipped ? `, ${skipped} skipped (change signal unmoved)` : '');
}

function exportLine(e: RunSummary['export'], succeeded: boolean): string {
  return exportFigures(e, succeeded) + (e.head ? `\n  ledger head: ${e.head.batch_id}:${e.head.hash} (note it; verify --head proves the archive still holds everything up to it)` : '');
}

function exportFigures(e: RunSummary['export'], succeeded: boolean): string {
  if (e.error !== undefined) {
    return (
      `  exports: publication FAILED (${escapeForTerminal(e.error)}); ` +
      `${e.lines ? `${e.lines} lines in ${e.files} files were published before it; ` : ''}` +
      'every committed change stays in the change log and the next run publishes it'
    );
  }
  // "Nothing changed" only when the run could tell: a failed run may have missed changes.
  const held = e.held ? `; ${e.held.lines === 1 ? "this run's line waits" : `${e.held.lines} run lines (this run's too) wait`} for the next publication with changes, at the latest the first after ${e.held.until}` : '';
  if (e.lines === 0 && !succeeded) return `  exports: no new lines (watermark ${e.watermark})${held}`;
  return e.lines === 0
    ? `  exports: no new lines: nothing changed since the last publication (watermark ${e.watermark})${held}`
    : `  exports: ${e.lines} new lines in ${e.files} files (watermark ${e.watermark})${held}`;
}

/**
 * Prints the run summary to stdout: {@link summaryLines}, or the whole summary as JSON (code points
 * a terminal would interpret written `\uXXXX`, src/terminal.ts).
 * @param label - with several workspaces, `account <id>`: put before the first line (`account <id>: run 3 ...`)
 */
export function printSummary(s: RunSummary, json: boolean, label?: string): void {
  const lines = summaryLines(s);
  if (label !== undefined) lines[0] = `${escapeForTerminal(label)}: ${lines[0]}`;
  process.stdout.write(json ? jsonForTerminal(s, 2) + '\n' : lines.join('\n') + '\n');
}

/**
 * Names each failed conversation (or the conversation list) on stderr: `failed: conversation <id>: [CODE] message`
 * (`failed: account <id>: conversation ...` with a `label`); ids and messages come from the API, so
 * each line is escaped for the terminal ({@link escapeForTerminal}).
 */
export function reportFailures(s: RunSummary, label?: string): void {
  for (const f of s.failures) {
    const what = f.id === LIST_FAILURE_ID ? 'conversation list' : `conversation ${f.id}`;
    process.stderr.write(escapeForTerminal(`failed: ${label === undefined ? '' : `${label}: `}${what}: [${f.code}] ${f.message}`) + '\n');
  }
}

/**
 * `status`'s mirror part: counts per table, the last runs, the failures of the last run; each line
 * escaped for the terminal (ids and errors come from the API).
 */
export function formatStatus(db: string, { counts, runs, failures, head }: StatusResult): string[] {
  const out: string[] = [`mirror ${db}`];
  for (const [k, v] of Object.entries(counts)) out.push(`  ${k.padEnd(26)} ${v}`);
  out.push(`  ${'ledger head'.padEnd(26)} ${head ? `${head.batch_id}:${head.hash}` : 'none (nothing published yet)'}`);
  const pending = (counts as Partial<Record<string, number>>).erasures_pending ?? 0;
  if (pending > 0) {
    out.push(`erasures pending: ${pending} recorded in the mirror, waiting for the archive step (the next convo-mirror erase or sync, or a daemon's publication, finishes ${pending === 1 ? 'it' : 'them'})`);
  }
  out.push('last runs:');
  for (const r of runs) {
    out.push(
      `  #${r.id} ${r.scope ?? r.mode}${r.refresh ? ` ${r.refresh}` : ''}${r.trigger ? ` (${r.trigger})` : ''} ${r.status} started ${r.started_at}${r.ended_at ? ` ended ${r.ended_at}` : ''}: ` +
        `${r.conversations_synced} conversations, +${r.messages_inserted} ~${r.messages_updated} -${r.messages_deleted} messages, ` +
        `${r.requests} requests, ${r.retries} retries, ${r.conversations_failed} failed, ${r.export_lines} export lines` +
        (r.error ? `; error: ${r.error}` : '') +
        (r.ledger_hash ? `; head ${r.ledger_batch_id}:${String(r.ledger_hash).slice(0, 12)}…` : ''),
    );
  }
  if (failures.length) {
    out.push('failures of the last run:');
    for (const f of failures) out.push(`  ${f.conversation_id}: [${f.code}] ${f.message}`);
  }
  return out.map(escapeForTerminal);
}

/**
 * `status`'s queue part: counts, schedulers and the failed jobs (dead letters); each line escaped
 * for the terminal (job data and failure reasons come from Redis).
 */
export function formatQueueStatus(q: QueueStatus): string[] {
  if ('error' in q) return [escapeForTerminal(`queue: unavailable (${q.error})`)];
  const out = [`queue ${q.prefix} on ${q.redis}: ` + Object.entries(q.counts).map(([k, v]) => `${k} ${v}`).join(', ')];
  out.push('schedulers:');
  if (q.schedulers.length === 0) out.push('  none (start convo-mirror daemon)');
  for (const s of q.schedulers) out.push(`  ${s.id}: ${s.pattern} (${s.tz ?? 'UTC'}), next run ${s.next ?? 'unknown'}`);
  if (q.failed.length) {
    out.push('failed jobs (dead letter; convo-mirror retry-failed re-queues them):');
    for (const f of q.failed) out.push(`  ${f.id} ${f.name}${f.conversation_id ? ` ${f.conversation_id}` : ''} after ${f.attempts} attempts at ${f.failed_at}: ${f.reason}`);
  }
  return out.map(escapeForTerminal);
}
