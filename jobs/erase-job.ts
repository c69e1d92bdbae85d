/**
 * `erase` jobs (`enqueue --erase-sender ID --reason TEXT`, `--erase-conversation ID`): the same
 * erasure as `convo-mirror erase` (src/run/erase.ts: the mirror's erasure, then the archive step
 * under the publisher lock), run by the daemon that holds the mirror. The subject's id is in the
 * job's data until the mirror has recorded the erasure, then dropped from it; it is never logged,
 * returned or counted.
 */
import { UnrecoverableError, type Job } from 'bullmq';
import { ConvoMirrorError, describeError } from '../src/errors.js';
import { archiveStep, eraseAndArchive, type ArchiveStepOptions, type ArchiveStepResult } from '../src/run/erase.js';
import type { ErasureCounts } from '../src/store/mirror.js';
import type { JobDeps } from './deps.js';
import type { EraseJobData, EraseJobResult } from './queue.js';

/**
 * The request an `erase` job carries, checked as `erase`'s flags are.
 *
 * @throws `UnrecoverableError` (never retried) with one line naming what is wrong (never the subject)
 */
function checkedRequest(job: Job<EraseJobData>, accountId: string): { kind: 'sender' | 'conversation'; subject: string; reason: string; accountId: string } {
  const { kind, subject, reason } = job.data;
  const invalid = (why: string) => new UnrecoverableError(`erase job ${job.id}: not a valid request: ${why}; nothing erased`);
  if (kind !== 'sender' && kind !== 'conversation') throw invalid(`its kind ${JSON.stringify(String(kind)).slice(0, 40)} is neither "sender" nor "conversation"`);
  if (subject === undefined) throw invalid('it holds no subject id (dropped from its data when it failed before); queue it again with convo-mirror enqueue');
  if (typeof subject !== 'string' || subject.trim() === '') throw invalid(`the ${kind} id is empty`);
  if (typeof reason !== 'string' || reason.trim() === '') throw invalid('the reason is blank: it is required (why the subject is erased, e.g. the ticket reference); queue it again with --reason');
  return { kind, subject, reason, accountId };
}

/** Whether `err` ends the job for good: BullMQ retries nothing after it, or this was its last attempt. */
function isFinal(job: Job, err: unknown): boolean {
  if (err instanceof UnrecoverableError) return true;
  if (err instanceof ConvoMirrorError && !err.retryable) return true;
  return job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
}

/** The job's data without the subject (kept as a dead letter, or awaiting its archive step). */
function withoutSubject(data: EraseJobData, erasureId?: number): EraseJobData {
  const { subject: _subject, ...rest } = data;
  return { ...rest, ...(erasureId !== undefined ? { erasureId } : {}) };
}

/**
 * `erase`: the mirror's erasure (unless an earlier attempt recorded it: `erasureId` in the data),
 * then the archive step. Once the mirror has recorded the erasure, the subject is dropped from the
 * job's data and {@link JobDeps.onErasure} is told; a retried attempt runs only the archive step.
 * A job that fails for good drops its subject too. A failed archive step leaves the erasure pending
 * in the mirror: the next publication (a run's, another `erase`) finishes it.
 *
 * @returns the erasure's id, kind, account and counts, and what the archive step did; never the subject
 * @throws `UnrecoverableError` for an invalid request (a blank reason, no subject, an unknown kind);
 *   what the mirror or the archive step throws (processJob lets it decide retry)
 */
export async function processEraseJob(d: JobDeps, job: Job<EraseJobData>): Promise<EraseJobResult> {
  const logger = d.logger.child({ job: job.id });
  const o: ArchiveStepOptions = { settings: d.target, clock: d.clock, logger };
  const data = job.data;
  try {
    if (data.erasureId !== undefined) {
      const step = await archiveStep(d.mirror, data.erasureId, o);
      return await resultOf(d, data, data.erasureId, undefined, step);
    }
    const request = checkedRequest(job, d.accountId);
    const done = await eraseAndArchive(d.mirror, request, {
      ...o,
      afterMirror: async (erased) => {
        report(d, request.kind);
        await job.updateData(withoutSubject(data, erased.erasureId));
      },
    });
    return await resultOf(d, data, done.mirror.erasureId!, done.mirror, done);
  } catch (err) {
    if (isFinal(job, err) && job.data.subject !== undefined) {
      await job.updateData(withoutSubject(job.data)).catch((e: unknown) => logger.warn({ err: describeError(e) }, 'could not drop the subject from the failed erase job'));
    }
    throw err;
  }
}

/** Tells {@link JobDeps.onErasure}; an observer never fails a job. */
function report(d: JobDeps, kind: 'sender' | 'conversation'): void {
  try {
    d.onErasure?.(kind, d.accountId);
  } catch (err) {
    d.logger.warn({ err: describeError(err) }, 'erasure hook failed');
  }
}

/** The job's result: counts of the mirror's erasure (zeros when an earlier attempt recorded it) and of the archive step. */
async function resultOf(d: JobDeps, data: EraseJobData, erasureId: number, counts: ErasureCounts | undefined, step: ArchiveStepResult): Promise<EraseJobResult> {
  const own = step.archived.find((e) => e.erasureId === erasureId);
  let archive: EraseJobResult['archive'];
  if (own) archive = { files: own.files.length, lines: own.lines, recordBatchId: own.record?.batch_id ?? null };
  else if (step.busy) archive = { pending: step.busy };
  else {
    // Finished before this attempt (by another publication, or an attempt that failed after it).
    const row = (await d.mirror.erasures()).find((e) => e.id === erasureId);
    archive = { files: 0, lines: 0, recordBatchId: row?.archiveBatchId ?? null };
  }
  const c = counts ?? { messages: 0, history: 0, pendingChanges: 0, conversations: 0, publishedLines: 0 };
  return {
    outcome: 'erased',
    erasureId,
    kind: data.kind,
    accountId: d.accountId,
    messages: c.messages,
    history: c.history,
    pendingChanges: c.pendingChanges,
    conversations: c.conversations,
    publishedLines: c.publishedLines,
    archive,
  };
}
