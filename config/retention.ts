/**
 * `CONVO_MIRROR_RETENTION` (issue 26, item 3): how long the archive keeps published export files,
 * by their date partition. Parsed here (pure); applied by the publisher (src/export/retention.ts).
 *
 * Syntax: empty or `none` keeps everything (the default); one limit for every stream (`400d`,
 * `52w`, `7y`); or limits per stream, comma-separated (`messages=400d,conversations=7y`: a stream
 * not named is kept forever). Units: `d` (days), `w` (weeks of 7 days), `y` (calendar years). No
 * months: `m` means minutes in every other duration of the configuration, and a month has no fixed
 * length. A limit is between 1 day and 100 years.
 */
import { z } from 'zod';

/** The streams of the export. */
export const RETENTION_STREAMS = ['messages', 'conversations', 'runs'] as const;
/** A stream of the export. */
export type RetentionStream = (typeof RETENTION_STREAMS)[number];

/** One limit: a number of days, weeks or calendar years. */
export interface RetentionLimit {
  amount: number;
  unit: 'd' | 'w' | 'y';
}

/** A parsed retention policy. */
export interface RetentionPolicy {
  /** Each stream's limit; a stream absent is kept forever. */
  streams: Partial<Record<RetentionStream, RetentionLimit>>;
  /** The canonical text: `400d` when one limit covers every stream, else `messages=400d,runs=7y` (streams in the order messages, conversations, runs). */
  text: string;
  /**
   * Also expire the messages of the mirror created before the `messages` cutoff, by a retention
   * erasure (`CONVO_MIRROR_PRUNE_MIRROR`, `--prune-mirror`; src/export/retention.ts `pruneMirror`).
   * Set from that setting, never parsed from the policy's text. @defaultValue false
   */
  pruneMirror?: boolean;
}

const LIMIT_RE = /^([1-9]\d{0,5})([dwy])$/;
const MAX_DAYS = 36_525;

/** A limit's text (`400d`). */
function limitText(l: RetentionLimit): string {
  return `${l.amount}${l.unit}`;
}

/** A limit's length in days, roughly (a year as 365.25 days): only to bound it. */
function approxDays(l: RetentionLimit): number {
  return l.unit === 'd' ? l.amount : l.unit === 'w' ? l.amount * 7 : l.amount * 365.25;
}

/**
 * Parses a retention setting (see the module comment).
 *
 * @returns the policy; undefined for an empty value or `none` (keep everything)
 * @throws Error saying what is wrong (`"400" has no unit: write 400d, 52w or 7y`, `unknown stream
 *   "msgs"`, `messages is given twice`, a limit outside 1 day to 100 years)
 */
export function parseRetention(value: string): RetentionPolicy | undefined {
  const text = value.trim();
  if (text === '' || text.toLowerCase() === 'none') return undefined;
  const limit = (s: string): RetentionLimit => {
    const m = LIMIT_RE.exec(s.trim());
    if (!m) {
      if (/^\d+$/.test(s.trim())) throw new Error(`"${s.trim()}" has no unit: write ${s.trim()}d (days), ${s.trim()}w (weeks) or ${s.trim()}y (years)`);
      throw new Error(`"${s.trim()}" is not a limit: a whole number of days, weeks or years, e.g. 400d, 52w, 7y (no months: m would read as minutes)`);
    }
    const l = { amount: Number(m[1]), unit: m[2] as RetentionLimit['unit'] };
    if (approxDays(l) > MAX_DAYS) throw new Error(`${limitText(l)} is more than 100 years`);
    return l;
  };
  if (!text.includes('=')) {
    const l = limit(text);
    return { streams: { messages: l, conversations: l, runs: l }, text: limitText(l) };
  }
  const streams: Partial<Record<RetentionStream, RetentionLimit>> = {};
  for (const part of text.split(',')) {
    const eq = part.indexOf('=');
    if (eq === -1) throw new Error(`"${part.trim()}" names no stream: write stream=limit, e.g. messages=400d`);
    const name = part.slice(0, eq).trim();
    if (!(RETENTION_STREAMS as readonly string[]).includes(name)) throw new Error(`unknown stream "${name}": one of ${RETENTION_STREAMS.join(', ')}`);
    if (streams[name as RetentionStream]) throw new Error(`${name} is given twice`);
    streams[name as RetentionStream] = limit(part.slice(eq + 1));
  }
  const named = RETENTION_STREAMS.filter((s) => streams[s]);
  const first = streams[named[0]!]!;
  const same = named.length === RETENTION_STREAMS.length && named.every((s) => limitText(streams[s]!) === limitText(first));
  return { streams, text: same ? limitText(first) : named.map((s) => `${s}=${limitText(streams[s]!)}`).join(',') };
}

/**
 * The first day a limit keeps, `YYYY-MM-DD` (UTC): `now`'s UTC day minus the limit (days and weeks
 * exactly; years by the calendar, the same month and day, a 29 February becoming 1 March). A file
 * whose partition date is before it has expired.
 *
 * @param nowMs - the clock, ms since the epoch
 */
export function cutoffDay(limit: RetentionLimit, nowMs: number): string {
  const d = new Date(nowMs);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const day = d.getUTCDate();
  const cut = limit.unit === 'y' ? Date.UTC(y - limit.amount, m, day) : Date.UTC(y, m, day - limit.amount * (limit.unit === 'w' ? 7 : 1));
  return new Date(cut).toISOString().slice(0, 10);
}

/** The zod schema of the setting: a string parsed by {@link parseRetention}. */
export function retentionSetting(): z.ZodType<RetentionPolicy | undefined, string> {
  return z.string().transform((value, ctx) => {
    try {
      return parseRetention(value);
    } catch (err) {
      ctx.addIssue({ code: 'custom', message: (err as Error).message });
      return z.NEVER;
    }
  });
}
