/**
 * Exporter: change log → JSONL change files and the ledger's batch records (design: src/export/).
 *
 * Exactly-once by construction, whichever process publishes:
 * 0. One publisher at a time per mirror: the mirror's publisher lock (`Mirror.tryPublisherLock`;
 *    PostgreSQL: an advisory lock), waited for up to `publisherWaitMs`.
 * 1. A batch is *planned* in the mirror first: its seq range `(watermark, max(seq)]`, its time and
 *    whether it is gzipped are fixed before any file is written, so a re-run after a crash, or
 *    another publisher taking over, re-publishes the very same lines under the same names.
 * 2. Each data file is written to a temp file in `<dir>/.convo-mirror-tmp/`, fsynced, renamed into
 *    place (same filesystem), and its directory fsynced. File names derive from the seq range they
 *    hold, so re-publishing yields the same names and bytes.
 * 3. The batch record (`_ledger/<batch>.json`: its files with size, line count, SHA-256 and the
 *    Merkle tree hash of their lines, computed as they were written; its seq range, mirror, run,
 *    time, and the hash of the previous record; signed when a key is given) is published the same
 *    way; it is deterministic too, so a re-publication writes it once.
 * 4. In one transaction, the files and the ledger entry are recorded, the batch marked published
 *    and the exported watermark advanced; the head moves only by compare-and-set from the head the
 *    record chains on, so a publisher that stalled past losing its lock records nothing (fenced).
 * 5. Only then the signed head (src/export/head.ts: the chain head, the watermark, the time, signed
 *    when a key is given) is appended to the witness file when `witnessDir` is set
 *    (src/export/witness.ts) and published as `manifest.json`: neither ever shows a head the mirror
 *    has not recorded, nor goes back to an older one.
 * Publication costs what the batch holds: nothing written before is read or rewritten (except the
 * small manifest, and the last line of the witness file, read back), unless an erasure waits for
 * its archive step: before planning a batch (and only once no batch planned earlier waits, whose
 * record must come first), every erasure the mirror has not marked archived is finished
 * (src/export/erasure.ts: the subject's published lines replaced by stubs in rewritten files, an
 * erasure record in the chain, the replaced files removed), so the next `sync` or daemon
 * publication finishes an erasure that `erase` left interrupted. `erase` publishes with
 * {@link ExportOptions.newBatches} false: that step, and no new batch.
 *
 * Every call rewrites `manifest.json` with a fresh `signed_at`, also when nothing is pending: its
 * time says when the publisher last vouched for the head (as a CT log issues a fresh signed tree
 * head every maximum merge delay), so `verify --max-age` can tell a stale or rolled-back head.
 *
 * Layout: `<dir>/<stream>/account=<account_id>/date=<YYYY-MM-DD>/<first_seq>-<last_seq>.jsonl[.gz]`,
 * stream `messages`, `conversations` or `runs`, date from the line's `synced_at` (UTC). Each line is
 * {@link exportLine} of its change-log row (src/export/lines.ts) followed by `\n`. Published files
 * are read-only (0400, or 0440 group-readable).
 *
 * Nothing lost, nothing leaked: publication deletes nothing but its own leftovers in
 * `.convo-mirror-tmp/`, never replaces a published file with other bytes, and never writes over a
 * `manifest.json` it did not write.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import type { ExportBatch, ExportChange, LedgerEntry, LedgerHead, Mirror, PublisherLease } from '../store/mirror.js';
import { ExportError, StoreError, type ConfigError } from '../errors.js';
import { isoNow, systemClock, type Clock } from '../clock.js';
import { PRIVATE_MODES, mkdirPrivate, type FileModes } from '../private-fs.js';
import { MANIFEST, assertSafeExportDir, kindOf, manifestTempName, recordTempName } from './paths.js';
import { MANIFEST_VERSION, MANIFEST_VERSIONS, manifestOf, renderManifest } from './manifest.js';
import { sealHead, type SignedHead } from './head.js';
import { appendWitness, assertWitnessUsable } from './witness.js';
import { LEDGER_DIR, RECORD_VERSION, asVersion1, isBatchRecord, isErasureRecord, parseRecord, recordHash, recordPath, renderRecord, sealRecord, type AnyBody, type RecordBody } from './ledger.js';
import { finishErasures, type ErasureArchived, type ErasureStepContext } from './erasure.js';
import { applyRetention, clearUnrecordedRetention, pruneMirror, type MirrorPruned, type RetentionApplied } from './retention.js';
import type { RetentionPolicy } from '../../config/retention.js';
import { PartitionWriter, type WrittenFile } from './partition-writer.js';
import { MAX_RECORD_BYTES, makeDir, makeReadOnly, prepareTempDir, publishBytes, readIfPresent, type ExportFailpoint, type Target } from './publish-fs.js';
import { sign, type SigningKey } from './signing.js';

export { MANIFEST, TEMP_DIR, assertSafeExportDir } from './paths.js';
export { manifestOf, renderManifest, type Manifest } from './manifest.js';
export { witnessDirProblem, witnessFile } from './witness.js';
export { exportLine } from './lines.js';
export { verifyArchive, verifyExports, type ArchiveReport, type HeadRef, type VerifyOptions, type VerifyProblem, type VerifyProblemKind } from './verify.js';
export type { ExportFailpoint } from './publish-fs.js';
export type { ErasureArchived } from './erasure.js';
export type { MirrorPruned, RetentionApplied } from './retention.js';

/**
 * One file published by a call, as recorded in `export_files` and listed by its batch record (the
 * root of its lines, `merkle_root`, is in the record only).
 */
export type ExportFile = WrittenFile;

/** Options of {@link publishChanges}. */
export interface ExportOptions {
  /**
   * Root directory of the exports; created if missing (with any missing parents). It must pass
   * {@link assertSafeExportDir} for the mirror's database file.
   */
  exportDir: string;
  /** Most lines in one file; a larger partition is split. @defaultValue 100000 */
  maxLinesPerFile?: number;
  /** Run to record on the batch. */
  runId?: number | null;
  /**
   * Write new batches as `.jsonl.gz` (deterministic bytes: see src/export/gzip.ts). A batch planned
   * before keeps the choice it was planned with. @defaultValue false
   */
  gzip?: boolean;
  /** Sign each batch record and the head (`manifest.json`) with this Ed25519 key (see src/export/signing.ts). @defaultValue unsigned */
  signingKey?: SigningKey | undefined;
  /**
   * Hold run lines: when only lines of the `runs` stream wait (no message or conversation
   * changed since the last publication), no batch is planned until the heartbeat window of the
   * oldest of them has ended ({@link heartbeatDue}); they go out with the next batch that carries
   * changes in any case. Undefined or 0: everything waiting is published. A batch planned before
   * (an interrupted publication) is always re-published. Milliseconds.
   * @defaultValue undefined (publish everything)
   */
  runsHeartbeatMs?: number | undefined;
  /**
   * The head witness's directory (`CONVO_MIRROR_WITNESS_DIR`): another disk or mount, which must
   * exist. Each publication that adds a ledger record appends the signed head to
   * `<witnessDir>/<mirror id>.heads.jsonl` (see src/export/witness.ts); one with nothing new
   * appends only when the witness's last line is not the current head (a witness set on an
   * existing archive is given its head at once). @defaultValue no witness
   */
  witnessDir?: string | undefined;
  clock?: Clock;
  logger?: Logger | undefined;
  /**
   * Modes of every directory (the export root and its missing parents, partition directories,
   * `_ledger/`, `.convo-mirror-tmp/`) publication creates, set exactly whatever the umask; files
   * (data files, records, the manifest) get the same mode without write bits (0400 or 0440).
   * Existing directories are left as they are. The CLI passes `fileModes(config.groupReadable)`.
   * @defaultValue {@link PRIVATE_MODES} (files 0600 → published 0400, directories 0700)
   */
  modes?: FileModes | undefined;
  /**
   * Test hook (a failpoint): called at `point` with the absolute path of the file being published.
   * Whatever it throws propagates unchanged and nothing is cleaned up, so the files on disk stay as
   * a crash at that point would leave them. At `before-ledger`, `before-record` and `before-head` a promise it
   * returns is awaited (the hook may use the mirror); at `before-rename` it must be synchronous.
   * Never set in production.
   */
  failpoint?: (point: ExportFailpoint, file: string) => void | Promise<void>;
  /**
   * Plan and publish a new batch of what waits in the change log. False (the `erase` command): only
   * a batch planned before and not yet published is published (erasure records come after it), and
   * the erasures waiting for the archive step are finished; nothing new is published.
   * @defaultValue true
   */
  newBatches?: boolean | undefined;
  /**
   * Retention (`CONVO_MIRROR_RETENTION`, config/retention.ts): each publication first expires the
   * published files whose date partition is before their stream's cutoff by the clock, in a
   * retention record, then deletes them (src/export/retention.ts). Undefined: keep everything
   * (deletions a crash left after an earlier retention record are still finished).
   * @defaultValue undefined (keep everything)
   */
  retention?: RetentionPolicy | undefined;
  /**
   * How long to wait for the mirror's publisher lock while another process publishes, ms; then
   * the call publishes nothing and returns {@link ExportResult.busy} (the changes stay in the
   * change log for the next publication). Polled every {@link PUBLISHER_POLL_MS}.
   * @defaultValue 30000
   */
  publisherWaitMs?: number;
}

/** How often a publisher waiting for the publisher lock asks again, ms. */
export const PUBLISHER_POLL_MS = 50;

/** What one {@link publishChanges} call published. */
export interface ExportResult {
  /** Files published by this call (empty when nothing was pending). */
  files: ExportFile[];
  /** Lines in those files. */
  lines: number;
  /** The exported watermark after the call (last published change_log.seq). */
  watermark: number;
  /** True when a batch planned by an earlier, interrupted call was re-published. */
  resumed: boolean;
  /** The chain head after the call; undefined when nothing was ever published. */
  head: LedgerHead | undefined;
  /** Run lines left waiting by {@link ExportOptions.runsHeartbeatMs} (0 when nothing was held). */
  held: number;
  /**
   * Set when this call published nothing because of another publisher: `'busy'` when another
   * process held the publisher lock for all of {@link ExportOptions.publisherWaitMs}; `'fenced'`
   * when this call lost the lock and another publisher recorded a batch first (its data files and
   * batch record are byte for byte the other's; no head, witness line or manifest was written).
   */
  busy?: 'busy' | 'fenced';
  /**
   * The erasures whose archive step this call finished (src/export/erasure.ts): each erasure's
   * published lines replaced by stubs, its erasure record published. Absent or empty when none waited.
   */
  erasures?: ErasureArchived[];
  /**
   * What the retention step did (src/export/retention.ts): the retention record it published and
   * the files it expired and deleted. Absent when it had nothing to do.
   */
  retention?: RetentionApplied;
  /**
   * The retention erasures `--prune-mirror` recorded in this call (src/export/retention.ts
   * `pruneMirror`), one per account whose messages expired; their archive steps are among
   * {@link erasures}. Absent when none.
   */
  pruned?: MirrorPruned[];
}

/**
 * Whether run lines held since `oldestMs` are due: the heartbeat window they fell in (windows are
 * the multiples of `heartbeatMs` since the epoch, so 24 h windows are UTC days) has ended by `nowMs`.
 * Epoch-aligned windows make a quiet day one batch holding one day's lines (one file per account),
 * where "older than 24 h" would straddle two days.
 *
 * @param heartbeatMs - window length, ms (> 0)
 */
export function heartbeatDue(oldestMs: number, nowMs: number, heartbeatMs: number): boolean {
  return Math.floor(nowMs / heartbeatMs) > Math.floor(oldestMs / heartbeatMs);
}

/** When the heartbeat window holding `oldestMs` ends (epoch ms): held run lines are due from then on. */
export function heartbeatWindowEnd(oldestMs: number, heartbeatMs: number): number {
  return (Math.floor(oldestMs / heartbeatMs) + 1) * heartbeatMs;
}

/** The run lines publication holds back now ({@link ExportOptions.runsHeartbeatMs}), or 0 when it publishes what waits. */
async function heldRunLines(mirror: Mirror, heartbeatMs: number | undefined, nowMs: number): Promise<number> {
  if (!heartbeatMs || (await mirror.pendingExportBatch()) !== undefined) return 0;
  const waiting = await mirror.pendingExport();
  if (waiting.data > 0 || waiting.oldestRunLineAt === undefined) return 0;
  return heartbeatDue(Date.parse(waiting.oldestRunLineAt), nowMs, heartbeatMs) ? 0 : waiting.runLines;
}

/**
 * Publishes every change-log row above the exported watermark as one batch: its data files, its
 * batch record, the witness line, the manifest, then its records in SQLite (see the module
 * comment). Idempotent: with nothing pending it writes no data file and no record; it only re-signs
 * the head (a fresh `signed_at` in `manifest.json`).
 *
 * First it checks the export directory ({@link assertSafeExportDir}), creates it if missing, checks
 * its manifest is this mirror's, and removes the leftovers of an interrupted publication from
 * `.convo-mirror-tmp/` (regular files with names convo-mirror generates; nothing else anywhere).
 * An export directory published before the ledger existed is migrated first: a genesis record
 * (`kind: migration`) lists every file recorded so far, and those files are made read-only.
 *
 * @throws {@link ConfigError} (`CONVO_MIRROR_EXPORT_DIR`) when the export directory is unsafe for
 *   the mirror's database file (`mirror.localFile`), see {@link assertSafeExportDir}; nothing is written
 * @throws {@link ExportError} naming the file or directory, before anything is written, when
 *   `manifest.json` is not one this mirror wrote (another program's file, unparsable, another
 *   format, or another mirror's) or `.convo-mirror-tmp` is not a directory
 * @throws {@link ExportError} naming `CONVO_MIRROR_WITNESS_DIR` and the path, before anything is
 *   written, when `witnessDir` is missing, not a directory or not writable; later, when the witness
 *   line cannot be appended (the batch stays planned, as for any failure)
 * @throws {@link ExportError} naming the file when a write, fsync or rename fails, or a published
 *   name already holds other content; the watermark is then unchanged and the next call
 *   re-publishes the same batch
 */
export async function publishChanges(mirror: Mirror, opts: ExportOptions): Promise<ExportResult> {
  return oneAtATime(mirror, async () => {
    const lease = await publisherLease(mirror, opts);
    if (!lease) {
      const waitedMs = opts.publisherWaitMs ?? 30_000;
      // A progressive publication (no wait) that finds another publisher is routine: not worth an info line.
      opts.logger?.[waitedMs > 0 ? 'info' : 'debug']({ waited_ms: waitedMs }, 'another process is publishing this mirror: the changes go out with its next publication');
      return { ...(await nothingPublished(mirror)), busy: 'busy' };
    }
    try {
      return await publishAlone(mirror, opts, lease);
    } catch (err) {
      if (!(err instanceof PublisherLockLost || (err instanceof StoreError && err.code === 'LEDGER_FENCED'))) throw err;
      opts.logger?.warn({ err: err.message }, 'publication fenced: another publisher recorded this batch first; nothing more was written');
      return { ...(await nothingPublished(mirror)), busy: 'fenced' };
    } finally {
      await lease.release();
    }
  });
}

/** The mirror's publisher lock, waiting up to {@link ExportOptions.publisherWaitMs} for it. */
async function publisherLease(mirror: Mirror, opts: ExportOptions): Promise<PublisherLease | undefined> {
  const clock = opts.clock ?? systemClock;
  const until = clock.now() + (opts.publisherWaitMs ?? 30_000);
  for (;;) {
    const lease = await mirror.tryPublisherLock();
    if (lease || clock.now() >= until) return lease;
    await clock.sleep(Math.min(PUBLISHER_POLL_MS, until - clock.now()));
  }
}

/** The result of a call that published nothing: the mirror's head and watermark as they are. */
async function nothingPublished(mirror: Mirror): Promise<ExportResult> {
  return { files: [], lines: 0, watermark: await mirror.exportWatermark(), resumed: false, head: await mirror.ledgerHead(), held: 0 };
}

/**
 * Throws when the publisher lock is known lost: checked before each step other processes see
 * (the batch record, the head). The compare-and-set of the head catches what this cannot (a
 * process that has not heard yet).
 */
function assertLeaseHeld(lease: PublisherLease): void {
  if (lease.lost) throw new PublisherLockLost();
}

/** Thrown by {@link assertLeaseHeld}; {@link publishChanges} turns it into a `'fenced'` result. */
class PublisherLockLost extends ExportError {
  constructor() {
    super('publication stopped: the publisher lock was lost (its database session ended); another process publishes now', {});
  }
}

/**
 * Publications in flight, by mirror: one at a time per mirror object in this process, as when
 * publication was synchronous (two would plan, write and record the same batch).
 */
const publications = new WeakMap<Mirror, Promise<void>>();

/** Runs `f` once every publication of `mirror` started before it in this process has settled. */
async function oneAtATime<T>(mirror: Mirror, f: () => Promise<T>): Promise<T> {
  const mine = (publications.get(mirror) ?? Promise.resolve()).then(f);
  const settled = mine.then(
    () => undefined,
    () => undefined,
  );
  publications.set(mirror, settled);
  try {
    return await mine;
  } finally {
    if (publications.get(mirror) === settled) publications.delete(mirror);
  }
}

/** {@link publishChanges}, once no other publication of the mirror runs in this process. */
async function publishAlone(mirror: Mirror, opts: ExportOptions, lease: PublisherLease): Promise<ExportResult> {
  assertSafeExportDir(opts.exportDir, mirror.localFile);
  const clock = opts.clock ?? systemClock;
  const dir = path.resolve(opts.exportDir);
  const modes = opts.modes ?? PRIVATE_MODES;
  try {
    mkdirPrivate(dir, modes, { durable: true });
  } catch (err) {
    throw new ExportError(`cannot create the export directory ${dir}: ${(err as Error).message}`, { dir }, err);
  }
  const mirrorId = await mirror.mirrorId();
  assertOwnedBy(dir, mirrorId);
  if (opts.witnessDir !== undefined) assertWitnessUsable(opts.witnessDir, mirrorId, dir);
  const target: Target = { root: dir, temp: prepareTempDir(dir, modes), modes, failpoint: opts.failpoint };
  await migrateToLedger(mirror, target, mirrorId, opts, lease);

  // 0. The archive step of erasures waiting for it, once no batch planned earlier waits (its
  // record comes first: an erasure record takes the next batch id and chains on the head); first,
  // with --prune-mirror, the retention erasure of the messages past the cutoff (its archive step
  // is one of them).
  const pendingBatch = await mirror.pendingExportBatch();
  let pruned: MirrorPruned[] = [];
  let erasures: ErasureArchived[] = [];
  let retention: RetentionApplied | undefined;
  if (pendingBatch === undefined) {
    if (opts.retention?.pruneMirror === true) pruned = await pruneMirror({ mirror, policy: opts.retention, clock, logger: opts.logger });
    if ((await mirror.erasures()).some((e) => e.archiveDoneAt === null)) {
      // An erasure record takes the next batch id: a retention record an interrupted publication
      // left there unrecorded goes first (retention is decided again below).
      await clearUnrecordedRetention({ mirror, target, mirrorId, logger: opts.logger });
    }
    const step: ErasureStepContext = {
      mirror,
      target,
      mirrorId,
      clock,
      logger: opts.logger,
      failpoint: opts.failpoint,
      publishRecord: (body) => publishRecord(target, body, opts.signingKey),
      publishHead: (head, watermark) => void publishHead(target, mirrorId, head, watermark, opts),
      assertLeaseHeld: () => assertLeaseHeld(lease),
    };
    erasures = await finishErasures(step);
    // 0b. Retention, under the same condition (its record also takes the next batch id).
    retention = await applyRetention({ ...step, policy: opts.retention });
  }
  const erased = { ...(erasures.length > 0 ? { erasures } : {}), ...(retention ? { retention } : {}), ...(pruned.length > 0 ? { pruned } : {}) };

  // 1. Plan (or find the planned, unpublished) batch, unless only run lines wait and they are held.
  const held = await heldRunLines(mirror, opts.runsHeartbeatMs, clock.now());
  const noNew = opts.newBatches === false && pendingBatch === undefined;
  const plan = held > 0 || noNew ? undefined : await mirror.planExportBatch(opts.runId ?? null, isoNow(clock), opts.gzip === true);
  if (!plan) {
    const head = await mirror.ledgerHead();
    const watermark = await mirror.exportWatermark();
    assertLeaseHeld(lease);
    publishHead(target, mirrorId, head, watermark, opts);
    if (held > 0) opts.logger?.debug({ run_lines: held }, 'run lines held: nothing changed; they go out with the next changes or at the heartbeat');
    return { files: [], lines: 0, watermark, resumed: false, head, held, ...erased };
  }
  if (plan.resumed) opts.logger?.warn({ batch: plan.id, first_seq: plan.first_seq, last_seq: plan.last_seq }, 're-publishing an export batch interrupted earlier');

  // 2. The data files, 3. the batch record, 4. the records in the mirror (the head moves by
  // compare-and-set from the head the record chains on), 5. the witness line and the manifest.
  // Data files and record are the same bytes whoever writes them; the head moves only once the
  // mirror recorded it, so a fenced publisher never shows an older head.
  const files = await writeBatchFiles(mirror, target, plan, opts.maxLinesPerFile ?? 100_000);
  await opts.failpoint?.('before-ledger', path.join(dir, recordPath(plan.id)));
  assertLeaseHeld(lease);
  const entry = publishRecord(target, batchBody(mirrorId, plan, files, await mirror.ledgerHead()), opts.signingKey);
  const head = { batch_id: entry.batch_id, hash: entry.hash };
  await opts.failpoint?.('before-record', path.join(dir, recordPath(plan.id)));
  await mirror.recordPublication(plan, files, entry, isoNow(clock));
  await opts.failpoint?.('before-head', path.join(dir, MANIFEST));
  assertLeaseHeld(lease);
  publishHead(target, mirrorId, head, plan.last_seq, opts);
  const lines = files.reduce((n, f) => n + f.lines, 0);
  opts.logger?.info({ batch: plan.id, files: files.length, lines, watermark: plan.last_seq, head: `${head.batch_id}:${head.hash}` }, 'exports published');
  if (plan.resumed) {
    // The interrupted batch is out; now publish what was committed since it was planned.
    const rest = await publishAlone(mirror, opts, lease);
    const all = [...erasures, ...(rest.erasures ?? [])];
    const kept = rest.retention ?? retention;
    const prunedAll = [...pruned, ...(rest.pruned ?? [])];
    return {
      files: [...files, ...rest.files],
      lines: lines + rest.lines,
      watermark: rest.watermark,
      resumed: true,
      head: rest.head,
      held: rest.held,
      ...(all.length > 0 ? { erasures: all } : {}),
      ...(kept ? { retention: kept } : {}),
      ...(prunedAll.length > 0 ? { pruned: prunedAll } : {}),
    };
  }
  return { files, lines, watermark: plan.last_seq, resumed: false, head, held: 0, ...erased };
}

/** Writes a batch's data files, one partition (stream, account, day) at a time, in seq order. */
async function writeBatchFiles(mirror: Mirror, target: Target, plan: ExportBatch, maxLines: number): Promise<ExportFile[]> {
  const files: ExportFile[] = [];
  let open: PartitionWriter | undefined;
  for await (const chunk of mirror.changeChunksOf(plan)) {
    for (const row of chunk) {
      if (open && !open.accepts(row, maxLines)) {
        files.push(open.publish());
        open = undefined;
      }
      open ??= new PartitionWriter(target, row, plan.id, plan.gzip);
      open.write(row);
    }
  }
  if (open) files.push(open.publish());
  return files;
}

/** The body of a batch's record. */
function batchBody(mirrorId: string, plan: ExportBatch, files: ExportFile[], prev: LedgerHead | undefined): RecordBody {
  return {
    format: 'convo-mirror-ledger',
    version: RECORD_VERSION,
    kind: 'batch',
    mirror_id: mirrorId,
    batch_id: plan.id,
    run_id: plan.run_id,
    planned_at: plan.planned_at,
    first_seq: plan.first_seq,
    last_seq: plan.last_seq,
    files,
    prev: prev ?? null,
  };
}

/**
 * Publishes a record (a batch record, or an erasure record: src/export/erasure.ts; sealed: hashed,
 * signed with `key` when given) as `_ledger/<batch>.json`,
 * unless that name already holds a record with the same hash (a batch re-published after a crash;
 * it is kept as it is, whatever its signature), or the version 1 record of the same batch (written
 * by a convo-mirror older than line commitments, which crashed before recording it: kept as it
 * is, without `merkle_root`, so the data files it vouches for and the record are what that
 * publication wrote).
 *
 * @returns its ledger entry
 * @throws {@link ExportError} naming the file when it cannot be published, or holds anything else
 */
function publishRecord(target: Target, body: AnyBody, key: SigningKey | undefined): LedgerEntry {
  let record = sealRecord(body, key ? (bytes) => sign(bytes, key) : undefined);
  const rel = recordPath(body.batch_id);
  const final = path.join(target.root, rel);
  makeDir(target, path.join(target.root, LEDGER_DIR));
  let existing: Buffer | undefined;
  try {
    existing = readIfPresent(final, MAX_RECORD_BYTES);
  } catch (err) {
    throw new ExportError(`cannot publish the batch record ${final}: ${(err as Error).message}`, { file: final }, err);
  }
  if (existing === undefined) {
    publishBytes(target, recordTempName(body.batch_id), final, renderRecord(record));
  } else {
    const parsed = parseRecord(existing);
    const olderForm = parsed.ok && isBatchRecord(body) && parsed.record.version === 1 && body.version === 2 && parsed.record.hash === recordHash(asVersion1(body));
    if (!parsed.ok || (parsed.record.hash !== record.hash && !olderForm)) {
      throw new ExportError(
        `refusing to replace the batch record ${final}: it records ${parsed.ok ? `another batch (hash ${parsed.record.hash})` : `something else (${parsed.why})`}`,
        { file: final },
      );
    }
    record = parsed.record;
  }
  return {
    batch_id: record.batch_id,
    hash: record.hash,
    prev_hash: record.prev?.hash ?? null,
    path: rel,
    files: record.files.length,
    // An erasure record's lines: those it replaced by stubs.
    lines: isErasureRecord(record) ? record.files.reduce((n, f) => n + f.redacted_seqs.length, 0) : record.files.reduce((n, f) => n + f.lines, 0),
    key_id: record.signature?.key_id ?? null,
  };
}

/**
 * Migrates an export directory published before the ledger existed: one genesis record
 * (`kind: migration`, no `prev`) lists every file recorded so far, by the mirror's records (its
 * time is the last publication's, so a retry writes the same record); those files are made
 * read-only. Nothing to do once the ledger has a record.
 *
 * The record is of version 1: it vouches for those files by the size, line count and SHA-256 the
 * mirror recorded when they were published; the mirror never knew the roots of their lines, and
 * publication reads back nothing it published before (a root computed now would only restate what
 * the disk holds today).
 */
async function migrateToLedger(mirror: Mirror, target: Target, mirrorId: string, opts: ExportOptions, lease: PublisherLease): Promise<void> {
  const genesis = await mirror.ledgerGenesis();
  if (!genesis) return;
  const files = await mirror.publishedFiles();
  const body: RecordBody = {
    format: 'convo-mirror-ledger',
    version: 1, // no merkle_root: see above
    kind: 'migration',
    mirror_id: mirrorId,
    batch_id: genesis.batch_id,
    run_id: null,
    planned_at: genesis.published_at,
    first_seq: files[0]?.first_seq ?? 1,
    last_seq: genesis.last_seq,
    files,
    prev: null,
  };
  const entry = publishRecord(target, body, opts.signingKey);
  for (const f of files) {
    const failed = makeReadOnly(path.join(target.root, f.path));
    if (failed) opts.logger?.warn({ file: f.path, err: failed }, 'could not make a file published earlier read-only');
  }
  await mirror.recordLedgerGenesis(entry, isoNow(opts.clock ?? systemClock));
  assertLeaseHeld(lease);
  publishHead(target, mirrorId, entry, await mirror.exportWatermark(), opts);
  opts.logger?.info({ files: files.length, head: `${entry.batch_id}:${entry.hash}` }, 'export directory migrated to the ledger: genesis record published');
}

/**
 * Signs the head now (`signed_at` from the clock; signed with the key, when given), appends it to
 * the witness file when `opts.witnessDir` is set and there is a head (unless the witness's last line
 * is already this head: see {@link appendWitness}), then publishes it as `manifest.json`.
 *
 * @returns the signed head
 * @throws {@link ExportError} naming the witness file or the manifest when either cannot be written
 */
function publishHead(target: Target, mirrorId: string, head: LedgerHead | undefined, watermark: number, opts: ExportOptions): SignedHead {
  const signed = sealHead(manifestOf(mirrorId, head, watermark, isoNow(opts.clock ?? systemClock)), opts.signingKey);
  if (opts.witnessDir !== undefined && signed.head !== null) appendWitness(opts.witnessDir, signed, target.modes);
  publishBytes(target, manifestTempName(), path.join(target.root, MANIFEST), renderManifest(signed));
  return signed;
}

/**
 * Refuses an export directory whose `manifest.json` convo-mirror would have to overwrite without
 * having written it: not a regular file, not JSON, not a convo-mirror manifest (`format`), a newer
 * manifest version, or the manifest of another mirror (the two change logs' seq numbers would
 * collide). A missing manifest is fine: it is (re)written from the mirror's records.
 *
 * @throws {@link ExportError} naming the manifest file (and, for another mirror, both ids)
 */
function assertOwnedBy(dir: string, mirrorId: string): void {
  const file = path.join(dir, MANIFEST);
  const refuse = (why: string) =>
    new ExportError(
      `${file} ${why}; convo-mirror never overwrites a file it did not write: move it away, or choose another CONVO_MIRROR_EXPORT_DIR`,
      { file },
    );
  let text: string;
  try {
    const st = fs.lstatSync(file);
    if (!st.isFile()) throw refuse(`is not a regular file (${kindOf(st)})`);
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if (err instanceof ExportError) throw err;
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return; // no manifest yet, or removed: rewritten
    throw new ExportError(`cannot read ${file}: ${(err as Error).message}`, { file }, err);
  }
  let manifest: unknown;
  try {
    manifest = JSON.parse(text);
  } catch {
    throw refuse('is not a convo-mirror manifest (not JSON)');
  }
  const m = (typeof manifest === 'object' && manifest !== null && !Array.isArray(manifest) ? manifest : {}) as { format?: unknown; version?: unknown; mirror_id?: string };
  if (m.format !== 'convo-mirror-exports') {
    throw refuse(`is not a convo-mirror manifest (format ${m.format === undefined ? 'absent' : JSON.stringify(m.format)}, expected "convo-mirror-exports")`);
  }
  if (typeof m.version !== 'number' || !MANIFEST_VERSIONS.includes(m.version)) {
    throw refuse(`has manifest version ${JSON.stringify(m.version)}, which this convo-mirror does not know (it writes ${MANIFEST_VERSION})`);
  }
  if (m.mirror_id !== mirrorId) {
    throw new ExportError(
      `the export directory ${dir} holds the exports of another mirror (mirror id ${m.mirror_id ?? 'unknown'} in ${file}, this mirror is ${mirrorId}): ` +
        'point CONVO_MIRROR_EXPORT_DIR at a fresh directory, or CONVO_MIRROR_DB at the mirror that wrote it',
      { dir, file, mirror_id: mirrorId, manifest_mirror_id: m.mirror_id },
    );
  }
}

