/**
 * What `verify` reports: one {@link VerifyProblem} per thing found wrong, and one {@link Check}
 * per check, run or not.
 */

/**
 * What is wrong with one path:
 * - `missing`: a listed file, a record or `manifest.json` is absent (detail: why, when not plain
 *   absence, e.g. `<dir> does not exist`, `messages/account=x is not a directory`);
 * - `not-regular`: it is not a regular file, or is reached through a symbolic link (not followed);
 * - `size`, `sha256`, `lines`: a listed file's bytes differ from its record: `found` is what the
 *   file holds, `expected` what its record says (bytes, the hex SHA-256 in full, lines; for
 *   `.jsonl.gz` lines are counted after decompression);
 * - `merkle_root`: the Merkle tree hash of a listed file's lines (decompressed, for `.jsonl.gz`)
 *   is not the one its record (of version 2) commits to: `found` and `expected` are the hex roots,
 *   detail names the record;
 * - `record`: a batch record that does not read back (not JSON, a wrong shape, its hash does not
 *   match its content, another batch's or another mirror's record);
 * - `chain`: a link of the hash chain does not hold (a record missing, altered and re-hashed,
 *   inserted or reordered);
 * - `unsigned`, `signature`: with a public key, a record or a signed head (`manifest.json`, a
 *   witness line) without a signature, or one that does not verify (invalid, another key, malformed);
 * - `head`: the head given with `--head` is not in the chain, or the chain is broken before it;
 * - `manifest`: `manifest.json` is not the pointer the chain (and the mirror) imply, or not a
 *   signed head convo-mirror reads;
 * - `witness`: with `--witness`, a witness line that is malformed, out of order or of another
 *   mirror, or a witnessed head this archive no longer holds, unbroken and unchanged;
 * - `age`: with `--max-age`, the newest signed head is older than that (or carries no usable time);
 * - `mirror`: the ledger on disk and the mirror's records disagree (a record the mirror does not
 *   have, or the other way round, or another hash);
 * - `unlisted`: anything in `messages/`, `conversations/`, `runs/` or `_ledger/` that no record lists;
 * - `deep`: `--deep` found the exports and the mirror's rows disagree (detail names the key);
 * - `temp`: an entry in `.convo-mirror-tmp/`, left by an interrupted publication;
 * - `erasure`: a file an erasure record rewrote does not hold what the records say of its erased
 *   lines (a stub no erasure record lists, a stub whose leaf is not the one recorded, a line
 *   recorded as erased that is not a stub, one missing), a file an erasure record replaced still
 *   there, or an erasure record that does not follow the records before it (detail names the
 *   file, the seq and the record).
 */
export type VerifyProblemKind =
  | 'missing'
  | 'not-regular'
  | 'size'
  | 'sha256'
  | 'lines'
  | 'merkle_root'
  | 'record'
  | 'chain'
  | 'unsigned'
  | 'signature'
  | 'head'
  | 'manifest'
  | 'witness'
  | 'age'
  | 'mirror'
  | 'unlisted'
  | 'deep'
  | 'temp'
  | 'erasure'
  | 'retention';

/** A problem found by `verify`. */
export interface VerifyProblem {
  /**
   * Relative to the export directory, `/`-separated (`manifest.json`, `_ledger/….json`, a data
   * file); the mirror's file for `mirror`; the witness file and line (`/mnt/w/<id>.heads.jsonl:12`)
   * for `witness`.
   */
  path: string;
  problem: VerifyProblemKind;
  /** What was found (`size`: bytes, `lines`: lines, `sha256`: the hex digest, `merkle_root`: the hex root, in full), when a value differs. */
  found?: string | number;
  /** What was expected, in the same unit as {@link VerifyProblem.found}. */
  expected?: string | number;
  /** One line saying more, when there is more to say. */
  detail?: string;
}

/** The checks `verify` runs, in the order it reports them. */
export type CheckName = 'database' | 'chain' | 'files' | 'unlisted' | 'manifest' | 'signatures' | 'head' | 'witness' | 'age' | 'mirror' | 'deep' | 'temp';

/** One check: passed (`ok`), found problems (`failed`), or could not or was not asked to run (`skipped`, with why). */
export interface Check {
  name: CheckName;
  status: 'ok' | 'failed' | 'skipped';
  /** What was checked, or why it was skipped, in one line. */
  detail: string;
}
