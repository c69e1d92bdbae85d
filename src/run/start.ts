/**
 * Starting a recorded run: a new `runs` row, or taking up a run recorded earlier (by an earlier
 * attempt of a job, or by a process that died, which left it `interrupted`).
 */
import type { Logger } from 'pino';
import type { Mirror } from '../store/mirror.js';
import { openMirror } from '../store/open-mirror.js';
import type { FileModes } from '../private-fs.js';
import type { Clock } from '../clock.js';
import type { SyncDeps } from '../sync/types.js';
import type { RunHandle, RunSpec } from './types.js';

/** What starting a run needs: the mirror, the clock and a logger. */
export type RunDeps = Pick<SyncDeps, 'mirror' | 'clock' | 'logger'>;

/**
 * Records the start of a run (status `running`) with its scope, refresh and trigger.
 *
 * @throws {@link MirrorUnusableError} when the mirror cannot be written
 */
export async function startRun(deps: RunDeps, spec: RunSpec): Promise<RunHandle> {
  const runId = await deps.mirror.startRun(spec);
  deps.logger.info({ run: runId, scope: spec.scope, refresh: spec.refresh, trigger: spec.trigger, account_id: spec.accountId }, 'run started');
  return { ...spec, runId, startedMs: deps.clock.now() };
}

/** A run recorded earlier: its id and, when known, when it started (epoch ms). */
export interface EarlierRun {
  runId: number;
  startedMs?: number | undefined;
}

/**
 * Takes up a run recorded earlier so its work continues under the same id: a run a crash left
 * `interrupted` is reopened (`running` again, `resumes` + 1); a running one is taken as it is.
 *
 * @param o.evenIfEnded - also take up a run that has ended (an on-demand job's retried attempt
 *   continues its own run after an earlier attempt recorded it). @defaultValue false
 * @returns the run, or undefined when it has ended (and `evenIfEnded` is not set) or is unknown
 * @throws {@link MirrorUnusableError} when the mirror cannot be written
 */
export async function resumeRun(deps: RunDeps, spec: RunSpec, earlier: EarlierRun, o: { evenIfEnded?: boolean } = {}): Promise<RunHandle | undefined> {
  const state = await deps.mirror.resumeRun(earlier.runId);
  if (state === 'ended' && o.evenIfEnded !== true) return undefined;
  if (state === 'resumed') deps.logger.info({ run: earlier.runId }, 'run left interrupted by a crash taken up again');
  return { ...spec, runId: earlier.runId, startedMs: earlier.startedMs ?? deps.clock.now() };
}

/**
 * Takes up `earlier` when it is still open (running or interrupted), else starts a new run.
 *
 * @throws {@link MirrorUnusableError} when the mirror cannot be written
 */
export async function openRun(deps: RunDeps, spec: RunSpec, earlier?: EarlierRun): Promise<RunHandle> {
  return (earlier && (await resumeRun(deps, spec, earlier))) || (await startRun(deps, spec));
}

/**
 * Whether a run is still open (running, or interrupted and now reopened): work of a run that has
 * ended would change the mirror with nobody to publish or record it.
 */
export async function runIsOpen(mirror: Mirror, runId: number): Promise<boolean> {
  return (await mirror.resumeRun(runId)) !== 'ended';
}

/**
 * Marks the runs a dead process left `running` as `interrupted`. Call once at process start-up,
 * right after opening the mirror for writing (the writer lock is then ours, so no live process can
 * own a running run), and never while runs of this process are in flight.
 *
 * @returns how many runs were marked
 * @throws {@link MirrorUnusableError} when the mirror cannot be written
 */
export async function sweepInterruptedRuns(mirror: Mirror, logger: Logger): Promise<number> {
  const n = await mirror.markInterruptedRuns();
  if (n) logger.warn({ runs: n }, 'runs left running by a dead process marked interrupted');
  return n;
}

/**
 * Opens the mirror for writing, as a process that records runs does once at start-up (`sync`, the
 * daemon): takes the writer lock, then marks the runs a dead process left `running` as interrupted
 * ({@link sweepInterruptedRuns}; with the lock held, none of them can be live). The mirror is
 * closed again when the sweep fails. An open that migrated the mirror logs `migrated the mirror`
 * (PostgreSQL: of a fleet's daemons starting together on a new schema, only the one that did it).
 *
 * @param modes - modes of what opening creates (see `MirrorOptions.modes`)
 * @param clock - the mirror's time (runs, changes). @defaultValue the system clock
 * @param target - the mirror (`CONVO_MIRROR_DB`), see {@link openMirror}
 * @throws what {@link openMirror} throws; {@link MirrorUnusableError} from the sweep
 */
export async function openMirrorForRuns(target: string, modes: FileModes, logger: Logger, clock?: Clock): Promise<Mirror> {
  const mirror = await openMirror(target, {
    modes,
    ...(clock ? { clock } : {}),
    onMigrated: (m) => logger.info({ migrations: m.applied, schema_version: m.version }, 'migrated the mirror'),
  });
  try {
    await sweepInterruptedRuns(mirror, logger);
  } catch (err) {
    await mirror.close();
    throw err;
  }
  return mirror;
}
