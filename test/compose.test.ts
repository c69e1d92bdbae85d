/**
 * docker-compose.yml, read as Compose reads it (YAML with merge keys). There is no Docker here, so
 * this checks what a reading can: the `fleet` profile's daemons form one mirror (the same
 * PostgreSQL schema, Redis, queue prefix and export volume), the profile stays out of a plain
 * `docker compose up`, and the fleet adds no variable that a plain `up` would then require
 * (Compose interpolates the whole file before it picks the services to start).
 */
import fs from 'node:fs';
import path from 'node:path';
import { parseDocument } from 'yaml';
import { describe, expect, it } from 'vitest';
import { ROOT } from './children.js';

interface Service {
  profiles?: string[];
  image?: string;
  build?: unknown;
  command?: string[];
  hostname?: string;
  environment?: Record<string, string | number>;
  depends_on?: Record<string, { condition: string }>;
  ports?: string[];
  volumes?: string[];
}

const text = fs.readFileSync(path.join(ROOT, 'docker-compose.yml'), 'utf8');
const doc = parseDocument(text, { merge: true });
const compose = doc.toJS() as { services: Record<string, Service>; volumes: Record<string, unknown> };
const services = compose.services;
const fleetDaemons = Object.keys(services).filter((n) => /^fleet-daemon-\d+$/.test(n));

/** The node flags of the CLI's shebang (test/packaging.test.ts checks the other ways it starts). */
const shebangFlags = /^#!\/usr\/bin\/env -S node((?: --[\w-]+)*)\n/.exec(fs.readFileSync(path.join(ROOT, 'src', 'cli', 'index.ts'), 'utf8'))![1]!.trim().split(' ');

describe('docker-compose.yml', () => {
  it('parses without errors or warnings', () => {
    expect(doc.errors).toEqual([]);
    expect(doc.warnings).toEqual([]);
  });

  it('a plain `up` starts Redis and the SQLite daemon only; every other service is in the fleet profile', () => {
    const plain = Object.entries(services).filter(([, s]) => s.profiles === undefined).map(([n]) => n);
    expect(plain.sort()).toEqual(['daemon', 'redis']);
    for (const [name, s] of Object.entries(services)) if (s.profiles !== undefined) expect(s.profiles, name).toEqual(['fleet']);
    expect(services.daemon!.environment!.CONVO_MIRROR_DB).toBe('/app/data/mirror.sqlite');
  });

  it('the fleet profile has PostgreSQL, the fake API and two daemons', () => {
    expect(services['fleet-postgres']!.image).toMatch(/^postgres:1[56]/);
    expect(services['fake-api']!.command).toEqual(['node', ...shebangFlags, 'dist/src/cli/index.js', 'fake-api', '--host', '0.0.0.0', '--port', '4010']);
    expect(fleetDaemons).toEqual(['fleet-daemon-1', 'fleet-daemon-2']);
  });

  it('the fleet daemons are one mirror: the same schema, Redis, queue prefix and export volume', () => {
    const [first, ...others] = fleetDaemons.map((n) => services[n]!);
    const env = first!.environment!;
    expect(String(env.CONVO_MIRROR_DB)).toMatch(/^postgres:\/\/convo_mirror:[^@]+@fleet-postgres:5432\/convo_mirror\?schema=convo_mirror$/);
    // One queue prefix per mirror: not the SQLite daemon's (its default) on the same Redis.
    expect(env.CONVO_MIRROR_QUEUE_PREFIX).toBeDefined();
    expect(env.CONVO_MIRROR_QUEUE_PREFIX).not.toBe(services.daemon!.environment!.CONVO_MIRROR_QUEUE_PREFIX ?? 'convo-mirror');
    expect(env.REDIS_URL).toBe(services.daemon!.environment!.REDIS_URL);
    const exportMount = `fleet-exports:${env.CONVO_MIRROR_EXPORT_DIR}`;
    expect(compose.volumes).toHaveProperty('fleet-exports');
    for (const s of [first!, ...others]) {
      expect(s.environment).toEqual(env);
      expect(s.volumes).toEqual([exportMount]);
      expect(Object.keys(s.depends_on ?? {}).sort()).toEqual(['fleet-postgres', 'redis']);
      expect(s.image).toBe(services.daemon!.image);
    }
    // Told apart in `status` (hostname) and on the host (their own published port).
    const hostnames = fleetDaemons.map((n) => services[n]!.hostname);
    expect(new Set(hostnames).size).toBe(fleetDaemons.length);
    const ports = Object.values(services).flatMap((s) => s.ports ?? []);
    expect(new Set(ports).size).toBe(ports.length);
    for (const p of ports) expect(p).toMatch(/^127\.0\.0\.1:/);
  });

  it('the fleet requires no variable the SQLite daemon does not already require', () => {
    const required = (v: unknown) => new Set([...JSON.stringify(v).matchAll(/\$\{([A-Z0-9_]+):?\?/g)].map((m) => m[1]!));
    const plain = Object.values(services).filter((s) => s.profiles === undefined);
    expect([...required(plain)].sort()).toEqual(['CONVO_MIRROR_API_KEY', 'CONVO_MIRROR_BASE_URL']);
    expect([...required(compose)].sort()).toEqual([...required(plain)].sort());
  });
});
