/**
 * Where the daemon's HTTP server listens (`CONVO_MIRROR_HTTP_HOST`, `CONVO_MIRROR_HTTP_PORT`): the
 * words for a listen that failed, shared by the daemon (jobs/daemon.ts) and `check --daemon`, which
 * tries the address without starting a server. No fastify here: `check` loads none.
 */
import net from 'node:net';
import { ConfigError } from '../errors.js';

/** `127.0.0.1:9464`, `[::1]:9464`: a listen address as messages show it. */
export function listenAddress(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/**
 * The {@link ConfigError} of a failed listen, naming the setting to change: `CONVO_MIRROR_HTTP_PORT`
 * when the port is in use or not allowed, `CONVO_MIRROR_HTTP_HOST` when the interface does not
 * exist here; any other error is returned as it is.
 */
export function listenError(err: unknown, host: string, port: number): unknown {
  const code = (err as { code?: string } | undefined)?.code;
  const where = listenAddress(host, port);
  if (code === 'EADDRINUSE') return new ConfigError('CONVO_MIRROR_HTTP_PORT', `${where} is already in use: choose another port (--http-port), or 0 for no HTTP server`, err);
  if (code === 'EACCES') return new ConfigError('CONVO_MIRROR_HTTP_PORT', `${where}: not allowed to listen on port ${port} (ports below 1024 need privileges); choose another port`, err);
  if (code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN') {
    return new ConfigError('CONVO_MIRROR_HTTP_HOST', `cannot listen on ${host}: no such interface on this machine (${code})`, err);
  }
  return err;
}

/**
 * Listens on `host:port` (TCP, as the daemon's server would) and closes at once: proves the
 * address can be listened on now. Accepts no connection and writes nothing.
 *
 * @param port - 1 to 65535 (the daemon reads 0 as "no server": do not call this for 0)
 * @throws what {@link listenError} makes of the failure (a {@link ConfigError} naming the setting)
 */
export async function tryListen(host: string, port: number): Promise<void> {
  const server = net.createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port, exclusive: true }, () => resolve());
    });
  } catch (err) {
    throw listenError(err, host, port);
  }
  await new Promise<void>((resolve) => server.close(() => resolve()));
}
