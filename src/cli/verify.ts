/**
 * `convo-mirror verify`: the auditor's tool. Checks the archive from its own evidence (the ledger's
 * hash chain from genesis to head, every file it lists, nothing unlisted, the manifest) and, when
 * the mirror's database is there, against the mirror too (`quick_check`, its ledger); `--head`
 * proves the archive still holds, unchanged, everything up to a head noted earlier; `--public-key`
 * checks every record's signature; `--deep` replays every export line against the mirror's rows.
 * Read without the writer lock; works on a read-only copy, and without the database.
 *
 * Exit 0 intact, 1 with problems, 2 for a usage or configuration error (a bad `--head`, an unusable
 * public key, `--deep` without the database).
 */
import fs from 'node:fs';
import type { Command } from 'commander';
import { ConfigError } from '../errors.js';
import { loadPublicKey, type PublicKey } from '../export/signing.js';
import type { Check, HeadRef } from '../export/verify.js';
import { EXIT, exitFor, type SetExit } from './exit.js';
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

const MARK: Record<Check['status'], string> = { ok: 'ok  ', failed: 'FAIL', skipped: 'skip' };

/** Prints the report (checks and verdict on stdout, problems on stderr); returns the exit code. */
function printVerify(r: VerifyResult, o: { json: boolean; deepWithoutDb: boolean }): number {
  const code = o.deepWithoutDb ? EXIT.CONFIG : r.problems.length === 0 ? EXIT.OK : EXIT.FAILURES;
  if (o.json) {
    process.stdout.write(JSON.stringify({ ok: code === EXIT.OK, exit_code: code, db: r.file ?? null, ...r }, null, 2) + '\n');
    return code;
  }
  for (const p of r.problems) process.stderr.write(`problem: ${p.path || '(exports)'}: ${p.problem}${p.detail ? ` (${p.detail})` : ''}\n`);
  const lines = r.checks.map((c) => `${MARK[c.status]} ${c.name}: ${c.detail}`);
  const head = r.head ? `${r.head.batch_id}:${r.head.hash}` : 'none';
  lines.push(
    r.problems.length === 0
      ? `archive intact: ${r.records} records, ${r.files} files, ${r.lines} lines; head ${head}` + (r.file ? '' : ' (verified without the database)')
      : `${r.problems.length} problem${r.problems.length === 1 ? '' : 's'} in ${r.exportDir}${r.file ? '' : ' (verified without the database)'}; the chain is intact up to head ${head}`,
  );
  if (o.deepWithoutDb) lines.push(`--deep needs the mirror's database: none at the configured CONVO_MIRROR_DB`);
  process.stdout.write(lines.join('\n') + '\n');
  return code;
}

/** Adds `verify` to `program`. */
export function addVerifyCommand(program: Command, setExit: SetExit): void {
  const cmd = program
    .command('verify')
    .description(
      "Verify the archive: the ledger's hash chain, every published file (size, lines, SHA-256), nothing unlisted, the manifest; with the database, against the mirror too. Works without the database",
    )
    .option('--deep', "also replay every export line in seq order and compare with the mirror's rows (needs the database)")
    .option('--head <batch:hash>', 'also prove the archive still holds, unchanged, everything up to this chain head (as sync and status print it)')
    .option('--public-key <file>', 'check every batch record is signed by this Ed25519 public key (PEM; convo-mirror keygen writes one)')
    .option('--json', 'print the report as JSON');
  addConfigFlags(cmd, 'verify').action(async (o: { deep?: boolean; head?: string; publicKey?: string; json?: boolean }) => {
    let head: HeadRef | undefined;
    let publicKey: PublicKey | undefined;
    try {
      head = o.head === undefined ? undefined : parseHeadRef(o.head);
      publicKey = o.publicKey === undefined ? undefined : loadPublicKey(o.publicKey);
    } catch (err) {
      setExit(exitFor(err));
      return;
    }
    const opts = { head, publicKey, deep: o.deep === true };
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
          deepWithoutDb = opts.deep;
          return verifyOf(undefined, { ...opts, exportDir: config.exportDir });
        },
      },
    );
  });
}
