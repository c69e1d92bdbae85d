/**
 * Every way convo-mirror is started runs Node with the same flags: those the `convo-mirror`
 * command's shebang passes (`#!/usr/bin/env -S node <flags>`), which hold a large sync's memory
 * flat (docs/architecture.md, "Memory"). The npm scripts and the Docker image pass them explicitly,
 * since `node <file>` ignores a shebang.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { CLI, ROOT, assertBuilt } from './children.js';

const SHEBANG = /^#!\/usr\/bin\/env -S node((?: --[\w-]+(?:=\S+)?)*)\n/;

function shebangFlags(file: string): string {
  const m = SHEBANG.exec(fs.readFileSync(file, 'utf8'));
  if (!m) throw new Error(`${file} does not start with #!/usr/bin/env -S node [flags]`);
  return m[1]!.trim();
}

describe('Node flags', () => {
  it('the source and the built command start with the same shebang, and it names flags', () => {
    assertBuilt();
    const flags = shebangFlags(path.join(ROOT, 'src', 'cli', 'index.ts'));
    expect(flags).toContain('--optimize-for-size');
    expect(shebangFlags(CLI)).toBe(flags);
  });

  it('every npm script and the Docker image that start the CLI or the bench pass those flags', () => {
    const flags = shebangFlags(path.join(ROOT, 'src', 'cli', 'index.ts'));
    const scripts = (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts;
    const starts = Object.entries(scripts).filter(([, cmd]) => /\bnode\b.*dist\/(src\/cli\/index|bench\/run)\.js/.test(cmd));
    expect(starts.map(([name]) => name).sort()).toEqual(['bench', 'cli', 'demo', 'demo:daemon']);
    for (const [name, cmd] of starts) expect(cmd, name).toContain(`node ${flags} dist/`);
    const cmd = /^CMD (\[.*\])$/m.exec(fs.readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8'));
    expect(JSON.parse(cmd![1]!)).toEqual(['node', ...flags.split(' '), 'dist/src/cli/index.js', 'daemon']);
  });

  it('the built command is executable and runs through its shebang', () => {
    assertBuilt();
    // The build makes it executable: npx reaches it through a link it made once (its cache is
    // keyed by the directory), so a fresh clone built in the same place must not need npm's chmod.
    expect(fs.statSync(CLI).mode & 0o111).toBe(0o111);
    const out = execFileSync(CLI, ['--help'], { encoding: 'utf8', env: { PATH: process.env.PATH } });
    expect(out).toMatch(/^Usage: convo-mirror/m);
  });
});
