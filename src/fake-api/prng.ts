/**
 * Deterministic pseudo-random numbers for the fake API's data generator (fake-api/).
 *
 * Everything the fake serves is derived from one {@link mulberry32} stream per workspace, so the same
 * seed and the same sequence of calls give byte-identical data. Nothing here reads the clock.
 */

/** A source of uniformly distributed numbers in `[0, 1)`, as returned by {@link mulberry32}. */
export type Rng = () => number;

/**
 * Mulberry32: a small, fast 32-bit PRNG. Not cryptographic; good enough for test data.
 *
 * @param seed - any number; it is truncated to an unsigned 32-bit integer (`seed >>> 0`), so seeds
 *   that differ only above bit 31 or in their fraction give the same stream
 * @returns a function that yields the next number of the stream, uniformly in `[0, 1)`, on each call
 */
export function mulberry32(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A uniformly distributed integer in `[min, max]` (both inclusive).
 *
 * @param rng - the stream to draw from (one draw)
 * @param min - lower bound, an integer
 * @param max - upper bound, an integer `>= min`
 * @throws RangeError when `max < min` or either bound is not an integer
 */
export function randInt(rng: Rng, min: number, max: number): number {
  if (!Number.isInteger(min) || !Number.isInteger(max) || max < min) {
    throw new RangeError(`randInt: bad bounds [${min}, ${max}]`);
  }
  return min + Math.floor(rng() * (max - min + 1));
}

/**
 * One element of a non-empty array, chosen uniformly.
 *
 * @param rng - the stream to draw from (one draw)
 * @param items - the candidates
 * @throws RangeError when `items` is empty
 */
export function pick<T>(rng: Rng, items: readonly T[]): T {
  if (items.length === 0) throw new RangeError('pick: empty array');
  return items[Math.floor(rng() * items.length)] as T;
}

/**
 * `true` with probability `p`.
 *
 * @param rng - the stream to draw from (one draw)
 * @param p - probability in `[0, 1]`
 */
export function chance(rng: Rng, p: number): boolean {
  return rng() < p;
}

/**
 * A string of lowercase hexadecimal digits.
 *
 * @param rng - the stream to draw from (one draw per 8 digits, rounded up)
 * @param length - number of hex digits
 */
export function randHex(rng: Rng, length: number): string {
  let out = '';
  while (out.length < length) {
    out += Math.floor(rng() * 4294967296)
      .toString(16)
      .padStart(8, '0');
  }
  return out.slice(0, length);
}

/**
 * A UUID version 4 string (`xxxxxxxx-xxxx-4xxx-Yxxx-xxxxxxxxxxxx`, Y in 8..b, lowercase) drawn from
 * the stream, so it is deterministic for a seed (spec 2.4: conversations are identified by a UUID).
 *
 * @param rng - the stream to draw from (four draws)
 */
export function randUuidV4(rng: Rng): string {
  const h = randHex(rng, 32).split('');
  h[12] = '4';
  h[16] = '89ab'[parseInt(h[16] ?? '0', 16) & 3] ?? '8';
  const s = h.join('');
  return `${s.slice(0, 8)}-${s.slice(8, 12)}-${s.slice(12, 16)}-${s.slice(16, 20)}-${s.slice(20, 32)}`;
}

/**
 * Shuffles an array in place (Fisher–Yates) and returns it.
 *
 * @param rng - the stream to draw from (`items.length - 1` draws)
 * @param items - the array to shuffle; it is modified
 */
export function shuffle<T>(rng: Rng, items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    const tmp = items[i] as T;
    items[i] = items[j] as T;
    items[j] = tmp;
  }
  return items;
}
