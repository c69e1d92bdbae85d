/**
 * Terminal-safe text (src/terminal.ts): the classes of code points a terminal would interpret,
 * checked over every code point against a table written here from the Unicode charts (not from the
 * module), each boundary named; the visible escapes; JSON that parses to the same value with
 * none of them raw; and the logger's lines (JSON and pretty) with none of them raw.
 */
import { describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';
import { codePointName, escapeForTerminal, escapeJsonText, jsonForTerminal, unsafeCharOf, unsafeClassOf, visibleJsonText, type UnsafeClass } from '../src/terminal.js';
import { createLogger } from '../src/logger.js';
import { tempDir } from './helpers.js';

/** The classes, as the charts give them: [class, first, last]. */
const SPEC: [UnsafeClass, number, number][] = [
  ['C0 control', 0x0000, 0x001f],
  ['DEL', 0x007f, 0x007f],
  ['C1 control', 0x0080, 0x009f],
  ['bidi mark', 0x061c, 0x061c], // ARABIC LETTER MARK
  ['bidi mark', 0x200e, 0x200f], // LRM, RLM
  ['line or paragraph separator', 0x2028, 0x2029],
  ['bidi embedding or override', 0x202a, 0x202e], // LRE RLE PDF LRO RLO
  ['bidi isolate', 0x2066, 0x2069], // LRI RLI FSI PDI
  ['lone surrogate', 0xd800, 0xdfff],
];
const expectedClass = (cp: number): UnsafeClass | undefined => SPEC.find(([, lo, hi]) => cp >= lo && cp <= hi)?.[0];

describe('the classes of code points a terminal would interpret', () => {
  it('every code point from U+0000 to U+10FFFF is classed as the charts say', () => {
    const wrong: string[] = [];
    for (let cp = 0; cp <= 0x10ffff; cp++) {
      if (unsafeClassOf(cp) !== expectedClass(cp)) wrong.push(`${codePointName(cp)}: ${unsafeClassOf(cp)} != ${expectedClass(cp)}`);
    }
    expect(wrong).toEqual([]);
  });

  it('at each boundary: the first and last of a class are in it, their neighbours are not (or are the next class)', () => {
    const cases: [number, UnsafeClass | undefined][] = [
      [0x0000, 'C0 control'], [0x001b, 'C0 control'], [0x001f, 'C0 control'], [0x0020, undefined],
      [0x007e, undefined], [0x007f, 'DEL'], [0x0080, 'C1 control'], [0x0085, 'C1 control'], [0x009b, 'C1 control'], [0x009f, 'C1 control'], [0x00a0, undefined],
      [0x061b, undefined], [0x061c, 'bidi mark'], [0x061d, undefined],
      [0x200d, undefined], [0x200e, 'bidi mark'], [0x200f, 'bidi mark'], [0x2010, undefined],
      [0x2027, undefined], [0x2028, 'line or paragraph separator'], [0x2029, 'line or paragraph separator'],
      [0x202a, 'bidi embedding or override'], [0x202e, 'bidi embedding or override'], [0x202f, undefined],
      [0x2065, undefined], [0x2066, 'bidi isolate'], [0x2069, 'bidi isolate'], [0x206a, undefined],
      [0xd7ff, undefined], [0xd800, 'lone surrogate'], [0xdfff, 'lone surrogate'], [0xe000, undefined],
      [0xfeff, undefined], [0x1f916, undefined], [0x10ffff, undefined],
    ];
    for (const [cp, cls] of cases) expect(unsafeClassOf(cp), codePointName(cp)).toBe(cls);
  });

  it('unsafeCharOf names the first one with its class, code point and index; a surrogate pair is one safe character', () => {
    expect(unsafeCharOf('conv-1')).toBeUndefined();
    expect(unsafeCharOf('李伟 محمد נועה Олег 🤖👍🏽 Zoë')).toBeUndefined();
    expect(unsafeCharOf('ab\u202ecd\u0085')).toEqual({ cls: 'bidi embedding or override', codePoint: 0x202e, name: 'U+202E', index: 2 });
    expect(unsafeCharOf('x\u0085')).toMatchObject({ cls: 'C1 control', name: 'U+0085', index: 1 });
    expect(unsafeCharOf('\ud83e\udd16\ud800')).toMatchObject({ cls: 'lone surrogate', name: 'U+D800', index: 2 });
    expect(unsafeCharOf('\udc00\ud83e')).toMatchObject({ cls: 'lone surrogate', name: 'U+DC00', index: 0 });
    // The regex is global: a second call after a match starts from the beginning again.
    expect(unsafeCharOf('\u2066')).toMatchObject({ index: 0 });
    expect(unsafeCharOf('\u2066')).toMatchObject({ index: 0 });
  });
});

describe('escapeForTerminal', () => {
  it('writes each of them as a visible \\u{...} escape and leaves every other code point as it is', () => {
    const changed: string[] = [];
    for (let cp = 0; cp <= 0x10ffff; cp++) {
      const c = String.fromCodePoint(cp);
      const out = escapeForTerminal(c);
      const want = expectedClass(cp) ? `\\u{${cp.toString(16).toUpperCase().padStart(4, '0')}}` : c;
      if (out !== want) changed.push(codePointName(cp));
    }
    expect(changed).toEqual([]);
  });

  it('escapes ANSI and OSC sequences, NEL, Trojan Source reordering and line breaks; keeps scripts, emoji and backslashes', () => {
    expect(escapeForTerminal('\x1b[31mred\x1b[0m')).toBe('\\u{001B}[31mred\\u{001B}[0m');
    expect(escapeForTerminal('\x1b]0;pwned\x07')).toBe('\\u{001B}]0;pwned\\u{0007}');
    expect(escapeForTerminal('a\u0085b\u009b2J')).toBe('a\\u{0085}b\\u{009B}2J');
    expect(escapeForTerminal('invoice\u202egpj.exe')).toBe('invoice\\u{202E}gpj.exe');
    expect(escapeForTerminal('x\u2066y\u2069\u200e\u200f\u061c')).toBe('x\\u{2066}y\\u{2069}\\u{200E}\\u{200F}\\u{061C}');
    expect(escapeForTerminal('one\ntwo\r\u2028\u2029\t\x7f')).toBe('one\\u{000A}two\\u{000D}\\u{2028}\\u{2029}\\u{0009}\\u{007F}');
    expect(escapeForTerminal('\ud800 \udfff \udc00\ud800')).toBe('\\u{D800} \\u{DFFF} \\u{DC00}\\u{D800}');
    const ordinary = 'conv-1 李伟 山田 محمد נועה Олег Nguyễn 🤖 👍🏽 👩‍👩‍👧 C:\\Users\\me "quoted" \u00a0nbsp';
    expect(escapeForTerminal(ordinary)).toBe(ordinary);
    expect(escapeForTerminal('')).toBe('');
  });
});

describe('jsonForTerminal', () => {
  it('parses to the same value, with none of them raw and JSON.stringify unchanged otherwise', () => {
    const value = {
      id: 'a\u202eb\u0085c\u2028d\u2029e\x7ff\u2066g\u200eh\u061ci\x1bj\ud800k',
      nested: [{ reason: 'line\nbreak', emoji: '🤖 李伟', n: 3, none: null }],
    };
    const text = jsonForTerminal(value, 2);
    expect(JSON.parse(text)).toEqual(value);
    expect(unsafeCharOf(text.replace(/\n/g, ''))).toBeUndefined(); // only the indentation's newlines
    expect(text).toContain('a\\u202eb\\u0085c\\u2028d\\u2029e\\u007ff\\u2066g\\u200eh\\u061ci\\u001bj\\ud800k');
    expect(text).toContain('"emoji": "🤖 李伟"');
    const plain = { id: 'conv-1', list: [1, 'x'] };
    expect(jsonForTerminal(plain, 2)).toBe(JSON.stringify(plain, null, 2));
    expect(jsonForTerminal(plain)).toBe(JSON.stringify(plain));
    expect(jsonForTerminal(undefined)).toBe('null');
  });
});

describe('log lines', () => {
  const hostile = 'conv-\u202egnp.exe-\u0085-\u001b[2J-\u009b\u2028\u007f\\u001b-李伟🤖';

  it('escapeJsonText: a JSON log line keeps its values, with none of them raw', () => {
    const line = JSON.stringify({ conversation_id: hostile, msg: 'conversation failed' });
    const out = escapeJsonText(line);
    expect(JSON.parse(out)).toEqual(JSON.parse(line));
    expect(unsafeCharOf(out)).toBeUndefined();
  });

  it('visibleJsonText: decoded (as pino-pretty does), every one of them reads \\u{...}; LF and TAB stay; an escaped backslash stays a backslash', () => {
    const line = JSON.stringify({ id: hostile, stack: 'Error: x\n    at y\t(z)', bs: 'C:\\u001b\\path', ctl: '\b\f\r\u0001' });
    const out = JSON.parse(visibleJsonText(line)) as Record<string, string>;
    expect(out['id']).toBe('conv-\\u{202E}gnp.exe-\\u{0085}-\\u{001B}[2J-\\u{009B}\\u{2028}\\u{007F}\\u001b-李伟🤖');
    expect(out['stack']).toBe('Error: x\n    at y\t(z)');
    expect(out['bs']).toBe('C:\\u001b\\path');
    expect(out['ctl']).toBe('\\u{0008}\\u{000C}\\u{000D}\\u{0001}');
  });

  it('createLogger writes JSON lines with the same values and none raw; pretty lines show \\u{...} (colours are its own)', () => {
    let json = '';
    createLogger({ level: 'info', destination: new Writable({ write: (c, _e, cb) => ((json += String(c)), cb()) }) }).error({ conversation_id: hostile }, 'conversation failed');
    expect((JSON.parse(json) as { conversation_id: string }).conversation_id).toBe(hostile);
    expect(unsafeCharOf(json.trimEnd())).toBeUndefined();

    const file = path.join(tempDir('convo-mirror-pretty-'), 'pretty.log');
    const fd = fs.openSync(file, 'w');
    try {
      createLogger({ level: 'info', pretty: true, destination: fd }).error({ conversation_id: hostile }, 'conversation failed');
    } finally {
      fs.closeSync(fd);
    }
    const pretty = fs.readFileSync(file, 'utf8').replace(/\u001b\[[0-9;]*m/g, ''); // pino-pretty's own colours
    expect(pretty).toContain('conv-\\u{202E}gnp.exe-\\u{0085}-\\u{001B}[2J-\\u{009B}\\u{2028}\\u{007F}');
    expect(unsafeCharOf(pretty.trimEnd())).toBeUndefined();
    fs.rmSync(path.dirname(file), { recursive: true, force: true });
  });
});
