/**
 * Progress of a long-running command: a cli-progress bar on a TTY, a structured `progress` log line
 * every 10 s otherwise; both carry conversations done of total, messages, requests per second over
 * the last 10 s and the time left at that pace (ETA).
 */
import { createRequire } from 'node:module';
import type CliProgress from 'cli-progress';

/** cli-progress is loaded only for a terminal's bar. */
const loadCliProgress = (): typeof CliProgress => createRequire(import.meta.url)('cli-progress') as typeof CliProgress;
import type { Logger } from 'pino';
import type { ApiStats } from './api/client.js';
import type { SyncProgress } from './sync/types.js';

/** What the bar and the log lines show beyond the counters: the request rate and the time left. */
export interface ProgressRates {
  /** Requests per second over the last {@link RATE_WINDOW_MS} (since the start before that). */
  requestsPerSec: number;
  /** Seconds until every known conversation is done at the recent pace; undefined while unknown. */
  etaSec: number | undefined;
}

/** The window the rates are measured over, ms. */
export const RATE_WINDOW_MS = 10_000;

/** One observation: when (ms, monotonic), requests sent and conversations done so far. */
export interface ProgressSample {
  atMs: number;
  requests: number;
  done: number;
}

/**
 * Rates from samples, oldest first (the last is now): requests/s and the ETA of `total`
 * conversations over the span from the newest sample at least {@link RATE_WINDOW_MS} older than
 * the last (else the oldest) to the last; no ETA while `total` is 0.
 */
export function progressRates(samples: readonly ProgressSample[], total: number): ProgressRates {
  const last = samples.at(-1);
  // The base: the newest sample at least a window old (a line logged every window finds the one
  // before it, even a few ms late), else the oldest there is.
  const first = last === undefined ? undefined : (samples.findLast((x) => x.atMs <= last.atMs - RATE_WINDOW_MS) ?? samples[0]);
  if (!last || !first || last.atMs <= first.atMs) return { requestsPerSec: 0, etaSec: undefined };
  const sec = (last.atMs - first.atMs) / 1000;
  const donePerSec = (last.done - first.done) / sec;
  const left = Math.max(0, total - last.done);
  return {
    requestsPerSec: Math.round(((last.requests - first.requests) / sec) * 10) / 10,
    // No total yet (the list is still being read): no ETA rather than "0s".
    etaSec: total === 0 ? undefined : left === 0 ? 0 : donePerSec > 0 ? Math.ceil(left / donePerSec) : undefined,
  };
}

/** `1h02m`, `3m05s`, `42s`, or `?` when unknown. */
export function formatEta(sec: number | undefined): string {
  if (sec === undefined) return '?';
  const h = Math.floor(sec / 3600);
  const m = Math.floor((sec % 3600) / 60);
  const s = sec % 60;
  if (h > 0) return `${h}h${String(m).padStart(2, '0')}m`;
  return m > 0 ? `${m}m${String(s).padStart(2, '0')}s` : `${s}s`;
}

/** Options of {@link startProgress}. */
export interface ProgressOptions {
  progress: SyncProgress;
  stats: ApiStats;
  logger: Logger;
  /** Draw a bar (stderr is a terminal) instead of logging. */
  tty: boolean;
  /** Log interval when not on a TTY, ms. @defaultValue 10000 */
  intervalMs?: number;
}

/** Keeps the samples of the last {@link RATE_WINDOW_MS} and gives the rates. */
function rateMeter(progress: SyncProgress, stats: ApiStats): () => ProgressRates {
  const samples: ProgressSample[] = [];
  return () => {
    const now = performance.now();
    samples.push({ atMs: now, requests: stats.requests, done: progress.conversationsDone });
    while (samples.length > 2 && samples[1]!.atMs < now - RATE_WINDOW_MS) samples.shift();
    return progressRates(samples, progress.conversationsTotal);
  };
}

/** What the bar and the log line show, read at each draw or line. */
type Payload = () => { messages: number; requests: number; retries: number; failed: number; rps: number; eta: string; etaSec: number | undefined };

/** Starts reporting; call the returned function to stop (it draws or logs a final state). */
export function startProgress(opts: ProgressOptions): () => void {
  const { progress, stats } = opts;
  const rates = rateMeter(progress, stats);
  const payload: Payload = () => {
    const r = rates();
    return {
      messages: progress.messagesServed,
      requests: stats.requests,
      retries: stats.retries,
      failed: progress.conversationsFailed,
      rps: r.requestsPerSec,
      eta: formatEta(r.etaSec),
      etaSec: r.etaSec,
    };
  };
  if (opts.tty) return startBar(progress, payload);
  const log = () => {
    const { rps, etaSec, eta, ...counts } = payload();
    opts.logger.info(
      { conversations_done: progress.conversationsDone, conversations_total: progress.conversationsTotal, ...counts, requests_per_sec: rps, eta_s: etaSec ?? null, eta },
      'progress',
    );
  };
  // A first sample now, so the first line's rates span the whole interval.
  rates();
  const timer = setInterval(log, opts.intervalMs ?? 10_000);
  timer.unref();
  return () => clearInterval(timer);
}

/** The terminal's bar, redrawn every 100 ms; the returned function draws the last state and stops it. */
function startBar(progress: SyncProgress, payload: Payload): () => void {
  const cliProgress = loadCliProgress();
  const bar = new cliProgress.SingleBar(
    {
      format: 'conversations {bar} {value}/{total} | messages {messages} | {rps} req/s | ETA {eta} | requests {requests} | retries {retries} | failed {failed}',
      hideCursor: true,
      stream: process.stderr,
      fps: 10,
    },
    cliProgress.Presets.shades_classic,
  );
  bar.start(Math.max(progress.conversationsTotal, 1), 0, payload());
  const draw = () => {
    bar.setTotal(Math.max(progress.conversationsTotal, 1));
    bar.update(progress.conversationsDone, payload());
  };
  const timer = setInterval(draw, 100);
  return () => {
    clearInterval(timer);
    draw();
    bar.stop();
  };
}
