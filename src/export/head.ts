/**
 * The signed head: the chain head of the export ledger, the watermark and the mirror, with the time
 * the publisher vouched for them (`signed_at`) and, when a signing key is configured, an Ed25519
 * signature over all of it. After Certificate Transparency's signed tree head (RFC 6962 §3.5,
 * RFC 9162 §4.10) and sigstore's checkpoints: a record's signature proves who wrote that record,
 * but not that no newer record existed; a signed, timed head says "as of `signed_at`, this was the
 * newest record", so an old head shown as the newest is caught by its age (`verify --max-age`) and
 * a head someone saw is caught missing by a witness (`verify --witness`).
 *
 * It is `manifest.json` (version 3, indented by 2, rewritten at every publication, even one with
 * nothing new: its time is when the publisher last vouched for the head) and, as one compact JSON
 * line, each entry of a witness file (src/export/witness.ts):
 * ```json
 * { "format": "convo-mirror-exports", "version": 3, "mirror_id": "…", "watermark": 250,
 *   "ledger": "_ledger", "head": { "batch_id": 8, "hash": "…", "record": "_ledger/000000000008.json" },
 *   "signed_at": "2026-11-25T10:00:00.000Z",
 *   "signature": { "algorithm": "ed25519", "key_id": "sha256:…", "value": "…" } }
 * ```
 * The body is the head without `signature`, serialized as compact JSON with the fields in the order
 * above (the same conventions as a batch record's body, src/export/ledger.ts); the signature is an
 * Ed25519 signature of the body's UTF-8 bytes. Its `format` (`convo-mirror-exports`, where a record
 * says `convo-mirror-ledger`) keeps a head's signature from ever passing for a record's.
 */
import { z } from 'zod';
import type { LedgerHead } from '../store/mirror.js';
import { recordPath } from './ledger.js';
import { checkSignature, sign, type PublicKey, type Signature, type SignatureCheck, type SigningKey } from './signing.js';

/** The manifest version that is a signed head. */
export const SIGNED_HEAD_VERSION = 3;

/** The chain head a signed head points at. */
export interface HeadPointer extends LedgerHead {
  /** Path of the head's batch record, relative to the export directory (`_ledger/<12 digits>.json`). */
  record: string;
}

/** What a signed head's signature covers. */
export interface HeadBody {
  format: 'convo-mirror-exports';
  version: 3;
  /** Id of the mirror whose change log the archive holds (`mirror_meta.mirror_id`). */
  mirror_id: string;
  /** Last change_log.seq published (the head record's `last_seq`; 0 before the first). */
  watermark: number;
  /** Directory of the batch records. */
  ledger: '_ledger';
  /** The chain head; null before the first record. */
  head: HeadPointer | null;
  /** When the publisher signed it: ISO 8601 UTC with milliseconds, from the publisher's clock. */
  signed_at: string;
}

/** A head as published: its body and, when a signing key was configured, its signature. */
export interface SignedHead extends HeadBody {
  signature?: Signature;
}

/** The body of a signed head for a chain head and watermark, signed at `signedAt` (ISO 8601 UTC). */
export function headBodyOf(mirrorId: string, head: LedgerHead | undefined, watermark: number, signedAt: string): HeadBody {
  return {
    format: 'convo-mirror-exports',
    version: SIGNED_HEAD_VERSION,
    mirror_id: mirrorId,
    watermark,
    ledger: '_ledger',
    head: head ? { batch_id: head.batch_id, hash: head.hash, record: recordPath(head.batch_id) } : null,
    signed_at: signedAt,
  };
}

/** The canonical body of `h`: its fields in their fixed order, whatever the source object's order. */
function canonicalBody(h: HeadBody): HeadBody {
  return {
    format: h.format,
    version: h.version,
    mirror_id: h.mirror_id,
    watermark: h.watermark,
    ledger: h.ledger,
    head: h.head === null ? null : { batch_id: h.head.batch_id, hash: h.head.hash, record: h.head.record },
    signed_at: h.signed_at,
  };
}

/** The bytes a head's signature covers: its canonical body as compact JSON, UTF-8. */
export function headBodyBytes(h: HeadBody): Buffer {
  return Buffer.from(JSON.stringify(canonicalBody(h)), 'utf8');
}

/** Seals a head body: signs it with `key` when given (Ed25519, deterministic). */
export function sealHead(body: HeadBody, key?: SigningKey): SignedHead {
  const canonical = canonicalBody(body);
  return key ? { ...canonical, signature: sign(headBodyBytes(canonical), key) } : canonical;
}

/** `h` as a plain object in canonical order, its signature last. */
function canonicalOf(h: SignedHead): SignedHead {
  const out: SignedHead = canonicalBody(h);
  if (h.signature) out.signature = { algorithm: h.signature.algorithm, key_id: h.signature.key_id, value: h.signature.value };
  return out;
}

/** The exact bytes of `manifest.json` holding `h`: indented by 2, LF-terminated, UTF-8. */
export function renderHeadManifest(h: SignedHead): Buffer {
  return Buffer.from(JSON.stringify(canonicalOf(h), null, 2) + '\n', 'utf8');
}

/** The exact bytes of a witness line holding `h`: compact JSON, LF-terminated, UTF-8. */
export function renderHeadLine(h: SignedHead): Buffer {
  return Buffer.from(JSON.stringify(canonicalOf(h)) + '\n', 'utf8');
}

/** ISO 8601 UTC with milliseconds, exactly as `Date.prototype.toISOString` writes it. */
const ISO_UTC_RE = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

/** Whether `s` is a time as convo-mirror writes one (`2026-11-25T10:00:00.000Z`), and a real one. */
export function isIsoUtc(s: string): boolean {
  if (!ISO_UTC_RE.test(s)) return false;
  const t = Date.parse(s);
  return Number.isFinite(t) && new Date(t).toISOString() === s;
}

const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, 'a SHA-256 in lowercase hex');
const SignedHeadSchema = z.strictObject({
  format: z.literal('convo-mirror-exports'),
  version: z.literal(SIGNED_HEAD_VERSION),
  mirror_id: z.string().regex(/^[0-9a-f]{32}$/, 'a mirror id: 32 lowercase hex digits'),
  watermark: z.number().int().min(0),
  ledger: z.literal('_ledger'),
  head: z.strictObject({ batch_id: z.number().int().min(1), hash: sha256Hex, record: z.string() }).nullable(),
  signed_at: z.string().refine(isIsoUtc, 'an ISO 8601 UTC time such as 2026-11-25T10:00:00.000Z'),
  signature: z.strictObject({ algorithm: z.string(), key_id: z.string(), value: z.string() }).optional(),
});

/** What reading a signed head back found. */
export type ParsedHead = { ok: true; head: SignedHead } | { ok: false; why: string };

/**
 * Checks a parsed JSON value is a signed head, trusting nothing: the exact shape (no missing, extra
 * or mistyped field), a real time, and a head whose `record` is the path its batch id implies. The
 * signature's shape and value are judged by {@link checkHeadSignature}.
 *
 * @returns the head, or why it is not one (`signed_at: an ISO 8601 UTC time…`, `head.record "x" is not…`)
 */
export function parseSignedHead(json: unknown): ParsedHead {
  const parsed = SignedHeadSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    return { ok: false, why: `${issue.path.join('.') || 'head'}: ${issue.message}` };
  }
  const head = parsed.data as SignedHead;
  if (head.head && head.head.record !== recordPath(head.head.batch_id)) {
    return { ok: false, why: `head.record ${JSON.stringify(head.head.record)} is not the record of batch ${head.head.batch_id} (${recordPath(head.head.batch_id)})` };
  }
  return { ok: true, head };
}

/**
 * What a head's signature says with `key`: `unsigned` when it carries none, else
 * {@link checkSignature} of its body bytes.
 */
export function checkHeadSignature(h: SignedHead, key: PublicKey): SignatureCheck | 'unsigned' {
  if (h.signature === undefined) return 'unsigned';
  return checkSignature(headBodyBytes(h), h.signature, key);
}
