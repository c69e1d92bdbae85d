/**
 * Running something as an unprivileged user, for tests of permissions (a read-only copy, an
 * unreadable file). Root ignores permission bits, so when the suite runs as root these run as user
 * 65534 through `setpriv`, on a copy of the built CLI that user can read (test/unprivileged-copy.ts,
 * made once in global setup): a checkout in a private directory would not let it reach `dist/`.
 * Not as root, they run as the user running the suite, on the checkout itself.
 *
 * When neither can be done the tests skip, saying why in their title:
 *
 * ```ts
 * it.skipIf(unprivilegedSkip)(skipTitle('an unreadable .env …'), async () => {
 *   const r = await runCommand(asUnprivileged([process.execPath, unprivilegedPath(CLI), 'config']), env);
 * });
 * ```
 */
import os from 'node:os';
import path from 'node:path';
import { inject } from 'vitest';
import { ROOT } from './children.js';
import { UNPRIVILEGED_UID, type Unprivileged } from './unprivileged-copy.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** How to run as an unprivileged user in this run (see test/unprivileged-copy.ts). */
    unprivileged: Unprivileged;
  }
}

export { UNPRIVILEGED_UID };

/** The suite runs as root: permission cases need another user. */
export const asRoot = os.userInfo().uid === 0;

const provided = inject('unprivileged');
if (!provided) throw new Error('unprivileged was not provided: is test/global-setup.ts listed in vitest.config.ts globalSetup?');

/** Why tests as an unprivileged user are skipped in this run, or undefined when they run. */
export const unprivilegedSkip: string | undefined = 'skip' in provided ? provided.skip : undefined;

/** `title`, plus the reason when {@link unprivilegedSkip} skips it (the reason shows in the report). */
export function skipTitle(title: string): string {
  return unprivilegedSkip ? `${title} [skipped: ${unprivilegedSkip}]` : title;
}

function ready(): { argv: string[]; root: string } {
  if ('skip' in provided) throw new Error(`no unprivileged run here (${provided.skip}): skip the test with unprivilegedSkip`);
  return provided;
}

/** `argv` run as the unprivileged user: behind `setpriv --reuid=65534 …` as root, as is otherwise. */
export function asUnprivileged(argv: string[]): string[] {
  return [...ready().argv, ...argv];
}

/**
 * A file of the checkout (the CLI, a module under `dist/`, a package of `node_modules/`) at a path
 * the unprivileged user can read: in the readable copy as root, the file itself otherwise.
 *
 * @throws Error when `file` is not under the repository root
 */
export function unprivilegedPath(file: string): string {
  const rel = path.relative(ROOT, file);
  if (rel.startsWith('..') || path.isAbsolute(rel)) throw new Error(`${file} is not in the repository (${ROOT})`);
  return path.join(ready().root, rel);
}
