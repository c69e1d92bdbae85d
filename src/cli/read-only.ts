/**
 * The read-only commands' computations (`status`, `verify`) on an existing mirror, without the
 * writer lock, on a consistent snapshot.
 */
import fs from 'node:fs';
import { loadConfig, type Config, type ConfigFlags } from '../../config/index.js';
import type { Mirror } from '../store/mirror.js';
import { mirrorFileOf, readConsistent } from '../store/open-mirror.js';
import { MirrorUnusableError, describeError } from '../errors.js';
import { archiveVerdict, verifyArchive, type ArchiveReport, type VerifyOptions } from '../export/verify.js';
import { EXIT, exitFor, fail, type SetExit } from './exit.js';

/** Failpoints of the read-only commands' computations, for tests. */
export interface SnapshotHooks {
  /**
   * Called after each computation on a read-only open, before {@link Mirror.snapshotChanged} is
   * asked (attempt 1, 2, 3).
   */
  onSnapshot?: (attempt: number, mirror: Mirror) => void | Promise<void>;
}

/** What `status` reports from the mirror (the queue is read apart). */
export interface StatusResult {
  counts: Record<string, number>;
  /** The ledger's chain head, if anything was published. */
  head: { batch_id: number; hash: string } | undefined;
  runs: Record<string, unknown>[];
  failures: Record<string, unknown>[];
}

/** What `verify` found: the archive's report, and the mirror it was checked against (if any). */
export interface VerifyResult extends ArchiveReport {
  /** Where the mirror is ({@link Mirror.location}: a SQLite file's absolute path); undefined when verified without the database. */
  file: string | undefined;
}

/** Computes {@link StatusResult} from a read-only mirror. */
export async function statusOf(mirror: Mirror): Promise<StatusResult> {
  return { counts: await mirror.counts(), head: await mirror.ledgerHead(), runs: await mirror.lastRuns(5), failures: await mirror.lastRunFailures() };
}

/**
 * Computes {@link VerifyResult} ({@link verifyArchive}); a mirror whose own reads fail (a damaged
 * page) is reported as a `database` problem, not a crash.
 *
 * @param mirror - the mirror, read-only; undefined: the ledger and the files alone
 */
export async function verifyOf(mirror: Mirror | undefined, o: Omit<VerifyOptions, 'mirror'>): Promise<VerifyResult> {
  try {
    return { file: mirror?.location, ...(await verifyArchive({ ...o, mirror })) };
  } catch (err) {
    if (!(err instanceof MirrorUnusableError) || !mirror) throw err;
    const report = await verifyArchive({ ...o, mirror: undefined, deep: false });
    const problem = { path: mirror.location, problem: 'mirror' as const, detail: describeError(err.cause) };
    const checks = report.checks.map((c) => (c.name === 'database' ? { name: c.name, status: 'failed' as const, detail: '1 problem' } : c));
    return { file: mirror.location, ...report, checks, problems: [problem, ...report.problems], verdict: archiveVerdict({ ...report, checks }) };
  }
}

/**
 * Computes a read-only command's whole result on an existing mirror with
 * {@link readConsistent}: a result read from a file a writer changed meanwhile is thrown away and
 * computed again (at most 3 attempts), so a writer that starts mid-way cannot make a healthy
 * mirror look damaged.
 *
 * @param target - the mirror (`CONVO_MIRROR_DB`)
 */
export async function readMirrorResult<R>(target: string, compute: (mirror: Mirror) => R | Promise<R>, hooks: SnapshotHooks = {}): Promise<R> {
  return readConsistent(target, compute, hooks.onSnapshot ? { onSnapshot: hooks.onSnapshot } : {});
}

/**
 * {@link readMirrorResult} with SIGINT/SIGTERM held off: with a listener installed a signal waits
 * for the read to end (it is not cut short), so a private copy of the mirror (a `-wal` with no live
 * writer) is always removed. Returns the signal that came meanwhile, if any.
 */
async function readUninterrupted<R>(target: string, compute: (mirror: Mirror) => R | Promise<R>): Promise<{ result: R; interrupted?: NodeJS.Signals }> {
  let interrupted: NodeJS.Signals | undefined;
  const onSignal = (sig: NodeJS.Signals) => (interrupted ??= sig);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  let result: R;
  try {
    result = await readMirrorResult(target, compute);
  } finally {
    // A signal that came during the last synchronous step of the read is delivered on the next turn of the loop.
    await new Promise((resolve) => setImmediate(resolve));
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  return interrupted ? { result, interrupted } : { result };
}

/**
 * Runs a read-only command (`status`, `verify`) on an existing mirror, without the writer lock:
 * `compute` builds the whole result on a consistent read-only snapshot ({@link readMirrorResult}),
 * then `print` (after the mirror is closed) writes it and returns the exit code. A missing mirror is
 * a configuration error (exit 2) and is not created, unless `o.withoutMirror` computes the result
 * without it; a signal during the read exits 130.
 */
export async function withExistingMirror<R>(
  flags: ConfigFlags,
  setExit: SetExit,
  compute: (mirror: Mirror, config: Config) => R | Promise<R>,
  print: (result: R, config: Config) => number | Promise<number>,
  o: { withoutMirror?: (config: Config) => R | Promise<R> } = {},
): Promise<void> {
  try {
    const config = loadConfig(process.env, flags, { needsApi: false });
    const file = mirrorFileOf(config.db);
    if (file !== undefined && !fs.existsSync(file)) {
      if (o.withoutMirror) setExit(await print(await o.withoutMirror(config), config));
      else setExit(fail(EXIT.CONFIG, `no mirror at ${config.db} (CONVO_MIRROR_DB); run convo-mirror sync first`));
      return;
    }
    // Read-only: no lock, no WAL switch, no migration, no file created beside it (an auditor's copy, a backup).
    const read = await readUninterrupted(config.db, (mirror) => compute(mirror, config));
    if (read.interrupted) {
      setExit(fail(EXIT.INTERRUPTED, `interrupted by ${read.interrupted}`));
      return;
    }
    setExit(await print(read.result, config));
  } catch (err) {
    setExit(exitFor(err));
  }
}
