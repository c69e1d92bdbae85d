/**
 * Line-level commitments (src/export/merkle.ts): RFC 6962 §2.1 tree hashes and audit paths against
 * the reference vectors, the streaming builder against a naive recursive tree hash of every size up
 * to 70, and the line splitter against whole lines whatever the chunking.
 *
 * The vectors are copied from github.com/transparency-dev/merkle (commit 417fb0c3):
 * - leaf inputs, node hashes and roots for tree sizes 0..8: `testonly/constants.go`
 *   (`LeafInputs`, `NodeHashes`, `RootHashes`, `EmptyRootHash`);
 * - audit paths: `cmd/proofgen/main.go` (`inclusionProofs`, whose leaf indices count from 1), the
 *   generator of `testdata/inclusion/{0..4}/happy-path.json`.
 */
import crypto from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  EMPTY_ROOT_HEX,
  LineTreeHasher,
  MerkleTreeBuilder,
  inclusionProof,
  leafHash,
  merkleRoot,
  nodeHash,
  rootFromInclusionProof,
  verifyInclusion,
} from '../src/export/merkle.js';

const hex = (b: Buffer) => b.toString('hex');
const unhex = (s: string) => Buffer.from(s, 'hex');

/** testonly/constants.go `LeafInputs()`. */
const LEAF_INPUTS = ['', '00', '10', '2021', '3031', '40414243', '5051525354555657', '606162636465666768696a6b6c6d6e6f'];

/** testonly/constants.go `NodeHashes()[0]`: the leaf hashes of {@link LEAF_INPUTS}. */
const LEAF_HASHES = [
  '6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d',
  '96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7',
  '0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7',
  '07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7',
  'bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b',
  '4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658',
  'b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f',
  '46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1',
];

/** testonly/constants.go `RootHashes()`: the root of the first `n` leaves, n = 0..8. */
const ROOTS = [
  'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
  '6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d',
  'fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125',
  'aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77',
  'd37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7',
  '4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4',
  '76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef',
  'ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c',
  '5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328',
];

/** cmd/proofgen/main.go `inclusionProofs`: leaf index (from 0 here), tree size, audit path. */
const PATHS: [number, number, string[]][] = [
  [0, 1, []],
  [0, 8, ['96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7', '5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e', '6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4']],
  [5, 8, ['bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b', 'ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0', 'd37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7']],
  [2, 3, ['fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125']],
  [1, 5, ['6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d', '5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e', 'bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b']],
];

const leaves = LEAF_INPUTS.map((l) => leafHash(unhex(l)));

/** The RFC's definition, written out again: recursive, split at the largest power of two below n. */
function naiveRoot(hs: Buffer[]): Buffer {
  const sha = (...parts: Buffer[]) => crypto.createHash('sha256').update(Buffer.concat(parts)).digest();
  if (hs.length === 0) return sha();
  if (hs.length === 1) return hs[0]!;
  let k = 1;
  while (k * 2 < hs.length) k *= 2;
  return sha(Buffer.from([1]), naiveRoot(hs.slice(0, k)), naiveRoot(hs.slice(k)));
}

describe('RFC 6962 reference vectors (transparency-dev/merkle)', () => {
  it('leaf hashes of the eight leaf inputs', () => {
    expect(leaves.map(hex)).toEqual(LEAF_HASHES);
  });

  it('the root of every tree size 0..8, by merkleRoot and by the streaming builder', () => {
    expect(EMPTY_ROOT_HEX).toBe(ROOTS[0]);
    for (let n = 0; n <= 8; n++) expect(hex(merkleRoot(leaves.slice(0, n))), `size ${n}`).toBe(ROOTS[n]);
    const b = new MerkleTreeBuilder();
    const seen = [hex(b.root())];
    for (const leaf of leaves) {
      b.push(leaf);
      seen.push(hex(b.root()));
    }
    expect(seen).toEqual(ROOTS);
    expect(b.size).toBe(8);
    const fromHex = new MerkleTreeBuilder();
    for (const h of LEAF_HASHES) fromHex.pushHex(h);
    expect(fromHex.rootHex()).toBe(ROOTS[8]);
  });

  it('interior nodes: the two-leaf root is nodeHash of the leaves', () => {
    expect(hex(nodeHash(leaves[0]!, leaves[1]!))).toBe('fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125');
    expect(hex(nodeHash(leaves[6]!, leaves[7]!))).toBe('ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0');
  });

  it.each(PATHS)('the audit path of leaf %i in a tree of %i leaves, and it proves the leaf', (index, size, path) => {
    const tree = leaves.slice(0, size);
    expect(inclusionProof(tree, index).map(hex)).toEqual(path);
    const proof = path.map(unhex);
    expect(hex(rootFromInclusionProof(index, size, leaves[index]!, proof)!)).toBe(ROOTS[size]);
    expect(verifyInclusion(index, size, leaves[index]!, proof, unhex(ROOTS[size]!))).toBe(true);
  });

  it('a wrong leaf, index, size, sibling or root, or a path too long or too short, proves nothing', () => {
    const [index, size, path] = PATHS[2]!;
    const proof = path.map(unhex);
    const root = unhex(ROOTS[size]!);
    const leaf = leaves[index]!;
    expect(verifyInclusion(index, size, leaves[index + 1]!, proof, root)).toBe(false);
    expect(verifyInclusion(index + 1, size, leaf, proof, root)).toBe(false);
    expect(verifyInclusion(index - 1, size, leaf, proof, root)).toBe(false);
    // the size changes made by transparency-dev/merkle's testdata/inclusion/*/treeSize-{div,mul}-@2.json
    expect(verifyInclusion(index, size / 2, leaf, proof, root)).toBe(false);
    expect(verifyInclusion(index, size * 2, leaf, proof, root)).toBe(false);
    expect(verifyInclusion(size, size, leaf, proof, root)).toBe(false);
    for (let i = 0; i < proof.length; i++) {
      const bad = proof.map((p, j) => (j === i ? Buffer.from(p.map((x, at) => (at === 0 ? x ^ 1 : x))) : p));
      expect(verifyInclusion(index, size, leaf, bad, root), `sibling ${i}`).toBe(false);
    }
    expect(verifyInclusion(index, size, leaf, [...proof, leaves[0]!], root)).toBe(false);
    expect(verifyInclusion(index, size, leaf, proof.slice(0, -1), root)).toBe(false);
    expect(verifyInclusion(index, size, leaf, proof, unhex(ROOTS[size - 1]!))).toBe(false);
    expect(verifyInclusion(index, size, leaf, [Buffer.alloc(31)], root)).toBe(false);
  });
});

describe('the streaming builder and audit paths against the recursive definition', () => {
  it('every size 0..70: the root after each push is the naive root; every leaf has a path that proves it', () => {
    const hs = Array.from({ length: 70 }, (_, i) => leafHash(`line ${i}`));
    const b = new MerkleTreeBuilder();
    for (let n = 0; n <= hs.length; n++) {
      const want = naiveRoot(hs.slice(0, n));
      expect(hex(b.root()), `size ${n}`).toBe(hex(want));
      for (let i = 0; i < n; i++) {
        const proof = inclusionProof(hs.slice(0, n), i);
        expect(proof.length, `leaf ${i} of ${n}`).toBeLessThanOrEqual(Math.ceil(Math.log2(n)));
        expect(verifyInclusion(i, n, hs[i]!, proof, want), `leaf ${i} of ${n}`).toBe(true);
        if (n > 1) expect(verifyInclusion(i, n, hs[(i + 1) % n]!, proof, want), `another leaf at ${i} of ${n}`).toBe(false);
      }
      if (n < hs.length) b.push(hs[n]!);
    }
  });

  it('keeps one subtree root per set bit of the count, whatever the count', () => {
    const b = new MerkleTreeBuilder();
    const leaf = leafHash('x');
    for (let n = 1; n <= 1000; n++) {
      b.push(leaf);
      const stack = (b as unknown as { stack: unknown[] }).stack;
      expect(stack.length, `after ${n}`).toBe(n.toString(2).replace(/0/g, '').length);
    }
  });

  it('refuses a leaf or node that is not 32 bytes, and a path for a leaf outside the tree', () => {
    expect(() => new MerkleTreeBuilder().push(Buffer.alloc(31))).toThrow(RangeError);
    expect(() => nodeHash(Buffer.alloc(32), Buffer.alloc(33))).toThrow(RangeError);
    expect(() => inclusionProof(leaves, 8)).toThrow(/leaf 8 is not in a tree of 8 leaves/);
    expect(() => inclusionProof([], 0)).toThrow(RangeError);
    expect(() => new MerkleTreeBuilder().pushHex('A'.repeat(64))).toThrow(/64 lowercase hex digits/);
    expect(() => new MerkleTreeBuilder().pushHex('0'.repeat(63))).toThrow(RangeError);
  });

  it('a string line is hashed as its UTF-8 bytes', () => {
    expect(leafHash('héllo 🙂').equals(leafHash(Buffer.from('héllo 🙂', 'utf8')))).toBe(true);
    expect(hex(leafHash(''))).toBe(LEAF_HASHES[0]);
  });
});

describe('LineTreeHasher: lines of a byte stream', () => {
  const lines = ['{"seq":1,"op":"insert"}', '', '{"seq":3,"content":"héllo\\n 🙂"}', 'carriage\r', 'x'.repeat(300), 'y'.repeat(9000)]; // the last one longer than the hasher's first scratch buffer
  const content = Buffer.from(lines.map((l) => `${l}\n`).join(''), 'utf8');
  const expected = merkleRoot(lines.map((l) => leafHash(l)));

  it('a line is its bytes without the LF, however the content is chunked (each split point, and byte by byte)', () => {
    for (let at = 0; at <= content.length; at++) {
      const t = new LineTreeHasher();
      t.update(content.subarray(0, at));
      t.update(content.subarray(at));
      expect(t.rootHex(), `split at ${at}`).toBe(hex(expected));
      expect(t.lines).toBe(lines.length);
    }
    const t = new LineTreeHasher();
    for (let i = 0; i < content.length; i++) t.update(content.subarray(i, i + 1));
    expect(t.rootHex()).toBe(hex(expected));
  });

  it('bytes after the last LF are one more line; empty content is the empty tree', () => {
    const t = new LineTreeHasher();
    t.update(Buffer.from('a\nb'));
    expect(t.rootHex()).toBe(hex(merkleRoot([leafHash('a'), leafHash('b')])));
    expect(t.lines).toBe(2);
    const empty = new LineTreeHasher();
    empty.update(Buffer.alloc(0));
    expect(empty.rootHex()).toBe(ROOTS[0]);
    const one = new LineTreeHasher();
    one.update(Buffer.from('\n'));
    expect(one.rootHex()).toBe(LEAF_HASHES[0]); // one empty line
  });

  it('a changed byte, a line dropped or two lines swapped change the root', () => {
    const rootOf = (s: string) => {
      const t = new LineTreeHasher();
      t.update(Buffer.from(s));
      return t.rootHex();
    };
    const base = rootOf('a\nb\nc\n');
    expect(rootOf('a\nb\nd\n')).not.toBe(base);
    expect(rootOf('a\nc\n')).not.toBe(base);
    expect(rootOf('b\na\nc\n')).not.toBe(base);
    expect(rootOf('a\nb\nc\n')).toBe(base);
  });
});
