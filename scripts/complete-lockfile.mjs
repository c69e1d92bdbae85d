#!/usr/bin/env node
/**
 * Completes package-lock.json with per-platform optional packages the registry did not serve.
 *
 * Some registries serve only a few of a package's platform builds (rollup's, msgpackr-extract's:
 * just linux x64/arm64 gnu, say). npm then leaves the others out of the lock, and `npm ci` refuses
 * the lock as out of sync. For every optional dependency that is missing from the lock and whose
 * name names a platform (os and cpu), this adds an entry (version, os, cpu, libc; optional): npm
 * skips such entries on other platforms and never downloads them. Run it after any `npm install`
 * that rewrote the lock:
 *
 *   node scripts/complete-lockfile.mjs
 */
import fs from 'node:fs';

const OSES = ['android', 'darwin', 'freebsd', 'linux', 'netbsd', 'openbsd', 'openharmony', 'sunos', 'win32', 'aix'];
const CPUS = ['arm64', 'arm', 'ia32', 'x64', 'loong64', 'ppc64', 'riscv64', 's390x', 'mips64el'];

const file = new URL('../package-lock.json', import.meta.url);
const lock = JSON.parse(fs.readFileSync(file, 'utf8'));
const pk = lock.packages;
const added = [];
const skipped = [];
for (const [where, meta] of Object.entries(pk)) {
  for (const [name, version] of Object.entries(meta.optionalDependencies ?? {})) {
    const key = `node_modules/${name}`;
    const nested = `${where}/node_modules/${name}`;
    if (pk[key] || pk[nested]) continue;
    const parts = name.split('/').pop().split('-');
    const os = parts.find((p) => OSES.includes(p));
    const cpuPart = parts.find((p) => CPUS.includes(p) || p === 'armv7' || p === 'arm64');
    if (!os || !cpuPart) {
      skipped.push(name);
      continue;
    }
    const cpu = cpuPart === 'armv7' ? 'arm' : cpuPart;
    const entry = { version: String(version).replace(/^[\^~]/, ''), cpu: [cpu], dev: meta.dev === true, optional: true, os: [os] };
    if (!entry.dev) delete entry.dev;
    if (os === 'linux') {
      if (parts.some((p) => p.startsWith('musl'))) entry.libc = ['musl'];
      else if (parts.some((p) => p === 'gnu' || p.startsWith('gnueabi'))) entry.libc = ['glibc'];
    }
    pk[key] = entry;
    added.push(name);
  }
}
lock.packages = Object.fromEntries(Object.entries(pk).sort(([a], [b]) => (a === '' ? -1 : b === '' ? 1 : a.localeCompare(b))));
fs.writeFileSync(file, JSON.stringify(lock, null, 2) + '\n');
console.log(added.length ? `package-lock.json: added ${added.length} platform entries (${added.join(', ')})` : 'package-lock.json: complete');
if (skipped.length) console.log(`not added (no platform in the name): ${skipped.join(', ')}`);
