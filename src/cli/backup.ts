/**
 * `convo-mirror backup FILE`: a consistent copy of the mirror (SQLite's online backup,
 * src/store/sqlite/backup.ts), safe while a `sync` or the daemon writes it, read without the writer lock
 * like `status` and `verify`. The new file is private (0600, or 0640 with
 * `CONVO_MIRROR_GROUP_READABLE`), never written over an existing file, and removed when the backup
 * fails or is interrupted. Progress: a line redrawn on a terminal, a `backup progress` log line
 * every 10 s otherwise. Exit 0 done; 1 the copy failed its check; 2 a setting or path to fix (no
 * mirror, the file exists, its directory is missing, no room); 130 interrupted.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import type { Logger } from 'pino';
import { loadConfig } from '../../config/index.js';
import { createLogger } from '../logger.js';
import { fileModes } from '../private-fs.js';
import { BackupInterrupted, backupMirror, type BackupProgress, type BackupResult } from '../store/sqlite/backup.js';
import { mirrorFileOf } from '../store/open-mirror.js';
import { EXIT, fail, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { isTTY } from './summary.js';

/** Interval of the `backup progress` log lines when stderr is not a terminal, ms. */
const LOG_INTERVAL_MS = 10_000;
/** Interval of the progress line's redraws on a terminal, ms. */
const DRAW_INTERVAL_MS = 200;

const MIB = 1024 * 1024;

/** How the mirror was read, in words. */
const ACCESS_WORDS: Record<BackupResult['access'], string> = {
  shared: 'read through the running writer\'s WAL, at one instant',
  immutable: 'no writer was running',
  'private-copy': 'its WAL read from a private copy: no writer was running',
  'read-write': 'read-write',
};

/**
 * Reports progress: a line redrawn on stderr on a terminal; else a `backup progress` log line every
 * {@link LOG_INTERVAL_MS}. Returns the progress callback and a function that ends the reporting.
 */
function progressReporter(tty: boolean, logger: Logger): { onProgress: (p: BackupProgress) => void; end: () => void } {
  let last = 0;
  let drawn = false;
  const started = Date.now();
  const onProgress = (p: BackupProgress) => {
    const now = Date.now();
    if (now - last < (tty ? DRAW_INTERVAL_MS : LOG_INTERVAL_MS)) return;
    last = now;
    const done = p.totalPages - p.remainingPages;
    const pct = p.totalPages === 0 ? 100 : Math.floor((done / p.totalPages) * 100);
    if (tty) {
      process.stderr.write(`\rbackup: ${pct} % (${done} of ${p.totalPages} pages)\x1b[K`);
      drawn = true;
    } else {
      logger.info({ pages_done: done, pages_total: p.totalPages, elapsed_ms: now - started }, 'backup progress');
    }
  };
  // The first report waits a full interval: a small mirror is copied before anything is shown.
  last = started;
  return { onProgress, end: () => void (drawn && process.stderr.write('\r\x1b[K')) };
}

/** Backs up the configured mirror to `file`; returns the exit code. */
async function backup(file: string, o: Record<string, unknown>): Promise<number> {
  const config = loadConfig(process.env, configFlagsOf(o, 'backup'), { needsApi: false });
  const dbFile = mirrorFileOf(config.db);
  if (dbFile === undefined) return fail(EXIT.CONFIG, 'CONVO_MIRROR_DB names a PostgreSQL database: back it up with pg_dump (backup copies a SQLite mirror file)');
  if (!fs.existsSync(config.db)) return fail(EXIT.CONFIG, `no mirror at ${path.resolve(config.db)} (CONVO_MIRROR_DB): nothing to back up`);
  const tty = isTTY();
  const logger = createLogger({ level: config.logLevel });
  let interrupted: NodeJS.Signals | undefined;
  const onSignal = (sig: NodeJS.Signals) => (interrupted ??= sig);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const progress = progressReporter(tty, logger);
  let result: BackupResult;
  try {
    result = await backupMirror(config.db, file, { modes: fileModes(config.groupReadable), onProgress: progress.onProgress, interrupted: () => interrupted });
  } catch (err) {
    if (err instanceof BackupInterrupted) return fail(EXIT.INTERRUPTED, err.message);
    throw err;
  } finally {
    progress.end();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  const head = result.head ? `ledger head ${result.head.batch_id}:${result.head.hash}` : 'nothing published yet';
  if (!tty) logger.info({ file: result.file, bytes: result.bytes, pages: result.pages, access: result.access, attempts: result.attempts, head: result.head ? `${result.head.batch_id}:${result.head.hash}` : null }, 'backup written');
  process.stdout.write(
    `backup written: ${result.file} (${(result.bytes / MIB).toFixed(1)} MiB; ${ACCESS_WORDS[result.access]})\n` +
      `  checked: PRAGMA quick_check ok; ${head}, watermark ${result.watermark}\n` +
      `  it holds the mirror only: copy the export directory ${config.exportDir} with any tool (its files never change)\n`,
  );
  return EXIT.OK;
}

/** Adds `backup` to `program`. */
export function addBackupCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('backup')
    .argument('<file>', 'the new file (must not exist; its directory must)')
    .description(
      'Write a consistent copy of the mirror to a new file (SQLite online backup), safe while sync or the daemon runs; ' +
        'private (0600, 0640 with --group-readable), never over an existing file, removed if the backup fails. The export directory is not included',
    );
  addConfigFlags(cmd, 'backup').action((file: string, o: Record<string, unknown>) => settle(setExit, () => backup(file, o)));
}
