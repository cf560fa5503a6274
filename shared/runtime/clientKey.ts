import { chmod, link, readFile, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import ssh2 from 'ssh2';
import { encodeEd25519PrivateKey, newEd25519KeyPair } from '../providers/local/hostKey.ts';

/**
 * The embedded pool's own SSH client key: `<stateDir>/client_ed25519` (private, 0600) and
 * `client_ed25519.pub`, made by the first `metastatic dev` on a state dir and reused after. Every local
 * backing node lets it in (besides its pool's `authorized-keys`); `metastatic ssh` logs in with it.
 */
export const CLIENT_KEY_FILE = 'client_ed25519';

export function clientKeyPath(stateDir: string): string {
  return join(stateDir, CLIENT_KEY_FILE);
}

export interface ClientKey {
  /** The private key file (0600). */
  readonly privateKeyFile: string;
  /** `ssh-ed25519 <base64> <comment>`, as in authorized_keys. */
  readonly publicKey: string;
}

/** The public key line of the private key in `text`, or an Error saying why there is none. */
function publicLineOf(text: string, comment: string): string | Error {
  const parsed = ssh2.utils.parseKey(text);
  const key = Array.isArray(parsed) ? parsed[0] : parsed;
  if (!key || key instanceof Error) return new Error(key ? key.message : 'no key');
  if (!key.isPrivateKey()) return new Error('not a private key');
  return `${key.type} ${key.getPublicSSH().toString('base64')} ${comment}`;
}

/**
 * The client key of `stateDir`, made if there is none. The private file is created whole and exclusively
 * (written to a temporary name, then hard-linked into place, which fails if another process made one
 * first: that one is then used). An unreadable or unparsable existing key is an error, not replaced.
 */
export async function ensureClientKey(stateDir: string): Promise<ClientKey> {
  const privateKeyFile = clientKeyPath(stateDir);
  const comment = `metastatic-dev@${stateDir}`.replace(/\s/g, '_');
  let text: string | undefined;
  try {
    text = await readFile(privateKeyFile, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  if (text === undefined) {
    const { seed, publicKey } = newEd25519KeyPair();
    const made = encodeEd25519PrivateKey(seed, publicKey, comment);
    const tmp = `${privateKeyFile}.${process.pid}.tmp`;
    await writeFile(tmp, made, { mode: 0o600 });
    try {
      await link(tmp, privateKeyFile);
      text = made;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      text = await readFile(privateKeyFile, 'utf8');
    } finally {
      await unlink(tmp).catch(() => {});
    }
  }
  // OpenSSH refuses a private key others can read: keep ours private even if a copy loosened it.
  await chmod(privateKeyFile, 0o600);
  const publicKey = publicLineOf(text, comment);
  if (publicKey instanceof Error) {
    throw new Error(`the client key ${privateKeyFile} cannot be used: ${publicKey.message}`);
  }
  await writeFile(`${privateKeyFile}.pub`, `${publicKey}\n`, { mode: 0o644 });
  return { privateKeyFile, publicKey };
}
