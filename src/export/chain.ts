/**
 * Reading the ledger back from disk, trusting nothing: every file of `_ledger/`, each record
 * checked on its own ({@link parseRecord}), then the chain walked from genesis to head, each link
 * (`prev`) checked against the record before it. Read-only; follows no symlink.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { LedgerHead } from '../store/mirror.js';
import { LEDGER_DIR, batchIdOfName, isBatchRecord, parseRecord, type AnyRecord } from './ledger.js';
import { kindOf } from './paths.js';
import { MAX_RECORD_BYTES, readIfPresent } from './publish-fs.js';
import type { VerifyProblem } from './verify-types.js';

/** The chain as found on disk. */
export interface Chain {
  /** Every record that reads back sound (shape and hash), by batch id, whether or not its link holds: batch and erasure records. */
  records: AnyRecord[];
  /** The last record of the unbroken chain from genesis, if any: the head the archive proves. */
  head: LedgerHead | undefined;
  /** Batch id of the first record whose link (or own content) is broken; undefined when the chain is whole. */
  brokenAt: number | undefined;
  /** Records whose file does not read back as the canonical rendering of its content. */
  formatting: string[];
  /**
   * Data file paths named by records that do not read back sound (their problem is reported at the
   * record): not reported again as unlisted.
   */
  suspectPaths: Set<string>;
  problems: VerifyProblem[];
}

/** Entries of `_ledger/` by batch id (record names), and the problems of everything else in it. */
function listLedgerDir(root: string): { names: Map<number, string>; problems: VerifyProblem[] } {
  const dir = path.join(root, LEDGER_DIR);
  const names = new Map<number, string>();
  const problems: VerifyProblem[] = [];
  let st: fs.Stats;
  try {
    st = fs.lstatSync(dir);
  } catch {
    return { names, problems };
  }
  if (!st.isDirectory()) return { names, problems: [{ path: LEDGER_DIR, problem: 'not-regular', detail: `${kindOf(st)}, expected the ledger's directory` }] };
  const entries = fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const id = batchIdOfName(e.name);
    const rel = `${LEDGER_DIR}/${e.name}`;
    if (id === undefined) problems.push({ path: rel, problem: 'unlisted', ...(e.isFile() ? {} : { detail: `${kindOf(e)}, not followed` }) });
    else if (!e.isFile()) problems.push({ path: rel, problem: 'not-regular', detail: `${kindOf(e)}, expected a batch record` });
    else names.set(id, rel);
  }
  return { names, problems };
}

/** Reads and checks one record file on its own: shape, hash, the batch id its name says, the mirror. */
function readRecord(root: string, id: number, rel: string, mirrorId: string | undefined): { record?: AnyRecord; formatting?: boolean; problem?: VerifyProblem; paths?: string[] } {
  let bytes: Buffer | undefined;
  try {
    bytes = readIfPresent(path.join(root, rel), MAX_RECORD_BYTES);
  } catch (err) {
    return { problem: { path: rel, problem: 'record', detail: `cannot read it: ${(err as Error).message}` } };
  }
  if (bytes === undefined) return { problem: { path: rel, problem: 'missing' } };
  const parsed = parseRecord(bytes);
  if (!parsed.ok) return { problem: { path: rel, problem: 'record', detail: parsed.why }, paths: namedPaths(bytes) };
  const r = parsed.record;
  if (r.batch_id !== id) return { problem: { path: rel, problem: 'record', detail: `holds the record of batch ${r.batch_id}: records were renamed or swapped` } };
  if (mirrorId !== undefined && r.mirror_id !== mirrorId) {
    return { problem: { path: rel, problem: 'record', detail: `belongs to mirror ${r.mirror_id}, not ${mirrorId}` } };
  }
  return { record: r, formatting: parsed.formatting };
}

/** The `files[].path` strings of a record that does not read back sound, as far as it is JSON at all. */
function namedPaths(bytes: Buffer): string[] {
  try {
    const files = (JSON.parse(bytes.toString('utf8')) as { files?: unknown }).files;
    return Array.isArray(files) ? files.map((f) => (f as { path?: unknown } | null)?.path).filter((p): p is string => typeof p === 'string') : [];
  } catch {
    return [];
  }
}

/**
 * Why `r` does not follow `prev` (undefined when it does), and whether `prev` itself is suspect
 * (its hash does not match the link). `lastBatch` is the last batch record up to `prev`
 * (an erasure or retention record covers no seq: the batch record after it starts where the one before it ended).
 */
function linkProblem(r: AnyRecord, prev: AnyRecord | undefined, first: boolean, lastBatch: { batch_id: number; last_seq: number } | undefined): { why: string; prevSuspect?: boolean } | undefined {
  if (!prev) {
    if (r.prev === null) return undefined;
    if (first && !isBatchRecord(r)) return { why: `an ${r.kind} record, but its previous record (batch ${r.prev.batch_id}) is missing: the chain does not start at a genesis record` };
    return first
      ? { why: `its previous record (batch ${r.prev.batch_id}) is missing: the chain does not start at a genesis record` }
      : { why: `its previous record (batch ${r.prev.batch_id}) is missing or damaged` };
  }
  if (r.prev === null) return { why: `claims to be a genesis record, but follows batch ${prev.batch_id}: a record was inserted` };
  if (r.prev.batch_id !== prev.batch_id) {
    return { why: `links to batch ${r.prev.batch_id}, but the record before it is batch ${prev.batch_id}: ${r.prev.batch_id > prev.batch_id ? 'a record is missing' : 'records were reordered'}` };
  }
  if (r.prev.hash !== prev.hash) {
    return { why: `batch ${r.batch_id} links to it with hash ${r.prev.hash}, but it hashes to ${prev.hash}: it was altered (and re-hashed), or replaced`, prevSuspect: true };
  }
  if (isBatchRecord(r) && lastBatch !== undefined && r.first_seq !== lastBatch.last_seq + 1) {
    return { why: `starts at seq ${r.first_seq}, but batch ${lastBatch.batch_id} ended at ${lastBatch.last_seq}` };
  }
  return undefined;
}

/**
 * Reads `_ledger/` and walks the chain from genesis to head. Problems: `record` (a record that does
 * not read back: not JSON, a wrong shape, a hash that does not match its content, another batch's
 * or another mirror's record), `chain` (a link that does not hold: a record missing, altered and
 * re-hashed, inserted or reordered; named at the record the link points to when that one is the
 * suspect), `not-regular`/`unlisted` for the directory's entries. The head is the last record of
 * the unbroken prefix from genesis.
 *
 * @param mirrorId - the mirror the records must belong to; undefined: the first record's
 */
export function readChain(root: string, mirrorId?: string): Chain {
  const { names, problems } = listLedgerDir(root);
  const records: AnyRecord[] = [];
  const formatting: string[] = [];
  const suspectPaths = new Set<string>();
  /** The unbroken prefix from genesis, while it lasts. */
  const prefix: AnyRecord[] = [];
  let intact = true;
  let brokenAt: number | undefined;
  /** The record before, and the last batch record up to it. */
  let prev: { record: AnyRecord; rel: string; lastBatch: { batch_id: number; last_seq: number } | undefined } | undefined;
  let owner = mirrorId;
  const ordered = [...names].sort((a, b) => a[0] - b[0]);
  ordered.forEach(([id, rel], index) => {
    const read = readRecord(root, id, rel, owner);
    if (!read.record) {
      problems.push(read.problem!);
      for (const p of read.paths ?? []) suspectPaths.add(p);
      brokenAt ??= id;
      intact = false;
      prev = undefined;
      return;
    }
    const r = read.record;
    owner ??= r.mirror_id;
    records.push(r);
    if (read.formatting) formatting.push(rel);
    const link = linkProblem(r, prev?.record, index === 0, prev?.lastBatch);
    if (link) {
      problems.push({ path: link.prevSuspect && prev ? prev.rel : rel, problem: 'chain', detail: link.why });
      brokenAt ??= link.prevSuspect && prev ? prev.record.batch_id : id;
      if (intact && link.prevSuspect) prefix.pop();
      intact = false;
    } else if (intact) prefix.push(r);
    prev = { record: r, rel, lastBatch: isBatchRecord(r) ? { batch_id: r.batch_id, last_seq: r.last_seq } : prev?.lastBatch };
  });
  const last = prefix.at(-1);
  return { records, head: last ? { batch_id: last.batch_id, hash: last.hash } : undefined, brokenAt, formatting, suspectPaths, problems };
}
