import { createServer } from 'node:net';

/**
 * A TCP port free on loopback a moment ago, for a server of its own that cannot listen on port 0 and
 * report its port (moto_server, DynamoDB Local): another process may take it before that server binds, so
 * its caller tries again on another.
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}
