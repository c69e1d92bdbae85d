/**
 * Command-line flags generated from the one configuration table (config/ `CONFIG_FIELDS`): each
 * command's options, their help text, and the parsed options → {@link ConfigFlags} mapping.
 */
import { Option, type Command } from 'commander';
import { CONFIG_FIELDS, type Config, type ConfigCommand, type ConfigFlags, type FieldDef } from '../../config/index.js';
import { ConfigError } from '../errors.js';

/**
 * Whether `command` takes the flag of the field `def`: the commands its table entry lists; `config`
 * takes every one (it shows them all), and `check` the daemon's too, so the command line of a
 * daemon is checked by writing `check --daemon` for `daemon`.
 */
export function takesField(command: ConfigCommand, def: Pick<FieldDef, 'commands'>): boolean {
  return command === 'config' || def.commands.includes(command) || (command === 'check' && def.commands.includes('daemon'));
}

/** The fields a command takes ({@link takesField}), in table (= help) order. */
function fieldsOf(command: ConfigCommand): [keyof Config, FieldDef][] {
  return (Object.entries(CONFIG_FIELDS) as [keyof Config, FieldDef][]).filter(([, def]) => takesField(command, def));
}

/** The default as help shows it: `shownDefault`, else the value (quoted when it holds a space); undefined = none. */
function shownDefault(def: FieldDef): string | undefined {
  if (def.shownDefault !== undefined) return def.shownDefault;
  if (def.defaultValue === undefined) return undefined;
  const v = String(def.defaultValue);
  return /\s/.test(v) ? JSON.stringify(v) : v;
}

/** Help text of a field's flag: `<help> (env <ENV>[, default <default>][; <note>])`. */
export function flagHelp(def: FieldDef): string {
  const dflt = shownDefault(def);
  return `${def.help} (env ${def.env}${dflt === undefined ? '' : `, default ${dflt}`}${def.helpNote ? `; ${def.helpNote}` : ''})`;
}

/** Adds the configuration flags `command` takes (see {@link CONFIG_FIELDS}) to `cmd`; returns `cmd`. */
export function addConfigFlags(cmd: Command, command: ConfigCommand): Command {
  for (const [, def] of fieldsOf(command)) cmd.addOption(new Option(def.flag, flagHelp(def)));
  return cmd;
}

/**
 * The configuration flags among commander's parsed options `o` of `command` (undefined = not
 * given), for {@link loadConfig}.
 */
export function configFlagsOf(o: Record<string, unknown>, command: ConfigCommand): ConfigFlags {
  const flags: ConfigFlags = {};
  for (const [key, def] of fieldsOf(command)) flags[key] = o[new Option(def.flag).attributeName()] as string | boolean | undefined;
  return flags;
}

/**
 * Conversation ids given on the command line: each must be non-empty and usable as one path
 * segment (`.` and `..` would be normalized out of `/v1/conversations/:id/messages`).
 *
 * @throws {@link ConfigError} naming `--conversation` and the id
 */
export function conversationIdsFrom(ids: string[] | undefined): string[] | undefined {
  if (ids === undefined) return undefined;
  for (const id of ids) {
    if (id.trim() === '') throw new ConfigError('--conversation', 'must not be empty');
    if (id === '.' || id === '..') throw new ConfigError('--conversation', `${JSON.stringify(id)} is not a conversation id`);
  }
  return ids;
}

/** Where the job queue lives, from the configuration. */
export const queueSettings = (config: Config): { redisUrl: string; prefix: string } => ({ redisUrl: config.redisUrl, prefix: config.queuePrefix });

/**
 * Commands that talk to the BullMQ queue in Redis (`enqueue`, `retry-failed`) have nothing to talk
 * to when the daemon runs its queue in-process.
 *
 * @throws {@link ConfigError} naming CONVO_MIRROR_SCHEDULER when it is `local`
 */
export function requireBullmq(config: Config, command: string): void {
  if (config.scheduler !== 'local') return;
  throw new ConfigError(
    'CONVO_MIRROR_SCHEDULER',
    `is local: ${command} needs the BullMQ scheduler (a queue in Redis). With the local scheduler the queue lives inside the daemon: trigger a conversation through its webhook route (POST /webhooks/conversations), or stop it and run convo-mirror sync --conversation ID`,
  );
}
