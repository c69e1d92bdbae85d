/**
 * `.env` in the working directory (flags > environment > .env > default), the warning about
 * misspelt `CONVO_MIRROR_*` variables, and `.env.example` kept in step with `CONFIG_FIELDS`.
 * The CLI runs as a child process (the built CLI) in a fresh temp directory, with an environment
 * stripped of every convo-mirror setting.
 */
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { parseEnv } from 'node:util';
import { CONFIG_FIELDS, knownVariables } from '../config/index.js';
import { editDistance, nearestName, unknownVariableWarnings, unquotedHashCuts } from '../config/env-file.js';
import { FakeWorkspace, startFakeApi } from '../src/fake-api/index.js';
import { assertBuilt, CLI, killLeftovers, ROOT, runCommand, cleanEnv, runIn, workDirs } from './children.js';
import { asUnprivileged, skipTitle, unprivilegedPath, unprivilegedSkip } from './unprivileged.js';

beforeAll(assertBuilt);
afterEach(killLeftovers);

const work = workDirs('convo-mirror-env-');
afterEach(() => work.cleanup());
/** A fresh working directory, removed after the test; `dotenv` is written to its `.env`. */
const workDir = (dotenv?: string): string => work.make(dotenv);

const SECRET = 'sk-dotenv-SECRET-5e1f9a';

describe('.env in the working directory', () => {
  it('is read: a setting only .env gives reaches the command (status names the mirror from .env)', async () => {
    const dir = workDir('# comment\nCONVO_MIRROR_DB=from-dotenv.sqlite\nexport LOG_LEVEL="warn"\n');
    const r = await runIn(dir, ['status'], cleanEnv());
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('convo-mirror: no mirror at from-dotenv.sqlite (CONVO_MIRROR_DB); run convo-mirror sync first\n');
    expect(fs.readdirSync(dir)).toEqual(['.env']);
  });

  it('the environment wins over .env, and a flag wins over both', async () => {
    const dir = workDir('CONVO_MIRROR_DB=from-dotenv.sqlite\n');
    const fromEnv = await runIn(dir, ['status'], cleanEnv({ CONVO_MIRROR_DB: 'from-env.sqlite' }));
    expect(fromEnv.stderr).toContain('no mirror at from-env.sqlite');
    const fromFlag = await runIn(dir, ['status', '--db', 'from-flag.sqlite'], cleanEnv({ CONVO_MIRROR_DB: 'from-env.sqlite' }));
    expect(fromFlag.stderr).toContain('no mirror at from-flag.sqlite');
    expect(fromFlag.stderr).not.toContain('from-env');
  });

  it('an empty variable in the environment still wins over .env', async () => {
    const dir = workDir('CONVO_MIRROR_DB=from-dotenv.sqlite\n');
    const r = await runIn(dir, ['status'], cleanEnv({ CONVO_MIRROR_DB: '' }));
    expect(r.stderr).toContain('no mirror at data/mirror.sqlite');
  });

  it('a missing .env is silent', async () => {
    const r = await runIn(workDir(), ['config'], cleanEnv());
    expect(r.code).toBe(0);
    expect(r.stderr).toBe('');
  });

  it('a .env that is a directory: one line naming the path and the reason, exit 2, nothing run', async () => {
    const dir = workDir();
    fs.mkdirSync(path.join(dir, '.env'));
    const r = await runIn(dir, ['config'], cleanEnv());
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(`convo-mirror: configuration error: ${fs.realpathSync(dir)}/.env: cannot be read: is a directory\n`);
  });

  // Root reads any file: as root, the CLI runs as nobody (65534) under setpriv (test/unprivileged.ts).
  it.skipIf(unprivilegedSkip)(skipTitle('a .env that cannot be read: one line with the OS reason, exit 2'), async () => {
    const dir = workDir(`CONVO_MIRROR_API_KEY=${SECRET}\n`);
    fs.chmodSync(path.join(dir, '.env'), 0o000);
    fs.chmodSync(dir, 0o755);
    const r = await runCommand(asUnprivileged(['/bin/sh', '-c', 'cd "$0" && exec "$@"', dir, process.execPath, unprivilegedPath(CLI), 'config']), cleanEnv());
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`convo-mirror: configuration error: ${fs.realpathSync(dir)}/.env: cannot be read: permission denied\n`);
  });

  it('a .env over 1 MiB is refused naming the file, and none of it is shown', async () => {
    const dir = workDir(`CONVO_MIRROR_API_KEY=${SECRET}\n` + '#'.repeat(1024 * 1024) + '\n');
    const r = await runIn(dir, ['config'], cleanEnv());
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^convo-mirror: configuration error: \S+\/\.env: is larger than 1 MiB/);
    expect(r.stderr.split('\n').filter(Boolean)).toHaveLength(1);
    expect(r.stdout + r.stderr).not.toContain(SECRET);
  });
});

describe('misspelt CONVO_MIRROR_* variables', () => {
  it('one warning each, once, with the nearest name, from the environment and from .env; never the value', async () => {
    const dir = workDir(`CONVO_MIRROR_API_KYE=${SECRET}\n`);
    const r = await runIn(dir, ['config'], cleanEnv({ CONVO_MIRROR_CONCURENCY: '8', CONVO_MIRROR_ZZZ: 'value-zzz' }));
    expect(r.code).toBe(0);
    expect(r.stderr.split('\n').filter(Boolean)).toEqual([
      'convo-mirror: warning: CONVO_MIRROR_API_KYE (from .env) is not a setting; did you mean CONVO_MIRROR_API_KEY?',
      'convo-mirror: warning: CONVO_MIRROR_CONCURENCY is not a setting; did you mean CONVO_MIRROR_CONCURRENCY?',
      'convo-mirror: warning: CONVO_MIRROR_ZZZ is not a setting (ignored)',
    ]);
    expect(r.stdout + r.stderr).not.toContain(SECRET);
    expect(r.stdout + r.stderr).not.toContain('value-zzz');
  });

  it('no warning for the variables the code reads: every setting, the bench probe, a workspaces file\'s key variable', async () => {
    const dir = workDir();
    const file = path.join(dir, 'workspaces.json');
    fs.writeFileSync(file, JSON.stringify([{ account_id: '3d6f0a52-7c1e-4b8a-9f2d-5e6a7b8c9d01', api_key_env: 'CONVO_MIRROR_ACME_KEY' }]));
    const settings = Object.fromEntries(Object.values(CONFIG_FIELDS).map((d) => [d.env, ''] as const));
    const env = cleanEnv({ ...settings, CONVO_MIRROR_BENCH_RSS_FILE: 'x', CONVO_MIRROR_ACME_KEY: SECRET, CONVO_MIRROR_WORKSPACES: file });
    const r = await runIn(dir, ['config'], env);
    expect(r.stderr).toBe('');
    // The same key variable without the file that names it is warned about.
    const without = await runIn(dir, ['config'], cleanEnv({ CONVO_MIRROR_ACME_KEY: SECRET }));
    expect(without.stderr).toContain('warning: CONVO_MIRROR_ACME_KEY is not a setting');
  });

  it('edit distance counts a swap of neighbours as one edit; far names get no suggestion', () => {
    expect(editDistance('KYE', 'KEY')).toBe(1);
    expect(editDistance('kitten', 'sitting')).toBe(3);
    expect(editDistance('', 'abc')).toBe(3);
    const known = knownVariables();
    expect(nearestName('CONVO_MIRROR_REQUEST_TIMEOUT', known)).toBe('CONVO_MIRROR_REQUEST_TIMEOUT_MS');
    expect(nearestName('convo_mirror_db', known)).toBe('CONVO_MIRROR_DB');
    expect(nearestName('CONVO_MIRROR_FOO', known)).toBeUndefined();
    expect(unknownVariableWarnings({ CONVO_MIRROR_DB: 'x', LOG_LEVEL: 'y', OTHER: 'z' }, known, new Set())).toEqual([]);
  });
});

describe('an unquoted "#" in .env', () => {
  it('util.parseEnv, like dotenv, ends an unquoted value at the first "#", space before it or not; unquotedHashCuts reports exactly those, skipping quoted (even multi-line) values', () => {
    const text = [
      'A=k3y#Secret',
      'B=value # a note',
      'C="q#x"',
      "D='multi",
      "E=z#y'",
      'F=#x',
      'G= # nothing',
      'export H=a#b',
      'I=plain',
      'J=j#k\r',
      'K=`x#y`  # after the quote',
    ].join('\n');
    const parsed = parseEnv(text);
    expect(parsed).toMatchObject({ A: 'k3y', B: 'value', C: 'q#x', D: 'multi\nE=z#y', F: '', G: '', H: 'a', I: 'plain', J: 'j', K: 'x#y' });
    expect(unquotedHashCuts(text, parsed)).toEqual([
      { line: 1, name: 'A', spaced: false },
      { line: 2, name: 'B', spaced: true },
      { line: 6, name: 'F', spaced: false },
      { line: 7, name: 'G', spaced: true },
      { line: 8, name: 'H', spaced: false },
      { line: 10, name: 'J', spaced: false },
    ]);
    // Only what the parser did: a value it did not cut there is not reported.
    expect(unquotedHashCuts('A=k3y#Secret', { A: 'k3y#Secret' })).toEqual([]);
    // Linear: a 1 MiB file of unterminated quotes is read once.
    expect(unquotedHashCuts('A="x\n'.repeat(150_000), {})).toEqual([]);
  });

  it('CONVO_MIRROR_API_KEY=k3y#Secret: the API refuses the cut key, and one warning names the line and the variable, never the value; quoted, it works and nothing is said', async () => {
    const fake = await startFakeApi({ workspace: FakeWorkspace.fromCounts([1]), apiKey: 'k3y#Secret' });
    try {
      const env = cleanEnv({ CONVO_MIRROR_BASE_URL: fake.url, CONVO_MIRROR_MAX_RETRIES: '0' });
      const cut = workDir('# the key\nCONVO_MIRROR_DB=m.sqlite # the mirror\nCONVO_MIRROR_API_KEY=k3y#Secret\n');
      const warning = `convo-mirror: warning: .env line 3: CONVO_MIRROR_API_KEY's value holds "#" unquoted: everything from it on is read as a comment; quote the value ('...') if the "#" belongs to it\n`;
      const check = await runIn(cut, ['check', '--no-queue'], env);
      expect(check.code).toBe(2);
      expect(check.stdout).toMatch(/^✗ api: .*401.*CONVO_MIRROR_API_KEY/m);
      expect(check.stderr).toBe(warning);
      const config = await runIn(cut, ['config'], env);
      expect(config.stdout).toMatch(/^CONVO_MIRROR_API_KEY +\.env +set \(secret, not shown\)$/m);
      expect(config.stderr).toBe(warning);
      for (const r of [check, config]) expect(r.stdout + r.stderr).not.toMatch(/k3y|Secret/);
      // The environment wins over .env: what .env holds is not used, so not warned about.
      expect((await runIn(cut, ['config'], { ...env, CONVO_MIRROR_API_KEY: 'k3y#Secret' })).stderr).toBe('');
      for (const quoted of ["CONVO_MIRROR_API_KEY='k3y#Secret'\n", 'CONVO_MIRROR_API_KEY="k3y#Secret" # the key\n']) {
        const ok = await runIn(workDir(quoted), ['check', '--no-queue'], env);
        expect(ok.code, ok.stdout).toBe(0);
        expect(ok.stderr).toBe('');
      }
    } finally {
      await fake.close();
    }
  });

  it('" #" after a space is an inline comment: said nothing of for a plain setting, warned about for a secret', async () => {
    const dir = workDir(`CONVO_MIRROR_DB=m.sqlite # the mirror\nCONVO_MIRROR_ADMIN_PASSWORD=correct horse #battery staple\n`);
    const r = await runIn(dir, ['config'], cleanEnv());
    expect(r.code).toBe(0);
    expect(r.stderr).toBe(
      `convo-mirror: warning: .env line 2: CONVO_MIRROR_ADMIN_PASSWORD's value is followed by an unquoted " #": everything from it on is read as a comment; quote the value ('...') if the "#" belongs to it, or put the comment on a line of its own\n`,
    );
    expect(r.stdout).toMatch(/^CONVO_MIRROR_DB +\.env +m\.sqlite$/m);
    expect(r.stdout + r.stderr).not.toMatch(/horse|battery/);
  });
});

describe('.env.example', () => {
  const text = fs.readFileSync(path.join(ROOT, '.env.example'), 'utf8');
  const lines = text.split('\n');
  /** Index and text of each `# NAME=value` line. */
  const assignments = lines.flatMap((l, i) => (/^# ?[A-Z][A-Z0-9_]*=/.test(l) ? [{ i, line: l.replace(/^# ?/, '') }] : []));

  /** A default as .env would hold it (lists comma-separated). */
  const asEnv = (v: unknown): string => (v === undefined ? '' : Array.isArray(v) ? v.join(',') : String(v));

  it('lists every variable of CONFIG_FIELDS, in table order, and no other', () => {
    expect(assignments.map((a) => a.line.split('=')[0])).toEqual(Object.values(CONFIG_FIELDS).map((d) => d.env));
  });

  it('gives each its default (or nothing), as util.parseEnv reads it, under one line of meaning', () => {
    for (const def of Object.values(CONFIG_FIELDS)) {
      const a = assignments.find((x) => x.line.startsWith(`${def.env}=`))!;
      const value = parseEnv(a.line)[def.env];
      // Written as a user writes it (24h, a list...): it reads back as the default.
      if (def.defaultValue === undefined || value === asEnv(def.defaultValue)) expect(value, def.env).toBe(asEnv(def.defaultValue));
      else expect(def.schema.parse(value), def.env).toEqual(def.defaultValue);
      const above = lines[a.i - 1] ?? '';
      expect(above, `${def.env} has no line of meaning above it`).toMatch(/^# \S.{8,}/);
      expect(above).not.toMatch(/^# ?[A-Z][A-Z0-9_]*=/);
    }
  });

  it('is all comments: copied to .env as it is, it sets nothing', () => {
    expect(Object.keys(parseEnv(text))).toEqual([]);
  });

  it('.gitignore keeps .env out of the repository', () => {
    expect(fs.readFileSync(path.join(ROOT, '.gitignore'), 'utf8').split('\n')).toContain('.env');
  });
});
