/**
 * `convo-mirror demo`: starts the fake API in-process, syncs it into data/demo/, and prints a
 * summary checked against the fake.
 */
import crypto from 'node:crypto';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { loadConfig, type Config } from '../../config/index.js';
import { FakeWorkspace, startFakeApi } from '../fake-api/index.js';
import { openMirror } from '../store/open-mirror.js';
import { EXIT, settle, type SetExit } from './exit.js';
import { syncWithConfig } from './sync.js';
import { printSummary, reportFailures } from './summary.js';

/** Account id the demo's fake workspace requires in `X-Account-Id` (fixed, so re-runs match). */
export const DEMO_ACCOUNT_ID = '0b7e6d52-4c1f-4e8a-9d3b-5a2f1c8e7d60';

/** The demo's options, as commander parsed them. */
interface DemoOptions {
  dir: string;
  seed: string;
  conversations: string;
  concurrency: string;
  maxRps: string;
  logLevel?: string;
}

/**
 * The demo's configuration: the fake's URL and key, the mirror and exports under `--dir`; from the
 * environment only the log level and how the archive is published (`CONVO_MIRROR_EXPORT_GZIP`,
 * `CONVO_MIRROR_SIGNING_KEY_FILE`, `CONVO_MIRROR_PUBLISH_INTERVAL_MS`, `CONVO_MIRROR_PUBLISH_LINES`,
 * `CONVO_MIRROR_RETENTION`, `CONVO_MIRROR_PRUNE_MIRROR`).
 */
function demoConfig(o: DemoOptions, url: string, apiKey: string): Config {
  const env = loadConfig(process.env, { logLevel: o.logLevel }, { needsApi: false });
  return loadConfig(
    {},
    {
      exportGzip: env.exportGzip,
      publishIntervalMs: env.publishIntervalMs,
      publishLines: env.publishLines,
      ...(env.signingKeyFile === undefined ? {} : { signingKeyFile: env.signingKeyFile }),
      ...(env.retention === undefined ? {} : { retention: env.retention.text }),
      pruneMirror: env.pruneMirror,
      baseUrl: url,
      apiKey,
      accountId: DEMO_ACCOUNT_ID,
      db: path.join(o.dir, 'mirror.sqlite'),
      exportDir: path.join(o.dir, 'exports'),
      concurrency: o.concurrency,
      maxRps: o.maxRps,
      logLevel: env.logLevel,
    },
  );
}

/** Live conversations and messages of the demo account in the mirror at `db`. */
async function mirroredCounts(db: string): Promise<{ conversations: number; messages: number }> {
  const mirror = await openMirror(db, { readonly: true });
  try {
    return await mirror.liveCounts(DEMO_ACCOUNT_ID);
  } finally {
    await mirror.close();
  }
}

/** Runs the demo; returns the exit code (0 when the sync succeeded and the mirror equals the fake). */
async function demo(o: DemoOptions): Promise<number> {
  const workspace = FakeWorkspace.generate({ seed: Number(o.seed), conversations: Number(o.conversations) });
  const apiKey = crypto.randomBytes(16).toString('hex');
  const fake = await startFakeApi({ workspace, apiKey, accountId: DEMO_ACCOUNT_ID });
  try {
    const config = demoConfig(o, fake.url, apiKey);
    const t = workspace.totals();
    process.stdout.write(`demo: fake API on ${fake.url} serving ${t.conversations} conversations and ${t.messages} messages\n`);
    const s = await syncWithConfig({ config });
    printSummary(s, false);
    reportFailures(s);
    const live = await mirroredCounts(config.db);
    const equal = live.conversations === t.conversations && live.messages === t.messages;
    process.stdout.write(
      `\n  fake:   ${t.conversations} conversations, ${t.messages} messages\n` +
        `  mirror: ${live.conversations} conversations, ${live.messages} messages  ${equal ? '(equal)' : '(MISMATCH)'}\n` +
        `  mirror file: ${config.db}   exports: ${config.exportDir}\n` +
        `  try: sqlite3 ${config.db} 'select count(*) from messages'\n` +
        `  prove the archive: npx convo-mirror verify --db ${config.db} --export-dir ${config.exportDir} --deep\n`,
    );
    return equal && s.status === 'succeeded' ? EXIT.OK : EXIT.FAILURES;
  } finally {
    await fake.close();
  }
}

/** Adds `demo` to `program`. */
export function addDemoCommand(program: Command, setExit: SetExit): void {
  program
    .command('demo')
    .description('Start the fake API in-process, sync it into data/demo/, and print a summary checked against the fake')
    .addOption(new Option('--dir <dir>', 'where the demo mirror and exports go').default('data/demo'))
    .addOption(new Option('--seed <n>', 'random seed of the workspace').default('42'))
    .addOption(new Option('--conversations <n>', 'conversations to generate').default('320'))
    .addOption(new Option('--concurrency <n>', 'conversations in flight').default('8'))
    .addOption(new Option('--max-rps <n>', 'request cap (the fake is local, so none by default)').default('0'))
    .option('--log-level <level>', 'log level (env LOG_LEVEL, default info)')
    .action((o: DemoOptions) => settle(setExit, () => demo(o)));
}
