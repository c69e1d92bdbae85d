/**
 * Progress of a long-running command: a cli-progress bar on a TTY, a structured `progress` log line
 * every few seconds otherwise.
 */
import { createRequire } from 'node:module';
import type CliProgress from 'cli-progress';

/** cli-progress is loaded only for a terminal's bar. */
const loadCliProgress = (): typeof CliProgress => createRequire(import.meta.url)('cli-progress') as typeof CliProgress;
import type { Logger } from 'pino';
import type { ApiStats } from './api/client.js';
import type { SyncProgress } from './sync/types.js';

/** Options of {@link startProgress}. */
export interface ProgressOptions {
  progress: SyncProgress;
  stats: ApiStats;
  logger: Logger;
  /** Draw a bar (stderr is a terminal) instead of logging. */
  tty: boolean;
  /** Log interval when not on a TTY, ms. @defaultValue 5000 */
  intervalMs?: number;
}

/** Starts reporting; call the returned function to stop (it draws or logs a final state). */
export function startProgress(opts: ProgressOptions): () => void {
  const { progress, stats } = opts;
  const payload = () => ({
    messages: progress.messagesServed,
    requests: stats.requests,
    retries: stats.retries,
    failed: progress.conversationsFailed,
  });
  if (opts.tty) {
    const cliProgress = loadCliProgress();
    const bar = new cliProgress.SingleBar(
      {
        format: 'conversations {bar} {value}/{total} | messages {messages} | requests {requests} | retries {retries} | failed {failed}',
        hideCursor: true,
        stream: process.stderr,
        fps: 10,
      },
      cliProgress.Presets.shades_classic,
    );
    bar.start(Math.max(progress.conversationsTotal, 1), 0, payload());
    const timer = setInterval(() => {
      bar.setTotal(Math.max(progress.conversationsTotal, 1));
      bar.update(progress.conversationsDone, payload());
    }, 100);
    return () => {
      clearInterval(timer);
      bar.setTotal(Math.max(progress.conversationsTotal, 1));
      bar.update(progress.conversationsDone, payload());
      bar.stop();
    };
  }
  const log = () =>
    opts.logger.info(
      { conversations_done: progress.conversationsDone, conversations_total: progress.conversationsTotal, ...payload() },
      'progress',
    );
  const timer = setInterval(log, opts.intervalMs ?? 5000);
  timer.unref();
  return () => clearInterval(timer);
}
