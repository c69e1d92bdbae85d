/**
 * The data files an archive should hold now, from its records in chain order: every file a batch
 * record lists, followed through the erasure records that replaced it (src/export/erasure.ts) to
 * the path, SHA-256 and erased lines it has now. `verify` checks each against what it should be;
 * `verify --deep` replays them. A retention record (src/export/retention.ts) takes the files it
 * lists out of the current ones: they are expired, and may be absent. Pure: reads no file.
 */
import { cutoffDay, parseRetention, RETENTION_STREAMS } from '../../config/retention.js';
import { isErasureRecord, isRetentionRecord, recordPath, type AnyRecord, type ErasureInfo, type RecordFile, type RetentionInfo } from './ledger.js';
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

/** A retention record, summed up for the report. */
export interface RetentionSummary {
  /** The retention record's batch id, and its file. */
  record: number;
  path: string;
  retention: RetentionInfo;
  /** Files it expired, and their lines. */
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
  /** Files a retention record expired (which may be gone), by path, with the record and the file as it was. */
  expired: Map<string, { record: number; state: FileState }>;
  /** The retention records, in chain order. */
  retentions: RetentionSummary[];
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
  const expired = new Map<string, { record: number; state: FileState }>();
  const retentions: RetentionSummary[] = [];
  for (const r of records) {
    if (isRetentionRecord(r)) {
      const rel = recordPath(r.batch_id);
      const by = `retention record ${r.batch_id} (${rel})`;
      let lines = 0;
      problems.push(...retentionDecision(r.retention, rel, by));
      for (const f of r.files) {
        const cut = r.retention.cutoff[f.stream as keyof typeof r.retention.cutoff];
        if (cut === undefined || !(f.date < cut)) {
          problems.push({ path: f.path, problem: 'retention', detail: `${by} expires it, but its date ${f.date} is not before the record's cutoff for ${f.stream} (${cut ?? 'none: the policy keeps that stream'})` });
        }
        const cur = current.get(f.path);
        if (!cur) {
          const earlier = expired.get(f.path);
          problems.push({ path: f.path, problem: 'retention', detail: earlier ? `${by} expires it, but retention record ${earlier.record} expired it before` : `${by} expires it, but no earlier record lists it as a file held now` });
          continue;
        }
        const says = (field: string, found: string, expected: string) =>
          problems.push({ path: f.path, problem: 'retention', found, expected, detail: `${by} gives this ${field}; the records before it the expected one` });
        if (f.sha256 !== cur.sha256) says('sha256', f.sha256, cur.sha256);
        if (f.lines !== cur.original.lines) says('lines', String(f.lines), String(cur.original.lines));
        if ((f.merkle_root ?? 'none') !== (cur.original.merkle_root ?? 'none')) says('merkle_root', f.merkle_root ?? 'none', cur.original.merkle_root ?? 'none');
        if (f.stream !== cur.original.stream) says('stream', f.stream, cur.original.stream);
        if (f.date !== cur.original.date) says('date', f.date, cur.original.date);
        current.delete(f.path);
        expired.set(f.path, { record: r.batch_id, state: cur });
        listed.set(f.path, r.batch_id);
        lines += f.lines;
      }
      retentions.push({ record: r.batch_id, path: rel, retention: r.retention, files: r.files.length, lines });
      continue;
    }
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
        const gone = expired.get(f.path);
        problems.push({
          path: f.path,
          problem: 'erasure',
          detail: earlier
            ? `${by} replaces it, but erasure record ${earlier.record} replaced it before (by ${earlier.newPath})`
            : gone
              ? `${by} replaces it, but retention record ${gone.record} expired it before`
              : `${by} replaces it, but no earlier record lists it`,
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
  return { current, replaced, listed, erasures, expired, retentions, problems };
}

/**
 * What does not add up in a retention record's decision: its policy must read as a policy, and its
 * cutoffs must be the ones that policy gives at its `decided_at` (config/retention.ts).
 */
function retentionDecision(t: RetentionInfo, rel: string, by: string): VerifyProblem[] {
  let policy;
  try {
    policy = parseRetention(t.policy);
  } catch (err) {
    return [{ path: rel, problem: 'retention', detail: `${by}: its policy ${JSON.stringify(t.policy)} is not a retention policy (${(err as Error).message})` }];
  }
  const at = Date.parse(t.decided_at);
  if (!policy || Number.isNaN(at)) return [{ path: rel, problem: 'retention', detail: `${by}: its policy ${JSON.stringify(t.policy)} keeps everything, or its decided_at ${JSON.stringify(t.decided_at)} is not a time` }];
  const expected = Object.fromEntries(RETENTION_STREAMS.filter((s) => policy.streams[s]).map((s) => [s, cutoffDay(policy.streams[s]!, at)]));
  const found = JSON.stringify(t.cutoff);
  if (found !== JSON.stringify(expected)) return [{ path: rel, problem: 'retention', found, expected: JSON.stringify(expected), detail: `${by}: its cutoffs are not what its policy gives at its decided_at` }];
  return [];
}
