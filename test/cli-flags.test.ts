/**
 * The CLI's configuration flags come from the one table (config/ `CONFIG_FIELDS`): every field shows
 * in the help of each command that takes it, with its env name and default, and nowhere else; flags
 * parsed by the real program land in the configuration. In-process: the program is built and
 * parsed with each command's action swapped for one that only records its options.
 */
import fs from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Command } from 'commander';
import { CONFIG_FIELDS, loadConfig, type Config, type ConfigCommand, type FieldDef } from '../config/index.js';
import { buildProgram, EXIT } from '../src/cli/index.js';
import { configFlagsOf, flagHelp, takesField } from '../src/cli/flags.js';
import { ROOT, assertBuilt, run } from './children.js';

const COMMANDS: readonly ConfigCommand[] = ['check', 'conversations', 'sync', 'status', 'verify', 'erase', 'daemon', 'enqueue', 'retry-failed'];
const FIELDS = Object.entries(CONFIG_FIELDS) as [keyof Config, FieldDef][];

function commandOf(program: Command, name: string): Command {
  const cmd = program.commands.find((c) => c.name() === name);
  if (!cmd) throw new Error(`no command ${name}`);
  return cmd;
}

/** The command's help with line wrapping undone (one space between words). */
function helpOf(name: string): string {
  return commandOf(buildProgram(() => {}), name).helpInformation().replace(/\s+/g, ' ');
}

/**
 * Parses `convo-mirror <command> ...args` with the real program, its action replaced by one that
 * keeps the options; returns the configuration they give (no env).
 */
async function configFrom(command: ConfigCommand, args: string[]): Promise<Config> {
  const codes: number[] = [];
  const program = buildProgram((c) => codes.push(c));
  let opts: Record<string, unknown> | undefined;
  commandOf(program, command).action((o: Record<string, unknown>) => {
    opts = o;
  });
  await program.parseAsync(['node', 'convo-mirror', command, ...args]);
  expect(codes).toEqual([]);
  if (!opts) throw new Error(`${command}: the action did not run`);
  return loadConfig({}, configFlagsOf(opts, command), { needsApi: false });
}

describe('configuration flags in help', () => {
  it.each(COMMANDS)('%s: every field it takes is listed with its flag, help, env name and default; no other field is', (name) => {
    const help = helpOf(name);
    const cmd = commandOf(buildProgram(() => {}), name);
    for (const [key, def] of FIELDS) {
      const long = def.flag.split(' ')[0]!;
      const option = cmd.options.find((o) => o.long === long);
      if (takesField(name, def)) {
        expect(help, `${name} --help lacks ${key}`).toContain(`${def.flag} ${flagHelp(def)}`);
        expect(option?.description).toMatch(new RegExp(`\\(env ${def.env}(, default [^)]+)?(; [^)]+)?\\)$`));
        if (def.defaultValue !== undefined) expect(option?.description).toContain(', default ');
      } else {
        expect(option, `${name} takes ${long}, which its table entry does not list`).toBeUndefined();
      }
    }
  });

  it("check takes the daemon's flags (check --daemon is run with the daemon's command line) and --daemon itself", () => {
    const help = helpOf('check');
    for (const def of Object.values(CONFIG_FIELDS).filter((d) => d.commands.includes('daemon'))) expect(help).toContain(`${def.flag} ${flagHelp(def)}`);
    expect(help).toContain('--daemon also check what the daemon needs');
    expect(help).toContain('--http-port <port>');
  });

  it('shows the defaults as before: quoted crons, the response cap in MiB, no default for the URL', () => {
    expect(helpOf('daemon')).toContain('--schedule <cron> regular sync (env CONVO_MIRROR_SCHEDULE, default "*/15 * * * *")');
    expect(helpOf('sync')).toContain('(env CONVO_MIRROR_MAX_RESPONSE_BYTES, default 33554432 = 32 MiB)');
    expect(helpOf('sync')).toContain("--base-url <url> API base URL, the spec's {base_url} (env CONVO_MIRROR_BASE_URL)");
    expect(helpOf('sync')).toContain('(env CONVO_MIRROR_API_KEY; prefer the env: flags show in ps)');
  });
});

describe('configuration flags parse into the configuration', () => {
  it('sync: --max-rps, --concurrency, --request-timeout, --group-readable, --db', async () => {
    const config = await configFrom('sync', ['--max-rps', '3', '--concurrency', '7', '--request-timeout', '1500', '--group-readable', '--db', 'x.sqlite']);
    expect([config.maxRps, config.concurrency, config.requestTimeoutMs, config.groupReadable, config.db]).toEqual([3, 7, 1500, true, 'x.sqlite']);
    // Not given: the defaults.
    expect([config.maxRetries, config.exportDir]).toEqual([6, 'data/exports']);
  });

  it('daemon: the schedule flags and the queue flags', async () => {
    const config = await configFrom('daemon', ['--schedule', '* * * * *', '--tz', 'Europe/Paris', '--job-lock', '5000', '--queue-prefix', 'p1', '--job-attempts', '2']);
    expect([config.schedule, config.tz, config.jobLockMs, config.queuePrefix, config.jobAttempts]).toEqual(['* * * * *', 'Europe/Paris', 5000, 'p1', 2]);
  });

  it('a flag a command does not take is a usage error (exit 2), before any action runs', async () => {
    const program = buildProgram(() => {});
    let ran = false;
    commandOf(program, 'verify')
      .configureOutput({ writeErr: () => {}, writeOut: () => {} })
      .action(() => {
        ran = true;
      });
    const err = await program.parseAsync(['node', 'convo-mirror', 'verify', '--max-rps', '3']).then(
      () => undefined,
      (e: unknown) => e as { exitCode?: number; code?: string },
    );
    expect(err?.code).toBe('commander.unknownOption');
    expect(err?.exitCode).toBe(EXIT.CONFIG);
    expect(ran).toBe(false);
  });
});

describe('the command line as a user meets it (the built CLI)', () => {
  beforeAll(assertBuilt);
  const env = { PATH: process.env.PATH, HOME: process.env.HOME };

  it('--version and -V print the version of package.json, exit 0', async () => {
    const { version } = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
    for (const flag of ['--version', '-V']) {
      const r = await run([flag], env);
      expect([r.code, r.stdout, r.stderr]).toEqual([0, `${version}\n`, '']);
    }
  });

  it('an unknown command or flag answers in at most three lines (the error, the nearest match, where help is), exit 2', async () => {
    for (const args of [['snyc'], ['sync', '--fulll'], ['check', '--no-queeu']]) {
      const r = await run(args, env);
      expect(r.code, args.join(' ')).toBe(2);
      const lines = r.stderr.trimEnd().split('\n');
      expect(lines.length, r.stderr).toBeLessThanOrEqual(3);
      expect(lines[0]).toMatch(/^error: unknown (command|option) '/);
      expect(r.stderr).toMatch(/Did you mean (sync|--full|--no-queue)\?/);
      expect(lines.at(-1)).toContain('--help');
      expect(r.stdout).toBe('');
    }
  });
});
