/**
 * The complete step of a recorded run: publish its changes, record its failures and figures, and
 * build the summary. Shared by `sync` (runSync), on-demand conversation jobs and the `finish` step
 * of workspace jobs.
 */
import { RunError, describeError } from '../errors.js';
import { heartbeatWindowEnd, type ExportResult } from '../export/exporter.js';
import { Publisher } from '../export/publisher.js';
import type { SyncDeps } from '../sync/types.js';
import { runColumns, workFigures } from './figures.js';
import type { RunHandle, RunOutcome, RunSummary } from './types.js';

/**
 * Finishes a recorded run: publishes the exports, records failures and figures in `runs` and
 * `run_failures` (which appends the run's `runs` change-log line), publishes that line too, records
 * the chain head the run leaves, and returns the summary. Whatever fails here (publication, or
 * recording into a full or damaged mirror), the summary is still built and carried by the error,
 * so the caller can always print it.
 *
 * @throws {@link RunError} carrying the summary when `fatal` is set, publication fails, or the run
 *   cannot be recorded (its cause is then the store's error, e.g. {@link MirrorUnusableError})
 */
export async function completeRun(deps: SyncDeps, o: RunOutcome): Promise<RunSummary> {
  const log = deps.logger.child({ run: o.run.runId });
  const publisher = new Publisher(deps.mirror, o.target, { clock: deps.clock, logger: log, runId: o.run.runId });
  const published = await publishRun(publisher);
  const failuresError = await recordFailures(deps, o);
  const summary = await buildSummary(deps, o, published);
  let firstError = o.fatal ?? published.error ?? failuresError;
  if (firstError !== undefined) summary.status = 'failed';
  try {
    await deps.mirror.finishRun(o.run.runId, runColumns(summary, firstError !== undefined ? describeError(firstError) : null));
    // The run's own line is part of the archive: a run that changed something publishes it now
    // and records the head it leaves; the line of a run that changed nothing waits for the next
    // publication with changes, or the heartbeat (a quiet daemon adds no record every tick).
    // (Its failure is no failure of the run, recorded as it is: the line waits for the next publication.)
    if (published.error === undefined) {
      if (!o.target.runsHeartbeatMs || (await changedAnything(deps, o.run.runId))) {
        const own = await publishRun(publisher, 'now');
        if (own.error !== undefined) log.warn({ err: describeError(own.error) }, "could not publish the run's own line; the next publication exports it");
      } else {
        const held = await heldLines(deps, o.target.runsHeartbeatMs);
        if (held) summary.export.held = held;
      }
    }
    const head = await deps.mirror.ledgerHead();
    await deps.mirror.setRunLedgerHead(o.run.runId, head);
    if (head) summary.export.head = head;
  } catch (err) {
    // A full disk or a damaged mirror: the run cannot be recorded, but the summary is still told.
    log.error({ err: describeError(err) }, 'could not record the run in the mirror');
    firstError ??= err;
    summary.status = 'failed';
  }
  log.info(
    { status: summary.status, duration_ms: summary.durationMs, requests: summary.requests, messages_served: summary.messages.served, minimum_requests: summary.minimumRequests, export_lines: summary.export.lines },
    'run finished',
  );
  if (firstError !== undefined) throw new RunError(summary, firstError);
  return summary;
}

/**
 * Records a run that a shutdown cut short as `interrupted` (no publication: the next run, or the
 * job's next attempt, publishes its changes; checkpoints let it resume).
 *
 * @throws {@link MirrorUnusableError} when the mirror cannot be written
 */
export async function interruptRun(deps: Pick<SyncDeps, 'mirror'>, run: RunHandle, why: string): Promise<void> {
  await deps.mirror.finishRun(run.runId, { status: 'interrupted', error: why });
}

/** What publication did, or why it failed. */
interface Published {
  exported?: ExportResult;
  error?: unknown;
}

/**
 * Publishes every change not yet exported (this run's and any earlier run's); run lines alone
 * wait for their heartbeat unless `runLines` is `now`. Never rejects.
 */
async function publishRun(publisher: Publisher, runLines: 'hold' | 'now' = 'hold'): Promise<Published> {
  try {
    return { exported: await publisher.publish({ runLines }) };
  } catch (err) {
    return { error: err }; // a damaged mirror arrives as MirrorUnusableError (the store converts it)
  }
}

/** Whether run `runId` changed any message or conversation (its change-log rows, in every process and attempt). */
async function changedAnything(deps: SyncDeps, runId: number): Promise<boolean> {
  try {
    const c = await deps.mirror.runChanges(runId);
    return [c.messages, c.conversations].some((x) => x.inserted + x.updated + x.deleted > 0);
  } catch {
    return true; // an unusable mirror: publishing says why
  }
}

/** The run lines waiting when held ({@link RunSummary} `export.held`), or undefined when none waits or nothing is held. */
async function heldLines(deps: SyncDeps, heartbeatMs: number | undefined): Promise<RunSummary['export']['held']> {
  if (!heartbeatMs) return undefined;
  const waiting = await deps.mirror.pendingExport();
  if (waiting.oldestRunLineAt === undefined) return undefined;
  return { lines: waiting.runLines, until: new Date(heartbeatWindowEnd(Date.parse(waiting.oldestRunLineAt), heartbeatMs)).toISOString() };
}

/** Records the run's failures (replacing earlier records of the run). @returns the store's error, if any */
async function recordFailures(deps: SyncDeps, o: RunOutcome): Promise<unknown> {
  try {
    await deps.mirror.recordFailures(o.run.runId, o.work?.failures ?? []);
    return undefined;
  } catch (err) {
    return err;
  }
}

/**
 * The run's summary; status from the outcome (`failed` whenever an error ended it). Messages
 * inserted, updated and tombstoned are the run's own change-log rows (so pages a failed crawl
 * committed, and those of a crashed daemon's run before it resumed, count too); if the mirror
 * cannot be read, the finished crawls' counts stand in.
 */
async function buildSummary(deps: SyncDeps, o: RunOutcome, published: Published): Promise<RunSummary> {
  const { failures, ...figures } = workFigures(o.work, o.run.scope, o.fatal !== undefined);
  try {
    const changed = (await deps.mirror.runChanges(o.run.runId)).messages;
    figures.messages = { ...figures.messages, ...changed };
  } catch {
    /* an unusable mirror: the error is reported by recording the run */
  }
  const failed = o.fatal !== undefined || published.error !== undefined;
  const exported = published.exported;
  return {
    runId: o.run.runId,
    scope: o.run.scope,
    refresh: o.run.refresh,
    trigger: o.run.trigger,
    status: failed ? 'failed' : o.interrupted ? 'interrupted' : failures.length > 0 ? 'partial' : 'succeeded',
    durationMs: deps.clock.now() - o.run.startedMs,
    ...figures,
    export: {
      // What the run's end published, and what it published before (progressive publications).
      files: (exported?.files.length ?? 0) + (o.publishedDuringRun?.files ?? 0),
      lines: (exported?.lines ?? 0) + (o.publishedDuringRun?.lines ?? 0),
      watermark: exported?.watermark ?? 0,
      resumed: exported?.resumed ?? false,
      ...(published.error !== undefined ? { error: describeError(published.error) } : {}),
    },
    failures,
  };
}
