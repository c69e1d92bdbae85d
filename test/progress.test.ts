/**
 * Progress figures: requests per second over the last 10 s and the time left at the recent pace,
 * from samples (pure), and the structured `progress` log line a non-terminal run writes.
 */
import { describe, expect, it } from 'vitest';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { formatEta, progressRates, startProgress, RATE_WINDOW_MS } from '../src/progress.js';
import { newProgress } from '../src/sync/types.js';
import { waitFor } from './children.js';

describe('progress rates', () => {
  it('requests/s and the ETA come from the last 10 s only', () => {
    const samples = [
      { atMs: 0, requests: 0, done: 0 },
      // 10 s later at a slow pace, then 10 s at 20 requests/s and 2 conversations/s.
      { atMs: 10_000, requests: 10, done: 1 },
      { atMs: 20_000, requests: 210, done: 21 },
    ];
    // The window holds the last two samples: 200 requests and 20 conversations in 10 s.
    expect(progressRates(samples.slice(1), 121)).toEqual({ requestsPerSec: 20, etaSec: 50 });
    expect(progressRates(samples, 121).requestsPerSec).toBe(20);
    expect(RATE_WINDOW_MS).toBe(10_000);
  });

  it('unknown ETA while nothing finished recently; 0 when all is done; nothing from one sample', () => {
    expect(progressRates([{ atMs: 0, requests: 0, done: 3 }, { atMs: 5000, requests: 50, done: 3 }], 10)).toEqual({ requestsPerSec: 10, etaSec: undefined });
    expect(progressRates([{ atMs: 0, requests: 0, done: 9 }, { atMs: 1000, requests: 5, done: 10 }], 10).etaSec).toBe(0);
    expect(progressRates([{ atMs: 0, requests: 0, done: 0 }], 10)).toEqual({ requestsPerSec: 0, etaSec: undefined });
  });

  it('a line logged every 10 s, a few ms late, measures from the line before it; no ETA while the total is unknown', () => {
    const samples = [
      { atMs: 0, requests: 0, done: 0 },
      { atMs: 10_004, requests: 200, done: 10 },
    ];
    expect(progressRates(samples, 30)).toEqual({ requestsPerSec: 20, etaSec: 21 });
    expect(progressRates(samples, 0).etaSec).toBeUndefined();
  });

  it('formats the ETA for people', () => {
    expect([formatEta(undefined), formatEta(0), formatEta(42), formatEta(185), formatEta(3720)]).toEqual(['?', '0s', '42s', '3m05s', '1h02m']);
  });
});

describe('progress without a terminal', () => {
  it('logs conversations done of total, messages, requests/s and the ETA as structured fields', async () => {
    const lines: Record<string, unknown>[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, cb) {
        for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
        cb();
      },
    });
    const progress = newProgress();
    progress.conversationsTotal = 10;
    const stats = { requests: 0, retries: 0, rateLimited: 0, networkErrors: 0, byStatus: {} };
    const stop = startProgress({ progress, stats, logger: pino({ level: 'info' }, sink), tty: false, intervalMs: 20 });
    try {
      progress.conversationsDone = 4;
      progress.messagesServed = 400;
      stats.requests = 8;
      await waitFor(() => lines.some((l) => l.conversations_done === 4), 5_000, 'a progress line');
    } finally {
      stop();
    }
    const line = lines.find((l) => l.conversations_done === 4)!;
    expect(line).toMatchObject({ msg: 'progress', conversations_total: 10, messages: 400, requests: 8 });
    expect(line.requests_per_sec).toBeGreaterThan(0);
    expect(typeof line.eta_s).toBe('number');
    expect(line.eta).toMatch(/^\d+(s|m\d\ds)$/);
  });
});
