/**
 * The log throttle (src/log-throttle.ts) on an injected clock and injected timers: one line per
 * reason per window, the count of the rest carried by the next line or by a summary when the window
 * closes, reasons apart, flush on shutdown. Then the queue dashboard's failed logins over real HTTP
 * (jobs/dashboard.ts on a real BullMQ queue): many wrong passwords, one log line, the count
 * suppressed, the 401s unchanged.
 */
import { Writable } from 'node:stream';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import pino from 'pino';
import type { Queue } from 'bullmq';
import { LogThrottle, DEFAULT_LOG_WINDOW_MS } from '../src/log-throttle.js';
import { dashboardPlugin } from '../jobs/dashboard.js';
import { openQueue } from '../jobs/queue.js';
import { RedisLink } from '../jobs/redis-link.js';
import { redisShown } from '../config/redis-url.js';
import { Metrics, startServer, type RunningServer } from '../src/server/index.js';
import { cleanupPrefix, prefixSequence, redisUrl } from './redis.js';

/** Timers the test fires by hand: each `setTimer` call recorded with its delay. */
function manualTimers() {
  const armed: { fn: () => void; ms: number; cancelled: boolean }[] = [];
  return {
    armed,
    setTimer: (fn: () => void, ms: number) => {
      const t = { fn, ms, cancelled: false };
      armed.push(t);
      return () => void (t.cancelled = true);
    },
    /** Fires every armed, uncancelled timer once (in order). */
    fire: () => {
      for (const t of armed.splice(0)) if (!t.cancelled) t.fn();
    },
  };
}

function throttle(windowMs = 10_000) {
  let now = 5_000_000;
  const summaries: [string, number][] = [];
  const timers = manualTimers();
  const t = new LogThrottle<string>({ windowMs, now: () => now, setTimer: timers.setTimer, onSuppressed: (r, n) => summaries.push([r, n]) });
  return { t, summaries, timers, advance: (ms: number) => (now += ms) };
}

describe('LogThrottle', () => {
  it('logs the first event of a reason, suppresses the rest of its 10 s window, and the next line carries the count', () => {
    const { t, advance } = throttle();
    expect(DEFAULT_LOG_WINDOW_MS).toBe(10_000);
    expect(t.admit('bad_signature')).toEqual({ suppressed: 0 });
    for (let i = 0; i < 1999; i++) expect(t.admit('bad_signature')).toBeUndefined();
    advance(9_999);
    expect(t.admit('bad_signature')).toBeUndefined(); // still inside: 2,000 suppressed
    advance(1); // the window's end
    expect(t.admit('bad_signature')).toEqual({ suppressed: 2000 });
    expect(t.admit('bad_signature')).toBeUndefined();
    advance(10_000);
    expect(t.admit('bad_signature')).toEqual({ suppressed: 1 });
    advance(10_000);
    expect(t.admit('bad_signature')).toEqual({ suppressed: 0 }); // nothing left out since
  });

  it('keeps each reason apart', () => {
    const { t } = throttle();
    expect(t.admit('bad_signature')).toEqual({ suppressed: 0 });
    expect(t.admit('replay')).toEqual({ suppressed: 0 });
    expect(t.admit('bad_signature')).toBeUndefined();
    expect(t.admit('replay')).toBeUndefined();
    expect(t.admit('bad_id')).toEqual({ suppressed: 0 });
    expect(t.size).toBe(3);
  });

  it('a window that closes with suppressed events writes one summary line, armed at the first suppressed event for the rest of the window', () => {
    const { t, summaries, timers, advance } = throttle();
    t.admit('bad_credentials');
    expect(timers.armed).toEqual([]); // nothing suppressed, nothing to report
    advance(4_000);
    for (let i = 0; i < 49; i++) t.admit('bad_credentials');
    expect(timers.armed.map((x) => x.ms)).toEqual([6_000]); // one timer, for the rest of the window
    advance(6_000);
    timers.fire();
    expect(summaries).toEqual([['bad_credentials', 49]]);
    // Reported once: the next event opens a fresh window without a count.
    expect(t.admit('bad_credentials')).toEqual({ suppressed: 0 });
    expect(summaries).toHaveLength(1);
  });

  it('a timer that fires before the clock reached the window end re-arms for the rest; a line that comes first carries the count and cancels it', () => {
    const { t, summaries, timers, advance } = throttle();
    t.admit('replay');
    t.admit('replay');
    advance(7_000);
    timers.fire(); // early: 3 s left
    expect(summaries).toEqual([]);
    expect(timers.armed.map((x) => x.ms)).toEqual([3_000]);
    advance(3_000);
    expect(t.admit('replay')).toEqual({ suppressed: 1 });
    timers.fire(); // cancelled: no summary on top of the line
    expect(summaries).toEqual([]);
  });

  it('flush reports every pending count (shutdown) and forgets every window', () => {
    const { t, summaries, timers } = throttle();
    t.admit('a');
    t.admit('a');
    t.admit('a');
    t.admit('b');
    t.admit('c');
    t.admit('c');
    t.flush();
    expect(summaries).toEqual([['a', 2], ['c', 1]]);
    expect(t.size).toBe(0);
    timers.fire(); // cancelled by the flush
    expect(summaries).toHaveLength(2);
    expect(t.admit('a')).toEqual({ suppressed: 0 });
  });
});

describe('the dashboard: failed logins', () => {
  const prefixes = prefixSequence('log-throttle');
  const servers: RunningServer[] = [];
  const queues: Queue[] = [];
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => s.close()));
    await Promise.all(queues.splice(0).map((q) => q.close()));
  });
  afterAll(async () => {
    for (const p of prefixes.all) await cleanupPrefix(redisUrl(), p);
  });

  it('300 wrong passwords: every answer 401 as before, one log line; after 10 s the next line carries suppressed: 299; a closing window is summed up on shutdown', async () => {
    const PASSWORD = 'correct-horse-battery-staple';
    const queue = openQueue({ redisUrl: redisUrl(), prefix: prefixes.next() });
    queues.push(queue);
    const link = new RedisLink(queue.getBackend().client, redisShown(redisUrl()));
    await link.connected;
    let now = 1_800_000_000_000;
    let log = '';
    const logger = pino({ level: 'debug' }, new Writable({ write: (c, _e, cb) => ((log += String(c)), cb()) }));
    const server = await startServer(
      // Summary timers never fire by themselves (manual): a slow machine cannot write one mid-test.
      { logger, metrics: new Metrics({ processMetrics: false }), checks: [], plugins: [dashboardPlugin({ queue, link, password: PASSWORD, logger, now: () => now, setTimer: manualTimers().setTimer })] },
      { host: '127.0.0.1', port: 0 },
    );
    servers.push(server);
    const wrong = { authorization: `Basic ${Buffer.from('admin:wrong-password-123').toString('base64')}` };
    const attempt = async () => {
      const res = await fetch(`${server.url}/admin/queues/api/queues`, { headers: wrong });
      await res.body?.cancel();
      return [res.status, res.headers.get('www-authenticate')] as const;
    };
    const lines = () => log.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => String(l['msg']).startsWith('dashboard: refused credentials'));

    for (let i = 0; i < 300; i++) expect(await attempt()).toEqual([401, 'Basic realm="convo-mirror", charset="UTF-8"']);
    expect(lines()).toHaveLength(1);
    expect(lines()[0]).toMatchObject({ msg: 'dashboard: refused credentials', refusal: 'bad_credentials', path: '/admin/queues/api/queues', component: 'dashboard' });
    expect(lines()[0]).not.toHaveProperty('suppressed');

    now += 10_000;
    expect(await attempt()).toEqual([401, 'Basic realm="convo-mirror", charset="UTF-8"']);
    expect(lines()).toHaveLength(2);
    expect(lines()[1]).toMatchObject({ msg: 'dashboard: refused credentials', suppressed: 299 });

    // No credentials at all is not a failed login: answered 401, not logged (as before).
    const bare = await fetch(`${server.url}/admin/queues/api/queues`);
    expect(bare.status).toBe(401);
    await bare.body?.cancel();
    for (let i = 0; i < 5; i++) await attempt();
    await server.close();
    expect(lines().slice(2)).toEqual([expect.objectContaining({ msg: 'dashboard: refused credentials suppressed', refusal: 'bad_credentials', suppressed: 5, window_ms: 10_000 })]);
    expect(log).not.toContain('wrong-password-123');
    expect(log).not.toContain(PASSWORD);
  });
});
