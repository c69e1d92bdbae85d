/**
 * `convo-mirror keygen [--out <prefix>]`: writes a new Ed25519 key pair for signing the export
 * ledger, `<prefix>.key` (the private key, 0600) and `<prefix>.pub` (the public key, 0644), and
 * says what each is for. Needs no configuration; never overwrites a file. Exit 0, or 2 when a file
 * exists, its directory is missing, or it cannot be written.
 */
import path from 'node:path';
import { Option, type Command } from 'commander';
import { ConfigError } from '../errors.js';
import { KEYGEN_OUT_FLAG, SIGNING_KEY_VARIABLE, generateKeyPair } from '../export/signing.js';
import { EXIT, settle, type SetExit } from './exit.js';

/** The prefix of the two files when `--out` is not given. */
export const DEFAULT_KEY_PREFIX = 'convo-mirror-signing';

/** The two files of a prefix. @throws ConfigError naming `--out` when the prefix is empty or ends in a separator */
function keyFilesOf(prefix: string): { privateFile: string; publicFile: string } {
  if (prefix === '' || prefix.endsWith('/') || prefix.endsWith(path.sep)) {
    throw new ConfigError(KEYGEN_OUT_FLAG, `${JSON.stringify(prefix)} is not a prefix of file names: give one such as keys/${DEFAULT_KEY_PREFIX} (writes keys/${DEFAULT_KEY_PREFIX}.key and .pub)`);
  }
  return { privateFile: `${prefix}.key`, publicFile: `${prefix}.pub` };
}

/** Writes the key pair of `prefix` and prints what was written; returns the exit code. */
function keygen(prefix: string): number {
  const { privateFile, publicFile } = keyFilesOf(prefix);
  const { keyId } = generateKeyPair(privateFile, publicFile);
  process.stdout.write(
    `wrote the private key ${privateFile} (0600): keep it secret; set ${SIGNING_KEY_VARIABLE}=${path.resolve(privateFile)} for sync and the daemon\n` +
      `wrote the public key ${publicFile}: give it to auditors; they run convo-mirror verify --public-key ${publicFile}\n` +
      `key id ${keyId}\n`,
  );
  return EXIT.OK;
}

/** Adds `keygen` to `program`. */
export function addKeygenCommand(program: Command, setExit: SetExit): void {
  program
    .command('keygen')
    .description(`Write a new Ed25519 key pair for signing the export ledger: <prefix>.key (private, 0600; for ${SIGNING_KEY_VARIABLE}) and <prefix>.pub (public, for verify --public-key); never overwrites a file`)
    .addOption(new Option(`${KEYGEN_OUT_FLAG} <prefix>`, 'prefix of the two files written (their directory must exist)').default(DEFAULT_KEY_PREFIX))
    .action((o: { out: string }) => settle(setExit, () => keygen(o.out)));
}
