/**
 * `convo-mirror conversations`: the mirrored conversations, newest update first, so that
 * `sync --conversation ID` and `enqueue --conversation ID` have their ids. Read-only like `status`
 * (no writer lock, no write, no migration, a consistent snapshot) and never reaches Redis.
 */
import type { Command } from 'commander';
import { ConfigError } from '../errors.js';
import type { ConversationFilter, ConversationListing, ConversationSummary } from '../store/mirror.js';
import { EXIT, exitFor, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { withExistingMirror } from './read-only.js';
import { escapeForTerminal, jsonForTerminal } from '../terminal.js';

/** Conversations listed when `--limit` is not given. */
export const DEFAULT_LIMIT = 50;

/** commander's parsed options of `conversations` (configuration flags aside). */
interface ConversationsOptions {
  status?: string[];
  since?: string;
  limit: string;
  account?: string[];
  deleted?: boolean;
  includeDeleted?: boolean;
  json?: boolean;
}

/** `YYYY-MM-DD`, optionally `THH:MM[:SS[.fff]]` with a zone (`Z` or `±HH:MM`). */
const ISO_TIME = /^(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?(?:([Zz])|([+-])(\d{2}):?(\d{2})))?$/;

/** Days in `month` (1-12) of `year`, proleptic Gregorian. */
function daysIn(year: number, month: number): number {
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  return month === 2 ? (leap ? 29 : 28) : [4, 6, 9, 11].includes(month) ? 30 : 31;
}

/**
 * Parses `--since`: an ISO 8601 date (`2025-06-01`, midnight UTC) or date and time with a zone
 * (`2025-06-01T12:00:00Z`, `2025-06-01T14:00:00.5+02:00`); fractions of a second are rounded to
 * the millisecond, as SQLite reads the served times.
 *
 * @returns the instant, ms since the epoch
 * @throws {@link ConfigError} naming `--since` for anything else (a time without a zone, 24:00, Feb 30)
 */
export function parseSince(text: string): number {
  const m = ISO_TIME.exec(text.trim());
  const bad = () => new ConfigError('--since', `must be an ISO 8601 date, or a date and time with a zone, such as 2025-06-01 or 2025-06-01T12:00:00Z (got ${JSON.stringify(text)})`);
  if (!m) throw bad();
  const [y, mo, d] = [Number(m[1]), Number(m[2]), Number(m[3])];
  const [h, mi, s] = [Number(m[4] ?? 0), Number(m[5] ?? 0), Number(m[6] ?? 0)];
  const [oh, om] = [Number(m[10] ?? 0), Number(m[11] ?? 0)];
  if (m[4] !== undefined && m[8] === undefined && m[9] === undefined) throw bad();
  if (mo < 1 || mo > 12 || d < 1 || d > daysIn(y, mo) || h > 23 || mi > 59 || s > 59 || oh > 23 || om > 59) throw bad();
  const t = new Date(0);
  t.setUTCFullYear(y, mo - 1, d);
  t.setUTCHours(h, mi, s, 0);
  const fractionMs = m[7] === undefined ? 0 : Math.round(Number(`0.${m[7]}`) * 1000);
  const offsetMs = (m[9] === '-' ? -1 : 1) * (oh * 60 + om) * 60_000;
  return t.getTime() + fractionMs - offsetMs;
}

/**
 * Parses `--limit`: a whole number >= 0; 0 means no limit.
 *
 * @returns the limit, undefined for 0 (all)
 * @throws {@link ConfigError} naming `--limit` for anything else
 */
export function parseLimit(text: string): number | undefined {
  const n = /^\s*\d+\s*$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(n)) throw new ConfigError('--limit', `must be a whole number >= 0 (0 lists every conversation), got ${JSON.stringify(text)}`);
  return n === 0 ? undefined : n;
}

/** The non-empty values of a repeatable flag, trimmed. @throws {@link ConfigError} naming `flag` for an empty one */
function values(flag: string, given: string[] | undefined): string[] | undefined {
  if (given === undefined) return undefined;
  return given.map((v) => {
    if (v.trim() === '') throw new ConfigError(flag, 'must not be empty');
    return v.trim();
  });
}

/** The store's filter from the command's options. @throws {@link ConfigError} naming the flag at fault */
function filterOf(o: ConversationsOptions): ConversationFilter {
  return {
    accountIds: values('--account', o.account),
    statuses: values('--status', o.status),
    sinceMs: o.since === undefined ? undefined : parseSince(o.since),
    includeDeleted: o.deleted === true || o.includeDeleted === true,
    limit: parseLimit(o.limit),
  };
}

/** A conversation as `--json` prints it: stable snake_case keys, in this order, null when unknown. */
function jsonOf(c: ConversationSummary): Record<string, string | number | null> {
  return { id: c.id, account_id: c.accountId, status: c.status, updated_at: c.updatedAt, messages: c.messages, last_synced_at: c.lastSyncedAt, deleted_at: c.deletedAt };
}

/**
 * A value as a table cell: `-` for none, every code point a terminal would interpret escaped
 * (src/terminal.ts: served text never drives the terminal).
 */
function cell(v: string | null): string {
  if (v === null) return '-';
  if (v === '') return '""';
  return escapeForTerminal(v);
}

/** The last line of a listing `--limit` cut, else undefined. */
export function moreLine(listing: ConversationListing): string | undefined {
  const more = listing.total - listing.rows.length;
  return more > 0 ? `${more} more not shown (${listing.total} in all; --limit 0 lists them all)` : undefined;
}

/**
 * The plain output: an aligned table (the message count right-aligned; a `deleted` column with
 * `withDeleted`), then a line saying how many more there are when `--limit` cut the list.
 */
export function formatConversations(listing: ConversationListing, withDeleted: boolean): string[] {
  if (listing.rows.length === 0) return ['no conversations match'];
  const head = ['id', 'account', 'status', 'updated', 'messages', 'last synced', ...(withDeleted ? ['deleted'] : [])];
  const rows = listing.rows.map((c) => [cell(c.id), cell(c.accountId), cell(c.status), cell(c.updatedAt), String(c.messages), cell(c.lastSyncedAt), ...(withDeleted ? [cell(c.deletedAt)] : [])]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (r: string[]) => r.map((v, i) => (i === 4 ? v.padStart(widths[i]!) : v.padEnd(widths[i]!))).join('  ').trimEnd();
  const more = moreLine(listing);
  return [line(head), ...rows.map(line), ...(more ? [more] : [])];
}

/** Writes the listing (plain or `--json`) to stdout; with `--json`, a cut list is noted on stderr. */
function printListing(listing: ConversationListing, o: ConversationsOptions): number {
  if (o.json) {
    process.stdout.write(jsonForTerminal(listing.rows.map(jsonOf), 2) + '\n');
    const more = moreLine(listing);
    if (more) process.stderr.write(`convo-mirror: ${more}\n`);
  } else {
    process.stdout.write(formatConversations(listing, o.deleted === true || o.includeDeleted === true).join('\n') + '\n');
  }
  return EXIT.OK;
}

/** Adds `conversations` to `program`. */
export function addConversationsCommand(program: Command, setExit: SetExit): void {
  const collect = (v: string, prev: string[] = []) => [...prev, v];
  const cmd = program
    .command('conversations')
    .description('List the mirrored conversations, newest update first: id, account, status, updated (as served), live messages, last synced (read-only)')
    .option('--status <status>', 'only conversations with this status as served (repeatable: any of them)', collect)
    .option('--since <time>', 'only conversations updated at or after this ISO 8601 time (2025-06-01 is midnight UTC; a time needs Z or an offset)')
    .option('--limit <n>', 'at most n conversations, newest first; 0 = all', String(DEFAULT_LIMIT))
    .option('--account <id>', 'only this account (repeatable); default: every account in the mirror', collect)
    .option('--deleted', 'also list conversations deleted upstream (tombstoned), with when')
    .option('--include-deleted', 'same as --deleted')
    .option('--json', 'print a JSON array of {id, account_id, status, updated_at, messages, last_synced_at, deleted_at}');
  addConfigFlags(cmd, 'conversations').action(async (o: ConversationsOptions & Record<string, unknown>) => {
    let filter: ConversationFilter;
    try {
      filter = filterOf(o);
    } catch (err) {
      setExit(exitFor(err));
      return;
    }
    await withExistingMirror(configFlagsOf(o, 'conversations'), setExit, (mirror) => mirror.listConversations(filter), (listing) => printListing(listing, o));
  });
}
