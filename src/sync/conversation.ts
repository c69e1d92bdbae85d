/**
 * syncConversation: crawl every message page of one conversation into the mirror (spec 4.1).
 *
 * - Pages `per_page=100` from page 1 (or from the committed checkpoint) to the end; each page commits
 *   in one transaction with its change-log rows and the checkpoint. A resumed crawl first re-reads
 *   its last committed page and restarts from page 1 if that page's ids changed.
 * - Drift checks: if `meta.total_count` shrinks mid-crawl (a deletion shifted the pages), or an id is
 *   served twice, or the crawl ends with fewer distinct ids than `total_count`, the crawl restarts from
 *   page 1 (bounded: `maxRestarts`). If `total_count` grows, paging simply continues.
 * - After a complete crawl, messages no longer served are tombstoned (`deleted_at`), never deleted.
 * - A 404 is evidence, not proof, of a deletion. It tombstones the conversation and its messages
 *   only when a complete listing of this run no longer shows the conversation (`unlisted`); then it
 *   is a result, not a failure. Otherwise (the listing still shows it, or it was named) it is a
 *   {@link ListedButNotFoundError}: the conversation failed, nothing of it is tombstoned, and the
 *   next run asks again. A 404 for a conversation never mirrored is a {@link NotFoundError}.
 * - Checkpoints resume only when `resume` is not false and they are younger than `checkpointMaxAgeMs`.
 * - Any other failure leaves everything mirrored as it was (and the checkpoint, to resume from).
 */
import type { Logger } from 'pino';
import { DriftError, ListedButNotFoundError, NotFoundError, PageRunawayError } from '../errors.js';
import type { SyncDeps, SyncOptions } from './types.js';
import { newTally, type RequestTally } from '../api/client.js';
import { checkComplete, checkPage, planCrawl, type CrawlFacts, type CrawlPlan, type CrawlPolicy, type CrawlStart, type PageVerdict } from './crawl-plan.js';
import type { Mirror } from '../store/mirror.js';

/** Outcome of one conversation. */
export interface ConversationResult {
  id: string;
  /** `synced`: complete crawl; `deleted`: the API answered 404 and the conversation was tombstoned. */
  status: 'synced' | 'deleted';
  /** Pages fetched (all crawls, restarts included). */
  pages: number;
  /** Messages served at the completed crawl. */
  messageCount: number;
  inserted: number;
  updated: number;
  deleted: number;
  /** Crawl restarts caused by drift. */
  restarts: number;
  /** True when the crawl continued from a checkpoint committed by an earlier run. */
  resumed: boolean;
  /** Requests this conversation cost (retries included), retries, 429 answers, and messages served. */
  tally: RequestTally;
  /** How the conversation was synced: every page, from its last known page, or skipped (change signal unmoved). */
  crawl: 'full' | 'incremental' | 'skipped';
}

/** One crawl of one conversation: what every step shares. */
interface Crawl {
  deps: SyncDeps;
  id: string;
  opts: SyncOptions;
  log: Logger;
  result: ConversationResult;
}

/**
 * Mirrors one conversation's complete message history.
 *
 * @param deps - api, mirror, logger, clock
 * @param conversationId - the conversation UUID (spec 2.4)
 * @returns the outcome; `status: 'deleted'` when the API answered 404 for a conversation a complete
 *   listing no longer shows (`opts.unlisted`)
 * @throws {@link AuthError} (401/403: the whole run must stop), {@link HttpError} after retries,
 *   {@link ListedButNotFoundError} for a 404 that a listing contradicts, {@link NotFoundError} for a
 *   404 of a conversation never mirrored,
 *   {@link SchemaError} for a page that is not JSON or breaks the documented shape,
 *   {@link DriftError} when the pages kept shifting beyond `maxRestarts`
 */
export async function syncConversation(deps: SyncDeps, conversationId: string, opts: SyncOptions): Promise<ConversationResult> {
  if (deps.crawlLock) {
    const { crawlLock, ...alone } = deps;
    return crawlLock(`${opts.accountId}/${conversationId}`, () => syncConversation(alone, conversationId, opts));
  }
  // No other writer (another process on a shared mirror) crawls this conversation meanwhile.
  return deps.mirror.withConversationLock(opts.accountId, conversationId, () => crawlConversation(deps, conversationId, opts));
}

/** {@link syncConversation}, once it holds the conversation's locks. */
async function crawlConversation(deps: SyncDeps, conversationId: string, opts: SyncOptions): Promise<ConversationResult> {
  const { mirror } = deps;
  const { accountId } = opts;
  const c: Crawl = { deps, id: conversationId, opts, log: deps.logger.child({ conversation_id: conversationId }), result: newResult(conversationId, opts) };
  const { result, log } = c;
  const maxRestarts = opts.maxRestarts ?? 5;
  let incremental = opts.incremental === true;
  // What the last complete crawl left (read once: only this crawl writes this conversation now).
  const state = incremental ? await mirror.crawlState(accountId, conversationId) : undefined;
  for (;;) {
    const checkpoint = await mirror.loadCheckpoint(accountId, conversationId);
    const plan = await planWithMirror(mirror, accountId, conversationId, { checkpoint, state }, {
      incremental,
      changeField: opts.changeField,
      resume: opts.resume,
      runId: opts.runId,
      checkpointMaxAgeMs: opts.checkpointMaxAgeMs,
      now: deps.clock.now(),
      first: result.restarts === 0,
    });
    if (plan.kind === 'skip') {
      result.crawl = 'skipped';
      result.messageCount = plan.messageCount;
      log.debug({ field: opts.changeField, signal: plan.signal }, 'change signal unmoved: skipped');
      return result;
    }
    let verdict: PageVerdict;
    try {
      verdict = await crawlPages(c, plan);
      if (verdict.ok) return await completeCrawl(c);
    } catch (err) {
      return await onCrawlFailure(c, err);
    }
    result.restarts++;
    await mirror.resetCrawl(accountId, conversationId);
    if (verdict.earlierPagesChanged) {
      // Earlier pages changed (a deletion or an edit of history): crawl the whole conversation.
      incremental = false;
      result.crawl = 'full';
      log.info({ reason: verdict.reason }, 'incremental crawl not possible: falling back to a full crawl');
      continue;
    }
    if (result.restarts > maxRestarts) {
      throw new DriftError(`conversation ${conversationId}: pages kept shifting (${verdict.reason}); gave up after ${maxRestarts} restarts`, {
        conversation_id: conversationId,
        restarts: maxRestarts,
      });
    }
    log.warn({ reason: verdict.reason, restart: result.restarts }, 'pages shifted during the crawl, restarting from page 1');
  }
}

/**
 * {@link planCrawl} (pure, synchronous) with the mirror's facts: it asks for at most one message id
 * (the incremental boundary's), which is read here only when the plan asks for it, then planned
 * again with it.
 */
async function planWithMirror(mirror: Mirror, accountId: string, conversationId: string, facts: Omit<CrawlFacts, 'messageIdAt'>, policy: CrawlPolicy): Promise<CrawlPlan> {
  const known = new Map<number, string | undefined>();
  for (;;) {
    let wanted: number | undefined;
    const plan = planCrawl(
      {
        ...facts,
        messageIdAt: (position) => {
          if (known.has(position)) return known.get(position);
          wanted ??= position;
          return undefined;
        },
      },
      policy,
    );
    if (wanted === undefined) return plan;
    known.set(wanted, await mirror.messageIdAt(accountId, conversationId, wanted));
  }
}

/** A zeroed result of a full crawl of `id`. */
function newResult(id: string, opts: SyncOptions): ConversationResult {
  return { id, status: 'synced', pages: 0, messageCount: 0, inserted: 0, updated: 0, deleted: 0, restarts: 0, resumed: false, tally: opts.tally ?? newTally(), crawl: 'full' };
}

/**
 * Carries out the start of `plan` (discard or resume a checkpoint, seed an incremental crawl), then
 * fetches and commits pages from `plan.startPage` to the last, each checked by {@link checkPage}
 * before it is written.
 *
 * @returns `{ ok: true }` when every page was served and the crawl is complete
 *   ({@link checkComplete}); else the drift that stopped it (nothing of the drifting page written)
 */
async function crawlPages(c: Crawl, plan: CrawlStart): Promise<PageVerdict> {
  const { deps, id, opts, log, result } = c;
  const { mirror } = deps;
  const { accountId, runId, progress } = opts;
  if (plan.discard) {
    const { checkpoint, ageMs } = plan.discard;
    log.info({ page: checkpoint.nextPage, age_ms: ageMs, full: opts.resume === false }, 'discarding checkpoint: crawling from page 1');
    await mirror.resetCrawl(accountId, id);
  }
  if (plan.resume && result.restarts === 0) {
    result.resumed = true;
    log.info({ page: plan.resume.nextPage }, 'resuming crawl from checkpoint');
  }
  const seen = new Set<string>(plan.resume?.seenIds);
  if (plan.boundary) {
    for (const m of await mirror.seedIncrementalCrawl(accountId, id, plan.boundary.position)) seen.add(m);
    result.crawl = 'incremental';
  }
  let lastTotal = plan.lastTotal;
  for await (const page of deps.api.messages(id, plan.startPage, result.tally)) {
    result.pages++;
    const ids = page.data.map((m) => m.id);
    const verdict = checkPage({ page: page.page, ids, totalCount: page.meta.total_count }, { plan, lastTotal, seen });
    if (!verdict.ok) return verdict;
    const counts = await mirror.commitMessagesPage(accountId, id, page, runId);
    await deps.afterCommit?.();
    for (const m of ids) seen.add(m);
    lastTotal = page.meta.total_count;
    result.inserted += counts.inserted;
    result.updated += counts.updated;
    if (progress) {
      progress.messagesServed += page.data.length;
      progress.messagesInserted += counts.inserted;
      progress.messagesUpdated += counts.updated;
    }
    log.debug({ page: page.page, served: page.data.length, total_count: lastTotal, ...counts }, 'page committed');
  }
  return checkComplete(seen.size, lastTotal);
}

/** Completes a crawl that saw every message: tombstones what no page served, records the count. */
async function completeCrawl(c: Crawl): Promise<ConversationResult> {
  const { opts, result } = c;
  const done = await c.deps.mirror.completeCrawl(opts.accountId, c.id, opts.runId, opts.changeField);
  await c.deps.afterCommit?.();
  result.deleted += done.deleted;
  result.messageCount = done.messageCount;
  if (opts.progress) opts.progress.messagesDeleted += done.deleted;
  return result;
}

/**
 * A crawl failed. A 404 ({@link NotFoundError}) tombstones the conversation when a complete listing
 * no longer shows it (`unlisted`), else becomes the error that says why not; a
 * {@link PageRunawayError} drops the checkpoint. Everything else is re-thrown as it is.
 *
 * @returns the `deleted` result of a tombstoned conversation
 * @throws `err`, or the {@link NotFoundError} / {@link ListedButNotFoundError} it means
 */
async function onCrawlFailure(c: Crawl, err: unknown): Promise<ConversationResult> {
  const { deps, id, opts, result } = c;
  const { mirror } = deps;
  if (err instanceof NotFoundError) {
    if (!(await mirror.hasConversation(opts.accountId, id))) {
      // Never mirrored (e.g. a mistyped --conversation id): nothing to tombstone; say so.
      throw new NotFoundError(`conversation ${id} not found: ${err.message}; nothing was mirrored`, err, { context: { conversation_id: id }, cause: err });
    }
    if (opts.unlisted !== true) {
      const why = opts.named ? 'it is in the mirror (only a workspace sync whose complete listing no longer shows it tombstones it)' : 'the conversation list shows it';
      throw new ListedButNotFoundError(id, err, why);
    }
    const gone = await mirror.tombstoneConversation(opts.accountId, id, opts.runId);
    await deps.afterCommit?.();
    result.status = 'deleted';
    result.deleted += gone.messages;
    if (opts.progress) opts.progress.messagesDeleted += gone.messages;
    c.log.info({ messages_tombstoned: gone.messages }, 'conversation gone from the complete listing and answering 404: tombstoned');
    return result;
  }
  if (err instanceof PageRunawayError) {
    // Keep what was committed (nothing is removed on a failure), but not the checkpoint: a
    // resumed crawl would take its page bound from where this one stopped, and a conversation
    // that never ends would grow by a tenth every run.
    await mirror.resetCrawl(opts.accountId, id);
  }
  throw err;
}
