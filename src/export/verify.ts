/**
 * `verify`, the auditor's tool: the archive (an export directory) checked from its own evidence,
 * the ledger's hash chain and the files it lists, and, when the mirror's database is at hand,
 * against the mirror's records too. Read-only; follows no symlink inside the export directory;
 * works on a read-only copy, and without the database (saying which checks it could not run).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { LedgerHead, Mirror } from '../store/mirror.js';
import { readChain, type Chain } from './chain.js';
import { deepCheck } from './deep.js';
import { LEDGER_DIR, recordBodyBytes, recordPath, type LedgerRecord } from './ledger.js';
import { manifestOf, renderManifest } from './manifest.js';
import { MANIFEST, STREAM_DIRS } from './paths.js';
import { MAX_MANIFEST_BYTES, readIfPresent } from './publish-fs.js';
import { checkSignature, type PublicKey } from './signing.js';
import { DirCheck, checkListed, checkTemp, walkTree } from './verify-files.js';
import type { Check, CheckName, VerifyProblem } from './verify-types.js';

export type { Check, CheckName, VerifyProblem, VerifyProblemKind } from './verify-types.js';

/** A chain head an auditor noted: its hash, and optionally its batch id (`42:<hash>` on the command line). */
export interface HeadRef {
  batch_id?: number | undefined;
  hash: string;
}

/** Options of {@link verifyArchive}. */
export interface VerifyOptions {
  /** The export directory (absolute or relative to the current directory). */
  exportDir: string;
  /** The mirror, opened read-only; absent: the ledger and the files alone. */
  mirror?: Mirror | undefined;
  /** Check every record's signature with this key; absent: signatures are counted, not checked. */
  publicKey?: PublicKey | undefined;
  /** Also prove the archive still holds, unchanged, everything up to this head. */
  head?: HeadRef | undefined;
  /** Also replay every export line and compare with the mirror's rows (needs `mirror`). */
  deep?: boolean | undefined;
}

/** What {@link verifyArchive} found. */
export interface ArchiveReport {
  /** Absolute export directory. */
  exportDir: string;
  /** Every check, run or skipped, in order. */
  checks: Check[];
  /** Every problem found, by check. */
  problems: VerifyProblem[];
  /** The last record of the unbroken chain from genesis: the head this archive proves. */
  head: LedgerHead | undefined;
  /** Batch records, files and lines the chain lists (records that read back sound). */
  records: number;
  files: number;
  lines: number;
  /** Records carrying a signature. */
  signed: number;
}

/** Collects problems by check, and the checks' verdicts. */
class Report {
  readonly checks: Check[] = [];
  readonly problems: VerifyProblem[] = [];

  /** Records check `name`: `failed` with `found` when there are any, else `ok` with `detail`. */
  add(name: CheckName, found: VerifyProblem[], detail: string): void {
    this.problems.push(...found);
    this.checks.push({ name, status: found.length ? 'failed' : 'ok', detail: found.length ? `${found.length} problem${found.length === 1 ? '' : 's'}` : detail });
  }

  skip(name: CheckName, why: string): void {
    this.checks.push({ name, status: 'skipped', detail: why });
  }
}

const short = (h: LedgerHead | undefined): string => (h ? `${h.batch_id}:${h.hash}` : 'none');

/**
 * Verifies an archive; see the module comment. In order:
 * 1. `database`: `PRAGMA quick_check` of the mirror (skipped without it);
 * 2. `ledger`: every batch record reads back (shape, hash) and the chain holds from genesis to head;
 * 3. `files`: every file a record lists is a regular file with its size, line count and SHA-256;
 * 4. `unlisted`: nothing in `messages/`, `conversations/`, `runs/` or `_ledger/` that no record lists;
 * 5. `manifest`: `manifest.json` points at the head (the mirror's head, with the database);
 * 6. `signatures`: with a public key, every record is signed by it (else counted, skipped);
 * 7. `head`: with `head`, that record is in the chain, and nothing up to it is broken or changed;
 * 8. `mirror`: with the database, the mirror's ledger and the chain on disk are the same records
 *    (a truncated archive shows here);
 * 9. `deep`: with `deep`, every export line replayed in seq order against the mirror's rows;
 * 10. `temp`: `.convo-mirror-tmp/` is empty.
 * A missing export directory is fine only when the mirror says nothing was ever published.
 *
 * @throws {@link MirrorUnusableError} when the mirror cannot be read (the CLI reports it as a
 *   database problem)
 */
export function verifyArchive(o: VerifyOptions): ArchiveReport {
  const root = path.resolve(o.exportDir);
  const report = new Report();
  const mirror = o.mirror;
  if (mirror) {
    const qc = mirror.quickCheck();
    report.add('database', qc.map((p) => ({ path: mirror.file, problem: 'mirror', detail: `quick_check: ${p}` })), `quick_check ok (${mirror.file})`);
  } else report.skip('database', 'no database: checked from the ledger and the files alone');

  let rootStat: fs.Stats | undefined;
  try {
    rootStat = fs.statSync(root); // the export directory itself may be a symlink: the operator's choice
  } catch {
    rootStat = undefined;
  }
  if (!rootStat?.isDirectory()) {
    const published = mirror ? mirror.exportTotals().everPublished || mirror.ledgerHead() !== undefined : true;
    const why = rootStat ? `${root} is not a directory` : `${root} does not exist`;
    if (published) report.add('ledger', [{ path: MANIFEST, problem: 'missing', detail: why }], '');
    else report.add('ledger', [], `nothing published yet (${why})`);
    return { exportDir: root, checks: report.checks, problems: report.problems, head: undefined, records: 0, files: 0, lines: 0, signed: 0 };
  }

  const chain = readChain(root, mirror?.mirrorId());
  checkLedger(report, chain, mirror);
  const listed = checkFiles(report, root, chain);
  checkManifest(report, root, chain, mirror);
  checkSignatures(report, chain.records, o.publicKey);
  if (o.head) checkHead(report, chain, o.head, listed);
  else report.skip('head', 'no --head given');
  if (mirror) checkMirror(report, chain, mirror);
  else report.skip('mirror', 'no database');
  if (o.deep && mirror) report.add('deep', deepCheck(mirror, root, chain.records), 'every export line replayed in seq order matches the mirror: live rows, tombstones, message history and runs');
  else report.skip('deep', o.deep ? 'needs the database' : 'not asked (--deep)');
  report.add('temp', checkTemp(root), 'no leftovers of an interrupted publication');
  const files = chain.records.reduce((n, r) => n + r.files.length, 0);
  const lines = chain.records.reduce((n, r) => n + r.files.reduce((m, f) => m + f.lines, 0), 0);
  const signed = chain.records.filter((r) => r.signature !== undefined).length;
  return { exportDir: root, checks: report.checks, problems: report.problems, head: chain.head, records: chain.records.length, files, lines, signed };
}

/** The chain's own problems, records not rendered canonically, and an empty ledger where there should be one. */
function checkLedger(report: Report, chain: Chain, mirror: Mirror | undefined): void {
  const found = chain.problems.filter((p) => p.problem !== 'unlisted');
  for (const rel of chain.formatting) found.push({ path: rel, problem: 'record', detail: 'its content is intact but its bytes are not the canonical rendering (edited by hand?)' });
  if (chain.records.length === 0 && found.length === 0 && mirror && (mirror.ledgerHead() || mirror.exportTotals().everPublished)) {
    const detail = mirror.ledgerGenesis()
      ? 'no batch record: these exports were published before the ledger existed; the next sync writes their genesis record'
      : 'no batch record, yet the mirror published';
    found.push({ path: LEDGER_DIR, problem: 'missing', detail });
  }
  const n = chain.records.length;
  report.add('ledger', found, n === 0 ? 'no batch record: nothing published yet' : `${n} record${n === 1 ? '' : 's'}, chained from genesis to head ${short(chain.head)}`);
}

/**
 * Every file the sound records list against its record, then what lies in the partition trees and
 * `_ledger/` that no record lists.
 *
 * @returns the batch listing each file
 */
function checkFiles(report: Report, root: string, chain: Chain): Map<string, number> {
  const records = chain.records;
  const listed = new Map<string, number>();
  const found: VerifyProblem[] = [];
  const dirs = new DirCheck(root);
  let lines = 0;
  for (const r of records) {
    for (const f of r.files) {
      const other = listed.get(f.path);
      if (other !== undefined) {
        found.push({ path: f.path, problem: 'record', detail: `listed by batch ${other} and again by batch ${r.batch_id}` });
        continue;
      }
      listed.set(f.path, r.batch_id);
      lines += f.lines;
      found.push(...checkListed(root, dirs, f));
    }
  }
  report.add('files', found, `${listed.size} files, ${lines} lines: sizes, line counts and SHA-256 as recorded`);
  const unlisted: VerifyProblem[] = chain.problems.filter((p) => p.problem === 'unlisted');
  for (const stream of STREAM_DIRS) {
    for (const e of walkTree(root, stream)) {
      if (listed.has(e.rel) || chain.suspectPaths.has(e.rel)) continue;
      unlisted.push(e.kind === 'regular file' ? { path: e.rel, problem: 'unlisted' } : { path: e.rel, problem: 'unlisted', detail: e.kind === 'symbolic link' ? 'symbolic link, not followed' : e.kind });
    }
  }
  report.add('unlisted', unlisted, `nothing in ${STREAM_DIRS.join('/, ')}/ or ${LEDGER_DIR}/ that no record lists`);
  return listed;
}

/** `manifest.json` against the head: the mirror's (with the database), else the last record on disk. */
function checkManifest(report: Report, root: string, chain: Chain, mirror: Mirror | undefined): void {
  const last = chain.records.at(-1);
  const mirrorId = mirror?.mirrorId() ?? last?.mirror_id;
  let bytes: Buffer | undefined;
  try {
    bytes = readIfPresent(path.join(root, MANIFEST), MAX_MANIFEST_BYTES);
  } catch (err) {
    report.add('manifest', [{ path: MANIFEST, problem: 'not-regular', detail: (err as Error).message }], '');
    return;
  }
  if (bytes === undefined || mirrorId === undefined) {
    report.add('manifest', bytes === undefined && last ? [{ path: MANIFEST, problem: 'missing' }] : [], 'nothing published: no manifest needed');
    return;
  }
  const expected = mirror
    ? manifestOf(mirrorId, mirror.ledgerHead(), mirror.exportWatermark())
    : manifestOf(mirrorId, last ? { batch_id: last.batch_id, hash: last.hash } : undefined, last?.last_seq ?? 0);
  if (bytes.equals(renderManifest(expected))) {
    report.add('manifest', [], `points at head ${short(expected.head ?? undefined)}, watermark ${expected.watermark}`);
    return;
  }
  let detail: string;
  try {
    const got = JSON.parse(bytes.toString('utf8')) as { version?: unknown; head?: { batch_id?: unknown; hash?: unknown } | null; watermark?: unknown };
    detail =
      got.version !== 2
        ? `version ${JSON.stringify(got.version)}, expected 2 (the next sync rewrites it)`
        : `points at head ${JSON.stringify(got.head ?? null)} with watermark ${JSON.stringify(got.watermark)}; expected head ${short(expected.head ?? undefined)}, watermark ${expected.watermark}`;
  } catch {
    detail = 'not JSON';
  }
  report.add('manifest', [{ path: MANIFEST, problem: 'manifest', detail }], '');
}

/** With a key, every record signed by it; without, the signatures counted. */
function checkSignatures(report: Report, records: LedgerRecord[], key: PublicKey | undefined): void {
  const signed = records.filter((r) => r.signature !== undefined).length;
  if (!key) {
    report.skip(
      'signatures',
      signed === 0 ? `the ${records.length} records are unsigned (no signing key when they were published)` : `${signed} of ${records.length} records signed; pass --public-key FILE to check them`,
    );
    return;
  }
  const found: VerifyProblem[] = [];
  for (const r of records) {
    const rel = recordPath(r.batch_id);
    if (!r.signature) {
      found.push({ path: rel, problem: 'unsigned', detail: 'published without a signing key' });
      continue;
    }
    const verdict = checkSignature(recordBodyBytes(r), r.signature, key);
    if (verdict === 'wrong-key') found.push({ path: rel, problem: 'signature', detail: `signed by key ${r.signature.key_id}, not ${key.keyId}` });
    else if (verdict !== 'valid') found.push({ path: rel, problem: 'signature', detail: verdict === 'invalid' ? 'the signature does not verify: the record or its signature was forged' : 'malformed signature' });
  }
  report.add('signatures', found, `all ${records.length} records signed by ${key.keyId}`);
}

/** The head an auditor noted is in the chain, and nothing up to it is broken or changed. */
function checkHead(report: Report, chain: Chain, head: HeadRef, listed: Map<string, number>): void {
  const shown = `${head.batch_id === undefined ? '' : `${head.batch_id}:`}${head.hash}`;
  const r = chain.records.find((x) => x.hash === head.hash && (head.batch_id === undefined || x.batch_id === head.batch_id));
  if (!r) {
    report.add('head', [{ path: LEDGER_DIR, problem: 'head', detail: `no record of this archive is ${shown} (its chain ends at ${short(chain.head)}): it was truncated, or altered up to that head` }], '');
    return;
  }
  let firstBad = chain.brokenAt;
  for (const p of report.problems) {
    const batch = listed.get(p.path);
    if (batch !== undefined && ['missing', 'not-regular', 'size', 'sha256', 'lines'].includes(p.problem)) firstBad = Math.min(firstBad ?? batch, batch);
  }
  if (firstBad !== undefined && firstBad <= r.batch_id) {
    report.add('head', [{ path: recordPath(r.batch_id), problem: 'head', detail: `head ${shown} is in the chain, but batch ${firstBad} before it is broken or its files changed` }], '');
    return;
  }
  report.add('head', [], `head ${shown} is in the chain, which is unbroken and unchanged from genesis to it (append-only since)`);
}

/** The mirror's ledger entries and the records on disk are the same, batch for batch. */
function checkMirror(report: Report, chain: Chain, mirror: Mirror): void {
  const onDisk = new Map(chain.records.map((r) => [r.batch_id, r]));
  const found: VerifyProblem[] = [];
  const entries = mirror.ledgerEntries();
  const known = new Set<number>();
  for (const e of entries) {
    known.add(e.batch_id);
    const r = onDisk.get(e.batch_id);
    if (!r) found.push({ path: e.path, problem: 'mirror', detail: `the mirror recorded batch ${e.batch_id} (hash ${e.hash}); the archive has no sound record of it: removed, truncated or damaged` });
    else if (r.hash !== e.hash) found.push({ path: e.path, problem: 'mirror', detail: `the mirror recorded hash ${e.hash}, the archive's record hashes to ${r.hash}` });
  }
  const planned = mirror.pendingExportBatch();
  for (const r of chain.records) {
    if (known.has(r.batch_id)) continue;
    const detail = planned === r.batch_id ? 'left by an interrupted publication; the next sync records it' : 'not in the mirror\'s ledger';
    found.push({ path: recordPath(r.batch_id), problem: 'mirror', detail });
  }
  const head = entries.at(-1);
  report.add('mirror', found, `the mirror's ledger (${entries.length} records, head ${short(head)}) is the archive's`);
}

/**
 * The archive's problems against a mirror ({@link verifyArchive} with the database, without the
 * database's own `quick_check` findings): what tests and callers that only need the verdict use.
 */
export function verifyExports(mirror: Mirror, exportDir: string): VerifyProblem[] {
  return verifyArchive({ exportDir, mirror }).problems.filter((p) => !(p.problem === 'mirror' && p.path === mirror.file));
}
