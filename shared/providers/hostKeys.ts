/**
 * SSH host-key scanning (label option `host-key-checking`): one real SSH handshake with the `ssh2` client,
 * no shell-out. The scan completes the key exchange, so the returned key is one the server proved it holds
 * (the exchange hash is signed with it), and disconnects before authentication.
 *
 * One handshake negotiates one host-key algorithm, so a server with several host keys yields the one the
 * ssh2 client prefers (ed25519, then ecdsa, then rsa).
 */
import { connect } from 'node:net';
import ssh2 from 'ssh2';
import { TimeoutError } from '../core/errors.ts';

/** How long a scan that got its key waits for the server to close the connection before dropping it. */
const CLOSE_GRACE_MS = 1_000;

/** `host:port`, with an IPv6 address in brackets. */
function endpoint(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * The host key of the SSH server at host:port, as `["<type> <base64>"]` (the known_hosts / authorized_keys
 * form, e.g. `ssh-ed25519 AAAA...`). Rejects with `host-key scan of HOST:PORT failed: <reason>` when the
 * connection or the key exchange fails, and with a TimeoutError `host-key scan of HOST:PORT timed out after
 * Nms` when the key exchange is not done within `timeoutMs` (the caller tells a scan its own deadline cut
 * short from a dead server by it). Settles only once its socket is closed; leaves no timer.
 */
export async function scanHostKeys(host: string, port: number, timeoutMs: number): Promise<string[]> {
  const where = endpoint(host, port);
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new RangeError(
      `host-key scan of ${where}: timeout must be a positive number of ms, got ${timeoutMs}`,
    );
  }
  return new Promise<string[]>((resolve, reject) => {
    const socket = connect({ host, port });
    const client = new ssh2.Client();
    let hostKey: string | undefined;
    let keyError: string | undefined;
    let outcome: { keys: string[] } | { error: Error } | undefined;
    let graceTimer: NodeJS.Timeout | undefined;

    const fail = (reason: string): void => {
      if (outcome) return;
      outcome = { error: new Error(`host-key scan of ${where} failed: ${reason}`) };
      clearTimeout(timer);
      socket.destroy();
    };

    const timer = setTimeout(() => {
      if (outcome) return;
      outcome = { error: new TimeoutError(`host-key scan of ${where} timed out after ${timeoutMs}ms`) };
      socket.destroy();
    }, timeoutMs);

    socket.on('error', () => {}); // Reported through the client's 'error' event.
    socket.once('close', () => {
      clearTimeout(timer);
      clearTimeout(graceTimer);
      if (!outcome) fail('connection closed before the key exchange completed');
      if (outcome && 'keys' in outcome) resolve(outcome.keys);
      else if (outcome) reject(outcome.error);
    });

    client.on('error', (err) => fail(keyError ?? err.message));
    client.on('handshake', () => {
      if (outcome) return;
      if (hostKey === undefined) {
        fail(keyError ?? 'the server presented no host key');
        return;
      }
      outcome = { keys: [hostKey] };
      clearTimeout(timer);
      // Polite disconnect; the server closes its end in turn. Should it not, drop the connection.
      client.end();
      graceTimer = setTimeout(() => socket.destroy(), CLOSE_GRACE_MS);
    });

    try {
      client.connect({
        sock: socket,
        username: 'metastatic-host-key-scan',
        // Our own timer bounds the scan; ssh2's would only start once connected and runs until auth.
        readyTimeout: 0,
        // With hostHash unset the verifier receives the raw public key blob.
        hostVerifier: (key: Buffer): boolean => {
          const parsed = ssh2.utils.parseKey(key);
          if (parsed instanceof Error) {
            keyError = `cannot parse the server's host key: ${parsed.message}`;
            return false;
          }
          hostKey = `${parsed.type} ${parsed.getPublicSSH().toString('base64')}`;
          // Accept, so the key exchange goes on to check the server's signature made with this key.
          return true;
        },
      });
    } catch (err) {
      fail(err instanceof Error ? err.message : String(err));
    }
  });
}
