/**
 * syncWorkspace: list every conversation, upsert it, and crawl each one's messages with a bounded
 * number in flight (design: src/sync/).
 *
 * The order of `GET /v1/conversations` is not documented and may shift while we page (a busy
 * conversation can jump to page 1; one can be deleted while another is added, leaving
 * `total_count` unchanged), so listing repeats until one pass sees no id not seen before and at
 * least `meta.total_count` ids have been seen: at least two passes, at most `maxListPasses`. A
 * listing that never gets there is reported as a failure (the run is `partial`, exit 1).
 * Conversations start crawling as soon as the first pass lists them; each later pass starts when the
 * crawls before it are done. Conversations in the mirror that the
 * confirming pass no longer shows are crawled (again) too: only for them does a 404 mean a deletion.
 *
 * Errors that make every further request or write pointless stop the run at once (no new crawl
 * starts; crawls in flight finish): rejected credentials, a wrong base URL, an unusable mirror, and a
 * conversation list that runs past its own total. What was committed before stays, and is reported.
 */
import { addTally, declaredPages, newTally, type RequestTally } from '../api/client.js';
import type { Conversation, Page } from '../api/schemas.js';
import { AuthError, ConfigError, ConvoMirrorError, DriftError, MirrorUnusableError, PageRunawayError, describeError } from '../errors.js';
import { syncConversation } from './conversation.js';
import { CrawlAccumulator, emptyCrawlTotals, type CrawlTotals } from './crawl-totals.js';
import { OrderTracker, compareSignals, type ListOrder } from './list-order.js';
import { newProgress, type SyncDeps, type SyncOptions, type SyncProgress } from './types.js';

/** A conversation that failed after retries. */
export interface ConversationFailure {
  /** Conversation id, or `(conversation list)` when the listing itself failed. */
  id: string;
  error: Error;
  /** What the failed crawl cost and was served before it failed (absent for the listing's failure). */
  tally?: RequestTally;
}

/** Outcome of {@link syncWorkspace} or {@link syncConversations}. */
export interface WorkspaceResult {
  /** Listing passes made (0 when conversations were named). */
  listPasses: number;
  /** True when the listing met its completeness rule (always true for named conversations). */
  listConfirmed: boolean;
  /** Distinct conversations seen in the listing. */
  conversationsListed: number;
  conversationsInserted: number;
  conversationsUpdated: number;
  /** What the crawls did, summed (no object per conversation: see {@link CrawlTotals}). */
  crawls: CrawlTotals;
  failures: ConversationFailure[];
  /** Requests the listing cost (zero when conversations were named). */
  listingTally?: RequestTally;
  /**
   * Everything this sync asked and was served: the listing and every crawl, finished, failed or
   * stopped. `served` counts records of both (conversations listed, messages crawled).
   */
  tally?: RequestTally;
  /** Messages served to the crawls (finished, failed or stopped) of this sync. */
  messagesServed?: number;
  /**
   * The error that stopped the run early, if any: an {@link AuthError}, a {@link ConfigError}, a
   * {@link MirrorUnusableError}, or a {@link PageRunawayError} of the listing. The rest of the
   * result still says what was done before it.
   */
  fatal?: Error;
}

/** Errors after which nothing more is attempted in a run. */
export type FatalError = AuthError | ConfigError | MirrorUnusableError | PageRunawayError;

/** Whether `err` must stop the whole run (bad credentials or configuration, an unusable mirror). */
export function isFatal(err: unknown): err is FatalError {
  return err instanceof AuthError || err instanceof ConfigError || err instanceof MirrorUnusableError;
}

/** Options of {@link syncWorkspace}. */
export interface WorkspaceOptions extends SyncOptions {
  /** Conversations crawled in parallel. @defaultValue 4 */
  concurrency?: number;
  /** Most listing passes before giving up on confirmation. @defaultValue 5 */
  maxListPasses?: number;
  /**
   * Change signal setting: `auto` (detect a field on the first list page), `none`, or a field
   * name. Used only with `incremental`. @defaultValue `none`
   */
  changeFieldSetting?: string;
  /**
   * Always confirm the listing with a second pass (full refresh). Without it, one pass suffices
   * when it was consistent (same `total_count` on every page, no id twice, at least `total_count`
   * ids): what list drift could hide from it is a new conversation, found by the next sync.
   * @defaultValue true
   */
  confirmListing?: boolean;
}

/** Fields tried, in order, when the change field is `auto`. */
export const CHANGE_FIELD_CANDIDATES = ['updated_at', 'last_activity_at', 'last_message_at', 'messages_count', 'message_count'] as const;

/**
 * Resolves the change field: `none` → undefined; a name → that name; `auto` → the first candidate
 * present (not null) in every object of the first list page, else undefined.
 */
export function resolveChangeField(setting: string | undefined, firstPage: Record<string, unknown>[]): string | undefined {
  if (!setting || setting === 'none') return undefined;
  if (setting !== 'auto') return setting;
  if (firstPage.length === 0) return undefined;
  return CHANGE_FIELD_CANDIDATES.find((f) => firstPage.every((o) => o[f] !== undefined && o[f] !== null));
}

/** Label used for a failure of the conversation listing itself. */
export const LIST_FAILURE_ID = '(conversation list)';

/**
 * Full sync of a workspace: every page of the conversation list and of every conversation.
 *
 * @returns per-conversation results and failures; conversations that fail after retries are
 *   reported, the others go on. `fatal` is set when the run was stopped early: the API rejected the
 *   credentials ({@link AuthError}), the conversation list answered 404 ({@link ConfigError}: wrong
 *   base URL), the mirror became unusable ({@link MirrorUnusableError}), or the listing ran past its
 *   own total ({@link PageRunawayError}).
 * @throws only unexpected programming errors
 */
export async function syncWorkspace(deps: SyncDeps, opts: WorkspaceOptions): Promise<WorkspaceResult> {
  const progress = opts.progress ?? newProgress();
  const crawlOpts: WorkspaceOptions & { progress: SyncProgress } = { ...opts, progress, changeField: undefined };
  const crawl = new Crawler(deps, crawlOpts);
  const out: WorkspaceResult = {
    listPasses: 0,
    listConfirmed: false,
    conversationsListed: 0,
    conversationsInserted: 0,
    conversationsUpdated: 0,
    crawls: emptyCrawlTotals(),
    failures: [],
    listingTally: newTally(),
  };
  try {
    const listing = await listWorkspace(deps, opts, {
      onNewId: (id) => crawl.enqueue(id),
      // Later passes start once the crawls scheduled so far are done, so the conversation objects
      // they store are at least as fresh as the messages just crawled.
      beforeNextPass: () => crawl.idle(),
      stopped: () => crawl.stopped,
      onChangeField: (field) => {
        crawlOpts.changeField = field;
      },
      // Kept when the listing stops the run (rejected credentials, say): its requests count.
      tally: out.listingTally,
    });
    Object.assign(out, {
      listPasses: listing.passes,
      listConfirmed: listing.confirmed,
      conversationsListed: listing.seen.length,
      conversationsInserted: listing.inserted,
      conversationsUpdated: listing.updated,
      listingTally: listing.tally,
    });
    if (listing.failure) crawl.fail(LIST_FAILURE_ID, listing.failure);
    // A list that runs past its own total is not trusted: stop, rather than crawl what it invented.
    if (listing.failure instanceof PageRunawayError) crawl.stop(listing.failure);
    // Re-checks always ask the API (no change-signal skip): the complete listing no longer shows
    // them, so for them alone a 404 means the conversation was deleted.
    if (!crawl.stopped) for (const id of listing.recheck) crawl.enqueue(id, { again: true, noSkip: true, unlisted: true });
    // An early-stopped listing did not reach them, but their last crawl failed: ask again.
    if (!crawl.stopped) for (const id of listing.retry ?? []) crawl.enqueue(id, { noSkip: true });
  } catch (err) {
    if (isFatal(err)) crawl.stop(err);
    else throw err;
  }
  await crawl.idle();
  out.crawls = crawl.totals();
  out.failures = crawl.failures;
  out.messagesServed = crawl.tally.served;
  out.tally = addTally(out.listingTally ?? newTally(), crawl.tally);
  if (crawl.fatal) out.fatal = crawl.fatal;
  return out;
}

/** Hooks {@link listWorkspace} calls while it pages. */
export interface ListHooks {
  /**
   * Counters the listing adds its requests and served conversations to (its result's `tally`):
   * pass one to keep them when the listing throws. @defaultValue a fresh tally
   */
  tally?: RequestTally;
  /** Called once for each conversation id the first time any pass sees it. */
  onNewId?: (id: string) => void;
  /** Awaited before every pass after the first. */
  beforeNextPass?: () => Promise<void>;
  /** Polled between pages; true stops the listing. */
  stopped?: () => boolean;
  /** Called once, before the first id is reported, with the resolved change field (if any). */
  onChangeField?: (field: string | undefined) => void;
}

/** Outcome of {@link listWorkspace}. */
export interface ListingResult {
  passes: number;
  /** The completeness rule was met. */
  confirmed: boolean;
  /** Every id seen, in first-seen order. */
  seen: string[];
  /** Mirrored live conversations the final pass did not show: crawl them again (404 tombstones). Empty unless confirmed. */
  recheck: string[];
  /** Conversation rows inserted / updated (change-log rows written). */
  inserted: number;
  updated: number;
  /** Requests the listing cost. */
  tally: RequestTally;
  /** The change field in use (resolved from `changeFieldSetting`). */
  changeField?: string | undefined;
  /** Why the listing is incomplete (a transient failure or unsettled list), if it is. */
  failure?: Error;
  /**
   * The list is ordered by the change signal (newest first) and this incremental listing stopped
   * once past everything that changed: `confirmed`, but nothing is re-checked (what a stopped
   * listing cannot see, the next complete listing does).
   */
  stoppedEarly?: boolean;
  /**
   * With `stoppedEarly`: mirrored conversations the stopped listing did not reach whose last crawl
   * did not complete (a failure forgot its baseline): crawl them anyway, as the next incremental
   * sync of a failed conversation always does. A 404 does not tombstone them (they were not shown
   * missing by a complete listing).
   */
  retry?: string[];
}

/**
 * Pages `GET /v1/conversations` until the listing is trustworthy and upserts every page (one
 * transaction per page, with change-log rows): passes repeat until one finds no id not seen before
 * and at least `meta.total_count` ids have been seen (two passes at least, `maxListPasses` at most).
 *
 * @throws {@link AuthError} on 401/403; {@link ConfigError} from the client when the list answers
 *   404 (wrong base URL); {@link MirrorUnusableError} when the mirror cannot be written. Other failures (including
 *   a {@link PageRunawayError}: the list ran past its own total) are returned in `failure`, with
 *   what was listed so far; then nothing is confirmed and nothing is re-checked.
 */
export async function listWorkspace(deps: SyncDeps, opts: WorkspaceOptions, hooks: ListHooks = {}): Promise<ListingResult> {
  // No other writer (another process on a shared mirror) lists this workspace meanwhile.
  return deps.mirror.withListingLock(opts.accountId, () => listWorkspaceAlone(deps, opts, hooks));
}

/** {@link listWorkspace}, once it holds the workspace's listing lock. */
async function listWorkspaceAlone(deps: SyncDeps, opts: WorkspaceOptions, hooks: ListHooks): Promise<ListingResult> {
  const log = deps.logger;
  const maxPasses = opts.maxListPasses ?? 5;
  const seen = new Set<string>();
  const out: ListingResult = { passes: 0, confirmed: false, seen: [], recheck: [], inserted: 0, updated: 0, tally: hooks.tally ?? newTally() };
  const stopped = () => hooks.stopped?.() === true || opts.signal?.aborted === true;
  // An incremental listing may stop early when the last complete one found the list ordered.
  const known = opts.confirmListing === false ? await deps.mirror.listOrder(opts.accountId) : undefined;
  let lastPass = new Set<string>();
  try {
    while (out.passes < maxPasses && !stopped()) {
      if (out.passes > 0) await hooks.beforeNextPass?.();
      if (stopped()) break;
      out.passes++;
      const pass = await listPass(deps, opts, hooks, { out, seen, stopped, known: out.passes === 1 ? known : undefined });
      lastPass = pass.ids;
      log.info({ pass: out.passes, listed: pass.ids.size, new_ids: pass.fresh, total_count: pass.lastTotal, consistent: pass.consistent, stopped_early: pass.stoppedEarly }, 'conversation list pass done');
      if (pass.stoppedEarly) {
        out.confirmed = true;
        out.stoppedEarly = true;
        out.retry = (await deps.mirror.unsettledConversationIds(opts.accountId)).filter((id) => !seen.has(id));
        break;
      }
      if ((out.passes === 1 && pass.consistent && opts.confirmListing === false) || (out.passes > 1 && pass.fresh === 0 && seen.size >= pass.lastTotal)) {
        out.confirmed = true;
        await recordOrder(deps, opts, out, pass, known);
        break;
      }
    }
    if (!out.confirmed && !stopped()) {
      log.warn({ passes: out.passes, seen: seen.size }, 'the conversation list kept shifting; listing not confirmed complete');
      out.failure = new DriftError(`the conversation list kept shifting: not confirmed complete after ${out.passes} passes (${seen.size} ids seen)`, {
        passes: out.passes,
      });
    }
    if (out.confirmed && !out.stoppedEarly) {
      // Mirrored conversations the final pass no longer shows: check each again, even if it was
      // crawled already (it may have been deleted since); a 404 tombstones it.
      out.recheck = await deps.mirror.liveConversationIdsNotIn(opts.accountId, lastPass);
    }
  } catch (err) {
    // Credentials, a wrong base URL (the client's ConfigError for a 404 of the list), an unusable mirror.
    if (isFatal(err)) throw err;
    log.error({ err: describeError(err), code: (err as ConvoMirrorError).code }, 'listing conversations failed');
    out.failure = err as Error;
  }
  out.seen = [...seen];
  return out;
}

/**
 * After a complete listing: records in the mirror whether the list was ordered by the change
 * field, newest first, and the newest signal seen (the next incremental listing's threshold);
 * logs when that changes.
 */
async function recordOrder(deps: SyncDeps, opts: WorkspaceOptions, out: ListingResult, pass: PassResult, before: ListOrder | undefined): Promise<void> {
  const field = out.changeField;
  if (!field || !pass.order) return;
  // A time later than when the pass began is not trusted as the threshold (a bogus future date
  // would hide every change below it): the threshold is at most that time.
  const began = new Date(pass.startedMs).toISOString();
  const seenNewest = pass.order.newest ?? null;
  const newest = isTime(seenNewest) && (compareSignals(seenNewest, began) ?? 0) > 0 ? began : seenNewest;
  const order: ListOrder = {
    field,
    ordered: pass.order.ordered,
    newest,
    at: new Date(deps.clock.now()).toISOString(),
    ...(pass.order.why ? { why: pass.order.why } : {}),
  };
  await deps.mirror.recordListOrder(opts.accountId, order);
  if (order.ordered && before?.ordered !== true) {
    deps.logger.info({ field }, 'the conversation list is ordered by its change signal, newest first: incremental listings stop once past what changed');
  } else if (!order.ordered && before?.ordered !== false) {
    deps.logger.info({ field, why: order.why }, 'the conversation list is not ordered by its change signal: incremental listings read every page');
  }
}

/** What one listing pass saw. */
interface PassResult {
  /** Ids this pass listed (held-back pages included unless stopped). */
  ids: Set<string>;
  /** Ids no earlier pass had seen. */
  fresh: number;
  /** `meta.total_count` of the last page stored. */
  lastTotal: number;
  /** Same `total_count` on every page, no id twice, at least `total_count` ids. */
  consistent: boolean;
  /** Stopped once past everything that changed (an ordered list, an incremental listing). */
  stoppedEarly: boolean;
  /** An id came twice in this pass. */
  duplicate: boolean;
  /** When the pass began (the clock's epoch ms). */
  startedMs: number;
  /** What the pass found of the list's order by the change field (when there is one). */
  order?: { ordered: boolean; newest: string | number | undefined; why: string | undefined };
}

/**
 * One pass over `GET /v1/conversations`: stores each page (adding to `out`'s counts and `seen`,
 * reporting new ids), resolves the change field on the first page of the first pass. Pages beyond
 * what page 1 declared are held back until the pass ends within its bound.
 */
async function listPass(
  deps: SyncDeps,
  opts: WorkspaceOptions,
  hooks: ListHooks,
  shared: { out: ListingResult; seen: Set<string>; stopped: () => boolean; known?: ListOrder | undefined },
): Promise<PassResult> {
  const { out, seen, stopped } = shared;
  const pass: PassResult = { ids: new Set(), fresh: 0, lastTotal: 0, consistent: false, stoppedEarly: false, duplicate: false, startedMs: deps.clock.now() };
  let tracker: OrderTracker | undefined;
  const totals = new Set<number>();
  const take = (page: Page<Conversation>): Promise<void> => storePage(deps, opts, hooks, { out, seen, pass, totals }, page);
  // Pages beyond what the first page declared are the list growing while we page, or a list
  // that never ends: they are held back until the pass ends within its bound, so a runaway
  // list stores and crawls nothing it invented past its own total.
  let declared = Infinity;
  const held: Page<Conversation>[] = [];
  for await (const page of deps.api.conversations(1, out.tally)) {
    if (out.passes === 1 && page.page === 1) resolveFirstPage(deps, opts, hooks, out, page);
    if (page.page === 1) {
      declared = Math.max(1, declaredPages(page.meta));
      tracker = orderTracker(out, shared.known);
    }
    if (page.page > declared) held.push(page);
    else await take(page);
    if (tracker && (await observeOrder(deps, opts, tracker, page, shared.known))) {
      pass.stoppedEarly = true;
      break;
    }
    if (stopped()) break;
  }
  if (!stopped() && !pass.stoppedEarly) for (const page of held) await take(page);
  pass.consistent = totals.size <= 1 && !pass.duplicate && pass.ids.size >= pass.lastTotal;
  if (tracker) pass.order = { ordered: tracker.ordered, newest: tracker.newest, why: tracker.why };
  return pass;
}

/** Stores one page of a pass (one transaction) and reports its ids: new ones to `onNewId`. */
async function storePage(
  deps: SyncDeps,
  opts: WorkspaceOptions,
  hooks: ListHooks,
  at: { out: ListingResult; seen: Set<string>; pass: PassResult; totals: Set<number> },
  page: Page<Conversation>,
): Promise<void> {
  const { out, seen, pass, totals } = at;
  const counts = await deps.mirror.upsertConversations(opts.accountId, page, opts.runId);
  await deps.afterCommit?.();
  out.inserted += counts.inserted;
  out.updated += counts.updated;
  totals.add(page.meta.total_count);
  pass.lastTotal = page.meta.total_count;
  for (const c of page.data) {
    if (pass.ids.has(c.id)) pass.duplicate = true;
    pass.ids.add(c.id);
    if (!seen.has(c.id)) {
      seen.add(c.id);
      pass.fresh++;
      hooks.onNewId?.(c.id);
    }
  }
}

/** Whether a signal is a time (an ISO 8601 string, or anything `Date.parse` reads). */
function isTime(s: string | number | null | undefined): s is string {
  return typeof s === 'string' && !Number.isNaN(Date.parse(s));
}

/**
 * The order tracker of a pass (when a change field is in use), with the early-stop threshold when
 * the last complete listing found the list ordered by that same field.
 */
function orderTracker(out: ListingResult, known: ListOrder | undefined): OrderTracker | undefined {
  const field = out.changeField;
  if (!field) return undefined;
  // Only a time is safe: a conversation that changes gets a signal newer than anything listed
  // before. A count (messages_count) may grow and still be below the list's largest.
  const usable = known?.ordered === true && known.field === field && isTime(known.newest) ? known.newest : undefined;
  return new OrderTracker(field, usable);
}

/**
 * Observes a page's order. A disorder seen while stopping early was allowed is recorded at once (so
 * no later incremental listing relies on it) and the pass goes on to the end.
 *
 * @returns true when the pass may stop: two pages in a row (the second is the overlap for ties)
 *   held only conversations older than everything the last complete listing saw
 */
async function observeOrder(deps: SyncDeps, opts: WorkspaceOptions, tracker: OrderTracker, page: Page<Conversation>, known: ListOrder | undefined): Promise<boolean> {
  const wasOrdered = tracker.ordered;
  tracker.observe(page.raw);
  if (wasOrdered && !tracker.ordered && known?.ordered) {
    await deps.mirror.recordListOrder(opts.accountId, { ...known, ordered: false, at: new Date(deps.clock.now()).toISOString(), ...(tracker.why ? { why: tracker.why } : {}) });
    deps.logger.warn({ field: known.field, why: tracker.why }, 'the conversation list is no longer ordered by its change signal: this listing reads every page, and so will the next ones');
  }
  return tracker.olderPages >= 2;
}

/** Resolves the change field from the first list page of the first pass and reports it. */
function resolveFirstPage(deps: SyncDeps, opts: WorkspaceOptions, hooks: ListHooks, out: ListingResult, page: Page<Conversation>): void {
  out.changeField = resolveChangeField(opts.changeFieldSetting, page.raw);
  if (opts.changeFieldSetting && opts.changeFieldSetting !== 'none') {
    deps.logger.info(
      { setting: opts.changeFieldSetting, field: out.changeField ?? null },
      out.changeField ? 'change signal in use' : 'no change signal found: every conversation costs at least one request',
    );
  }
  hooks.onChangeField?.(out.changeField);
}

/**
 * Syncs the named conversations only, e.g. `sync --conversation ID`. A 404 never tombstones a
 * named conversation (no listing confirms it is gone): it is a failure.
 *
 * @returns results and failures; `fatal` is set when the run was stopped early (see {@link syncWorkspace})
 */
export async function syncConversations(deps: SyncDeps, ids: string[], opts: WorkspaceOptions): Promise<WorkspaceResult> {
  const crawl = new Crawler(deps, { ...opts, named: true, progress: opts.progress ?? newProgress() });
  for (const id of new Set(ids)) crawl.enqueue(id);
  await crawl.idle();
  const out = namedConversationsResult(crawl.totals(), crawl.failures);
  out.messagesServed = crawl.tally.served;
  out.tally = crawl.tally;
  if (crawl.fatal) out.fatal = crawl.fatal;
  return out;
}

/** The outcome of a sync of named conversations (no listing): results and failures only. */
export function namedConversationsResult(crawls: CrawlTotals, failures: ConversationFailure[]): WorkspaceResult {
  return { listPasses: 0, listConfirmed: true, conversationsListed: 0, conversationsInserted: 0, conversationsUpdated: 0, crawls, failures };
}

/** How a conversation is crawled, as bits of a queued entry. */
const NO_SKIP = 1;
const UNLISTED = 2;

/**
 * Runs conversation crawls with a concurrency cap; stops everything on a fatal error.
 *
 * Flat memory: what waits is a queue of ids and flag bits (not a promise or closure per
 * conversation), `concurrency` workers take from it, and a finished crawl leaves only its id and
 * one number ({@link CrawlAccumulator}). A listing of 100,000 conversations that runs ahead of the
 * crawls costs their ids, nothing more.
 */
class Crawler {
  private readonly acc = new CrawlAccumulator();
  private readonly failuresById = new Map<string, { error: Error; tally?: RequestTally }>();
  /** Every crawl's requests and served messages, whatever its outcome. */
  readonly tally: RequestTally = newTally();
  /** The error that stopped the whole run (see {@link isFatal}), if any. */
  fatal: FatalError | undefined;
  /** Every id ever enqueued (a second enqueue without `again` is ignored). */
  private readonly scheduled = new Set<string>();
  /** Waiting ids and their flag bits, from `head` on (a FIFO; consumed entries are dropped in chunks). */
  private queueIds: string[] = [];
  private queueFlags: number[] = [];
  private head = 0;
  /** Crawls in flight by id (at most `concurrency`): a second crawl of one waits for the first. */
  private readonly inFlight = new Map<string, Promise<void>>();
  private workers = 0;
  private readonly concurrency: number;
  /** An unexpected error of a worker (a programming error): {@link idle} throws it. */
  private crash: unknown;
  /** Resolved when the queue is empty and no worker runs. */
  private drained: { promise: Promise<void>; resolve: () => void } | undefined;

  constructor(
    private readonly deps: SyncDeps,
    private readonly opts: WorkspaceOptions & { progress: NonNullable<SyncOptions['progress']> },
  ) {
    this.concurrency = Math.max(1, opts.concurrency ?? 4);
  }

  /** What the finished crawls did, summed (each conversation by its last outcome). */
  totals(): CrawlTotals {
    return this.acc.totals();
  }

  /** Conversations (and the listing) whose last attempt failed. */
  get failures(): ConversationFailure[] {
    return [...this.failuresById].map(([id, f]) => ({ id, ...f }));
  }

  /** Records a failure of `id` (its last attempt's error counts). */
  fail(id: string, error: Error, tally?: RequestTally): void {
    this.acc.forget(id);
    this.failuresById.set(id, tally ? { error, tally } : { error });
  }

  get stopped(): boolean {
    return this.fatal !== undefined || this.opts.signal?.aborted === true;
  }

  /** No crawl starts after this; crawls in flight finish. The first error wins. */
  stop(err: FatalError): void {
    if (this.fatal) return;
    this.fatal = err;
    this.deps.logger.error({ err: describeError(err), code: err.code }, 'stopping the run: nothing more is attempted');
  }

  /**
   * Schedules a crawl of `id`. A conversation already scheduled is not crawled twice, unless
   * `again` is set: then it is crawled once more after the earlier crawl has finished.
   */
  enqueue(id: string, opts: { again?: boolean; noSkip?: boolean; unlisted?: boolean } = {}): void {
    if (this.scheduled.has(id) && !opts.again) return;
    this.scheduled.add(id);
    this.opts.progress.conversationsTotal++;
    this.queueIds.push(id);
    this.queueFlags.push((opts.noSkip ? NO_SKIP : 0) | (opts.unlisted ? UNLISTED : 0));
    if (this.workers < this.concurrency) {
      this.workers++;
      void this.work();
    }
  }

  /** Takes the next waiting entry, if any. */
  private take(): { id: string; flags: number } | undefined {
    if (this.head >= this.queueIds.length) return undefined;
    const entry = { id: this.queueIds[this.head]!, flags: this.queueFlags[this.head]! };
    this.head++;
    if (this.head >= 4096 && this.head * 2 >= this.queueIds.length) {
      this.queueIds = this.queueIds.slice(this.head);
      this.queueFlags = this.queueFlags.slice(this.head);
      this.head = 0;
    }
    return entry;
  }

  /** One worker: crawls waiting conversations until none is left (or the run is stopped). */
  private async work(): Promise<void> {
    try {
      for (let next = this.take(); next && !this.stopped; next = this.take()) {
        const { id, flags } = next;
        // Never two crawls of one conversation at once: a second one waits for the first.
        for (let earlier = this.inFlight.get(id); earlier; earlier = this.inFlight.get(id)) await earlier;
        const crawl = this.run(id, { noSkip: (flags & NO_SKIP) !== 0, unlisted: (flags & UNLISTED) !== 0 });
        this.inFlight.set(id, crawl);
        try {
          await crawl;
        } finally {
          this.inFlight.delete(id);
        }
      }
    } catch (err) {
      this.crash ??= err;
      this.dropQueue();
    } finally {
      this.workers--;
      if (this.workers === 0) {
        // Stopped: what still waits is never crawled.
        if (this.stopped) this.dropQueue();
        if (this.head >= this.queueIds.length) this.drained?.resolve();
      }
    }
  }

  private dropQueue(): void {
    this.queueIds = [];
    this.queueFlags = [];
    this.head = 0;
  }

  private async run(id: string, how: { noSkip?: boolean; unlisted?: boolean }): Promise<void> {
    const progress = this.opts.progress;
    const tally = newTally();
    try {
      const opts: SyncOptions = { ...this.opts, tally, ...(how.noSkip ? { changeField: undefined } : {}), ...(how.unlisted ? { unlisted: true } : {}) };
      const r = await syncConversation(this.deps, id, opts);
      // A conversation crawled again (a re-check): its last outcome counts.
      this.acc.add(r);
      if (this.failuresById.delete(r.id)) progress.conversationsFailed--;
    } catch (err) {
      if (isFatal(err)) {
        this.stop(err);
        return;
      }
      if (this.opts.signal?.aborted) {
        // Shutting down: not a failure; the committed checkpoint lets the next run resume.
        this.deps.logger.info({ conversation_id: id }, 'crawl stopped by shutdown; checkpoint kept');
        return;
      }
      if (!this.failuresById.has(id)) progress.conversationsFailed++;
      this.fail(id, err as Error, tally);
      // Ask the API about it again next run, whatever its change signal says.
      try {
        await this.deps.mirror.forgetCrawlBaseline(this.opts.accountId, id);
      } catch (e) {
        if (isFatal(e)) this.stop(e);
      }
      this.deps.logger.error(
        { conversation_id: id, err: describeError(err), code: (err as ConvoMirrorError).code, context: (err as ConvoMirrorError).context },
        'conversation failed after retries',
      );
    } finally {
      Object.assign(this.tally, addTally(this.tally, tally));
      progress.conversationsDone++;
    }
  }

  /**
   * Waits until every crawl enqueued so far (and any enqueued meanwhile) has finished.
   * @throws only an unexpected (programming) error of a worker
   */
  async idle(): Promise<void> {
    while (this.workers > 0) {
      if (!this.drained) {
        let resolve!: () => void;
        const promise = new Promise<void>((r) => (resolve = r));
        this.drained = { promise, resolve };
      }
      await this.drained.promise;
      this.drained = undefined;
    }
    if (this.stopped) this.dropQueue();
    if (this.crash !== undefined) throw this.crash;
  }
}
