/**
 * Real PostgreSQL for tests (design habit 9): the server of `CONVO_MIRROR_TEST_PG` (default
 * `postgres://postgres@127.0.0.1:5432/test`, trust authentication), one random schema per test
 * file (`cmtest_<label>_<random>`), dropped in `afterAll`; and a tiny fake server speaking just
 * enough of the wire protocol to refuse a password (trust authentication accepts any), or to
 * never answer.
 *
 * ```ts
 * const schema = randomSchema('pages');
 * afterAll(() => dropSchema(schema));
 * const mirror = await PostgresMirror.open(pgUrl(schema));
 * ```
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import pg from 'pg';

/** The test server (no `schema` parameter). */
export const PG_BASE = process.env.CONVO_MIRROR_TEST_PG ?? 'postgres://postgres@127.0.0.1:5432/test';

/** A fresh schema name, `cmtest_<label>_<12 hex digits>` (label cut to 20 lower-case letters, digits and `_`). */
export function randomSchema(label = 'pg'): string {
  const clean = label.toLowerCase().replace(/[^a-z0-9_]/g, '_').slice(0, 20);
  return `cmtest_${clean}_${randomBytes(6).toString('hex')}`;
}

/** The test server's URL with `?schema=<schema>` (and `base` another server or user, e.g. with a password). */
export function pgUrl(schema: string, base = PG_BASE): string {
  const u = new URL(base);
  u.searchParams.set('schema', schema);
  return u.href;
}

/** Runs one statement on the test server (a connection of its own). */
export async function pgQuery<T extends pg.QueryResultRow = Record<string, unknown>>(text: string, values: unknown[] = []): Promise<T[]> {
  const client = new pg.Client({ connectionString: PG_BASE, application_name: 'convo-mirror-test' });
  await client.connect();
  try {
    return (await client.query<T>(text, values)).rows;
  } finally {
    await client.end();
  }
}

/** Drops `schema` and everything in it (no error when it does not exist). */
export async function dropSchema(schema: string): Promise<void> {
  if (!/^cmtest_[a-z0-9_]+$/.test(schema)) throw new Error(`not a test schema: ${schema}`);
  await pgQuery(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/**
 * Polls `check` until it returns true: for a state another connection reaches (e.g. a backend
 * waiting for a lock), never a timed assertion; the test's timeout bounds it.
 */
export async function until(check: () => Promise<boolean>, what: string, pauseMs = 20): Promise<void> {
  for (let i = 0; ; i++) {
    if (await check()) return;
    if (i > 0 && i % 500 === 0) console.warn(`still waiting for ${what}`);
    await new Promise((r) => setTimeout(r, pauseMs));
  }
}

/** Whether some backend waits for the advisory lock with the 64-bit key `key` (decimal text). */
export async function advisoryWaiter64(key: string): Promise<boolean> {
  const k = BigInt.asUintN(64, BigInt(key));
  const rows = await pgQuery(
    `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2`,
    [(k >> 32n).toString(), (k & 0xffffffffn).toString()],
  );
  return rows.length > 0;
}

/** Whether some backend waits for the advisory lock with the int4 pair `key`. */
export async function advisoryWaiterPair(key: [number, number]): Promise<boolean> {
  const rows = await pgQuery(
    `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2 AND classid::bigint = $1 AND objid::bigint = $2`,
    [key[0] >>> 0, key[1] >>> 0],
  );
  return rows.length > 0;
}

/** Whether some backend of `application_name` convo-mirror waits for a row lock (a tuple or a transaction id). */
export async function rowLockWaiters(): Promise<number> {
  const rows = await pgQuery<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'convo-mirror' AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')`,
  );
  return rows[0]!.n;
}

/** A fake PostgreSQL server on 127.0.0.1 (see {@link startFakePg}). */
export interface FakePg {
  port: number;
  /** The passwords clients sent (cleartext password messages), in order. */
  passwords: string[];
  close(): Promise<void>;
}

/** One backend message: type byte, length, body. */
function message(type: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0, 'latin1');
  head.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

/** An ErrorResponse with severity, SQLSTATE and message. */
function errorResponse(severity: string, code: string, text: string): Buffer {
  const field = (t: string, v: string) => Buffer.concat([Buffer.from(t, 'latin1'), Buffer.from(v, 'utf8'), Buffer.from([0])]);
  return message('E', Buffer.concat([field('S', severity), field('V', severity), field('C', code), field('M', text), Buffer.from([0])]));
}

/**
 * Starts a fake PostgreSQL server on 127.0.0.1 (a free port). `refuse`: it answers the startup
 * message by asking for a cleartext password, records the password the client sends, and answers
 * with `ErrorResponse FATAL <code> <text>` (then closes), as a server refusing the credentials
 * does. `silent`: it accepts connections and never answers (a connect timeout).
 */
export async function startFakePg(mode: { refuse: { code: string; text: string } } | { silent: true }): Promise<FakePg> {
  const passwords: string[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    if ('silent' in mode) return;
    let buf = Buffer.alloc(0);
    let started = false;
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      for (;;) {
        if (!started) {
          // StartupMessage (or SSLRequest): Int32 length, then the body; no type byte.
          if (buf.length < 4) return;
          const len = buf.readInt32BE(0);
          if (buf.length < len) return;
          const code = buf.readInt32BE(4);
          buf = buf.subarray(len);
          if (code === 80877103) {
            socket.write('N'); // SSLRequest: no TLS here
            continue;
          }
          started = true;
          // AuthenticationCleartextPassword
          const body = Buffer.alloc(4);
          body.writeInt32BE(3, 0);
          socket.write(message('R', body));
          continue;
        }
        if (buf.length < 5) return;
        const len = buf.readInt32BE(1);
        if (buf.length < len + 1) return;
        const type = String.fromCharCode(buf[0]!);
        const body = buf.subarray(5, len + 1);
        buf = buf.subarray(len + 1);
        if (type === 'p') {
          passwords.push(body.subarray(0, body.indexOf(0)).toString('utf8'));
          socket.end(errorResponse('FATAL', mode.refuse.code, mode.refuse.text));
          return;
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    passwords,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A port on 127.0.0.1 nothing listens on (bound, then released). */
export async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
