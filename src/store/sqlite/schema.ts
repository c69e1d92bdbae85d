/**
 * The schema's version and its migrations: `PRAGMA user_version` holds how many of
 * {@link MIGRATIONS} have run. A writer migrates at open; a read-only open only checks.
 */
import type { Db } from './sqlite.js';
import { StoreError } from '../../errors.js';
import { MIGRATIONS } from './migrations.js';

export { MIGRATIONS } from './migrations.js';

/**
 * Checks the schema version of `db`; returns it.
 *
 * @param file - the mirror's path, for messages
 * @param readOnly - also refuse a schema older than this code (read-only opens never migrate)
 * @throws {@link StoreError} when the file is not a convo-mirror database, is newer than this
 *   code, or (`readOnly`) older than this code
 */
export function checkSchema(db: Db, file: string, readOnly: boolean): number {
  const version = db.pragma('user_version', { simple: true }) as number;
  if (version > MIGRATIONS.length) {
    throw new StoreError(
      `the mirror ${file} has schema version ${version}, newer than this convo-mirror knows (${MIGRATIONS.length}); upgrade convo-mirror`,
      { file, version },
    );
  }
  if (version === 0) {
    const tables = db.prepare<[], { n: number }>(`SELECT count(*) AS n FROM sqlite_master WHERE type = 'table'`).get()?.n ?? 0;
    if (tables > 0 || readOnly) throw new StoreError(`${file} is ${tables > 0 ? 'a SQLite database but ' : ''}not a convo-mirror mirror`, { file });
  }
  if (readOnly && version < MIGRATIONS.length) {
    throw new StoreError(
      `the mirror ${file} has schema version ${version}, older than this convo-mirror's (${MIGRATIONS.length}); ` +
        'read-only commands never migrate: run convo-mirror sync (which migrates it) first',
      { file, version },
    );
  }
  return version;
}

/**
 * Applies the pending migrations of a writer's connection, each in its own immediate transaction
 * together with its `user_version`. A file upgraded from before {@link LEAN_SCHEMA_VERSION} is
 * rewritten once (`VACUUM`, which needs as much free disk as
 * the file) to get incremental auto-vacuum, which a new file gets at open (see `openWriter`).
 *
 * @throws {@link StoreError} as {@link checkSchema} (nothing is changed then); SQLite errors of a
 *   migration as they are (its transaction is rolled back)
 */
export function migrate(db: Db, file: string): void {
  const version = checkSchema(db, file, false);
  for (let v = version; v < MIGRATIONS.length; v++) {
    db.transaction(() => {
      db.exec(MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }).immediate();
  }
  if (version > 0 && version < LEAN_SCHEMA_VERSION && db.pragma('auto_vacuum', { simple: true }) !== AUTO_VACUUM_INCREMENTAL) {
    // Once, on the upgrade to the lean schema: rewrite the file without what it dropped, with
    // incremental auto-vacuum from now on (VACUUM is the only way to turn it on in an existing file).
    db.pragma('auto_vacuum = INCREMENTAL');
    db.exec('VACUUM');
  }
}

/** The schema version of the lean mirror (derived columns computed, change payloads pruned once published). */
export const LEAN_SCHEMA_VERSION = 8;
/** `PRAGMA auto_vacuum` value of INCREMENTAL. */
const AUTO_VACUUM_INCREMENTAL = 2;
