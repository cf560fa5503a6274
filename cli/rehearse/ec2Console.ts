import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BEGIN_KEYS, END_KEYS } from '../../shared/providers/aws/consoleHostKeys.ts';
import { ed25519PublicBlob, newEd25519KeyPair } from '../../shared/providers/local/hostKey.ts';

/**
 * What cloud-init prints on an EC2 instance's serial console at first boot, for moto's instances: moto
 * answers GetConsoleOutput with a fixed kernel log, without the SSH host keys the functions wait for
 * (`host-keys: console`, the default for functions outside the instances' VPC), so no backing node would
 * ever be ready. The functions' EC2 endpoint is this proxy: it passes every call to moto and adds, to a
 * GetConsoleOutput answer, the block cloud-init's `ssh_keys_to_console` writes, with an ed25519 host key
 * made here once per instance. There is no machine behind it: the keys are the rehearsal's, and nothing
 * answers SSH with them.
 */
export class Ec2ConsoleProxy {
  private readonly keys = new Map<string, string>();

  private constructor(
    private readonly server: Server,
    readonly endpoint: string,
  ) {}

  static async start(motoEndpoint: string): Promise<Ec2ConsoleProxy> {
    const target = new URL(motoEndpoint);
    let proxy: Ec2ConsoleProxy | undefined;
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        const instanceId = consoleOutputInstance(req, body);
        const upstream = httpRequest(
          {
            host: target.hostname,
            port: target.port,
            method: req.method,
            path: req.url,
            headers: { ...req.headers, host: target.host },
          },
          (answer) => {
            if (instanceId === undefined || answer.statusCode !== 200) {
              res.writeHead(answer.statusCode ?? 502, answer.headers);
              answer.pipe(res);
              return;
            }
            const parts: Buffer[] = [];
            answer.on('data', (c: Buffer) => parts.push(c));
            answer.on('end', () => {
              const xml = proxy?.withHostKeys(Buffer.concat(parts).toString('utf8'), instanceId) ?? '';
              const headers = { ...answer.headers, 'content-length': String(Buffer.byteLength(xml)) };
              delete headers['transfer-encoding'];
              res.writeHead(200, headers);
              res.end(xml);
            });
          },
        );
        upstream.on('error', (err) => {
          res.writeHead(502, { 'content-type': 'text/plain' });
          res.end(`rehearsal EC2 proxy: moto did not answer: ${err.message}`);
        });
        upstream.end(body);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    proxy = new Ec2ConsoleProxy(server, `http://localhost:${port}`);
    return proxy;
  }

  /** The host key line of an instance (made on first use). */
  hostKey(instanceId: string): string {
    let line = this.keys.get(instanceId);
    if (!line) {
      line = ed25519HostKey();
      this.keys.set(instanceId, line);
    }
    return line;
  }

  /** moto's GetConsoleOutput answer with cloud-init's host key block after its output. */
  private withHostKeys(xml: string, instanceId: string): string {
    return xml.replace(/<output>([^<]*)<\/output>/, (_, encoded: string) => {
      const console = Buffer.from(encoded, 'base64').toString('utf8');
      const block = [
        '',
        `ec2: ${BEGIN_KEYS}`,
        `ec2: ${this.hostKey(instanceId)} root@${instanceId}`,
        `ec2: ${END_KEYS}`,
        '',
      ].join('\r\n');
      return `<output>${Buffer.from(console + block, 'utf8').toString('base64')}</output>`;
    });
  }

  stop(): Promise<void> {
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }
}

/** The instance a GetConsoleOutput call (EC2's query protocol) asks about, or undefined for any other call. */
function consoleOutputInstance(req: IncomingMessage, body: Buffer): string | undefined {
  if (req.method !== 'POST') return undefined;
  const form = new URLSearchParams(body.toString('utf8'));
  if (form.get('Action') !== 'GetConsoleOutput') return undefined;
  return form.get('InstanceId') ?? undefined;
}

/** `ssh-ed25519 <base64 of the SSH wire form>`: a new key's public half, as known_hosts has it. */
function ed25519HostKey(): string {
  return `ssh-ed25519 ${ed25519PublicBlob(newEd25519KeyPair().publicKey).toString('base64')}`;
}
