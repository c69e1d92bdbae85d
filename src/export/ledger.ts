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

/** A partition file's path as convo-mirror writes it: `<stream>/account=<id>/date=<day>/<first>-<last>.jsonl[.gz]`. */
const DATA_PATH_RE = /^(messages|conversations|runs)\/account=[^/]+\/date=\d{4}-\d{2}-\d{2}\/\d{12}-\d{12}\.jsonl(\.gz)?$/;

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

/** A whole record as published. */
export interface LedgerRecord extends RecordBody {
  /** SHA-256 (hex) of {@link recordBodyBytes}. */
  hash: string;
  signature?: Signature;
}

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
 *   record, present in a version 1 record), or the version is unknown: the body would not read back
 */
function canonicalBody(r: RecordBody): RecordBody {
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

/**
 * The bytes a record's hash and signature cover: its canonical body as compact JSON, UTF-8. A file's
 * `merkle_root` follows its `sha256` in version 2; version 1 bodies are byte for byte what they
 * were before version 2 existed.
 */
export function recordBodyBytes(r: RecordBody): Buffer {
  return Buffer.from(JSON.stringify(canonicalBody(r)), 'utf8');
}

/** SHA-256 (hex) of {@link recordBodyBytes}. */
export function recordHash(r: RecordBody): string {
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
export function sealRecord(body: RecordBody, sign?: (bytes: Buffer) => Signature): LedgerRecord {
  const canonical = canonicalBody(body);
  const bytes = recordBodyBytes(canonical);
  const hash = crypto.createHash('sha256').update(bytes).digest('hex');
  return sign ? { ...canonical, hash, signature: sign(bytes) } : { ...canonical, hash };
}

/** The exact bytes of a record's file: the record indented by 2, LF-terminated, UTF-8. */
export function renderRecord(r: LedgerRecord): Buffer {
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

/** What reading a record file back found. */
export type ParsedRecord =
  | { ok: true; record: LedgerRecord; /** The file is not byte for byte {@link renderRecord} of its content. */ formatting: boolean }
  | { ok: false; why: string };

/**
 * Reads a record file's bytes back, trusting nothing: JSON, a version it knows (1 or 2), the exact
 * shape of that version (no missing, extra or mistyped field: a version 2 file without
 * `merkle_root`, or a version 1 file with one, is refused), data file paths convo-mirror could have
 * written, and the hash recomputed from the body. Whether the bytes are the canonical rendering is
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
  const version = typeof json === 'object' && json !== null && !Array.isArray(json) ? (json as { version?: unknown }).version : undefined;
  if (version !== 1 && version !== 2) return { ok: false, why: `version ${JSON.stringify(version) ?? 'absent'}, which this convo-mirror does not know (it writes ${RECORD_VERSION})` };
  const parsed = RecordSchemas[version].safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    return { ok: false, why: `${issue.path.join('.') || 'record'}: ${issue.message}` };
  }
  const record = parsed.data as LedgerRecord;
  const badPath = record.files.findIndex((f) => !isDataPath(f.path));
  if (badPath !== -1) return { ok: false, why: `files[${badPath}].path ${JSON.stringify(record.files[badPath]!.path)} is not a data file path` };
  const actual = recordHash(record);
  if (actual !== record.hash) return { ok: false, why: `hash ${record.hash} does not match its content (${actual}): the record was edited` };
  return { ok: true, record, formatting: !renderRecord(record).equals(bytes) };
}
