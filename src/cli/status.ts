/**
 * `convo-mirror status`: counts per table, the last runs and their failures, and the job queue,
 * read without the writer lock. Read-only in Redis too: the queue is read without writing a key
 * (jobs/admin.ts `queueStatus`), so a prefix never used stays empty.
 */
import type { Command } from 'commander';
import { EXIT, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf, queueSettings } from './flags.js';
import { statusOf, withExistingMirror } from './read-only.js';
import { formatQueueStatus, formatStatus } from './summary.js';
import { jsonForTerminal } from '../terminal.js';

/** Adds `status` to `program`. */
export function addStatusCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('status')
    .description('Show counts per table, the last runs and their failures, the export watermark, and the job queue (counts, schedulers, failed jobs)')
    .option('--json', 'print as JSON');
  addConfigFlags(cmd, 'status').action((o) =>
    withExistingMirror(configFlagsOf(o, 'status'), setExit, statusOf, async (status, config) => {
      const { queueStatus } = await import('../../jobs/admin.js'); // the queue's libraries load only here
      const queue = await queueStatus(queueSettings(config));
      if (o.json) {
        // Ids and errors come from the API and Redis: no code point a terminal interprets is written raw.
        process.stdout.write(jsonForTerminal({ db: config.db, counts: status.counts, ledger_head: status.head ?? null, runs: status.runs, failures: status.failures, queue }, 2) + '\n');
      } else {
        process.stdout.write([...formatStatus(config.db, status), ...formatQueueStatus(queue)].join('\n') + '\n');
      }
      return EXIT.OK;
    }),
  );
}
