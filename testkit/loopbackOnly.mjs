// Preloaded (node --import) into every process a moto test starts, and imported by the tests
// themselves: a host name other than localhost does not resolve, so a client that ignores
// AWS_ENDPOINT_URL (a queue URL's host, a default endpoint) fails loudly instead of reaching AWS.
// Addresses given as IP literals are passed through.
import dns from 'node:dns';
import { isIP } from 'node:net';

const lookup = dns.lookup;
if (!lookup.loopbackOnly) {
  const guarded = (hostname, options, callback) => {
    const cb = typeof options === 'function' ? options : callback;
    const opts = typeof options === 'function' ? {} : options;
    if (hostname === 'localhost' || isIP(hostname) !== 0) return lookup.call(dns, hostname, opts, cb);
    const err = new Error(
      `getaddrinfo ENOTFOUND ${hostname} (blocked: these tests reach only localhost; is a configured endpoint ignored?)`,
    );
    err.code = 'ENOTFOUND';
    err.hostname = hostname;
    process.nextTick(() => cb(err));
  };
  guarded.loopbackOnly = true;
  dns.lookup = guarded;
}
