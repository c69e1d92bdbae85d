/**
 * Names inside an export directory, and the check that an export directory is a safe place to write.
 *
 * Layout of an export directory (everything else in it belongs to someone else and is never touched):
 * - `manifest.json` ({@link MANIFEST}), the pointer to the chain head;
 * - `_ledger/`, the batch records (`LEDGER_DIR` in ledger.ts);
 * - the partition trees `messages/`, `conversations/` and `runs/` ({@link STREAM_DIRS});
 * - `.convo-mirror-tmp/` ({@link TEMP_DIR}): the only place where temp files are written, and the
 *   only place where publication ever deletes anything.
 */
import fs from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../errors.js';

/** Name of the manifest file at the root of the export directory. */
export const MANIFEST = 'manifest.json';

/**
 * Name of the directory, at the root of the export directory, that holds the temp files of a
 * publication in progress. Files are written and fsynced there, then renamed into place (same
 * filesystem). Publication removes leftovers there (and only there) when it starts.
 */
export const TEMP_DIR = '.convo-mirror-tmp';

/** The partition trees convo-mirror writes, one per change-log stream. */
export const STREAM_DIRS = ['messages', 'conversations', 'runs'] as const;

/**
 * Temp names convo-mirror generates: `<stream>-<batch>-<first seq>.<pid>.tmp`,
 * `erasure-<erasure id>-<first seq>.<pid>.tmp`, `ledger-<batch>.<pid>.tmp` and `manifest.json.<pid>.tmp`.
 */
const TEMP_NAME_RE = /^(?:[a-z]+-\d+-\d+|ledger-\d+|manifest\.json)\.\d+\.tmp$/;

/** Temp name of the data file of batch `batchId` whose first line has `firstSeq`, in {@link TEMP_DIR}. */
export function partitionTempName(stream: string, batchId: number, firstSeq: number): string {
  return `${stream}-${batchId}-${firstSeq}.${process.pid}.tmp`;
}

/** Temp name of the file erasure `erasureId` rewrites from the data file whose first seq is `firstSeq`, in {@link TEMP_DIR}. */
export function erasureTempName(erasureId: number, firstSeq: number): string {
  return `erasure-${erasureId}-${firstSeq}.${process.pid}.tmp`;
}

/** Temp name of batch `batchId`'s ledger record, in {@link TEMP_DIR}. */
export function recordTempName(batchId: number): string {
  return `ledger-${batchId}.${process.pid}.tmp`;
}

/** Temp name of the manifest, in {@link TEMP_DIR}. */
export function manifestTempName(): string {
  return `${MANIFEST}.${process.pid}.tmp`;
}

/** True for a name {@link partitionTempName} or {@link manifestTempName} generates. */
export function isTempName(name: string): boolean {
  return TEMP_NAME_RE.test(name);
}

/** What kind of file an `lstat` result (or a directory entry) describes, in words: `symbolic link`, `directory`... */
export function kindOf(st: fs.Stats | fs.Dirent): string {
  if (st.isSymbolicLink()) return 'symbolic link';
  if (st.isDirectory()) return 'directory';
  if (st.isFile()) return 'regular file';
  if (st.isFIFO()) return 'FIFO';
  if (st.isSocket()) return 'socket';
  return 'device';
}

/** A path made absolute and canonical as far as it exists. */
interface Canonical {
  /** The realpath of the longest existing prefix, with the missing rest appended (`.`/`..` applied). */
  real: string;
  /** The realpath of the longest existing prefix. */
  existing: string;
  /** Whether the whole path exists. */
  exists: boolean;
}

/**
 * Canonical form of `p`: the kernel's realpath of its longest existing prefix (symlinks resolved,
 * `..` after a symlink resolved as the kernel does), then the components that do not exist yet.
 * Looks at the components of `p` only; never walks a directory.
 */
function canonical(p: string): Canonical {
  const abs = path.isAbsolute(p) ? p : `${process.cwd()}${path.sep}${p}`;
  const root = path.parse(abs).root;
  const parts = abs.slice(root.length).split(path.sep).filter((s) => s !== '');
  for (let k = parts.length; k >= 0; k--) {
    let existing: string;
    try {
      existing = fs.realpathSync.native(root + parts.slice(0, k).join(path.sep));
    } catch {
      continue; // ENOENT, ENOTDIR, EACCES, ELOOP: try a shorter prefix
    }
    const rest = parts.slice(k);
    return { real: path.resolve(existing, ...rest), existing, exists: rest.length === 0 };
  }
  return { real: path.resolve(abs), existing: root, exists: false };
}

/** True when `inner` lies strictly below `outer` (both canonical). */
function isBelow(outer: string, inner: string): boolean {
  const prefix = outer.endsWith(path.sep) ? outer : outer + path.sep;
  return inner !== outer && inner.startsWith(prefix);
}

const VARIABLE = 'CONVO_MIRROR_EXPORT_DIR';

/**
 * Refuses an export directory that could lose or leak data: the filesystem root, an existing file
 * (or a path below one), the database file itself, or a directory containing the database (its own
 * directory or any ancestor of it), since the database, its WAL and lock files would then sit in the
 * export tree. The default layout (database `data/mirror.sqlite`, exports `data/exports`) and any
 * sibling of the database's directory are fine.
 *
 * Both paths are made absolute (relative to the current directory) and compared through the
 * realpath of the longest existing prefix of each, so neither a symlink nor `..` hides the relation.
 * The database is checked both at its resolved location and beside its (possibly symlinked) name,
 * where convo-mirror keeps its lock files. Only the components of the two paths are examined: the
 * filesystem is never walked, and nothing is created.
 *
 * @param exportDir - the export directory as configured (absolute or relative)
 * @param dbFile - the mirror's database file as configured (`Mirror.localFile`); undefined (a
 *   mirror in a database server), `''` or `':memory:'` (no file) skips the database checks
 * @throws {@link ConfigError} for `CONVO_MIRROR_EXPORT_DIR`, with a one-line message naming both paths
 */
export function assertSafeExportDir(exportDir: string, dbFile: string | undefined): void {
  const exp = canonical(exportDir);
  const shown = exp.real === exportDir ? exportDir : `${exportDir} (${exp.real})`;
  if (path.parse(exp.real).root === exp.real) {
    throw new ConfigError(VARIABLE, `the export directory ${shown} is a filesystem root; choose a directory of its own, e.g. data/exports`);
  }
  if (dbFile !== undefined && dbFile !== '' && dbFile !== ':memory:') {
    const dbReal = canonical(dbFile).real;
    const dbBeside = path.join(canonical(path.dirname(path.resolve(dbFile))).real, path.basename(dbFile));
    const suggestion = path.join(path.dirname(dbFile), 'exports');
    for (const db of new Set([dbReal, dbBeside])) {
      const dbShown = db === dbFile ? dbFile : `${dbFile} (${db})`;
      if (db === exp.real) {
        throw new ConfigError(VARIABLE, `the export directory ${shown} is the mirror database ${dbShown} itself; choose a directory such as ${suggestion}`);
      }
      if (isBelow(db, exp.real)) {
        throw new ConfigError(VARIABLE, `the export directory ${shown} lies below the path of the mirror database ${dbShown}; choose a directory such as ${suggestion}`);
      }
      if (path.dirname(db) === exp.real) {
        throw new ConfigError(
          VARIABLE,
          `the export directory ${shown} is the directory of the mirror database ${dbShown}, which would sit inside the export tree; choose a subdirectory such as ${suggestion}`,
        );
      }
      if (isBelow(exp.real, db)) {
        throw new ConfigError(
          VARIABLE,
          `the export directory ${shown} contains the mirror database ${dbShown}, which would sit inside the export tree; choose a directory beside it, such as ${suggestion}`,
        );
      }
    }
  }
  let st: fs.Stats;
  try {
    st = fs.statSync(exp.existing);
  } catch {
    return; // vanished meanwhile: creating it will report the error
  }
  if (!st.isDirectory()) {
    throw new ConfigError(
      VARIABLE,
      exp.exists
        ? `the export directory ${shown} exists and is not a directory`
        : `the export directory ${shown} cannot be created: ${exp.existing} is not a directory`,
    );
  }
}
