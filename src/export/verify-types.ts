/**
 * What `verify` reports: one {@link VerifyProblem} per thing found wrong, and one {@link Check}
 * per check, run or not.
 */

/**
 * What is wrong with one path:
 * - `missing`: a listed file, a record or `manifest.json` is absent (detail: why, when not plain
 *   absence, e.g. `<dir> does not exist`, `messages/account=x is not a directory`);
 * - `not-regular`: it is not a regular file, or is reached through a symbolic link (not followed);
 * - `size`, `sha256`, `lines`: a listed file's bytes differ from its record (`N bytes, expected M`,
 *   `N lines, expected M`; for `.jsonl.gz` lines are counted after decompression);
 * - `record`: a batch record that does not read back (not JSON, a wrong shape, its hash does not
 *   match its content, another batch's or another mirror's record);
 * - `chain`: a link of the hash chain does not hold (a record missing, altered and re-hashed,
 *   inserted or reordered);
 * - `unsigned`, `signature`: with a public key, a record without a signature, or one that does not
 *   verify (invalid, another key, malformed);
 * - `head`: the head given with `--head` is not in the chain, or the chain is broken before it;
 * - `manifest`: `manifest.json` is not the pointer the chain (and the mirror) imply;
 * - `mirror`: the ledger on disk and the mirror's records disagree (a record the mirror does not
 *   have, or the other way round, or another hash);
 * - `unlisted`: anything in `messages/`, `conversations/`, `runs/` or `_ledger/` that no record lists;
 * - `deep`: `--deep` found the exports and the mirror's rows disagree (detail names the key);
 * - `temp`: an entry in `.convo-mirror-tmp/`, left by an interrupted publication.
 */
export type VerifyProblemKind =
  | 'missing'
  | 'not-regular'
  | 'size'
  | 'sha256'
  | 'lines'
  | 'record'
  | 'chain'
  | 'unsigned'
  | 'signature'
  | 'head'
  | 'manifest'
  | 'mirror'
  | 'unlisted'
  | 'deep'
  | 'temp';

/** A problem found by `verify`. */
export interface VerifyProblem {
  /** Relative to the export directory, `/`-separated (`manifest.json`, `_ledger/….json`, a data file); the mirror's file for `mirror`. */
  path: string;
  problem: VerifyProblemKind;
  /** One line saying more, when there is more to say. */
  detail?: string;
}

/** The checks `verify` runs, in the order it reports them. */
export type CheckName = 'database' | 'ledger' | 'files' | 'unlisted' | 'manifest' | 'signatures' | 'head' | 'mirror' | 'deep' | 'temp';

/** One check: passed (`ok`), found problems (`failed`), or could not or was not asked to run (`skipped`, with why). */
export interface Check {
  name: CheckName;
  status: 'ok' | 'failed' | 'skipped';
  /** What was checked, or why it was skipped, in one line. */
  detail: string;
}
