/**
 * An erasure as `convo-mirror erase` and the daemon's `erase` job run it (issue 26): the mirror's
 * erasure (`Mirror.eraseSubject`), then the archive step (a publication that plans no new batch:
 * src/export/erasure.ts, under the publisher lock). One code path for both, so what the job does is
 * what the command does. Nothing here logs or returns the subject's id.
 */
import type { Logger } from 'pino';
import type { Clock } from '../clock.js';
import { ConvoMirrorError, describeError } from '../errors.js';
import type { ErasureArchived } from '../export/erasure.js';
import { publishChanges, type ExportFailpoint, type ExportResult } from '../export/exporter.js';
import type { PublishSettings } from '../export/publisher.js';
import type { ErasureRequest, ErasureResult, LedgerHead, Mirror } from '../store/mirror.js';

/**
 * The archive step failed after the mirror recorded the erasure (`erasureId`): the erasure stays
 * pending, and the next `erase` or publication (`sync`, the daemon's runs) finishes it. `cause` is
 * what failed (an `ExportError` naming the file, a `LEDGER_FENCED` `StoreError`...); retryable as
 * its cause is.
 */
export class ArchiveStepError extends ConvoMirrorError {
  constructor(
    readonly erasureId: number,
    cause: unknown,
  ) {
    super('ERASURE_ARCHIVE_FAILED', `erasure ${erasureId} is recorded in the mirror, but its archive step failed: ${describeError(cause)}`, {
      context: { erasure_id: erasureId },
      cause,
      retryable: cause instanceof ConvoMirrorError ? cause.retryable : true,
    });
  }
}

/** How the archive step publishes. */
export interface ArchiveStepOptions {
  /** Where and how (export directory, modes, signing key, witness directory); its gzip and intervals are not used. */
  settings: PublishSettings;
  clock: Clock;
  logger: Logger;
  /** Test hook: passed to the publication (see `ExportOptions.failpoint`). Never set in production. */
  failpoint?: ((point: ExportFailpoint, file: string) => void | Promise<void>) | undefined;
  /** How long to wait for another publisher, ms. @defaultValue the exporter's (30000) */
  publisherWaitMs?: number | undefined;
}

/** What the archive step did. */
export interface ArchiveStepResult {
  /** Every erasure the step finished (the one asked for, and any left pending before), oldest first. */
  archived: ErasureArchived[];
  /** Set when the step was left to another publisher (see `ExportResult.busy`). */
  busy?: 'busy' | 'fenced' | undefined;
  /** The chain head after the step; undefined when nothing was ever published. */
  head: LedgerHead | undefined;
}

/** What {@link eraseAndArchive} did. */
export interface EraseDone extends ArchiveStepResult {
  /** The mirror's erasure (its id, the rows redacted, the published lines left to the archive step). */
  mirror: ErasureResult;
  /**
   * Set when the same erasure (kind, account, subject and reason) was recorded earlier and its
   * archive step never finished (an interrupted `erase`): its `requested_at`. That erasure was
   * finished instead of recording another; {@link mirror} holds its counts.
   */
  resumedFrom?: string;
}

/**
 * The archive step of every erasure the mirror has not marked archived (erasure `erasureId`
 * among them): a publication with `newBatches: false`, which takes the publisher lock, publishes
 * a batch planned earlier first if one waits, then rewrites the published lines and records each
 * erasure in the ledger.
 *
 * @throws {@link ArchiveStepError} for whatever the publication throws (the erasure stays pending)
 */
export async function archiveStep(mirror: Mirror, erasureId: number, o: ArchiveStepOptions): Promise<ArchiveStepResult> {
  const s = o.settings;
  let res: ExportResult;
  try {
    res = await publishChanges(mirror, {
      exportDir: s.exportDir,
      newBatches: false,
      clock: o.clock,
      logger: o.logger,
      ...(s.modes ? { modes: s.modes } : {}),
      ...(s.signingKey ? { signingKey: s.signingKey } : {}),
      ...(s.witnessDir !== undefined ? { witnessDir: s.witnessDir } : {}),
      // Retention applies to every publication, this one too.
      ...(s.retention !== undefined ? { retention: s.retention } : {}),
      ...(o.failpoint ? { failpoint: o.failpoint } : {}),
      ...(o.publisherWaitMs !== undefined ? { publisherWaitMs: o.publisherWaitMs } : {}),
    });
  } catch (err) {
    throw new ArchiveStepError(erasureId, err);
  }
  return { archived: res.erasures ?? [], busy: res.busy, head: res.head };
}

/**
 * Erases a subject: the mirror's erasure (one transaction: the subject's records become redaction
 * markers, an `erasures` row records it), then {@link archiveStep}. Logs `erasure recorded in the
 * mirror` with the erasure's id, kind, account and counts (never the subject).
 *
 * @param afterMirror - called once the mirror has recorded the erasure, before the archive step
 *   (the daemon's job drops the subject from its data there); what it throws is ignored after
 *   a warning
 * @throws what `Mirror.eraseSubject` throws (`StoreError`; nothing erased), {@link ArchiveStepError}
 *   when the archive step failed (the erasure is recorded: the next `erase` or publication finishes it)
 */
export async function eraseAndArchive(mirror: Mirror, request: Omit<ErasureRequest, 'dryRun'>, o: ArchiveStepOptions & { afterMirror?: (erased: ErasureResult) => Promise<void> }): Promise<EraseDone> {
  // The same erasure asked again after an interrupted one: finish that one (every page committed
  // since redacted the subject as it arrived), rather than record a second that redacts nothing.
  const earlier = (await mirror.erasures()).find(
    (e) => e.archiveDoneAt === null && e.kind === request.kind && e.accountId === request.accountId && e.subject === request.subject && e.reason === request.reason,
  );
  const erased: ErasureResult = earlier
    ? {
        erasureId: earlier.id,
        dryRun: false,
        messages: earlier.messages,
        history: earlier.history,
        pendingChanges: earlier.pendingChanges,
        conversations: earlier.conversations,
        publishedLines: earlier.publishedLines,
        publishedThroughSeq: earlier.publishedThroughSeq,
      }
    : await mirror.eraseSubject({ kind: request.kind, accountId: request.accountId, subject: request.subject, reason: request.reason });
  const fields = { erasure: erased.erasureId, kind: request.kind, account_id: request.accountId, messages: erased.messages, published_lines: erased.publishedLines };
  if (earlier) o.logger.info({ ...fields, requested_at: earlier.requestedAt }, 'the same erasure was recorded earlier and its archive step never finished: finishing it');
  else o.logger.info(fields, 'erasure recorded in the mirror');
  if (o.afterMirror) {
    await o.afterMirror(erased).catch((err: unknown) => o.logger.warn({ erasure: erased.erasureId, err: describeError(err) }, 'after the erasure was recorded: a hook failed'));
  }
  return { mirror: erased, ...(earlier ? { resumedFrom: earlier.requestedAt } : {}), ...(await archiveStep(mirror, erased.erasureId!, o)) };
}
