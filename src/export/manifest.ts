/**
 * `manifest.json`: a small pointer to the head of the ledger's hash chain, rewritten (atomically)
 * at every publication. It lists no files: the batch records in `_ledger/` do, and they are the
 * evidence. Consumers read it to find the head and the watermark; `verify` checks it against the
 * chain it walked (and the mirror's records when the database is there).
 *
 * Version 3 (written since the head pointer is signed) is a signed head (src/export/head.ts): the
 * head, the watermark, the mirror, `signed_at` and, with a signing key, a signature; it is
 * rewritten by every publication, also one with nothing new, so its time says when the publisher
 * last vouched for the head. Versions 1 and 2 are still read: version 2 is the same pointer without
 * a time or a signature; version 1 (before the ledger) listed every file. An export directory
 * holding either is brought to version 3 by its next publication (version 1 first migrated to the
 * ledger, see `publishChanges`).
 */
import type { LedgerHead } from '../store/mirror.js';
import { headBodyOf, parseSignedHead, renderHeadManifest, type HeadBody, type HeadPointer, type SignedHead } from './head.js';

/** The manifest document (`manifest.json`) as published: version 3, a signed head. */
export type Manifest = SignedHead;

/** Manifest versions convo-mirror reads; it writes {@link MANIFEST_VERSION}. */
export const MANIFEST_VERSIONS: readonly number[] = [1, 2, 3];

/** The manifest version convo-mirror writes. */
export const MANIFEST_VERSION = 3;

/**
 * The (unsigned) manifest body for a chain head and watermark at `signedAt`.
 *
 * @param signedAt - ISO 8601 UTC, from the publisher's clock
 */
export function manifestOf(mirrorId: string, head: LedgerHead | undefined, watermark: number, signedAt: string): HeadBody {
  return headBodyOf(mirrorId, head, watermark, signedAt);
}

/** The exact bytes of `manifest.json`: JSON indented by 2, LF-terminated, UTF-8. */
export function renderManifest(manifest: Manifest): Buffer {
  return renderHeadManifest(manifest);
}

/** What a `manifest.json` read back says, whatever its version. */
export type ReadManifest =
  | {
      ok: true;
      version: 1 | 2 | 3;
      mirror_id: string;
      watermark: number;
      /** The head it points at (null: nothing published; undefined: version 1, which names none). */
      head: HeadPointer | null | undefined;
      /** Version 3: the signed head. */
      signed?: SignedHead;
      /** Version 3: the bytes are not exactly {@link renderManifest} of its content. */
      formatting?: boolean;
    }
  | { ok: false; why: string };

/**
 * Reads a `manifest.json`'s bytes, trusting nothing: JSON, `format`, a known version, and for
 * version 3 the exact shape of a signed head ({@link parseSignedHead}). Versions 1 and 2 are read
 * for their mirror, watermark and head.
 *
 * @returns what it says, or why it is not a manifest convo-mirror reads (`not JSON`,
 *   `version 4, which this convo-mirror does not know (it writes 3)`, `signed_at: …`)
 */
export function readManifest(bytes: Buffer): ReadManifest {
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch {
    return { ok: false, why: 'not JSON' };
  }
  const m = (typeof json === 'object' && json !== null && !Array.isArray(json) ? json : {}) as Record<string, unknown>;
  if (m.format !== 'convo-mirror-exports') return { ok: false, why: `format ${m.format === undefined ? 'absent' : JSON.stringify(m.format)}, expected "convo-mirror-exports"` };
  if (m.version === 3) {
    const parsed = parseSignedHead(json);
    if (!parsed.ok) return { ok: false, why: parsed.why };
    const h = parsed.head;
    return { ok: true, version: 3, mirror_id: h.mirror_id, watermark: h.watermark, head: h.head, signed: h, formatting: !renderHeadManifest(h).equals(bytes) };
  }
  if (m.version !== 1 && m.version !== 2) return { ok: false, why: `version ${JSON.stringify(m.version)}, which this convo-mirror does not know (it writes ${MANIFEST_VERSION})` };
  if (typeof m.mirror_id !== 'string' || !Number.isSafeInteger(m.watermark)) return { ok: false, why: `version ${m.version} without a mirror_id and a watermark` };
  const head = m.head as { batch_id?: unknown; hash?: unknown; record?: unknown } | null | undefined;
  const pointer =
    head && typeof head === 'object' && Number.isSafeInteger(head.batch_id) && typeof head.hash === 'string'
      ? { batch_id: head.batch_id as number, hash: head.hash, record: String(head.record) }
      : head === null
        ? null
        : undefined;
  if (m.version === 2 && pointer === undefined) return { ok: false, why: 'version 2 without a head' };
  return { ok: true, version: m.version, mirror_id: m.mirror_id, watermark: m.watermark as number, head: m.version === 1 ? undefined : pointer };
}
