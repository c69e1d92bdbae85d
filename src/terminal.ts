/**
 * Terminal-safe text: the code points a terminal (or a text viewer) would interpret rather than
 * show, named by class, and their visible escapes. Ids and failure messages come from the API, a
 * webhook's sender or Redis; none of them may move the cursor, recolour the screen, retitle the
 * window, reorder what follows (Trojan Source, CVE-2021-42574) or start a new line.
 *
 * One list, used three ways: the webhook route refuses ids holding any of them
 * ({@link unsafeCharOf}); every command that prints an id or a failure message escapes them
 * ({@link escapeForTerminal}); `--json` writes them as `\uXXXX` ({@link jsonForTerminal}).
 */

/** The classes of code points a terminal would interpret. */
export type UnsafeClass = 'C0 control' | 'DEL' | 'C1 control' | 'bidi embedding or override' | 'bidi isolate' | 'bidi mark' | 'line or paragraph separator' | 'lone surrogate';

/**
 * Every class with its code points (inclusive ranges), in the order {@link unsafeClassOf} tests them:
 * - C0 controls U+0000–U+001F (ESC starts ANSI sequences; CR, LF, TAB, BS rewrite the line);
 * - DEL U+007F;
 * - C1 controls U+0080–U+009F (U+009B is CSI, U+009D OSC, U+0085 NEL: a line break);
 * - bidi embeddings and overrides U+202A–U+202E (LRE, RLE, PDF, LRO, RLO);
 * - bidi isolates U+2066–U+2069 (LRI, RLI, FSI, PDI);
 * - bidi marks U+200E LRM, U+200F RLM, U+061C ALM;
 * - U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR;
 * - lone surrogates U+D800–U+DFFF not part of a pair (no character at all).
 */
export const UNSAFE_RANGES: readonly { cls: UnsafeClass; ranges: readonly (readonly [number, number])[] }[] = [
  { cls: 'C0 control', ranges: [[0x00, 0x1f]] },
  { cls: 'DEL', ranges: [[0x7f, 0x7f]] },
  { cls: 'C1 control', ranges: [[0x80, 0x9f]] },
  { cls: 'bidi embedding or override', ranges: [[0x202a, 0x202e]] },
  { cls: 'bidi isolate', ranges: [[0x2066, 0x2069]] },
  { cls: 'bidi mark', ranges: [[0x200e, 0x200f], [0x061c, 0x061c]] },
  { cls: 'line or paragraph separator', ranges: [[0x2028, 0x2029]] },
  { cls: 'lone surrogate', ranges: [[0xd800, 0xdfff]] },
];

/**
 * One match of any unsafe code point. In `u` mode a surrogate pair is one code point (an emoji),
 * so `\p{Cs}` matches only a lone surrogate.
 */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]|\p{Cs}/gu;
/** The same without lone surrogates: what `JSON.stringify` leaves raw (it escapes C0 and lone surrogates itself). */
const RAW_IN_JSON = /[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** `U+202E`: a code point as the Unicode standard writes it (at least 4 uppercase hex digits). */
export const codePointName = (cp: number): string => `U+${cp.toString(16).toUpperCase().padStart(4, '0')}`;

/**
 * The class of code point `cp` if a terminal would interpret it; undefined for ordinary text
 * (letters of any script, digits, punctuation, emoji, spaces other than the controls).
 * A surrogate code point counts as `lone surrogate`: pass code points of well-formed pairs combined.
 */
export function unsafeClassOf(cp: number): UnsafeClass | undefined {
  for (const { cls, ranges } of UNSAFE_RANGES) {
    for (const [lo, hi] of ranges) if (cp >= lo && cp <= hi) return cls;
  }
  return undefined;
}

/** The first unsafe code point of a string, with its class and its UTF-16 index. */
export interface UnsafeChar {
  cls: UnsafeClass;
  /** The code point, e.g. 0x202e. */
  codePoint: number;
  /** Its name, e.g. `U+202E`. */
  name: string;
  /** Index of its UTF-16 code unit in the string. */
  index: number;
}

/** The first code point of `s` a terminal would interpret, or undefined when `s` is safe to print. */
export function unsafeCharOf(s: string): UnsafeChar | undefined {
  UNSAFE.lastIndex = 0;
  const m = UNSAFE.exec(s);
  if (!m) return undefined;
  const codePoint = m[0].codePointAt(0)!;
  return { cls: unsafeClassOf(codePoint)!, codePoint, name: codePointName(codePoint), index: m.index };
}

/**
 * `s` with every code point a terminal would interpret ({@link UNSAFE_RANGES}) written as a visible
 * escape, `\u{1B}`-style with at least 4 hex digits: ESC becomes `\u{001B}`, NEL `\u{0085}`, RLO
 * `\u{202E}`, a newline `\u{000A}`. Everything else is left as it is, including non-Latin scripts,
 * emoji and the backslash (so the escapes are for reading, not a reversible encoding).
 */
export function escapeForTerminal(s: string): string {
  return s.replace(UNSAFE, (c) => `\\u{${c.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}}`);
}

/**
 * `JSON.stringify(value, null, indent)` in which no code point a terminal would interpret is raw:
 * the ones `JSON.stringify` leaves as they are (DEL, C1, the bidi controls, U+2028/2029) are
 * written `\u007f`, `\u0085`, `\u202e`... It escapes C0 and lone surrogates itself. These code
 * points only ever occur inside string literals, so the result parses to the same value.
 * (`undefined` at the top level, which `JSON.stringify` cannot write, is written `null`.)
 */
export function jsonForTerminal(value: unknown, indent?: number): string {
  const text = JSON.stringify(value, null, indent) as string | undefined; // undefined for undefined or a function
  return escapeJsonText(text ?? 'null');
}

/**
 * JSON text (as `JSON.stringify` or pino writes it) with the code points a terminal would interpret
 * that are still raw in it written `\uXXXX`: valid JSON with the same value (they can only occur
 * inside string literals).
 */
export function escapeJsonText(json: string): string {
  return json.replace(RAW_IN_JSON, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** In JSON text: an escaped backslash (kept), a C0 escape other than `\n` and `\t`, or a raw unsafe code point. */
const JSON_UNSAFE = /\\\\|\\u00[01][0-9a-fA-F]|\\[bfr]|[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const SHORT_ESCAPES: Record<string, number> = { b: 0x08, f: 0x0c, r: 0x0d };

/**
 * JSON text rewritten for a reader that decodes it and shows it on a terminal (pino-pretty): every
 * code point a terminal would interpret, raw or `\uXXXX`-escaped, becomes the text `\u{XXXX}` in
 * the decoded value ({@link escapeForTerminal}'s form), except LF and TAB, which a pretty log keeps
 * for stack traces. Still valid JSON; the decoded strings differ from the original (for display).
 * Lone surrogates, which `JSON.stringify` writes `\udXXX`, decode to themselves and are left alone.
 */
export function visibleJsonText(json: string): string {
  return json.replace(JSON_UNSAFE, (m) => {
    if (m === '\\\\') return m;
    const cp = m.length === 1 ? m.charCodeAt(0) : m.length === 2 ? SHORT_ESCAPES[m[1]!]! : parseInt(m.slice(2), 16);
    return `\\\\u{${cp.toString(16).toUpperCase().padStart(4, '0')}}`;
  });
}
