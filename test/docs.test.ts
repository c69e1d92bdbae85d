/**
 * The documentation stands alone: every relative link in README.md and docs/*.md resolves to a file
 * or directory inside this repository, and no tracked text file points at the shared folder beside
 * the checkout (which a user's clone does not have).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/**
 * The shared folder beside the checkout, as a relative path. Built rather than written out, so
 * that this file does not contain it.
 */
const OUTSIDE = ['..', 'shared'].join('/');

/** Directories never searched when git cannot list the tracked files. */
const UNTRACKED_DIRS = new Set(['.git', 'node_modules', 'dist', 'data', 'coverage']);

/** The markdown files whose links are checked: README.md and every docs/*.md. */
function markdownFiles(): string[] {
  const docs = path.join(ROOT, 'docs');
  const inDocs = fs.existsSync(docs)
    ? fs
        .readdirSync(docs)
        .filter((name) => name.endsWith('.md'))
        .sort()
        .map((name) => path.join(docs, name))
    : [];
  return [path.join(ROOT, 'README.md'), ...inDocs];
}

/**
 * `md` with fenced code blocks and inline code spans blanked out, line count kept: a `[x](y)` inside
 * code is text, not a link.
 */
function withoutCode(md: string): string {
  const lines = md.split('\n');
  let fence: string | undefined;
  const out = lines.map((line) => {
    const opener = /^ {0,3}(`{3,}|~{3,})/.exec(line);
    if (fence !== undefined) {
      if (opener && opener[1]!.startsWith(fence)) fence = undefined;
      return '';
    }
    if (opener) {
      fence = opener[1]!;
      return '';
    }
    return line.replace(/(`+)[\s\S]*?\1/g, '');
  });
  return out.join('\n');
}

/** One link found in a markdown text: its 1-based line and its target as written. */
interface FoundLink {
  line: number;
  target: string;
}

/** Inline links and images `[text](target "title")`; link text may hold one level of brackets. */
const INLINE_LINK = /!?\[(?:[^[\]]|\[[^[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)/g;
/** Reference definitions `[label]: target`. */
const REFERENCE_DEFINITION = /^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)/gm;

/** Every link target in `md` (outside code), with its line. */
export function markdownLinks(md: string): FoundLink[] {
  const text = withoutCode(md);
  const found: FoundLink[] = [];
  for (const re of [INLINE_LINK, REFERENCE_DEFINITION]) {
    for (const m of text.matchAll(re)) {
      const raw = m[1] ?? '';
      const target = raw.startsWith('<') && raw.endsWith('>') ? raw.slice(1, -1) : raw;
      found.push({ line: text.slice(0, m.index).split('\n').length, target });
    }
  }
  return found.sort((a, b) => a.line - b.line);
}

/**
 * The links of `md` (the text of the file `file`) that do not resolve to an existing file or
 * directory inside `root`, as `file:line: target (why)`. `http:`, `https:` and `mailto:` links and
 * pure `#anchor` links are not checked; a `#fragment` is stripped before resolving. A target
 * starting with `/` is taken from `root`, as a repository viewer does.
 */
export function brokenLinks(file: string, md: string, root = ROOT): string[] {
  const broken: string[] = [];
  const where = path.relative(root, file) || file;
  for (const { line, target } of markdownLinks(md)) {
    if (/^(?:https?|mailto):/i.test(target) || target.startsWith('#')) continue;
    const bare = target.replace(/#.*$/, '');
    let decoded: string;
    try {
      decoded = decodeURIComponent(bare);
    } catch {
      broken.push(`${where}:${line}: ${target} (malformed percent-encoding)`);
      continue;
    }
    if (decoded === '') {
      broken.push(`${where}:${line}: ${target} (empty target)`);
      continue;
    }
    const resolved = decoded.startsWith('/') ? path.join(root, decoded) : path.resolve(path.dirname(file), decoded);
    const rel = path.relative(root, resolved);
    if (rel.startsWith('..') || path.isAbsolute(rel)) {
      broken.push(`${where}:${line}: ${target} (outside the repository)`);
    } else if (!fs.existsSync(resolved)) {
      broken.push(`${where}:${line}: ${target} (no such file or directory)`);
    }
  }
  return broken;
}

/** Repository-relative paths of the tracked files (git ls-files), or of every file when git cannot say. */
function trackedFiles(): string[] {
  try {
    const out = execFileSync('git', ['ls-files', '-z'], { cwd: ROOT, maxBuffer: 64 * 1024 * 1024, stdio: ['ignore', 'pipe', 'ignore'] });
    return out.toString('utf8').split('\0').filter((f) => f !== '');
  } catch {
    const files: string[] = [];
    const walk = (dir: string): void => {
      for (const entry of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
        const rel = dir === '' ? entry.name : `${dir}/${entry.name}`;
        if (entry.isDirectory()) {
          if (!UNTRACKED_DIRS.has(entry.name)) walk(rel);
        } else if (entry.isFile()) files.push(rel);
      }
    };
    walk('');
    return files;
  }
}

describe('documentation links', () => {
  it('README.md links to docs/api.md and docs/architecture.md, which exist', () => {
    const readme = path.join(ROOT, 'README.md');
    const targets = markdownLinks(fs.readFileSync(readme, 'utf8')).map((l) => l.target.replace(/#.*$/, ''));
    expect(targets).toContain('docs/api.md');
    expect(targets).toContain('docs/architecture.md');
    expect(fs.statSync(path.join(ROOT, 'docs', 'api.md')).isFile()).toBe(true);
    expect(fs.statSync(path.join(ROOT, 'docs', 'architecture.md')).isFile()).toBe(true);
  });

  it('every relative link in README.md and docs/*.md resolves to a file or directory in the repository', () => {
    const files = markdownFiles();
    expect(files.length).toBeGreaterThanOrEqual(3);
    const broken = files.flatMap((file) => brokenLinks(file, fs.readFileSync(file, 'utf8')));
    expect(broken).toEqual([]);
  });

  it('the link check itself reports what is broken and skips what is not a relative link', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'convo-mirror-docs-'));
    try {
      fs.mkdirSync(path.join(dir, 'docs'));
      fs.writeFileSync(path.join(dir, 'README.md'), '');
      fs.writeFileSync(path.join(dir, 'docs', 'a.md'), '');
      const md = [
        'ok: [a](a.md), [a with fragment](a.md#part), [readme](../README.md), [dir](./), [rooted](/docs/a.md)',
        'ok: [web](https://example.com/x.md), [plain](http://example.com), [mail](mailto:x@example.com), [anchor](#top)',
        'ok: [titled](a.md "a title"), [angle](<a.md>), ![image](a.md)',
        'broken: [missing](missing.md)',
        'broken: [fragment only stripped](gone.md#part)',
        `broken: [escapes](../${OUTSIDE}/api-spec.md)`,
        '`[in code](nowhere.md)`',
        '```',
        '[in a fence](nowhere-either.md)',
        '```',
        '[ref]: missing-ref.md',
      ].join('\n');
      const broken = brokenLinks(path.join(dir, 'docs', 'b.md'), md, dir);
      expect(broken).toEqual([
        'docs/b.md:4: missing.md (no such file or directory)',
        'docs/b.md:5: gone.md#part (no such file or directory)',
        `docs/b.md:6: ../${OUTSIDE}/api-spec.md (outside the repository)`,
        'docs/b.md:11: missing-ref.md (no such file or directory)',
      ]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the repository stands alone', () => {
  it(`no tracked text file (package-lock.json aside) contains ${OUTSIDE}`, () => {
    const files = trackedFiles().filter((f) => path.basename(f) !== 'package-lock.json');
    expect(files).toContain('README.md');
    const offenders: string[] = [];
    for (const rel of files) {
      const abs = path.join(ROOT, rel);
      let buf: Buffer;
      try {
        if (!fs.lstatSync(abs).isFile()) continue;
        buf = fs.readFileSync(abs);
      } catch {
        continue; // tracked but deleted in the working tree
      }
      if (buf.subarray(0, 8000).includes(0)) continue; // binary
      buf
        .toString('utf8')
        .split('\n')
        .forEach((line, i) => {
          if (line.includes(OUTSIDE)) offenders.push(`${rel}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(offenders).toEqual([]);
  });
});
