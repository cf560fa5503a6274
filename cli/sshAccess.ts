import { randomBytes } from 'node:crypto';
import { chmod, mkdir, rename, stat, unlink, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { CliError } from './errors.ts';

/**
 * How the CLI lets OpenSSH into a node, for `metastatic ssh` (an ssh argument list) and `metastatic
 * inventory` (the same options, as Ansible's ansible_ssh_common_args): the node's recorded host keys as
 * the only known hosts, checked strictly, with one identity and no password. One place, so that what the
 * two trust cannot drift apart.
 */

/** A host as the CLI writes it into known_hosts and ssh options: an address or a DNS name, nothing else. */
const HOST = /^[A-Za-z0-9._:-]{1,253}$/;
/** A host key as records keep it: `<type> <base64>` (no comment: core/records.ts NodeRecord.hostKeys). */
const HOST_KEY = /^[a-z0-9@.-]{1,64} [A-Za-z0-9+/]{1,16384}={0,2}$/;

/** Why `host` cannot be written into known_hosts or ssh options, or undefined when it can. */
export function badHost(host: string): string | undefined {
  return HOST.test(host) ? undefined : `host ${JSON.stringify(host)} is not an address or a host name`;
}

/** Why `key` is not a host key as records keep them (`<type> <base64>`), or undefined when it is one. */
export function badHostKey(key: string): string | undefined {
  return HOST_KEY.test(key)
    ? undefined
    : `host key ${JSON.stringify(key.slice(0, 80))} is not "<type> <base64>"`;
}

/** The name known_hosts gives a host on a port: `host` on 22, `[host]:port` otherwise. */
export function knownHostName(host: string, port: number): string {
  return port === 22 ? host : `[${host}]:${port}`;
}

/**
 * known_hosts lines for hosts and their recorded host keys: `[host]:port type base64` (`host ...` on port
 * 22), each line once. A host or key that could add anything else to the file (a space, a newline, an
 * `@cert-authority` marker) is refused: the file decides whom ssh trusts.
 */
export function knownHostsText(
  entries: readonly { host: string; port: number; hostKeys: readonly string[] }[],
): string {
  const lines = new Set<string>();
  for (const { host, port, hostKeys } of entries) {
    const why = badHost(host) ?? hostKeys.map(badHostKey).find((b) => b !== undefined);
    if (why) throw new CliError(`cannot write a known_hosts entry: ${why}`);
    for (const key of hostKeys) lines.add(`${knownHostName(host, port)} ${key}\n`);
  }
  return [...lines].join('');
}

/** known_hosts lines for one host's recorded host keys (knownHostsText). */
export function knownHostsLines(host: string, port: number, hostKeys: readonly string[]): string {
  return knownHostsText([{ host, port, hostKeys }]);
}

/**
 * The ssh options that make the host keys of `knownHosts` the only ones trusted: strict checking, no
 * global file, no learning of new keys, no check of the address against other names; no password or
 * keyboard-interactive fallback.
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
 * Refuses a private key file others may read or write, as OpenSSH does ("UNPROTECTED PRIVATE KEY
 * FILE"), but with the reason and the fix in one line, before ssh is started.
 */
export async function checkIdentity(file: string): Promise<void> {
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

/**
 * Writes `text` to `file` readable by its owner only (0600), whole: a private temporary file beside it,
 * then renamed over it, so nobody ever reads a half-written file and a symbolic link at `file` is
 * replaced, never followed. `makeDir`: the directory is created (0700) if missing.
 */
export async function writePrivateFile(file: string, text: string, makeDir = false): Promise<void> {
  if (makeDir) await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  try {
    await writeFile(tmp, text, { mode: 0o600, flag: 'wx' });
    await chmod(tmp, 0o600); // the umask may have taken bits away, never added: still, be exact
    await rename(tmp, file);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw new CliError(`cannot write ${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
}
