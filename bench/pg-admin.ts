/**
 * The bench's PostgreSQL schemas: a mirror target in a schema of its own (`bench_<what>_<random>`),
 * and its removal at the end. The server comes from `--pg`, else `CONVO_MIRROR_TEST_PG`, else
 * `postgres://postgres@127.0.0.1:5432/test` (the test server).
 */
import pg from 'pg';

/** The default server and database of the bench's PostgreSQL sections. */
export const DEFAULT_PG_BASE = process.env.CONVO_MIRROR_TEST_PG ?? 'postgres://postgres@127.0.0.1:5432/test';

/** `base` (a `postgres://` URL without `schema`) with `?schema=<schema>`: a `CONVO_MIRROR_DB` value. */
export function pgTarget(base: string, schema: string): string {
  const u = new URL(base);
  u.searchParams.set('schema', schema);
  return u.href;
}

/** `base` with its password, if any, as `***`: for output. */
export function pgShown(base: string): string {
  const u = new URL(base);
  if (u.password !== '') u.password = '***';
  return u.href;
}

/**
 * Drops a schema of the bench (`bench_…`) and everything in it; a failure is written to stderr,
 * not thrown (the figures are worth more than the clean-up).
 * @throws Error when `schema` is not a bench schema (`bench_[a-z0-9_]+`)
 */
export async function dropBenchSchema(base: string, schema: string): Promise<void> {
  if (!/^bench_[a-z0-9_]+$/.test(schema)) throw new Error(`not a bench schema: ${schema}`);
  const client = new pg.Client({ connectionString: base, application_name: 'convo-mirror-bench' });
  try {
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  } catch (err) {
    process.stderr.write(`[bench] could not drop schema ${schema}: ${err instanceof Error ? err.message : String(err)}\n`);
  } finally {
    await client.end().catch(() => {});
  }
}
