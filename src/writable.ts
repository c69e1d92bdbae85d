/**
 * Whether convo-mirror can write where it is configured to (the mirror file, the export
 * directory), found without changing anything there: an existing file is opened for writing and
 * closed; a directory gets a probe file created and removed at once; a path that does not exist yet
 * is judged by its nearest existing ancestor (nothing is created). Used by `check`, and by `sync`
 * and the daemon before they start (jobs/daemon.ts), so an unusable path is one line naming the setting, the path
 * and the operating system's reason instead of a library's error later.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { getSystemErrorMap } from 'node:util';
import { ConfigError } from './errors.js';

/** The operating system's reason for an `fs` error code, in words. */
export function osReason(err: unknown): string {
  const code = (err as { code?: unknown } | undefined)?.code;
  switch (code) {
    case 'EACCES':
    case 'EPERM':
      return 'permission denied';
    case 'ENOTDIR':
      return 'not a directory';
    case 'EISDIR':
      return 'is a directory';
    case 'EROFS':
      return 'read-only file system';
    case 'ENOENT':
      return 'no such file or directory';
    case 'ENOSPC':
      return 'no space left on device';
    case 'ELOOP':
      return 'too many symbolic links';
    case 'ENAMETOOLONG':
      return 'file name too long';
    default: {
      // libuv's own words for the rest (e.g. `too many open files`), else the code.
      const errno = (err as { errno?: unknown } | undefined)?.errno;
      const known = typeof errno === 'number' ? getSystemErrorMap().get(errno)?.[1] : undefined;
      return known ?? (typeof code === 'string' ? code : err instanceof Error ? err.message : String(err));
    }
  }
}

/** Creates and removes a probe file in `dir`; undefined when that worked, else the reason. */
function probeDirectory(dir: string): string | undefined {
  const probe = path.join(dir, `.convo-mirror-check-${process.pid}-${crypto.randomBytes(4).toString('hex')}`);
  try {
    fs.closeSync(fs.openSync(probe, 'wx', 0o600));
  } catch (err) {
    return osReason(err);
  }
  try {
    fs.unlinkSync(probe);
  } catch {
    /* created by us a moment ago; if it cannot go, the write itself still worked */
  }
  return undefined;
}

/** Whether `p` is a symbolic link (whatever it points to). */
function isSymlink(p: string): boolean {
  try {
    return fs.lstatSync(p).isSymbolicLink();
  } catch {
    return false;
  }
}

/**
 * The nearest existing ancestor of `p` (itself when it exists), with its stat; or why the walk
 * stopped: an error other than a missing component, or a symbolic link whose target is missing
 * (SQLite and mkdir would fail on it later).
 */
function nearestExisting(p: string): { at: string; stat: fs.Stats } | { at: string; why: string } {
  let at = path.resolve(p);
  for (;;) {
    try {
      return { at, stat: fs.statSync(at) };
    } catch (err) {
      const parent = path.dirname(at);
      // ENOTDIR: a component is a file; the walk up finds it and reports "not a directory".
      const code = (err as { code?: string }).code;
      if (code === 'ENOENT' && isSymlink(at)) return { at, why: `${at} is a symbolic link to a missing target` };
      if ((code !== 'ENOENT' && code !== 'ENOTDIR') || parent === at) return { at, why: `${osReason(err)}: ${at}` };
      at = parent;
    }
  }
}

/**
 * Why `target` cannot be written, or undefined when it can: `kind` `file` (the mirror: an existing
 * regular file opened for writing, or a new one creatable in its directory) or `dir` (the export
 * directory: an existing directory a file can be created in, or a new one creatable).
 *
 * @returns e.g. `permission denied`, `/etc/passwd is not a directory`, `read-only file system`,
 *   `nothing can be created in /proc (no such file or directory)`
 */
export function whyNotWritable(target: string, kind: 'file' | 'dir'): string | undefined {
  const found = nearestExisting(target);
  if ('why' in found) return found.why;
  const exists = found.at === path.resolve(target);
  if (exists && kind === 'file') {
    if (found.stat.isDirectory()) return 'is a directory';
    if (!found.stat.isFile()) return 'not a regular file';
    try {
      fs.closeSync(fs.openSync(target, 'r+'));
      return probeDirectory(path.dirname(path.resolve(target)));
    } catch (err) {
      return osReason(err);
    }
  }
  if (!found.stat.isDirectory()) return `${found.at} is not a directory`;
  const why = probeDirectory(found.at);
  return why === undefined ? undefined : exists ? why : `nothing can be created in ${found.at} (${why})`;
}

/**
 * Throws when `target` cannot be written ({@link whyNotWritable}).
 *
 * @param variable - the setting that names the path, e.g. `CONVO_MIRROR_DB`
 * @throws {@link ConfigError} `<variable>: cannot write <path>: <reason>`
 */
export function assertWritable(variable: string, target: string, kind: 'file' | 'dir'): void {
  const why = whyNotWritable(target, kind);
  if (why !== undefined) throw new ConfigError(variable, `cannot write ${target}: ${why}`);
}
