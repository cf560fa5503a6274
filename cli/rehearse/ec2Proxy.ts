import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { BEGIN_KEYS, END_KEYS } from '../../shared/providers/aws/consoleHostKeys.ts';
import { ed25519PublicBlob, newEd25519KeyPair } from '../../shared/providers/local/hostKey.ts';
import { mapConfigText } from './network.ts';

/**
 * The functions' EC2 endpoint in the rehearsal: a proxy in front of moto that changes two things, and
 * says so.
 *
 * - Ids. moto cannot make a resource with a given id, so the subnets, security groups, images and launch
 *   templates the configuration names exist in moto under ids of moto's (network.ts). Rather than run the
 *   functions with a configuration rewritten to name those (which would no longer be the code `cdk
 *   deploy` uploads under the asset's hash), each request's parameters naming one of the configuration's
 *   ids are sent to moto with moto's, and moto's ids in the answer are given back as the configuration's:
 *   the functions run the code and configuration CDK deployed, byte for byte, and see the account as the
 *   configuration describes it.
 * - The console. moto answers GetConsoleOutput with a fixed kernel log and no SSH host keys, so with
 *   `host-keys: console` (the default outside the VPC) no backing node would ever be ready. Unless told
 *   not to (`consoleHostKeys: false`: the rehearsal of an image that prints none), the proxy adds to the
 *   answer the block cloud-init's `keys_to_console` writes, with an ed25519 host key made here once per
 *   instance, after a line saying it is made up. No machine is behind it: the key is the rehearsal's,
 *   nothing answers SSH with it, and it proves only that the functions wait for and parse such a block,
 *   not that an image prints one.
 */
export interface Ec2ProxyOptions {
  readonly motoEndpoint: string;
  /** The configuration's ids -> moto's (network.ts). */
  readonly ids?: ReadonlyMap<string, string>;
  /** Add a made-up host-key block to each console output (default true). */
  readonly consoleHostKeys?: boolean;
}

/** The line the proxy prints before the block it makes up, as an instance's console would show it. */
export const MADE_UP_NOTICE =
  'metastatic rehearse: the SSH host-key block below is made up by the rehearsal (moto prints none; your image prints its own only if its cloud-init does)';

export class Ec2Proxy {
  private readonly keys = new Map<string, string>();
  /** moto's ids -> the configuration's. */
  private readonly back: ReadonlyMap<string, string>;

  private constructor(
    private readonly server: Server,
    readonly endpoint: string,
    private readonly ids: ReadonlyMap<string, string>,
    readonly consoleHostKeys: boolean,
  ) {
    this.back = new Map([...ids].map(([ours, motos]) => [motos, ours]));
  }

  static async start(options: Ec2ProxyOptions): Promise<Ec2Proxy> {
    const target = new URL(options.motoEndpoint);
    let proxy: Ec2Proxy | undefined;
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const asked = Buffer.concat(chunks);
        const form = formOf(req, asked);
        const sent = form && proxy ? proxy.toMoto(form) : undefined;
        const body = sent === undefined ? asked : Buffer.from(sent, 'utf8');
        const consoleOf = form?.get('Action') === 'GetConsoleOutput' ? form.get('InstanceId') : null;
        const headers = { ...req.headers, host: target.host, 'content-length': String(body.length) };
        delete headers['transfer-encoding'];
        const upstream = httpRequest(
          { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
          (answer) => {
            const parts: Buffer[] = [];
            answer.on('data', (c: Buffer) => parts.push(c));
            answer.on('end', () => {
              let text = Buffer.concat(parts).toString('utf8');
              if (proxy) text = proxy.fromMoto(text);
              if (proxy && consoleOf && answer.statusCode === 200) text = proxy.withConsole(text, consoleOf);
              const headers = { ...answer.headers, 'content-length': String(Buffer.byteLength(text)) };
              delete headers['transfer-encoding'];
              res.writeHead(answer.statusCode ?? 502, headers);
              res.end(text);
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
    proxy = new Ec2Proxy(
      server,
      `http://localhost:${port}`,
      options.ids ?? new Map(),
      options.consoleHostKeys ?? true,
    );
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

  /** A request's form with the configuration's ids replaced by moto's; undefined when none is named. */
  private toMoto(form: URLSearchParams): string | undefined {
    return translateForm(form, this.ids);
  }

  /** An answer with moto's ids replaced by the configuration's. */
  private fromMoto(text: string): string {
    return this.back.size === 0 ? text : mapConfigText(text, this.back);
  }

  private withConsole(xml: string, instanceId: string): string {
    return this.consoleHostKeys ? withMadeUpHostKeys(xml, instanceId, this.hostKey(instanceId)) : xml;
  }

  stop(): Promise<void> {
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }
}

/**
 * The form with every value that is one of `ids`' keys replaced by its value (EC2's query protocol names
 * a resource by a whole parameter value: `SubnetId`, `SecurityGroupId.1`, `ImageId.1`,
 * `LaunchTemplate.LaunchTemplateId`, `Filter.1.Value.1`, ...), re-encoded; undefined when no value was
 * replaced (the request is then sent as it came).
 */
export function translateForm(form: URLSearchParams, ids: ReadonlyMap<string, string>): string | undefined {
  if (ids.size === 0) return undefined;
  let replaced = false;
  const out = new URLSearchParams();
  for (const [key, value] of form) {
    const to = ids.get(value);
    if (to !== undefined) replaced = true;
    out.append(key, to ?? value);
  }
  return replaced ? out.toString() : undefined;
}

/**
 * moto's GetConsoleOutput answer with cloud-init's host key block after its output, announced by
 * MADE_UP_NOTICE (the parser skips lines outside the block, as it skips kernel lines).
 */
export function withMadeUpHostKeys(xml: string, instanceId: string, keyLine: string): string {
  return xml.replace(/<output>([^<]*)<\/output>/, (_, encoded: string) => {
    const console = Buffer.from(encoded, 'base64').toString('utf8');
    const block = [
      '',
      `ec2: ${MADE_UP_NOTICE}`,
      `ec2: ${BEGIN_KEYS}`,
      `ec2: ${keyLine} root@${instanceId}`,
      `ec2: ${END_KEYS}`,
      '',
    ].join('\r\n');
    return `<output>${Buffer.from(console + block, 'utf8').toString('base64')}</output>`;
  });
}

/** A POST of EC2's query protocol, as a form; undefined for anything else. */
function formOf(req: IncomingMessage, body: Buffer): URLSearchParams | undefined {
  if (req.method !== 'POST') return undefined;
  const form = new URLSearchParams(body.toString('utf8'));
  return form.has('Action') ? form : undefined;
}

/** `ssh-ed25519 <base64 of the SSH wire form>`: a new key's public half, as known_hosts has it. */
function ed25519HostKey(): string {
  return `ssh-ed25519 ${ed25519PublicBlob(newEd25519KeyPair().publicKey).toString('base64')}`;
}
