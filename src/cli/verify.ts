/**
 * `convo-mirror verify`: the auditor's tool. Checks the archive from its own evidence (the ledger's
 * hash chain from genesis to head, every file it lists, nothing unlisted, the manifest) and, when
 * the mirror's database is there, against the mirror too (`quick_check`, its ledger); `--head`
 * proves the archive still holds, unchanged, everything up to a head noted earlier; `--public-key`
 * checks every record's signature and the head pointer's (`--signed-from` accepts an unsigned
 * prefix); `--witness` proves it still holds every head the witness saw; `--max-age` fails when the
 * newest signed head is older than that; `--deep` replays every export line against the mirror's
 * rows. Read without the writer lock; works on a read-only copy, and without the database.
 *
 * Output: one `problem:` line per problem on stderr (the path, what was found and what was
 * expected), then one verdict per check and the archive's verdict on stdout; the last line never
 * says intact when a check failed.
 *
 * Exit 0 intact, 1 with problems, 2 for a usage or configuration error (a bad `--head`,
 * `--signed-from` or `--max-age`, an unusable public key or a private one, a missing `--witness`
 * directory, `--deep` without the database).
 */
import fs from 'node:fs';
import type { Command } from 'commander';
import { parseDuration } from '../../config/duration.js';
import { ConfigError } from '../errors.js';
import { loadPublicKey, type PublicKey } from '../export/signing.js';
import type { Check, HeadRef, VerifyOptions, VerifyProblem } from '../export/verify.js';
import { EXIT, exitFor, type SetExit } from './exit.js';
import { escapeForTerminal, jsonForTerminal } from '../terminal.js';
import { addConfigFlags, configFlagsOf } from './flags.js';
import { verifyOf, withExistingMirror, type VerifyResult } from './read-only.js';

/**
 * A head as noted from a summary or `status`: `<batch id>:<sha256 hex>`, or the hash alone.
 *
 * @throws {@link ConfigError} (`--head`) for anything else
 */
export function parseHeadRef(text: string): HeadRef {
  const m = /^(?:(\d{1,15}):)?([0-9a-f]{64})$/.exec(text.trim().toLowerCase());
  if (!m) throw new ConfigError('--head', `expected <batch id>:<64 hex digits> (as sync and status print it) or the 64 hex digits alone, got ${JSON.stringify(text)}`);
  return m[1] === undefined ? { hash: m[2]! } : { batch_id: Number(m[1]), hash: m[2]! };
}

/** What `verify`'s flags ask for, parsed and checked before anything is read. */
export type VerifyFlags = Omit<VerifyOptions, 'exportDir' | 'mirror' | 'clock'>;

/**
 * Parses and checks `verify`'s own flags: `--head`, `--public-key` (a public key: a private one is
 * refused), `--signed-from` (a batch id, only with `--public-key`), `--witness` (an existing
 * directory), `--max-age` (a duration such as 90m or 2d), `--deep`.
 *
 * @throws {@link ConfigError} naming the flag, in one line
 */
export function parseVerifyFlags(o: { deep?: boolean; head?: string; publicKey?: string; signedFrom?: string; witness?: string; maxAge?: string }): VerifyFlags {
  const head = o.head === undefined ? undefined : parseHeadRef(o.head);
  let signedFrom: number | undefined;
  if (o.signedFrom !== undefined) {
    if (!/^\s*\d{1,15}\s*$/.test(o.signedFrom) || Number(o.signedFrom) < 1) throw new ConfigError('--signed-from', `expected a batch id (a whole number from 1, as its record _ledger/<12 digits>.json is named), got ${JSON.stringify(o.signedFrom)}`);
    if (o.publicKey === undefined) throw new ConfigError('--signed-from', 'needs --public-key: it says from which batch on every record must be signed by that key');
    signedFrom = Number(o.signedFrom);
  }
  let maxAgeMs: number | undefined;
  if (o.maxAge !== undefined) {
    try {
      maxAgeMs = parseDuration(o.maxAge);
    } catch (err) {
      throw new ConfigError('--max-age', (err as Error).message);
    }
  }
  if (o.witness !== undefined) {
    let st: fs.Stats;
    try {
      st = fs.statSync(o.witness);
    } catch {
      throw new ConfigError('--witness', `${o.witness} does not exist: give the witness directory (the publisher's CONVO_MIRROR_WITNESS_DIR, or a copy of it)`);
    }
    if (!st.isDirectory()) throw new ConfigError('--witness', `${o.witness} is not a directory: give the witness directory, not its file`);
  }
  const publicKey: PublicKey | undefined = o.publicKey === undefined ? undefined : loadPublicKey(o.publicKey);
  return { head, publicKey, signedFrom, witnessDir: o.witness, maxAgeMs, deep: o.deep === true };
}

const MARK: Record<Check['status'], string> = { ok: 'ok  ', failed: 'FAIL', skipped: 'skip' };

/** Units of the values a problem found and expected, by kind. */
const UNIT: Partial<Record<VerifyProblem['problem'], string>> = { size: ' bytes', lines: ' lines' };

/**
 * A problem as one line: `problem: <path>: <kind>[ found <value>, expected <value>][ (<detail>)]`,
 * values whole (a SHA-256 in its 64 hex digits).
 */
export function problemLine(p: VerifyProblem): string {
  const unit = UNIT[p.problem] ?? '';
  const values = p.found !== undefined || p.expected !== undefined ? ` found ${p.found ?? 'nothing'}${unit}, expected ${p.expected ?? 'nothing'}${unit}` : '';
  // Paths and details quote what the archive holds (file names, a record's or the manifest's
  // fields): escaped, so a tampered archive cannot write over the lines an auditor reads.
  return escapeForTerminal(`problem: ${p.path || '(exports)'}: ${p.problem}${values}${p.detail ? ` (${p.detail})` : ''}`);
}

/**
 * One line per erasure record (`erased: record 9 (_ledger/….json): erasure 3 of a sender of account
 * …, requested …, reason "DSR-1": 4 lines in 2 files`), and one per file erased without line proof;
 * escaped (a reason is whatever the operator typed).
 */
export function erasureLines(r: Pick<VerifyResult, 'erasures' | 'erasedWithoutLineProof'>): string[] {
  const out = r.erasures.map(
    (e) =>
      `erased: record ${e.record} (${e.path}): erasure ${e.erasure.id} of ${e.erasure.kind === 'retention' ? `the messages created before ${e.erasure.cutoff ?? '?'} (retention)` : `a ${e.erasure.kind}`} of account ${e.erasure.account_id}, requested ${e.erasure.requested_at}, reason ${JSON.stringify(e.erasure.reason)}: ` +
      `${e.lines} line${e.lines === 1 ? '' : 's'} in ${e.files} file${e.files === 1 ? '' : 's'} replaced by stubs`,
  );
  for (const p of r.erasedWithoutLineProof) out.push(`erased without line proof: ${p} (published by a record of version 1, which has no Merkle root: its bytes are proven by the SHA-256 of the erasure record that rewrote it, its lines are not)`);
  return out.map((l) => escapeForTerminal(l));
}

/**
 * One line per retention record (`expired: record 12 (_ledger/….json): retention 400d, cutoff
 * 2025-10-23, decided …: 3 files, 120 lines`; per stream `cutoff messages 2025-10-23, runs
 * 2019-11-27`), and one per expired file still present (a note, not a problem); escaped.
 */
export function retentionLines(r: Pick<VerifyResult, 'retentions' | 'expiredPresent'>): string[] {
  const out = r.retentions.map(
    (e) =>
      `expired: record ${e.record} (${e.path}): retention ${e.retention.policy}, ${cutoffText(e.retention.cutoff)}, decided ${e.retention.decided_at}: ` +
      `${e.files} file${e.files === 1 ? '' : 's'}, ${e.lines} line${e.lines === 1 ? '' : 's'}`,
  );
  for (const p of r.expiredPresent) out.push(`expired but still present: ${p} (a retention record expired it; the next publication removes it)`);
  return out.map((l) => escapeForTerminal(l));
}

/** A retention record's cutoffs in words: `cutoff 2025-10-23` when every stream limited has the same, else `cutoff messages 2025-10-23, runs 2019-11-27`. */
function cutoffText(cutoff: Record<string, string | undefined>): string {
  const days = Object.entries(cutoff).filter((e): e is [string, string] => e[1] !== undefined);
  if (days.length > 0 && days.every(([, d]) => d === days[0]![1])) return `cutoff ${days[0]![1]}`;
  return `cutoff ${days.map(([s, d]) => `${s} ${d}`).join(', ')}`;
}

/** Prints the report (problems on stderr; checks and verdict on stdout); returns the exit code. */
function printVerify(r: VerifyResult, o: { json: boolean; deepWithoutDb: boolean }): number {
  const code = o.deepWithoutDb ? EXIT.CONFIG : r.problems.length === 0 ? EXIT.OK : EXIT.FAILURES;
  const withoutDb = r.file ? '' : ' (verified without the database)';
  if (o.json) {
    process.stdout.write(jsonForTerminal({ ok: code === EXIT.OK, exit_code: code, db: r.file ?? null, ...r, verdict: r.verdict + withoutDb }, 2) + '\n');
    return code;
  }
  for (const p of r.problems) process.stderr.write(problemLine(p) + '\n');
  const lines = [...erasureLines(r), ...retentionLines(r), ...r.checks.map((c) => `${MARK[c.status]} ${c.name}: ${escapeForTerminal(c.detail)}`)];
  lines.push(escapeForTerminal(r.verdict + withoutDb));
  if (o.deepWithoutDb) lines.push(`--deep needs the mirror's database: none at the configured CONVO_MIRROR_DB`);
  process.stdout.write(lines.join('\n') + '\n');
  return code;
}

/** Adds `verify` to `program`. */
export function addVerifyCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('verify')
    .description(
      "Verify the archive: the ledger's hash chain, every published file (size, lines, SHA-256), nothing unlisted, the signed head; with the database, against the mirror too. Works without the database",
    )
    .option('--deep', "also replay every export line in seq order and compare with the mirror's rows (needs the database)")
    .option('--head <batch:hash>', 'also prove the archive still holds, unchanged, everything up to this chain head (as sync and status print it)')
    .option('--public-key <file>', 'check every batch record and the head pointer are signed by this Ed25519 public key (PEM; convo-mirror keygen writes one; a private key is refused)')
    .option('--signed-from <batch>', 'with --public-key: records before this batch may be unsigned (an archive signed from that batch on)')
    .option('--witness <dir>', "also prove the archive still holds everything every head in this witness directory covered (the publisher's CONVO_MIRROR_WITNESS_DIR)")
    .option('--max-age <duration>', 'fail when the newest signed head is older than this, e.g. 2h or 1d (authenticated only with --public-key)')
    .option('--json', 'print the report as JSON');
  addConfigFlags(cmd, 'verify').action(async (o: { deep?: boolean; head?: string; publicKey?: string; signedFrom?: string; witness?: string; maxAge?: string; json?: boolean }) => {
    let opts: VerifyFlags;
    try {
      opts = parseVerifyFlags(o);
    } catch (err) {
      setExit(exitFor(err));
      return;
    }
    let deepWithoutDb = false;
    await withExistingMirror(
      configFlagsOf(o, 'verify'),
      setExit,
      (mirror, config) => verifyOf(mirror, { ...opts, exportDir: config.exportDir }),
      (result) => printVerify(result, { json: o.json === true, deepWithoutDb }),
      {
        withoutMirror: (config) => {
          if (!fs.existsSync(config.exportDir)) {
            throw new ConfigError('CONVO_MIRROR_DB', `no mirror at ${config.db} and no archive at ${config.exportDir} (CONVO_MIRROR_EXPORT_DIR): nothing to verify`);
          }
          deepWithoutDb = opts.deep === true;
          return verifyOf(undefined, { ...opts, exportDir: config.exportDir });
        },
      },
    );
  });
}
