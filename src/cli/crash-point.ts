/**
 * Crash points, for tests that kill a real process in the middle of an erasure (issue 26: "SIGKILL
 * at each step of an erasure (failpoints), then a restart"): with `CONVO_MIRROR_CRASH_AT` set to
 * the name of an erasure failpoint (`erasure-after-file`, `erasure-before-record`,
 * `erasure-before-mirror`, `erasure-after-record`, `erasure-after-delete`: see `ExportFailpoint`
 * in src/export/publish-fs.ts), the command kills its own process with SIGKILL when it gets there,
 * as a power cut or the kernel's OOM killer would: no handler, no cleanup, no flush. Never set in
 * production; unset, nothing changes.
 */
import type { ExportFailpoint } from '../export/publish-fs.js';

/** The environment variable that names the crash point. */
export const CRASH_AT_ENV = 'CONVO_MIRROR_CRASH_AT';

/**
 * The failpoint hook that SIGKILLs this process at the failpoint `env.CONVO_MIRROR_CRASH_AT` names,
 * or undefined when it is unset or empty (the production case).
 *
 * @param env - where to read it @defaultValue process.env
 */
export function crashPointFromEnv(env: NodeJS.ProcessEnv = process.env): ((point: ExportFailpoint) => void) | undefined {
  const at = env[CRASH_AT_ENV];
  if (at === undefined || at === '') return undefined;
  return (point) => {
    if (point === at) process.kill(process.pid, 'SIGKILL');
  };
}
