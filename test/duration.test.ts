import { describe, expect, it } from 'vitest';
import { durationSetting, formatDuration, parseDuration } from '../config/duration.js';

describe('parseDuration', () => {
  it.each([
    ['500ms', 500],
    ['90s', 90_000],
    ['15m', 900_000],
    ['24h', 86_400_000],
    ['7d', 604_800_000],
    ['2w', 1_209_600_000],
    ['1h30m', 5_400_000],
    [' 1h 30m ', 5_400_000],
    ['24H', 86_400_000],
    ['0s', 0],
  ])('%s is %i ms', (text, ms) => {
    expect(parseDuration(text)).toBe(ms);
  });

  it.each([
    ['30', /bare number: say which unit/],
    ['', /empty value/],
    ['1.5h', /expected a duration/],
    ['-5m', /expected a duration/],
    ['5 minutes', /expected a duration/],
    ['5y', /expected a duration/],
    ['h', /expected a duration/],
    ['99999999999999999d', /too long a duration/],
  ])('%j is refused', (text, why) => {
    expect(() => parseDuration(text)).toThrow(why);
  });
});

describe('formatDuration', () => {
  it.each([
    [0, '0 s'],
    [120, '120 ms'],
    [45_000, '45 s'],
    [119_999, '1 min 59 s'],
    [3_600_000, '1 h'],
    [7_500_000, '2 h 5 min'],
    [86_400_000 * 3 + 3_600_000 * 4 + 59_000, '3 d 4 h'],
    [-90_000, '-1 min 30 s'],
  ])('%i ms is %s', (ms, text) => {
    expect(formatDuration(ms)).toBe(text);
  });
});

describe('durationSetting', () => {
  const schema = durationSetting(60_000, 86_400_000 * 7);
  it('parses to ms within its bounds', () => {
    expect(schema.parse('24h')).toBe(86_400_000);
  });
  it('refuses what is out of bounds or not a duration, saying why', () => {
    expect(schema.safeParse('30s').error?.issues[0]?.message).toBe('must be between 1 min and 7 d, got 30 s');
    expect(schema.safeParse('30').error?.issues[0]?.message).toMatch(/^must be a duration such as .* \(a bare number: say which unit/);
  });
});
