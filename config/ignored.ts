/**
 * Settings given (by flag, environment or `.env`) whose value nothing reads in the configuration
 * chosen: the admin password with the local scheduler, a webhook secret without an HTTP server...
 * `daemon` logs each once at warn, `check` prints each once on stderr, `config` shows it in its
 * listing. Only where the value is truly ignored by every command that could use it; never a value.
 */
import { CONFIG_FIELDS, flagName, settingReport, workspaceKeyVariables, type ConfigFlags, type FieldKey, type SettingReport } from './index.js';

/** A setting given but ignored, and why. */
export interface IgnoredSetting {
  key: FieldKey;
  /** The flag or variable that gave it, e.g. `CONVO_MIRROR_ADMIN_PASSWORD` or `--admin-password`. */
  name: string;
  /** Why it is ignored, naming the setting that makes it so, e.g. `with CONVO_MIRROR_SCHEDULER=local there is no queue dashboard, which needs the bullmq scheduler`. */
  reason: string;
}

/**
 * The rules: a setting, whether it is ignored given the others' reports, and why. `said(key, value)`
 * names the setting that decides, as the user gave it (`--scheduler local`, `CONVO_MIRROR_SCHEDULER=local`).
 */
type Rule = {
  key: FieldKey;
  ignored: (get: (key: FieldKey) => SettingReport, said: (key: FieldKey, shown: string) => string, keyVariables: () => readonly string[] | undefined) => string | undefined;
};

const nameOfFile = (get: (key: FieldKey) => SettingReport): string => (get('workspacesFile').source === 'flag' ? flagName(CONFIG_FIELDS.workspacesFile) : CONFIG_FIELDS.workspacesFile.env);
const local = (get: (key: FieldKey) => SettingReport) => get('scheduler').value === 'local';
const noServer = (get: (key: FieldKey) => SettingReport) => get('httpPort').value === 0;

const RULES: readonly Rule[] = [
  {
    key: 'adminPassword',
    ignored: (get, said) =>
      local(get)
        ? `with ${said('scheduler', 'local')} there is no queue dashboard, which needs the bullmq scheduler`
        : noServer(get)
          ? `with ${said('httpPort', '0')} there is no HTTP server, so no queue dashboard`
          : undefined,
  },
  // REDIS_URL and CONVO_MIRROR_QUEUE_PREFIX are not here: status reads the queue in Redis whatever the scheduler.
  { key: 'jobLockMs', ignored: (get, said) => (local(get) ? `with ${said('scheduler', 'local')} jobs take no lock (the lock is BullMQ's, in Redis)` : undefined) },
  { key: 'webhookSecret', ignored: (get, said) => (noServer(get) ? `with ${said('httpPort', '0')} there is no HTTP server, so no webhook route` : undefined) },
  {
    key: 'webhookIdPointers',
    ignored: (get, said) =>
      noServer(get)
        ? `with ${said('httpPort', '0')} there is no HTTP server, so no webhook route`
        : get('webhookSecret').source === 'unset'
          ? `the webhook route exists only with ${CONFIG_FIELDS.webhookSecret.env}, which is not set`
          : undefined,
  },
  { key: 'httpHost', ignored: (get, said) => (noServer(get) ? `with ${said('httpPort', '0')} there is no HTTP server` : undefined) },
  {
    // A workspaces file names the variable holding each workspace's key (api_key_env).
    key: 'apiKey',
    ignored: (get, _said, keyVariables) => {
      const names = keyVariables();
      if (names === undefined || names.includes(CONFIG_FIELDS.apiKey.env)) return undefined;
      return `with a workspaces file (${nameOfFile(get)}) each workspace's key comes from the variable its api_key_env names`;
    },
  },
  {
    // Given in different places, the command line wins (config/index.ts resolveWorkspaces).
    key: 'accountId',
    ignored: (get) => (get('workspacesFile').source === 'flag' && get('accountId').source !== 'flag' ? `${flagName(CONFIG_FIELDS.workspacesFile)} gives the workspaces` : undefined),
  },
  {
    key: 'workspacesFile',
    ignored: (get) => (get('accountId').source === 'flag' && get('workspacesFile').source !== 'flag' ? `${flagName(CONFIG_FIELDS.accountId)} gives the workspaces` : undefined),
  },
];

/**
 * The settings given (flag, environment or `.env`) that the configuration `env` + `flags` ignores,
 * in rule order, at most one entry per setting. Never throws: a malformed setting is not judged
 * (loading the configuration names it), and a workspaces file that cannot be read is left to
 * the commands that read it. Never shows a value, except the deciding `--scheduler local` or
 * `CONVO_MIRROR_HTTP_PORT=0` and the workspaces file's path.
 *
 * @param fromEnvFile - the variables `env` took from `.env` (config/env-file.ts `envFileNames`)
 */
export function ignoredSettings(env: NodeJS.ProcessEnv, flags: ConfigFlags, fromEnvFile: ReadonlySet<string> = new Set()): IgnoredSetting[] {
  const reports = new Map<FieldKey, SettingReport>();
  const get = (key: FieldKey): SettingReport => {
    let r = reports.get(key);
    if (r === undefined) reports.set(key, (r = settingReport(key, env, flags, fromEnvFile)));
    return r;
  };
  const nameOf = (key: FieldKey): string => (get(key).source === 'flag' ? flagName(CONFIG_FIELDS[key]) : CONFIG_FIELDS[key].env);
  const said = (key: FieldKey, shown: string): string => (get(key).source === 'flag' ? `${flagName(CONFIG_FIELDS[key])} ${shown}` : `${CONFIG_FIELDS[key].env}=${shown}`);
  let keyVariables: readonly string[] | undefined | null = null;
  const keyVariablesOnce = (): readonly string[] | undefined => {
    if (keyVariables !== null) return keyVariables;
    const file = get('workspacesFile');
    keyVariables = undefined;
    if (file.source !== 'unset' && file.error === undefined && get('workspacesFile').value !== undefined) {
      try {
        keyVariables = workspaceKeyVariables(String(file.value), nameOf('workspacesFile'));
      } catch {
        // The command that reads the file says what is wrong with it.
      }
    }
    return keyVariables;
  };
  const out: IgnoredSetting[] = [];
  for (const rule of RULES) {
    const r = get(rule.key);
    if (r.source === 'unset' || r.source === 'default' || r.error !== undefined) continue;
    const reason = rule.ignored(get, said, keyVariablesOnce);
    if (reason !== undefined) out.push({ key: rule.key, name: nameOf(rule.key), reason });
  }
  return out;
}

/** One line (without `convo-mirror: warning: `): `CONVO_MIRROR_ADMIN_PASSWORD is set but ignored: with ...`. */
export function ignoredWarning(s: IgnoredSetting): string {
  return `${s.name} is set but ignored: ${s.reason}`;
}
