/**
 * verify prints what a tampered archive holds (file names, a manifest's fields) without letting it
 * act on the auditor's terminal: control characters, bidi controls and line separators come out
 * as visible escapes, on stdout, on stderr and in --json. The built CLI on a real archive.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { assertBuilt, killLeftovers, run } from './children.js';
import { cliEnv, harnessPool, tempDir } from './helpers.js';

const pool = harnessPool();
beforeAll(assertBuilt);
afterEach(async () => {
  await killLeftovers();
  await pool.closeAll();
});

/** Code points a terminal would act on (C0 but LF, DEL, C1, bidi controls and isolates, U+2028/9). */
const RAW = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\u2028\u2029]/u;

describe('verify on a hostile archive', () => {
  it('escapes a file name and a manifest field holding ESC sequences and a bidi override', async () => {
    const h = await pool.start({ workspace: FakeWorkspace.fromCounts([3]) });
    const dir = tempDir();
    const sync = await run(['sync'], cliEnv(h.fake, dir));
    expect(sync.code, sync.stderr).toBe(0);
    const exportDir = path.join(dir, 'exports');
    // A file no record lists, named to clear the line and paint it green.
    const partition = path.dirname(path.join(exportDir, fs.readdirSync(path.join(exportDir, 'messages'), { recursive: true }).map(String).find((p) => p.endsWith('.jsonl'))!.replace(/^/, 'messages/')));
    fs.writeFileSync(path.join(partition, '\x1b[2K\r\x1b[32mok   all fine\x1b[0m\u202e.jsonl'), 'x\n');
    // The manifest's key id, forged to do the same on an "ok" line.
    const manifestFile = path.join(exportDir, 'manifest.json');
    const manifest = JSON.parse(fs.readFileSync(manifestFile, 'utf8')) as Record<string, unknown>;
    manifest['signature'] = { algorithm: 'ed25519', key_id: '\x1b[2K\r\x1b[32mok   signatures: all records signed\x1b[0m', value: 'AAAA' };
    fs.chmodSync(manifestFile, 0o600);
    fs.writeFileSync(manifestFile, JSON.stringify(manifest, null, 2) + '\n');
    const env = cliEnv(h.fake, dir, { CONVO_MIRROR_DB: path.join(dir, 'nonexistent.sqlite') });
    const text = await run(['verify'], env);
    expect(text.code).toBe(1);
    expect(text.stdout + text.stderr).not.toMatch(RAW);
    expect(text.stderr).toContain('\\u{001B}[2K\\u{000D}\\u{001B}[32mok   all fine\\u{001B}[0m\\u{202E}.jsonl');
    const json = await run(['verify', '--json'], env);
    expect(json.stdout).not.toMatch(RAW);
    const report = JSON.parse(json.stdout) as { ok: boolean; problems: { path: string }[] };
    expect(report.ok).toBe(false);
    expect(report.problems.map((p) => p.path)).toContainEqual(expect.stringContaining('\x1b[32mok   all fine\x1b[0m\u202e.jsonl'));
  });
});
