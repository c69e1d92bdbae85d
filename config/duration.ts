/**
 * Durations as people write them in settings and flags: `90s`, `15m`, `24h`, `7d`, `1h30m`, `500ms`
 * (units `ms`, `s`, `m`, `h`, `d`, `w`; several parts add up). A bare number is refused: whether
 * `30` meant seconds or milliseconds is exactly the mistake a setting should not guess at.
 */

import { z } from 'zod';

/** Milliseconds per unit. */
const UNIT_MS: Readonly<Record<string, number>> = Object.freeze({
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
  w: 604_800_000,
});

/** One part of a duration: a whole number and its unit (`ms` before `m`, so `500ms` is not 500 minutes). */
const PART_RE = /(\d+)(ms|s|m|h|d|w)/y;

/** How the error of {@link parseDuration} describes what it accepts. */
export const DURATION_HINT = 'a duration such as 90s, 15m, 24h, 7d or 1h30m (units ms, s, m, h, d, w)';

/**
 * Parses a duration (see the module comment) into milliseconds. Spaces around the text, and
 * between parts, are ignored; letters are case-insensitive.
 *
 * @returns milliseconds (a safe integer, ≥ 0)
 * @throws RangeError saying what is accepted ({@link DURATION_HINT}) for anything else: a bare
 *   number, an unknown unit, a fraction, a negative sign, an empty string, or more than
 *   `Number.MAX_SAFE_INTEGER` ms
 */
export function parseDuration(text: string): number {
  const s = text.replace(/\s+/g, '').toLowerCase();
  if (s === '') throw new RangeError(`expected ${DURATION_HINT}, got an empty value`);
  let ms = 0;
  PART_RE.lastIndex = 0;
  while (PART_RE.lastIndex < s.length) {
    const m = PART_RE.exec(s);
    if (!m) {
      const why = /^\d+$/.test(s) ? ' (a bare number: say which unit, e.g. 30s or 30m)' : '';
      throw new RangeError(`expected ${DURATION_HINT}, got ${JSON.stringify(text)}${why}`);
    }
    ms += Number(m[1]) * UNIT_MS[m[2]!]!;
  }
  if (!Number.isSafeInteger(ms)) throw new RangeError(`${JSON.stringify(text)} is too long a duration`);
  return ms;
}

/**
 * A duration for people: the two largest non-zero units, e.g. `3 d 4 h`, `2 h 5 min`, `45 s`,
 * `120 ms` (`0 s` for zero). Rounds down: `formatDuration(119_999)` is `1 min 59 s`.
 *
 * @param ms - milliseconds, ≥ 0 (a negative value is formatted as its absolute value with a `-`)
 */
export function formatDuration(ms: number): string {
  if (ms < 0) return `-${formatDuration(-ms)}`;
  if (ms < 1_000) return ms === 0 ? '0 s' : `${Math.floor(ms)} ms`;
  const units: [string, number][] = [
    ['d', 86_400_000],
    ['h', 3_600_000],
    ['min', 60_000],
    ['s', 1_000],
  ];
  const parts: string[] = [];
  let rest = Math.floor(ms);
  for (const [name, size] of units) {
    const n = Math.floor(rest / size);
    rest -= n * size;
    if (n > 0 || parts.length > 0) parts.push(`${n} ${name}`);
    if (parts.length === 2) break;
  }
  return parts.filter((p) => !p.startsWith('0 ')).join(' ');
}

/**
 * A zod schema for a duration setting: the text parsed by {@link parseDuration}, then bounded.
 * Parses to milliseconds.
 *
 * @param minMs - shortest accepted duration, ms
 * @param maxMs - longest accepted duration, ms
 */
export function durationSetting(minMs: number, maxMs: number) {
  return z.string().transform((s, ctx) => {
    let ms: number;
    try {
      ms = parseDuration(s);
    } catch (err) {
      ctx.addIssue({ code: 'custom', message: `must be ${(err as Error).message.replace(/^expected /, '')}` });
      return z.NEVER;
    }
    if (ms < minMs || ms > maxMs) {
      ctx.addIssue({ code: 'custom', message: `must be between ${formatDuration(minMs)} and ${formatDuration(maxMs)}, got ${formatDuration(ms)}` });
      return z.NEVER;
    }
    return ms;
  });
}
