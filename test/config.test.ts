/**
 * loadConfig: defaults, precedence (flag > env > default), validation naming the variable or flag,
 * the API key never echoed, freezing.
 */
import { describe, expect, it } from 'vitest';
import { maskUserInfo, loadConfig, type Config, type ConfigFlags } from '../config/index.js';
import { ConfigError } from '../src/errors.js';

const KEY = 'sk-config-SECRET-4b81e07d';
const BASE = {
  CONVO_MIRROR_BASE_URL: 'https://support.example.com/api',
  CONVO_MIRROR_API_KEY: KEY,
} as const;

/** The ConfigError thrown by loadConfig; fails the test if it does not throw one. */
function configError(env: NodeJS.ProcessEnv, flags: ConfigFlags = {}, opts?: { needsApi?: boolean }): ConfigError {
  try {
    loadConfig(env, flags, opts);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error('expected loadConfig to throw a ConfigError');
}

describe('loadConfig defaults', () => {
  it('uses the documented defaults when only URL and key are set', () => {
    const cfg = loadConfig({ ...BASE });
    expect(cfg).toEqual<Config>({
      baseUrl: 'https://support.example.com/api',
      apiKey: KEY,
      accountId: undefined,
      workspacesFile: undefined,
      workspaces: [{ accountId: undefined, baseUrl: 'https://support.example.com/api', apiKey: KEY, schedule: '*/15 * * * *', fullSchedule: '0 3 * * *' }],
      db: 'data/mirror.sqlite',
      exportDir: 'data/exports',
      exportGzip: false,
      publishIntervalMs: 300_000,
      publishLines: 10_000,
      runsHeartbeatMs: 86_400_000,
      signingKeyFile: undefined,
      witnessDir: undefined,
      retention: undefined,
      pruneMirror: false,
      listParams: [],
      concurrency: 4,
      maxRps: 10,
      requestTimeoutMs: 30_000,
      maxRetries: 6,
      logLevel: 'info',
      redisUrl: 'redis://127.0.0.1:6379',
      schedule: '*/15 * * * *',
      fullSchedule: '0 3 * * *',
      tz: 'UTC',
      shutdownTimeoutMs: 20_000,
      queuePrefix: 'convo-mirror',
      jobAttempts: 5,
      failedJobsMaxAgeMs: 604_800_000,
      failedJobsMaxCount: 1000,
      jobLockMs: 30_000,
      maxResponseBytes: 32 * 1024 * 1024,
      groupReadable: false,
      changeField: 'auto',
      httpHost: '127.0.0.1',
      httpPort: 9464,
      scheduler: 'bullmq',
      webhookSecret: undefined,
      webhookIdPointers: ['/conversation_id', '/conversation/id', '/data/conversation_id', '/data/conversation/id'],
      adminPassword: undefined,
    });
  });

  it('treats an empty environment variable as unset', () => {
    const cfg = loadConfig({ ...BASE, CONVO_MIRROR_CONCURRENCY: '', LOG_LEVEL: '', CONVO_MIRROR_ACCOUNT_ID: '' });
    expect(cfg.concurrency).toBe(4);
    expect(cfg.logLevel).toBe('info');
    expect(cfg.accountId).toBeUndefined();
  });

  it('reads every variable from the environment and coerces numbers', () => {
    const cfg = loadConfig({
      ...BASE,
      CONVO_MIRROR_BASE_URL: 'http://127.0.0.1:8080/prefix///',
      CONVO_MIRROR_ACCOUNT_ID: '3D6F0A52-8C1E-4B7A-9F20-6E5D4C3B2A10',
      CONVO_MIRROR_DB: '/tmp/m.sqlite',
      CONVO_MIRROR_EXPORT_DIR: '/tmp/exp',
      CONVO_MIRROR_CONCURRENCY: '8',
      CONVO_MIRROR_MAX_RPS: '2.5',
      CONVO_MIRROR_REQUEST_TIMEOUT_MS: '1500',
      CONVO_MIRROR_MAX_RETRIES: '0',
      LOG_LEVEL: 'debug',
    });
    expect(cfg.baseUrl).toBe('http://127.0.0.1:8080/prefix');
    expect(cfg.accountId).toBe('3D6F0A52-8C1E-4B7A-9F20-6E5D4C3B2A10');
    expect(cfg.db).toBe('/tmp/m.sqlite');
    expect(cfg.exportDir).toBe('/tmp/exp');
    expect(cfg.concurrency).toBe(8);
    expect(cfg.maxRps).toBe(2.5);
    expect(cfg.requestTimeoutMs).toBe(1500);
    expect(cfg.maxRetries).toBe(0);
    expect(cfg.logLevel).toBe('debug');
  });

  it('accepts maxRps 0 (no cap)', () => {
    expect(loadConfig({ ...BASE, CONVO_MIRROR_MAX_RPS: '0' }).maxRps).toBe(0);
  });
});

describe('CONVO_MIRROR_LIST_PARAMS', () => {
  it('parses a query string (a leading ? allowed, percent-encoding decoded) into its pairs in order; unset is none', () => {
    expect(loadConfig({ ...BASE, CONVO_MIRROR_LIST_PARAMS: '?sort=last_activity_at&order=desc&filter=a%2Cb' }).listParams).toEqual([
      ['sort', 'last_activity_at'],
      ['order', 'desc'],
      ['filter', 'a,b'],
    ]);
    expect(loadConfig({ ...BASE }).listParams).toEqual([]);
    expect(loadConfig({ ...BASE }, { listParams: 'order=desc' }).listParams).toEqual([['order', 'desc']]);
  });
});

describe('loadConfig precedence', () => {
  it('flags win over the environment', () => {
    const cfg = loadConfig(
      { ...BASE, CONVO_MIRROR_CONCURRENCY: '2', CONVO_MIRROR_DB: 'env.sqlite', LOG_LEVEL: 'warn', CONVO_MIRROR_MAX_RPS: '3' },
      { concurrency: '6', db: 'flag.sqlite', logLevel: 'error', maxRps: 7, baseUrl: 'https://flag.example.com/' },
    );
    expect(cfg.concurrency).toBe(6);
    expect(cfg.db).toBe('flag.sqlite');
    expect(cfg.logLevel).toBe('error');
    expect(cfg.maxRps).toBe(7);
    expect(cfg.baseUrl).toBe('https://flag.example.com');
    expect(cfg.apiKey).toBe(KEY);
  });

  it('a valid flag overrides a malformed environment value', () => {
    const cfg = loadConfig({ ...BASE, CONVO_MIRROR_CONCURRENCY: 'lots' }, { concurrency: 3 });
    expect(cfg.concurrency).toBe(3);
  });

  it('flags supply the required URL and key', () => {
    const cfg = loadConfig({}, { baseUrl: 'http://localhost:9', apiKey: 'k' });
    expect(cfg.baseUrl).toBe('http://localhost:9');
    expect(cfg.apiKey).toBe('k');
  });
});

describe('loadConfig errors', () => {
  it('missing CONVO_MIRROR_BASE_URL throws a ConfigError naming it', () => {
    const err = configError({ CONVO_MIRROR_API_KEY: KEY });
    expect(err.variable).toBe('CONVO_MIRROR_BASE_URL');
    expect(err.message).toContain('CONVO_MIRROR_BASE_URL');
    expect(err.message).toContain('--base-url');
    expect(err.code).toBe('CONFIG_ERROR');
  });

  it('missing CONVO_MIRROR_API_KEY throws a ConfigError naming it', () => {
    const err = configError({ CONVO_MIRROR_BASE_URL: BASE.CONVO_MIRROR_BASE_URL });
    expect(err.variable).toBe('CONVO_MIRROR_API_KEY');
    expect(err.message).toContain('CONVO_MIRROR_API_KEY');
  });

  it.each<[string, Record<string, string>, string]>([
    ['base URL not a URL', { CONVO_MIRROR_BASE_URL: 'not a url' }, 'CONVO_MIRROR_BASE_URL'],
    ['base URL not http(s)', { CONVO_MIRROR_BASE_URL: 'ftp://example.com/api' }, 'CONVO_MIRROR_BASE_URL'],
    ['account id not a UUID', { CONVO_MIRROR_ACCOUNT_ID: 'abc' }, 'CONVO_MIRROR_ACCOUNT_ID'],
    ['concurrency 0', { CONVO_MIRROR_CONCURRENCY: '0' }, 'CONVO_MIRROR_CONCURRENCY'],
    ['concurrency x', { CONVO_MIRROR_CONCURRENCY: 'x' }, 'CONVO_MIRROR_CONCURRENCY'],
    ['concurrency 1.5', { CONVO_MIRROR_CONCURRENCY: '1.5' }, 'CONVO_MIRROR_CONCURRENCY'],
    ['concurrency 65', { CONVO_MIRROR_CONCURRENCY: '65' }, 'CONVO_MIRROR_CONCURRENCY'],
    ['max rps -1', { CONVO_MIRROR_MAX_RPS: '-1' }, 'CONVO_MIRROR_MAX_RPS'],
    ['max rps abc', { CONVO_MIRROR_MAX_RPS: 'abc' }, 'CONVO_MIRROR_MAX_RPS'],
    ['timeout 5', { CONVO_MIRROR_REQUEST_TIMEOUT_MS: '5' }, 'CONVO_MIRROR_REQUEST_TIMEOUT_MS'],
    ['max retries 21', { CONVO_MIRROR_MAX_RETRIES: '21' }, 'CONVO_MIRROR_MAX_RETRIES'],
    ['LOG_LEVEL loud', { LOG_LEVEL: 'loud' }, 'LOG_LEVEL'],
    ['api key blank', { CONVO_MIRROR_API_KEY: '   ' }, 'CONVO_MIRROR_API_KEY'],
    ['list params setting page', { CONVO_MIRROR_LIST_PARAMS: 'sort=x&page=3' }, 'CONVO_MIRROR_LIST_PARAMS'],
    ['list params setting per_page', { CONVO_MIRROR_LIST_PARAMS: 'per_page=50' }, 'CONVO_MIRROR_LIST_PARAMS'],
    ['list params with a space', { CONVO_MIRROR_LIST_PARAMS: 'sort=last activity' }, 'CONVO_MIRROR_LIST_PARAMS'],
    ['list params with a nameless pair', { CONVO_MIRROR_LIST_PARAMS: '=desc' }, 'CONVO_MIRROR_LIST_PARAMS'],
  ])('%s throws a ConfigError naming the variable', (_label, env, variable) => {
    const err = configError({ ...BASE, ...env });
    expect(err.variable).toBe(variable);
    expect(err.message.startsWith(`${variable}: `)).toBe(true);
    expect(err.context).toEqual({ variable });
    expect(err.message).not.toContain(KEY);
  });

  it('the offending value is shown for non-secret variables', () => {
    const err = configError({ ...BASE, LOG_LEVEL: 'loud' });
    expect(err.message).toContain('"loud"');
    expect(err.message).toContain('info');
  });

  it.each<[string, ConfigFlags, string]>([
    ['--concurrency 0', { concurrency: '0' }, '--concurrency'],
    ['--concurrency x', { concurrency: 'x' }, '--concurrency'],
    ['--max-rps -1', { maxRps: -1 }, '--max-rps'],
    ['--log-level loud', { logLevel: 'loud' }, '--log-level'],
    ['--account-id abc', { accountId: 'abc' }, '--account-id'],
    ['--base-url not a url', { baseUrl: 'not a url' }, '--base-url'],
  ])('a malformed flag (%s) throws a ConfigError naming the flag', (_label, flags, flag) => {
    const err = configError({ ...BASE }, flags);
    expect(err.variable).toBe(flag);
    expect(err.message).toContain(flag);
  });

  it('never includes the API key value in an error message', () => {
    // A malformed key given as a flag (commander may coerce to a number): the value must not be echoed.
    const numeric = configError({ CONVO_MIRROR_BASE_URL: BASE.CONVO_MIRROR_BASE_URL }, { apiKey: 987654321 });
    expect(numeric.variable).toBe('--api-key');
    expect(numeric.message).not.toContain('987654321');
    expect(JSON.stringify(numeric)).not.toContain('987654321');
    // Errors about other variables while the key is set never mention it either.
    for (const env of [{ CONVO_MIRROR_BASE_URL: 'nope' }, { CONVO_MIRROR_CONCURRENCY: 'x' }, { CONVO_MIRROR_ACCOUNT_ID: 'abc' }]) {
      const err = configError({ ...BASE, ...env });
      expect(err.message).not.toContain(KEY);
      expect(JSON.stringify(err)).not.toContain(KEY);
    }
    // A key with surrounding whitespace only is rejected without echoing anything of it.
    const blank = configError({ ...BASE, CONVO_MIRROR_API_KEY: ' \t ' });
    expect(blank.message).not.toContain('got');
  });
});

describe('loadConfig options and result', () => {
  it('needsApi: false allows a missing URL and key', () => {
    const cfg = loadConfig({}, {}, { needsApi: false });
    expect(cfg.baseUrl).toBeUndefined();
    expect(cfg.apiKey).toBeUndefined();
    expect(cfg.db).toBe('data/mirror.sqlite');
  });

  it('needsApi: false still validates a URL that is given', () => {
    const err = configError({ CONVO_MIRROR_BASE_URL: 'not a url' }, {}, { needsApi: false });
    expect(err.variable).toBe('CONVO_MIRROR_BASE_URL');
  });

  it('the result is frozen', () => {
    const cfg = loadConfig({ ...BASE });
    expect(Object.isFrozen(cfg)).toBe(true);
    expect(() => {
      (cfg as { db: string }).db = 'elsewhere.sqlite';
    }).toThrow(TypeError);
    expect(cfg.db).toBe('data/mirror.sqlite');
  });

  it('does not read process.env', () => {
    const before = process.env['CONVO_MIRROR_BASE_URL'];
    process.env['CONVO_MIRROR_BASE_URL'] = 'https://from-process-env.example.com';
    try {
      const err = configError({ CONVO_MIRROR_API_KEY: KEY });
      expect(err.variable).toBe('CONVO_MIRROR_BASE_URL');
    } finally {
      if (before === undefined) delete process.env['CONVO_MIRROR_BASE_URL'];
      else process.env['CONVO_MIRROR_BASE_URL'] = before;
    }
  });
});

describe('loadConfig blank values', () => {
  it('refuses a blank flag or a whitespace-only env value instead of coercing it to 0 (no rate cap)', () => {
    expect(() => loadConfig({ ...BASE }, { maxRps: '' })).toThrowError(/--max-rps: must not be blank/);
    expect(() => loadConfig({ ...BASE, CONVO_MIRROR_MAX_RPS: ' ' })).toThrowError(/CONVO_MIRROR_MAX_RPS: must not be blank/);
    // An empty env value still means "unset", so the default applies.
    expect(loadConfig({ ...BASE, CONVO_MIRROR_MAX_RPS: '' }).maxRps).toBe(10);
  });
});

describe('daemon settings', () => {
  it('rejects an invalid cron, time zone or Redis URL, naming the variable', () => {
    expect(() => loadConfig({ ...BASE, CONVO_MIRROR_SCHEDULE: '61 * * * *' })).toThrowError(/CONVO_MIRROR_SCHEDULE: must be a cron expression/);
    expect(() => loadConfig({ ...BASE }, { fullSchedule: 'every day' })).toThrowError(/--full-schedule: must be a cron expression/);
    expect(() => loadConfig({ ...BASE, CONVO_MIRROR_TZ: 'Mars/Olympus' })).toThrowError(/CONVO_MIRROR_TZ: must be an IANA time zone/);
    expect(() => loadConfig({ ...BASE, REDIS_URL: 'http://localhost:6379' })).toThrowError(/REDIS_URL: must be a redis:\/\/ or rediss:\/\/ URL/);
    expect(() => loadConfig({ ...BASE, CONVO_MIRROR_QUEUE_PREFIX: 'a b' })).toThrowError(/CONVO_MIRROR_QUEUE_PREFIX/);
  });

  it('accepts a valid cron with a time zone', () => {
    const cfg = loadConfig({ ...BASE, CONVO_MIRROR_SCHEDULE: '* * * * *', CONVO_MIRROR_TZ: 'Europe/Paris', REDIS_URL: 'redis://:pw@10.0.0.1:6380/2' });
    expect([cfg.schedule, cfg.tz, cfg.redisUrl]).toEqual(['* * * * *', 'Europe/Paris', 'redis://:pw@10.0.0.1:6380/2']);
  });
});

describe('maskUserInfo', () => {
  it('masks everything up to the last @, and any query or fragment, parseable or not', () => {
    expect(maskUserInfo('https://bob:s3cr/etPW@api.example.com/x')).toBe('https://***@api.example.com/x');
    expect(maskUserInfo('https://bob:pa@ss@api.example.com')).toBe('https://***@api.example.com');
    expect(maskUserInfo('https://bob:pa#ss@api.example.com')).toBe('https://***@api.example.com');
    expect(maskUserInfo('bob:secret@api.example.com')).toBe('***@api.example.com');
    expect(maskUserInfo('https://api.example.com/v?token=secret')).toBe('https://api.example.com/v?***');
    expect(maskUserInfo('https://api.example.com/v#secret')).toBe('https://api.example.com/v#***');
    expect(maskUserInfo('https://api.example.com/api')).toBe('https://api.example.com/api');
  });
});


describe('daemon service settings', () => {
  const SECRET = `whsec_${Buffer.from('0123456789abcdef0123456789abcdef').toString('base64')}`;

  it('reads the scheduler, the webhook secret and pointers, and the admin password', () => {
    const cfg = loadConfig({
      ...BASE,
      CONVO_MIRROR_SCHEDULER: 'local',
      CONVO_MIRROR_WEBHOOK_SECRET: SECRET,
      CONVO_MIRROR_WEBHOOK_ID_POINTERS: '/event/ticket_id, /id',
      CONVO_MIRROR_ADMIN_PASSWORD: 'correct horse battery',
    });
    expect(cfg.scheduler).toBe('local');
    expect(cfg.webhookSecret).toBe(SECRET);
    expect(cfg.webhookIdPointers).toEqual(['/event/ticket_id', '/id']);
    expect(cfg.adminPassword).toBe('correct horse battery');
  });

  it('refuses a malformed secret, pointer, password or scheduler, naming the variable and never echoing a secret', () => {
    const badSecret = 'not-a-whsec-secret-value-1234';
    const e1 = configError({ ...BASE, CONVO_MIRROR_WEBHOOK_SECRET: badSecret });
    expect(e1.message).toContain('CONVO_MIRROR_WEBHOOK_SECRET');
    expect(e1.message).not.toContain(badSecret);
    const short = configError({ ...BASE, CONVO_MIRROR_WEBHOOK_SECRET: `whsec_${Buffer.from('short').toString('base64')}` });
    expect(short.message).toContain('CONVO_MIRROR_WEBHOOK_SECRET');
    const e2 = configError({ ...BASE, CONVO_MIRROR_WEBHOOK_ID_POINTERS: '/ok,conversation_id' });
    expect(e2.message).toMatch(/CONVO_MIRROR_WEBHOOK_ID_POINTERS.*item 2 must be a JSON pointer/);
    const e3 = configError({ ...BASE, CONVO_MIRROR_ADMIN_PASSWORD: 'hunter2' });
    expect(e3.message).toMatch(/CONVO_MIRROR_ADMIN_PASSWORD.*at least 12/);
    expect(e3.message).not.toContain('hunter2');
    const e4 = configError({ ...BASE, CONVO_MIRROR_SCHEDULER: 'cron' });
    expect(e4.message).toMatch(/CONVO_MIRROR_SCHEDULER.*bullmq.*local/);
  });
});
