/**
 * The batch record format of the export ledger: one immutable JSON file per published batch,
 * `_ledger/<batch id, 12 digits>.json`, chained by hash. This module decides a record's canonical
 * body (what is hashed and signed), its hash, its exact bytes on disk, and how a file read back is
 * checked; the exporter writes records, `verify` reads them.
 *
 * A record:
 * ```json
 * { "format": "convo-mirror-ledger", "version": 2, "kind": "batch",
 *   "mirror_id": "…", "batch_id": 7, "run_id": 3, "planned_at": "2026-11-25T10:00:00.000Z",
 *   "first_seq": 101, "last_seq": 250,
 *   "files": [{ "path", "stream", "account_id", "date", "first_seq", "last_seq", "lines", "bytes", "sha256", "merkle_root" }],
 *   "prev": { "batch_id": 6, "hash": "…" },
 *   "hash": "…",
 *   "signature": { "algorithm": "ed25519", "key_id": "sha256:…", "value": "…" } }
 * ```
 * `kind` is `migration` for the genesis record that takes in the files of an export directory
 * published before the ledger existed. `prev` is null on the genesis record.
 *
 * An **erasure record** (`kind: "erasure"`, issue 26) is a record of the same chain and id
 * sequence (it takes the next batch id, chains on the head), published when an erasure replaced
 * the subject's published lines by stubs (src/export/stub.ts) in rewritten files
 * (src/export/erasure.ts). It covers no seq; it says which erasure (not whose data: the subject is
 * personal data), and for each file it replaced the path and SHA-256 it had, the rewritten file's,
 * the Merkle root the file's original record committed to (absent for a file of a version 1
 * record), and the seqs erased with their leaf hashes:
 * ```json
 * { "format": "convo-mirror-ledger", "version": 2, "kind": "erasure", "mirror_id": "…", "batch_id": 9,
 *   "erasure": { "id": 3, "kind": "sender", "account_id": "…", "reason": "DSR-1234", "requested_at": "…" },
 *   "files": [{ "path", "new_path", "stream", "sha256", "new_sha256", "merkle_root", "redacted_seqs": [17, 40], "redacted_leaves": ["…", "…"] }],
 *   "prev": { "batch_id": 8, "hash": "…" }, "hash": "…", "signature": { … } }
 * ```
 * Hashed, signed and written exactly as a batch record.
 *
 * A **retention record** (`kind: "retention"`, issue 26 item 3) is a record of the same chain and id
 * sequence, published when `CONVO_MIRROR_RETENTION` expired published files (src/export/retention.ts):
 * the policy, the cutoff day and when it was decided, and each file it expires as it was published
 * (path, stream, partition date, SHA-256, lines, Merkle root when its record has one). The files are
 * deleted only once it is in the chain; `verify` accepts them absent:
 * ```json
 * { "format": "convo-mirror-ledger", "version": 2, "kind": "retention", "mirror_id": "…", "batch_id": 12,
 *   "retention": { "policy": "messages=400d", "cutoff": { "messages": "2025-10-23" }, "decided_at": "…" },
 *   "files": [{ "path", "stream", "date", "sha256", "lines", "merkle_root" }],
 *   "prev": { "batch_id": 11, "hash": "…" }, "hash": "…", "signature": { … } }
 * ```
 *
 * Versions: a record of version 2 commits, for each file, to the Merkle tree hash of its lines
 * (`merkle_root`: src/export/merkle.ts) beside the SHA-256 of its bytes; version 1 (the records
 * written before) has no `merkle_root`, and is read and verified as it always was. convo-mirror
 * writes version 2 for every batch, and version 1 for a `migration` record (its files were
 * published before, and the mirror knows them only by their SHA-256: see the exporter). The body is the record
 * without `hash` and `signature`, serialized as compact JSON with the fields in the order above;
 * `hash` is the SHA-256 (hex) of the body's UTF-8 bytes; `signature` (optional) is an Ed25519
 * signature of the same bytes. The file holds the whole record, indented by 2, LF-terminated.
 */
import crypto from 'node:crypto';
import { z } from 'zod';
import type { LedgerHead } from '../store/mirror.js';
import type { Signature } from './signing.js';

/** Directory of the batch records, at the root of the export directory. */
export const LEDGER_DIR = '_ledger';

/** Record file names: the batch id on 12 digits. */
const RECORD_NAME_RE = /^(\d{12})\.json$/;

/**
 * A partition file's path as convo-mirror writes it: `<stream>/account=<id>/date=<day>/<first>-<last>.jsonl[.gz]`,
 * or, rewritten by erasure `N` (src/export/erasure.ts), `<first>-<last>.e<N>.jsonl[.gz]`.
 */
const DATA_PATH_RE = /^(messages|conversations|runs)\/account=[^/]+\/date=\d{4}-\d{2}-\d{2}\/\d{12}-\d{12}(\.e[1-9]\d{0,14})?\.jsonl(\.gz)?$/;

/** The `.e<N>` of a rewritten file's name (see {@link DATA_PATH_RE}). */
const ERASED_SUFFIX_RE = /\.e[1-9]\d{0,14}(?=\.jsonl(?:\.gz)?$)/;

/**
 * The path a data file has once erasure `erasureId` rewrote it: the original name (the seq range)
 * with `.e<erasure id>` before `.jsonl` (`…/000000000101-000000000250.e3.jsonl`, `.e3.jsonl.gz`);
 * a file rewritten before drops its earlier `.e<M>` (one suffix at most, the latest erasure's).
 */
export function erasedPath(p: string, erasureId: number): string {
  return originalPath(p).replace(/(\.jsonl(?:\.gz)?)$/, `.e${erasureId}$1`);
}

/** The path a data file was first published under: `p` without the `.e<N>` of a rewrite. */
export function originalPath(p: string): string {
  return p.replace(ERASED_SUFFIX_RE, '');
}

/** A file a record lists. */
export interface RecordFile {
  /** Relative to the export directory, `/`-separated. */
  path: string;
  stream: string;
  account_id: string;
  /** UTC day of the lines' `synced_at`, `YYYY-MM-DD`. */
  date: string;
  first_seq: number;
  last_seq: number;
  /** Lines in the file (uncompressed). */
  lines: number;
  /** Size of the file as stored (compressed, for `.jsonl.gz`). */
  bytes: number;
  /** SHA-256 (hex) of the file's bytes as stored. */
  sha256: string;
  /**
   * The Merkle tree hash (RFC 6962 §2.1, hex) of the file's lines, each without its LF (of the
   * decompressed lines, for `.jsonl.gz`): see src/export/merkle.ts. Present in every file of a
   * version 2 record, absent from version 1.
   */
  merkle_root?: string;
}

/** A record's body: everything its hash covers. */
export interface RecordBody {
  format: 'convo-mirror-ledger';
  /** 2: files carry `merkle_root`; 1: records written before line commitments (none). */
  version: RecordVersion;
  /** `batch`, or `migration` for the genesis record of an export directory older than the ledger. */
  kind: 'batch' | 'migration';
  mirror_id: string;
  batch_id: number;
  run_id: number | null;
  /** When the batch's seq range was fixed (publication follows), ISO 8601 UTC. */
  planned_at: string;
  first_seq: number;
  last_seq: number;
  files: RecordFile[];
  /** The previous record's id and hash; null on the genesis record. */
  prev: LedgerHead | null;
}

/** A whole batch record as published. */
export interface LedgerRecord extends RecordBody {
  /** SHA-256 (hex) of {@link recordBodyBytes}. */
  hash: string;
  signature?: Signature;
}

/** The erasure an erasure record is for: no subject id (the record is public; the subject is personal data). */
export interface ErasureInfo {
  /** The mirror's `erasures.id`: the `N` of the stubs' `redacted.erasure` and of the rewritten files' `.e<N>`. */
  id: number;
  /** `sender`, `conversation`, or `retention` (`--prune-mirror`: every message created before {@link cutoff}). */
  kind: 'sender' | 'conversation' | 'retention';
  account_id: string;
  /** Why (a ticket reference), as given to `erase --reason`; for `retention`, the policy that expired the messages. */
  reason: string;
  /** When the erasure was asked of the mirror, ISO 8601 UTC. */
  requested_at: string;
  /** `retention` only (and always): the cutoff day, `YYYY-MM-DD`; every message of the account created before its start (UTC) is erased. Not personal data. */
  cutoff?: string;
}

/** One file an erasure record replaced. */
export interface ErasureRecordFile {
  /** The path replaced (a file of a batch record, or one an earlier erasure record wrote). */
  path: string;
  /** The rewritten file ({@link erasedPath}). */
  new_path: string;
  stream: string;
  /** SHA-256 (hex) of the file replaced, as stored. */
  sha256: string;
  /** SHA-256 (hex) of the rewritten file, as stored. */
  new_sha256: string;
  /**
   * The Merkle root the file's original (batch) record commits to, which the rewritten file still
   * hashes to when each stub counts as the leaf it carries; absent for a file of a version 1
   * record (no root: such a file is erased without line proof).
   */
  merkle_root?: string;
  /** The seqs of the lines this record replaced by stubs, ascending (never empty). */
  redacted_seqs: number[];
  /** The leaf hash (hex) of each of those lines, in the same order: what its stub carries. */
  redacted_leaves: string[];
}

/** An erasure record's body: everything its hash covers. */
export interface ErasureBody {
  format: 'convo-mirror-ledger';
  /** Always 2 (erasure records came with line commitments). */
  version: 2;
  kind: 'erasure';
  mirror_id: string;
  /** Its place in the chain: the next batch id when it was published. */
  batch_id: number;
  erasure: ErasureInfo;
  files: ErasureRecordFile[];
  /** The record it chains on (never null: an erasure record is never a genesis record). */
  prev: LedgerHead;
}

/** A whole erasure record as published. */
export interface ErasureRecord extends ErasureBody {
  /** SHA-256 (hex) of {@link recordBodyBytes}. */
  hash: string;
  signature?: Signature;
}

/** What a retention record decided. */
export interface RetentionInfo {
  /** The setting, in its canonical text (`400d`, or `conversations=7y,messages=400d,runs=7y`). */
  policy: string;
  /**
   * The first day kept (`YYYY-MM-DD`, UTC) of each stream the policy limits, in the order messages,
   * conversations, runs: what `policy` gives at `decided_at` (config/retention.ts `cutoffDay`). A
   * file expires when its partition date is before its stream's cutoff.
   */
  cutoff: Partial<Record<'messages' | 'conversations' | 'runs', string>>;
  /** When the publisher decided it (its clock), ISO 8601 UTC. */
  decided_at: string;
}

/** One file a retention record expires, as it was published (its latest form, after any erasure). */
export interface RetentionRecordFile {
  /** Its path (as published, or as an erasure record rewrote it). */
  path: string;
  stream: string;
  /** Its partition date, `YYYY-MM-DD`. */
  date: string;
  /** SHA-256 (hex) of the file, as stored. */
  sha256: string;
  lines: number;
  /** The Merkle root its original record commits to; absent for a file of a version 1 record. */
  merkle_root?: string;
}

/** A retention record's body: everything its hash covers. */
export interface RetentionBody {
  format: 'convo-mirror-ledger';
  /** Always 2. */
  version: 2;
  kind: 'retention';
  mirror_id: string;
  /** Its place in the chain: the next batch id when it was published. */
  batch_id: number;
  retention: RetentionInfo;
  files: RetentionRecordFile[];
  /** The record it chains on (never null). */
  prev: LedgerHead;
}

/** A whole retention record as published. */
export interface RetentionRecord extends RetentionBody {
  /** SHA-256 (hex) of {@link recordBodyBytes}. */
  hash: string;
  signature?: Signature;
}

/** Any record of the ledger: a batch (or migration) record, an erasure record, a retention record. */
export type AnyRecord = LedgerRecord | ErasureRecord | RetentionRecord;
/** Any record's body. */
export type AnyBody = RecordBody | ErasureBody | RetentionBody;

/** Whether `r` is a retention record. */
export function isRetentionRecord(r: AnyRecord): r is RetentionRecord;
export function isRetentionRecord(r: AnyBody): r is RetentionBody;
export function isRetentionRecord(r: AnyBody): boolean {
  return r.kind === 'retention';
}

/** Whether `r` is a batch (or migration) record: one that covers a seq range and publishes files. */
export function isBatchRecord(r: AnyRecord): r is LedgerRecord;
export function isBatchRecord(r: AnyBody): r is RecordBody;
export function isBatchRecord(r: AnyBody): boolean {
  return r.kind === 'batch' || r.kind === 'migration';
}

/** Whether `r` is an erasure record. */
export function isErasureRecord(r: AnyRecord): r is ErasureRecord;
export function isErasureRecord(r: AnyBody): r is ErasureBody;
export function isErasureRecord(r: AnyBody): boolean {
  return r.kind === 'erasure';
}

/** A retention record file's fields in their fixed order (`merkle_root` only when present). */
const RETENTION_FILE_FIELDS: readonly (keyof RetentionRecordFile)[] = ['path', 'stream', 'date', 'sha256', 'lines', 'merkle_root'];

/** An erasure record file's fields in their fixed order (`merkle_root` only when present). */
const ERASURE_FILE_FIELDS: readonly (keyof ErasureRecordFile)[] = ['path', 'new_path', 'stream', 'sha256', 'new_sha256', 'merkle_root', 'redacted_seqs', 'redacted_leaves'];

/** Record versions convo-mirror reads. */
export type RecordVersion = 1 | 2;

/** The record version convo-mirror writes for a batch. */
export const RECORD_VERSION = 2;

/** A file's fields in their fixed order, by record version. */
const FILE_FIELDS: Record<RecordVersion, readonly (keyof RecordFile)[]> = {
  1: ['path', 'stream', 'account_id', 'date', 'first_seq', 'last_seq', 'lines', 'bytes', 'sha256'],
  2: ['path', 'stream', 'account_id', 'date', 'first_seq', 'last_seq', 'lines', 'bytes', 'sha256', 'merkle_root'],
};

/** The path of batch `batchId`'s record, relative to the export directory. */
export function recordPath(batchId: number): string {
  return `${LEDGER_DIR}/${String(batchId).padStart(12, '0')}.json`;
}

/** The batch id a record file name stands for (`000000000007.json` → 7); undefined for any other name. */
export function batchIdOfName(name: string): number | undefined {
  const m = RECORD_NAME_RE.exec(name);
  return m ? Number(m[1]) : undefined;
}

/** Whether `p` is a data file path convo-mirror could have written (and so safe to open under the export directory). */
export function isDataPath(p: string): boolean {
  return DATA_PATH_RE.test(p) && !p.split('/').some((part) => part === '..' || part === '.');
}

/**
 * The canonical body of `r` (fields in their fixed order, whatever the source object's order).
 *
 * @throws Error when a file's `merkle_root` does not go with the version (absent from a version 2
 *   batch record, present in a version 1 record), or the version is unknown: the body would not read back
 */
function canonicalBody(r: AnyBody): AnyBody {
  if (isErasureRecord(r)) return canonicalErasureBody(r);
  if (isRetentionRecord(r)) return canonicalRetentionBody(r);
  const fields = FILE_FIELDS[r.version];
  if (fields === undefined) throw new Error(`batch record ${r.batch_id}: version ${String(r.version)}, which this convo-mirror does not write`);
  for (const f of r.files) {
    if ((f.merkle_root !== undefined) !== (r.version === 2)) {
      throw new Error(`batch record ${r.batch_id} of version ${r.version}: ${f.path} ${r.version === 2 ? 'has no merkle_root' : 'has a merkle_root'}`);
    }
  }
  return {
    format: r.format,
    version: r.version,
    kind: r.kind,
    mirror_id: r.mirror_id,
    batch_id: r.batch_id,
    run_id: r.run_id,
    planned_at: r.planned_at,
    first_seq: r.first_seq,
    last_seq: r.last_seq,
    files: r.files.map((f) => Object.fromEntries(fields.map((k) => [k, f[k]])) as unknown as RecordFile),
    prev: r.prev === null ? null : { batch_id: r.prev.batch_id, hash: r.prev.hash },
  };
}

/** The canonical body of an erasure record (see the module comment). */
function canonicalErasureBody(r: ErasureBody): ErasureBody {
  const e = r.erasure;
  return {
    format: r.format,
    version: r.version,
    kind: r.kind,
    mirror_id: r.mirror_id,
    batch_id: r.batch_id,
    erasure: { id: e.id, kind: e.kind, account_id: e.account_id, reason: e.reason, requested_at: e.requested_at, ...(e.cutoff !== undefined ? { cutoff: e.cutoff } : {}) },
    files: r.files.map(
      (f) =>
        Object.fromEntries(
          ERASURE_FILE_FIELDS.filter((k) => k !== 'merkle_root' || f.merkle_root !== undefined).map((k) => [k, k === 'redacted_seqs' || k === 'redacted_leaves' ? [...f[k]] : f[k]]),
        ) as unknown as ErasureRecordFile,
    ),
    prev: { batch_id: r.prev.batch_id, hash: r.prev.hash },
  };
}

/** The canonical body of a retention record (see the module comment). */
function canonicalRetentionBody(r: RetentionBody): RetentionBody {
  const t = r.retention;
  return {
    format: r.format,
    version: r.version,
    kind: r.kind,
    mirror_id: r.mirror_id,
    batch_id: r.batch_id,
    retention: { policy: t.policy, cutoff: Object.fromEntries((['messages', 'conversations', 'runs'] as const).filter((k) => t.cutoff[k] !== undefined).map((k) => [k, t.cutoff[k]])), decided_at: t.decided_at },
    files: r.files.map(
      (f) => Object.fromEntries(RETENTION_FILE_FIELDS.filter((k) => k !== 'merkle_root' || f.merkle_root !== undefined).map((k) => [k, f[k]])) as unknown as RetentionRecordFile,
    ),
    prev: { batch_id: r.prev.batch_id, hash: r.prev.hash },
  };
}

/**
 * The bytes a record's hash and signature cover: its canonical body as compact JSON, UTF-8. A file's
 * `merkle_root` follows its `sha256` in version 2; version 1 bodies are byte for byte what they
 * were before version 2 existed.
 */
export function recordBodyBytes(r: AnyBody): Buffer {
  return Buffer.from(JSON.stringify(canonicalBody(r)), 'utf8');
}

/** SHA-256 (hex) of {@link recordBodyBytes}. */
export function recordHash(r: AnyBody): string {
  return crypto.createHash('sha256').update(recordBodyBytes(r)).digest('hex');
}

/**
 * The version 1 form of a version 2 body: the same batch without the files' `merkle_root`, as
 * convo-mirror wrote it before line commitments. A batch planned and recorded on disk by an older
 * convo-mirror, then re-published by this one after a crash, keeps that record
 * (see the exporter's `publishRecord`).
 */
export function asVersion1(body: RecordBody): RecordBody {
  return { ...body, version: 1, files: body.files.map(({ merkle_root: _root, ...f }) => f) };
}

/**
 * Seals a body: adds its hash, and the signature when `sign` is given.
 *
 * @throws Error from {@link recordBodyBytes}'s canonical form when the files' `merkle_root` does
 *   not go with the version
 */
export function sealRecord(body: RecordBody, sign?: (bytes: Buffer) => Signature): LedgerRecord;
export function sealRecord(body: ErasureBody, sign?: (bytes: Buffer) => Signature): ErasureRecord;
export function sealRecord(body: RetentionBody, sign?: (bytes: Buffer) => Signature): RetentionRecord;
export function sealRecord(body: AnyBody, sign?: (bytes: Buffer) => Signature): AnyRecord;
export function sealRecord(body: AnyBody, sign?: (bytes: Buffer) => Signature): AnyRecord {
  const canonical = canonicalBody(body);
  const bytes = recordBodyBytes(canonical);
  const hash = crypto.createHash('sha256').update(bytes).digest('hex');
  return sign ? { ...canonical, hash, signature: sign(bytes) } : { ...canonical, hash };
}

/** The exact bytes of a record's file: the record indented by 2, LF-terminated, UTF-8. */
export function renderRecord(r: AnyRecord): Buffer {
  const out: Record<string, unknown> = { ...canonicalBody(r), hash: r.hash };
  if (r.signature) out.signature = { algorithm: r.signature.algorithm, key_id: r.signature.key_id, value: r.signature.value };
  return Buffer.from(JSON.stringify(out, null, 2) + '\n', 'utf8');
}

const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, 'a SHA-256 in lowercase hex');
const seq = z.number().int().min(1);
const RecordFileV1Schema = z.strictObject({
  path: z.string(),
  stream: z.enum(['messages', 'conversations', 'runs']),
  account_id: z.string(),
  date: z.string().regex(/^\d{4}-\d{2}-\d{2}$/),
  first_seq: seq,
  last_seq: seq,
  lines: z.number().int().min(1),
  bytes: z.number().int().min(1),
  sha256: sha256Hex,
});
const RecordFileV2Schema = RecordFileV1Schema.extend({ merkle_root: z.string().regex(/^[0-9a-f]{64}$/, 'a Merkle tree hash in lowercase hex (64 digits)') });
const recordFields = {
  format: z.literal('convo-mirror-ledger'),
  kind: z.enum(['batch', 'migration']),
  mirror_id: z.string().regex(/^[0-9a-f]{32}$/, 'a mirror id: 32 lowercase hex digits'),
  batch_id: z.number().int().min(1),
  run_id: z.number().int().min(1).nullable(),
  planned_at: z.string(),
  first_seq: seq,
  last_seq: seq,
  prev: z.strictObject({ batch_id: z.number().int().min(1), hash: sha256Hex }).nullable(),
  hash: sha256Hex,
  signature: z.strictObject({ algorithm: z.string(), key_id: z.string(), value: z.string() }).optional(),
};
const RecordSchemas = {
  1: z.strictObject({ ...recordFields, version: z.literal(1), files: z.array(RecordFileV1Schema) }),
  2: z.strictObject({ ...recordFields, version: z.literal(2), files: z.array(RecordFileV2Schema) }),
} as const;
const ErasureFileSchema = z
  .strictObject({
    path: z.string(),
    new_path: z.string(),
    stream: z.enum(['messages', 'conversations']),
    sha256: sha256Hex,
    new_sha256: sha256Hex,
    merkle_root: z.string().regex(/^[0-9a-f]{64}$/, 'a Merkle tree hash in lowercase hex (64 digits)').optional(),
    redacted_seqs: z.array(seq).min(1),
    redacted_leaves: z.array(z.string().regex(/^[0-9a-f]{64}$/, 'a leaf hash in lowercase hex (64 digits)')),
  })
  .refine((f) => f.redacted_leaves.length === f.redacted_seqs.length, { message: 'redacted_leaves must give one leaf per seq of redacted_seqs', path: ['redacted_leaves'] })
  .refine((f) => f.redacted_seqs.every((s, i) => i === 0 || s > f.redacted_seqs[i - 1]!), { message: 'redacted_seqs must be in ascending order, each once', path: ['redacted_seqs'] });
const ErasureRecordSchema = z.strictObject({
  format: z.literal('convo-mirror-ledger'),
  version: z.literal(2),
  kind: z.literal('erasure'),
  mirror_id: recordFields.mirror_id,
  batch_id: recordFields.batch_id,
  erasure: z
    .strictObject({
      id: z.number().int().min(1),
      kind: z.enum(['sender', 'conversation', 'retention']),
      account_id: z.string(),
      reason: z.string(),
      requested_at: z.string(),
      cutoff: z.string().regex(/^\d{4}-\d{2}-\d{2}$/, 'a day, YYYY-MM-DD').optional(),
    })
    .refine((e) => (e.kind === 'retention') === (e.cutoff !== undefined), { message: 'cutoff is given for a retention erasure, and only for one', path: ['cutoff'] }),
  files: z.array(ErasureFileSchema).min(1),
  prev: z.strictObject({ batch_id: z.number().int().min(1), hash: sha256Hex }),
  hash: sha256Hex,
  signature: recordFields.signature,
});

const day = z.string().regex(/^\d{4}-\d{2}-\d{2}$/, 'a day, YYYY-MM-DD');
const RetentionRecordSchema = z.strictObject({
  format: z.literal('convo-mirror-ledger'),
  version: z.literal(2),
  kind: z.literal('retention'),
  mirror_id: recordFields.mirror_id,
  batch_id: recordFields.batch_id,
  retention: z.strictObject({
    policy: z.string().min(1),
    cutoff: z.strictObject({ messages: day.optional(), conversations: day.optional(), runs: day.optional() }),
    decided_at: z.string(),
  }),
  files: z
    .array(
      z.strictObject({
        path: z.string(),
        stream: z.enum(['messages', 'conversations', 'runs']),
        date: z.string().regex(/^\d{4}-\d{2}-\d{2}$/),
        sha256: sha256Hex,
        lines: z.number().int().min(1),
        merkle_root: z.string().regex(/^[0-9a-f]{64}$/, 'a Merkle tree hash in lowercase hex (64 digits)').optional(),
      }),
    )
    .min(1),
  prev: z.strictObject({ batch_id: z.number().int().min(1), hash: sha256Hex }),
  hash: sha256Hex,
  signature: recordFields.signature,
});

/** What reading a record file back found. */
export type ParsedRecord =
  | { ok: true; record: AnyRecord; /** The file is not byte for byte {@link renderRecord} of its content. */ formatting: boolean }
  | { ok: false; why: string };

/**
 * Reads a record file's bytes back, trusting nothing: JSON, a version it knows (1 or 2), the exact
 * shape of that version and kind (no missing, extra or mistyped field: a version 2 batch record
 * without `merkle_root`, or a version 1 record with one, is refused; an erasure record is of
 * version 2, chains on a record, lists at least one file with one leaf per erased seq, its seqs
 * ascending, and each file's `new_path` is the rewrite of its `path` by that erasure), data file
 * paths convo-mirror could have written, and the hash recomputed from the body. Whether the bytes are the canonical rendering is
 * reported apart (`formatting`).
 *
 * @returns the record, or why it cannot be one (`not JSON: …`, `version 3, which this convo-mirror
 *   does not know (it writes 2)`, `files.2.merkle_root: …`,
 *   `hash abc… does not match its content (def…)`, `files[0].path "../x" is not a data file path`)
 */
export function parseRecord(bytes: Buffer): ParsedRecord {
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    return { ok: false, why: `not JSON: ${(err as Error).message}` };
  }
  const obj = typeof json === 'object' && json !== null && !Array.isArray(json) ? (json as { version?: unknown; kind?: unknown }) : undefined;
  const version = obj?.version;
  if (version !== 1 && version !== 2) return { ok: false, why: `version ${JSON.stringify(version) ?? 'absent'}, which this convo-mirror does not know (it writes ${RECORD_VERSION})` };
  const parsed = obj?.kind === 'erasure' ? ErasureRecordSchema.safeParse(json) : obj?.kind === 'retention' ? RetentionRecordSchema.safeParse(json) : RecordSchemas[version].safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    return { ok: false, why: `${issue.path.join('.') || 'record'}: ${issue.message}` };
  }
  const record = parsed.data as AnyRecord;
  const paths = isErasureRecord(record) ? record.files.flatMap((f, i) => [{ i, field: 'path', p: f.path }, { i, field: 'new_path', p: f.new_path }]) : record.files.map((f, i) => ({ i, field: 'path', p: f.path }));
  const bad = paths.find((x) => !isDataPath(x.p));
  if (bad) return { ok: false, why: `files[${bad.i}].${bad.field} ${JSON.stringify(bad.p)} is not a data file path` };
  if (isRetentionRecord(record)) {
    const odd = record.files.findIndex((f) => !f.path.startsWith(`${f.stream}/`) || !f.path.includes(`/date=${f.date}/`));
    if (odd !== -1) return { ok: false, why: `files[${odd}]: its stream or date is not its path's (${JSON.stringify(record.files[odd]!.path)})` };
  }
  if (isErasureRecord(record)) {
    const odd = record.files.findIndex((f) => f.new_path !== erasedPath(f.path, record.erasure.id) || !f.path.startsWith(`${f.stream}/`) || f.path.endsWith('.gz') !== f.new_path.endsWith('.gz'));
    if (odd !== -1) return { ok: false, why: `files[${odd}]: new_path ${JSON.stringify(record.files[odd]!.new_path)} is not the rewrite of ${JSON.stringify(record.files[odd]!.path)} by erasure ${record.erasure.id} (${erasedPath(record.files[odd]!.path, record.erasure.id)}), or its stream is not the path's` };
  }
  const actual = recordHash(record);
  if (actual !== record.hash) return { ok: false, why: `hash ${record.hash} does not match its content (${actual}): the record was edited` };
  return { ok: true, record, formatting: !renderRecord(record).equals(bytes) };
}
