#!/usr/bin/env node
/**
 * Completes package-lock.json with rollup's per-platform optional packages.
 *
 * Some registries serve only a few of rollup's platform builds (e.g. linux x64/arm64 gnu). npm then
 * leaves the others out of the lock, and `npm ci` refuses the lock as out of sync. This adds an
 * entry (version, os, cpu, libc; optional) for each missing one: npm skips them on other platforms
 * and never downloads them. Run it after any `npm install` that rewrote the lock:
 *
 *   node scripts/complete-lockfile.mjs
 */
import fs from 'node:fs';

const file = new URL('../package-lock.json', import.meta.url);
const lock = JSON.parse(fs.readFileSync(file, 'utf8'));
const pk = lock.packages;
const rollup = pk['node_modules/rollup'];
const added = [];
for (const [name, version] of Object.entries(rollup?.optionalDependencies ?? {})) {
  const key = `node_modules/${name}`;
  if (pk[key]) continue;
  const [os, cpu, abi] = name.replace('@rollup/rollup-', '').split('-'); // e.g. linux-arm64-musl, win32-x64-msvc
  const entry = { version, cpu: [cpu], dev: true, license: 'MIT', optional: true, os: [os] };
  if (os === 'linux' && abi) entry.libc = [abi.startsWith('musl') ? 'musl' : 'glibc'];
  pk[key] = entry;
  added.push(name);
}
lock.packages = Object.fromEntries(Object.entries(pk).sort(([a], [b]) => (a === '' ? -1 : b === '' ? 1 : a.localeCompare(b))));
fs.writeFileSync(file, JSON.stringify(lock, null, 2) + '\n');
console.log(added.length ? `package-lock.json: added ${added.length} rollup platform entries` : 'package-lock.json: complete');
