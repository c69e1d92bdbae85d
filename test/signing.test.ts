/**
 * Ed25519 keys of the export ledger (src/export/signing.ts) and `convo-mirror keygen`: signatures
 * and their check, key ids, loading keys and every way a key file can be wrong, the key pair's
 * files. Real key files in temp dirs; keygen and permission cases run as child processes (the built
 * CLI and dist/, which `npm test` builds), under `umask` or as an unprivileged user when root.
 */
import { describe, it, expect, beforeAll, afterEach } from 'vitest';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ConfigError } from '../src/errors.js';
import {
  checkSignature,
  generateKeyPair,
  keyId,
  loadPublicKey,
  loadSigningKey,
  sign,
  type PublicKey,
  type SigningKey,
} from '../src/export/signing.js';
import { CLI, assertBuilt, killLeftovers, runCommand, type Ran } from './children.js';
import { tempDir } from './helpers.js';
import { asRoot, asUnprivileged, skipTitle, unprivilegedPath, unprivilegedSkip } from './unprivileged.js';

afterEach(killLeftovers);

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** The built signing module, for child processes. */
const SIGNING_JS = path.join(ROOT, 'dist/src/export/signing.js');

/** A new Ed25519 key pair written to `dir` as `<name>.key` (0600) and `<name>.pub`. */
function keyPairIn(dir: string, name = 'k'): { keyFile: string; pubFile: string } {
  const keyFile = path.join(dir, `${name}.key`);
  const pubFile = path.join(dir, `${name}.pub`);
  generateKeyPair(keyFile, pubFile);
  return { keyFile, pubFile };
}

/** A signing key and its public key, freshly generated in a temp dir. */
function freshKeys(): { signing: SigningKey; pub: PublicKey } {
  const { keyFile, pubFile } = keyPairIn(tempDir());
  return { signing: loadSigningKey(keyFile), pub: loadPublicKey(pubFile) };
}

/** The error `f` throws; fails the test when it returns. */
function thrown(f: () => unknown): unknown {
  try {
    f();
  } catch (err) {
    return err;
  }
  throw new Error('expected a throw');
}

/** Asserts `err` is a ConfigError naming `variable` and `file`, with `words` in its message. */
function expectConfigError(err: unknown, variable: string, file: string, words: RegExp): void {
  expect(err).toBeInstanceOf(ConfigError);
  const e = err as ConfigError;
  expect(e.variable).toBe(variable);
  expect(e.message).toContain(file);
  expect(e.message).toMatch(words);
}

/** The base64 body lines of a PEM (its key material), for "never in a message" checks. */
const pemBody = (pem: string): string[] => pem.split('\n').filter((l) => l && !l.startsWith('-----'));

const BODY = Buffer.from('{"batch":1,"files":[],"previous":"sha256:00"}\n');

describe('sign and checkSignature', () => {
  it('a signature checks valid with the public key, names the key, and is deterministic', () => {
    const { signing, pub } = freshKeys();
    const sig = sign(BODY, signing);
    expect(Object.keys(sig).sort()).toEqual(['algorithm', 'key_id', 'value']);
    expect(sig.algorithm).toBe('ed25519');
    expect(sig.key_id).toBe(pub.keyId);
    expect(Buffer.from(sig.value, 'base64')).toHaveLength(64);
    expect(checkSignature(BODY, sig, pub)).toBe('valid');
    // A JSON round trip (as in a ledger record) keeps it valid.
    expect(checkSignature(BODY, JSON.parse(JSON.stringify(sig)), pub)).toBe('valid');
    expect(sign(Buffer.from(BODY), signing)).toEqual(sig);
    expect(checkSignature(Buffer.alloc(0), sign(Buffer.alloc(0), signing), pub)).toBe('valid');
  });

  it('one flipped byte (or bit) of the body, or of the signature, is invalid', () => {
    const { signing, pub } = freshKeys();
    const sig = sign(BODY, signing);
    for (const i of [0, 10, BODY.length - 1]) {
      const flipped = Buffer.from(BODY);
      flipped[i] = flipped[i]! ^ 0x01;
      expect(checkSignature(flipped, sig, pub), `byte ${i}`).toBe('invalid');
    }
    expect(checkSignature(Buffer.concat([BODY, Buffer.from(' ')]), sig, pub)).toBe('invalid');
    const bytes = Buffer.from(sig.value, 'base64');
    bytes[5] = bytes[5]! ^ 0x80;
    expect(checkSignature(BODY, { ...sig, value: bytes.toString('base64') }, pub)).toBe('invalid');
  });

  it('a signature by another key is wrong-key; another key claiming this key id is invalid', () => {
    const a = freshKeys();
    const b = freshKeys();
    expect(a.pub.keyId).not.toBe(b.pub.keyId);
    const byB = sign(BODY, b.signing);
    expect(checkSignature(BODY, byB, a.pub)).toBe('wrong-key');
    expect(checkSignature(BODY, { ...byB, key_id: a.pub.keyId }, a.pub)).toBe('invalid');
  });

  it('anything but exactly {algorithm: "ed25519", key_id, value: base64 of 64 bytes} is malformed', () => {
    const { signing, pub } = freshKeys();
    const sig = sign(BODY, signing);
    const bytes = Buffer.from(sig.value, 'base64');
    const malformed: [string, unknown][] = [
      ['undefined', undefined],
      ['null', null],
      ['a string', sig.value],
      ['an array', [sig.algorithm, sig.key_id, sig.value]],
      ['no value', { algorithm: sig.algorithm, key_id: sig.key_id }],
      ['an extra field', { ...sig, signed_at: '2025-01-01' }],
      ['another algorithm', { ...sig, algorithm: 'rsa' }],
      ['algorithm in capitals', { ...sig, algorithm: 'Ed25519' }],
      ['a numeric key_id', { ...sig, key_id: 1 }],
      ['a null value', { ...sig, value: null }],
      ['value not base64', { ...sig, value: '!'.repeat(88) }],
      ['value without padding', { ...sig, value: sig.value.replace(/=+$/, '') }],
      ['value url-safe', { ...sig, value: bytes.toString('base64url') }],
      ['value with a newline', { ...sig, value: `${sig.value.slice(0, 44)}\n${sig.value.slice(44)}` }],
      ['63 bytes', { ...sig, value: bytes.subarray(0, 63).toString('base64') }],
      ['65 bytes', { ...sig, value: Buffer.concat([bytes, Buffer.from([0])]).toString('base64') }],
      ['an empty value', { ...sig, value: '' }],
    ];
    for (const [what, s] of malformed) expect(checkSignature(BODY, s, pub), what).toBe('malformed');
  });
});

describe('keyId', () => {
  it('is sha256: and the hex SHA-256 of the SPKI DER, the same from the private key, the signing key file and the public PEM', () => {
    const { privateKey, publicKey } = crypto.generateKeyPairSync('ed25519');
    const der = publicKey.export({ type: 'spki', format: 'der' });
    const id = keyId(publicKey);
    expect(id).toBe(`sha256:${crypto.createHash('sha256').update(der).digest('hex')}`);
    expect(id).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(keyId(privateKey)).toBe(id);
    const dir = tempDir();
    const keyFile = path.join(dir, 'k.key');
    const pubFile = path.join(dir, 'k.pub');
    fs.writeFileSync(keyFile, privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
    fs.writeFileSync(pubFile, publicKey.export({ type: 'spki', format: 'pem' }));
    expect(loadSigningKey(keyFile).keyId).toBe(id);
    expect(loadPublicKey(pubFile).keyId).toBe(id);
  });
});

describe('loadSigningKey', () => {
  const V = 'CONVO_MIRROR_SIGNING_KEY_FILE';

  it('loads a PKCS#8 Ed25519 key: file as given, no warning at 0600, a warning (logged by the caller) at 0644 or 0640', () => {
    const dir = tempDir();
    const { keyFile } = keyPairIn(dir);
    const k = loadSigningKey(keyFile);
    expect(k.file).toBe(keyFile);
    expect(k.privateKey.type).toBe('private');
    expect(k.privateKey.asymmetricKeyType).toBe('ed25519');
    expect(k.warning).toBeUndefined();
    fs.chmodSync(keyFile, 0o644);
    expect(loadSigningKey(keyFile).warning).toBe(`${keyFile} can be read or written by its group and others (mode 0644); chmod 600 it`);
    fs.chmodSync(keyFile, 0o640);
    expect(loadSigningKey(keyFile).warning).toMatch(/by its group \(mode 0640\); chmod 600 it$/);
    fs.chmodSync(keyFile, 0o400);
    expect(loadSigningKey(keyFile).warning).toBeUndefined();
  });

  it('a missing file, a directory, an RSA key, an EC key, a public key, an encrypted key, garbage: ConfigErrors naming the variable and the file, no key material', () => {
    const dir = tempDir();
    const write = (name: string, data: string | Buffer): string => {
      const f = path.join(dir, name);
      fs.writeFileSync(f, data, { mode: 0o600 });
      return f;
    };
    const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
    const rsaPem = rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const ed = crypto.generateKeyPairSync('ed25519');
    const pubPem = ed.publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const encrypted = ed.privateKey.export({ type: 'pkcs8', format: 'pem', cipher: 'aes-256-cbc', passphrase: 'secret' }) as string;
    const cases: [string, string, RegExp, string[]][] = [
      ['missing', path.join(dir, 'absent.key'), /is missing/, []],
      ['a directory', dir, /not a regular file/, []],
      ['an RSA key', write('rsa.key', rsaPem), /holds an RSA key, expected Ed25519/, pemBody(rsaPem)],
      ['a PKCS#1 RSA key', write('rsa1.key', rsa.privateKey.export({ type: 'pkcs1', format: 'pem' })), /holds an RSA key, expected Ed25519/, []],
      ['an EC key', write('ec.key', ec), /holds an EC \(prime256v1\) key, expected Ed25519/, pemBody(ec)],
      ['a public key', write('ed.pub', pubPem), /holds a public key where the private key is expected/, pemBody(pubPem)],
      ['an encrypted key', write('enc.key', encrypted), /encrypted private key/, pemBody(encrypted)],
      ['garbage', write('garbage.key', 'not a key at all\n'), /is not a PEM private key/, []],
      ['an empty file', write('empty.key', ''), /is not a PEM private key/, []],
      ['a truncated PEM', write('cut.key', rsaPem.slice(0, 200)), /is not a PEM private key/, []],
      ['too large', write('big.key', Buffer.alloc(100_000, 0x41)), /too large to be a PEM key/, []],
    ];
    for (const [what, file, words, material] of cases) {
      const err = thrown(() => loadSigningKey(file));
      expectConfigError(err, V, file, words);
      expect((err as Error).message, what).toMatch(new RegExp(`^${V}: `));
      for (const line of material) expect((err as Error).message, what).not.toContain(line);
    }
  });
});

describe('loadPublicKey', () => {
  it('takes an SPKI PEM; refuses a private key (never deriving its public key), other key types and garbage naming the flag or variable, no key material', () => {
    const dir = tempDir();
    const { keyFile, pubFile } = keyPairIn(dir);
    const fromPub = loadPublicKey(pubFile);
    expect(fromPub.key.type).toBe('public');
    expect(fromPub.file).toBe(pubFile);
    expect(checkSignature(BODY, sign(BODY, loadSigningKey(keyFile)), fromPub)).toBe('valid');
    // A private key, in every form it comes in: refused, in one line naming the flag and the file.
    const ed = crypto.generateKeyPairSync('ed25519');
    const write = (name: string, data: string | Buffer): string => {
      const f = path.join(dir, name);
      fs.writeFileSync(f, data, { mode: 0o600 });
      return f;
    };
    const privates: [string, string][] = [
      ['keygen\'s private key', keyFile],
      ['an encrypted private key', write('enc.key', ed.privateKey.export({ type: 'pkcs8', format: 'pem', cipher: 'aes-256-cbc', passphrase: 'secret' }) as string)],
      ['a private key after its public key', write('both.pem', `${ed.publicKey.export({ type: 'spki', format: 'pem' }) as string}${ed.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string}`)],
      ['a PKCS#1 RSA private key', write('rsa1.key', crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs1', format: 'pem' }))],
    ];
    for (const [what, file] of privates) {
      const err = thrown(() => loadPublicKey(file));
      expectConfigError(err, '--public-key', file, /holds a private key, not a public key: give the public key \(the \.pub file convo-mirror keygen wrote\); verifying never needs the private key/);
      expect((err as Error).message, what).not.toMatch(/\n/);
      for (const line of pemBody(fs.readFileSync(file, 'utf8'))) expect((err as Error).message, what).not.toContain(line);
    }
    const rsaPub = path.join(dir, 'rsa.pub');
    fs.writeFileSync(rsaPub, crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey.export({ type: 'spki', format: 'pem' }));
    expectConfigError(thrown(() => loadPublicKey(rsaPub)), '--public-key', rsaPub, /holds an RSA key, expected Ed25519/);
    expectConfigError(thrown(() => loadPublicKey(rsaPub, 'CONVO_MIRROR_PUBLIC_KEY_FILE')), 'CONVO_MIRROR_PUBLIC_KEY_FILE', rsaPub, /RSA/);
    const garbage = path.join(dir, 'garbage.pub');
    fs.writeFileSync(garbage, '-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n');
    expectConfigError(thrown(() => loadPublicKey(garbage)), '--public-key', garbage, /is not a PEM public key/);
    expectConfigError(thrown(() => loadPublicKey(path.join(dir, 'absent.pub'))), '--public-key', path.join(dir, 'absent.pub'), /is missing/);
  });
});

describe('generateKeyPair', () => {
  it('writes a PKCS#8 private key 0600 and an SPKI public key 0644 that belong together', () => {
    const dir = tempDir();
    const keyFile = path.join(dir, 'k.key');
    const pubFile = path.join(dir, 'k.pub');
    const { keyId: id } = generateKeyPair(keyFile, pubFile);
    expect(fs.statSync(keyFile).mode & 0o7777).toBe(0o600);
    expect(fs.statSync(pubFile).mode & 0o7777).toBe(0o644);
    expect(fs.readFileSync(keyFile, 'utf8')).toMatch(/^-----BEGIN PRIVATE KEY-----\n[\s\S]+-----END PRIVATE KEY-----\n$/);
    expect(fs.readFileSync(pubFile, 'utf8')).toMatch(/^-----BEGIN PUBLIC KEY-----\n[\s\S]+-----END PUBLIC KEY-----\n$/);
    expect(loadPublicKey(pubFile).keyId).toBe(id);
    expect(loadSigningKey(keyFile).keyId).toBe(id);
    // Another call makes another key.
    expect(generateKeyPair(path.join(dir, 'j.key'), path.join(dir, 'j.pub')).keyId).not.toBe(id);
  });

  it('takes other modes exactly', () => {
    const dir = tempDir();
    generateKeyPair(path.join(dir, 'k.key'), path.join(dir, 'k.pub'), { privateKey: 0o640, publicKey: 0o600 });
    expect(fs.statSync(path.join(dir, 'k.key')).mode & 0o7777).toBe(0o640);
    expect(fs.statSync(path.join(dir, 'k.pub')).mode & 0o7777).toBe(0o600);
  });

  it('never overwrites: an existing private or public file (even a dangling symlink) is refused before anything is written', () => {
    const dir = tempDir();
    const keyFile = path.join(dir, 'k.key');
    const pubFile = path.join(dir, 'k.pub');
    fs.writeFileSync(pubFile, 'an auditor\'s copy');
    expectConfigError(thrown(() => generateKeyPair(keyFile, pubFile)), '--out', pubFile, /already exists: keygen never overwrites a key/);
    expect(fs.existsSync(keyFile)).toBe(false);
    expect(fs.readFileSync(pubFile, 'utf8')).toBe('an auditor\'s copy');
    fs.rmSync(pubFile);
    fs.symlinkSync(path.join(dir, 'nowhere'), keyFile);
    expectConfigError(thrown(() => generateKeyPair(keyFile, pubFile)), '--out', keyFile, /already exists/);
    expect(fs.existsSync(path.join(dir, 'nowhere'))).toBe(false);
    expect(fs.existsSync(pubFile)).toBe(false);
    expectConfigError(thrown(() => generateKeyPair(pubFile, pubFile)), '--out', pubFile, /cannot both be written/);
    expect(fs.readdirSync(dir)).toEqual(['k.key']);
  });

  it('a missing directory is an error, not created; a file on the path is not a directory', () => {
    const dir = tempDir();
    const missing = path.join(dir, 'keys', 'sub');
    expectConfigError(thrown(() => generateKeyPair(path.join(missing, 'k.key'), path.join(missing, 'k.pub'))), '--out', missing, /does not exist: create it first/);
    expect(fs.existsSync(path.join(dir, 'keys'))).toBe(false);
    // Only the public key's directory missing: nothing written either.
    expectConfigError(thrown(() => generateKeyPair(path.join(dir, 'k.key'), path.join(missing, 'k.pub'))), '--out', missing, /does not exist/);
    fs.writeFileSync(path.join(dir, 'file'), '');
    expectConfigError(thrown(() => generateKeyPair(path.join(dir, 'file', 'k.key'), path.join(dir, 'k.pub'))), '--out', path.join(dir, 'file'), /is not a directory/);
    expect(fs.readdirSync(dir)).toEqual(['file']);
  });
});

// ------------------------------------------------------------------ child processes

/**
 * Runs `node -e script args` as an unprivileged user, printing JSON: root ignores permission bits,
 * so as root it runs as user 65534 through setpriv (test/unprivileged.ts).
 */
function runUnprivileged(script: string, args: string[]): Promise<Ran> {
  const node = [process.execPath, '--input-type=module', '-e', script, ...args];
  return runCommand(asUnprivileged(node), { PATH: process.env.PATH }, 20_000);
}

/** Calls `signing.<fn>(...args)` in the child; prints `{ok}` or `{name, variable, message}`. */
const CALL_SCRIPT = `
const [mod, fn, ...args] = process.argv.slice(1);
const signing = await import(mod);
try { signing[fn](...args); console.log(JSON.stringify({ ok: true })); }
catch (e) { console.log(JSON.stringify({ name: e.name, variable: e.variable, message: e.message })); }
`;

/** A temp dir everyone may enter (the unprivileged user must reach what is inside). */
function sharedDir(): string {
  const d = tempDir('convo-mirror-signing-');
  fs.chmodSync(d, 0o755);
  return d;
}

describe.skipIf(unprivilegedSkip)(skipTitle('permissions (as an unprivileged user)'), () => {
  beforeAll(assertBuilt);

  it('an unreadable signing key: permission denied, naming the variable and the file', async () => {
    const d = sharedDir();
    const { keyFile } = keyPairIn(d);
    if (!asRoot) fs.chmodSync(keyFile, 0o000);
    const r = await runUnprivileged(CALL_SCRIPT, [pathToFileURL(unprivilegedPath(SIGNING_JS)).href, 'loadSigningKey', keyFile]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { name: string; variable: string; message: string };
    expect(out).toMatchObject({ name: 'ConfigError', variable: 'CONVO_MIRROR_SIGNING_KEY_FILE' });
    expect(out.message).toContain(`permission denied reading the key file ${keyFile}`);
  });

  it('when the public key cannot be written, the private key just written is removed', async () => {
    const d = sharedDir();
    const privDir = path.join(d, 'private');
    const pubDir = path.join(d, 'public');
    fs.mkdirSync(privDir, { mode: 0o777 });
    fs.chmodSync(privDir, 0o777);
    fs.mkdirSync(pubDir);
    fs.chmodSync(pubDir, 0o555);
    const pubFile = path.join(pubDir, 'k.pub');
    const r = await runUnprivileged(CALL_SCRIPT, [pathToFileURL(unprivilegedPath(SIGNING_JS)).href, 'generateKeyPair', path.join(privDir, 'k.key'), pubFile]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { name: string; variable: string; message: string };
    expect(out).toMatchObject({ name: 'ConfigError', variable: '--out', message: `--out: permission denied creating ${pubFile}` });
    expect(fs.readdirSync(privDir)).toEqual([]);
    expect(fs.readdirSync(pubDir)).toEqual([]);
  });
});

/** Runs the CLI under `umask` (through sh, so the mask is the process's own from the start) in `cwd`. */
const keygenUnder = (mask: string, cwd: string, args: string[]): Promise<Ran> =>
  runCommand(['sh', '-c', 'umask "$1"; cd "$2"; shift 2; exec "$@"', 'sh', mask, cwd, process.execPath, CLI, 'keygen', ...args], { PATH: process.env.PATH, HOME: process.env.HOME }, 20_000);

describe('convo-mirror keygen (CLI)', () => {
  beforeAll(assertBuilt);

  it.each(['000', '077'])('under umask %s: <prefix>.key 0600 and <prefix>.pub 0644, the key id printed, a pair that signs and verifies; a second run refuses (exit 2, files unchanged)', async (mask) => {
    const dir = tempDir();
    const prefix = path.join(dir, 'k');
    const r = await keygenUnder(mask, dir, ['--out', prefix]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const keyFile = `${prefix}.key`;
    const pubFile = `${prefix}.pub`;
    expect(fs.statSync(keyFile).mode & 0o7777).toBe(0o600);
    expect(fs.statSync(pubFile).mode & 0o7777).toBe(0o644);
    const pub = loadPublicKey(pubFile);
    expect(r.stdout).toBe(
      `wrote the private key ${keyFile} (0600): keep it secret; set CONVO_MIRROR_SIGNING_KEY_FILE=${keyFile} for sync and the daemon\n` +
        `wrote the public key ${pubFile}: give it to auditors; they run convo-mirror verify --public-key ${pubFile}\n` +
        `key id ${pub.keyId}\n`,
    );
    const signing = loadSigningKey(keyFile);
    expect(signing.warning).toBeUndefined();
    expect(checkSignature(BODY, sign(BODY, signing), pub)).toBe('valid');
    for (const l of pemBody(fs.readFileSync(keyFile, 'utf8'))) expect(r.stdout).not.toContain(l);

    const before = [keyFile, pubFile].map((f) => ({ bytes: fs.readFileSync(f), mtimeMs: fs.statSync(f).mtimeMs }));
    const again = await keygenUnder(mask, dir, ['--out', prefix]);
    expect(again.code).toBe(2);
    expect(again.stdout).toBe('');
    expect(again.stderr).toBe(`convo-mirror: configuration error: --out: ${keyFile} already exists: keygen never overwrites a key; choose another --out prefix, or move the existing file away\n`);
    [keyFile, pubFile].forEach((f, i) => {
      expect(fs.readFileSync(f).equals(before[i]!.bytes), f).toBe(true);
      expect(fs.statSync(f).mtimeMs, f).toBe(before[i]!.mtimeMs);
    });
    expect(fs.readdirSync(dir).sort()).toEqual(['k.key', 'k.pub']);
  });

  it('defaults to convo-mirror-signing.key/.pub in the working directory, printing the absolute path to set', async () => {
    const dir = tempDir();
    const r = await keygenUnder('022', dir, []);
    expect(r.code, r.stderr).toBe(0);
    expect(fs.readdirSync(dir).sort()).toEqual(['convo-mirror-signing.key', 'convo-mirror-signing.pub']);
    expect(r.stdout).toContain(`wrote the private key convo-mirror-signing.key (0600): keep it secret; set CONVO_MIRROR_SIGNING_KEY_FILE=${path.join(fs.realpathSync(dir), 'convo-mirror-signing.key')} for sync`);
    expect(r.stdout).toContain('they run convo-mirror verify --public-key convo-mirror-signing.pub\n');
  });

  it('a missing directory or an empty prefix: exit 2, naming --out, nothing written', async () => {
    const dir = tempDir();
    const missing = await keygenUnder('022', dir, ['--out', path.join(dir, 'keys', 'k')]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toBe(`convo-mirror: configuration error: --out: the directory ${path.join(dir, 'keys')} does not exist: create it first (keygen creates no directories)\n`);
    const empty = await keygenUnder('022', dir, ['--out', '']);
    expect(empty.code).toBe(2);
    expect(empty.stderr).toMatch(/^convo-mirror: configuration error: --out: "" is not a prefix of file names/);
    expect(fs.readdirSync(dir)).toEqual([]);
  });
});
