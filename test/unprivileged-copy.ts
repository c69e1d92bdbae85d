/**
 * The CLI for an unprivileged user (setup side; tests read the outcome through
 * test/unprivileged.ts). Root ignores permission bits, so tests that check what a reader without
 * write access sees, or an unreadable file, run the CLI as user 65534 through `setpriv` when the
 * suite runs as root. That user must reach the built CLI and the packages it loads, which a
 * checkout in a private directory (`mktemp -d`, mode 0700) does not allow.
 *
 * {@link makeUnprivilegedCopy} therefore makes, once per run, a directory under `os.tmpdir()` that
 * every user may enter, holding `package.json`, `dist/` and the production packages of
 * `node_modules/` (those package-lock.json does not mark `dev`): files are hard links where the
 * file is already readable by all and the filesystem allows it, copies made readable otherwise.
 * It then runs the copy's CLI (`--version`) and loads better-sqlite3 as that user; a copy that
 * fails either is removed and the reason returned, for the tests to skip with.
 *
 * No vitest import: runs in vitest's main process (test/global-setup.ts).
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** The unprivileged user and group (`nobody` on Debian and most distributions). */
export const UNPRIVILEGED_UID = 65534;

/** Where setpriv is looked for. */
export const SETPRIV = '/usr/bin/setpriv';

/** The argv prefix that runs a command as {@link UNPRIVILEGED_UID} with no supplementary groups. */
export const SETPRIV_ARGV = [SETPRIV, `--reuid=${UNPRIVILEGED_UID}`, `--regid=${UNPRIVILEGED_UID}`, '--clear-groups'];

/**
 * How the tests run something as an unprivileged user in this run (provided to the tests as
 * `unprivileged`):
 * - `argv`: the prefix before `node …` (empty when the suite does not run as root: the user
 *   running it is unprivileged already);
 * - `root`: the directory standing for the repository root (the checkout itself when not root,
 *   the readable copy otherwise);
 * - `skip`: instead of both, why no unprivileged run can be made here.
 */
export type Unprivileged = { argv: string[]; root: string } | { skip: string };

/** What {@link makeUnprivilegedCopy} made. */
export interface UnprivilegedCopy {
  dir: string;
  /** Files hard-linked and copied, for the one line logged at start. */
  linked: number;
  copied: number;
  /** Removes the copy (only the directory this made). */
  remove(): void;
}

/** The first directory from `/` down to `dir` that other users cannot enter, if any. */
function closedAncestor(dir: string): string | undefined {
  const parts = fs.realpathSync(dir).split(path.sep).filter(Boolean);
  let p: string = path.sep;
  for (const part of ['', ...parts]) {
    p = part ? path.join(p, part) : p;
    if ((fs.statSync(p).mode & 0o001) === 0) return p;
  }
  return undefined;
}

/** The package directories of node_modules/ the CLI may load: every package-lock entry not marked dev. */
function productionPackages(repoRoot: string): string[] {
  const lock = JSON.parse(fs.readFileSync(path.join(repoRoot, 'package-lock.json'), 'utf8')) as { packages?: Record<string, { dev?: boolean; link?: boolean }> };
  const keys = Object.entries(lock.packages ?? {})
    .filter(([k, v]) => k.startsWith('node_modules/') && v.dev !== true && v.link !== true)
    .map(([k]) => k)
    .sort();
  // A nested package (node_modules/a/node_modules/b) comes with its parent's directory.
  return keys.filter((k) => !keys.some((o) => k.startsWith(`${o}/`)) && fs.existsSync(path.join(repoRoot, k)));
}

/** Replicates `src` at `dst` readable by all: directories 0755, files linked when already world-readable, else copied 0644/0755. */
function replicate(src: string, dst: string, count: { linked: number; copied: number }): void {
  const st = fs.lstatSync(src);
  if (st.isDirectory()) {
    fs.mkdirSync(dst, { recursive: true });
    fs.chmodSync(dst, 0o755);
    for (const name of fs.readdirSync(src)) replicate(path.join(src, name), path.join(dst, name), count);
  } else if (st.isSymbolicLink()) {
    fs.symlinkSync(fs.readlinkSync(src), dst);
  } else if (st.isFile()) {
    if ((st.mode & 0o004) !== 0) {
      try {
        fs.linkSync(src, dst);
        count.linked++;
        return;
      } catch {
        // another filesystem, or links refused: a copy below
      }
    }
    fs.copyFileSync(src, dst);
    fs.chmodSync(dst, (st.mode & 0o111) !== 0 ? 0o755 : 0o644);
    count.copied++;
  }
}

/** Runs `argv` as the unprivileged user; the reason it failed, or undefined. */
function probe(argv: string[], what: string): string | undefined {
  const r = spawnSync(SETPRIV_ARGV[0]!, [...SETPRIV_ARGV.slice(1), ...argv], { cwd: '/', env: { PATH: process.env.PATH }, encoding: 'utf8', timeout: 20_000 });
  if (r.error) return `${what} as user ${UNPRIVILEGED_UID} could not start: ${r.error.message}`;
  if (r.status === 0) return undefined;
  const why = `${r.stderr}`.trim().split('\n').find((l) => /error|denied|EACCES|cannot|not found/i.test(l)) ?? `${r.stderr}`.trim().split('\n')[0] ?? '';
  return `${what} as user ${UNPRIVILEGED_UID} failed (${r.status ?? r.signal}): ${why.slice(0, 300)}`;
}

/**
 * Makes the copy described above for the checkout at `repoRoot`, with `cli` its built CLI.
 *
 * @returns the copy, or the reason none can be made (no file is left behind then)
 */
export function makeUnprivilegedCopy(repoRoot: string, cli: string): UnprivilegedCopy | { skip: string } {
  if (!fs.existsSync(SETPRIV)) return { skip: `running as root without ${SETPRIV}: the CLI cannot be run as an unprivileged user, and root ignores permission bits` };
  if (!fs.existsSync(cli)) return { skip: `${cli} is missing: run "npm run build" first (npm test does it)` };
  const base = os.tmpdir();
  const closed = closedAncestor(base);
  if (closed) {
    const where = closed === fs.realpathSync(base) ? `the temp directory ${base}` : `${closed} (on the way to the temp directory ${base})`;
    return { skip: `${where} cannot be entered by other users: set TMPDIR to a directory they can enter` };
  }
  const dir = fs.mkdtempSync(path.join(base, 'convo-mirror-unprivileged-'));
  const remove = () => fs.rmSync(dir, { recursive: true, force: true });
  try {
    fs.chmodSync(dir, 0o755);
    const count = { linked: 0, copied: 0 };
    for (const rel of ['package.json', 'dist', ...productionPackages(repoRoot)]) {
      fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
      replicate(path.join(repoRoot, rel), path.join(dir, rel), count);
    }
    // Directories made on the way (node_modules/, node_modules/@scope/) are enterable too.
    for (const rel of productionPackages(repoRoot)) for (let d = path.dirname(rel); d !== '.'; d = path.dirname(d)) fs.chmodSync(path.join(dir, d), 0o755);
    const copiedCli = path.join(dir, path.relative(repoRoot, cli));
    const failed =
      probe([process.execPath, copiedCli, '--version'], `the copied CLI (${copiedCli} --version)`) ??
      probe([process.execPath, '-e', `require(${JSON.stringify(path.join(dir, 'node_modules', 'better-sqlite3'))})(':memory:').close()`], 'loading the copied better-sqlite3');
    if (failed) {
      remove();
      return { skip: failed };
    }
    return { dir, ...count, remove };
  } catch (err) {
    remove();
    return { skip: `the copy under ${base} could not be made: ${(err as Error).message}` };
  }
}
