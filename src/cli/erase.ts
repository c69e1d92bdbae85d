/**
 * `convo-mirror erase`: a data subject's right to erasure (GDPR Art. 17, CCPA deletion; issue 26).
 * `--sender ID` (a customer's or a user's sender id) or `--conversation ID`, with `--reason TEXT`
 * (a ticket reference), in one workspace (`--account` when several are configured):
 * 1. the mirror redacts the subject (`Mirror.eraseSubject`: messages, history, unpublished changes,
 *    a conversation's own object) and records the erasure;
 * 2. the archive step (src/export/erasure.ts) replaces each published line of the subject by its
 *    stub in a rewritten file, publishes a signed (with the signing key) erasure record in the
 *    ledger, then removes the replaced files; it also finishes any erasure an earlier `erase` left
 *    interrupted. No new batch is published.
 * `--dry-run` counts what both would do, from the mirror and from the archive, and writes nothing.
 *
 * Takes the writer lock as `sync` does (a SQLite mirror: the writer lock; every engine: the
 * publisher lock for the archive step). Prints what it did (never the subject's id: the archive and
 * the logs must not carry it); structured logs on stderr when not on a terminal.
 *
 * Exit 0 done; 1 the archive step failed (the mirror's erasure stays recorded, and the next `erase`
 * or `sync` finishes it); 2 a usage or configuration error (nothing written); 3 the archive step
 * waits for another process that holds the publisher lock (its next publication finishes it).
 */
import fs from 'node:fs';
import type { Command } from 'commander';
import type { Logger } from 'pino';
import { CONFIG_FIELDS, loadConfig, type Config } from '../../config/index.js';
import { systemClock, type Clock } from '../clock.js';
import { ConfigError } from '../errors.js';
import { archiveDryRun, type ArchiveDryRun, type ErasureArchived } from '../export/erasure.js';
import { assertSafeExportDir, type ExportFailpoint } from '../export/exporter.js';
import { publishSettingsFromConfig } from '../export/publisher.js';
import { assertWitnessDirSetting } from '../export/witness.js';
import { createLogger } from '../logger.js';
import { fileModes } from '../private-fs.js';
import type { ErasureKind, ErasureResult, LedgerHead, Mirror } from '../store/mirror.js';
import { mirrorFileOf, openMirror, readConsistent } from '../store/open-mirror.js';
import { jsonForTerminal, escapeForTerminal } from '../terminal.js';
import { ArchiveStepError, eraseAndArchive } from '../run/erase.js';
import { accountFor } from './enqueue.js';
import { EXIT, fail, settle, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { isTTY } from './summary.js';
import { crashPointFromEnv } from './crash-point.js';

export { ArchiveStepError } from '../run/erase.js';

/** What `erase` is asked, parsed and checked. */
export interface EraseRequest {
  kind: ErasureKind;
  /** The sender id or the conversation id. */
  subject: string;
  reason: string;
  /** The workspace's account id (`default` without one). */
  accountId: string;
  dryRun: boolean;
}

/** Options of {@link eraseWithConfig}. */
export interface EraseCommandOptions extends EraseRequest {
  config: Config;
  logger?: Logger | undefined;
  /** @defaultValue the system clock */
  clock?: Clock | undefined;
  /** Test hook: passed to the publication (see `ExportOptions.failpoint`). Never set in production. */
  failpoint?: ((point: ExportFailpoint, file: string) => void | Promise<void>) | undefined;
  /** How long to wait for another publisher, ms. @defaultValue 30000 */
  publisherWaitMs?: number | undefined;
}

/** What `erase` did (or, for a dry run, would do). */
export type EraseOutcome =
  | { dryRun: true; request: EraseRequest; mirror: ErasureResult; archive: ArchiveDryRun }
  | {
      dryRun: false;
      request: EraseRequest;
      mirror: ErasureResult;
      /** Every erasure the archive step finished (this one, and any left pending before). */
      archived: ErasureArchived[];
      /** Set when the archive step was left to another publisher (see `ExportResult.busy`). */
      busy?: 'busy' | 'fenced' | undefined;
      head: LedgerHead | undefined;
      /** Set when the same erasure, interrupted earlier, was finished instead (its `requested_at`: see `EraseDone.resumedFrom`). */
      resumedFrom?: string;
    };

/**
 * Parses `erase`'s own flags: exactly one of `--sender` and `--conversation`, a `--reason` that is
 * not blank.
 *
 * @throws {@link ConfigError} naming the flag
 */
export function parseEraseFlags(o: { sender?: string; conversation?: string; reason?: string }): { kind: ErasureKind; subject: string; reason: string } {
  if ((o.sender === undefined) === (o.conversation === undefined)) {
    throw new ConfigError('--sender', 'give exactly one of --sender ID (a customer\'s or user\'s sender id) and --conversation ID');
  }
  const kind: ErasureKind = o.sender !== undefined ? 'sender' : 'conversation';
  const subject = (o.sender ?? o.conversation)!;
  if (subject.trim() === '') throw new ConfigError(`--${kind}`, 'must not be empty');
  if (o.reason === undefined || o.reason.trim() === '') throw new ConfigError('--reason', 'is required: why the subject is erased (e.g. the ticket reference of the request); the erasure record in the archive carries it');
  return { kind, subject, reason: o.reason };
}

/**
 * Erases a subject with a built config (see the module comment): the mirror's erasure, then the
 * archive step; or, for a dry run, the counts of both, read on a read-only snapshot.
 *
 * @throws {@link ConfigError} for an unsafe export directory, a missing mirror, an unusable key or
 *   witness directory (nothing written); what the mirror throws (`StoreError`: nothing erased);
 *   {@link ArchiveStepError} when the archive step failed (the mirror's erasure is recorded: the
 *   next `erase` or `sync` finishes it)
 */
export async function eraseWithConfig(opts: EraseCommandOptions): Promise<EraseOutcome> {
  const { config } = opts;
  const request: EraseRequest = { kind: opts.kind, subject: opts.subject, reason: opts.reason, accountId: opts.accountId, dryRun: opts.dryRun };
  const file = mirrorFileOf(config.db);
  assertSafeExportDir(config.exportDir, file);
  if (file !== undefined && !fs.existsSync(file)) throw new ConfigError(CONFIG_FIELDS.db.env, `no mirror at ${config.db}: nothing to erase (run convo-mirror sync first)`);
  const subject = { kind: opts.kind, accountId: opts.accountId, subject: opts.subject };
  if (opts.dryRun) {
    return await readConsistent(config.db, async (mirror) => {
      await assertAccountMirrored(mirror, opts.accountId);
      const counted = await mirror.eraseSubject({ ...subject, reason: opts.reason, dryRun: true });
      const archive = await archiveDryRun(mirror, config.exportDir, subject, counted.publishedThroughSeq);
      return { dryRun: true as const, request, mirror: counted, archive };
    });
  }
  if (config.witnessDir !== undefined) assertWitnessDirSetting(config.witnessDir, config.exportDir);
  const logger = opts.logger ?? createLogger({ level: config.logLevel });
  const settings = publishSettingsFromConfig(config, logger);
  const clock = opts.clock ?? systemClock;
  // A writer: the SQLite writer lock, as sync takes it.
  const mirror: Mirror = await openMirror(config.db, { modes: fileModes(config.groupReadable), clock });
  try {
    await assertAccountMirrored(mirror, opts.accountId);
    const done = await eraseAndArchive(mirror, { ...subject, reason: opts.reason }, {
      settings,
      clock,
      logger,
      ...(opts.failpoint ? { failpoint: opts.failpoint } : {}),
      ...(opts.publisherWaitMs !== undefined ? { publisherWaitMs: opts.publisherWaitMs } : {}),
    });
    return { dryRun: false, request, ...done };
  } finally {
    await mirror.close();
  }
}

/**
 * Refuses an erasure in an account the mirror holds no message of while it holds messages of
 * others: a workspace named wrong (the default account of an unset `CONVO_MIRROR_ACCOUNT_ID`)
 * would record an erasure that finds nothing. An empty mirror is let through (an erasure asked
 * before the first sync redacts the subject as it arrives).
 *
 * @throws {@link ConfigError} naming the account setting and the accounts the mirror holds
 */
async function assertAccountMirrored(mirror: Mirror, accountId: string): Promise<void> {
  const accounts = await mirror.messageAccounts();
  if (accounts.length === 0 || accounts.includes(accountId)) return;
  const shown = accounts.slice(0, 5).join(', ') + (accounts.length > 5 ? `, and ${accounts.length - 5} more` : '');
  throw new ConfigError(
    CONFIG_FIELDS.accountId.env,
    `the mirror holds no message of account ${accountId}, but holds messages of ${shown}: name the workspace with --account-id (or --account when several are configured); nothing erased`,
  );
}

/** `1 line`, `2 lines`. */
const n = (count: number, word: string): string => `${count} ${word}${count === 1 ? '' : 's'}`;

/** The text `erase` prints for `o` (never the subject's id). */
export function eraseSummary(o: EraseOutcome): string[] {
  const r = o.request;
  const what = `a ${r.kind} of account ${r.accountId}, reason ${JSON.stringify(r.reason)}`;
  const m = o.mirror;
  const mirrorCounts = `${n(m.messages, 'message')}, ${n(m.history, 'history version')}, ${n(m.pendingChanges, 'unpublished change')}${r.kind === 'conversation' || m.conversations > 0 ? `, ${n(m.conversations, 'conversation object')}` : ''}`;
  if (o.dryRun) {
    const a = o.archive;
    return [
      `dry run (nothing written): erasing ${what}`,
      `mirror: would redact ${mirrorCounts}; ${n(m.publishedLines, 'published line')} at or below seq ${m.publishedThroughSeq}`,
      `archive: would rewrite ${n(a.files, 'file')}, replacing ${n(a.lines, 'line')} by stubs${a.unpublished > 0 ? ` (and ${n(a.unpublished, 'line')} of a batch not yet published, after its publication)` : ''}`,
    ];
  }
  const out = [
    `erasure ${m.erasureId!}: ${what}`,
    o.resumedFrom !== undefined
      ? `mirror: recorded earlier (${o.resumedFrom}), its archive step interrupted: it redacted ${mirrorCounts}; ${n(m.publishedLines, 'published line')} at or below seq ${m.publishedThroughSeq} for the archive`
      : `mirror: redacted ${mirrorCounts}; ${n(m.publishedLines, 'published line')} at or below seq ${m.publishedThroughSeq} for the archive`,
  ];
  for (const e of o.archived) {
    const own = e.erasureId === m.erasureId ? 'archive' : `archive (erasure ${e.erasureId}, left pending earlier)`;
    if (!e.record) {
      out.push(`${own}: no published line left to rewrite (none published, or erased before): no erasure record needed`);
      continue;
    }
    out.push(
      `${own}: ${n(e.files.length, 'file')} rewritten, ${n(e.lines, 'line')} replaced by stubs; erasure record ${e.record.batch_id} (_ledger/${String(e.record.batch_id).padStart(12, '0')}.json); ${n(e.removed, 'replaced file')} removed`,
    );
    for (const k of e.kept) out.push(`warning: ${k} was replaced, but no longer holds what was published: left as it is; remove it by hand (verify names it)`);
  }
  if (!o.archived.some((e) => e.erasureId === m.erasureId)) {
    out.push(
      o.busy === 'busy'
        ? 'archive: pending: another process holds the publisher lock; its next publication (or the next convo-mirror erase or sync) rewrites the published lines'
        : o.busy === 'fenced'
          ? 'archive: pending: another publisher recorded first; the next publication (or the next convo-mirror erase or sync) rewrites the published lines'
          : 'archive: pending',
    );
  }
  if (o.head) out.push(`ledger head: ${o.head.batch_id}:${o.head.hash}`);
  return out;
}

/** Exit code of an outcome: 0, or 3 when this erasure's archive step was left to another publisher. */
export function exitOfErase(o: EraseOutcome): number {
  if (o.dryRun) return EXIT.OK;
  return o.archived.some((e) => e.erasureId === o.mirror.erasureId) ? EXIT.OK : EXIT.UNFINISHED;
}

/** Adds `erase` to `program`. */
export function addEraseCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('erase')
    .description(
      "Erase a data subject (GDPR Art. 17): redact a sender's (or a conversation's) messages in the mirror, replace their published lines by stubs and record the erasure in the ledger; --dry-run counts first",
    )
    .option('--sender <id>', "the sender id (a customer's or a user's) whose messages are erased, in every conversation of the workspace")
    .option('--conversation <id>', 'the conversation erased: its messages and its own object')
    .option('--reason <text>', 'why (required): e.g. the ticket reference of the request; the erasure record in the archive carries it')
    .option('--dry-run', 'count what would be redacted in the mirror and rewritten in the archive; write nothing')
    .option('--account <id>', 'the workspace (its account id); needed when several are configured')
    .option('--json', 'print what was done as JSON');
  addConfigFlags(cmd, 'erase').action((o) =>
    settle(setExit, async () => {
      const flags = parseEraseFlags(o as { sender?: string; conversation?: string; reason?: string });
      const config = loadConfig(process.env, configFlagsOf(o, 'erase'), { needsApi: false });
      const accountId = accountFor(config, o.account as string | undefined);
      const json = o.json === true;
      const tty = isTTY() && !json;
      const level = tty && config.logLevel === 'info' ? 'warn' : config.logLevel;
      const logger = createLogger({ level, pretty: tty });
      let outcome: EraseOutcome;
      try {
        const crash = crashPointFromEnv();
        outcome = await eraseWithConfig({ config, logger, ...flags, accountId, dryRun: o.dryRun === true, ...(crash ? { failpoint: crash } : {}) });
      } catch (err) {
        if (!(err instanceof ArchiveStepError)) throw err;
        return fail(EXIT.FAILURES, `${err.message}; once that is fixed, convo-mirror erase (again, with the same flags) or sync finishes it`);
      }
      if (json) process.stdout.write(jsonForTerminal({ ...outcome, request: { ...outcome.request, subject: undefined } }, 2) + '\n');
      else process.stdout.write(eraseSummary(outcome).map((l) => escapeForTerminal(l)).join('\n') + '\n');
      return exitOfErase(outcome);
    }),
  );
}
