/**
 * The decisions of a conversation crawl, as pure functions of what the mirror says and what the API
 * served (design habit 8): {@link planCrawl} (skip, or where to start and what to verify),
 * {@link checkPage} (does one served page drift) and {@link checkComplete} (did the crawl see every
 * message). `syncConversation` (conversation.ts) only orchestrates: it reads the mirror, asks these,
 * fetches and commits.
 */
import { PER_PAGE } from '../api/schemas.js';
import { signalOf, type Checkpoint } from '../store/mirror.js';

/** What the last complete crawl of a conversation left in the mirror (`Mirror.crawlState`). */
export interface CrawlState {
  /** Messages served at the last complete crawl; null when none completed. */
  messageCount: number | null;
  /** The change signal recorded at the last complete crawl; null when none. */
  crawledSignal: string | null;
  /** The conversation object as last listed (JSON), where the change signal is read from. */
  raw: string | null;
}

/** What the mirror says about one conversation, as {@link planCrawl} needs it. */
export interface CrawlFacts {
  /** The committed checkpoint of an unfinished crawl, if any (`Mirror.loadCheckpoint`). */
  checkpoint: Checkpoint | undefined;
  /** What the last complete crawl left; undefined when not read (a full refresh). */
  state: CrawlState | undefined;
  /** The id of the live message the mirror holds at `position` (0-based; `Mirror.messageIdAt`). */
  messageIdAt(position: number): string | undefined;
}

/** The options and moment {@link planCrawl} decides with. */
export interface CrawlPolicy {
  /** Incremental crawl allowed (false for a full refresh, or after a failed boundary check). */
  incremental: boolean;
  /** Change-signal field (e.g. `last_activity_at`); undefined: never skip. */
  changeField: string | undefined;
  /** `SyncOptions.resume`: true (any recent checkpoint), `'same-run'`, or false. @defaultValue true */
  resume: boolean | 'same-run' | undefined;
  /** The run crawling now (checkpoints record theirs); null outside a recorded run. */
  runId: number | null;
  /** Checkpoints older than this are discarded, ms. @defaultValue 86400000 (24 h) */
  checkpointMaxAgeMs?: number | undefined;
  /** Current time, epoch ms. */
  now: number;
  /** True for the crawl's first attempt; false after a restart (no skip, no resume). */
  first: boolean;
}

/** The conversation's change signal has not moved since its last complete crawl: no request. */
export interface SkipPlan {
  kind: 'skip';
  /** The unmoved signal value. */
  signal: string;
  /** Messages of the last complete crawl (the result's `messageCount`). */
  messageCount: number;
}

/** Why a checkpoint is not resumed. */
export type DiscardReason = 'resume-off' | 'other-run' | 'too-old';

/** A crawl to make. */
export interface CrawlStart {
  kind: 'crawl';
  /** `full`: from page 1 or a checkpoint; `incremental`: from the page holding the last known message. */
  crawl: 'full' | 'incremental';
  /** First page to request. */
  startPage: number;
  /**
   * The checkpoint found but not resumed: the crawl state must be reset (`Mirror.resetCrawl`)
   * before crawling from page 1. `ageMs` is its age when discarded.
   */
  discard?: { checkpoint: Checkpoint; why: DiscardReason; ageMs: number };
  /** The checkpoint resumed (its seen ids, total and pages carry over). */
  resume?: Checkpoint;
  /**
   * Resuming past page 1: `page` (the last committed one) is re-read first and must serve exactly
   * `ids`, in order; otherwise earlier pages shifted while we were away.
   */
  verify?: { page: number; ids: readonly string[] };
  /**
   * Incremental: `page` holds the last known message; its first message must be `firstId`, the one
   * the mirror holds at `position`, and `meta.total_count` must not be below `known`. The messages
   * before `position` are taken as seen (`Mirror.seedIncrementalCrawl(position)`).
   */
  boundary?: { page: number; position: number; firstId: string; known: number };
  /** `meta.total_count` the crawl starts from (the resumed checkpoint's), for the shrink check. */
  lastTotal?: number;
}

/** Outcome of {@link planCrawl}. */
export type CrawlPlan = SkipPlan | CrawlStart;

/**
 * Decides how to crawl one conversation, without I/O:
 *
 * 1. **Skip** (first attempt only): incremental, a change field set, no checkpoint, a completed
 *    crawl on record, and the conversation's signal (read from `state.raw`) equal to the one recorded
 *    at that crawl.
 * 2. **Discard** (first attempt only) a checkpoint when `resume` is false, when `resume` is
 *    `'same-run'` and another run committed it, or when it is older than `checkpointMaxAgeMs`
 *    (its age `now - updatedAt`; a NaN age counts as too old).
 * 3. **Resume** a kept checkpoint at `nextPage`, re-reading (verifying) `nextPage - 1` first when
 *    that is a page.
 * 4. **Incremental** (no checkpoint or a discarded one, `incremental`, `state` read, a completed
 *    crawl of n > 0 messages whose
 *    message at the boundary position is still live): start at page `floor((n-1)/100)+1`, checking
 *    its first message.
 * 5. Otherwise a full crawl from page 1.
 */
export function planCrawl(facts: CrawlFacts, policy: CrawlPolicy): CrawlPlan {
  const { state } = facts;
  if (policy.first && state && policy.changeField && !facts.checkpoint) {
    const signal = signalOf(state.raw, policy.changeField);
    if (state.messageCount !== null && signal !== null && signal === state.crawledSignal) {
      return { kind: 'skip', signal, messageCount: state.messageCount };
    }
  }
  const plan: CrawlStart = { kind: 'crawl', crawl: 'full', startPage: 1 };
  const checkpoint = facts.checkpoint;
  const why = checkpoint && policy.first ? discardReason(checkpoint, policy) : undefined;
  if (checkpoint && why) plan.discard = { checkpoint, why, ageMs: policy.now - checkpoint.updatedAt };
  else if (checkpoint) {
    plan.resume = checkpoint;
    plan.lastTotal = checkpoint.totalCount;
    plan.startPage = checkpoint.nextPage;
    if (checkpoint.nextPage > 1) {
      plan.verify = { page: checkpoint.nextPage - 1, ids: checkpoint.lastPageIds };
      plan.startPage = checkpoint.nextPage - 1;
    }
    return plan;
  }
  // No checkpoint (or a discarded one; discarding leaves the messages as they are).
  const known = state?.messageCount ?? null;
  if (policy.incremental && known !== null && known > 0) {
    const page = Math.floor((known - 1) / PER_PAGE) + 1;
    const position = (page - 1) * PER_PAGE;
    const firstId = facts.messageIdAt(position);
    if (firstId !== undefined) return { ...plan, crawl: 'incremental', startPage: page, boundary: { page, position, firstId, known } };
  }
  return plan;
}

/** Why `checkpoint` must not be resumed under `policy`, if so. */
function discardReason(checkpoint: Checkpoint, policy: CrawlPolicy): DiscardReason | undefined {
  if (policy.resume === false) return 'resume-off';
  const sameRun = checkpoint.runId !== null && checkpoint.runId === policy.runId;
  if (policy.resume === 'same-run' && !sameRun) return 'other-run';
  const age = policy.now - checkpoint.updatedAt;
  // `!(age <= max)`: a NaN age (a damaged timestamp) is too old as well.
  if (!(age <= (policy.checkpointMaxAgeMs ?? 86_400_000))) return 'too-old';
  return undefined;
}

/** One served page, as {@link checkPage} needs it. */
export interface ServedPage {
  /** The page number asked for (and served as `meta.current_page`). */
  page: number;
  /** The message ids served, in order. */
  ids: readonly string[];
  /** `meta.total_count` of the page. */
  totalCount: number;
}

/** How a page (or the crawl) drifted; each means the pages shifted under the crawl. */
export type DriftKind =
  /** The incremental boundary page says fewer messages than the mirror holds. */
  | 'boundary-total'
  /** The incremental boundary page does not start with the mirror's message. */
  | 'boundary-mismatch'
  /** `meta.total_count` went down since the previous page (a deletion shifted the pages). */
  | 'total-shrank'
  /** The re-read last committed page of a resumed crawl serves other ids than were committed. */
  | 'page-changed'
  /** A message id was served twice (on this page, or on an earlier page of the crawl). */
  | 'duplicate'
  /** The crawl ended with a number of distinct messages other than `meta.total_count`. */
  | 'incomplete';

/** Verdict of {@link checkPage} / {@link checkComplete}. */
export type PageVerdict =
  | { ok: true }
  | {
      ok: false;
      drift: DriftKind;
      /** Human-readable reason, for logs and the final {@link DriftError}. */
      reason: string;
      /**
       * The incremental boundary check failed: pages before the start changed, so the conversation
       * must be crawled in full (not merely restarted).
       */
      earlierPagesChanged: boolean;
    };

/** What {@link checkPage} compares a page with: the crawl's plan and progress so far. */
export interface CrawlProgress {
  /** The plan the crawl follows (its `boundary` and `verify`). */
  plan: Pick<CrawlStart, 'boundary' | 'verify'>;
  /** `meta.total_count` of the previous committed page (or of the resumed checkpoint). */
  lastTotal: number | undefined;
  /** Ids served on the pages committed so far (with a resumed checkpoint's and the seeded ones). */
  seen: ReadonlySet<string>;
}

/**
 * Checks one served page before anything of it is written, in this order: the incremental boundary
 * (its page only: total not below the known count, first message the mirror's), `total_count` not
 * shrinking, the re-read page of a resumed crawl unchanged since its checkpoint, and no id served
 * twice (the re-read page's own ids do not count as seen: it is committed again, idempotently).
 *
 * @returns `{ ok: true }`, or the first drift found
 */
export function checkPage(page: ServedPage, progress: CrawlProgress): PageVerdict {
  const { boundary, verify } = progress.plan;
  const total = page.totalCount;
  if (boundary && page.page === boundary.page) {
    if (total < boundary.known) {
      return drift('boundary-total', `meta.total_count ${total} is below the ${boundary.known} messages mirrored`, true);
    }
    if (page.ids[0] !== boundary.firstId) {
      return drift('boundary-mismatch', `boundary check failed at page ${page.page}: the first message is ${page.ids[0] ?? 'missing'}, the mirror has ${boundary.firstId}`, true);
    }
  }
  if (progress.lastTotal !== undefined && total < progress.lastTotal) {
    return drift('total-shrank', `meta.total_count shrank from ${progress.lastTotal} to ${total} at page ${page.page}`);
  }
  let recommitted: ReadonlySet<string> = new Set();
  if (verify && page.page === verify.page) {
    if (page.ids.join('\n') !== verify.ids.join('\n')) return drift('page-changed', `page ${page.page} changed since the checkpoint`);
    recommitted = new Set(verify.ids);
  }
  const onPage = new Set<string>();
  for (const id of page.ids) {
    if ((progress.seen.has(id) && !recommitted.has(id)) || onPage.has(id)) {
      return drift('duplicate', `message ${id} served twice (pages shifted) at page ${page.page}`);
    }
    onPage.add(id);
  }
  return { ok: true };
}

/**
 * Checks a crawl that reached its last page: it must have seen exactly `meta.total_count` distinct
 * messages (of the last page; undefined when no page was served, which passes).
 */
export function checkComplete(distinctSeen: number, lastTotal: number | undefined): PageVerdict {
  if (lastTotal === undefined || distinctSeen === lastTotal) return { ok: true };
  return drift('incomplete', `crawl ended with ${distinctSeen} distinct messages but meta.total_count is ${lastTotal}`);
}

function drift(kind: DriftKind, reason: string, earlierPagesChanged = false): PageVerdict {
  return { ok: false, drift: kind, reason, earlierPagesChanged };
}
