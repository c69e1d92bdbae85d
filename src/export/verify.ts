/**
 * `verify`, the auditor's tool: the archive (an export directory) checked from its own evidence,
 * the ledger's hash chain and the files it lists, and, when the mirror's database is at hand,
 * against the mirror's records too; with a public key, the signatures of every record and of the
 * head; with a witness, every head the witness saw; the signed head's age. Read-only; follows no
 * symlink inside the export directory; works on a read-only copy, and without the database (saying
 * which checks it could not run). Each check gives its own verdict ({@link Check}), and the archive
 * is intact only when none failed ({@link archiveVerdict}).
 */
import fs from 'node:fs';
import path from 'node:path';
import { formatDuration } from '../../config/duration.js';
import { systemClock, type Clock } from '../clock.js';
import type { LedgerHead, Mirror } from '../store/mirror.js';
import { readChain, type Chain } from './chain.js';
import { deepCheck } from './deep.js';
import { checkHeadSignature, type SignedHead } from './head.js';
import { LEDGER_DIR, isBatchRecord, recordBodyBytes, recordPath, type AnyRecord, type LedgerRecord } from './ledger.js';
import { fileStates, type ErasureSummary, type FileStates, type RetentionSummary } from './file-states.js';
import { readManifest, type ReadManifest } from './manifest.js';
import { MANIFEST, STREAM_DIRS } from './paths.js';
import { MAX_MANIFEST_BYTES, readIfPresent } from './publish-fs.js';
import { checkSignature, type PublicKey, type SignatureCheck } from './signing.js';
import { DirCheck, checkErased, checkListed, checkTemp, walkTree } from './verify-files.js';
import type { Check, CheckName, VerifyProblem } from './verify-types.js';
import { readWitnessLines, witnessFile } from './witness.js';

export type { Check, CheckName, VerifyProblem, VerifyProblemKind } from './verify-types.js';
export type { ErasureSummary, RetentionSummary } from './file-states.js';

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
  /**
   * Check every record's signature, and the signed head's (`manifest.json`, witness lines), with
   * this key; absent: signatures are counted, not checked, and a head's time is only claimed.
   */
  publicKey?: PublicKey | undefined;
  /**
   * With `publicKey`: records of batches before this one may be unsigned (an archive that began
   * unsigned; accepted and reported); from this batch on every record must be signed by the key.
   * @defaultValue every record must be signed
   */
  signedFrom?: number | undefined;
  /** Also prove the archive still holds, unchanged, everything up to this head. */
  head?: HeadRef | undefined;
  /**
   * The head witness's directory (`verify --witness`): its `<mirror id>.heads.jsonl` is read, and
   * the archive must still hold, unbroken and unchanged, everything up to every head it saw.
   */
  witnessDir?: string | undefined;
  /**
   * Fail when the newest signed head (of `manifest.json` and, with `witnessDir`, the witness) was
   * signed longer ago than this, ms. With `publicKey` only heads whose signature verifies count;
   * without, the time compared is only claimed (the report says so). @defaultValue no limit
   */
  maxAgeMs?: number | undefined;
  /** Also replay every export line and compare with the mirror's rows (needs `mirror`). */
  deep?: boolean | undefined;
  /** The clock the head's age is measured with. @defaultValue the system clock */
  clock?: Clock | undefined;
  /**
   * Test hook (a failpoint): called (and awaited) at `chain-read`, once the archive's chain is read and before
   * the witness file is (a publication then lands between the two). Never set in production.
   */
  failpoint?: ((point: 'chain-read') => void | Promise<void>) | undefined;
}

/** The newest signed head {@link verifyArchive} found: the one whose age it reports. */
export interface NewestSignedHead {
  /** Its chain head (`null`: nothing was published yet when it was signed). */
  head: LedgerHead | null;
  /** When it was signed, ISO 8601 UTC. */
  signed_at: string;
  /** Now minus `signed_at`, ms (negative: signed in the future). */
  age_ms: number;
  /** True when its signature was checked with the public key; false: its time is only claimed. */
  authenticated: boolean;
  /** Where it was found: `manifest.json`, or the witness file and line. */
  source: string;
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
  /**
   * The erasure records of the chain (src/export/erasure.ts), each with its erasure (id, kind,
   * account, reason, time) and the files and lines it erased; empty when there is none.
   */
  erasures: ErasureSummary[];
  /**
   * The retention records of the chain (src/export/retention.ts), each with its policy, cutoff and
   * time, and the files and lines it expired; empty when there is none.
   */
  retentions: RetentionSummary[];
  /** Files a retention record expired that are still in the export directory (a note: the next publication removes them). */
  expiredPresent: string[];
  /**
   * Files rewritten by an erasure record whose original record is of version 1 (no Merkle root):
   * erased without line proof, their bytes proven by the erasure record's SHA-256 alone.
   */
  erasedWithoutLineProof: string[];
  /** The newest signed head with a time (see {@link VerifyOptions.maxAgeMs}), if any. */
  newestSignedHead: NewestSignedHead | undefined;
  /** One line: `archive intact: …` or `NOT intact: <check> FAILED (…), …` ({@link archiveVerdict}). */
  verdict: string;
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

const short = (h: LedgerHead | undefined | null): string => (h ? `${h.batch_id}:${h.hash}` : 'none');

/** `records 3–7` / `record 3`. */
const span = (from: number, to: number): string => (from === to ? `record ${from}` : `records ${from}–${to}`);

/**
 * The archive's verdict in one line: `archive intact: <records>, <files>, <lines>; head <id:hash>`
 * (and the checks skipped) when no check failed, else `NOT intact: <check> FAILED (<n> problems),
 * …; everything else ok or skipped`. Never says intact when any check failed.
 */
export function archiveVerdict(r: Pick<ArchiveReport, 'checks' | 'records' | 'files' | 'lines' | 'head'> & { retentions?: readonly RetentionSummary[] }): string {
  const failed = r.checks.filter((c) => c.status === 'failed');
  if (failed.length > 0) return `NOT intact: ${failed.map((c) => `${c.name} FAILED (${c.detail})`).join(', ')}; everything else ok or skipped`;
  const skipped = r.checks.filter((c) => c.status === 'skipped').map((c) => c.name);
  const expiredFiles = (r.retentions ?? []).reduce((n, e) => n + e.files, 0);
  const expiredLines = (r.retentions ?? []).reduce((n, e) => n + e.lines, 0);
  const expired = expiredFiles > 0 ? ` (${expiredFiles} files, ${expiredLines} lines of them expired by retention)` : '';
  return `archive intact: ${r.records} records, ${r.files} files, ${r.lines} lines${expired}; head ${short(r.head)}${skipped.length ? `; not checked: ${skipped.join(', ')}` : ''}`;
}

/**
 * Verifies an archive; see the module comment. In order:
 * 1. `database`: the engine's check of the mirror's storage (`Mirror.quickCheck`: SQLite's `PRAGMA quick_check`; PostgreSQL's schema version and change-log counter), skipped without it;
 * 2. `chain`: every batch record reads back (shape, hash) and the chain holds from genesis to head;
 * 3. `files`: every file a record lists is a regular file with its size, line count and SHA-256,
 *    and (records of version 2) the Merkle tree hash of its lines;
 * 4. `unlisted`: nothing in `messages/`, `conversations/`, `runs/` or `_ledger/` that no record lists;
 * 5. `manifest`: `manifest.json` is a signed head (version 3; 2 and 1 are read) pointing at the
 *    head (the mirror's head, with the database; else the last record on disk);
 * 6. `signatures`: with a public key, every record (from `signedFrom` on) and the head pointer are
 *    signed by it (else counted, skipped);
 * 7. `head`: with `head`, that record is in the chain, and nothing up to it is broken or changed;
 * 8. `witness`: with `witnessDir`, every witnessed head is well formed, in order, this mirror's,
 *    signed by the key (with one), and still held by the archive, unbroken and unchanged;
 * 9. `age`: how long ago the newest signed head was signed, and with `maxAgeMs` whether that is
 *    too long (skipped when no head carries a time);
 * 10. `mirror`: with the database, the mirror's ledger and the chain on disk are the same records
 *    (a truncated archive shows here);
 * 11. `deep`: with `deep`, every export line replayed in seq order against the mirror's rows;
 * 12. `temp`: `.convo-mirror-tmp/` is empty.
 * A missing export directory is fine only when the mirror says nothing was ever published.
 *
 * @throws {@link MirrorUnusableError} when the mirror cannot be read (the CLI reports it as a
 *   database problem)
 */
export async function verifyArchive(o: VerifyOptions): Promise<ArchiveReport> {
  const root = path.resolve(o.exportDir);
  const report = new Report();
  const mirror = o.mirror;
  if (mirror) {
    const qc = await mirror.quickCheck();
    // SQLite: PRAGMA quick_check; PostgreSQL: the schema version and the change log's counter.
    const check = mirror.engine === 'sqlite' ? 'quick_check' : 'consistency check';
    report.add('database', qc.map((p) => ({ path: mirror.location, problem: 'mirror', detail: `${check}: ${p}` })), `${check} ok (${mirror.location})`);
  } else report.skip('database', 'no database: checked from the ledger and the files alone');

  let rootStat: fs.Stats | undefined;
  try {
    rootStat = fs.statSync(root); // the export directory itself may be a symlink: the operator's choice
  } catch {
    rootStat = undefined;
  }
  if (!rootStat?.isDirectory()) {
    const published = mirror ? (await mirror.exportTotals()).everPublished || (await mirror.ledgerHead()) !== undefined : true;
    const why = rootStat ? `${root} is not a directory` : `${root} does not exist`;
    if (published) report.add('chain', [{ path: MANIFEST, problem: 'missing', detail: why }], '');
    else report.add('chain', [], `nothing published yet (${why})`);
    const empty = { exportDir: root, checks: report.checks, problems: report.problems, head: undefined, records: 0, files: 0, lines: 0, signed: 0, erasures: [], retentions: [], expiredPresent: [], erasedWithoutLineProof: [], newestSignedHead: undefined };
    return { ...empty, verdict: archiveVerdict(empty) };
  }

  // The witness's sizes first: a publisher writes a record before its witness line, so what the
  // witness held before the archive was read is what the archive must hold (a publication during
  // the verification is no false alarm).
  const witnessSizes = o.witnessDir !== undefined ? sizesOfWitnessFiles(o.witnessDir) : undefined;
  const chain = readChain(root, await mirror?.mirrorId());
  await o.failpoint?.('chain-read');
  await checkLedger(report, chain, mirror);
  const states = fileStates(chain.records);
  const { listed, withoutLineProof, expiredPresent } = await checkFiles(report, root, chain, states);
  const manifest = await checkManifest(report, root, chain, mirror);
  const manifestHead = manifest?.ok && manifest.signed ? manifest.signed : undefined;
  checkSignatures(report, chain.records, manifest, o.publicKey, o.signedFrom);
  const firstBad = firstBadBatch(chain, report.problems, listed);
  if (o.head) checkHead(report, chain, o.head, firstBad);
  else report.skip('head', 'no --head given');
  const timed: TimedHead[] = manifestHead ? [{ head: manifestHead, source: MANIFEST, authenticated: o.publicKey !== undefined && checkHeadSignature(manifestHead, o.publicKey) === 'valid' }] : [];
  if (o.witnessDir !== undefined) {
    const mirrorId = (await mirror?.mirrorId()) ?? chain.records[0]?.mirror_id ?? (manifest?.ok ? manifest.mirror_id : undefined);
    timed.push(...checkWitness(report, chain, { dir: o.witnessDir, mirrorId, key: o.publicKey, signedFrom: o.signedFrom, firstBad, sizes: witnessSizes ?? new Map() }));
  } else report.skip('witness', 'no --witness given');
  const newestSignedHead = checkAge(report, timed, { key: o.publicKey, maxAgeMs: o.maxAgeMs, now: (o.clock ?? systemClock).now() });
  if (mirror) await checkMirror(report, chain, mirror);
  else report.skip('mirror', 'no database');
  if (o.deep && mirror) report.add('deep', await deepCheck(mirror, root, [...states.current.values()], [...states.expired.values()].map((e) => e.state)), 'every export line replayed in seq order matches the mirror: live rows, tombstones, message history and runs');
  else report.skip('deep', o.deep ? 'needs the database' : 'not asked (--deep)');
  report.add('temp', checkTemp(root), 'no leftovers of an interrupted publication');
  const batches = chain.records.filter((r): r is LedgerRecord => isBatchRecord(r));
  const files = batches.reduce((n, r) => n + r.files.length, 0);
  const lines = batches.reduce((n, r) => n + r.files.reduce((m, f) => m + f.lines, 0), 0);
  const signed = chain.records.filter((r) => r.signature !== undefined).length;
  const out = { exportDir: root, checks: report.checks, problems: report.problems, head: chain.head, records: chain.records.length, files, lines, signed, erasures: states.erasures, retentions: states.retentions, expiredPresent, erasedWithoutLineProof: withoutLineProof, newestSignedHead };
  return { ...out, verdict: archiveVerdict(out) };
}

/** The chain's own problems, records not rendered canonically, and an empty ledger where there should be one. */
async function checkLedger(report: Report, chain: Chain, mirror: Mirror | undefined): Promise<void> {
  const found = chain.problems.filter((p) => p.problem !== 'unlisted');
  for (const rel of chain.formatting) found.push({ path: rel, problem: 'record', detail: 'its content is intact but its bytes are not the canonical rendering (edited by hand?)' });
  if (chain.records.length === 0 && found.length === 0 && mirror && ((await mirror.ledgerHead()) || (await mirror.exportTotals()).everPublished)) {
    const detail = (await mirror.ledgerGenesis())
      ? 'no batch record: these exports were published before the ledger existed; the next sync writes their genesis record'
      : 'no batch record, yet the mirror published';
    found.push({ path: LEDGER_DIR, problem: 'missing', detail });
  }
  const n = chain.records.length;
  report.add('chain', found, n === 0 ? 'no batch record: nothing published yet' : `${n} record${n === 1 ? '' : 's'}, chained from genesis to head ${short(chain.head)}`);
}

/**
 * Every file the sound records list against its record (one at a time, streamed), followed through
 * the erasure records that rewrote it (src/export/file-states.ts): a file never erased against its
 * batch record; a rewritten one against its latest SHA-256 and, line by line, its erased lines and
 * the root of its original record ({@link checkErased}); a file an erasure record replaced must be
 * gone. A file a retention record expired may be absent (it is not looked at; still present, it is
 * named in `expiredPresent`, not a problem). Then what lies in the partition trees and `_ledger/`
 * that no record lists.
 *
 * @returns the record that last names each path (for the first bad batch), the rewritten
 *   files erased without line proof, and the expired files still present
 */
async function checkFiles(report: Report, root: string, chain: Chain, states: FileStates): Promise<{ listed: Map<string, number>; withoutLineProof: string[]; expiredPresent: string[] }> {
  const found: VerifyProblem[] = [...states.problems];
  const dirs = new DirCheck(root);
  let lines = 0;
  let rooted = 0;
  let rewritten = 0;
  let erasedLines = 0;
  const withoutLineProof: string[] = [];
  for (const f of states.current.values()) {
    lines += f.original.lines;
    if (f.original.merkle_root !== undefined) rooted++;
    if (f.rewrittenBy.length === 0) {
      found.push(...(await checkListed(root, dirs, f.original, f.batch)));
      continue;
    }
    rewritten++;
    erasedLines += f.erased.size;
    const r = await checkErased(root, dirs, f);
    found.push(...r.problems);
    if (r.withoutLineProof) withoutLineProof.push(f.path);
  }
  for (const [p, by] of states.replaced) {
    if (states.current.has(p)) continue;
    let st: fs.Stats | undefined;
    try {
      st = fs.lstatSync(path.join(root, p));
    } catch {
      st = undefined;
    }
    if (st) {
      found.push({
        path: p,
        problem: 'erasure',
        detail: `erasure record ${by.record} (${recordPath(by.record)}) replaced it by ${by.newPath}, yet it is still here: it may hold the lines that erasure erased (left by an erasure interrupted after its record, the next convo-mirror erase or sync removes it; else remove it by hand)`,
      });
    }
  }
  const expiredPresent: string[] = [];
  let expiredLines = 0;
  for (const [p, e] of states.expired) {
    expiredLines += e.state.original.lines;
    try {
      fs.lstatSync(path.join(root, p));
      expiredPresent.push(p);
    } catch {
      // gone, as the retention record allows
    }
  }
  const what =
    rooted === 0
      ? 'sizes, line counts and SHA-256 as recorded'
      : rooted === states.current.size
        ? 'sizes, line counts, SHA-256 and the Merkle roots of their lines as recorded'
        : `sizes, line counts and SHA-256 as recorded; the Merkle roots of the lines of the ${rooted} files listed by records of version 2 too`;
  const erased =
    rewritten === 0
      ? ''
      : `; ${rewritten} rewritten by erasure records (${erasedLines} lines erased, each a stub carrying its line's leaf): their SHA-256 as the erasure record says${rewritten > withoutLineProof.length ? ', the lines not erased proven unchanged by the roots of their original records' : ''}` +
        (withoutLineProof.length > 0 ? `; ${withoutLineProof.length} erased without line proof (published by records of version 1, which have no root)` : '');
  const expired =
    states.expired.size === 0
      ? ''
      : `; ${states.expired.size} expired by ${states.retentions.length} retention record${states.retentions.length === 1 ? '' : 's'} (${expiredLines} lines)` +
        (expiredPresent.length > 0 ? `, ${expiredPresent.length} of them still present (the next publication removes them)` : ', all gone');
  report.add('files', found, `${states.current.size} files, ${lines} lines: ${what}${erased}${expired}`);
  const unlisted: VerifyProblem[] = chain.problems.filter((p) => p.problem === 'unlisted');
  for (const stream of STREAM_DIRS) {
    for (const e of walkTree(root, stream)) {
      if (states.listed.has(e.rel) || chain.suspectPaths.has(e.rel)) continue;
      unlisted.push(e.kind === 'regular file' ? { path: e.rel, problem: 'unlisted' } : { path: e.rel, problem: 'unlisted', detail: e.kind === 'symbolic link' ? 'symbolic link, not followed' : e.kind });
    }
  }
  report.add('unlisted', unlisted, `nothing in ${STREAM_DIRS.join('/, ')}/ or ${LEDGER_DIR}/ that no record lists`);
  return { listed: states.listed, withoutLineProof, expiredPresent };
}

/**
 * `manifest.json` against the head: the mirror's (with the database), else the last record on
 * disk; version 3 must be the canonical rendering of a well-formed signed head.
 *
 * @returns what the manifest says, when there is one to read
 */
async function checkManifest(report: Report, root: string, chain: Chain, mirror: Mirror | undefined): Promise<ReadManifest | undefined> {
  const last = chain.records.at(-1);
  const mirrorId = (await mirror?.mirrorId()) ?? last?.mirror_id;
  let bytes: Buffer | undefined;
  try {
    bytes = readIfPresent(path.join(root, MANIFEST), MAX_MANIFEST_BYTES);
  } catch (err) {
    report.add('manifest', [{ path: MANIFEST, problem: 'not-regular', detail: (err as Error).message }], '');
    return undefined;
  }
  if (bytes === undefined) {
    report.add('manifest', last ? [{ path: MANIFEST, problem: 'missing' }] : [], 'nothing published: no manifest needed');
    return undefined;
  }
  const m = readManifest(bytes);
  if (!m.ok) {
    report.add('manifest', [{ path: MANIFEST, problem: 'manifest', detail: m.why }], '');
    return m;
  }
  if (mirrorId === undefined) {
    report.add('manifest', [], `version ${m.version}; nothing published`);
    return m;
  }
  const found: VerifyProblem[] = [];
  const expectedHead = mirror ? await mirror.ledgerHead() : last ? { batch_id: last.batch_id, hash: last.hash } : undefined;
  const lastBatch = chain.records.filter((r): r is LedgerRecord => isBatchRecord(r)).at(-1);
  const expectedWatermark = mirror ? await mirror.exportWatermark() : (lastBatch?.last_seq ?? 0);
  const whose = mirror ? 'as the mirror records' : 'as the last record says';
  if (m.mirror_id !== mirrorId) found.push({ path: MANIFEST, problem: 'manifest', found: `mirror ${m.mirror_id}`, expected: `mirror ${mirrorId}` });
  if (m.version === 1) {
    found.push({ path: MANIFEST, problem: 'manifest', detail: 'version 1, written before the ledger: the next sync rewrites it as version 3' });
  } else if (short(m.head) !== short(expectedHead) || m.watermark !== expectedWatermark) {
    found.push({ path: MANIFEST, problem: 'manifest', found: `head ${short(m.head)} with watermark ${m.watermark}`, expected: `head ${short(expectedHead)} with watermark ${expectedWatermark}, ${whose}` });
  }
  if (m.formatting) found.push({ path: MANIFEST, problem: 'manifest', detail: 'its content is well formed but its bytes are not the canonical rendering (edited by hand?)' });
  const points = `points at head ${short(m.head)}, watermark ${m.watermark}, ${whose}`;
  const signed = m.signed ? `signed at ${m.signed.signed_at}${m.signed.signature ? ` by ${m.signed.signature.key_id}` : ', no signature'}` : '';
  report.add('manifest', found, m.version === 3 ? `${points}; ${signed}` : `version 2 (no time, no signature; the next publication rewrites it as version 3): ${points}`);
  return m;
}

/** Words for a signature that does not verify. */
function signatureWords(verdict: Exclude<SignatureCheck, 'valid'>, keyId: string, by: string | undefined): string {
  if (verdict === 'wrong-key') return `signed by key ${by ?? 'unknown'}, not ${keyId}`;
  return verdict === 'invalid' ? 'the signature does not verify: the record or its signature was forged' : 'malformed signature';
}

/**
 * With a key: every record from `signedFrom` on (all without it) and the head pointer signed by
 * it; records before `signedFrom` may be unsigned (reported). Without: the signatures counted.
 */
function checkSignatures(report: Report, records: AnyRecord[], manifest: ReadManifest | undefined, key: PublicKey | undefined, signedFrom: number | undefined): void {
  const signed = records.filter((r) => r.signature !== undefined).length;
  const headSigned = manifest?.ok && manifest.signed?.signature !== undefined;
  if (!key) {
    const recs = signed === 0 ? `the ${records.length} records are unsigned (no signing key when they were published)` : `${signed} of ${records.length} records signed`;
    report.skip('signatures', `${recs}, the head pointer ${headSigned ? 'signed' : 'unsigned'}; pass --public-key FILE to check them`);
    return;
  }
  const found: VerifyProblem[] = [];
  const unsigned: AnyRecord[] = [];
  for (const r of records) {
    const rel = recordPath(r.batch_id);
    if (!r.signature) {
      if (signedFrom === undefined || r.batch_id >= signedFrom) unsigned.push(r);
      continue;
    }
    const verdict = checkSignature(recordBodyBytes(r), r.signature, key);
    if (verdict !== 'valid') found.push({ path: rel, problem: 'signature', detail: signatureWords(verdict, key.keyId, r.signature.key_id) });
  }
  found.push(...unsignedProblems(records, unsigned, key, signedFrom));
  if (manifest?.ok) {
    if (!manifest.signed) {
      found.push({ path: MANIFEST, problem: 'unsigned', detail: `version ${manifest.version}: the head pointer was not signed then; the next publication signs it` });
    } else {
      const verdict = checkHeadSignature(manifest.signed, key);
      if (verdict === 'unsigned') found.push({ path: MANIFEST, problem: 'unsigned', detail: 'the head pointer carries no signature: written without the signing key (by the publisher without one, or by someone else)' });
      else if (verdict !== 'valid') found.push({ path: MANIFEST, problem: 'signature', detail: signatureWords(verdict, key.keyId, manifest.signed.signature?.key_id).replace('the record', 'the head pointer') });
    }
  }
  report.add('signatures', found, signedDetail(records, key, signedFrom) + (manifest?.ok ? '; the head pointer signed by it' : ''));
}

/**
 * The problems of the records that should be signed and are not: one line for an unsigned prefix
 * followed only by signed records (suggesting `--signed-from`), or for an archive with no signed
 * record at all; else one per record.
 */
function unsignedProblems(records: AnyRecord[], unsigned: AnyRecord[], key: PublicKey, signedFrom: number | undefined): VerifyProblem[] {
  if (unsigned.length === 0) return [];
  const first = records[0]!.batch_id;
  const isPrefix = signedFrom === undefined && unsigned.every((r, i) => r === records[i]);
  if (isPrefix && unsigned.length === records.length) {
    return [{ path: LEDGER_DIR, problem: 'unsigned', detail: `all ${records.length} records were published without a signing key: none is signed by ${key.keyId}` }];
  }
  if (isPrefix) {
    const next = records[unsigned.length]!.batch_id;
    const last = unsigned.at(-1)!.batch_id;
    return [
      {
        path: LEDGER_DIR,
        problem: 'unsigned',
        detail: `${span(first, last)} were published without a signing key, and every record from batch ${next} on is signed: if signing began at batch ${next}, accept the unsigned ones with --signed-from ${next}`,
      },
    ];
  }
  const after = signedFrom === undefined ? '' : ` (from --signed-from ${signedFrom} on, every record must be signed)`;
  return unsigned.map((r) => ({ path: recordPath(r.batch_id), problem: 'unsigned' as const, detail: `published without a signing key${after}` }));
}

/** `all 8 records signed by <key>`, or `records 1–7 unsigned (accepted by --signed-from 8), 8–12 signed by <key>`. */
function signedDetail(records: AnyRecord[], key: PublicKey, signedFrom: number | undefined): string {
  if (signedFrom === undefined || records.length === 0) return `all ${records.length} records signed by ${key.keyId}`;
  const before = records.filter((r) => r.batch_id < signedFrom);
  const from = records.filter((r) => r.batch_id >= signedFrom);
  const range = (rs: AnyRecord[]) => span(rs[0]!.batch_id, rs.at(-1)!.batch_id);
  const parts: string[] = [];
  if (before.length > 0) {
    const unsignedBefore = before.filter((r) => !r.signature).length;
    parts.push(
      unsignedBefore === before.length
        ? `${range(before)} unsigned (accepted by --signed-from ${signedFrom})`
        : `${range(before)}, before --signed-from ${signedFrom}: ${unsignedBefore} unsigned (accepted), ${before.length - unsignedBefore} signed by ${key.keyId}`,
    );
  }
  parts.push(from.length > 0 ? `${range(from)} signed by ${key.keyId}` : `no record from batch ${signedFrom} on yet`);
  return parts.join(', ');
}

/** The first batch whose record is broken or whose files changed (from the chain and the files' problems), if any. */
function firstBadBatch(chain: Chain, problems: VerifyProblem[], listed: Map<string, number>): number | undefined {
  let firstBad = chain.brokenAt;
  for (const p of problems) {
    const batch = listed.get(p.path);
    if (batch !== undefined && ['missing', 'not-regular', 'size', 'sha256', 'lines', 'merkle_root', 'erasure', 'retention'].includes(p.problem)) firstBad = Math.min(firstBad ?? batch, batch);
  }
  return firstBad;
}

/** Why the archive does not prove a head (see {@link unproven}). */
type Unproven =
  /** No record of the archive is that head; `removed`: the records after the chain's end up to it are all gone. */
  | { kind: 'absent'; removed: [number, number] | undefined }
  /** The archive's record of that batch has another hash. */
  | { kind: 'replaced'; record: AnyRecord }
  /** It is in the chain, but batch `firstBad` at or before it is broken or its files changed. */
  | { kind: 'broken'; firstBad: number };

/**
 * Why the archive does not prove `head` (undefined when it does): its record must be in the chain,
 * and nothing up to it broken or changed.
 */
function unproven(chain: Chain, head: HeadRef, firstBad: number | undefined): Unproven | undefined {
  const r = chain.records.find((x) => x.hash === head.hash && (head.batch_id === undefined || x.batch_id === head.batch_id));
  if (!r) {
    const sameBatch = head.batch_id === undefined ? undefined : chain.records.find((x) => x.batch_id === head.batch_id);
    if (sameBatch) return { kind: 'replaced', record: sameBatch };
    const end = chain.head?.batch_id ?? 0;
    const target = head.batch_id;
    const gone = target !== undefined && target > end && !chain.records.some((x) => x.batch_id > end && x.batch_id <= target);
    return { kind: 'absent', removed: gone ? [end + 1, target] : undefined };
  }
  if (firstBad !== undefined && firstBad <= r.batch_id) return { kind: 'broken', firstBad };
  return undefined;
}

/** `: records 8–9 were removed`, or that the head is simply not there. */
function absentWords(removed: [number, number] | undefined): string {
  if (!removed) return ': it was truncated, or altered up to that head';
  return `: ${span(removed[0], removed[1])} ${removed[0] === removed[1] ? 'was' : 'were'} removed`;
}

/** The head an auditor noted is in the chain, and nothing up to it is broken or changed. */
function checkHead(report: Report, chain: Chain, head: HeadRef, firstBad: number | undefined): void {
  const shown = `${head.batch_id === undefined ? '' : `${head.batch_id}:`}${head.hash}`;
  const why = unproven(chain, head, firstBad);
  if (!why) {
    report.add('head', [], `head ${shown} is in the chain, which is unbroken and unchanged from genesis to it (append-only since)`);
    return;
  }
  const problem: VerifyProblem =
    why.kind === 'absent'
      ? { path: LEDGER_DIR, problem: 'head', detail: `no record of this archive is ${shown} (its chain ends at ${short(chain.head)})${absentWords(why.removed)}` }
      : why.kind === 'replaced'
        ? { path: recordPath(why.record.batch_id), problem: 'head', found: why.record.hash, expected: head.hash, detail: `the archive's record of batch ${why.record.batch_id} is not the noted head: replaced since` }
        : { path: LEDGER_DIR, problem: 'head', detail: `head ${shown} is in the chain, but batch ${why.firstBad} before it is broken or its files changed` };
  if (why.kind === 'broken') problem.path = recordPath(chain.records.find((x) => x.hash === head.hash)!.batch_id);
  report.add('head', [problem], '');
}

/** A signed head with a time, where it was found, and whether its signature was checked. */
interface TimedHead {
  head: SignedHead;
  source: string;
  authenticated: boolean;
}

/** The size of every regular file of a witness directory (by name), now; empty when it cannot be listed. */
function sizesOfWitnessFiles(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return out;
  }
  for (const name of names) {
    try {
      const st = fs.lstatSync(path.join(dir, name));
      // Anything else is read as it is then, and refused by the reader (a symlink, a directory...).
      out.set(name, st.isFile() ? st.size : Number.MAX_SAFE_INTEGER);
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

/**
 * The witness file of the mirror in `o.dir`: every line a signed head of this mirror (signed by
 * the key, with one; from `signedFrom` on), in non-decreasing batch order, one hash per batch;
 * each witnessed head's hash the archive's record of that batch; and the newest witnessed head
 * still held, unbroken and unchanged from genesis.
 *
 * @returns the witnessed heads (for the age check), authenticated when their signature verified
 */
function checkWitness(
  report: Report,
  chain: Chain,
  o: { dir: string; mirrorId: string | undefined; key: PublicKey | undefined; signedFrom: number | undefined; firstBad: number | undefined; sizes: ReadonlyMap<string, number> },
): TimedHead[] {
  if (o.mirrorId === undefined) {
    report.add('witness', [{ path: path.resolve(o.dir), problem: 'witness', detail: 'cannot tell which mirror this archive belongs to (no record, no manifest, no database): no witness file to read' }], '');
    return [];
  }
  let file: string;
  try {
    file = witnessFile(o.dir, o.mirrorId);
  } catch (err) {
    report.add('witness', [{ path: path.resolve(o.dir), problem: 'witness', detail: (err as Error).message }], '');
    return [];
  }
  const found: VerifyProblem[] = [];
  const heads: TimedHead[] = [];
  const byBatch = new Map(chain.records.map((r) => [r.batch_id, r]));
  /** The hash first witnessed for each batch, and on which line. */
  const seen = new Map<number, { hash: string; line: number }>();
  let newest: { head: SignedHead; line: number } | undefined;
  try {
    const upTo = o.sizes.get(path.basename(file));
    if (upTo === undefined) throw Object.assign(new Error('no witness file'), { code: 'ENOENT' }); // absent when the verification began
    for (const l of readWitnessLines(file, { upTo })) {
      const at = `${file}:${l.line}`;
      if ('why' in l) {
        found.push({ path: at, problem: 'witness', detail: `malformed line: ${l.why}` });
        continue;
      }
      const h = l.head;
      if (h.mirror_id !== o.mirrorId) {
        found.push({ path: at, problem: 'witness', detail: `a head of mirror ${h.mirror_id}, not ${o.mirrorId}` });
        continue;
      }
      if (h.head === null) {
        found.push({ path: at, problem: 'witness', detail: 'a head before the first record: a witness line always names one' });
        continue;
      }
      let authenticated = false;
      if (o.key) {
        const verdict = checkHeadSignature(h, o.key);
        authenticated = verdict === 'valid';
        const exempt = verdict === 'unsigned' && o.signedFrom !== undefined && h.head.batch_id < o.signedFrom;
        if (verdict === 'unsigned' && !exempt) found.push({ path: at, problem: 'unsigned', detail: `witnessed head ${short(h.head)} carries no signature` });
        else if (verdict !== 'valid' && verdict !== 'unsigned') found.push({ path: at, problem: 'signature', detail: `witnessed head ${short(h.head)}: ${signatureWords(verdict, o.key.keyId, h.signature?.key_id).replace('the record', 'the head')}` });
      }
      heads.push({ head: h, source: at, authenticated });
      const top = newest?.head.head;
      const earlier = seen.get(h.head.batch_id);
      if (top && h.head.batch_id < top.batch_id) {
        found.push({ path: at, problem: 'witness', detail: `head ${short(h.head)} (signed ${h.signed_at}) comes after head ${short(top)}: the witnessed heads went backwards (the publisher's mirror was rolled back?)` });
      }
      if (earlier && earlier.hash !== h.head.hash) {
        found.push({ path: at, problem: 'witness', detail: `a second head for batch ${h.head.batch_id}: ${h.head.hash}, after ${earlier.hash} (line ${earlier.line}): the chain forked` });
      } else if (!earlier) seen.set(h.head.batch_id, { hash: h.head.hash, line: l.line });
      const record = byBatch.get(h.head.batch_id);
      if (record && record.hash !== h.head.hash) {
        found.push({ path: at, problem: 'witness', found: `record ${h.head.batch_id} hashes to ${record.hash}`, expected: `${h.head.hash} (the witnessed head signed ${h.signed_at})`, detail: 'the record was replaced since the witness saw it' });
      }
      if (!newest || h.head.batch_id >= newest.head.head!.batch_id) newest = { head: h, line: l.line };
    }
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const detail =
      code === 'ENOENT'
        ? `no witness file for mirror ${o.mirrorId}: the witness never saw this mirror (another --witness directory, or the publisher runs without CONVO_MIRROR_WITNESS_DIR)`
        : `cannot read it: ${code === 'ELOOP' ? 'a symbolic link, not followed' : (err as Error).message}`;
    report.add('witness', [{ path: file, problem: 'witness', detail }], '');
    return heads;
  }
  if (newest) {
    // Heads are in order, so proving the newest proves every earlier one (their hashes were compared above).
    const nh = newest.head.head!;
    const why = unproven(chain, nh, o.firstBad);
    const saw = `the witness saw head ${short(nh)} (signed ${newest.head.signed_at})`;
    if (why?.kind === 'absent') found.push({ path: `${file}:${newest.line}`, problem: 'witness', detail: `${saw}, but this archive's chain ends at ${short(chain.head)}${absentWords(why.removed)}` });
    else if (why?.kind === 'broken') found.push({ path: `${file}:${newest.line}`, problem: 'witness', detail: `${saw}; it is in this archive's chain, but batch ${why.firstBad} before it is broken or its files changed` });
    // 'replaced': already named at its line
  }
  const n = heads.length;
  const ok =
    n === 0
      ? `the witness ${file} has seen no head of this mirror yet: nothing to prove`
      : `${n} head${n === 1 ? '' : 's'} witnessed in ${file}${o.key ? `, signed by ${o.key.keyId}` : ''}; the newest, ${short(newest!.head.head)} (signed ${newest!.head.signed_at}), and everything before it are in this archive, unbroken and unchanged`;
  report.add('witness', found, ok);
  return heads;
}

/** How far in the future a head's time may be (clocks differ) before `--max-age` calls it a problem. */
const FUTURE_SLACK_MS = 5 * 60_000;

/**
 * The newest signed head's age: with a key, of the heads whose signature verified; without, of the
 * heads that claim a time. With `maxAgeMs`, older than that (or none at all) is a problem.
 */
function checkAge(report: Report, heads: TimedHead[], o: { key: PublicKey | undefined; maxAgeMs: number | undefined; now: number }): NewestSignedHead | undefined {
  const candidates = o.key ? heads.filter((h) => h.authenticated) : heads;
  const limit = o.maxAgeMs === undefined ? '' : `--max-age ${formatDuration(o.maxAgeMs)}`;
  if (candidates.length === 0) {
    const why = o.key
      ? `no signed head verified with ${o.key.keyId}: how old this archive's head is cannot be told`
      : 'no signed head carries a time (no manifest, or one of version 2 or older)';
    if (o.maxAgeMs === undefined) report.skip('age', why);
    else report.add('age', [{ path: MANIFEST, problem: 'age', detail: `${why}; ${limit} cannot be met` }], '');
    return undefined;
  }
  // The latest time wins; on a tie, the manifest (the archive's own), else the later witness line.
  const t = (x: TimedHead) => Date.parse(x.head.signed_at);
  const newest = candidates.reduce((a, b) => (t(b) > t(a) || (t(b) === t(a) && a.source !== MANIFEST) ? b : a));
  const age = o.now - Date.parse(newest.head.signed_at);
  const when = age >= 0 ? `${formatDuration(age)} ago` : `${formatDuration(-age)} in the future`;
  const trust = newest.authenticated ? `authenticated: signed by ${o.key!.keyId}` : 'only claimed: not authenticated without --public-key';
  const said = `the newest signed head, ${short(newest.head.head)} (${newest.source}), was signed ${when}, at ${newest.head.signed_at}; that time is ${trust}`;
  const info: NewestSignedHead = { head: newest.head.head ? { batch_id: newest.head.head.batch_id, hash: newest.head.head.hash } : null, signed_at: newest.head.signed_at, age_ms: age, authenticated: newest.authenticated, source: newest.source };
  if (o.maxAgeMs !== undefined && age > o.maxAgeMs) {
    report.add('age', [{ path: newest.source, problem: 'age', detail: `${said}: older than ${limit}; the publisher has not vouched for this archive since (stopped publishing, or the archive was rolled back to an older signed head)` }], '');
  } else if (o.maxAgeMs !== undefined && age < -FUTURE_SLACK_MS) {
    report.add('age', [{ path: newest.source, problem: 'age', detail: `${said}: a time in the future; the publisher's clock, or this one, is wrong` }], '');
  } else report.add('age', [], o.maxAgeMs === undefined ? said : `${said}; within ${limit}`);
  return info;
}

/** The mirror's ledger entries and the records on disk are the same, batch for batch. */
async function checkMirror(report: Report, chain: Chain, mirror: Mirror): Promise<void> {
  const onDisk = new Map(chain.records.map((r) => [r.batch_id, r]));
  const found: VerifyProblem[] = [];
  const entries = await mirror.ledgerEntries();
  const known = new Set<number>();
  for (const e of entries) {
    known.add(e.batch_id);
    const r = onDisk.get(e.batch_id);
    if (!r) found.push({ path: e.path, problem: 'mirror', detail: `the mirror recorded batch ${e.batch_id} (hash ${e.hash}); the archive has no sound record of it: removed, truncated or damaged` });
    else if (r.hash !== e.hash) found.push({ path: e.path, problem: 'mirror', detail: `the mirror recorded hash ${e.hash}, the archive's record hashes to ${r.hash}` });
  }
  const planned = await mirror.pendingExportBatch();
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
export async function verifyExports(mirror: Mirror, exportDir: string): Promise<VerifyProblem[]> {
  return (await verifyArchive({ exportDir, mirror })).problems.filter((p) => !(p.problem === 'mirror' && p.path === mirror.location));
}
