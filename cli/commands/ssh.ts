import { spawn } from 'node:child_process';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseNodeId } from '../../shared/core/ids.ts';
import type { NodeRecord } from '../../shared/core/records.ts';
import { clientKeyPath } from '../../shared/runtime/clientKey.ts';
import { connect, type PoolClient, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { sleep } from '../output.ts';
import { terminalText } from '../terminal.ts';

export interface SshOptions {
  /** Private key file; default: the embedded pool's client key (`<state-dir>/client_ed25519`). */
  readonly identity?: string;
  /** Log in as this user instead of the node's `username`. */
  readonly user?: string;
  /** Seconds to wait for a pending node to become ready. */
  readonly timeout: number;
}

const POLL_MS = 500;

/**
 * The node to log in to, once it is ready: waits (progress on stderr) while it is pending, up to
 * `timeoutSeconds`; refuses an unknown, ended or unreachable node with the reason.
 */
async function readyNode(client: PoolClient, nodeId: string, timeoutSeconds: number): Promise<NodeRecord> {
  const parsed = parseNodeId(nodeId);
  if (!parsed)
    throw new CliError(`"${nodeId}" is not a node id (node ids look like <request-id>/<index>)`, 2);
  const deadline = Date.now() + timeoutSeconds * 1000;
  let said = '';
  for (;;) {
    const request = await client.store.getRequest(parsed.requestId);
    const node = request?.nodes.find((n) => n.id === nodeId);
    if (!request) throw new CliError(`no node ${nodeId}: there is no request ${parsed.requestId}`);
    if (!node && request.state !== 'requested') {
      throw new CliError(
        `no node ${nodeId}: request ${parsed.requestId} has ${request.nodes.length} node(s)`,
      );
    }
    if (node?.state === 'ready') {
      if (said) process.stderr.write('\n');
      return node;
    }
    if (node && (node.state === 'released' || node.state === 'failed')) {
      const why = node.reason ? ` (${node.reason})` : '';
      throw new CliError(`node ${nodeId} is ${node.state}${why}: there is nothing to log in to`);
    }
    const state = node?.state ?? request.state;
    if (Date.now() >= deadline) {
      if (said) process.stderr.write('\n');
      throw new CliError(`node ${nodeId} is still ${state} after ${timeoutSeconds} s (--timeout)`);
    }
    if (said !== state) {
      process.stderr.write(terminalText(`${said ? '\n' : ''}waiting for node ${nodeId} (${state})`));
      said = state;
    } else process.stderr.write('.');
    await sleep(POLL_MS);
  }
}

/**
 * Refuses a private key file others may read or write, as OpenSSH does ("UNPROTECTED PRIVATE KEY
 * FILE"), but with the reason and the fix in one line, before ssh is started.
 */
async function checkIdentity(file: string): Promise<void> {
  let mode: number;
  try {
    const s = await stat(file);
    if (!s.isFile()) throw new CliError(`identity ${file} is not a file`);
    mode = s.mode & 0o777;
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new CliError(`cannot read the identity ${file}: ${(err as NodeJS.ErrnoException).code ?? err}`);
  }
  if (mode & 0o077) {
    throw new CliError(
      `permissions 0${mode.toString(8)} for identity ${file} are too open: a private key must be ` +
        `readable by you only, or ssh ignores it (chmod 600 ${file})`,
    );
  }
}

/** known_hosts lines for the node's recorded host keys: `[host]:port type base64` (`host ...` on port 22). */
export function knownHostsLines(host: string, port: number, hostKeys: readonly string[]): string {
  const name = port === 22 ? host : `[${host}]:${port}`;
  return hostKeys.map((key) => `${name} ${key}\n`).join('');
}

/** The ssh argument list: the node's host, port and user, this identity and known_hosts only. */
export function sshArgs(
  node: { host: string; port: number; user: string },
  identity: string,
  knownHosts: string,
  command: readonly string[],
): string[] {
  return [
    '-p',
    String(node.port),
    '-l',
    node.user,
    '-i',
    identity,
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    'StrictHostKeyChecking=yes',
    '-o',
    `UserKnownHostsFile=${knownHosts}`,
    '-o',
    'GlobalKnownHostsFile=/dev/null',
    '-o',
    'UpdateHostKeys=no',
    '-o',
    'CheckHostIP=no',
    '-o',
    'PasswordAuthentication=no',
    '-o',
    'KbdInteractiveAuthentication=no',
    node.host,
    ...(command.length > 0 ? ['--', ...command] : []),
  ];
}

/**
 * `metastatic ssh NODE-ID [-- COMMAND...]`: runs OpenSSH's `ssh` to the node with its recorded host
 * keys as the only known hosts (a known_hosts file written for this call, 0600, removed after) and
 * exits with ssh's exit status (128 + n if ssh itself dies of signal n).
 */
export async function ssh(
  target: Target,
  nodeId: string,
  command: string[],
  opts: SshOptions,
): Promise<void> {
  const identity = opts.identity ?? (target.stack ? undefined : clientKeyPath(target.stateDir));
  if (!identity)
    throw new CliError('against a stack, pass the private key to log in with: --identity FILE', 2);
  const client = await connect(target);
  let node: NodeRecord;
  try {
    node = await readyNode(client, nodeId, opts.timeout);
  } finally {
    client.close();
  }
  const user = opts.user ?? node.username;
  if (!user) throw new CliError(`node ${nodeId} records no username: pass --user NAME`, 2);
  if (!node.host || node.port === undefined) throw new CliError(`node ${nodeId} records no host and port`);
  if (!node.hostKeys?.length) {
    throw new CliError(`node ${nodeId} records no host keys: its host cannot be verified, so ssh is not run`);
  }
  await checkIdentity(identity);

  const dir = await mkdtemp(join(tmpdir(), 'metastatic-ssh-'));
  const knownHosts = join(dir, 'known_hosts');
  try {
    await writeFile(knownHosts, knownHostsLines(node.host, node.port, node.hostKeys), { mode: 0o600 });
    const child = spawn(
      'ssh',
      sshArgs({ host: node.host, port: node.port, user }, identity, knownHosts, command),
      {
        stdio: 'inherit',
      },
    );
    // Ctrl-C reaches ssh from the terminal itself; a signal sent to this process alone is passed on.
    const forward = (signal: NodeJS.Signals) => () => child.kill(signal);
    const onTerm = forward('SIGTERM');
    const onHup = forward('SIGHUP');
    const onInt = () => {};
    process.on('SIGTERM', onTerm);
    process.on('SIGHUP', onHup);
    process.on('SIGINT', onInt);
    try {
      const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
        child.once('error', (err: NodeJS.ErrnoException) =>
          reject(
            new CliError(
              err.code === 'ENOENT' ? 'ssh (OpenSSH) is not installed or not on PATH' : `ssh: ${err.message}`,
            ),
          ),
        );
        child.once('exit', (c, s) => resolve([c, s]));
      });
      process.exitCode = signal ? 128 + (signalNumber(signal) ?? 0) : (code ?? 1);
    } finally {
      process.off('SIGTERM', onTerm);
      process.off('SIGHUP', onHup);
      process.off('SIGINT', onInt);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function signalNumber(signal: NodeJS.Signals): number | undefined {
  return constants.signals[signal];
}
