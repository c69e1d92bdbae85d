/**
 * The fenced code blocks of the documentation (README.md and docs/*.md), with the test marker on
 * the line before each fence (`<!-- test: ... -->`), for the tests that run them
 * (test/readme-steps.test.ts, test/docs-recipes.test.ts).
 */
import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from './children.js';

/** A fenced code block of a markdown file, with the marker on the line before its fence. */
export interface DocBlock {
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  /** The info string's first word (`sh`, `sql`, `text`...). */
  lang: string;
  /** The text of `<!-- test: ... -->` on the line before the fence, if any. */
  marker: string | undefined;
  body: string;
}

/** README.md and every docs/*.md, repository-relative. */
export function docFiles(): string[] {
  return ['README.md', ...fs.readdirSync(path.join(ROOT, 'docs')).filter((n) => n.endsWith('.md')).sort().map((n) => `docs/${n}`)];
}

/** The fenced code blocks of `file` (repository-relative). */
export function docBlocks(file: string): DocBlock[] {
  const lines = fs.readFileSync(path.join(ROOT, file), 'utf8').split('\n');
  const out: DocBlock[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(`{3,})(\S*)/.exec(lines[i]!);
    if (!open) continue;
    const fence = open[1]!;
    const end = lines.findIndex((l, j) => j > i && l.startsWith(fence) && l.trim() === fence);
    const marker = /^<!-- test: (.*) -->$/.exec(lines[i - 1] ?? '')?.[1];
    out.push({ file, line: i + 1, lang: open[2]!, marker, body: lines.slice(i + 1, end < 0 ? lines.length : end).join('\n') });
    i = end < 0 ? lines.length : end;
  }
  return out;
}

