/**
 * A local backing node's keys: its SSH host key (kept in a file across restarts) and the public keys a
 * login may present (the authorized-keys file the pool writes). Used by backingNode.ts.
 */
import { readFile, rename, unlink, writeFile } from 'node:fs/promises';
import ssh2 from 'ssh2';
import { newEd25519PrivateKey } from './hostKey.ts';

const { utils } = ssh2;

export interface HostKey {
  /** The private key as stored (OpenSSH format). */
  readonly privateKey: string;
  /** `<type> <base64>`, as in known_hosts and authorized_keys. */
  readonly publicKey: string;
}

function toHostKey(privateKey: string, source: string): HostKey {
  const parsed = utils.parseKey(privateKey);
  if (parsed instanceof Error) throw new Error(`cannot parse host key ${source}: ${parsed.message}`);
  if (!parsed.isPrivateKey()) throw new Error(`host key ${source} is not a private key`);
  return { privateKey, publicKey: `${parsed.type} ${parsed.getPublicSSH().toString('base64')}` };
}

/** The host key stored at `path`, or a new ed25519 key written there (0600, atomically) if there is none. */
export async function loadOrCreateHostKey(path: string): Promise<HostKey> {
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

/** A public key a login may present, parsed once. */
export interface AllowedKey {
  readonly blob: Buffer;
  readonly key: ssh2.ParsedKey;
}

/**
 * The keys of the authorized-keys file (the embedded pool's client key and the pool's configured keys,
 * one OpenSSH public key line each); unreadable or unparsable lines are skipped with a warning.
 */
export async function loadAuthorizedKeys(path: string): Promise<AllowedKey[]> {
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
