/**
 * Opening a mirror: `openMirror` picks the engine from the target (a PostgreSQL URL, else a
 * SQLite file), and `readConsistent` reads a result from a read-only open that no writer changed
 * underneath. Every caller outside src/store opens mirrors here.
 */
import { StoreError } from '../errors.js';
import type { Clock } from '../clock.js';
import type { Mirror, MirrorOptions } from './mirror.js';
import { SqliteMirror } from './sqlite/mirror.js';
import type { InspectOptions, PostgresInspection } from './postgres/inspect.js';
import type { PostgresTarget } from '../../config/db-url.js';

export type { PostgresInspection, PostgresRights } from './postgres/inspect.js';

export { WRITER_TABLE_PRIVILEGES } from './postgres/rights.js';

/**
 * What `check` reads of a PostgreSQL mirror: see `inspectPostgres` in src/store/postgres/inspect.ts
 * (loaded on first use, with node-postgres, so a SQLite mirror's process never loads either).
 *
 * @throws what `inspectPostgres` throws: `ConfigError` for a malformed URL, `MirrorDatabaseError` naming `CONVO_MIRROR_DB`
 */
export async function inspectPostgres(target: string | PostgresTarget, opts: InspectOptions = {}): Promise<PostgresInspection> {
  const { inspectPostgres: inspect } = await import('./postgres/inspect.js');
  return inspect(target, opts);
}

/** Whether `target` names a PostgreSQL database (`postgres://…` or `postgresql://…`) rather than a SQLite file. */
export function isPostgresTarget(target: string): boolean {
  return /^postgres(ql)?:\/\//i.test(target);
}

/**
 * The local file the mirror `target` lives in: the SQLite file (as given), or undefined for a
 * PostgreSQL URL. For checks that keep clear of the file before it is opened (an export directory
 * never holds it).
 */
export function mirrorFileOf(target: string): string | undefined {
  return isPostgresTarget(target) ? undefined : target;
}

/**
 * Opens the mirror `target` (`CONVO_MIRROR_DB`): a URL starting with `postgres://` or
 * `postgresql://` is a PostgreSQL database (the PostgreSQL engine); anything else is the path of a
 * SQLite file (or `:memory:`), opened as `SqliteMirror.open` says.
 *
 * @param target - a SQLite file path, `:memory:`, or a PostgreSQL URL
 * @param opts - see {@link MirrorOptions} (`lock`, `modes` and the test hooks concern SQLite only,
 *   `onMigrated` PostgreSQL only)
 * @throws {@link StoreError} or {@link MirrorUnusableError} naming the target when it cannot be
 *   opened (see `SqliteMirror.open` for a file)
 */
export async function openMirror(target: string, opts: MirrorOptions = {}): Promise<Mirror> {
  if (isPostgresTarget(target)) {
    // Loaded here, not at start: a SQLite mirror's process never loads node-postgres.
    const [{ openPostgresMirror }, { PG_SCHEMA_VERSION }] = await Promise.all([import('./postgres/mirror.js'), import('./postgres/migrations.js')]);
    const m = await openPostgresMirror(target, {
      ...(opts.clock ? { clock: opts.clock } : {}),
      ...(opts.readonly ? { readonly: true } : {}),
    });
    if (m.migrated > 0) opts.onMigrated?.({ applied: m.migrated, version: PG_SCHEMA_VERSION });
    return m;
  }
  return SqliteMirror.open(target, opts);
}

/** Options of {@link readConsistent}. */
export interface ReadConsistentOptions {
  /** Opens in all, at most (a result computed on the last is returned whatever). @defaultValue 3 */
  attempts?: number;
  /** Time source of the mirror opened. @defaultValue the system clock */
  clock?: Clock;
  /**
   * Called after each computation and before the check (a failpoint for tests: e.g. a writer
   * commits there).
   */
  onSnapshot?: (attempt: number, mirror: Mirror) => void | Promise<void>;
}

/**
 * Opens `target` read-only, runs `compute` on it and returns its result once it was computed on a
 * snapshot no writer changed under it ({@link Mirror.snapshotChanged} false): otherwise closes,
 * reopens and computes again, at most `opts.attempts` times in all (the result of the last
 * attempt is returned). An error thrown by `compute` on a changed snapshot is retried the same
 * way; otherwise it is thrown. The mirror is always closed before this returns.
 *
 * @param target - see {@link openMirror}
 * @param compute - reads what it needs from the mirror; must not keep it
 * @throws what {@link openMirror} throws for a read-only open; what `compute` throws
 */
export async function readConsistent<R>(target: string, compute: (mirror: Mirror) => R | Promise<R>, opts: ReadConsistentOptions = {}): Promise<R> {
  const attempts = Math.max(1, opts.attempts ?? 3);
  for (let attempt = 1; ; attempt++) {
    const mirror = await openMirror(target, { readonly: true, ...(opts.clock ? { clock: opts.clock } : {}) });
    try {
      let result: R;
      try {
        result = await compute(mirror);
      } catch (err) {
        await opts.onSnapshot?.(attempt, mirror);
        if (attempt < attempts && (await mirror.snapshotChanged())) continue;
        throw err;
      }
      await opts.onSnapshot?.(attempt, mirror);
      if (attempt < attempts && (await mirror.snapshotChanged())) continue;
      return result;
    } finally {
      await mirror.close();
    }
  }
}
