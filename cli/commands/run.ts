import { constants } from 'node:os';
import {
  AbortedError,
  InvalidInputError,
  MetastaticError,
  NodeLostError,
  NodeUnreachableError,
  PoolStoppedError,
  RequestExistsError,
  RequestFailedError,
  TimeoutError,
  UnknownLabelError,
} from '../../client/errors.ts';
import { newRequestId, requestMessage } from '../../client/messages.ts';
import { checkIdentity, loginOf, remoteCommandLine, runSsh, type SshLogin } from '../../client/openssh.ts';
import { DEFAULT_RUN_LEASE } from '../../client/options.ts';
import { PoolClient } from '../../client/poolClient.ts';
import type { ReadyNode } from '../../client/readyNode.ts';
import { clientKeyPath } from '../../shared/runtime/clientKey.ts';
import { poolTarget, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { nonUtf8Argument } from '../rawArgv.ts';
import { terminalText } from '../terminal.ts';
import { asUsageError, type RequestOptions, requestSpecOf, waitProgress } from './request.ts';
import { exitStatus } from './ssh.ts';

/**
 * `metastatic run [LABEL... | --cores/--memory/--disk] -- COMMAND...`: the one command a CI step needs.
 * Requests nodes with a lease, waits for them (progress on stderr), runs COMMAND on the first over
 * OpenSSH exactly as `metastatic ssh` logs in, renews the lease while it runs, releases the request
 * whatever happens, and exits with the command's status. The work is the client library's `run`
 * (client/poolClient.ts); here, the command line, OpenSSH, signals and exit codes.
 */

/** Exit codes of `metastatic run` besides the command's own (documented in --help and docs/cli.md). */
export const RUN_EXIT = {
  /** A usage error: bad options, no command, labels the pool does not have. Nothing is held. */
  usage: 2,
  /** The pool stopped, or ended the node (released by someone else, lease lapsed), under the command. */
  poolStopped: 123,
  /** No node could be had: the request failed (its reason printed) or --timeout passed first. */
  noNode: 124,
  /** metastatic run failed for a reason of its own before the command ran: no pool, a refused key... */
  ownFailure: 125,
} as const;

export interface RunCommandOptions extends Omit<RequestOptions, 'wait' | 'json'> {
  /** Private key to log in with (default: the embedded pool's client key). */
  readonly identity?: string;
  /** Log in as this user instead of the node's `username`. */
  readonly user?: string;
  /** No progress lines on stderr (errors are still printed). */
  readonly quiet?: boolean;
  /** Run on a request of `--id` already in the table (refused otherwise), and release it after. */
  readonly attach?: boolean;
}

/** The POSIX shells `run`'s quoting is right for; a node's `shellType` null means sh. */
const POSIX_SHELLS = new Set([null, 'sh']);

const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

export async function run(
  target: Target,
  labels: string[],
  command: string[],
  opts: RunCommandOptions,
): Promise<void> {
  if (command.length === 0) {
    throw new CliError('give the command to run after --: metastatic run LABEL -- COMMAND [ARGS...]', 2);
  }
  const notText = nonUtf8Argument(command);
  if (notText) throw new CliError(notText, RUN_EXIT.usage);
  const spec = {
    ...requestSpecOf(labels, opts),
    id: opts.id ?? newRequestId(),
    lease: opts.lease ?? DEFAULT_RUN_LEASE,
  };
  try {
    requestMessage(spec);
  } catch (err) {
    throw asUsageError(err);
  }
  const identity = opts.identity ?? (target.stack ? undefined : clientKeyPath(target.stateDir));
  if (!identity)
    throw new CliError('against a stack, pass the private key to log in with: --identity FILE', 2);
  const say = (text: string) => {
    if (!opts.quiet) process.stderr.write(terminalText(`metastatic: ${text}\n`));
  };

  // A signal ends the wait or the command (ssh is sent SIGTERM), then the request is released, then
  // this process exits 128 + n. Later signals while releasing are taken, not obeyed: the release is short.
  const aborter = new AbortController();
  let received: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    if (received) return;
    received = signal;
    say(`${signal}: ending the command and releasing its nodes`);
    aborter.abort(signal);
  };
  for (const s of SIGNALS) process.on(s, onSignal);
  try {
    await checkIdentity(identity).catch((err) => {
      throw new CliError((err as Error).message, RUN_EXIT.ownFailure);
    });
    const pool = await PoolClient.connect(poolTarget(target)).catch((err) => {
      throw new CliError((err as Error).message, err instanceof InvalidInputError ? 2 : RUN_EXIT.ownFailure);
    });
    const progress = opts.quiet ? undefined : waitProgress(spec.id);
    try {
      let requestId: string | undefined;
      const status = await pool.run(
        spec,
        async (nodes, { request, signal }) => {
          progress?.done();
          requestId = request.id;
          const [first] = nodes;
          if (!first) throw new MetastaticError(`request ${request.id} has no node`);
          if (!POSIX_SHELLS.has(first.shellType)) {
            throw new MetastaticError(
              `node ${first.id}'s shell-type is ${first.shellType}: metastatic run quotes the command for a POSIX sh`,
            );
          }
          const login = loginOf(first, opts.user);
          say(`running on ${first.id} (${login.user}@${login.host}:${login.port})`);
          for (const n of nodes.slice(1)) say(`  also ${n.id} (${n.username}@${n.host}:${n.port})`);
          const line = remoteCommandLine(command, {
            METASTATIC_REQUEST_ID: request.id,
            METASTATIC_NODES: nodesVariable(nodes),
          });
          await loginAccepted(login, identity, signal, LOGIN_WAIT_MS);
          const ended = await runSsh(login, [line], { identity, signal });
          const code = exitStatus(ended);
          // ssh's own 255 is also what a dropped connection gives: a pool that stopped, a node released.
          if (code === 255 && !signal.aborted) await pool.checkHeld(request.id, 3000);
          return code;
        },
        {
          timeout: opts.timeout,
          signal: aborter.signal,
          attach: opts.attach === true,
          ...(progress ? { onProgress: progress.show } : {}),
          onReleaseError: (err) =>
            say(
              `warning: could not release ${requestId ?? 'the request'}: ${(err as Error).message} (its lease will)`,
            ),
        },
      );
      progress?.done();
      if (requestId) say(`released ${requestId}`);
      process.exitCode = status;
    } finally {
      progress?.done(); // a wait that failed leaves no half-drawn progress line on a terminal
      pool.close();
    }
  } catch (err) {
    throw runError(err, received);
  } finally {
    for (const s of SIGNALS) process.off(s, onSignal);
  }
}

/** How long `run` waits for a ready node to accept its login: past it, `run` fails (exit 125). */
const LOGIN_WAIT_MS = 30_000;

/**
 * Waits until the node lets this key in (ssh ... true exits 0), trying every half second for up to
 * `waitMs`: a node is recorded ready a moment before its host has taken it in (a local backing node told
 * of its live slots, an EC2 instance's per-slot user made by cloud-init), and the command must not be
 * lost to that moment. Nothing of these tries reaches stdout or stderr. The deadline holds during an
 * attempt too (one that hangs, on a node that accepts the connection and never speaks, is killed): past
 * it, NodeUnreachableError with ssh's last complaint, and the command is not run.
 */
export async function loginAccepted(login: SshLogin, identity: string, signal: AbortSignal, waitMs: number) {
  const deadline = Date.now() + waitMs;
  let why = 'no answer';
  for (;;) {
    const left = deadline - Date.now();
    if (signal.aborted) return; // the caller ends the job
    if (left <= 0) {
      throw new NodeUnreachableError(
        `node ${login.nodeId} (${login.user}@${login.host}:${login.port}) did not accept the login within ${waitMs / 1000} s: ${why}`,
      );
    }
    const attempt = AbortSignal.any([signal, AbortSignal.timeout(left)]);
    let stderr = '';
    const tried = await runSsh(login, ['true'], {
      identity,
      signal: attempt,
      connectTimeout: Math.min(10, left / 1000),
      stdio: ['ignore', 'ignore', 'pipe'],
      onSpawn: (child) => child.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d).slice(-2000))),
    });
    if (tried.code !== null && tried.code !== 255) return;
    const said = stderr.trim().split('\n').at(-1)?.trim();
    why = said || (tried.signal ? 'ssh got no answer in time' : `ssh exited ${tried.code}`);
    await new Promise((r) => setTimeout(r, Math.min(500, Math.max(0, deadline - Date.now()))));
  }
}

/** METASTATIC_NODES: one line per node, `<id> <host> <port> <username>`, the node it runs on first. */
function nodesVariable(nodes: readonly ReadyNode[]): string {
  return nodes.map((n) => `${n.id} ${n.host} ${n.port} ${n.username}`).join('\n');
}

/** How `run` ends when the command did not give its status: the message and the exit code. */
export function runError(err: unknown, received: NodeJS.Signals | undefined): CliError {
  if (received && (err instanceof AbortedError || !(err instanceof MetastaticError))) {
    return new CliError(`stopped by ${received}`, 128 + (constants.signals[received] ?? 0));
  }
  if (err instanceof CliError) return err;
  if (err instanceof InvalidInputError) {
    const usage = asUsageError(err);
    return usage instanceof CliError ? usage : new CliError(err.message, RUN_EXIT.usage);
  }
  if (err instanceof UnknownLabelError) return new CliError(err.message, RUN_EXIT.usage);
  if (err instanceof RequestExistsError) {
    const hint = 'give a new --id, or --attach to run on it (and release it after)';
    return new CliError(`${err.message} (another job's id?): ${hint}`, RUN_EXIT.usage);
  }
  if (err instanceof RequestFailedError) {
    return new CliError(`no node could be had: ${err.message}`, RUN_EXIT.noNode);
  }
  if (err instanceof TimeoutError) {
    return new CliError(`no node could be had: ${err.message}`, RUN_EXIT.noNode);
  }
  if (err instanceof PoolStoppedError) {
    return new CliError(`the pool stopped under the command: ${err.message}`, RUN_EXIT.poolStopped);
  }
  if (err instanceof NodeLostError) {
    return new CliError(`the pool ended the node under the command: ${err.message}`, RUN_EXIT.poolStopped);
  }
  return new CliError((err as Error).message ?? String(err), RUN_EXIT.ownFailure);
}
