/**
 * The program a local backing node runs: the embedded stack's stand-in for an EC2 instance. The local
 * provider spawns it as a child process (node + the tsx loader):
 *
 *   backingNode.ts --id <backingNodeId> --resource <resourceId> --boot-delay <seconds> --host 127.0.0.1
 *                  --state-file <path>
 *
 * It waits boot-delay seconds ("booting"), listens on a TCP port the OS chooses, writes its state file
 * atomically (tmp + rename, merged into whatever record the provider already wrote) and prints
 * `READY <port>` on stdout. Each connection gets a greeting line and then an echo, so `nc 127.0.0.1 PORT`
 * shows which backing node answers. SIGTERM/SIGINT close the server and exit 0.
 *
 * It deliberately does not watch its parent: a backing node outlives a crashed provider so that a restarted
 * one can adopt it from the state file.
 */
import { readFile, rename, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { parseArgs } from 'node:util';

interface Args {
  readonly id: string;
  readonly resource: string;
  readonly bootDelaySeconds: number;
  readonly host: string;
  readonly stateFile: string;
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
  return { id, resource, bootDelaySeconds, host: host ?? '127.0.0.1', stateFile };
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

function main(): void {
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

  const listen = (): void => {
    bootTimer = undefined;
    const srv = createServer((socket) => {
      sockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => sockets.delete(socket));
      socket.write(`metastatic backing node ${args.id} (${args.resource})\n`);
      socket.pipe(socket);
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
        startedAt,
        readyAt: Date.now(),
      }).then(
        () => {
          if (!stopping) process.stdout.write(`READY ${port}\n`);
        },
        (err: unknown) => fail(`cannot write state file ${args.stateFile}: ${String(err)}`),
      );
    });
  };

  bootTimer = setTimeout(listen, args.bootDelaySeconds * 1000);
}

main();
