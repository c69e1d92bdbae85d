/**
 * First contact: a transport failure before the server has answered anything says the base URL is
 * wrong (nothing listens there, no such host, `https://` against a plain-HTTP server, a certificate
 * that is not trusted), not that the network hiccupped. `check`, `sync` and the daemon's start-up
 * check turn it into a one-line configuration error naming the setting, in our words, instead of
 * retrying for seconds and printing the library's text. Once any response has arrived, the same
 * failures are transients and retried as before (src/api/client.ts, `failFast`).
 */
import { ConfigError } from '../errors.js';

/** Certificate problems, by the codes Node's TLS layer gives them. */
const CERTIFICATE_CODES = new Set([
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

/** `host port N` of a base URL, the port made explicit (80 for http, 443 for https). */
export function hostAndPort(baseUrl: string): { host: string; port: string; https: boolean } {
  const url = new URL(baseUrl);
  const https = url.protocol === 'https:';
  return { host: url.hostname, port: url.port !== '' ? url.port : https ? '443' : '80', https };
}

/**
 * What a transport error at first contact says about the base URL, in our words; undefined when it
 * says nothing certain (a timeout, a reset, a name server or route that is not there yet: those
 * stay transients and are retried).
 *
 * @param err - the error undici threw (its `code` is read: `ECONNREFUSED`, `ENOTFOUND`,
 *   `ERR_SSL_WRONG_VERSION_NUMBER`, certificate codes)
 */
export function firstContactProblem(baseUrl: string, err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  if (typeof code !== 'string') return undefined;
  const { host, port, https } = hostAndPort(baseUrl);
  if (code === 'ECONNREFUSED') return `nothing is listening on ${host} port ${port} (connection refused)`;
  if (code === 'ENOTFOUND') return `no such host: ${host}`;
  // EAI_AGAIN (the name server did not answer), EHOSTUNREACH and ENETUNREACH say the network is not
  // up yet (a container started before its network): transients, retried, never a wrong setting.
  if (https && (code === 'ERR_SSL_WRONG_VERSION_NUMBER' || code === 'ERR_SSL_PACKET_LENGTH_TOO_LONG')) {
    return `the URL says https:// but the server on ${host} port ${port} speaks plain HTTP (use http://, or the server's https port)`;
  }
  if (https && CERTIFICATE_CODES.has(code)) return `the TLS certificate of ${host} is not trusted (${code})`;
  return undefined;
}

/**
 * The {@link ConfigError} of a first-contact transport failure, naming `setting` (the variable, or
 * the workspaces file entry, that holds the base URL) and the base URL; undefined when the failure
 * says nothing certain ({@link firstContactProblem}).
 */
export function firstContactError(baseUrl: string, err: unknown, setting = 'CONVO_MIRROR_BASE_URL'): ConfigError | undefined {
  const problem = firstContactProblem(baseUrl, err);
  if (problem === undefined) return undefined;
  const url = new URL(baseUrl);
  // origin + path: never the user info or query a URL may carry.
  return new ConfigError(setting, `${url.origin}${url.pathname.replace(/\/+$/, '')} does not answer: ${problem}`, err);
}
