/**
 * `convo-mirror status`: counts per table, the last runs and their failures, and the job queue
 * with the daemons serving it and what each is doing, read without the writer lock. Read-only in
 * Redis too: the queue is read without writing a key (jobs/admin.ts `queueStatus`), so a prefix
 * never used stays empty. `CONVO_MIRROR_DB` is shown with a PostgreSQL password masked.
 */
import type { Command } from 'commander';
import { dbShown } from '../../config/db-url.js';
import { formatDuration } from '../../config/duration.js';
import type { ActiveJob, QueueStatus } from '../../jobs/admin.js';
import { EXIT, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, queueSettings } from './flags.js';
import { statusOf, withExistingMirror } from './read-only.js';
import { formatQueueStatus, formatStatus } from './summary.js';
import { escapeForTerminal, jsonForTerminal } from '../terminal.js';

/** One running job, as a line of {@link formatDaemons}. */
function jobLine(j: ActiveJob): string {
  const what = [j.account_id !== undefined ? `account ${j.account_id}` : undefined, j.conversation_id !== undefined ? `conversation ${j.conversation_id}` : undefined].filter(Boolean);
  const running = j.running_ms !== undefined ? `running ${formatDuration(j.running_ms)}` : 'running';
  return `    job ${j.id ?? '?'} ${j.name}${what.length > 0 ? ` (${what.join(', ')})` : ''}: ${running}, attempt ${j.attempt}`;
}

/**
 * `status`'s daemons part: each daemon serving the queue prefix (its worker's name
 * `<hostname>:<pid>`, where it connects from, for how long) with the jobs it runs now; then the
 * running jobs no connected daemon claims (a daemon gone: they run again once their lock
 * expires). Nothing when the queue could not be read (the queue line says why). Each line is
 * escaped for the terminal (names and job data come from Redis).
 */
export function formatDaemons(q: QueueStatus): string[] {
  if ('error' in q) return [];
  const out: string[] = [];
  if (q.workers.length === 0) out.push(`daemons serving ${q.prefix}: none (start convo-mirror daemon)`);
  else out.push(`daemons serving ${q.prefix}: ${q.workers.length}`);
  const names = new Set(q.workers.map((w) => w.name));
  for (const w of q.workers) {
    const jobs = q.active.filter((j) => j.worker === w.name);
    const where = [w.addr !== undefined ? `from ${w.addr}` : undefined, w.connected_s !== undefined ? `connected ${formatDuration(w.connected_s * 1000)}` : undefined].filter(Boolean);
    out.push(`  ${w.name}${where.length > 0 ? ` (${where.join(', ')})` : ''}: ${jobs.length === 0 ? 'idle' : `${jobs.length} job${jobs.length === 1 ? '' : 's'} running`}`);
    for (const j of jobs) out.push(jobLine(j));
  }
  const orphans = q.active.filter((j) => j.worker === undefined || !names.has(j.worker));
  if (orphans.length > 0) {
    out.push('running jobs of no connected daemon (they run again once their lock expires):');
    for (const j of orphans) out.push(`${jobLine(j)}${j.worker !== undefined ? ` (was ${j.worker})` : ''}`);
  }
  return out.map(escapeForTerminal);
}

/** Adds `status` to `program`. */
export function addStatusCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('status')
    .description('Show counts per table, the last runs and their failures, the export watermark, and the job queue (counts, schedulers, failed jobs, the daemons serving it and their running jobs)')
    .option('--json', 'print as JSON');
  addConfigFlags(cmd, 'status').action((o) =>
    withExistingMirror(configFlagsOf(o, 'status'), setExit, statusOf, async (status, config) => {
      const { queueStatus } = await import('../../jobs/admin.js'); // the queue's libraries load only here
      const queue = await queueStatus(queueSettings(config));
      const db = dbShown(config.db);
      if (o.json) {
        // Ids and errors come from the API and Redis: no code point a terminal interprets is written raw.
        process.stdout.write(jsonForTerminal({ db, counts: status.counts, ledger_head: status.head ?? null, runs: status.runs, failures: status.failures, queue }, 2) + '\n');
      } else {
        process.stdout.write([...formatStatus(db, status), ...formatQueueStatus(queue), ...formatDaemons(queue)].join('\n') + '\n');
      }
      return EXIT.OK;
    }),
  );
}
