/**
 * `convo-mirror verify`: the database (quick_check), the manifest and every published export file
 * against its records, read without the writer lock. Exit 0 intact, 1 with problems.
 */
import type { Command } from 'commander';
import { EXIT, type SetExit } from './exit.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { verifyOf, withExistingMirror, type VerifyResult } from './read-only.js';

/** Prints what `verify` found (problems on stderr, the verdict on stdout); returns the exit code. */
function printVerify({ file, dbProblems, problems, files }: VerifyResult, exportDir: string): number {
  for (const p of dbProblems) process.stderr.write(`problem: database ${file}: ${p}\n`);
  for (const p of problems) process.stderr.write(`problem: ${p.path}: ${p.problem}${p.detail ? ` (${p.detail})` : ''}\n`);
  const n = dbProblems.length + problems.length;
  process.stdout.write(
    n === 0
      ? `exports intact: ${files.n} files, ${files.l} lines; database: quick_check ok\n`
      : `${n} problem${n === 1 ? '' : 's'}: ${dbProblems.length ? `the database ${file} is damaged (restore a backup, or rebuild with sync --full into a new file)` : 'database: quick_check ok'}` +
          `${problems.length ? `; ${problems.length} in ${exportDir}` : ''}\n`,
  );
  return n === 0 ? EXIT.OK : EXIT.FAILURES;
}

/** Adds `verify` to `program`. */
export function addVerifyCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('verify')
    .description('Check the mirror database (PRAGMA quick_check), the manifest, and every published export file against its recorded size, line count and SHA-256; report unlisted files');
  addConfigFlags(cmd, 'verify').action((o) =>
    withExistingMirror(
      configFlagsOf(o, 'verify'),
      setExit,
      (mirror, config) => verifyOf(mirror, config.exportDir),
      (result, config) => printVerify(result, config.exportDir),
    ),
  );
}
