/**
 * A local backing node's keys: its SSH host key (kept in a file across restarts) and the public keys a
 * login may present (the authorized-keys file the pool writes). Used by backingNode.ts.
 *
 * Neither loads `ssh2` for the keys this pool writes (an ed25519 host key, OpenSSH public-key lines):
 * a backing node loads it at its first connection (nodeSshServer.ts), and most backing nodes of a test
 * run or of a pool whose jobs do not log in never have one. Loading it is ~0.09 CPU-s of a backing
 * node's ~0.23 to READY (measured here on Node 20), paid by every launch.
 */
import { readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { ed25519PublicKeyOf, newEd25519PrivateKey } from './hostKey.ts';

export interface HostKey {
  /** The private key as stored (OpenSSH format). */
  readonly privateKey: string;
  /** `<type> <base64>`, as in known_hosts and authorized_keys. */
  readonly publicKey: string;
}

async function toHostKey(privateKey: string, source: string): Promise<HostKey> {
  let ed25519: string | undefined;
  try {
    ed25519 = ed25519PublicKeyOf(privateKey);
  } catch (err) {
    throw new Error(`cannot parse host key ${source}: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (ed25519) return { privateKey, publicKey: ed25519 };
  // Another kind of key (one an operator put there): ssh2 says what it is.
  const { default: ssh2 } = await import('ssh2');
  const parsed = ssh2.utils.parseKey(privateKey);
  if (parsed instanceof Error) throw new Error(`cannot parse host key ${source}: ${parsed.message}`);
  if (!parsed.isPrivateKey()) throw new Error(`host key ${source} is not a private key`);
  return { privateKey, publicKey: `${parsed.type} ${parsed.getPublicSSH().toString('base64')}` };
}

/** The host key stored at `path`, or a new ed25519 key written there (0600, atomically) if there is none. */
export async function loadOrCreateHostKey(path: string): Promise<HostKey> {
  try {
    return await toHostKey(await readFile(path, 'utf8'), path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const key = await toHostKey(newEd25519PrivateKey(), 'just generated');
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

/**
 * A public key a login may present: its blob, to compare with the one a client offers, and its line,
 * which the SSH server parses (with `ssh2`) when a client offers that blob.
 */
export interface AllowedKey {
  readonly blob: Buffer;
  readonly line: string;
}

/** A public key line as `ssh2` reads one (`<type> <base64> [comment]`); the blob must name the same type. */
const PUBLIC_KEY_LINE =
  /^((?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp(?:256|384|521))(?:-cert-v0[01]@openssh\.com)?) ([A-Za-z0-9/+=]+)(?:$|\s+(\S.*)?)$/;

function blobOf(line: string): Buffer | undefined {
  const match = PUBLIC_KEY_LINE.exec(line.trim());
  if (!match?.[1] || !match[2]) return undefined;
  const blob = Buffer.from(match[2], 'base64');
  if (blob.length < 4) return undefined;
  const typeLength = blob.readUInt32BE(0);
  if (blob.subarray(4, 4 + typeLength).toString('latin1') !== match[1]) return undefined;
  return blob;
}

/**
 * The keys of the authorized-keys file (the embedded pool's client key and the pool's configured keys,
 * one OpenSSH public key line each); lines that are not such a line are skipped with a warning. (A line of
 * the right form whose key `ssh2` cannot parse is refused, with a warning, when a client offers it.) No
 * file is no key; a file that cannot be read now (EMFILE under a connection flood) is undefined: the
 * caller keeps the keys it had.
 */
export async function loadAuthorizedKeys(path: string): Promise<AllowedKey[] | undefined> {
  let text = '';
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    process.stderr.write(`backing node: cannot read ${path}: ${String(err)}\n`);
    return undefined;
  }
  const keys: AllowedKey[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '' || line.startsWith('#')) continue;
    const blob = blobOf(line);
    if (!blob) {
      process.stderr.write(
        `backing node: skipping an authorized key it cannot parse: ${line.slice(0, 40)}\n`,
      );
      continue;
    }
    keys.push({ blob, line: line.trim() });
  }
  return keys;
}
