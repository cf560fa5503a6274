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
 * and the slot's directory is removed.
 *
 * SIGHUP re-reads the live file and the authorized keys. SIGTERM/SIGINT end every session's processes,
 * close the server and exit 0. It deliberately does not watch its parent: a backing node outlives a
 * crashed provider so that a restarted one can adopt it from the state file.
 */
import { chmod, mkdir, readFile, rename, rm, symlink, unlink, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import ssh2, { type SessionAccept } from 'ssh2';
import { newEd25519PrivateKey } from './hostKey.ts';
import { LIVE_POLL_MS, parseLiveSlots, slotOfUser, slotUser } from './liveSlots.ts';
import { serveSftp } from './sftpServer.ts';
import { endGroup, KILL_GRACE_MS, type PtyInfo, runOnChannel, signalGroup } from './slotProcess.ts';

const { utils } = ssh2;

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
      'authorized-keys-file': { type: 'string' },
      'live-file': { type: 'string' },
      'work-dir': { type: 'string' },
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

/** A public key a login may present, parsed once. */
interface AllowedKey {
  readonly blob: Buffer;
  readonly key: ssh2.ParsedKey;
}

/**
 * The keys of the authorized-keys file (the embedded pool's client key and the pool's configured keys,
 * one OpenSSH public key line each); unreadable or unparsable lines are skipped with a warning.
 */
async function loadAuthorizedKeys(path: string): Promise<AllowedKey[]> {
  let text = '';
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
      process.stderr.write(`backing node: cannot read ${path}: ${String(err)}\n`);
    }
    return [];
  }
  const keys: AllowedKey[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '' || line.startsWith('#')) continue;
    const parsed = utils.parseKey(line);
    const key = Array.isArray(parsed) ? parsed[0] : parsed;
    if (!key || key instanceof Error) {
      process.stderr.write(
        `backing node: skipping an authorized key it cannot parse: ${line.slice(0, 40)}\n`,
      );
      continue;
    }
    keys.push({ blob: key.getPublicSSH(), key });
  }
  return keys;
}

/** A logged-in connection: the slot and node it is for, and the process groups its sessions started. */
interface Login {
  readonly slot: number;
  readonly nodeId: string;
  readonly dir: string;
  readonly end: () => void;
  readonly groups: Set<number>;
}

/** How long a login waits for its slot to be live (the pool writes the file just after the node is ready). */
const LOGIN_WAIT_MS = 2_000;
const LOGIN_POLL_MS = 100;
/** Environment variables a client may set (as sshd's default AcceptEnv). */
const ACCEPTED_ENV = /^(LANG|LC_[A-Z]+)$/;

/**
 * The slots as the live file says, re-read on demand; when a slot's node changes, every login for the old
 * node ends and its working directory is moved aside and removed, so the next node starts empty.
 */
class Slots {
  private slots: Readonly<Record<string, string>> = {};
  private reading: Promise<void> | undefined;
  readonly logins = new Set<Login>();

  constructor(
    private readonly liveFile: string,
    private readonly workDir: string,
  ) {}

  nodeOn(slot: number): string | undefined {
    return this.slots[String(slot)];
  }

  /** Re-reads the live file (one read at a time; a missing or unreadable file means no live slot). */
  reload(): Promise<void> {
    this.reading ??= this.read().finally(() => {
      this.reading = undefined;
    });
    return this.reading;
  }

  /** The node on `slot`, waiting up to LOGIN_WAIT_MS for the pool to name one. */
  async waitFor(slot: number): Promise<string | undefined> {
    const deadline = Date.now() + LOGIN_WAIT_MS;
    for (;;) {
      await this.reload();
      const node = this.nodeOn(slot);
      if (node !== undefined || Date.now() >= deadline) return node;
      await new Promise((resolve) => setTimeout(resolve, LOGIN_POLL_MS));
    }
  }

  /**
   * The slot's working directory, made private (0700) if it is not there yet, with its `~slot<N>` link
   * (homeLink) in place.
   */
  async dirOf(slot: number): Promise<string> {
    const dir = join(this.workDir, slotUser(slot));
    await mkdir(this.workDir, { recursive: true, mode: 0o700 });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    await homeLink(dir, slotUser(slot));
    return dir;
  }

  private async read(): Promise<void> {
    let next: Readonly<Record<string, string>> = {};
    try {
      next = parseLiveSlots(await readFile(this.liveFile, 'utf8'))?.slots ?? {};
    } catch {
      // No file yet (or it is being replaced): nothing is live.
    }
    const before = this.slots;
    this.slots = next;
    for (const login of this.logins) {
      if (next[String(login.slot)] !== login.nodeId) login.end();
    }
    for (const [slot, node] of Object.entries(before)) {
      if (next[slot] !== node) await this.clear(Number(slot));
    }
  }

  /** Moves a slot's directory aside (its next node gets a fresh one at once) and removes it in the background. */
  private async clear(slot: number): Promise<void> {
    const dir = join(this.workDir, slotUser(slot));
    const gone = join(this.workDir, `.gone-${slotUser(slot)}-${Date.now()}-${process.pid}`);
    try {
      await rename(dir, gone);
    } catch {
      return; // Never logged into: nothing to clear.
    }
    // After the old node's processes had their SIGKILL, so none writes into it while it goes.
    setTimeout(() => void rm(gone, { recursive: true, force: true }).catch(() => {}), KILL_GRACE_MS + 200);
  }
}

/**
 * `<dir>/~<user>` -> `.`, so that the word `~slot<N>` names the slot's directory from it. A client that
 * asks the node for a user's home does it the POSIX way, `echo ~slot<N>` (Ansible, for its remote_tmp
 * and every `~/` path a task names), and a shell expands `~name` only for a name the system's user
 * database knows. `slot<N>` is not a system user (a local node runs as you, without root), so POSIX
 * leaves the word as it is: `~slot0`, a relative path, which Ansible then uses from the login directory.
 * Without the link it made a directory literally named `~slot0` there, and `dest: ~/f` wrote
 * `~slot0/f`; with it both land where `HOME` is. Recreated at every login, so removing it is harmless.
 */
async function homeLink(dir: string, user: string): Promise<void> {
  try {
    await symlink('.', join(dir, `~${user}`));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
}

/** The environment of a slot's processes: the backing process's own, without the pool's variables. */
function slotEnv(login: Login, extra: Readonly<Record<string, string>>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith('METASTATIC_')) env[key] = value;
  }
  return {
    ...env,
    ...extra,
    HOME: login.dir,
    PWD: login.dir,
    METASTATIC_NODE_ID: login.nodeId,
    METASTATIC_SLOT: String(login.slot),
  };
}

/**
 * The SSH side of a local backing node. Public-key authentication only, as `slot<N>` for a live slot N,
 * with a key of the authorized-keys file; every client and channel error is swallowed (it is the client's).
 */
function sshServer(
  args: Args,
  hostKey: HostKey,
  slots: Slots,
  keys: () => readonly AllowedKey[],
  stopping: () => boolean,
): InstanceType<typeof ssh2.Server> {
  return new ssh2.Server({ hostKeys: [hostKey.privateKey], ident: identFor(args.id) }, (client) => {
    client.on('error', () => {});
    let login: Login | undefined;
    client.on('authentication', (ctx) => {
      if (ctx.method !== 'publickey' || stopping()) return ctx.reject(['publickey']);
      const slot = slotOfUser(ctx.username);
      const allowed = slot === undefined ? undefined : keys().find((k) => k.blob.equals(ctx.key.data));
      if (slot === undefined || !allowed) return ctx.reject(['publickey']);
      // Without a signature the client only asks whether this key would do.
      if (!ctx.signature || !ctx.blob) return ctx.accept();
      if (allowed.key.verify(ctx.blob, ctx.signature, ctx.hashAlgo) !== true)
        return ctx.reject(['publickey']);
      void (async () => {
        const nodeId = await slots.waitFor(slot);
        if (nodeId === undefined || stopping()) return ctx.reject(['publickey']);
        const dir = await slots.dirOf(slot);
        const groups = new Set<number>();
        login = {
          slot,
          nodeId,
          dir,
          groups,
          end: () => {
            for (const pgid of groups) endGroup(pgid);
            client.end();
          },
        };
        ctx.accept();
      })().catch((err: unknown) => {
        process.stderr.write(`backing node: login as ${ctx.username} failed: ${String(err)}\n`);
        ctx.reject(['publickey']);
      });
    });
    client.on('ready', () => {
      const current = login;
      if (!current) return void client.end();
      slots.logins.add(current);
      // The slot may have been released between the check and now.
      if (slots.nodeOn(current.slot) !== current.nodeId) return current.end();
      client.on('close', () => {
        slots.logins.delete(current);
        for (const pgid of current.groups) endGroup(pgid);
      });
      client.on('session', (acceptSession) => {
        const session = acceptSession();
        let pty: PtyInfo | undefined;
        const env: Record<string, string> = {};
        const sessionGroups = new Set<number>();
        const track = (pgid: number, started: boolean): void => {
          for (const set of [current.groups, sessionGroups]) {
            if (started) set.add(pgid);
            else set.delete(pgid);
          }
        };
        const options = () => ({ cwd: current.dir, env: slotEnv(current, env), track });
        // Replies are only owed when the client asked for one (accept is then undefined at run time).
        session.on('pty', (accept: SessionAccept | undefined, _reject, info) => {
          pty = { term: info.term, rows: info.rows, cols: info.cols };
          accept?.();
        });
        session.on('env', (accept: SessionAccept | undefined, reject: (() => void) | undefined, info) => {
          if (ACCEPTED_ENV.test(info.key)) {
            env[info.key] = info.val;
            accept?.();
          } else reject?.();
        });
        session.on('window-change', (accept: SessionAccept | undefined) => accept?.());
        session.on('signal', (accept: SessionAccept | undefined, _reject, info) => {
          const name = `SIG${info.name.replace(/^SIG/, '')}` as NodeJS.Signals;
          for (const pgid of sessionGroups) {
            try {
              process.kill(-pgid, name);
            } catch {
              // Gone, or not a signal this system knows.
            }
          }
          accept?.();
        });
        session.on('exec', (accept, _reject, info) => {
          const channel = accept();
          if (!channel) return;
          channel.on('error', () => {});
          runOnChannel(channel, info.command, pty, options());
        });
        session.on('shell', (accept) => {
          const channel = accept();
          if (!channel) return;
          channel.on('error', () => {});
          runOnChannel(channel, undefined, pty, options());
        });
        session.on('sftp', (accept) => {
          const sftp = accept();
          if (sftp) serveSftp(sftp, current.dir);
        });
        session.on('subsystem', (_accept, reject) => reject?.());
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

  const slots = new Slots(args.liveFile, args.workDir);
  let keys: readonly AllowedKey[] = [];
  const reload = async (): Promise<void> => {
    keys = await loadAuthorizedKeys(args.authorizedKeysFile);
    await slots.reload();
  };
  // Installed first: SIGHUP's default action would end the process.
  process.on('SIGHUP', () => void reload());

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
      process.exit(0);
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
  const ssh = sshServer(
    args,
    hostKey,
    slots,
    () => keys,
    () => stopping,
  );

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
