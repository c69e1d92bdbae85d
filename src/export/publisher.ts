/**
 * Where and how a run publishes ({@link PublishSettings}), built once from the configuration, and
 * the {@link Publisher} that publishes during a long run, every `publishIntervalMs`, so a
 * multi-hour backfill reaches the exports progressively. A batch is planned in one transaction
 * after whole transactions, so it never splits a page's; batches stay exactly-once (see
 * `publishChanges`, which also runs one publication of a mirror at a time in a process).
 */
import type { Logger } from 'pino';
import type { Clock } from '../clock.js';
import { describeError } from '../errors.js';
import { fileModes, type FileModes } from '../private-fs.js';
import type { Mirror } from '../store/mirror.js';
import { publishChanges, type ExportResult } from './exporter.js';
import { loadSigningKey, type SigningKey } from './signing.js';
import type { RetentionPolicy } from '../../config/retention.js';

/** Where and how changes are published. */
export interface PublishSettings {
  /** Root directory of the JSONL exports. */
  exportDir: string;
  /** Modes of the directories created (files: the same without write bits). @defaultValue PRIVATE_MODES (0700; files 0400) */
  modes?: FileModes | undefined;
  /** Write new batches as `.jsonl.gz`. @defaultValue false */
  gzip?: boolean | undefined;
  /** Sign each batch record and the head. @defaultValue unsigned */
  signingKey?: SigningKey | undefined;
  /** Append each new signed head to the witness file in this directory (`CONVO_MIRROR_WITNESS_DIR`). @defaultValue no witness */
  witnessDir?: string | undefined;
  /** During a run, publish every this many ms; undefined: only at the end. */
  publishIntervalMs?: number | undefined;
  /**
   * During a run, also publish as soon as this many changes wait in the change log (every
   * process' commits counted: the mirror's own count, read at most once per
   * {@link PUBLISH_LINES_CHECK_MS}), so batches stay bounded and a run's end publishes little.
   * 0 or undefined: by time only.
   */
  publishLines?: number | undefined;
  /**
   * Hold the line of a run that changed nothing until the next publication with changes or the
   * end of its heartbeat window, ms (see `ExportOptions.runsHeartbeatMs`). @defaultValue undefined (never held)
   */
  runsHeartbeatMs?: number | undefined;
  /** Expire and delete published files older than this (`CONVO_MIRROR_RETENTION`; see `ExportOptions.retention`). @defaultValue undefined (keep everything) */
  retention?: RetentionPolicy | undefined;
}

/** The settings {@link publishSettingsFromConfig} reads (the `Config` fields of the same names). */
export interface PublishConfig {
  exportDir: string;
  groupReadable: boolean;
  exportGzip: boolean;
  publishIntervalMs: number;
  publishLines: number;
  runsHeartbeatMs: number;
  signingKeyFile: string | undefined;
  witnessDir: string | undefined;
  retention: RetentionPolicy | undefined;
  /** `CONVO_MIRROR_PRUNE_MIRROR`: sets {@link RetentionPolicy.pruneMirror}. @defaultValue false */
  pruneMirror?: boolean;
}

/**
 * The publish settings of a configuration; loads the signing key, if any (a key readable by others
 * is logged as a warning).
 *
 * @throws {@link ConfigError} (`CONVO_MIRROR_SIGNING_KEY_FILE`) when the key cannot be used
 */
export function publishSettingsFromConfig(config: PublishConfig, logger?: Logger): PublishSettings {
  const signingKey = config.signingKeyFile === undefined ? undefined : loadSigningKey(config.signingKeyFile);
  if (signingKey?.warning) logger?.warn({ file: signingKey.file }, signingKey.warning);
  return {
    exportDir: config.exportDir,
    modes: fileModes(config.groupReadable),
    gzip: config.exportGzip,
    signingKey,
    witnessDir: config.witnessDir,
    publishIntervalMs: config.publishIntervalMs,
    publishLines: config.publishLines,
    runsHeartbeatMs: config.runsHeartbeatMs,
    retention: config.retention && config.pruneMirror === true ? { ...config.retention, pruneMirror: true } : config.retention,
  };
}

/** How often {@link Publisher.maybePublish} counts the changes waiting, at most, ms. */
export const PUBLISH_LINES_CHECK_MS = 1000;

/**
 * Publishes with fixed settings: now, or during a run when the interval has passed since its last
 * publication or enough changes wait ({@link PublishSettings.publishLines}).
 */
export class Publisher {
  private last: number;
  private lastCount: number;
  /** The progressive publication in flight, if any (a second one is not queued behind it). */
  private progressive: Promise<ExportResult | undefined> | undefined;
  private readonly totals = { files: 0, lines: 0 };

  /**
   * @param o.runId - the run recorded on the batches it plans
   */
  constructor(
    private readonly mirror: Mirror,
    private readonly settings: PublishSettings,
    private readonly o: { clock: Clock; logger?: Logger | undefined; runId: number | null },
  ) {
    this.last = o.clock.now();
    this.lastCount = this.last;
  }

  /**
   * Publishes every change not yet exported; run lines alone wait as {@link PublishSettings.runsHeartbeatMs}
   * says, unless `o.runLines` is `now`.
   *
   * @param o.runLines - `now`: publish waiting run lines too (a run that changed something
   *   publishes its own line at once). @defaultValue `hold`
   * @throws what `publishChanges` throws
   */
  async publish(o: { runLines?: 'hold' | 'now'; publisherWaitMs?: number } = {}): Promise<ExportResult> {
    this.last = this.o.clock.now();
    const s = this.settings;
    const r = await publishChanges(this.mirror, {
      exportDir: s.exportDir,
      runId: this.o.runId,
      clock: this.o.clock,
      logger: this.o.logger,
      ...(s.modes ? { modes: s.modes } : {}),
      ...(s.gzip ? { gzip: true } : {}),
      ...(s.signingKey ? { signingKey: s.signingKey } : {}),
      ...(o.runLines !== 'now' && s.runsHeartbeatMs ? { runsHeartbeatMs: s.runsHeartbeatMs } : {}),
      ...(s.witnessDir !== undefined ? { witnessDir: s.witnessDir } : {}),
      ...(s.retention !== undefined ? { retention: s.retention } : {}),
      ...(o.publisherWaitMs !== undefined ? { publisherWaitMs: o.publisherWaitMs } : {}),
    });
    this.totals.files += r.files.length;
    this.totals.lines += r.lines;
    return r;
  }

  /** Data files and lines this publisher has published so far, all its publications together. */
  get published(): { files: number; lines: number } {
    return { ...this.totals };
  }

  /**
   * {@link publish} during a run, when it is due: `publishIntervalMs` has passed since the last
   * publication (or since this publisher was made), or at least `publishLines` changes wait (counted
   * at most once per {@link PUBLISH_LINES_CHECK_MS}). It never waits for another process that holds
   * the publisher lock (those changes go out with that publication or the next), nor queues behind
   * a progressive publication of its own in flight. Never rejects: a failure is logged and left to
   * the run's final publication, which reports it.
   *
   * @returns what was published, when it was due and succeeded
   */
  async maybePublish(): Promise<ExportResult | undefined> {
    if (this.progressive) return undefined;
    this.progressive = this.publishIfDue();
    try {
      return await this.progressive;
    } finally {
      this.progressive = undefined;
    }
  }

  /** {@link maybePublish} without its guard. */
  private async publishIfDue(): Promise<ExportResult | undefined> {
    try {
      if (!(await this.due())) return undefined;
      return await this.publish({ publisherWaitMs: 0 });
    } catch (err) {
      this.o.logger?.warn({ err: describeError(err) }, 'progressive publication failed; the run publishes again when it ends');
      return undefined;
    }
  }

  /** Whether a progressive publication is due (see {@link maybePublish}). */
  private async due(): Promise<boolean> {
    const now = this.o.clock.now();
    const every = this.settings.publishIntervalMs;
    if (every !== undefined && now - this.last >= every) return true;
    const lines = this.settings.publishLines;
    if (!lines || now - this.lastCount < PUBLISH_LINES_CHECK_MS) return false;
    this.lastCount = now;
    return (await this.mirror.unexportedChanges()) >= lines;
  }
}
