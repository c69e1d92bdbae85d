/**
 * What the fleet tests check on a PostgreSQL mirror: its live rows against the fake's, and the
 * seqs of every export line (every stream).
 */
import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'vitest';
import type { FakeWorkspace } from '../src/fake-api/index.js';
import { ACCOUNT_ID, fakeMessages } from './helpers.js';
import { pgQuery } from './pg.js';

/**
 * The PostgreSQL mirror in `schema` holds exactly the fake's live conversations and messages
 * (same ids, and `raw_text` byte for byte the served JSON), nothing more.
 */
export async function expectPgMirrorEqualsFake(schema: string, ws: FakeWorkspace, accountId = ACCOUNT_ID): Promise<void> {
  const msgs = await pgQuery<{ k: string; raw: string }>(
    `SELECT conversation_id || '/' || id AS k, raw_text AS raw FROM "${schema}".messages WHERE account_id = $1 AND deleted_at IS NULL`,
    [accountId],
  );
  const mirrored = new Map(msgs.map((r) => [r.k, r.raw]));
  const served = fakeMessages(ws);
  const missing = [...served].filter(([k, raw]) => mirrored.get(k) !== raw).map(([k]) => k);
  const extra = [...mirrored.keys()].filter((k) => !served.has(k));
  expect({ missing: missing.slice(0, 5), missingCount: missing.length, extra: extra.slice(0, 5) }, 'messages missing, different or extra').toEqual({ missing: [], missingCount: 0, extra: [] });
  const convs = await pgQuery<{ id: string; raw: string | null }>(`SELECT id, raw_text AS raw FROM "${schema}".conversations WHERE account_id = $1 AND deleted_at IS NULL`, [accountId]);
  const mirroredConvs = new Map(convs.map((r) => [r.id, r.raw]));
  const servedConvs = new Map(ws.list().map((c) => [c.id, JSON.stringify(c.data)]));
  const convMissing = [...servedConvs].filter(([id, raw]) => mirroredConvs.get(id) !== raw).map(([id]) => id);
  const convExtra = [...mirroredConvs.keys()].filter((id) => !servedConvs.has(id));
  expect({ missing: convMissing.slice(0, 5), missingCount: convMissing.length, extra: convExtra.slice(0, 5) }, 'conversations missing, different or extra').toEqual({
    missing: [],
    missingCount: 0,
    extra: [],
  });
}

/** The `seq` of every line of every `.jsonl` file under `exportDir` (all streams), sorted. */
export function exportedSeqs(exportDir: string): number[] {
  const seqs: number[] = [];
  const walk = (d: string) => {
    if (!fs.existsSync(d)) return;
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.jsonl')) for (const line of fs.readFileSync(p, 'utf8').split('\n')) if (line) seqs.push((JSON.parse(line) as { seq: number }).seq);
    }
  };
  for (const stream of ['messages', 'conversations', 'runs']) walk(path.join(exportDir, stream));
  return seqs.sort((a, b) => a - b);
}
