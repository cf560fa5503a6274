import type { ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import { loginOf, runSsh } from '../../client/openssh.ts';
import { toPoolNode } from '../../client/records.ts';
import { parseNodeId } from '../../shared/core/ids.ts';
import type { NodeRecord } from '../../shared/core/records.ts';
import { clientKeyPath } from '../../shared/runtime/clientKey.ts';
import { connect, type PoolClient, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { sleep } from '../output.ts';
import { nonUtf8Argument } from '../rawArgv.ts';
import { human, terminalText } from '../terminal.ts';

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
      throw new CliError(human`node ${nodeId} is ${node.state}${why}: there is nothing to log in to`);
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
  const notText = nonUtf8Argument(command, undefined, 'metastatic ssh');
  if (notText) throw new CliError(notText, 2);
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
  if (!opts.user && !node.username) {
    throw new CliError(`node ${nodeId} records no username: pass --user NAME`, 2);
  }
  const login = loginOf(toPoolNode(node), opts.user);
  // Ctrl-C reaches ssh from the terminal itself; a signal sent to this process alone is passed on.
  let child: ChildProcess | undefined;
  const forward = (signal: NodeJS.Signals) => () => child?.kill(signal);
  const onTerm = forward('SIGTERM');
  const onHup = forward('SIGHUP');
  const onInt = () => {};
  process.on('SIGTERM', onTerm);
  process.on('SIGHUP', onHup);
  process.on('SIGINT', onInt);
  try {
    const ended = await runSsh(login, command, {
      identity,
      onSpawn: (c) => {
        child = c;
      },
    });
    process.exitCode = exitStatus(ended);
  } finally {
    process.off('SIGTERM', onTerm);
    process.off('SIGHUP', onHup);
    process.off('SIGINT', onInt);
  }
}

/** A process's end as a shell reports it: its code, or 128 + n when signal n killed it. */
export function exitStatus(ended: { code: number | null; signal: NodeJS.Signals | null }): number {
  return ended.signal ? 128 + (signalNumber(ended.signal) ?? 0) : (ended.code ?? 1);
}

export function signalNumber(signal: NodeJS.Signals): number | undefined {
  return constants.signals[signal];
}
