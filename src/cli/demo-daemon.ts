/**
 * `convo-mirror demo-daemon`: the daemon without Redis, end to end, against the fake API serving two
 * workspaces, in one process: the local scheduler mirrors both on its first ticks, then a
 * conversation gets new messages and a signed webhook (Standard Webhooks) asks for it, and the demo
 * reports how long it took to be mirrored, the key metrics as `/metrics` serves them, and stops the
 * daemon as SIGTERM would. With `--keep-running` the daemon goes on until Ctrl-C.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { loadConfig, type Config } from '../../config/index.js';
import { FakeWorkspace, startFakeApi, type FakeApi } from '../fake-api/index.js';
import { openMirror } from '../store/open-mirror.js';
import { createLogger } from '../logger.js';
import { DEMO_ACCOUNT_ID } from './demo.js';
import { EXIT, settle, type SetExit } from './exit.js';
import { ConfigError } from '../errors.js';

/** The second workspace of the demo (fixed, so re-runs match). */
export const DEMO_ACCOUNT_ID_2 = '5c9a3e71-2d4b-4f60-8e1a-7b3c5d9f0a24';

/** The demo's options, as commander parsed them. */
interface DemoDaemonOptions {
  dir: string;
  conversations: string;
  schedule: string;
  keepRunning?: boolean;
  logLevel?: string;
}

/** How long the demo waits for each step before it gives up, ms. */
const STEP_TIMEOUT_MS = 60_000;

/** Polls `pred` every 50 ms until it holds; false after `ms`. */
async function until(pred: () => boolean | Promise<boolean>, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}

/** Live messages of `account` in the mirror (read-only; 0 before the mirror exists). */
async function liveMessages(db: string, account: string): Promise<number> {
  if (!fs.existsSync(db)) return 0;
  const m = await openMirror(db, { readonly: true });
  try {
    return (await m.liveCounts(account)).messages;
  } finally {
    await m.close();
  }
}

/** The daemon's configuration: local scheduler, both workspaces, a generated webhook secret. */
function daemonConfig(o: DemoDaemonOptions, fake: FakeApi, apiKey: string, secret: string): Config {
  return loadConfig(
    {},
    {
      baseUrl: fake.url,
      apiKey,
      accountId: `${DEMO_ACCOUNT_ID},${DEMO_ACCOUNT_ID_2}`,
      db: path.join(o.dir, 'mirror.sqlite'),
      exportDir: path.join(o.dir, 'exports'),
      maxRps: '0',
      concurrency: '8',
      scheduler: 'local',
      schedule: o.schedule,
      webhookSecret: secret,
      logLevel: loadConfig(process.env, { logLevel: o.logLevel ?? 'warn' }, { needsApi: false }).logLevel,
    },
  );
}

/** Sends one signed webhook for `conversationId` of `account`; returns the HTTP status. */
async function sendWebhook(url: string, secret: string, account: string, conversationId: string): Promise<number> {
  const body = JSON.stringify({ type: 'conversation.updated', data: { account_id: account, conversation_id: conversationId } });
  const id = `msg_demo_${crypto.randomUUID()}`;
  const at = new Date();
  const res = await fetch(`${url}/webhooks/conversations`, {
    method: 'POST',
    body,
    headers: { 'content-type': 'application/json', 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new (await import('standardwebhooks')).Webhook(secret).sign(id, at, body) },
  });
  await res.body?.cancel();
  return res.status;
}

/** The demo's metric lines worth showing from a `/metrics` scrape. */
function keyMetrics(text: string): string[] {
  return text.split('\n').filter((l) => /^convo_mirror_(api_requests_total|messages_total\{.*op="insert"|last_success_timestamp_seconds|export_lag_changes|queue_jobs|runs_total)/.test(l));
}

/** Marks a directory as the demo's own, so that a later demo may start it over. */
const MARKER = '.convo-mirror-demo-daemon';

/**
 * Makes `dir` ready for a fresh demo: created (private) when missing; emptied when an earlier demo
 * made it (its marker file is there), since the fake starts from the same seed every time and an
 * earlier webhook's messages would no longer be served. Any other non-empty directory is refused.
 *
 * @throws {@link ConfigError} naming `--dir` for a non-empty directory the demo did not create
 */
function freshDemoDir(dir: string): void {
  if (fs.existsSync(dir) && fs.readdirSync(dir).length > 0) {
    if (!fs.existsSync(path.join(dir, MARKER))) throw new ConfigError('--dir', `${dir} is not empty and was not made by demo-daemon: choose another directory`);
    fs.rmSync(dir, { recursive: true });
  }
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  fs.chmodSync(dir, 0o700);
  fs.writeFileSync(path.join(dir, MARKER), 'made by convo-mirror demo-daemon; the next demo-daemon run starts this directory over\n', { mode: 0o600 });
}

/** Runs the demo; returns the exit code (0 when every step happened and the daemon stopped cleanly). */
async function demoDaemon(o: DemoDaemonOptions): Promise<number> {
  freshDemoDir(o.dir);
  const apiKey = crypto.randomBytes(16).toString('hex');
  const secret = `whsec_${crypto.randomBytes(32).toString('base64')}`;
  const n = Number(o.conversations);
  const ws = [FakeWorkspace.generate({ seed: 42, conversations: n }), FakeWorkspace.generate({ seed: 43, conversations: n })];
  const accounts = [DEMO_ACCOUNT_ID, DEMO_ACCOUNT_ID_2];
  const fake = await startFakeApi({ workspaces: Object.fromEntries(accounts.map((a, i) => [a, { workspace: ws[i]!, apiKey }])) });
  let release!: () => void;
  const stop = new Promise<void>((r) => (release = r));
  const out = (s: string) => process.stdout.write(`${s}\n`);
  try {
    const config = daemonConfig(o, fake, apiKey, secret);
    const logger = createLogger({ level: config.logLevel, pretty: false });
    let httpUrl = '';
    let onReady!: () => void;
    const started = new Promise<void>((r) => (onReady = r));
    const { runDaemon } = await import('../../jobs/daemon.js'); // the daemon's libraries load only here
    const done = runDaemon({ config, logger, stop, httpListen: { host: '127.0.0.1', port: 0 }, onReady: (x) => ((httpUrl = x.httpUrl ?? ''), onReady()) });
    await Promise.race([started, done]);
    out(`demo-daemon: fake API on ${fake.url} (2 workspaces, ${ws.map((w) => w.totals().messages).join(' + ')} messages); daemon --scheduler local --schedule '${o.schedule}', HTTP on ${httpUrl}`);
    const t0 = Date.now();
    const mirrored = await until(async () => {
      for (const [i, a] of accounts.entries()) if ((await liveMessages(config.db, a)) !== ws[i]!.totals().messages) return false;
      return true;
    }, STEP_TIMEOUT_MS);
    out(mirrored ? `  both workspaces mirrored by the scheduled runs, ${((Date.now() - t0) / 1000).toFixed(1)} s after start` : '  the scheduled runs did not mirror both workspaces in time');
    const conv = ws[1]!.list()[0]!.id;
    ws[1]!.appendMessages(conv, 3);
    const t1 = Date.now();
    const status = await sendWebhook(httpUrl, secret, DEMO_ACCOUNT_ID_2, conv);
    // Only that conversation changed: the workspace's total tells when its new messages are in.
    const hooked = await until(async () => (await liveMessages(config.db, DEMO_ACCOUNT_ID_2)) === ws[1]!.totals().messages, STEP_TIMEOUT_MS);
    out(`  webhook for conversation ${conv}: HTTP ${status}; its 3 new messages ${hooked ? `mirrored ${Date.now() - t1} ms after the webhook was sent` : 'NOT mirrored in time'}`);
    const metrics = await (await fetch(`${httpUrl}/metrics`)).text();
    out(`  ${httpUrl}/metrics (excerpt):\n${keyMetrics(metrics).map((l) => `    ${l}`).join('\n')}`);
    if (o.keepRunning) {
      out(`  the daemon keeps running (Ctrl-C stops it); mirror ${config.db}`);
      await new Promise<void>((r) => process.once('SIGINT', () => r()));
    }
    release();
    const exit = await done;
    out(`  daemon stopped in ${exit.shutdownMs} ms${exit.forced ? ' (running jobs cut short)' : ''}; mirror ${config.db}, exports ${config.exportDir}`);
    return mirrored && hooked && status === 202 && !exit.fatal ? EXIT.OK : EXIT.FAILURES;
  } finally {
    release();
    await fake.close();
  }
}

/** Adds `demo-daemon` to `program`. */
export function addDemoDaemonCommand(program: Command, setExit: SetExit): void {
  program
    .command('demo-daemon')
    .description('The daemon without Redis against the fake API (two workspaces): scheduled runs, a signed webhook, /metrics, a clean stop')
    .addOption(new Option('--dir <dir>', 'where the demo mirror and exports go (started over at each run)').default('data/demo-daemon'))
    .addOption(new Option('--conversations <n>', 'conversations per workspace').default('40'))
    .addOption(new Option('--schedule <cron>', 'cron of the regular sync (seconds first)').default('*/5 * * * * *'))
    .option('--keep-running', 'keep the daemon running after the demo steps, until Ctrl-C')
    .option('--log-level <level>', 'log level (env LOG_LEVEL, default warn)')
    .action((o: DemoDaemonOptions) => settle(setExit, () => demoDaemon(o)));
}
