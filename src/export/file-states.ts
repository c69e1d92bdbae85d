/**
 * The data files an archive should hold now, from its records in chain order: every file a batch
 * record lists, followed through the erasure records that replaced it (src/export/erasure.ts) to
 * the path, SHA-256 and erased lines it has now. `verify` checks each against what it should be;
 * `verify --deep` replays them. Pure: reads no file.
 */
import { isErasureRecord, type AnyRecord, type ErasureInfo, type RecordFile } from './ledger.js';
import type { VerifyProblem } from './verify-types.js';

/** One erased line of a file, as the erasure record that erased it lists it. */
export interface ErasedLine {
  /** The leaf hash of the line replaced, which its stub must carry. */
  leaf: string;
  /** The erasure record's batch id. */
  record: number;
}

/** A data file as the records say it is now. */
export interface FileState {
  /** Its path now (the latest rewrite's `new_path`, else as first published). */
  path: string;
  /** The batch record that first listed it. */
  batch: number;
  /** Its entry in that record: stream, seq range, line count, Merkle root (version 2). */
  original: RecordFile;
  /** Its SHA-256 now: the original's, or the latest erasure record's `new_sha256`. */
  sha256: string;
  /** The erasure records that rewrote it, in chain order (their batch ids). */
  rewrittenBy: number[];
  /** Every line erased in it, by seq. */
  erased: Map<number, ErasedLine>;
}

/** An erasure record, summed up for the report. */
export interface ErasureSummary {
  /** The erasure record's batch id, and its file. */
  record: number;
  path: string;
  erasure: ErasureInfo;
  /** Files it rewrote, and lines it replaced by stubs. */
  files: number;
  lines: number;
}

/** What {@link fileStates} found. */
export interface FileStates {
  /** The files the archive should hold now, by path. */
  current: Map<string, FileState>;
  /** Paths an erasure record replaced (which should be gone), with the record and what it replaced. */
  replaced: Map<string, { record: number; sha256: string; newPath: string }>;
  /** Every path any record lists (published, replaced or rewritten) with the last record that names it. */
  listed: Map<string, number>;
  /** The erasure records, in chain order. */
  erasures: ErasureSummary[];
  /** What does not add up among the records themselves (a path listed twice, an erasure record replacing what no record holds). */
  problems: VerifyProblem[];
}

/**
 * Follows every file of `records` (sound records, in batch id order) through the erasure records;
 * see the module comment. Problems: `record` for a file listed twice; `erasure` for an erasure
 * record that replaces a path no earlier record holds now, or gives a SHA-256, Merkle root or
 * stream other than the records before it, or names a new path already listed.
 */
export function fileStates(records: readonly AnyRecord[]): FileStates {
  const current = new Map<string, FileState>();
  const replaced = new Map<string, { record: number; sha256: string; newPath: string }>();
  const listed = new Map<string, number>();
  const erasures: ErasureSummary[] = [];
  const problems: VerifyProblem[] = [];
  for (const r of records) {
    if (!isErasureRecord(r)) {
      for (const f of r.files) {
        const other = listed.get(f.path);
        if (other !== undefined) {
          problems.push({ path: f.path, problem: 'record', detail: `listed by batch ${other} and again by batch ${r.batch_id}` });
          continue;
        }
        listed.set(f.path, r.batch_id);
        current.set(f.path, { path: f.path, batch: r.batch_id, original: f, sha256: f.sha256, rewrittenBy: [], erased: new Map() });
      }
      continue;
    }
    const rel = `_ledger/${String(r.batch_id).padStart(12, '0')}.json`;
    let lines = 0;
    for (const f of r.files) {
      const cur = current.get(f.path);
      const by = `erasure record ${r.batch_id} (${rel})`;
      if (!cur) {
        const earlier = replaced.get(f.path);
        problems.push({
          path: f.path,
          problem: 'erasure',
          detail: earlier ? `${by} replaces it, but erasure record ${earlier.record} replaced it before (by ${earlier.newPath})` : `${by} replaces it, but no earlier record lists it`,
        });
        continue;
      }
      const before = cur.rewrittenBy.length > 0 ? `erasure record ${cur.rewrittenBy.at(-1)!}` : `the record of batch ${cur.batch}`;
      if (f.sha256 !== cur.sha256) problems.push({ path: f.path, problem: 'erasure', found: f.sha256, expected: cur.sha256, detail: `${by} replaced it by this SHA-256, but ${before} says it is the expected one` });
      if (f.merkle_root !== cur.original.merkle_root) {
        problems.push({ path: f.path, problem: 'erasure', found: f.merkle_root ?? 'none', expected: cur.original.merkle_root ?? 'none', detail: `${by} gives this merkle_root; the record of batch ${cur.batch} the expected one` });
      }
      if (f.stream !== cur.original.stream) problems.push({ path: f.path, problem: 'erasure', found: f.stream, expected: cur.original.stream, detail: `${by} gives this stream` });
      if (listed.has(f.new_path)) {
        problems.push({ path: f.new_path, problem: 'erasure', detail: `${by} writes it, but the record of batch ${listed.get(f.new_path)!} lists it already` });
        continue;
      }
      const erased = new Map(cur.erased);
      f.redacted_seqs.forEach((seq, i) => erased.set(seq, { leaf: f.redacted_leaves[i]!, record: r.batch_id }));
      current.delete(f.path);
      replaced.set(f.path, { record: r.batch_id, sha256: f.sha256, newPath: f.new_path });
      listed.set(f.path, r.batch_id);
      listed.set(f.new_path, r.batch_id);
      current.set(f.new_path, { ...cur, path: f.new_path, sha256: f.new_sha256, rewrittenBy: [...cur.rewrittenBy, r.batch_id], erased });
      lines += f.redacted_seqs.length;
    }
    erasures.push({ record: r.batch_id, path: rel, erasure: r.erasure, files: r.files.length, lines });
  }
  return { current, replaced, listed, erasures, problems };
}
