/**
 * The stub of an erased line (issue 26): what an erasure leaves in a published file in place of a
 * line of the erased subject (src/export/erasure.ts), and how a line is recognised as one. This is
 * the only place that decides a stub's bytes.
 *
 * A stub is one compact JSON object, its keys in this order, on one line:
 * ```json
 * {"seq":17,"op":"insert","account_id":"…","conversation_id":"…","id":"msg_…","redacted":{"erasure":3,"leaf":"<64 hex>"}}
 * ```
 * `seq`, `op`, `account_id`, `conversation_id` and `id` are the erased line's (for a line of the
 * `conversations` stream, which has no `conversation_id`, the conversation's own id); `erasure` is
 * the mirror's erasure id (the `N` of its redaction markers); `leaf` is the RFC 6962 leaf hash of
 * the erased line's bytes (`SHA-256(0x00 || line)`, lowercase hex: src/export/merkle.ts). So the
 * file still hashes to the Merkle root its record committed to when each stub counts as the leaf it
 * carries, every other line is proven unchanged, and whoever holds a copy of the erased line can
 * prove it was there; the line's content is gone. A stub has no `synced_at`, which every export
 * line has: no line convo-mirror exports can be taken for one.
 */
import { ExportError } from '../errors.js';
import { leafHash } from './merkle.js';

/** A stub, parsed. */
export interface Stub {
  seq: number;
  op: 'insert' | 'update' | 'delete';
  account_id: string;
  conversation_id: string;
  id: string;
  /** The erasure that replaced the line (the mirror's `erasures.id`). */
  erasure: number;
  /** The leaf hash (lowercase hex) of the line it replaced. */
  leaf: string;
}

/** A stub's keys, in their written order. */
const STUB_KEYS = ['seq', 'op', 'account_id', 'conversation_id', 'id', 'redacted'];
const HEX_HASH = /^[0-9a-f]{64}$/;
const OPS = new Set(['insert', 'update', 'delete']);

/**
 * Longest stub read as one, bytes: a stub holds a seq, an op, three ids and a hash; anything longer
 * is no stub convo-mirror wrote (1 MiB leaves ids of any sane length room).
 */
export const MAX_STUB_BYTES = 1 << 20;

/** The bytes every stub holds (a cheap test before parsing). */
const STUB_MARK = Buffer.from('"redacted":{"erasure":');

/** The stub's bytes (compact JSON, no LF) of `s`. */
export function renderStub(s: Stub): Buffer {
  return Buffer.from(
    JSON.stringify({ seq: s.seq, op: s.op, account_id: s.account_id, conversation_id: s.conversation_id, id: s.id, redacted: { erasure: s.erasure, leaf: s.leaf } }),
    'utf8',
  );
}

/**
 * The stub that replaces `line`, an export line of the `messages` or `conversations` stream (its
 * bytes without the LF), for erasure `erasureId`.
 *
 * @param stream - the line's stream (a `conversations` line's own id is its `conversation_id`)
 * @throws {@link ExportError} when `line` is not such an export line (not JSON, no whole `seq`, an
 *   unknown `op`, a key that is not a string): the file is not what convo-mirror published
 */
export function stubOf(line: Buffer, stream: 'messages' | 'conversations', erasureId: number): Stub {
  let v: unknown;
  try {
    v = JSON.parse(line.toString('utf8'));
  } catch {
    throw new ExportError('not an export line (not JSON)', {});
  }
  const o = (typeof v === 'object' && v !== null && !Array.isArray(v) ? v : {}) as Record<string, unknown>;
  const conversation = stream === 'conversations' ? o.id : o.conversation_id;
  if (!Number.isSafeInteger(o.seq) || (o.seq as number) < 1 || typeof o.op !== 'string' || !OPS.has(o.op) || typeof o.account_id !== 'string' || typeof conversation !== 'string' || typeof o.id !== 'string') {
    throw new ExportError(`not an export line of the ${stream} stream (seq, op, account_id, ${stream === 'messages' ? 'conversation_id, ' : ''}id)`, {});
  }
  return { seq: o.seq as number, op: o.op as Stub['op'], account_id: o.account_id, conversation_id: conversation, id: o.id, erasure: erasureId, leaf: leafHash(line).toString('hex') };
}

/**
 * The stub `line` is (its bytes without the LF), exactly: the keys of a stub in their order, a
 * whole `seq` and `erasure` >= 1, a known `op`, string ids, a leaf of 64 lowercase hex digits, and
 * the bytes its compact rendering; undefined for anything else (any export line). Never throws.
 */
export function parseStub(line: Buffer): Stub | undefined {
  if (line.length > MAX_STUB_BYTES || line.indexOf(STUB_MARK) === -1) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(line.toString('utf8'));
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o);
  if (keys.length !== STUB_KEYS.length || keys.some((k, i) => k !== STUB_KEYS[i])) return undefined;
  const r = o.redacted as Record<string, unknown> | null;
  if (typeof r !== 'object' || r === null || Object.keys(r).join() !== 'erasure,leaf') return undefined;
  if (!Number.isSafeInteger(o.seq) || (o.seq as number) < 1 || typeof o.op !== 'string' || !OPS.has(o.op)) return undefined;
  if (typeof o.account_id !== 'string' || typeof o.conversation_id !== 'string' || typeof o.id !== 'string') return undefined;
  if (!Number.isSafeInteger(r.erasure) || (r.erasure as number) < 1 || typeof r.leaf !== 'string' || !HEX_HASH.test(r.leaf)) return undefined;
  const stub: Stub = { seq: o.seq as number, op: o.op as Stub['op'], account_id: o.account_id, conversation_id: o.conversation_id, id: o.id, erasure: r.erasure as number, leaf: r.leaf };
  return renderStub(stub).equals(line) ? stub : undefined;
}

/**
 * The `seq` a line starts with (`{"seq":<digits>,` as every export line and stub does), read from
 * its first bytes only; undefined when it does not start so.
 */
export function seqOfLine(line: Buffer): number | undefined {
  const head = line.subarray(0, 32).toString('latin1');
  const m = /^\{"seq":([1-9]\d{0,15}),/.exec(head);
  if (!m) return undefined;
  const n = Number(m[1]);
  return Number.isSafeInteger(n) ? n : undefined;
}
