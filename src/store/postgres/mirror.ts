/**
 * The PostgreSQL engine of the store: a mirror in one schema of a PostgreSQL database, shared by a
 * fleet of daemons (issue 25). This file is the facade; the SQL lives with its table group:
 *
 * - `migrations.ts`: the schema and its migrations (one transaction under an advisory lock);
 * - `connect.ts`: the pool and the one-line `CONVO_MIRROR_DB` errors;
 * - `conversations.ts`, `messages.ts`, `change-log.ts`: the mirror's rows and the change log (seqs
 *   in commit order, no gap: see change-log.ts);
 * - `runs.ts`, `export-ledger.ts`, `status.ts`, `audit.ts`: runs, the export ledger (a fenced
 *   chain head), `status` and `verify --deep` reads;
 * - `erasures.ts`: erasures and the redaction of their subjects (the account's erasure gate every
 *   transaction writing its records takes: see that file).
 *
 * Every write method is one transaction, like the SQLite engine's: a message page is the upsert,
 * its change-log rows and the checkpoint, or nothing. The transaction runner
 * ({@link PostgresMirror.tx}) flushes the change log last and then commits, and runs the whole
 * transaction again after a unique violation (another writer inserted a row first), a
 * serialization failure or a deadlock (at most {@link TX_ATTEMPTS} times).
 *
 * Writers are many (daemons on several machines, a CLI sync): what SQLite's single-writer lock
 * gave for free is asked for explicitly. Each writer holds an owner lock for its whole life
 * (`owner-lock.ts`) and stamps its runs with its instance id, so a process starting up marks
 * `interrupted` only the runs whose process is gone ({@link PostgresMirror.markInterruptedRuns}).
 * {@link PostgresMirror.withConversationLock} and
 * {@link PostgresMirror.withListingLock} hold session advisory locks; and every transaction that
 * writes a conversation's messages first locks the conversation's row, so its pages are applied
 * one after the other whoever writes them.
 */
import pg from 'pg';
import type { Conversation, Message, Page } from '../../api/schemas.js';
import { systemClock, isoNow, type Clock } from '../../clock.js';
import { StoreError } from '../../errors.js';
import { parsePostgresTarget, type PostgresTarget } from '../../../config/db-url.js';
import type { Mirror, PoolStats } from '../mirror.js';
import type {
  Checkpoint,
  ConversationFilter,
  ConversationListing,
  CrawlState,
  ErasureRequest,
  ErasureResult,
  ErasureRow,
  ErasureSubject,
  ReplacedFile,
  ExpiredFile,
  SubjectLine,
  ExportBatch,
  ExportChange,
  HistoryRow,
  LedgerEntry,
  LedgerGenesis,
  LedgerHead,
  ListOrder,
  MirrorAccess,
  PendingExport,
  PublisherLease,
  PublishedFile,
  RecordRow,
  RunChanges,
  RunFailureRecord,
  RunFigures,
  RunStart,
  WriteCounts,
} from '../mirror.js';
import { ChangeBuffer, ChangeLog } from './change-log.js';
import { checkConnection, checkout, createPool, translateError, type DatabaseStep } from './connect.js';
import { Conversations } from './conversations.js';
import { qualify } from './db.js';
import { conversationLockKey, erasureGateKey, listingLockKey } from './locks.js';
import { Erasures } from './erasures.js';
import { checkErasureRequest, erasuresInForce, NO_CONVERSATION_ERASURES, pageRetentionFloor, pageSenderIds, redactConversationsPage, redactMessagesPage } from '../redaction.js';
import { Messages } from './messages.js';
import { checkSchemaState, CreateSchemaFailed, migrate, PG_SCHEMA_VERSION, readSchemaVersion } from './migrations.js';
import { Runs } from './runs.js';
import { tryPublisherLock } from './publisher-lock.js';
import { ExportLedger } from './export-ledger.js';
import { MirrorStatus } from './status.js';
import { AuditReads } from './audit.js';
import { OwnerLock, type OwnerLockEvent } from './owner-lock.js';

/** Attempts of one transaction at most, when it must run again (see the module comment). */
export const TX_ATTEMPTS = 5;
/** SQLSTATEs after which a transaction is run again: unique violation, serialization failure, deadlock. */
const RETRY_CODES = new Set(['23505', '40001', '40P01']);
/** Connections of the pool that holds the session advisory locks, at most. */
export const LOCK_POOL_MAX = 128;

/** Test hooks of a {@link PostgresMirror}; never set in production. */
export interface PostgresHooks {
  /**
   * Called in every write transaction after its change-log rows were flushed (its seqs allocated,
   * the counter's row locked) and just before COMMIT, with the seqs and the transaction's
   * `synchronous_commit` (`off` for a group commit, `on` for a durable one: see `tx`). A
   * failpoint: a test holds a transaction open here, or throws to roll it back.
   */
  beforeCommit?: (tx: { seqs: readonly number[]; synchronousCommit: string }) => Promise<void> | void;
  /** Called by the open's migration once it holds the migration lock (see `MigrateHooks.onLocked`). */
  onMigrationLocked?: () => Promise<void> | void;
  /**
   * Awaited before each try to take a lost owner lock again (`attempt` from 1): a test holds the
   * gap between the loss and the retake open here (see `owner-lock.ts`).
   */
  beforeOwnerRetake?: (attempt: number) => Promise<void> | void;
}

/** Options of {@link PostgresMirror.open}. */
export interface PostgresMirrorOptions {
  /** Time source for `*_at` columns. @defaultValue the system clock */
  clock?: Clock;
  /**
   * Open for reading only (`status`, `verify`): no migration (a missing or older schema is
   * refused), and every write method throws {@link StoreError}. @defaultValue false
   */
  readonly?: boolean;
  /** Connections of the mirror's pool, at most. @defaultValue 10 */
  poolMax?: number;
  /** Connect timeout of one connection, ms. @defaultValue 5000 */
  connectTimeoutMs?: number;
  /** Called with the error of an idle pooled connection (see `PoolOptions.onIdleError`). */
  onIdleError?: (err: Error) => void;
  /**
   * Told what happens to a writer's owner lock after the open took it: its session was lost
   * (`lost`), a try to take it again failed (`retry-failed`, retried with a growing wait up to 5 s),
   * it is held again (`retaken`). Between `lost` and `retaken`, other processes sweeping runs
   * ({@link PostgresMirror.markInterruptedRuns}) may judge this writer's runs dead and mark them
   * `interrupted`. See `owner-lock.ts`.
   * @defaultValue the errors of `lost` and `retry-failed` (`OwnerLockError`, code `OWNER_LOCK_LOST`)
   *   go to {@link onIdleError}; `retaken` is dropped
   */
  onOwnerLock?: (event: OwnerLockEvent) => void;
  /** Test hooks. */
  hooks?: PostgresHooks;
}

/**
 * A mirror in a PostgreSQL schema. Safe to use from many async tasks of one process and from many
 * processes at once (see the module comment). The public methods are those of the store's
 * `Mirror` interface, with the same meanings as the SQLite engine's; each rejects with a
 * `MirrorDatabaseError` (code `DB_UNREACHABLE`, `DB_AUTH`, `DB_MISSING`, `DB_PRIVILEGE`) when the
 * database cannot be reached or used, naming `CONVO_MIRROR_DB` and its masked URL.
 */
/** What a transaction learned behind the erasure gate (see `tx`). */
interface GateState {
  /** The account has at least one erasure (false: nothing of the page can be erased; no lookup needed). */
  erasures: boolean;
}

export class PostgresMirror implements Mirror {
  /** The engine holding this mirror. */
  readonly engine = 'postgres' as const;
  /** The target as any output shows it: the URL with its password masked. */
  readonly location: string;
  /** A server database is no local file. */
  readonly localFile: string | undefined = undefined;
  /** `'read-write'` for a writer; `'shared'` for a read-only open (it sees every commit). */
  readonly access: MirrorAccess;
  /** The schema holding the mirror. */
  readonly schema: string;
  /** How many migrations this open applied (0 when the schema was current, or another process migrated it). */
  readonly migrated: number;
  /**
   * This writer's instance id: a random signed 64-bit integer as decimal text, fixed for the
   * open's life, stamped on the runs it starts or resumes (`runs.owner`); undefined for a
   * read-only open. Its owner lock is held from the open to {@link close} (see `owner-lock.ts`).
   */
  readonly instanceId: string | undefined;

  private readonly target: PostgresTarget;
  private readonly pool: pg.Pool;
  /** The pool of session advisory locks: separate, so lock holders never starve the work pool. */
  private readonly lockPool: pg.Pool;
  /** Backend pids of the lock pool's clients (asked once per connection). */
  private readonly lockPids = new WeakMap<pg.PoolClient, number>();
  /** Clients waiting for an advisory lock, with their backend pids: {@link close} cancels their waits. */
  private readonly lockWaiters = new Map<pg.PoolClient, number>();
  private readonly clock: Clock;
  private readonly readOnly: boolean;
  private readonly hooks: PostgresHooks;
  /** The writer's owner lock; undefined for a read-only open. */
  private readonly owner: OwnerLock | undefined;
  private closed = false;

  private readonly changes: ChangeLog;
  private readonly conversations: Conversations;
  private readonly messages: Messages;
  private readonly runs: Runs;
  private readonly ledger: ExportLedger;
  private readonly status: MirrorStatus;
  private readonly audit: AuditReads;
  private readonly erasures_: Erasures;

  private constructor(target: PostgresTarget, pool: pg.Pool, lockPool: pg.Pool, opts: PostgresMirrorOptions, migrated: number, owner: OwnerLock | undefined) {
    this.target = target;
    this.location = target.shown;
    this.schema = target.schema;
    this.pool = pool;
    this.lockPool = lockPool;
    this.clock = opts.clock ?? systemClock;
    this.readOnly = opts.readonly === true;
    this.access = this.readOnly ? 'shared' : 'read-write';
    this.hooks = opts.hooks ?? {};
    this.migrated = migrated;
    this.owner = owner;
    this.instanceId = owner?.id;
    const schema = target.schema;
    this.changes = new ChangeLog(schema);
    this.conversations = new Conversations(schema);
    this.messages = new Messages(schema);
    this.runs = new Runs(schema);
    this.ledger = new ExportLedger(schema);
    this.status = new MirrorStatus(schema);
    this.audit = new AuditReads(schema);
    this.erasures_ = new Erasures(schema);
  }

  /**
   * Opens the mirror at `target`: connects (one `SELECT 1`), then a writer migrates the schema
   * (creating it when missing; see `migrate`) and takes its owner lock (a random
   * {@link instanceId}; one client of the lock pool holds it until {@link close}), a read-only
   * open checks the schema is current.
   *
   * @param target - a `postgres://` or `postgresql://` URL (see `parsePostgresTarget`), or one parsed
   * @throws {@link ConfigError} naming `CONVO_MIRROR_DB` for a malformed URL
   * @throws `MirrorDatabaseError` naming `CONVO_MIRROR_DB` and the masked URL: `DB_UNREACHABLE`
   *   (refused, unknown host, no answer within the connect timeout), `DB_AUTH` (refused password or
   *   user), `DB_MISSING` (no such database), `DB_PRIVILEGE` (no right to create the schema or its
   *   tables)
   * @throws {@link StoreError} when the schema is newer than this code or holds other tables; for
   *   a read-only open, when it holds no mirror or an older one
   */
  static async open(target: string | PostgresTarget, opts: PostgresMirrorOptions = {}): Promise<PostgresMirror> {
    const t = typeof target === 'string' ? parsePostgresTarget(target) : target;
    const poolOpts = { connectTimeoutMs: opts.connectTimeoutMs, ...(opts.onIdleError ? { onIdleError: opts.onIdleError } : {}) };
    const pool = createPool(t, { ...poolOpts, max: opts.poolMax });
    const lockPool = createPool(t, { ...poolOpts, max: LOCK_POOL_MAX });
    try {
      await checkConnection(pool, t);
      let migrated = 0;
      let owner: OwnerLock | undefined;
      if (opts.readonly) {
        checkSchemaState(await readSchemaVersion(pool, t.schema), t.schema, t.shown, true);
      } else {
        try {
          migrated = await migrate(pool, t.schema, t.shown, opts.hooks?.onMigrationLocked ? { onLocked: opts.hooks.onMigrationLocked } : {});
        } catch (err) {
          if (err instanceof CreateSchemaFailed) throw translateError(err.original, t, 'create-schema', t.schema);
          throw translateError(err, t, 'migrate');
        }
        const onEvent =
          opts.onOwnerLock ?? ((e: OwnerLockEvent) => (e.event === 'retaken' ? undefined : opts.onIdleError?.(e.error)));
        try {
          const beforeRetake = opts.hooks?.beforeOwnerRetake;
          owner = await OwnerLock.take(lockPool, t.schema, { clock: opts.clock ?? systemClock, onEvent, location: t.shown, ...(beforeRetake ? { beforeRetake } : {}) });
        } catch (err) {
          throw translateError(err, t, 'query');
        }
      }
      return new PostgresMirror(t, pool, lockPool, opts, migrated, owner);
    } catch (err) {
      await Promise.all([pool.end(), lockPool.end()]).catch(() => {});
      throw err;
    }
  }

  // ---------------------------------------------------------------- plumbing

  private now(): string {
    return isoNow(this.clock);
  }

  /** Runs `f`, turning a failure to reach or use the database into a `MirrorDatabaseError`. */
  private async guard<T>(f: () => Promise<T>, step: DatabaseStep = 'query'): Promise<T> {
    if (this.closed) throw new StoreError(`the mirror ${this.location} is closed`, { target: this.location });
    try {
      return await f();
    } catch (err) {
      throw translateError(err, this.target, step);
    }
  }

  /** {@link guard} for a method that writes: refused on a read-only open. */
  private write<T>(f: () => Promise<T>): Promise<T> {
    if (this.readOnly) return Promise.reject(new StoreError(`the mirror ${this.location} was opened read-only: nothing can be written to it`, { target: this.location }));
    return this.guard(f);
  }

  /**
   * Runs `f` in one write transaction: BEGIN, `f` (which buffers its changes), the change-log
   * flush, the `beforeCommit` hook, COMMIT. Rolled back on any error; run again from the start
   * (a new transaction, a new buffer) after a unique violation, a serialization failure or a
   * deadlock, at most {@link TX_ATTEMPTS} times in all.
   *
   * `durability` (as the SQLite engine's `synchronous`): `'group'` commits without waiting for
   * the WAL flush (`synchronous_commit = off`: a server crash may take the last few commits back,
   * each whole, never a part of one; the crawl re-reads them); `'durable'` waits for it, and since
   * the WAL is flushed in order, makes every earlier commit durable too. Export batch plans and
   * recorded publications are durable: no seq in a published file can be lost and handed out
   * again.
   *
   * `gate` takes the erasure gate of an account (src/store/postgres/erasures.ts) in the same round
   * trip as BEGIN, before `f` reads anything: shared for a transaction that writes the account's
   * message or conversation records, exclusive for an erasure.
   */
  private tx<T>(
    f: (c: pg.PoolClient, buf: ChangeBuffer, gated: GateState) => Promise<T>,
    durability: 'group' | 'durable' = 'group',
    gate?: { accountId: string; exclusive?: boolean },
  ): Promise<T> {
    const begin = durability === 'durable' ? 'BEGIN' : 'BEGIN; SET LOCAL synchronous_commit TO OFF';
    // The key is a decimal integer this process computed: safe as a literal.
    const lock = gate ? `; SELECT pg_advisory_xact_lock${gate.exclusive ? '' : '_shared'}((${erasureGateKey(this.schema, gate.accountId)})::bigint)` : '';
    return this.write(async () => {
      for (let attempt = 1; ; attempt++) {
        const client = await checkout(this.pool);
        let broken: Error | undefined;
        try {
          // Behind the gate, in the same round trip: whether the account has any erasure at all (a
          // page of an account without one skips the lookup of the erasures in force).
          const any = gate ? `; SELECT EXISTS (SELECT 1 FROM ${qualify(this.schema, 'erasures')} WHERE account_id = ${client.escapeLiteral(gate.accountId)}) AS any` : '';
          const began = await client.query(begin + lock + any);
          const last = Array.isArray(began) ? (began as pg.QueryResult[])[(began as pg.QueryResult[]).length - 1] : began;
          const gated: GateState = { erasures: gate ? (last?.rows[0] as { any?: boolean } | undefined)?.any !== false : false };
          const buf = new ChangeBuffer();
          const result = await f(client, buf, gated);
          const seqs = await this.changes.flush(client, buf);
          if (this.hooks.beforeCommit) {
            const sc = await client.query<{ synchronous_commit: string }>('SHOW synchronous_commit');
            await this.hooks.beforeCommit({ seqs, synchronousCommit: sc.rows[0]!.synchronous_commit });
          }
          await client.query('COMMIT');
          return result;
        } catch (err) {
          try {
            await client.query('ROLLBACK');
          } catch (rollbackErr) {
            broken = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
          }
          const code = (err as { code?: unknown } | null)?.code;
          if (typeof code === 'string' && RETRY_CODES.has(code) && attempt < TX_ATTEMPTS && !broken) continue;
          throw err;
        } finally {
          client.release(broken);
        }
      }
    });
  }

  /** Runs `f` in one read-only REPEATABLE READ transaction (one snapshot for all its statements). */
  private snapshot<T>(f: (c: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.guard(async () => {
      const client = await checkout(this.pool);
      let broken: Error | undefined;
      try {
        await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
        const result = await f(client);
        await client.query('COMMIT');
        return result;
      } catch (err) {
        await client.query('ROLLBACK').catch((e: unknown) => {
          broken = e instanceof Error ? e : new Error(String(e));
        });
        throw err;
      } finally {
        client.release(broken);
      }
    });
  }

  /**
   * Runs `fn` holding the session advisory lock `key` on a client of the lock pool: waits for the
   * lock (blocking, however long another holder keeps it), runs `fn`, and releases the lock in
   * `finally` (a client whose unlock failed is destroyed, which releases it with the session).
   * {@link close} cancels a wait.
   */
  private async withAdvisoryLock<T>(key: [number, number], fn: () => Promise<T>): Promise<T> {
    const closed = () => new StoreError(`the mirror ${this.location} is closed`, { target: this.location });
    if (this.closed) throw closed();
    let client: pg.PoolClient;
    try {
      client = await checkout(this.lockPool);
    } catch (err) {
      throw translateError(err, this.target, 'query');
    }
    let broken: Error | undefined;
    const fail = (err: unknown) => {
      broken = err instanceof Error ? err : new Error(String(err));
    };
    try {
      let pid = this.lockPids.get(client);
      try {
        if (pid === undefined) {
          pid = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
          this.lockPids.set(client, pid);
        }
        // Registered and checked with no await in between: close() either sees this wait (and
        // cancels it) or has set `closed` before it.
        this.lockWaiters.set(client, pid);
        if (this.closed) throw closed();
        await client.query('SELECT pg_advisory_lock($1::int4, $2::int4)', key);
      } catch (err) {
        fail(err);
        throw this.closed
          ? new StoreError(`the mirror ${this.location} was closed while waiting for a lock`, { target: this.location }, err)
          : translateError(err, this.target, 'query');
      } finally {
        this.lockWaiters.delete(client);
      }
      try {
        return await fn();
      } finally {
        await client.query('SELECT pg_advisory_unlock($1::int4, $2::int4)', key).catch(fail);
      }
    } finally {
      client.release(broken);
    }
  }

  // ---------------------------------------------------------------- writers kept apart

  /**
   * Runs `fn` while no other writer, in this process or any other, crawls the conversation
   * `conversationId` of `accountId`, and returns its result: a session advisory lock
   * (`pg_advisory_lock(int4, int4)`, key from the schema, account and conversation: see
   * `conversationLockKey`) on a dedicated connection, held for `fn`'s duration and released in
   * `finally`. Waits for a writer that holds it (a CLI sync waits for the daemon's crawl of that
   * conversation, then continues from its checkpoint). A lock whose connection is lost is gone;
   * the row lock every page takes still keeps two pages from interleaving.
   */
  withConversationLock<T>(accountId: string, conversationId: string, fn: () => Promise<T>): Promise<T> {
    return this.withAdvisoryLock(conversationLockKey(this.schema, accountId, conversationId), fn);
  }

  /**
   * Runs `fn` while no other writer, in this process or any other, lists the workspace
   * `accountId`, and returns its result: as {@link withConversationLock}, with the key of the
   * listing (`listingLockKey`).
   */
  withListingLock<T>(accountId: string, fn: () => Promise<T>): Promise<T> {
    return this.withAdvisoryLock(listingLockKey(this.schema, accountId), fn);
  }

  /**
   * Takes the mirror's publisher lock (`pg_try_advisory_lock` on a key of the schema, on a
   * connection of the lock pool held until release); undefined when another session holds it.
   * See {@link tryPublisherLock} in `publisher-lock.ts` for what a lost lease means.
   */
  async tryPublisherLock(): Promise<PublisherLease | undefined> {
    if (this.access !== 'read-write') throw new StoreError(`the mirror ${this.location} was opened read-only: it cannot publish`, { db: this.location });
    try {
      return await tryPublisherLock(this.lockPool, this.schema);
    } catch (err) {
      throw translateError(err, this.target, 'query');
    }
  }

  // ---------------------------------------------------------------- runs

  /** This writer's instance id (only a writer gets this far: {@link write} refused a read-only open). */
  private self(): string {
    return this.owner!.id;
  }

  /** Records the start of a run (status `running`, owned by this writer: {@link instanceId}); returns its id. */
  startRun(run: RunStart): Promise<number> {
    return this.write(() => this.runs.start(this.pool, run, this.now(), this.self()));
  }

  /**
   * Marks `interrupted` the runs still `running` whose process is gone, each with its `runs`
   * change-log row, in one transaction: those whose owner (the writer that started or last
   * resumed them) holds no owner lock any more (no session holds it in `pg_locks`: the process
   * died, was killed or closed its mirror without ending them), and those with no owner. Runs of
   * live writers, in this process or any other, are left running, and this writer's own runs are
   * never marked. A writer whose owner-lock session was lost and not yet retaken counts as gone
   * (see {@link PostgresMirrorOptions.onOwnerLock}). Safe to call at any time, from any number of
   * processes at once (each run is marked once: its row is locked, and a run another sweep ended
   * meanwhile is no longer `running`).
   *
   * @returns how many runs were marked
   */
  markInterruptedRuns(): Promise<number> {
    return this.tx(async (c, buf) => {
      const ids = await this.runs.interruptibleIds(c, this.self());
      const now = this.now();
      for (const id of ids) await this.endRun(c, buf, id, { status: 'interrupted' }, now);
      return ids.length;
    });
  }

  /** Records a run's end and buffers its `runs` change-log row; call inside a transaction. */
  private async endRun(c: pg.PoolClient, buf: ChangeBuffer, runId: number, figures: RunFigures, now: string): Promise<void> {
    const head = (await this.ledger.head(c)) ?? null;
    await this.runs.finish(c, runId, figures, now, head);
    const line = await this.runs.lineRecord(c, runId, head);
    if (line) await this.changes.appendRun(c, buf, runId, line.accountId, line.record, line.endedAt);
  }

  /**
   * Resumes a run whose process died (see the interface); one transaction. A run resumed from
   * `interrupted` becomes this writer's (`owner` = {@link instanceId}); so does one still `running`
   * whose owner is gone (its process died and no sweep has marked it yet), so that no sweep marks
   * it while this writer carries on with it. A `running` run of a live writer keeps its owner.
   */
  resumeRun(runId: number): Promise<'running' | 'resumed' | 'ended'> {
    return this.tx((c) => this.runs.resume(c, runId, this.self()));
  }

  /** What a run changed, counted from its committed change-log rows. */
  runChanges(runId: number): Promise<RunChanges> {
    return this.guard(() => this.changes.changesOfRun(this.pool, runId));
  }

  /** A run's status; undefined for an unknown id. */
  runStatus(runId: number): Promise<string | undefined> {
    return this.guard(() => this.runs.status(this.pool, runId));
  }

  /** Whether a run has ended (any final status). */
  async runEnded(runId: number): Promise<boolean> {
    const status = await this.runStatus(runId);
    return status !== undefined && status !== 'running';
  }

  /** Records a run's end in one transaction, with its `runs` change-log row (see the interface). */
  finishRun(runId: number, figures: RunFigures): Promise<void> {
    return this.tx((c, buf) => this.endRun(c, buf, runId, figures, this.now()));
  }

  /** Sets the chain head a run left. */
  setRunLedgerHead(runId: number, head: LedgerHead | undefined): Promise<void> {
    return this.write(() => this.runs.setLedgerHead(this.pool, runId, head ?? null));
  }

  /** Records the conversations that failed in a run, replacing what was recorded before; one transaction. */
  recordFailures(runId: number, failures: RunFailureRecord[]): Promise<void> {
    return this.tx((c) => this.runs.recordFailures(c, runId, failures, this.now()));
  }

  /** The last `limit` runs, newest first (every column of `runs`). */
  lastRuns(limit: number): Promise<Record<string, unknown>[]> {
    return this.guard(() => this.runs.last(this.pool, limit));
  }

  /** Failures recorded for the newest finished run. */
  lastRunFailures(): Promise<Record<string, unknown>[]> {
    return this.guard(() => this.runs.lastFailures(this.pool));
  }

  /** Live (not tombstoned) conversations and messages of one account (one snapshot). */
  liveCounts(accountId: string): Promise<{ conversations: number; messages: number }> {
    return this.snapshot(async (c) => ({ conversations: await this.conversations.countLive(c, accountId), messages: await this.messages.countLive(c, accountId) }));
  }

  // ---------------------------------------------------------------- conversations

  /** Upserts one page of the conversation list in one transaction (see the interface). */
  upsertConversations(accountId: string, page: Page<Conversation>, runId: number | null): Promise<WriteCounts> {
    return this.tx(
      async (c, buf, gated) => {
        const erased = gated.erasures ? await this.erasures_.conversationsInForce(c, accountId, page.data.map((conv) => conv.id)) : NO_CONVERSATION_ERASURES;
        return this.conversations.upsertPage(c, buf, accountId, redactConversationsPage(page, erased), runId, this.now());
      },
      'group',
      { accountId },
    );
  }

  /** Forgets the change signal a conversation was last crawled at. */
  forgetCrawlBaseline(accountId: string, conversationId: string): Promise<void> {
    return this.write(() => this.conversations.forgetSignal(this.pool, accountId, conversationId));
  }

  /** Whether the mirror has a row (live or tombstoned) for this conversation. */
  hasConversation(accountId: string, conversationId: string): Promise<boolean> {
    return this.guard(() => this.conversations.has(this.pool, accountId, conversationId));
  }

  /** Ids of conversations mirrored and not tombstoned, sorted. */
  liveConversationIds(accountId: string): Promise<string[]> {
    return this.guard(() => this.conversations.liveIds(this.pool, accountId));
  }

  /** The mirrored conversations `filter` matches, and how many in all; one snapshot. */
  listConversations(filter: ConversationFilter = {}): Promise<ConversationListing> {
    return this.snapshot((c) => this.conversations.list(c, filter));
  }

  /** Ids of live conversations that `shown` does not hold, sorted. */
  liveConversationIdsNotIn(accountId: string, shown: ReadonlySet<string>): Promise<string[]> {
    return this.guard(() => this.conversations.liveIdsNotIn(this.pool, accountId, shown));
  }

  /** Ids of live conversations whose last crawl did not complete at a known change signal, sorted. */
  unsettledConversationIds(accountId: string): Promise<string[]> {
    return this.guard(() => this.conversations.unsettledIds(this.pool, accountId));
  }

  /**
   * Tombstones a conversation the API answered 404 for, and its live messages, in one transaction
   * (the messages' `delete` changes first).
   */
  tombstoneConversation(accountId: string, conversationId: string, runId: number | null): Promise<{ conversation: boolean; messages: number }> {
    return this.tx(
      async (c, buf) => {
        const now = this.now();
        await this.conversations.lock(c, accountId, conversationId);
        const messages = await this.messages.tombstoneLive(c, buf, accountId, conversationId, now, runId);
        const conversation = await this.conversations.tombstone(c, buf, accountId, conversationId, now, runId);
        await this.messages.clearCrawl(c, accountId, conversationId);
        return { conversation, messages };
      },
      'group',
      { accountId },
    );
  }

  // ---------------------------------------------------------------- message crawls

  /** The committed checkpoint of an unfinished crawl, if any (one snapshot). */
  loadCheckpoint(accountId: string, conversationId: string): Promise<Checkpoint | undefined> {
    return this.snapshot((c) => this.messages.loadCheckpoint(c, accountId, conversationId));
  }

  /** Forgets a crawl's checkpoint and seen ids. */
  resetCrawl(accountId: string, conversationId: string): Promise<void> {
    return this.tx((c) => this.messages.clearCrawl(c, accountId, conversationId));
  }

  /**
   * Commits one page of a conversation's messages in one transaction: the conversation's row
   * (stand-in or revival, locked), the upserts (unchanged rows skipped), their change-log rows and
   * superseded versions, the page's ids and the checkpoint.
   */
  commitMessagesPage(accountId: string, conversationId: string, page: Page<Message>, runId: number | null): Promise<WriteCounts> {
    return this.tx(
      async (c, buf, gated) => {
        const now = this.now();
        // Erasures in force first: an erased message is compared and written as its marker.
        const inForce = gated.erasures ? await this.erasures_.inForce(c, accountId, conversationId, pageSenderIds(page), pageRetentionFloor(page)) : erasuresInForce(conversationId, []);
        await this.conversations.ensure(c, buf, accountId, conversationId, now, runId, inForce.conversation);
        return this.messages.commitPage(c, buf, accountId, conversationId, redactMessagesPage(page, inForce), runId, now);
      },
      'group',
      { accountId },
    );
  }

  /**
   * Completes a crawl in one transaction: tombstones the live messages no page of it served, sets
   * the conversation's `message_count`, `last_synced_at` and (with `changeField`) its signal, and
   * clears the checkpoint.
   */
  completeCrawl(accountId: string, conversationId: string, runId: number | null, changeField?: string): Promise<{ deleted: number; messageCount: number }> {
    return this.tx(
      async (c, buf, gated) => {
        const now = this.now();
        const prev = await this.conversations.lock(c, accountId, conversationId);
        const deleted = await this.messages.tombstoneUnseen(c, buf, accountId, conversationId, now, runId);
        const messageCount = await this.messages.seenCount(c, accountId, conversationId);
        // Only a missing or tombstoned conversation gets a row here: its stand-in may be erased.
        const erasure = (prev && prev.deleted_at === null) || !gated.erasures ? undefined : (await this.erasures_.inForce(c, accountId, conversationId, [])).conversation;
        await this.conversations.ensure(c, buf, accountId, conversationId, now, runId, erasure);
        await this.conversations.finishCrawl(c, accountId, conversationId, messageCount, now, changeField);
        await this.messages.clearCrawl(c, accountId, conversationId);
        return { deleted, messageCount };
      },
      'group',
      { accountId },
    );
  }

  // ---------------------------------------------------------------- incremental sync

  /** What the last complete listing of `accountId` found of the list's order; undefined before any. */
  async listOrder(accountId: string): Promise<ListOrder | undefined> {
    const text = await this.guard(() => this.status.meta(this.pool, `list_order:${accountId}`));
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text) as ListOrder;
    } catch {
      return undefined;
    }
  }

  /** Records what a listing of `accountId` found of the list's order. */
  recordListOrder(accountId: string, order: ListOrder): Promise<void> {
    return this.write(() => this.status.setMeta(this.pool, `list_order:${accountId}`, JSON.stringify(order)));
  }

  /** What the last complete crawl of a conversation left. */
  crawlState(accountId: string, conversationId: string): Promise<CrawlState> {
    return this.guard(() => this.conversations.crawlState(this.pool, accountId, conversationId));
  }

  /** Id of the live message at `position`, if any. */
  messageIdAt(accountId: string, conversationId: string, position: number): Promise<string | undefined> {
    return this.guard(() => this.messages.idAt(this.pool, accountId, conversationId, position));
  }

  /** Starts an incremental crawl (see the interface); one transaction. */
  seedIncrementalCrawl(accountId: string, conversationId: string, beforePosition: number): Promise<string[]> {
    return this.tx((c) => this.messages.seedIncremental(c, accountId, conversationId, beforePosition));
  }

  // ---------------------------------------------------------------- export ledger

  /** The exported watermark: the last `change_log.seq` published. */
  exportWatermark(): Promise<number> {
    return this.guard(() => this.ledger.watermark(this.pool));
  }

  /** Change-log rows not yet published. */
  unexportedChanges(): Promise<number> {
    return this.guard(() => this.ledger.unexported(this.pool));
  }

  /** What waits above the exported watermark. */
  pendingExport(): Promise<PendingExport> {
    return this.guard(() => this.ledger.waiting(this.pool));
  }

  /**
   * The batch to publish, in one durable transaction: the pending one, else a new batch over
   * `(watermark, max(seq)]`. Every seq up to the max is committed (see change-log.ts), so the
   * range has no hole a late commit could fill; and the plan's commit waits for the WAL flush,
   * which makes every change before it durable (pages commit without waiting: see `tx`).
   */
  planExportBatch(runId: number | null, plannedAt: string, gzip = false): Promise<ExportBatch | undefined> {
    return this.tx((c) => this.ledger.plan(c, runId, plannedAt, gzip), 'durable');
  }

  /** The change-log rows of a batch, in file order, streamed. */
  async *changesOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): AsyncGenerator<ExportChange> {
    for await (const chunk of this.changeChunksOf(batch)) yield* chunk;
  }

  /** {@link changesOf} in chunks of up to 1,000 rows. */
  async *changeChunksOf(batch: Pick<ExportBatch, 'first_seq' | 'last_seq'>): AsyncGenerator<ExportChange[]> {
    yield* this.stream(this.ledger.chunksBetween(this.pool, batch.first_seq, batch.last_seq));
  }

  /**
   * Records a published batch in one transaction (files, ledger entry, batch published, watermark,
   * payloads pruned), moving the chain head by compare-and-set from `expectedHead`: by default
   * the head `entry` chains on (`entry.prev_hash`), so a publisher that lost its lock and wakes up
   * after another recorded a batch records nothing (`LedgerFencedError`, code `LEDGER_FENCED`).
   */
  recordPublication(batch: Pick<ExportBatch, 'id' | 'last_seq'>, files: PublishedFile[], entry: LedgerEntry, publishedAt: string, expectedHead?: LedgerHead): Promise<void> {
    return this.tx(async (c) => {
      const expected = expectedHead ?? (await this.headChainedOn(c, entry));
      await this.ledger.record(c, batch, files, entry, publishedAt, expected);
    }, 'durable');
  }

  /** The ledger record `entry` says it chains on (by its `prev_hash`); undefined for a first record. */
  private async headChainedOn(c: pg.PoolClient, entry: LedgerEntry): Promise<LedgerHead | undefined> {
    if (entry.prev_hash === null) return undefined;
    const r = await c.query<{ batch_id: number }>(`SELECT batch_id FROM ${qualify(this.schema, 'ledger')} WHERE hash = $1`, [entry.prev_hash]);
    // A hash no record has: the compare-and-set fails (nothing chains on an unrecorded head).
    return { batch_id: r.rows[0]?.batch_id ?? -1, hash: entry.prev_hash };
  }

  /** What the genesis record of an export directory published before the ledger existed must cover. */
  ledgerGenesis(): Promise<LedgerGenesis | undefined> {
    return this.guard(() => this.ledger.genesis(this.pool));
  }

  /** Records the genesis record of a migrated export directory (the first chain head). */
  recordLedgerGenesis(entry: LedgerEntry, publishedAt: string): Promise<void> {
    return this.tx((c) => this.ledger.recordGenesis(c, entry, publishedAt), 'durable');
  }

  /** The chain head; undefined before the first record. */
  ledgerHead(): Promise<LedgerHead | undefined> {
    return this.guard(() => this.ledger.head(this.pool));
  }

  /** Id of the export batch planned and not yet published, if any. */
  pendingExportBatch(): Promise<number | undefined> {
    return this.guard(() => this.ledger.pendingBatch(this.pool));
  }

  /** Every ledger entry as recorded, genesis first. */
  ledgerEntries(): Promise<LedgerEntry[]> {
    return this.guard(() => this.ledger.ledgerEntries(this.pool));
  }

  /** Every published export file as recorded, by first seq then path. */
  publishedFiles(): Promise<PublishedFile[]> {
    return this.guard(() => this.ledger.publishedFiles(this.pool));
  }

  /** The batch id the next record of the ledger takes (see the interface). */
  nextLedgerBatchId(): Promise<number> {
    return this.guard(() => this.ledger.nextBatchId(this.pool));
  }

  /**
   * Records a retention record in one durable transaction holding `export_state`'s row (see the
   * interface): no pending batch, the next id (reserved), the head moved by compare-and-set, the
   * entry, the expired files.
   */
  recordRetentionRecord(entry: LedgerEntry, paths: readonly string[], publishedAt: string): Promise<void> {
    return this.tx(async (c) => {
      const fenced = (why: string) => new StoreError(`retention record ${entry.batch_id} not recorded: ${why}. Nothing was changed`, { batch_id: entry.batch_id }, undefined, 'LEDGER_FENCED');
      const pending = await this.ledger.lockPlanning(c);
      if (pending !== undefined) throw fenced(`export batch ${pending} is planned and not published`);
      if (entry.prev_hash === null) throw fenced('it chains on no record');
      const next = await this.ledger.nextBatchId(c);
      if (entry.batch_id !== next) throw fenced(`the next batch id is ${next}`);
      await this.ledger.recordRetention(c, entry, paths, publishedAt, await this.headChainedOn(c, entry));
    }, 'durable');
  }

  /** Every file a retention record expired. */
  expiredFiles(): Promise<ExpiredFile[]> {
    return this.guard(() => this.ledger.expired(this.pool));
  }

  /** Published files and lines in all, and whether any batch was ever published. */
  exportTotals(): Promise<{ files: number; lines: number; everPublished: boolean }> {
    return this.guard(() => this.ledger.totals(this.pool));
  }

  // ---------------------------------------------------------------- erasure

  /**
   * Erases a subject (see `Mirror.eraseSubject`): one durable transaction holding the account's
   * erasure gate exclusive (every page, listing page, tombstone and crawl completion of the
   * account waits, and those in flight are waited for) and `export_state`'s row (no batch is
   * planned meanwhile): see src/store/postgres/erasures.ts. A dry run reads one snapshot, locks
   * nothing and writes nothing (it works on a read-only open too).
   */
  async eraseSubject(request: ErasureRequest): Promise<ErasureResult> {
    checkErasureRequest(request);
    if (request.dryRun === true) return this.snapshot((c) => this.erasures_.erase(c, request, this.now(), true));
    return this.tx((c) => this.erasures_.erase(c, request, this.now(), false), 'durable', { accountId: request.accountId, exclusive: true });
  }

  /** Every `erasures` row, oldest first. */
  erasures(): Promise<ErasureRow[]> {
    return this.guard(() => this.erasures_.list(this.pool));
  }

  /** The accounts the mirror holds messages of (see the interface). */
  messageAccounts(): Promise<string[]> {
    return this.guard(() => this.erasures_.messageAccounts(this.pool));
  }

  /** Records that the archive step finished an erasure (see the interface); one statement. */
  async recordErasureArchived(erasureId: number, doneAt: string): Promise<boolean> {
    const set = await this.write(() => this.erasures_.setArchived(this.pool, erasureId, doneAt));
    if (set === undefined) throw new StoreError(`no erasure ${erasureId} in the mirror ${this.location}`, { erasure_id: erasureId, target: this.location }, undefined, 'ERASURE_UNKNOWN');
    return set;
  }

  /** The subject's lines at or below `throughSeq` (see the interface), in one snapshot. */
  subjectLines(subject: ErasureSubject, throughSeq: number): Promise<SubjectLine[]> {
    return this.snapshot((c) => this.erasures_.subjectLines(c, subject, throughSeq));
  }

  /**
   * Reserves the batch id of erasure `erasureId`'s record (see the interface), in one durable
   * transaction holding `export_state`'s row (as planning does: no batch is planned meanwhile).
   */
  planErasureRecord(erasureId: number): Promise<number> {
    return this.tx(async (c) => {
      const pending = await this.ledger.lockPlanning(c);
      const e = await this.erasures_.get(c, erasureId, true);
      if (!e) throw new StoreError(`no erasure ${erasureId} in the mirror ${this.location}`, { erasure_id: erasureId, target: this.location }, undefined, 'ERASURE_UNKNOWN');
      const head = await this.ledger.head(c);
      if (e.archiveBatchId !== null && ((await this.ledger.recorded(c, e.archiveBatchId)) || head === undefined || e.archiveBatchId > head.batch_id)) return e.archiveBatchId;
      if (pending !== undefined) {
        throw new StoreError(`erasure ${erasureId}: export batch ${pending} is planned and not published: publish it before the erasure record`, { erasure_id: erasureId, batch_id: pending }, undefined, 'LEDGER_FENCED');
      }
      const id = await this.ledger.nextBatchId(c);
      await this.ledger.reserveBatchId(c, id);
      await this.erasures_.setArchiveBatch(c, erasureId, id);
      return id;
    }, 'durable');
  }

  /**
   * Records an erasure record in one durable transaction (see the interface): the head moved by
   * compare-and-set from the head `entry` chains on, the entry, the replaced files.
   */
  recordErasureRecord(erasureId: number, entry: LedgerEntry, files: readonly ReplacedFile[], publishedAt: string): Promise<void> {
    return this.tx(async (c) => {
      if (entry.prev_hash === null) throw new StoreError(`erasure record ${entry.batch_id} not recorded: it chains on no record. Nothing was changed`, { batch_id: entry.batch_id }, undefined, 'LEDGER_FENCED');
      const reserved = (await this.erasures_.get(c, erasureId, true))?.archiveBatchId ?? null;
      if (reserved !== entry.batch_id) {
        throw new StoreError(`erasure record ${entry.batch_id} not recorded: erasure ${erasureId} reserved batch id ${reserved ?? 'none'} for its record. Nothing was changed`, { batch_id: entry.batch_id, erasure_id: erasureId }, undefined, 'LEDGER_FENCED');
      }
      await this.ledger.recordErasure(c, entry, files, publishedAt, await this.headChainedOn(c, entry));
    }, 'durable');
  }

  // ---------------------------------------------------------------- audit (verify --deep)

  /** Streams `rows`, each step guarded; a reader that stops early releases the stream's client. */
  private async *stream<T>(rows: AsyncGenerator<T>): AsyncGenerator<T> {
    try {
      for (let r = await this.guard(() => rows.next()); !r.done; r = await this.guard(() => rows.next())) yield r.value;
    } finally {
      await rows.return(undefined);
    }
  }

  /** Every message or conversation row (tombstoned ones too), by key, with its record as served. */
  auditRecords(table: 'messages' | 'conversations'): AsyncGenerator<RecordRow> {
    return this.stream(this.audit.records(this.pool, table));
  }

  /** Every `message_history` row, by the seq of the update that replaced it. */
  auditHistory(): AsyncGenerator<HistoryRow> {
    return this.stream(this.audit.history(this.pool));
  }

  /** Every run with its status and the record its `runs` change-log row would carry now (one snapshot). */
  auditRuns(): Promise<{ id: number; status: string; accountId: string; record: string }[]> {
    return this.snapshot(async (c) => {
      const out: { id: number; status: string; accountId: string; record: string }[] = [];
      for (const r of await this.audit.runs(c)) {
        const line = (await this.runs.lineRecord(c, r.id, null))!;
        out.push({ id: r.id, status: r.status, accountId: line.accountId, record: line.record });
      }
      return out;
    });
  }

  // ---------------------------------------------------------------- reading

  /** This mirror's random id (32 hex digits), fixed at creation. */
  mirrorId(): Promise<string> {
    return this.guard(() => this.status.mirrorId(this.pool));
  }

  /** Row counts for `status`. */
  counts(): Promise<Record<string, number>> {
    return this.snapshot((c) => this.status.counts(c));
  }

  /** A `SELECT 1` on a connection of the query pool (see `Mirror.ping`). */
  async ping(): Promise<void> {
    await this.guard(() => this.pool.query('SELECT 1'));
  }

  /** Both pools' counters (see `Mirror.poolStats`): `queries` and `locks`. */
  poolStats(): PoolStats[] {
    const of = (pool: string, p: pg.Pool): PoolStats => ({ pool, total: p.totalCount, idle: p.idleCount, waiting: p.waitingCount, max: p.options.max ?? 0 });
    return [of('queries', this.pool), of('locks', this.lockPool)];
  }

  /**
   * The engine's check of what it keeps (one snapshot): the schema at this code's version, the
   * change-log counter at the highest seq, and the change log gapless from 1 to it (PostgreSQL
   * checks its own pages; `amcheck` is the tool for those).
   *
   * @returns the problems found; `[]` when all hold
   */
  quickCheck(): Promise<string[]> {
    return this.snapshot(async (c) => {
      const problems: string[] = [];
      const state = await readSchemaVersion(c, this.schema);
      if (state.version !== PG_SCHEMA_VERSION) problems.push(`schema_version is ${state.version}, not ${PG_SCHEMA_VERSION}`);
      const r = await c.query<{ last: number; max: number; n: number }>(
        `SELECT (SELECT last FROM ${qualify(this.schema, 'change_seq')} WHERE id = 1) AS last,
                (SELECT coalesce(max(seq), 0) FROM ${qualify(this.schema, 'change_log')}) AS max,
                (SELECT count(*) FROM ${qualify(this.schema, 'change_log')}) AS n`,
      );
      const { last, max, n } = r.rows[0]!;
      if (last !== max) problems.push(`change_seq.last is ${last}, but the highest change_log seq is ${max}`);
      if (n !== max) problems.push(`change_log holds ${n} rows for seqs 1 to ${max}: ${max - n} missing`);
      return problems;
    });
  }

  /** Always false: every read sees every commit. */
  snapshotChanged(): Promise<boolean> {
    return Promise.resolve(false);
  }

  /**
   * Cancels the waits for advisory locks (each rejects), then ends the pools, waiting for the
   * clients in use (a running transaction, a held lock's `fn`) to come back; a writer releases its
   * owner lock once the work pool has ended (its last transactions are in), before the lock pool
   * ends. A run still `running` then is left to the next sweep of any process
   * ({@link markInterruptedRuns}). Idempotent.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const waiting = [...this.lockWaiters.values()];
    if (waiting.length > 0) await this.pool.query('SELECT pg_cancel_backend(p) FROM unnest($1::int[]) AS p', [waiting]).catch(() => {});
    await this.pool.end();
    await this.owner?.close();
    await this.lockPool.end();
  }
}

/**
 * Opens the PostgreSQL mirror `target` (see {@link PostgresMirror.open}); the store's `openMirror`
 * calls this for a `postgres://` or `postgresql://` target.
 */
export function openPostgresMirror(target: string, opts: PostgresMirrorOptions = {}): Promise<PostgresMirror> {
  return PostgresMirror.open(target, opts);
}
