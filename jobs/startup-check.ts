/**
 * The daemon checks each workspace before it says ready: one request (the first page of the
 * conversation list) with a client that fails fast at first contact and does not retry, so a wrong
 * base URL or a refused key is reported by workspace at once. When no workspace can be mirrored
 * (every one refused for its configuration or key) the daemon does not start (the CLI exits 2).
 * A check that fails for a transient reason (a timeout, a 503) is repeated every
 * {@link RECHECK_MS} until it passes; `/readyz` answers 503 with the reasons until one workspace has
 * passed.
 */
import type { Logger } from 'pino';
import { baseUrlSettingOf, type Config, type Workspace } from '../config/index.js';
import { checkClientFromConfig, type ApiClientOptions } from '../src/api/client.js';
import { AuthError, ConfigError, describeError } from '../src/errors.js';
import { DEFAULT_ACCOUNT } from '../src/store/mirror.js';

/** How long a failed transient check waits before it is tried again, ms. */
export const RECHECK_MS = 30_000;
/** The longest one check's request may take, ms (CONVO_MIRROR_REQUEST_TIMEOUT when shorter). */
export const STARTUP_CHECK_TIMEOUT_MS = 8_000;

/** One workspace's check: `passed`, `unusable` (its configuration or key is refused: not retried) or `failing` (retried). */
export interface WorkspaceCheck {
  accountId: string;
  state: 'pending' | 'passed' | 'unusable' | 'failing';
  /** Why it failed, in words (never a key); empty when passed. */
  detail: string;
}

/** Checks one workspace: the first page of its conversation list. Throws what the request threw. */
export type CheckOne = (config: Config, workspace: Workspace, onAttempt?: ApiClientOptions['onAttempt'], signal?: AbortSignal) => Promise<void>;

/** The default {@link CheckOne}: one request, failing fast at first contact, no retries. */
export const firstListPage: CheckOne = async (config, workspace, onAttempt, signal) => {
  const api = checkClientFromConfig({ ...config, ...workspace }, STARTUP_CHECK_TIMEOUT_MS, { baseUrlSetting: baseUrlSettingOf(config, workspace), onAttempt, signal });
  const pages = api.conversations();
  try {
    await pages.next();
  } finally {
    await pages.return(undefined).catch(() => undefined);
    await api.close();
  }
};

/** The workspaces' start-up checks, their re-checks, and the readiness they give. */
export class WorkspaceChecks {
  private readonly checks = new Map<string, WorkspaceCheck>();
  /** Each workspace's last failure, rethrown as is when it is the only workspace and unusable. */
  private readonly lastError = new Map<string, unknown>();
  private timer: NodeJS.Timeout | undefined;
  /** Aborted by {@link stop}: a check in flight ends at once (shutdown does not wait for it). */
  private readonly abort = new AbortController();

  /**
   * @param attemptHook - the workspace's request observer (the daemon's metrics count the check's request too)
   * @param checkOne - how one workspace is checked (tests inject one) @defaultValue {@link firstListPage}
   * @param recheckMs - wait before a failing check is tried again, ms @defaultValue {@link RECHECK_MS}
   */
  constructor(
    private readonly config: Config,
    private readonly logger: Logger,
    private readonly attemptHook: (accountId: string) => ApiClientOptions['onAttempt'] = () => undefined,
    private readonly checkOne: CheckOne = firstListPage,
    private readonly recheckMs = RECHECK_MS,
  ) {
    for (const w of config.workspaces) this.checks.set(w.accountId ?? DEFAULT_ACCOUNT, { accountId: w.accountId ?? DEFAULT_ACCOUNT, state: 'pending', detail: '' });
  }

  /** Every workspace's check, in configured order. */
  get states(): WorkspaceCheck[] {
    return [...this.checks.values()].map((c) => ({ ...c }));
  }

  /**
   * Checks every workspace at once; logs each one that fails, by workspace; schedules re-checks of
   * the transient failures.
   *
   * @throws the workspace's own error ({@link ConfigError}, {@link AuthError}) when the only one is
   *   unusable; a {@link ConfigError} naming each when several are configured and none is usable
   */
  async initial(): Promise<void> {
    await Promise.all(this.config.workspaces.map((w) => this.checkWorkspace(w)));
    const all = this.states;
    if (all.every((c) => c.state === 'unusable')) {
      if (all.length === 1) throw this.lastError.get(all[0]!.accountId);
      const list = all.map((c) => `account ${c.accountId}: ${c.detail}`).join('; ');
      throw new ConfigError(this.config.workspacesFile !== undefined ? 'CONVO_MIRROR_WORKSPACES' : 'CONVO_MIRROR_ACCOUNT_ID', `no workspace can be mirrored: ${list}`);
    }
    this.armRecheck();
  }

  /** `/readyz`'s check: passes once any workspace has passed; else throws the reasons, by workspace. */
  assertReady(): void {
    const all = this.states;
    if (all.some((c) => c.state === 'passed')) return;
    throw new Error(all.map((c) => `account ${c.accountId}: ${c.state === 'pending' ? 'not checked yet' : c.detail}`).join('; '));
  }

  /** Stops the checks: one in flight is aborted, none is started again (shutdown). */
  stop(): void {
    this.abort.abort(new Error('daemon shutting down'));
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  /**
   * Checks one workspace. Only the first check may find it unusable: a re-check that fails for any
   * reason leaves it failing (the API may be restarting: nothing listening for a moment).
   */
  private async checkWorkspace(w: Workspace, recheck = false): Promise<void> {
    const accountId = w.accountId ?? DEFAULT_ACCOUNT;
    try {
      await this.checkOne(this.config, w, this.attemptHook(accountId), this.abort.signal);
      const was = this.checks.get(accountId)?.state;
      this.checks.set(accountId, { accountId, state: 'passed', detail: '' });
      if (was === 'failing') this.logger.info({ account_id: accountId }, 'workspace check passed');
    } catch (err) {
      if (this.abort.signal.aborted) return;
      const unusable = !recheck && (err instanceof ConfigError || err instanceof AuthError);
      this.lastError.set(accountId, err);
      this.checks.set(accountId, { accountId, state: unusable ? 'unusable' : 'failing', detail: describeError(err) });
      this.logger.error(
        { account_id: accountId, err: describeError(err) },
        unusable ? 'workspace check failed: its configuration or key is refused; its jobs will fail until that is fixed' : `workspace check failed; trying again in ${this.recheckMs / 1000} s`,
      );
    }
  }

  /** Re-checks the failing workspaces every {@link recheckMs} until each passes (or shutdown). */
  private armRecheck(): void {
    const failing = this.config.workspaces.filter((w) => this.checks.get(w.accountId ?? DEFAULT_ACCOUNT)?.state === 'failing');
    if (this.abort.signal.aborted || failing.length === 0) return;
    this.timer = setTimeout(() => {
      void Promise.all(failing.map((w) => this.checkWorkspace(w, true))).then(() => this.armRecheck());
    }, this.recheckMs);
    this.timer.unref();
  }
}
