/**
 * `convo-mirror fake-api`: the fake support API (a seeded workspace) on 127.0.0.1, for trying
 * convo-mirror out, until SIGINT/SIGTERM.
 */
import { Option, type Command } from 'commander';
import { loadConfig, type Config } from '../../config/index.js';
import { FakeWorkspace, startFakeApi } from '../fake-api/index.js';
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

/** Serves the fake until a signal; returns the exit code. */
async function serve(o: Record<string, string | boolean | undefined>, rateLimit: { rps: number; headers: boolean } | undefined, apiKey: string, accountId: string | undefined): Promise<number> {
  const workspace = FakeWorkspace.generate({ seed: Number(o.seed), conversations: Number(o.conversations) });
  const fake = await startFakeApi({ workspace, apiKey, ...(accountId ? { accountId } : {}), ...(rateLimit ? { rateLimit } : {}), host: String(o.host), port: Number(o.port) });
  const t = workspace.totals();
  process.stdout.write(
    `fake API listening on ${fake.url} (${t.conversations} conversations, ${t.messages} messages` +
      `${rateLimit ? `, limited to ${rateLimit.rps} requests/s${rateLimit.headers ? '' : ' without RateLimit headers'}` : ''})\n` +
      `  export CONVO_MIRROR_BASE_URL=${fake.url}  # and CONVO_MIRROR_API_KEY to the key it accepts\n`,
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
    .option('--api-key <key>', 'key the fake accepts (default: env CONVO_MIRROR_API_KEY, else "demo-key")')
    .option('--account-id <uuid>', 'require this X-Account-Id (default: env CONVO_MIRROR_ACCOUNT_ID, else none)')
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
      setExit(await serve(o, rateLimit, config.apiKey ?? 'demo-key', config.accountId));
    });
}
