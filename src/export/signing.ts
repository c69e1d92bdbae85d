/**
 * Ed25519 keys of the export ledger: loading the signing key (`CONVO_MIRROR_SIGNING_KEY_FILE`) and
 * an auditor's public key (`verify --public-key`, which refuses a private key), key ids, detached
 * signatures over a record's or a signed head's canonical body bytes and their check, and the key
 * pair `convo-mirror keygen` writes.
 *
 * Keys are PEM files: the private key PKCS#8 (`-----BEGIN PRIVATE KEY-----`), the public key SPKI
 * (`-----BEGIN PUBLIC KEY-----`). Nothing here ever prints, logs or puts key material in an error:
 * errors name the file and say what is wrong with it in plain words.
 */
import crypto, { type KeyObject } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../errors.js';
import { createPrivateFile, fsyncDir } from '../private-fs.js';

/** The variable whose file {@link loadSigningKey} reads, named by its errors. */
export const SIGNING_KEY_VARIABLE = 'CONVO_MIRROR_SIGNING_KEY_FILE';

/** The flag {@link generateKeyPair}'s errors name (the prefix of the files `keygen` writes). */
export const KEYGEN_OUT_FLAG = '--out';

/** The one signature algorithm of the ledger. */
export const SIGNATURE_ALGORITHM = 'ed25519';

/** Bytes of an Ed25519 signature (RFC 8032). */
const SIGNATURE_BYTES = 64;

/** A key file larger than this is not a PEM key (an Ed25519 PKCS#8 PEM is 119 bytes). */
const MAX_KEY_FILE_BYTES = 64 * 1024;

/** The private key that signs ledger records, as {@link loadSigningKey} loaded it. */
export interface SigningKey {
  /** The Ed25519 private key. */
  privateKey: KeyObject;
  /** {@link keyId} of its public key: `sha256:<64 hex digits>`. */
  keyId: string;
  /** The file it was read from, as given. */
  file: string;
  /**
   * Set when the file can be read or written by its group or others (mode & 0o077), e.g.
   * `keys/signing.key can be read or written by others (mode 0644); chmod 600 it`. The caller logs it.
   */
  warning?: string;
}

/** A public key that checks ledger signatures, as {@link loadPublicKey} loaded it. */
export interface PublicKey {
  /** The Ed25519 public key. */
  key: KeyObject;
  /** {@link keyId} of the key: `sha256:<64 hex digits>`. */
  keyId: string;
  /** The file it was read from, as given. */
  file: string;
}

/** A detached signature, as a ledger record carries it. */
export interface Signature {
  algorithm: 'ed25519';
  /** {@link keyId} of the public key that checks it. */
  key_id: string;
  /** The 64-byte Ed25519 signature, standard base64 with padding (88 characters). */
  value: string;
}

/**
 * What {@link checkSignature} found: `valid`; `wrong-key` (made by another key: its `key_id` is not
 * the given key's); `invalid` (the key's id, but the signature does not match the bytes); `malformed`
 * (not a {@link Signature}).
 */
export type SignatureCheck = 'valid' | 'wrong-key' | 'invalid' | 'malformed';

/** Permission bits of the two files {@link generateKeyPair} writes. */
export interface KeyPairModes {
  /** Mode of the private key file. @defaultValue 0o600 */
  privateKey: number;
  /** Mode of the public key file. @defaultValue 0o644 */
  publicKey: number;
}

/** The default {@link KeyPairModes}: the private key 0600, the public key 0644. */
export const KEY_PAIR_MODES: Readonly<KeyPairModes> = Object.freeze({ privateKey: 0o600, publicKey: 0o644 });

/**
 * The id of a key: `sha256:` followed by the lowercase hex SHA-256 of the public key's SPKI DER
 * encoding (`publicKey.export({ type: 'spki', format: 'der' })`, 44 bytes for Ed25519). It is the
 * same whichever PEM file the key came from, and says which key made a signature without revealing
 * anything a public key does not. Given a private key, the id of its public key.
 *
 * @returns `sha256:<64 hex digits>`
 */
export function keyId(publicKey: KeyObject): string {
  const pub = publicKey.type === 'private' ? crypto.createPublicKey(publicKey) : publicKey;
  const der = pub.export({ type: 'spki', format: 'der' });
  return `sha256:${crypto.createHash('sha256').update(der).digest('hex')}`;
}

/** What {@link readKeyFile} read: the bytes and the file's mode. */
interface KeyFile {
  pem: Buffer;
  mode: number;
}

/** Plain words for a failure to open or read a key file. */
function readFailure(err: unknown, file: string): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return `the key file ${file} is missing (no such file)`;
  if (code === 'EACCES' || code === 'EPERM') return `permission denied reading the key file ${file}: run as its owner, or give this user read access`;
  if (code === 'ENOTDIR') return `the key file ${file} is missing (a directory on its path is a file)`;
  return `cannot read the key file ${file} (${code ?? (err as Error).message})`;
}

/**
 * Reads a key file (a regular file of at most 64 KiB) and its mode, through one descriptor.
 * Opened non-blocking so a FIFO cannot hang the read.
 *
 * @throws ConfigError naming `variable` and the file: missing, permission denied, not a regular file, too large
 */
function readKeyFile(file: string, variable: string): KeyFile {
  let fd: number;
  try {
    fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  } catch (err) {
    throw new ConfigError(variable, readFailure(err, file), err);
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new ConfigError(variable, `the key file ${file} is not a regular file`);
    if (st.size > MAX_KEY_FILE_BYTES) throw new ConfigError(variable, `the key file ${file} is ${st.size} bytes: too large to be a PEM key`);
    return { pem: fs.readFileSync(fd), mode: st.mode & 0o7777 };
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(variable, readFailure(err, file), err);
  } finally {
    fs.closeSync(fd);
  }
}

/** "an RSA", "an EC (prime256v1)"...: the kind of an asymmetric key, for messages. */
function kindOf(key: KeyObject): string {
  const t = key.asymmetricKeyType ?? 'unknown';
  const names: Record<string, string> = { rsa: 'an RSA', 'rsa-pss': 'an RSA-PSS', dsa: 'a DSA', dh: 'a Diffie-Hellman', ed448: 'an Ed448', x25519: 'an X25519', x448: 'an X448' };
  if (t === 'ec') return `an EC (${key.asymmetricKeyDetails?.namedCurve ?? 'unknown curve'})`;
  return names[t] ?? `a ${t}`;
}

/** @throws ConfigError naming `variable` and `file` when `key` is not Ed25519 */
function requireEd25519(key: KeyObject, file: string, variable: string): void {
  if (key.asymmetricKeyType !== 'ed25519') {
    throw new ConfigError(variable, `${file} holds ${kindOf(key)} key, expected Ed25519 (convo-mirror keygen makes one)`);
  }
}

/**
 * True when `pem` is an encrypted private key (PKCS#8 `ENCRYPTED PRIVATE KEY`, or a traditional PEM
 * with `Proc-Type: 4,ENCRYPTED`), or node:crypto refused it for want of a passphrase.
 */
function isEncrypted(pem: Buffer, err: unknown): boolean {
  const text = pem.toString('latin1');
  if (text.includes('-----BEGIN ENCRYPTED PRIVATE KEY-----') || /^Proc-Type:\s*4,\s*ENCRYPTED/m.test(text)) return true;
  return (err as { code?: unknown } | null)?.code === 'ERR_MISSING_PASSPHRASE';
}

/** True when `pem` parses as a public key (SPKI, PKCS#1 or an X.509 certificate). */
function isPublicPem(pem: Buffer): boolean {
  try {
    return crypto.createPublicKey({ key: pem, format: 'pem' }).type === 'public';
  } catch {
    return false;
  }
}

/** Parses the signing key's PEM. @throws ConfigError naming the variable and `file`, in plain words */
function parsePrivateKey(pem: Buffer, file: string): KeyObject {
  const v = SIGNING_KEY_VARIABLE;
  try {
    return crypto.createPrivateKey({ key: pem, format: 'pem' });
  } catch (err) {
    if (isEncrypted(pem, err)) throw new ConfigError(v, `${file} holds an encrypted private key: convo-mirror needs it unencrypted (PKCS#8 PEM, as convo-mirror keygen writes it)`);
    if (isPublicPem(pem)) throw new ConfigError(v, `${file} holds a public key where the private key is expected: point ${v} at the private key (the .key file convo-mirror keygen wrote), not the .pub`);
    throw new ConfigError(v, `${file} is not a PEM private key (expected an Ed25519 key in PKCS#8 PEM, "-----BEGIN PRIVATE KEY-----"; convo-mirror keygen makes one)`);
  }
}

/** The warning of a key file open to its group or others, or undefined when it is private. */
function modeWarning(file: string, mode: number): string | undefined {
  if ((mode & 0o077) === 0) return undefined;
  const who = [mode & 0o070 ? 'its group' : '', mode & 0o007 ? 'others' : ''].filter(Boolean).join(' and ');
  return `${file} can be read or written by ${who} (mode ${mode.toString(8).padStart(4, '0')}); chmod 600 it`;
}

/**
 * Loads the Ed25519 private key that signs ledger records from a PEM file: PKCS#8
 * (`-----BEGIN PRIVATE KEY-----`), or any unencrypted private key PEM node:crypto reads, as long as
 * the key is Ed25519. Logs nothing: a file open to its group or others yields a `warning` the caller logs.
 *
 * @param file - the file `CONVO_MIRROR_SIGNING_KEY_FILE` names
 * @throws ConfigError naming `CONVO_MIRROR_SIGNING_KEY_FILE` and the file when it is missing,
 *   unreadable (permission denied), not a regular file, not a PEM private key, encrypted, a public
 *   key, or a key of another type (RSA, EC...). Never includes key material.
 */
export function loadSigningKey(file: string): SigningKey {
  const { pem, mode } = readKeyFile(file, SIGNING_KEY_VARIABLE);
  const privateKey = parsePrivateKey(pem, file);
  requireEd25519(privateKey, file, SIGNING_KEY_VARIABLE);
  const warning = modeWarning(file, mode);
  return { privateKey, keyId: keyId(privateKey), file, ...(warning === undefined ? {} : { warning }) };
}

/** Any PEM private key block: PKCS#8 (plain or encrypted), PKCS#1, SEC1, OpenSSH. */
const PRIVATE_PEM_RE = /-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----/;

/** True when `pem` holds a private key, whether or not it also holds a public one. */
function holdsPrivateKey(pem: Buffer): boolean {
  if (PRIVATE_PEM_RE.test(pem.toString('latin1'))) return true;
  try {
    crypto.createPrivateKey({ key: pem, format: 'pem' });
    return true;
  } catch (err) {
    return isEncrypted(pem, err);
  }
}

/**
 * Loads the Ed25519 public key that checks ledger signatures: an SPKI PEM
 * (`-----BEGIN PUBLIC KEY-----`). A private key is refused, never used to derive its public key:
 * an auditor never needs the private key, and a check that accepts it teaches handing it around.
 *
 * @param file - the key file
 * @param variable - the flag or variable that named the file, for errors. @defaultValue `--public-key`
 * @throws ConfigError naming `variable` and the file when it is missing, unreadable, a private key
 *   (encrypted or not), not a PEM public key, or not Ed25519. Never includes key material.
 */
export function loadPublicKey(file: string, variable = '--public-key'): PublicKey {
  const { pem } = readKeyFile(file, variable);
  if (holdsPrivateKey(pem)) {
    throw new ConfigError(variable, `${file} holds a private key, not a public key: give the public key (the .pub file convo-mirror keygen wrote); verifying never needs the private key, keep it with the publisher`);
  }
  let key: KeyObject;
  try {
    key = crypto.createPublicKey({ key: pem, format: 'pem' });
  } catch {
    throw new ConfigError(variable, `${file} is not a PEM public key (expected an Ed25519 key in SPKI PEM, "-----BEGIN PUBLIC KEY-----", as convo-mirror keygen writes it)`);
  }
  requireEd25519(key, file, variable);
  return { key, keyId: keyId(key), file };
}

/**
 * Signs `body` (a record's canonical body bytes) with the signing key: Ed25519 over the bytes
 * themselves (no pre-hash), deterministic per RFC 8032, so the same body and key always give the
 * same value.
 */
export function sign(body: Buffer, key: SigningKey): Signature {
  const value = crypto.sign(null, body, key.privateKey).toString('base64');
  return { algorithm: SIGNATURE_ALGORITHM, key_id: key.keyId, value };
}

/** The signature bytes when `sig` is exactly a {@link Signature} (three string fields, canonical base64 of 64 bytes), else undefined. */
function signatureBytes(sig: unknown): Buffer | undefined {
  if (typeof sig !== 'object' || sig === null || Array.isArray(sig)) return undefined;
  const keys = Object.keys(sig).sort();
  if (keys.length !== 3 || keys[0] !== 'algorithm' || keys[1] !== 'key_id' || keys[2] !== 'value') return undefined;
  const s = sig as Record<string, unknown>;
  if (typeof s.algorithm !== 'string' || typeof s.key_id !== 'string' || typeof s.value !== 'string') return undefined;
  if (s.algorithm !== SIGNATURE_ALGORITHM) return undefined;
  const bytes = Buffer.from(s.value, 'base64');
  // Canonical only: no whitespace, URL-safe alphabet, missing padding or stray bits.
  return bytes.length === SIGNATURE_BYTES && bytes.toString('base64') === s.value ? bytes : undefined;
}

/**
 * Checks a detached signature over `body` with `key`.
 *
 * @param sig - the signature as found in a record (any JSON value)
 * @returns `malformed` when `sig` is not an object with exactly `algorithm`, `key_id` and `value`,
 *   all strings, `algorithm` `ed25519` and `value` the canonical base64 of 64 bytes; else `wrong-key`
 *   when `key_id` is not the key's id; else `valid` or `invalid` as Ed25519 verification says
 */
export function checkSignature(body: Buffer, sig: unknown, key: PublicKey): SignatureCheck {
  const bytes = signatureBytes(sig);
  if (bytes === undefined) return 'malformed';
  if ((sig as Signature).key_id !== key.keyId) return 'wrong-key';
  return crypto.verify(null, body, key.key, bytes) ? 'valid' : 'invalid';
}

/** Plain words for a failure to create a key file, as a ConfigError naming `--out`. */
function outError(err: unknown, file: string): ConfigError {
  const code = (err as NodeJS.ErrnoException).code;
  const dir = path.dirname(file);
  const words: Record<string, string> = {
    EEXIST: `${file} already exists: keygen never overwrites a key; choose another ${KEYGEN_OUT_FLAG} prefix, or move the existing file away`,
    ENOENT: `the directory ${dir} does not exist: create it first (keygen creates no directories)`,
    ENOTDIR: `${dir} is not a directory`,
    EACCES: `permission denied creating ${file}`,
    EPERM: `permission denied creating ${file}`,
    EROFS: `cannot create ${file}: the file system is read-only`,
    ENOSPC: `cannot write ${file}: no space left on the device`,
  };
  return new ConfigError(KEYGEN_OUT_FLAG, words[code ?? ''] ?? `cannot write ${file} (${code ?? (err as Error).message})`, err);
}

/**
 * Checks, before anything is written, that `file` does not exist (not even as a dangling symlink)
 * and that its directory does.
 *
 * @throws ConfigError naming `--out`
 */
function assertCreatable(file: string): void {
  try {
    fs.lstatSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw outError(err, file);
    let dir: fs.Stats;
    try {
      dir = fs.statSync(path.dirname(file));
    } catch (e) {
      throw outError(e, file);
    }
    if (!dir.isDirectory()) throw outError(Object.assign(new Error('not a directory'), { code: 'ENOTDIR' }), file);
    return;
  }
  throw outError(Object.assign(new Error('exists'), { code: 'EEXIST' }), file);
}

/**
 * Creates `file` exclusively with `mode` exactly (whatever the umask), writes `data`, fsyncs the
 * file and its directory. A file left half-written is removed.
 *
 * @throws ConfigError naming `--out`
 */
function writeKeyFile(file: string, data: string, mode: number): void {
  let fd: number;
  try {
    fd = createPrivateFile(file, { file: mode, dir: 0o700 });
  } catch (err) {
    throw outError(err, file);
  }
  try {
    fs.writeFileSync(fd, data);
    fs.fsyncSync(fd);
  } catch (err) {
    fs.closeSync(fd);
    fs.rmSync(file, { force: true });
    throw outError(err, file);
  }
  fs.closeSync(fd);
  fsyncDir(path.dirname(path.resolve(file)));
}

/**
 * Generates an Ed25519 key pair and writes it: the private key as PKCS#8 PEM to `privateFile`, the
 * public key as SPKI PEM to `publicFile`, each created exclusively with its mode exactly whatever
 * the umask, fsynced with its directory. Nothing is ever overwritten: both files are checked first,
 * so an existing one means nothing is written; if writing the public key fails, the private key just
 * written is removed. Missing directories are an error, not created.
 *
 * @param modes - the files' modes. @defaultValue {@link KEY_PAIR_MODES} (0600 and 0644)
 * @returns the new key's {@link keyId}
 * @throws ConfigError naming `--out` and the file: it exists, its directory is missing or not a
 *   directory, permission denied, the two files are the same
 */
export function generateKeyPair(privateFile: string, publicFile: string, modes: KeyPairModes = KEY_PAIR_MODES): { keyId: string } {
  if (path.resolve(privateFile) === path.resolve(publicFile)) {
    throw new ConfigError(KEYGEN_OUT_FLAG, `the private and the public key cannot both be written to ${privateFile}`);
  }
  assertCreatable(privateFile);
  assertCreatable(publicFile);
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ed25519');
  writeKeyFile(privateFile, privateKey.export({ type: 'pkcs8', format: 'pem' }) as string, modes.privateKey);
  try {
    writeKeyFile(publicFile, publicKey.export({ type: 'spki', format: 'pem' }) as string, modes.publicKey);
  } catch (err) {
    fs.rmSync(privateFile, { force: true });
    fsyncDir(path.dirname(path.resolve(privateFile)));
    throw err;
  }
  return { keyId: keyId(publicKey) };
}
