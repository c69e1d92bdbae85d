/**
 * Retention (issue 26, item 3): with `CONVO_MIRROR_RETENTION` set (config/retention.ts), every
 * publication expires the published files whose date partition is before their stream's cutoff
 * (the UTC day of the publisher's clock minus the limit). Runs with the publisher lock held, from
 * a publication (`publishChanges`), after the erasures' archive step and before any new batch is
 * planned, and only when no batch is planned and unpublished.
 *
 * The steps, each safe to interrupt:
 * 1. the files to expire: those `Mirror.publishedFiles` lists (their current paths, rewritten
 *    files included) whose date is before their stream's cutoff;
 * 2. a retention record listing them (path, stream, date, SHA-256, lines, the Merkle root their
 *    original record commits to) is sealed (signed with the key) and written as
 *    `_ledger/<next batch id>.json`;
 * 3. the mirror records it (`Mirror.recordRetentionRecord`: the head moves by compare-and-set, the
 *    id is reserved, the files are marked expired); then the witness line and `manifest.json`;
 * 4. each listed file is deleted, only while it still holds what was published (its SHA-256): a
 *    file someone changed is left, and named in a warning.
 * A crash after 2 and before 3 leaves a record the chain never pointed at: the next publication
 * publishes the same record again when it still holds (same head, same files), else removes it
 * and decides again. A crash after 3 leaves files to delete: the next publication deletes those of
 * the last retention record first (whatever the setting says then).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { cutoffDay, RETENTION_STREAMS, type RetentionPolicy, type RetentionStream } from '../../config/retention.js';
import { isoNow, type Clock } from '../clock.js';
import { ExportError } from '../errors.js';
import { fsyncDir } from '../private-fs.js';
import type { LedgerHead, Mirror } from '../store/mirror.js';
import { RootsOfRecords, type ErasureStepContext } from './erasure.js';
import { LEDGER_DIR, isRetentionRecord, parseRecord, recordPath, type RetentionBody, type RetentionRecordFile } from './ledger.js';
import { MAX_RECORD_BYTES, readIfPresent, removeIfPublished } from './publish-fs.js';

/** What the retention step needs of the publication it runs in. */
export interface RetentionStepContext extends ErasureStepContext {
  /** The setting; undefined: keep everything (the step only finishes what an earlier record left). */
  policy: RetentionPolicy | undefined;
}

/** What the retention step did. */
export interface RetentionApplied {
  /** The retention record this call published; undefined when it published none (nothing expired, or it only finished deletions). */
  record: LedgerHead | undefined;
  /** The files that record expired. */
  files: { path: string; stream: string; date: string; lines: number }[];
  /** Their lines, in all. */
  lines: number;
  /** Expired files deleted by this call (of this call's record, or of an earlier one a crash left). */
  removed: number;
  /** Expired files left because they no longer hold what was published (named in a warning). */
  kept: string[];
}

/** What {@link pruneMirror} did in one account: the retention erasure it recorded. */
export interface MirrorPruned {
  accountId: string;
  /** The erasure's id (`erasures.id`): its archive step runs in the same publication. */
  erasureId: number;
  /** The `messages` cutoff: every message created before this day (UTC) is erased. */
  cutoff: string;
  /** The rows it redacted: messages, history versions, unpublished change payloads. */
  messages: number;
  history: number;
  pendingChanges: number;
  /** Published lines of those messages, for the archive step (stubs). */
  publishedLines: number;
}

/** The cutoff each mirror was last pruned at by this process, and the accounts it covered then: a publication reads the erasures again only when the day moves or an account is new. */
const prunedAt = new WeakMap<Mirror, { cutoff: string; accounts: ReadonlySet<string> }>();

/**
 * `--prune-mirror` (issue 26, item 3): expires the mirror's messages by the `messages` limit of
 * `policy`. For each account the mirror holds messages of, when the cutoff (the UTC day of the
 * clock minus the limit) is after the cutoff of every earlier retention erasure of the account, a
 * **retention erasure** (`Mirror.eraseSubject` kind `retention`, subject the cutoff day, reason
 * `retention <policy>: messages created before <day>`) redacts the messages created before it as
 * an erasure does (rows, history, unpublished payloads; key, position and `created_at` kept). It is
 * recorded even when nothing had expired yet: from then on every message served that was created
 * before the cutoff arrives redacted (a back-dated import, a workspace synced for the first time
 * later that day). Its archive step (the same publication's, which calls this first) then replaces
 * the published lines of those messages by stubs and publishes an erasure record with the cutoff
 * (none when nothing was published).
 *
 * Call with the publisher lock held (in a publication, before the archive step of erasures). Reads
 * the accounts on every call (one index probe per account), the erasures once per cutoff day per
 * process and when an account is new.
 *
 * @returns the retention erasures recorded that redacted something (an erasure of nothing is
 *   recorded, not returned)
 * @throws {@link StoreError} from the mirror (a read-only mirror, a lost writer lock)
 */
export async function pruneMirror(ctx: { mirror: Mirror; policy: RetentionPolicy; clock: Clock; logger?: Logger | undefined }): Promise<MirrorPruned[]> {
  const limit = ctx.policy.streams.messages;
  if (!limit || ctx.policy.pruneMirror !== true) return [];
  const cutoff = cutoffDay(limit, ctx.clock.now());
  const accounts = await ctx.mirror.messageAccounts();
  const done = prunedAt.get(ctx.mirror);
  if (done?.cutoff === cutoff && accounts.every((a) => done.accounts.has(a))) return [];
  const reason = `retention ${ctx.policy.text}: messages created before ${cutoff}`;
  const latest = new Map<string, string>();
  for (const e of await ctx.mirror.erasures()) if (e.kind === 'retention' && (latest.get(e.accountId) ?? '') < e.subject) latest.set(e.accountId, e.subject);
  const out: MirrorPruned[] = [];
  for (const accountId of accounts) {
    if ((latest.get(accountId) ?? '') >= cutoff) continue;
    const r = await ctx.mirror.eraseSubject({ kind: 'retention', accountId, subject: cutoff, reason });
    const pruned = { accountId, erasureId: r.erasureId!, cutoff, messages: r.messages, history: r.history, pendingChanges: r.pendingChanges, publishedLines: r.publishedLines };
    const fields = { erasure: pruned.erasureId, account_id: accountId, cutoff, messages: r.messages, history: r.history, pending_changes: r.pendingChanges, published_lines: r.publishedLines };
    if (r.messages + r.history + r.pendingChanges + r.publishedLines === 0) {
      ctx.logger?.debug(fields, 'retention: no message created before the cutoff yet; the cutoff is recorded, so messages older than it arrive redacted');
      continue;
    }
    out.push(pruned);
    ctx.logger?.info(fields, 'retention: messages created before the cutoff erased from the mirror (--prune-mirror); their published lines are replaced by stubs next');
  }
  prunedAt.set(ctx.mirror, { cutoff, accounts: new Set(accounts) });
  return out;
}

/**
 * The first day each stream keeps under `policy` at `nowMs` (see config/retention.ts
 * `cutoffDay`), for the streams it limits, in the order messages, conversations, runs.
 */
export function cutoffsOf(policy: RetentionPolicy, nowMs: number): Partial<Record<RetentionStream, string>> {
  return Object.fromEntries(RETENTION_STREAMS.filter((s) => policy.streams[s]).map((s) => [s, cutoffDay(policy.streams[s]!, nowMs)]));
}

/**
 * Applies retention (see the module comment). Call with the publisher lock held and no export
 * batch planned and unpublished.
 *
 * @returns what was done; undefined when there was nothing to do
 * @throws {@link ExportError} naming the file when a record cannot be read or written, a file
 *   cannot be read or deleted; {@link StoreError} `LEDGER_FENCED` when another publisher moved the head
 */
export async function applyRetention(ctx: RetentionStepContext): Promise<RetentionApplied | undefined> {
  const { mirror, target } = ctx;
  const done: RetentionApplied = { record: undefined, files: [], lines: 0, removed: 0, kept: [] };
  // Deletions an earlier publication left (a crash after its record was recorded).
  await removeExpired(ctx, done, undefined);
  const next = await mirror.nextLedgerBatchId();
  const orphan = unrecordedRetentionRecord(ctx, next);
  const head = await mirror.ledgerHead();
  const planned = ctx.policy && head ? await plan(ctx, ctx.policy, next, head) : undefined;
  let body: RetentionBody | undefined = planned;
  if (orphan) {
    // A record written under this id by a publication that crashed before the mirror recorded it.
    const held = new Map((await mirror.publishedFiles()).map((f) => [f.path, f.sha256]));
    const stillHolds = head !== undefined && orphan.prev.hash === head.hash && orphan.prev.batch_id === head.batch_id && orphan.files.every((f) => held.get(f.path) === f.sha256);
    if (stillHolds && ctx.policy?.text === orphan.retention.policy) body = orphan;
    else removeOrphan(ctx, next);
  }
  if (!body) return done.removed > 0 || done.kept.length > 0 ? done : undefined;
  ctx.assertLeaseHeld();
  const entry = ctx.publishRecord(body);
  await ctx.failpoint?.('retention-before-mirror', path.join(target.root, entry.path));
  await mirror.recordRetentionRecord(entry, body.files.map((f) => f.path), isoNow(ctx.clock));
  await ctx.failpoint?.('retention-after-record', path.join(target.root, entry.path));
  ctx.assertLeaseHeld();
  ctx.publishHead({ batch_id: entry.batch_id, hash: entry.hash }, await mirror.exportWatermark());
  done.record = { batch_id: entry.batch_id, hash: entry.hash };
  done.files = body.files.map((f) => ({ path: f.path, stream: f.stream, date: f.date, lines: f.lines }));
  done.lines = done.files.reduce((n, f) => n + f.lines, 0);
  await removeExpired(ctx, done, entry.batch_id);
  await ctx.failpoint?.('retention-after-delete', path.join(target.root, entry.path));
  ctx.logger?.info(
    { record: `${entry.batch_id}:${entry.hash}`, policy: body.retention.policy, cutoff: body.retention.cutoff, files: done.files.length, lines: done.lines, removed: done.removed },
    'retention: expired files listed in a retention record, then deleted',
  );
  return done;
}

/** The retention record for what `policy` expires now; undefined when nothing has expired. */
async function plan(ctx: RetentionStepContext, policy: RetentionPolicy, id: number, head: LedgerHead): Promise<RetentionBody | undefined> {
  const now = ctx.clock.now();
  const cutoff = cutoffsOf(policy, now);
  const expiring = (await ctx.mirror.publishedFiles()).filter((f) => {
    const c = cutoff[f.stream as RetentionStream];
    return c !== undefined && f.date < c;
  });
  if (expiring.length === 0) return undefined;
  const roots = new RootsOfRecords(ctx.target.root, await ctx.mirror.ledgerEntries());
  const files: RetentionRecordFile[] = expiring.map((f) => {
    const { root } = roots.rootOf(f);
    return { path: f.path, stream: f.stream, date: f.date, sha256: f.sha256, lines: f.lines, ...(root !== undefined ? { merkle_root: root } : {}) };
  });
  return {
    format: 'convo-mirror-ledger',
    version: 2,
    kind: 'retention',
    mirror_id: ctx.mirrorId,
    batch_id: id,
    retention: { policy: policy.text, cutoff, decided_at: new Date(now).toISOString() },
    files,
    prev: head,
  };
}

/** `_ledger/<id>.json` when it is a retention record of this mirror the mirror never recorded (the id is the next one); else undefined. */
function unrecordedRetentionRecord(ctx: Pick<RetentionStepContext, 'target' | 'mirrorId'>, id: number): RetentionBody | undefined {
  let bytes: Buffer | undefined;
  try {
    bytes = readIfPresent(path.join(ctx.target.root, recordPath(id)), MAX_RECORD_BYTES);
  } catch {
    return undefined;
  }
  if (bytes === undefined) return undefined;
  const parsed = parseRecord(bytes);
  if (!parsed.ok || !isRetentionRecord(parsed.record) || parsed.record.mirror_id !== ctx.mirrorId || parsed.record.batch_id !== id) return undefined;
  const { hash: _hash, signature: _signature, ...body } = parsed.record;
  return body;
}

/**
 * Removes a retention record an interrupted publication wrote as `_ledger/<next batch id>.json`
 * and the mirror never recorded, if there is one: the archive step of an erasure is about to take
 * that id for its own record (it must not find another record there). Retention is decided again
 * after it.
 *
 * @throws {@link ExportError} naming the file when it cannot be removed
 */
export async function clearUnrecordedRetention(ctx: Pick<RetentionStepContext, 'mirror' | 'target' | 'mirrorId' | 'logger'>): Promise<void> {
  const next = await ctx.mirror.nextLedgerBatchId();
  if (unrecordedRetentionRecord(ctx, next)) removeOrphan(ctx, next);
}

/** Removes the unrecorded retention record `_ledger/<id>.json` (no head ever pointed at it). */
function removeOrphan(ctx: Pick<RetentionStepContext, 'target' | 'logger'>, id: number): void {
  const file = path.join(ctx.target.root, recordPath(id));
  try {
    fs.unlinkSync(file);
    fsyncDir(path.join(ctx.target.root, LEDGER_DIR));
    ctx.logger?.warn({ file: recordPath(id) }, 'retention: removed a retention record an interrupted publication wrote and never recorded; retention is decided again');
  } catch (err) {
    throw new ExportError(`cannot remove the unrecorded retention record ${file}: ${(err as Error).message}`, { file }, err);
  }
}

/**
 * Deletes the files the mirror marks expired by retention record `batchId` (undefined: by the
 * last retention record, whichever it is), each only while it holds what was published.
 */
async function removeExpired(ctx: RetentionStepContext, done: RetentionApplied, batchId: number | undefined): Promise<void> {
  const expired = await ctx.mirror.expiredFiles();
  const last = batchId ?? expired.at(-1)?.expired_by;
  if (last === undefined) return;
  for (const f of expired) {
    if (f.expired_by !== last) continue;
    const r = removeIfPublished(ctx.target.root, f.path, f.sha256, 'delete the expired file');
    if (r === 'removed') done.removed++;
    else if (r === 'changed') {
      done.kept.push(f.path);
      ctx.logger?.warn({ file: f.path, record: f.expired_by }, 'retention: an expired file no longer holds what was published: left as it is; remove it by hand');
    }
  }
}

