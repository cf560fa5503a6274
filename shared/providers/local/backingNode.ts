/**
 * The program a local backing node runs: the embedded pool's stand-in for an EC2 instance. The local
 * provider spawns it as a child process (built, or bundled from the sources by bin/fromSources.mjs):
 *
 *   backingNode.ts --id <backingNodeId> --resource <resourceId> --boot-delay <seconds> --host 127.0.0.1
 *                  --state-file <path> [--host-key-file <path>] [--authorized-keys-file <path>]
 *                  [--live-file <path>] [--work-dir <path>]
 *
 * (The last four default to the state file's path with `.key`, `.authorized_keys`, `.live` and `.work`
 * in place of `.json`.) It loads its SSH host key from the host-key file, or generates an ed25519 key
 * there (mode 0600) on its first start, so a restarted process keeps its key. It then waits boot-delay
 * seconds ("booting"), serves SSH on a TCP port the OS chooses, writes its state file atomically (tmp +
 * rename, merged into whatever record the provider already wrote; with `hostKeys: ["<type> <base64>"]`)
 * and prints `HOSTKEY <type> <base64>` then `READY <port>` on stdout.
 *
 * SSH: the identification line is `SSH-2.0-metastatic_<backingNodeId>` (so `nc 127.0.0.1 PORT` shows
 * which backing node answers). One process on one port serves every slot: user `slot<N>` is slot N
 * (liveSlots.ts), let in only with public-key authentication by a key of the authorized-keys file, and
 * only while the live file names a node on that slot. A session runs commands for real (slotProcess.ts:
 * `/bin/sh -c` in the slot's working directory `<work-dir>/slot<N>` (0700) with METASTATIC_NODE_ID and
 * METASTATIC_SLOT set, exit status or signal returned, a pty through `script`) and serves the `sftp`
 * subsystem (sftpServer.ts), so `scp` works. The slot's directory holds a link `~slot<N>` -> `.` (homeLink:
 * `~slot<N>` is no system user, so a shell leaves that word as it is, and Ansible uses it as the home). Every process a connection started ends when it closes;
 * once the live file no longer names its node on its slot (released), its connection and processes end
 * and the slot's directory is removed. Only what the live file says ends anything: a file that cannot be
 * read (EMFILE) leaves every slot as it was. Connections that have not logged in are bounded
 * (loginGate.ts: a grace time, a count, per address), every connection by the listener's maxConnections.
 *
 * SIGHUP re-reads the live file and the authorized keys. SIGTERM/SIGINT end every session's processes,
 * close the server and exit 0. It deliberately does not watch its parent: a backing node outlives a
 * crashed provider so that a restarted one can adopt it from the state file.
 */
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { dirname, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { SlotLimits } from '../../core/slotLimits.ts';
import { LIVE_POLL_MS } from './liveSlots.ts';
import { LoginGate, MAX_CONNECTIONS } from './loginGate.ts';
import { type AllowedKey, type HostKey, loadAuthorizedKeys, loadOrCreateHostKey } from './nodeKeys.ts';
import { Slots } from './nodeSlots.ts';
import {
  containmentUnavailable,
  type IsolationMode,
  rootlessUnavailable,
  SlotIsolation,
} from './slotIsolation.ts';
import { endGroup, KILL_GRACE_MS, signalGroup } from './slotProcess.ts';

interface Args {
  readonly id: string;
  readonly resource: string;
  readonly bootDelaySeconds: number;
  readonly host: string;
  readonly stateFile: string;
  readonly hostKeyFile: string;
  readonly authorizedKeysFile: string;
  readonly liveFile: string;
  readonly workDir: string;
  readonly isolation: IsolationMode;
  readonly limits: SlotLimits;
  readonly slotProgram: string;
  /** Without root: what the jobs must not see, the pool's state directory (hideOf). */
  readonly hideDir: string;
}

/**
 * The pool's state directory (`<state-dir>/local/<id>.json` -> `<state-dir>`), hidden from rootless jobs;
 * where that is a directory the slot replaces anyway (`/tmp`, `/home`), the state file's own directory.
 */
function hideOf(stateFile: string): string {
  const stateDir = dirname(dirname(resolve(stateFile)));
  return ['/', '/tmp', '/var/tmp', '/home', '/dev/shm'].includes(stateDir)
    ? dirname(resolve(stateFile))
    : stateDir;
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
      'authorized-keys-file': { type: 'string' },
      'live-file': { type: 'string' },
      'work-dir': { type: 'string' },
      isolation: { type: 'string', default: 'none' },
      'slot-limits': { type: 'string', default: '0,0,0' },
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
  const isolation = values.isolation;
  if (isolation !== 'auto' && isolation !== 'contain' && isolation !== 'none' && isolation !== 'rootless') {
    fail(`--isolation must be auto, contain, none or rootless, got ${isolation}`);
  }
  const limits = (values['slot-limits'] ?? '').split(',');
  if (limits.length !== 3 || !limits.every((n) => /^(0|[1-9]\d{0,9})$/.test(n))) {
    fail(`--slot-limits must be MILLICORES,MEMORY_MIB,PIDS (whole numbers), got ${values['slot-limits']}`);
  }
  const [millicores, memoryMiB, pids] = limits.map(Number) as [number, number, number];
  const base = stateFile.replace(/\.json$/, '');
  return {
    id,
    resource,
    bootDelaySeconds,
    host: host ?? '127.0.0.1',
    stateFile,
    hostKeyFile: values['host-key-file'] || `${base}.key`,
    authorizedKeysFile: values['authorized-keys-file'] || `${base}.authorized_keys`,
    liveFile: values['live-file'] || `${base}.live`,
    workDir: values['work-dir'] || `${base}.work`,
    isolation,
    limits: { millicores, memoryMiB, pids },
    slotProgram: `${base}.slot`,
    hideDir: hideOf(stateFile),
  };
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

/**
 * The containment of this backing node's slots, or undefined (said on stderr when `auto` cannot): as
 * root where it runs as root; else, for `auto`, without root (user and mount namespaces: no uid of their
 * own, no limits, said once); `contain` fails where root's is not possible.
 */
async function isolationOf(args: Args): Promise<SlotIsolation | undefined> {
  if (args.isolation === 'none') return undefined;
  const why = args.isolation === 'rootless' ? 'rootless asked for' : containmentUnavailable();
  if (why === undefined) {
    const full = await installed(args);
    const reason = await probed(full, args);
    if (reason === undefined) return full;
    if (args.isolation === 'contain') fail(`isolation: contain, but ${reason}`);
    return rootless(args, reason);
  }
  if (args.isolation === 'contain') fail(`isolation: contain, but ${why}`);
  return rootless(args, why);
}

/** Slots contained without root, or undefined where even that is refused (said, with `why` full is not). */
async function rootless(args: Args, why: string): Promise<SlotIsolation | undefined> {
  const unavailable = rootlessUnavailable();
  const isolation = unavailable === undefined ? await installed(args, { hide: args.hideDir }) : undefined;
  const reason = unavailable ?? (isolation && (await probed(isolation, args)));
  if (reason !== undefined || !isolation) {
    process.stderr.write(`backing node: slots are not contained: ${why}; ${reason}\n`);
    return undefined;
  }
  if (args.isolation !== 'rootless') {
    process.stderr.write(
      `backing node: slots are contained without root (${why}): each has its own /home/slot<N>, /tmp and processes and cannot see the pool's state, but runs as this user, with no cores or memory limit\n`,
    );
  }
  return isolation;
}

async function installed(args: Args, rootlessOf?: { hide: string }): Promise<SlotIsolation> {
  try {
    return await SlotIsolation.install(args.slotProgram, args.id, args.limits, rootlessOf);
  } catch (err) {
    fail(`cannot write the slot program ${args.slotProgram}: ${String(err)}`);
  }
}

/** Why the slot program cannot contain a slot here (its probe's reason), or undefined when it can. */
async function probed(isolation: SlotIsolation, args: Args): Promise<string | undefined> {
  try {
    await mkdir(args.workDir, { recursive: true, mode: 0o700 });
    await isolation.probe(args.workDir);
    return undefined;
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
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

  // Installed first: SIGHUP's default action would end the process (a SIGHUP this early finds no file yet).
  let reload = async (): Promise<void> => {};
  process.on('SIGHUP', () => void reload());
  const slots = new Slots(args.liveFile, args.workDir, await isolationOf(args));
  let keys: readonly AllowedKey[] = [];
  reload = async (): Promise<void> => {
    keys = (await loadAuthorizedKeys(args.authorizedKeysFile)) ?? keys;
    await slots.reload();
  };

  const stop = (): void => {
    if (stopping) return;
    stopping = true;
    if (bootTimer) clearTimeout(bootTimer);
    clearInterval(poll);
    // Every session's processes end with the node: SIGHUP now, SIGKILL to what is left before exiting.
    const groups = [...slots.logins].flatMap((login) => [...login.groups]);
    for (const pgid of groups) endGroup(pgid);
    for (const socket of sockets) socket.destroy();
    const exit = (): void => {
      for (const pgid of groups) signalGroup(pgid, 'SIGKILL');
      // A contained slot's processes end with their cgroup, which goes too: nothing is left on the host.
      void slots.removeAll().finally(() => process.exit(0));
    };
    const exitAfterGrace = (): void => {
      if (groups.length === 0) exit();
      else setTimeout(exit, KILL_GRACE_MS);
    };
    if (!server?.listening) {
      exitAfterGrace();
      return;
    }
    server.close(exitAfterGrace);
    // Should close hang for any reason, still go.
    setTimeout(exit, KILL_GRACE_MS + 2_000).unref();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  // The signal is a prompt; the file is re-read now and then anyway (a signal sent while we started).
  const poll = setInterval(() => void slots.reload(), LIVE_POLL_MS);

  let hostKey: HostKey;
  try {
    hostKey = await loadOrCreateHostKey(args.hostKeyFile);
  } catch (err) {
    fail(`host key ${args.hostKeyFile}: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (stopping) return;
  await reload();
  // The SSH server (and ssh2, a third of this process's start) is loaded when a connection first comes.
  let ssh: Promise<{ injectSocket(socket: Socket): void }> | undefined;
  const gate = new LoginGate((message) => process.stderr.write(`backing node: ${message}\n`));
  const sshFor = () =>
    (ssh ??= import('./nodeSshServer.ts').then(({ sshServer }) =>
      sshServer(args.id, hostKey, slots, {
        keys: () => keys,
        stopping: () => stopping,
        exchanged: (address, port) => gate.exchanged(address, port),
        loggedIn: (address, port) => gate.loggedIn(address, port),
      }),
    ));
  // Accepting can fail (EMFILE: out of descriptors) without the listener being broken: said, not fatal.
  let acceptFailedAt = Number.NEGATIVE_INFINITY;
  const acceptFailed = (err: Error): void => {
    if (Date.now() - acceptFailedAt < 10_000) return;
    acceptFailedAt = Date.now();
    process.stderr.write(`backing node: cannot accept a connection: ${err.message}\n`);
  };

  const listen = (): void => {
    bootTimer = undefined;
    // Our own listener hands each socket to the SSH server, so that stop() can destroy every connection.
    const srv = createServer((socket) => {
      sockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => sockets.delete(socket));
      gate.admit(socket);
      // Until the server takes it, the socket holds what the client sends (nothing reads it).
      sshFor().then(
        (server) => {
          if (!socket.destroyed) server.injectSocket(socket);
        },
        (err: unknown) => fail(`cannot load the SSH server: ${String(err)}`),
      );
    });
    server = srv;
    srv.maxConnections = MAX_CONNECTIONS;
    srv.on('error', (err) => (srv.listening ? acceptFailed(err) : fail(`server error: ${err.message}`)));
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
