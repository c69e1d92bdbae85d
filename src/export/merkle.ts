/**
 * Merkle tree hashes of a data file's lines (RFC 6962 §2.1, SHA-256), the commitment a batch
 * record of version 2 carries for each file beside its SHA-256 (`merkle_root`, src/export/ledger.ts).
 *
 * Where the file's SHA-256 commits to its bytes as stored, the root commits to its lines one by
 * one: a line can be proven to be in a file (an audit path, {@link inclusionProof}), and a file
 * whose lines were replaced one by one by a stand-in carrying the line's leaf hash still proves
 * every other line unchanged (the root is recomputed from a stream of leaf hashes, some hashed from
 * lines, some taken from stand-ins: {@link MerkleTreeBuilder.push}).
 *
 * **A line** is the bytes of one line of the file's content (for `.jsonl.gz`, of the decompressed
 * content) without its terminating LF (`0x0a`), as they are: no decoding, no trimming, a CR kept.
 * convo-mirror ends every line it writes with one LF, so a file of `n` lines is a tree of `n`
 * leaves; bytes after the last LF (never written by convo-mirror) count as one more line, so they
 * change the root too ({@link LineTreeHasher}).
 *
 * The tree (RFC 6962 §2.1): the leaf hash of a line is `SHA-256(0x00 || line)`, an interior node
 * `SHA-256(0x01 || left || right)`; the root of `n > 1` leaves splits them at `k`, the largest power
 * of two smaller than `n`: `MTH(D[0:n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))`; one leaf's
 * root is its leaf hash; no leaf's root is `SHA-256("")`.
 */
import crypto from 'node:crypto';

/** Bytes of a hash (SHA-256). */
export const HASH_BYTES = 32;

const LEAF_PREFIX = 0x00;
const NODE_PREFIX = 0x01;
const LF = 0x0a;
const HEX_HASH = /^[0-9a-f]{64}$/;

/** The root of the empty tree, `SHA-256("")` (RFC 6962 §2.1), hex: a file with no line. */
export const EMPTY_ROOT_HEX = crypto.createHash('sha256').digest('hex');

/**
 * SHA-256 in hex, one shot. Hashes are carried as hex strings inside this module: `crypto.hash`
 * with a hex result allocates no Buffer, which makes a line's leaf about three times cheaper than
 * a `createHash` object per line (a publication hashes every line it writes).
 */
const sha256Hex = (data: Uint8Array): string => crypto.hash('sha256', data, 'hex');

/** `0x01 || left || right`, reused by {@link nodeHex} (everything here is synchronous). */
const nodeInput = Buffer.alloc(1 + 2 * HASH_BYTES);

/** `SHA-256(0x01 || left || right)` of two hex hashes, hex. */
function nodeHex(left: string, right: string): string {
  nodeInput[0] = NODE_PREFIX;
  nodeInput.write(left, 1, 'hex');
  nodeInput.write(right, 1 + HASH_BYTES, 'hex');
  return sha256Hex(nodeInput);
}

/**
 * The leaf hash of one line, `SHA-256(0x00 || line)` (RFC 6962 §2.1).
 *
 * @param line - the line's bytes without its LF (see the module comment); a string is taken as
 *   its UTF-8 bytes
 * @returns 32 bytes
 */
export function leafHash(line: Buffer | string): Buffer {
  const bytes = typeof line === 'string' ? Buffer.from(line, 'utf8') : line;
  return crypto.createHash('sha256').update(Buffer.from([LEAF_PREFIX])).update(bytes).digest();
}

/**
 * An interior node's hash, `SHA-256(0x01 || left || right)` (RFC 6962 §2.1).
 *
 * @param left - the left subtree's hash, 32 bytes
 * @param right - the right subtree's hash, 32 bytes
 * @returns 32 bytes
 * @throws RangeError when either is not 32 bytes
 */
export function nodeHash(left: Buffer, right: Buffer): Buffer {
  assertHash(left, 'left');
  assertHash(right, 'right');
  return Buffer.from(nodeHex(left.toString('hex'), right.toString('hex')), 'hex');
}

function assertHash(h: Buffer, what: string): void {
  if (h.length !== HASH_BYTES) throw new RangeError(`${what}: a hash of ${HASH_BYTES} bytes expected, got ${h.length}`);
}

/**
 * Computes a tree's root from its leaf hashes given one at a time, in order, in O(log n) memory:
 * it keeps the roots of the perfect subtrees the leaves so far make (one per set bit of the count,
 * largest, leftmost, first), merging two of the same size as soon as they exist. The root of the
 * leaves so far folds them from the right ({@link rootHex}), which is RFC 6962's split at the
 * largest power of two (§2.1).
 */
export class MerkleTreeBuilder {
  /** Roots of perfect subtrees (hex), left to right; their sizes, strictly decreasing powers of two. */
  private readonly stack: string[] = [];
  private readonly sizes: number[] = [];
  private count = 0;

  /**
   * Appends a leaf.
   *
   * @param leaf - the leaf's hash, 32 bytes: {@link leafHash} of a line, or a leaf hash carried
   *   by a stand-in for a line
   * @throws RangeError when it is not 32 bytes
   */
  push(leaf: Buffer): void {
    assertHash(leaf, 'leaf');
    this.add(leaf.toString('hex'));
  }

  /**
   * Appends a leaf given in hex, as a record or a stand-in for a line carries it.
   *
   * @param leaf - 64 lowercase hex digits
   * @throws RangeError when it is anything else
   */
  pushHex(leaf: string): void {
    if (!HEX_HASH.test(leaf)) throw new RangeError(`leaf: 64 lowercase hex digits expected, got ${JSON.stringify(leaf.slice(0, 80))}`);
    this.add(leaf);
  }

  private add(hex: string): void {
    let node = hex;
    let size = 1;
    while (this.sizes.length > 0 && this.sizes[this.sizes.length - 1] === size) {
      this.sizes.pop();
      node = nodeHex(this.stack.pop()!, node);
      size *= 2;
    }
    this.stack.push(node);
    this.sizes.push(size);
    this.count++;
  }

  /** Leaves pushed so far. */
  get size(): number {
    return this.count;
  }

  /**
   * The Merkle tree hash (RFC 6962 §2.1) of the leaves pushed so far, in lowercase hex
   * ({@link EMPTY_ROOT_HEX} for none). More leaves may be pushed after.
   */
  rootHex(): string {
    let i = this.stack.length - 1;
    if (i < 0) return EMPTY_ROOT_HEX;
    let r = this.stack[i]!;
    for (i--; i >= 0; i--) r = nodeHex(this.stack[i]!, r);
    return r;
  }

  /** {@link rootHex} as 32 bytes. */
  root(): Buffer {
    return Buffer.from(this.rootHex(), 'hex');
  }
}

/**
 * The Merkle tree hash (RFC 6962 §2.1) of `leaves`, leaf hashes in order.
 *
 * @returns 32 bytes; `SHA-256("")` ({@link EMPTY_ROOT_HEX}) for no leaf
 * @throws RangeError when a leaf is not 32 bytes
 */
export function merkleRoot(leaves: Iterable<Buffer>): Buffer {
  const b = new MerkleTreeBuilder();
  for (const leaf of leaves) b.push(leaf);
  return b.root();
}

/**
 * Splits a byte stream into lines (see the module comment) and computes the root of their tree,
 * chunk by chunk, in memory bounded by the chunk size and O(log n) for the tree: a line within a
 * chunk is hashed in one go, a line that spans chunks is hashed as its pieces come. The exporter
 * feeds it what it writes, `verify` what it reads back, so both split lines the same way.
 */
export class LineTreeHasher {
  private readonly tree = new MerkleTreeBuilder();
  /** The leaf hash of a line begun in an earlier chunk, fed as its pieces come. */
  private partial: crypto.Hash | undefined;
  /** `0x00 || line`, for lines within a chunk (grown to the longest such line, at most a chunk). */
  private scratch = Buffer.alloc(4096);

  /** Appends content bytes (uncompressed). */
  update(chunk: Buffer): void {
    let from = 0;
    for (let lf = chunk.indexOf(LF, from); lf !== -1; lf = chunk.indexOf(LF, from)) {
      if (this.partial) {
        this.tree.pushHex(this.partial.update(chunk.subarray(from, lf)).digest('hex'));
        this.partial = undefined;
      } else {
        const len = lf - from;
        if (len + 1 > this.scratch.length) this.scratch = Buffer.alloc(Math.max(len + 1, 2 * this.scratch.length));
        this.scratch[0] = LEAF_PREFIX;
        chunk.copy(this.scratch, 1, from, lf);
        this.tree.pushHex(sha256Hex(this.scratch.subarray(0, len + 1)));
      }
      from = lf + 1;
    }
    if (from < chunk.length) (this.partial ??= crypto.createHash('sha256').update(Buffer.from([LEAF_PREFIX]))).update(chunk.subarray(from));
  }

  /** Lines so far (LF-terminated ones, and the unterminated last one once {@link rootHex} was called). */
  get lines(): number {
    return this.tree.size;
  }

  /**
   * The root of the lines' tree, lowercase hex. Bytes after the last LF are taken as a last line
   * first; call it after the last {@link update}.
   *
   * @returns {@link EMPTY_ROOT_HEX} for empty content
   */
  rootHex(): string {
    if (this.partial) {
      this.tree.pushHex(this.partial.digest('hex'));
      this.partial = undefined;
    }
    return this.tree.rootHex();
  }
}

/** The largest power of two smaller than `n` (n > 1): RFC 6962's split point. */
function split(n: number): number {
  let k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}

/** MTH of `leaves[from, to)`, recursively (RFC 6962 §2.1). */
function rangeRoot(leaves: readonly Buffer[], from: number, to: number): Buffer {
  const n = to - from;
  if (n === 0) return Buffer.from(EMPTY_ROOT_HEX, 'hex');
  if (n === 1) return leaves[from]!;
  const k = split(n);
  return nodeHash(rangeRoot(leaves, from, from + k), rangeRoot(leaves, from + k, to));
}

/**
 * The audit path of leaf `index` in the tree of `leaves` (RFC 6962 §2.1.1, `PATH(m, D[n])`): the
 * sibling subtree roots from the leaf up to the root, which, with the leaf's hash, recompute the
 * root ({@link rootFromInclusionProof}). It proves one line is in a file whose root a record
 * carries, without the other lines. Holds every leaf hash (32 bytes per line).
 *
 * @param leaves - the file's leaf hashes, in order
 * @param index - the leaf's position, from 0
 * @returns the path, deepest sibling first (empty for a one-leaf tree)
 * @throws RangeError when `index` is not a position of `leaves`, or a leaf is not 32 bytes
 */
export function inclusionProof(leaves: readonly Buffer[], index: number): Buffer[] {
  if (!Number.isSafeInteger(index) || index < 0 || index >= leaves.length) throw new RangeError(`leaf ${index} is not in a tree of ${leaves.length} leaves`);
  for (const leaf of leaves) assertHash(leaf, 'leaf');
  const path: Buffer[] = [];
  let from = 0;
  let to = leaves.length;
  let m = index;
  // PATH(m, D[from:to]) = PATH(m, D[0:k]) : MTH(D[k:n]) or PATH(m - k, D[k:n]) : MTH(D[0:k]); the
  // siblings come out root-side first here, so they are reversed at the end.
  while (to - from > 1) {
    const k = split(to - from);
    if (m < k) {
      path.push(rangeRoot(leaves, from + k, to));
      to = from + k;
    } else {
      path.push(rangeRoot(leaves, from, from + k));
      from += k;
      m -= k;
    }
  }
  return path.reverse();
}

/**
 * The root an audit path leads to: leaf `index`'s hash combined with the siblings of `proof`, as
 * RFC 9162 §2.1.3.2 verifies an inclusion proof (the same tree as RFC 6962). The leaf is in the
 * tree of `size` leaves whose root is `root` when the result equals `root`.
 *
 * @param index - the leaf's position, from 0
 * @param size - leaves in the tree
 * @param leaf - the leaf's hash ({@link leafHash} of the line), 32 bytes
 * @param proof - the audit path ({@link inclusionProof})
 * @returns 32 bytes, or undefined when the path cannot be one of a leaf `index` of `size` leaves
 *   (too long or too short, or `index` not below `size`)
 * @throws RangeError when `leaf` or a sibling is not 32 bytes
 */
export function rootFromInclusionProof(index: number, size: number, leaf: Buffer, proof: readonly Buffer[]): Buffer | undefined {
  assertHash(leaf, 'leaf');
  if (!Number.isSafeInteger(index) || !Number.isSafeInteger(size) || index < 0 || index >= size) return undefined;
  // Arithmetic, not bit operators: those are 32-bit in JavaScript.
  let fn = index;
  let sn = size - 1;
  let r = leaf;
  for (const p of proof) {
    if (sn === 0) return undefined;
    if (fn % 2 === 1 || fn === sn) {
      r = nodeHash(p, r);
      while (fn % 2 === 0 && fn !== 0) {
        fn = Math.floor(fn / 2);
        sn = Math.floor(sn / 2);
      }
    } else r = nodeHash(r, p);
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  return sn === 0 ? r : undefined;
}

/**
 * Whether `proof` proves leaf `index` with hash `leaf` is in the tree of `size` leaves whose root
 * is `root` (RFC 9162 §2.1.3.2). Never throws on a malformed proof: false.
 */
export function verifyInclusion(index: number, size: number, leaf: Buffer, proof: readonly Buffer[], root: Buffer): boolean {
  if (leaf.length !== HASH_BYTES || root.length !== HASH_BYTES || proof.some((p) => p.length !== HASH_BYTES)) return false;
  const r = rootFromInclusionProof(index, size, leaf, proof);
  return r !== undefined && r.equals(root);
}
