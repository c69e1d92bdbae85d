/**
 * `convo-mirror fake-api`: the fake support API (a seeded workspace) on 127.0.0.1, for trying
 * convo-mirror out, until SIGINT/SIGTERM.
 */
import { Option, type Command } from 'commander';
import { loadConfig, type Config } from '../../config/index.js';
import { FakeWorkspace, mulberry32, randUuidV4, startFakeApi } from '../fake-api/index.js';
import { EXIT, exitFor, type SetExit } from './exit.js';

/** `--rate-limit` (and `--no-rate-limit-headers`); undefined = no limit. @throws a message when not a number >= 1 */
function rateLimitFrom(o: { rateLimit?: string; rateLimitHeaders?: boolean }): { rps: number; headers: boolean } | undefined {
  if (o.rateLimit === undefined) return undefined;
  const rps = Number(o.rateLimit);
  if (!(Number.isFinite(rps) && rps >= 1)) throw new Error(`--rate-limit: must be a number of requests per second >= 1, got ${JSON.stringify(o.rateLimit)}`);
  return { rps, headers: o.rateLimitHeaders !== false };
}

/** Resolves on the first SIGINT or SIGTERM. */
const untilSignal = (): Promise<void> =>
  new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });

/** The serving options of `fake-api`, as commander parsed them. */
type FakeApiCommandOptions = Record<string, string | boolean | undefined>;

/**
 * The account ids to serve: the configured ones (`--account-id`, a list, or a workspaces file),
 * else `--accounts N` generated ones (seeded, so a restart serves the same), else none (one
 * workspace, header ignored).
 * @throws Error naming `--accounts` when it is not a whole number 1..100, or disagrees with the configured ids
 */
function accountIdsFrom(o: FakeApiCommandOptions, config: Config): (string | undefined)[] {
  const configured = config.workspaces.map((w) => w.accountId);
  if (o.accounts === undefined) return configured;
  const n = Number(o.accounts);
  if (!(Number.isInteger(n) && n >= 1 && n <= 100)) throw new Error(`--accounts: must be a whole number from 1 to 100, got ${JSON.stringify(o.accounts)}`);
  if (configured[0] !== undefined) {
    if (configured.length !== n) throw new Error(`--accounts: ${n} does not match the ${configured.length} account ids configured`);
    return configured;
  }
  if (n === 1) return [undefined];
  const rng = mulberry32(Number(o.seed) ^ 0x5eed);
  return Array.from({ length: n }, () => randUuidV4(rng));
}

/** The key the standalone fake accepts when none is configured: the fake's own, not a secret. */
export const DEFAULT_FAKE_KEY = 'demo-key';

/**
 * The end of the start-up `export` line that says which key the fake accepts. The fake's own
 * default key is printed, so a newcomer can copy the line; a key that came from the configuration
 * (`--api-key`, `CONVO_MIRROR_API_KEY`, a workspaces file's key variables) may be a real one, so
 * only where it came from is named, never its value.
 */
function keyHint(config: Config): string {
  if (config.workspacesFile !== undefined) return '  # it accepts each workspace\'s key, from the api_key_env variables of CONVO_MIRROR_WORKSPACES';
  if (config.apiKey !== undefined) return '  # it accepts the key you gave it (--api-key or CONVO_MIRROR_API_KEY; not printed)';
  return ` CONVO_MIRROR_API_KEY=${DEFAULT_FAKE_KEY}  # the key this fake accepts: a fixed demo value, not a secret`;
}

/** Serves the fake until a signal; returns the exit code. */
async function serve(o: FakeApiCommandOptions, rateLimit: { rps: number; headers: boolean } | undefined, config: Config, accountIds: (string | undefined)[]): Promise<number> {
  const generate = (i: number) => FakeWorkspace.generate({ seed: Number(o.seed) + i, conversations: Number(o.conversations) });
  const common = { ...(rateLimit ? { rateLimit } : {}), host: String(o.host), port: Number(o.port) };
  const keyOf = (i: number) => config.workspaces[i]?.apiKey ?? config.apiKey ?? DEFAULT_FAKE_KEY;
  const several = accountIds.length > 1;
  const workspaces = accountIds.map((_, i) => generate(i));
  const fake = several
    ? await startFakeApi({ workspaces: Object.fromEntries(accountIds.map((id, i) => [id!, { workspace: workspaces[i]!, apiKey: keyOf(i) }])), ...common })
    : await startFakeApi({ workspace: workspaces[0]!, apiKey: keyOf(0), ...(accountIds[0] ? { accountId: accountIds[0] } : {}), ...common });
  const totals = workspaces.map((w) => w.totals());
  const sum = (k: 'conversations' | 'messages') => totals.reduce((a, t) => a + t[k], 0);
  process.stdout.write(
    `fake API listening on ${fake.url} (${several ? `${accountIds.length} workspaces, ` : ''}${sum('conversations')} conversations, ${sum('messages')} messages` +
      `${rateLimit ? `, limited to ${rateLimit.rps} requests/s${rateLimit.headers ? '' : ' without RateLimit headers'}` : ''})\n` +
      (several ? accountIds.map((id, i) => `  workspace ${id}: ${totals[i]!.conversations} conversations, ${totals[i]!.messages} messages\n`).join('') : '') +
      `  export CONVO_MIRROR_BASE_URL=${fake.url}` +
      (several && config.workspacesFile === undefined ? ` CONVO_MIRROR_ACCOUNT_ID=${accountIds.join(',')}` : '') +
      keyHint(config) +
      '\n',
  );
  await untilSignal();
  await fake.close();
  return EXIT.OK;
}

/** Adds `fake-api` to `program`. */
export function addFakeApiCommand(program: Command, setExit: SetExit): void {
  program
    .command('fake-api')
    .description('Run the fake support API (seeded workspace) on 127.0.0.1, for trying convo-mirror out')
    .addOption(new Option('--port <n>', 'port').default('4010'))
    .addOption(new Option('--host <host>', 'address to listen on').default('127.0.0.1'))
    .addOption(new Option('--seed <n>', 'random seed of the workspace').default('42'))
    .addOption(new Option('--conversations <n>', 'conversations to generate').default('320'))
    .option('--api-key <key>', 'key the fake accepts (default: env CONVO_MIRROR_API_KEY, else "demo-key", which it prints)')
    .option('--account-id <uuid>', 'require this X-Account-Id; a comma-separated list serves one workspace per id (default: env CONVO_MIRROR_ACCOUNT_ID, or the account ids of CONVO_MIRROR_WORKSPACES with their keys, else none)')
    .option('--accounts <n>', 'serve n workspaces (seeds seed, seed+1, ...), with generated account ids printed at start (default: one per configured account id, else 1)')
    .option('--rate-limit <rps>', 'answer 429 (Retry-After, RateLimit-* headers) above this many requests per sliding second (default: no limit)')
    .option('--no-rate-limit-headers', 'with --rate-limit, serve no RateLimit-* headers (clients learn from 429s alone)')
    .action(async (o) => {
      let rateLimit: { rps: number; headers: boolean } | undefined;
      try {
        rateLimit = rateLimitFrom(o);
      } catch (err) {
        process.stderr.write(`${(err as Error).message}\n`);
        setExit(EXIT.CONFIG);
        return;
      }
      let config: Config;
      try {
        config = loadConfig(process.env, { apiKey: o.apiKey, accountId: o.accountId }, { needsApi: false });
      } catch (err) {
        setExit(exitFor(err));
        return;
      }
      let accountIds: (string | undefined)[];
      try {
        accountIds = accountIdsFrom(o, config);
      } catch (err) {
        process.stderr.write(`${(err as Error).message}\n`);
        setExit(EXIT.CONFIG);
        return;
      }
      setExit(await serve(o, rateLimit, config, accountIds));
    });
}
