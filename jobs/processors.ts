/**
 * Job processors: unpack a BullMQ job and call src/run's steps (jobs/conversation-job.ts,
 * jobs/workspace-job.ts, jobs/erase-job.ts); map errors to BullMQ's retry semantics (design habit 2). The error
 * decides: one that is not `retryable` (authentication, configuration, a conversation never
 * mirrored, a response over the byte cap, a page breaking the documented shape, an unusable
 * mirror...) becomes `UnrecoverableError` and is never retried; everything else is retried with
 * backoff, and a retried conversation job resumes from its last committed page.
 *
 * A run outlives the daemon that started it: after a crash, the restarted daemon marks it
 * interrupted, and the first job of it that runs again reopens it. The remaining conversation jobs
 * finish inside that same run, and its `finish` step publishes their changes in one batch.
 */
import { DelayedError, UnrecoverableError, WaitingChildrenError, type Job } from 'bullmq';
import { ConvoMirrorError, RunError, describeError } from '../src/errors.js';
import { failureMessage } from '../src/run/index.js';
import { isFatal } from '../src/sync/workspace.js';
import { processConversationJob } from './conversation-job.js';
import { processWorkspaceJob } from './workspace-job.js';
import type { JobDeps } from './deps.js';
import { processEraseJob } from './erase-job.js';
import { ERASE_JOB, WORKSPACE_JOB, type ConversationJobData, type EraseJobData, type WorkspaceJobData } from './queue.js';

export { KeyedMutex, type JobDeps } from './deps.js';
export { processConversationJob } from './conversation-job.js';
export { childJobId, processWorkspaceJob } from './workspace-job.js';

/**
 * The error decides retry: one that is not `retryable` must not be retried by BullMQ
 * (`UnrecoverableError`). A fatal one (an unusable mirror, say) is also reported to `onFatal`, so
 * the daemon can stop. The message keeps the code (`[CODE] message`) for `status` and for runs of
 * older versions; the failure record itself travels in the job's data.
 */
export function toJobError(err: unknown, d: Pick<JobDeps, 'onFatal'>): Error {
  const cause = err instanceof RunError ? err.cause : err;
  if (isFatal(cause)) d.onFatal?.(cause);
  if (cause instanceof ConvoMirrorError) {
    const message = failureMessage(cause.code, describeError(cause));
    return cause.retryable ? new Error(message, { cause }) : new UnrecoverableError(message);
  }
  return err instanceof Error ? err : new Error(describeError(err));
}

/**
 * The worker's processor: runs a job of either kind; any error that escapes (including one from
 * recording the run itself, e.g. an unusable mirror) goes through {@link toJobError}, so the error
 * decides retry and a fatal one stops the daemon. BullMQ's control-flow errors pass untouched.
 */
export async function processJob(d: JobDeps, job: Job, token?: string): Promise<unknown> {
  try {
    if (job.name === ERASE_JOB) return await processEraseJob(d, job as Job<EraseJobData>);
    return job.name === WORKSPACE_JOB
      ? await processWorkspaceJob(d, job as Job<WorkspaceJobData>, token)
      : await processConversationJob(d, job as Job<ConversationJobData>, token);
  } catch (err) {
    if (err instanceof DelayedError || err instanceof WaitingChildrenError || err instanceof UnrecoverableError) throw err;
    throw toJobError(err, d);
  }
}
