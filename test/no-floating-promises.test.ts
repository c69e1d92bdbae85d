/**
 * Every promise is handled (test/floating-promises.ts): since the store's methods return promises,
 * a call nobody awaits would lose its error and run out of order. The whole project (src, config,
 * jobs, bench, test) is checked; the checker itself is checked on small sources.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { checkSource, findFloatingPromises, programOf } from './floating-promises.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

describe('the floating-promise checker', () => {
  const lines = (code: string) => checkSource(code).map((f) => `${f.line} ${f.rule}`);

  it('reports a promise statement nobody handles, and nothing else', () => {
    const code = [
      'async function f(): Promise<number> { return 1; }', // 1
      'declare const maybe: Promise<void> | undefined;', // 2
      'declare const thenable: { then(ok: () => void): void };', // 3
      'async function main() {', // 4
      '  f();', // 5: floating
      '  await f();', // 6
      '  void f();', // 7
      '  f().catch(() => {});', // 8
      '  f().then(() => {}, () => {});', // 9
      '  f().then(() => {});', // 10: floating (no rejection handler)
      '  f().finally(() => {});', // 11: floating
      '  maybe;', // 12: floating (a union with a promise)
      '  thenable;', // 13: floating (a thenable)
      '  const kept = f();', // 14
      '  let later: Promise<number>; later = f();', // 15
      '  return f();', // 16
      '}',
      'void main();',
    ].join('\n');
    expect(lines(code)).toEqual(['5 floating', '10 floating', '11 floating', '12 floating', '13 floating']);
  });

  it('reports an async callback passed where a void one is wanted', () => {
    const code = [
      'declare function on(event: string, handler: () => void): void;', // 1
      'declare function each<T>(xs: T[], fn: (x: T) => unknown): void;', // 2
      'declare function run(fn: () => Promise<void>): Promise<void>;', // 3
      'on("x", async () => {});', // 4: void-callback
      'on("x", () => void Promise.resolve().catch(() => {}));', // 5
      'each([1], async () => {});', // 6: fine (unknown return)
      'void run(async () => {});', // 7: fine (wants a promise)
      '[1].forEach(async () => {});', // 8: void-callback
    ].join('\n');
    expect(lines(code)).toEqual(['4 void-callback', '8 void-callback']);
  });
});

describe('the project', () => {
  it('leaves no promise unhandled', () => {
    const program = programOf([path.join(ROOT, 'tsconfig.test.json'), path.join(ROOT, 'tsconfig.json')]);
    const found = findFloatingPromises(program, ROOT);
    expect(found.map((f) => `${f.file}:${f.line} ${f.rule}: ${f.text}`)).toEqual([]);
  }, 120_000);
});
