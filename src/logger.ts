/**
 * Logger construction: pino JSON to stderr, with the API key redacted wherever it could appear
 * and a logged `config.db` shown with its PostgreSQL password masked (design habit 5). Errors and log fields carry paths, never headers. Log lines carry ids and
 * errors from the API, a webhook's sender or Redis, so no code point a terminal would interpret is
 * written raw (src/terminal.ts): JSON lines write them `\uXXXX` (same values), pretty lines show
 * them as `\u{XXXX}`.
 */
import { pino, type Logger, type LevelWithSilent } from 'pino';
import { createRequire } from 'node:module';
import type PinoPretty from 'pino-pretty';
import { escapeJsonText, visibleJsonText } from './terminal.js';
import { dbShown } from '../config/db-url.js';

/** pino-pretty is loaded only for a terminal (it costs memory a daemon or a piped run never needs). */
const loadPretty = (): typeof PinoPretty => createRequire(import.meta.url)('pino-pretty') as typeof PinoPretty;

/** Paths pino removes from every log line. */
export const REDACT_PATHS = [
  'apiKey',
  '*.apiKey',
  'api_key',
  '*.api_key',
  'headers["x-api-key"]',
  '*.headers["x-api-key"]',
  'headers.authorization',
  '*.headers.authorization',
  'config.apiKey',
  'config.db',
];

/** Paths of {@link REDACT_PATHS} whose value is shown masked rather than removed: a mirror target (`CONVO_MIRROR_DB`). */
const MASKED_PATHS = new Set(['config.db']);

/** pino's censor: a mirror target keeps its shape with a PostgreSQL password masked ({@link dbShown}); anything else is removed. */
function censor(value: unknown, path: string[]): unknown {
  return MASKED_PATHS.has(path.join('.')) && typeof value === 'string' ? dbShown(value) : '[redacted]';
}

/** Options of {@link createLogger}. */
export interface LoggerOptions {
  level: LevelWithSilent;
  /** Human-readable lines (pino-pretty) instead of JSON, for terminals. @defaultValue false */
  pretty?: boolean;
  /** Where lines go. @defaultValue stderr (fd 2) */
  destination?: NodeJS.WritableStream | number;
}

/** Creates the process's root logger. */
export function createLogger(opts: LoggerOptions): Logger {
  const base = { level: opts.level, redact: { paths: REDACT_PATHS, censor }, base: { app: 'convo-mirror' } };
  if (opts.pretty) {
    return pino({ ...base, hooks: { streamWrite: visibleJsonText } }, loadPretty()({
        destination: typeof opts.destination === 'number' ? opts.destination : 2,
        sync: true,
        colorize: true,
        singleLine: true,
        ignore: 'pid,hostname,app',
      }));
  }
  const dest = opts.destination ?? 2;
  return pino({ ...base, hooks: { streamWrite: escapeJsonText } }, typeof dest === 'number' ? pino.destination({ dest, sync: true }) : dest);
}
