/**
 * The program a local backing node runs: the embedded pool's stand-in for an EC2 instance. The local
 * provider spawns it as a child process (node + the tsx loader):
 *
 *   backingNode.ts --id <backingNodeId> --resource <resourceId> --boot-delay <seconds> --host 127.0.0.1
 *                  --state-file <path> [--host-key-file <path>]
 *
 * It loads its SSH host key from the host-key file (default: the state file's path with `.key` in place of
 * `.json`), or generates an ed25519 key there (mode 0600) on its first start, so a restarted process keeps
 * its key. It then waits boot-delay seconds ("booting"), serves SSH on a TCP port the OS chooses, writes
 * its state file atomically (tmp + rename, merged into whatever record the provider already wrote; with
 * `hostKeys: ["<type> <base64>"]`) and prints `HOSTKEY <type> <base64>` then `READY <port>` on stdout.
 *
 * The SSH server is a loopback toy machine: its identification line is `SSH-2.0-metastatic_<backingNodeId>`
 * (so `nc 127.0.0.1 PORT` shows which backing node answers), any user gets in with `none`, `password` or
 * `publickey`, and a session's `shell` or `exec` prints `metastatic backing node <id> (<resourceId>)`
 * (exec: then the command line) and exits 0. SIGTERM/SIGINT close the server and exit 0.
 *
 * It deliberately does not watch its parent: a backing node outlives a crashed provider so that a restarted
 * one can adopt it from the state file.
 */
import { readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { parseArgs } from 'node:util';
import ssh2, { type AuthenticationType, type ServerChannel, type SessionAccept } from 'ssh2';
import { newEd25519PrivateKey } from './hostKey.ts';

const { utils } = ssh2;

interface Args {
  readonly id: string;
  readonly resource: string;
  readonly bootDelaySeconds: number;
  readonly host: string;
  readonly stateFile: string;
  readonly hostKeyFile: string;
}

interface HostKey {
  /** The private key as stored (OpenSSH format). */
  readonly privateKey: string;
  /** `<type> <base64>`, as in known_hosts and authorized_keys. */
  readonly publicKey: string;
}

function fail(message: string): never {
  process.stderr.write(`backing node: ${message}\n`);
  process.exit(2);
}

function parse(): Args {
  const { values } = parseArgs({
    options: {
      id: { type: 'string' },
      resource: { type: 'string' },
      'boot-delay': { type: 'string', default: '0' },
      host: { type: 'string', default: '127.0.0.1' },
      'state-file': { type: 'string' },
      'host-key-file': { type: 'string' },
    },
    strict: true,
    allowPositionals: false,
  });
  const { id, resource, host } = values;
  const stateFile = values['state-file'];
  if (!id) fail('--id is required');
  if (!resource) fail('--resource is required');
  if (!stateFile) fail('--state-file is required');
  const bootDelaySeconds = Number(values['boot-delay']);
  if (!Number.isFinite(bootDelaySeconds) || bootDelaySeconds < 0) {
    fail(`--boot-delay must be a non-negative number of seconds, got ${values['boot-delay']}`);
  }
  const hostKeyFile = values['host-key-file'] || `${stateFile.replace(/\.json$/, '')}.key`;
  return { id, resource, bootDelaySeconds, host: host ?? '127.0.0.1', stateFile, hostKeyFile };
}

/** Writes `record` merged over the existing state file (if any), atomically. */
async function writeState(path: string, record: Record<string, unknown>): Promise<void> {
  let existing: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(await readFile(path, 'utf8'));
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed))
      existing = parsed as Record<string, unknown>;
  } catch {
    // No record yet (or an unreadable one): write ours alone.
  }
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify({ ...existing, ...record }, null, 2)}\n`);
  await rename(tmp, path);
}

function toHostKey(privateKey: string, source: string): HostKey {
  const parsed = utils.parseKey(privateKey);
  if (parsed instanceof Error) throw new Error(`cannot parse host key ${source}: ${parsed.message}`);
  if (!parsed.isPrivateKey()) throw new Error(`host key ${source} is not a private key`);
  return { privateKey, publicKey: `${parsed.type} ${parsed.getPublicSSH().toString('base64')}` };
}

/** The host key stored at `path`, or a new ed25519 key written there (0600, atomically) if there is none. */
async function loadOrCreateHostKey(path: string): Promise<HostKey> {
  try {
    return toHostKey(await readFile(path, 'utf8'), path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const key = toHostKey(newEd25519PrivateKey(), 'just generated');
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    await writeFile(tmp, key.privateKey, { mode: 0o600 });
    await rename(tmp, path);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw err;
  }
  return key;
}

/** An SSH identification string carries no spaces, control or non-ASCII characters. */
function identFor(backingNodeId: string): string {
  return `metastatic_${backingNodeId.replace(/[^\x21-\x7e]/g, '_')}`;
}

/** The SSH side of the toy machine; every client and channel error is swallowed (it is the client's). */
function sshServer(args: Args, hostKey: HostKey): InstanceType<typeof ssh2.Server> {
  const greeting = `metastatic backing node ${args.id} (${args.resource})\n`;
  const allowed: AuthenticationType[] = ['none', 'password', 'publickey'];
  return new ssh2.Server({ hostKeys: [hostKey.privateKey], ident: identFor(args.id) }, (client) => {
    client.on('error', () => {});
    client.on('authentication', (ctx) => {
      if (allowed.includes(ctx.method)) ctx.accept();
      else ctx.reject(allowed);
    });
    client.on('ready', () => {
      client.on('session', (acceptSession) => {
        const session = acceptSession();
        let pty = false;
        // Replies are only owed when the client asked for one (accept is then undefined at run time).
        session.on('pty', (accept: SessionAccept | undefined) => {
          pty = true;
          accept?.();
        });
        session.on('env', (accept: SessionAccept | undefined) => accept?.());
        session.on('window-change', (accept: SessionAccept | undefined) => accept?.());
        const run = (channel: ServerChannel | undefined, output: string): void => {
          if (!channel) return;
          channel.on('error', () => {});
          // A terminal in raw mode needs CR LF.
          channel.write(pty ? output.replace(/\n/g, '\r\n') : output);
          channel.exit(0);
          channel.end();
        };
        session.on('shell', (accept) => run(accept(), greeting));
        session.on('exec', (accept, _reject, info) => run(accept(), `${greeting}${info.command}\n`));
      });
    });
  });
}

async function main(): Promise<void> {
  const args = parse();
  const startedAt = Date.now();
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  let bootTimer: NodeJS.Timeout | undefined;
  let stopping = false;

  // The provider may be gone (crashed) while we keep running: never die of a broken stdout/stderr pipe.
  process.stdout.on('error', () => {});
  process.stderr.on('error', () => {});

  const stop = (): void => {
    if (stopping) return;
    stopping = true;
    if (bootTimer) clearTimeout(bootTimer);
    for (const socket of sockets) socket.destroy();
    if (!server?.listening) process.exit(0);
    server.close(() => process.exit(0));
    // Should close hang for any reason, still go.
    setTimeout(() => process.exit(0), 2_000).unref();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);

  let hostKey: HostKey;
  try {
    hostKey = await loadOrCreateHostKey(args.hostKeyFile);
  } catch (err) {
    fail(`host key ${args.hostKeyFile}: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (stopping) return;
  const ssh = sshServer(args, hostKey);

  const listen = (): void => {
    bootTimer = undefined;
    // Our own listener hands each socket to the SSH server, so that stop() can destroy every connection.
    const srv = createServer((socket) => {
      sockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => sockets.delete(socket));
      ssh.injectSocket(socket);
    });
    server = srv;
    srv.on('error', (err) => fail(`server error: ${err.message}`));
    srv.listen(0, args.host, () => {
      const address = srv.address();
      if (!address || typeof address === 'string') fail('could not determine the listening port');
      const port = address.port;
      writeState(args.stateFile, {
        resourceId: args.resource,
        backingNodeId: args.id,
        pid: process.pid,
        host: args.host,
        port,
        state: 'running',
        hostKeys: [hostKey.publicKey],
        startedAt,
        readyAt: Date.now(),
      }).then(
        () => {
          if (!stopping) process.stdout.write(`HOSTKEY ${hostKey.publicKey}\nREADY ${port}\n`);
        },
        (err: unknown) => fail(`cannot write state file ${args.stateFile}: ${String(err)}`),
      );
    });
  };

  bootTimer = setTimeout(listen, args.bootDelaySeconds * 1000);
}

void main();
