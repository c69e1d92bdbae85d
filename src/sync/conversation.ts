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
import { AuthError, DriftError, HttpError, ListedButNotFoundError, NotFoundError, PageRunawayError } from '../errors.js';
import type { SyncDeps, SyncOptions } from './types.js';
import { signalOf } from '../store/mirror.js';
import { PER_PAGE, newTally, type RequestTally } from '../api/client.js';

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

/** Signals that the pages shifted under the crawl; caught here, never escapes. */
class Drift extends Error {
  constructor(
    message: string,
    /** The incremental boundary check failed: pages before the one we started at changed. */
    readonly earlierPagesChanged = false,
  ) {
    super(message);
  }
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
  const { api, mirror } = deps;
  const log = deps.logger.child({ conversation_id: conversationId });
  const { accountId, runId } = opts;
  const maxRestarts = opts.maxRestarts ?? 5;
  const progress = opts.progress;
  const result: ConversationResult = {
    id: conversationId,
    status: 'synced',
    pages: 0,
    messageCount: 0,
    inserted: 0,
    updated: 0,
    deleted: 0,
    restarts: 0,
    resumed: false,
    tally: opts.tally ?? newTally(),
    crawl: 'full',
  };
  let incremental = opts.incremental === true;
  // What the last complete crawl left (read once: only this crawl writes this conversation now).
  const state = incremental ? mirror.crawlState(accountId, conversationId) : undefined;

  // Change signal: skip a conversation whose signal has not moved since its last complete crawl.
  if (state && opts.changeField && !mirror.loadCheckpoint(accountId, conversationId)) {
    const signal = signalOf(state.raw, opts.changeField);
    if (state.messageCount !== null && signal !== null && signal === state.crawledSignal) {
      result.crawl = 'skipped';
      result.messageCount = state.messageCount;
      log.debug({ field: opts.changeField, signal }, 'change signal unmoved: skipped');
      return result;
    }
  }

  for (;;) {
    let checkpoint = mirror.loadCheckpoint(accountId, conversationId);
    if (checkpoint && result.restarts === 0) {
      const age = deps.clock.now() - checkpoint.updatedAt;
      const maxAge = opts.checkpointMaxAgeMs ?? 86_400_000;
      const sameRun = checkpoint.runId !== null && checkpoint.runId === runId;
      if (opts.resume === false || (opts.resume === 'same-run' && !sameRun) || !(age <= maxAge)) {
        log.info({ page: checkpoint.nextPage, age_ms: age, full: opts.resume === false }, 'discarding checkpoint: crawling from page 1');
        mirror.resetCrawl(accountId, conversationId);
        checkpoint = undefined;
      }
    }
    if (checkpoint && result.restarts === 0) {
      result.resumed = true;
      log.info({ page: checkpoint.nextPage }, 'resuming crawl from checkpoint');
    }
    const seen = checkpoint?.seenIds ?? new Set<string>();
    let lastTotal = checkpoint?.totalCount;
    // Resuming: re-read the last committed page first; if its ids changed, earlier pages shifted
    // while we were away and the crawl starts over.
    const verifyPage = checkpoint && checkpoint.nextPage > 1 ? checkpoint.nextPage - 1 : undefined;
    // Incremental: start at the page holding the last known message (position n-1); its first
    // message must be the one the mirror has at that position (the boundary check).
    let boundary: { page: number; firstId: string; known: number } | undefined;
    if (!checkpoint && incremental && state) {
      const known = state.messageCount;
      if (known !== null && known > 0) {
        const page = Math.floor((known - 1) / PER_PAGE) + 1;
        const firstId = mirror.messageIdAt(accountId, conversationId, (page - 1) * PER_PAGE);
        if (firstId !== undefined) {
          for (const id of mirror.seedIncrementalCrawl(accountId, conversationId, (page - 1) * PER_PAGE)) seen.add(id);
          boundary = { page, firstId, known };
          result.crawl = 'incremental';
        }
      }
    }
    try {
      for await (const page of api.messages(conversationId, verifyPage ?? checkpoint?.nextPage ?? boundary?.page ?? 1, result.tally)) {
        result.pages++;
        const total = page.meta.total_count;
        if (boundary && page.page === boundary.page) {
          if (total < boundary.known) throw new Drift(`meta.total_count ${total} is below the ${boundary.known} messages mirrored`, true);
          if (page.data[0]?.id !== boundary.firstId) {
            throw new Drift(`boundary check failed at page ${page.page}: the first message is ${page.data[0]?.id ?? 'missing'}, the mirror has ${boundary.firstId}`, true);
          }
        }
        if (lastTotal !== undefined && total < lastTotal) {
          throw new Drift(`meta.total_count shrank from ${lastTotal} to ${total} at page ${page.page}`);
        }
        const pageIds = new Set<string>();
        if (page.page === verifyPage) {
          const now = page.data.map((m) => m.id).join('\n');
          if (now !== checkpoint!.lastPageIds.join('\n')) throw new Drift(`page ${page.page} changed since the checkpoint`);
          for (const id of checkpoint!.lastPageIds) seen.delete(id); // re-committed below, idempotently
        }
        for (const m of page.data) {
          if (seen.has(m.id) || pageIds.has(m.id)) throw new Drift(`message ${m.id} served twice (pages shifted) at page ${page.page}`);
          pageIds.add(m.id);
        }
        const counts = mirror.commitMessagesPage(accountId, conversationId, page, runId);
        for (const id of pageIds) seen.add(id);
        lastTotal = total;
        result.inserted += counts.inserted;
        result.updated += counts.updated;
        if (progress) {
          progress.messagesServed += page.data.length;
          progress.messagesInserted += counts.inserted;
          progress.messagesUpdated += counts.updated;
        }
        log.debug({ page: page.page, served: page.data.length, total_count: total, ...counts }, 'page committed');
      }
      if (lastTotal !== undefined && seen.size !== lastTotal) {
        throw new Drift(`crawl ended with ${seen.size} distinct messages but meta.total_count is ${lastTotal}`);
      }
      const done = mirror.completeCrawl(accountId, conversationId, runId, opts.changeField);
      result.deleted += done.deleted;
      result.messageCount = done.messageCount;
      if (progress) progress.messagesDeleted += done.deleted;
      return result;
    } catch (err) {
      if (err instanceof Drift && err.earlierPagesChanged) {
        // Earlier pages changed (a deletion or an edit of history): crawl the whole conversation.
        incremental = false;
        result.crawl = 'full';
        result.restarts++;
        mirror.resetCrawl(accountId, conversationId);
        log.info({ reason: err.message }, 'incremental crawl not possible: falling back to a full crawl');
        continue;
      }
      if (err instanceof Drift) {
        result.restarts++;
        mirror.resetCrawl(accountId, conversationId);
        if (result.restarts > maxRestarts) {
          throw new DriftError(`conversation ${conversationId}: pages kept shifting (${err.message}); gave up after ${maxRestarts} restarts`, {
            conversation_id: conversationId,
            restarts: maxRestarts,
          });
        }
        log.warn({ reason: err.message, restart: result.restarts }, 'pages shifted during the crawl, restarting from page 1');
        continue;
      }
      if (err instanceof HttpError && err.status === 404 && !(err instanceof AuthError)) {
        if (!mirror.hasConversation(accountId, conversationId)) {
          // Never mirrored (e.g. a mistyped --conversation id): nothing to tombstone; say so.
          throw new NotFoundError(`conversation ${conversationId} not found: ${err.message}; nothing was mirrored`, {
            conversation_id: conversationId,
            path: err.path,
          });
        }
        if (opts.unlisted !== true) {
          throw new ListedButNotFoundError(
            conversationId,
            err.path,
            opts.named ? 'it is in the mirror (only a workspace sync whose complete listing no longer shows it tombstones it)' : 'the conversation list shows it',
          );
        }
        const gone = mirror.tombstoneConversation(accountId, conversationId, runId);
        result.status = 'deleted';
        result.deleted += gone.messages;
        if (progress) progress.messagesDeleted += gone.messages;
        log.info({ messages_tombstoned: gone.messages }, 'conversation gone from the complete listing and answering 404: tombstoned');
        return result;
      }
      if (err instanceof PageRunawayError) {
        // Keep what was committed (nothing is removed on a failure), but not the checkpoint: a
        // resumed crawl would take its page bound from where this one stopped, and a conversation
        // that never ends would grow by a tenth every run.
        mirror.resetCrawl(accountId, conversationId);
      }
      throw err;
    }
  }
}
