import { type ChildProcess, type StdioOptions, spawn } from 'node:child_process';
import { rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { shellQuote } from '../shared/core/text.ts';
import { MetastaticError, NodeUnreachableError } from './errors.ts';
import type { PoolNode } from './records.ts';
import { makeSshDir, sweepStaleSshDirsOnce } from './sshDirs.ts';

/**
 * Logging in to a node with the real OpenSSH client, verified: the node's recorded host keys are the only
 * known hosts (a known_hosts written for the call, 0600 in a private temporary directory, removed after),
 * StrictHostKeyChecking=yes, IdentitiesOnly=yes, no password. `metastatic ssh` and `metastatic run` both
 * log in through here.
 */

/** A private key file that cannot be used: missing, not a file, or readable by others. */
export class IdentityError extends MetastaticError {}

/** Where and as whom to log in to a node, and the host keys to verify it by. */
export interface SshLogin {
  readonly nodeId: string;
  readonly host: string;
  readonly port: number;
  readonly user: string;
  readonly hostKeys: readonly string[];
}

/**
 * The login of a ready node (as `user`, else its `username`). NodeUnreachableError when its record
 * lacks a host, a port, a user or host keys: an unverifiable host is never logged in to.
 */
export function loginOf(node: PoolNode, user?: string): SshLogin {
  const name = user ?? node.username;
  if (!name) throw new NodeUnreachableError(`node ${node.id} records no username: pass --user NAME`);
  if (!node.host || node.port === null)
    throw new NodeUnreachableError(`node ${node.id} records no host and port`);
  const bad = badHost(node.host) ?? (user === undefined ? badUser(name) : undefined);
  if (bad) throw new NodeUnreachableError(`node ${node.id}: ${bad}`);
  if (node.hostKeys.length === 0) {
    throw new NodeUnreachableError(
      `node ${node.id} records no host keys: its host cannot be verified, so ssh is not run`,
    );
  }
  return { nodeId: node.id, host: node.host, port: node.port, user: name, hostKeys: node.hostKeys };
}

/**
 * Refuses a private key file others may read or write, as OpenSSH does ("UNPROTECTED PRIVATE KEY
 * FILE"), but with the reason and the fix in one line, before ssh is started.
 */
export async function checkIdentity(file: string): Promise<void> {
  let mode: number;
  try {
    const s = await stat(file);
    if (!s.isFile()) throw new IdentityError(`identity ${file} is not a file`);
    mode = s.mode & 0o777;
  } catch (err) {
    if (err instanceof IdentityError) throw err;
    throw new IdentityError(
      `cannot read the identity ${file}: ${(err as NodeJS.ErrnoException).code ?? err}`,
    );
  }
  if (mode & 0o077) {
    throw new IdentityError(
      `permissions 0${mode.toString(8)} for identity ${file} are too open: a private key must be ` +
        `readable by you only, or ssh ignores it (chmod 600 ${file})`,
    );
  }
}

/**
 * A host as known_hosts and ssh take it: an address or a DNS name, nothing else. It starts with a letter
 * or a digit, or is an IPv6 address starting `::`: never `-`, which ssh would read as an option.
 */
const HOST = /^(?:[A-Za-z0-9][A-Za-z0-9._:-]{0,252}|::[0-9A-Fa-f:.]{0,251})$/;
/** A user name as a record keeps it (the configuration's rule, any case): nothing ssh reads otherwise. */
const USER = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$/;
/** A host key as records keep it: `<type> <base64>` (no comment). */
const HOST_KEY = /^[a-z0-9@.-]{1,64} [A-Za-z0-9+/]{1,16384}={0,2}$/;

/** Why `host` cannot be written into known_hosts or ssh options, or undefined when it can. */
export function badHost(host: string): string | undefined {
  return HOST.test(host) ? undefined : `host ${JSON.stringify(host)} is not an address or a host name`;
}

/** Why a recorded user name cannot be passed to ssh, or undefined when it can. */
export function badUser(user: string): string | undefined {
  return USER.test(user) ? undefined : `user ${JSON.stringify(user)} is not a user name`;
}

/** Why `key` is not a host key as records keep them (`<type> <base64>`), or undefined when it is one. */
export function badHostKey(key: string): string | undefined {
  return HOST_KEY.test(key)
    ? undefined
    : `host key ${JSON.stringify(key.slice(0, 80))} is not "<type> <base64>"`;
}

/**
 * known_hosts lines for hosts and their recorded host keys: `[host]:port type base64` (`host ...` on port
 * 22), each line once. NodeUnreachableError for a host or key that could add anything else to the file
 * (a space, a newline, an `@cert-authority` marker): the file decides whom ssh trusts.
 */
export function knownHostsText(
  entries: readonly { host: string; port: number; hostKeys: readonly string[] }[],
): string {
  const lines = new Set<string>();
  for (const { host, port, hostKeys } of entries) {
    const why = badHost(host) ?? hostKeys.map(badHostKey).find((b) => b !== undefined);
    if (why) throw new NodeUnreachableError(`cannot write a known_hosts entry: ${why}`);
    const name = port === 22 ? host : `[${host}]:${port}`;
    for (const key of hostKeys) lines.add(`${name} ${key}\n`);
  }
  return [...lines].join('');
}

/** known_hosts lines for the node's recorded host keys (knownHostsText). */
export function knownHostsLines(host: string, port: number, hostKeys: readonly string[]): string {
  return knownHostsText([{ host, port, hostKeys }]);
}

/**
 * The ssh options that make the host keys of `knownHosts` the only ones trusted: strict checking, no
 * global file, no learning of new keys, no check of the address against other names; no password or
 * keyboard-interactive fallback. `metastatic inventory` gives Ansible the same (ansible_ssh_common_args).
 */
export function hostTrustOptions(knownHosts: string): string[] {
  return [
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
  ];
}

/** The ssh options that log in with this private key only (no agent's or default keys tried first). */
export function identityOptions(identity: string): string[] {
  return ['-i', identity, '-o', 'IdentitiesOnly=yes'];
}

/**
 * The ssh argument list: the node's host, port and user, this identity and known_hosts only. The
 * destination comes after `--`, so neither it nor the command is ever read as an option.
 */
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
    ...identityOptions(identity),
    ...hostTrustOptions(knownHosts),
    '--',
    node.host,
    ...command,
  ];
}

export { shellQuote };

/**
 * The command line a POSIX login shell (sh, bash, dash, ksh, zsh) reads back as exactly `argv`, each
 * element one word whatever it holds (spaces, quotes, `$`, `;`, newlines), after exporting `env`. It ends
 * with `exit $?`, so the shell waits for the command instead of exec'ing it: a command killed by signal n
 * then ends the session with status 128+n, which OpenSSH's client returns (an exit-signal from sshd
 * would make it exit 255, whatever the signal).
 */
export function remoteCommandLine(
  argv: readonly string[],
  env: Readonly<Record<string, string>> = {},
): string {
  if (argv.length === 0) throw new Error('no command');
  const exports = Object.entries(env).map(([k, v]) => {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new Error(`not an environment variable name: ${k}`);
    return `${k}=${shellQuote(v)}`;
  });
  return `${exports.length > 0 ? `export ${exports.join(' ')}; ` : ''}${argv.map(shellQuote).join(' ')}; exit $?`;
}

export interface SshRunOptions {
  /** The private key file (checked: 0600). */
  readonly identity: string;
  /** Default: inherit this process's stdin, stdout and stderr (byte for byte, nothing added). */
  readonly stdio?: StdioOptions;
  /** Ends ssh (SIGTERM) when it fires. */
  readonly signal?: AbortSignal;
  /** Told of the ssh process once it started (to pass signals on, say). */
  readonly onSpawn?: (child: ChildProcess) => void;
  /** Seconds ssh waits to connect and for the node's SSH banner (ConnectTimeout; default 10). */
  readonly connectTimeout?: number;
}

/**
 * The ssh options that keep it from waiting forever on a node that does not answer: a ConnectTimeout
 * (the TCP connection and the banner), then keepalives that end a session whose node went silent for a
 * minute (exit 255), where a lease renewed all along would keep the node forever.
 */
export function livenessOptions(connectTimeout = 10): string[] {
  const seconds = Math.max(1, Math.ceil(connectTimeout));
  return ['-o', `ConnectTimeout=${seconds}`, '-o', 'ServerAliveInterval=15', '-o', 'ServerAliveCountMax=4'];
}

/**
 * Runs OpenSSH's `ssh` to `login` with `remote` as its command arguments (none: a login shell) and
 * resolves with how ssh ended. The caller quotes: ssh joins its arguments with spaces and the remote shell
 * reads them again (`remoteCommandLine` makes one argument that reads back as an argv).
 */
export async function runSsh(
  login: SshLogin,
  remote: readonly string[],
  opts: SshRunOptions,
): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  await checkIdentity(opts.identity);
  await sweepStaleSshDirsOnce(); // those a `kill -9` left (once per process)
  const dir = await makeSshDir();
  const knownHosts = join(dir, 'known_hosts');
  try {
    await writeFile(knownHosts, knownHostsLines(login.host, login.port, login.hostKeys), { mode: 0o600 });
    const args = [
      ...livenessOptions(opts.connectTimeout),
      ...sshArgs(login, opts.identity, knownHosts, remote),
    ];
    const child = spawn('ssh', args, {
      stdio: opts.stdio ?? 'inherit',
    });
    const onAbort = () => child.kill('SIGTERM');
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const ended = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
        child.once('error', (err: NodeJS.ErrnoException) =>
          reject(
            new MetastaticError(
              err.code === 'ENOENT' ? 'ssh (OpenSSH) is not installed or not on PATH' : `ssh: ${err.message}`,
              { cause: err },
            ),
          ),
        );
        child.once('exit', (code, signal) => resolve({ code, signal }));
      });
      opts.onSpawn?.(child);
      if (opts.signal?.aborted) onAbort();
      return await ended;
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
