/**
 * A local backing node's SSH host key: a new ed25519 key in OpenSSH's private-key format, built here from
 * node:crypto rather than with `ssh2`'s `utils.generateKeyPairSync('ed25519')`. That one strips leading
 * zero bytes from the public key, so about one key in 256 comes out malformed and `ssh2` itself then
 * refuses it ("Malformed OpenSSH private key"; mscdex/ssh2#1390, #1513): a backing node that drew such
 * a key died before it was ready.
 *
 * The format (OpenSSH's PROTOCOL.key, unencrypted): the magic `openssh-key-v1\0`, cipher and KDF `none`,
 * one public key, then the private section (two equal check integers, the key type, the 32-byte public
 * key, the 64-byte seed || public key, a comment) padded with 1, 2, 3, ... to a multiple of 8 bytes.
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes } from 'node:crypto';

const KEY_TYPE = 'ssh-ed25519';
const MAGIC = Buffer.from('openssh-key-v1\0', 'latin1');
const BLOCK_SIZE = 8;

/** An SSH `string`: a uint32 length, then the bytes. */
function sshString(value: Buffer | string): Buffer {
  const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
  const length = Buffer.alloc(4);
  length.writeUInt32BE(bytes.length);
  return Buffer.concat([length, bytes]);
}

function uint32(value: number): Buffer {
  const out = Buffer.alloc(4);
  out.writeUInt32BE(value >>> 0);
  return out;
}

/** The public key blob, as in known_hosts after the type: string type, string key. */
export function ed25519PublicBlob(publicKey: Buffer): Buffer {
  return Buffer.concat([sshString(KEY_TYPE), sshString(publicKey)]);
}

/**
 * The OpenSSH private key file (PEM armour, 70-column base64, trailing newline) of an ed25519 key given
 * its 32-byte seed and 32-byte public key. `checkInt` is the private section's check value (random in
 * a real file; fixed for tests).
 */
export function encodeEd25519PrivateKey(
  seed: Buffer,
  publicKey: Buffer,
  comment = '',
  checkInt: number = randomBytes(4).readUInt32BE(),
): string {
  if (seed.length !== 32) throw new RangeError(`an ed25519 seed is 32 bytes, got ${seed.length}`);
  if (publicKey.length !== 32) {
    throw new RangeError(`an ed25519 public key is 32 bytes, got ${publicKey.length}`);
  }
  const section = Buffer.concat([
    uint32(checkInt),
    uint32(checkInt),
    sshString(KEY_TYPE),
    sshString(publicKey),
    sshString(Buffer.concat([seed, publicKey])),
    sshString(comment),
  ]);
  const padLength = (BLOCK_SIZE - (section.length % BLOCK_SIZE)) % BLOCK_SIZE;
  const padding = Buffer.from(Array.from({ length: padLength }, (_, i) => i + 1));
  const body = Buffer.concat([
    MAGIC,
    sshString('none'),
    sshString('none'),
    sshString(Buffer.alloc(0)),
    uint32(1),
    sshString(ed25519PublicBlob(publicKey)),
    sshString(Buffer.concat([section, padding])),
  ]);
  const lines = body.toString('base64').match(/.{1,70}/g) ?? [];
  return `-----BEGIN OPENSSH PRIVATE KEY-----\n${lines.join('\n')}\n-----END OPENSSH PRIVATE KEY-----\n`;
}

/** An ed25519 private key in PKCS#8 DER: this fixed prefix, then the 32-byte seed (RFC 8410). */
const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');
/** An ed25519 public key in SPKI DER: this fixed prefix, then the 32-byte key (RFC 8410). */
const SPKI_ED25519_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

/**
 * The raw 32-byte seed and public key of a new ed25519 key pair, taken from the DER encodings the key
 * generation returns. Not from a KeyObject's JWK export: on Node 20, exporting a key its generation job
 * still references deadlocks when that export's allocation runs a full garbage collection, which
 * finalizes the job and takes the key's lock the export holds (the process hangs for good; reproduced
 * within seconds in a 40 MB heap, and seen in a test worker with a large one; Node 24 is not affected).
 */
export function newEd25519KeyPair(): { seed: Buffer; publicKey: Buffer } {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519', {
    privateKeyEncoding: { format: 'der', type: 'pkcs8' },
    publicKeyEncoding: { format: 'der', type: 'spki' },
  });
  const seed = withPrefix(privateKey, PKCS8_ED25519_PREFIX);
  const raw = withPrefix(publicKey, SPKI_ED25519_PREFIX);
  if (!seed || !raw) throw new Error('node:crypto encoded an ed25519 key in an unexpected form');
  return { seed, publicKey: raw };
}

/** The 32 bytes after `prefix`, when `der` is exactly that prefix and 32 bytes. */
function withPrefix(der: Buffer, prefix: Buffer): Buffer | undefined {
  if (der.length !== prefix.length + 32 || !der.subarray(0, prefix.length).equals(prefix)) return undefined;
  return Buffer.from(der.subarray(prefix.length));
}

/** A new ed25519 host key in OpenSSH's private-key format. */
export function newEd25519PrivateKey(comment = ''): string {
  const { seed, publicKey } = newEd25519KeyPair();
  return encodeEd25519PrivateKey(seed, publicKey, comment);
}

/** Reads SSH wire types from a buffer, failing on a short read. */
class SshReader {
  private at = 0;
  constructor(private readonly bytes: Buffer) {}
  uint32(): number {
    if (this.at + 4 > this.bytes.length) throw new Error('truncated');
    const value = this.bytes.readUInt32BE(this.at);
    this.at += 4;
    return value;
  }
  string(): Buffer {
    const length = this.uint32();
    if (this.at + length > this.bytes.length) throw new Error('truncated');
    const value = this.bytes.subarray(this.at, this.at + length);
    this.at += length;
    return value;
  }
}

/**
 * The public key (`ssh-ed25519 <base64>`, as in known_hosts) of an unencrypted ed25519 key in OpenSSH's
 * private-key format, checked as `ssh2` would check it (the check integers agree, the private section
 * repeats the public key) and more (the seed derives that public key, by node:crypto), so that a local
 * backing node knows its host key without loading `ssh2` before its first connection. Undefined for any
 * other kind of key (another type, a passphrase, PEM), which the caller parses with `ssh2`; throws for an
 * ed25519 key file that is damaged.
 */
export function ed25519PublicKeyOf(privateKey: string): string | undefined {
  const armour =
    /^-----BEGIN OPENSSH PRIVATE KEY-----\s+([A-Za-z0-9+/=\s]+?)\s*-----END OPENSSH PRIVATE KEY-----\s*$/.exec(
      privateKey.trim(),
    );
  if (!armour?.[1]) return undefined;
  const body = Buffer.from(armour[1].replace(/\s+/g, ''), 'base64');
  if (!body.subarray(0, MAGIC.length).equals(MAGIC)) return undefined;
  try {
    const file = new SshReader(body.subarray(MAGIC.length));
    if (file.string().toString('latin1') !== 'none') return undefined; // a passphrase
    file.string(); // KDF
    file.string(); // KDF options
    if (file.uint32() !== 1) return undefined;
    const blob = file.string();
    const section = file.string();
    const pub = new SshReader(blob);
    if (pub.string().toString('latin1') !== KEY_TYPE) return undefined;
    const publicKey = pub.string();
    const priv = new SshReader(section);
    const check = priv.uint32();
    if (priv.uint32() !== check) throw new Error('its check integers differ');
    if (priv.string().toString('latin1') !== KEY_TYPE) throw new Error('its private key is of another type');
    if (!priv.string().equals(publicKey)) throw new Error('its private section holds another public key');
    const pair = priv.string();
    if (publicKey.length !== 32 || pair.length !== 64 || !pair.subarray(32).equals(publicKey)) {
      throw new Error('its key sizes are not those of ed25519');
    }
    const derived = createPublicKey(
      createPrivateKey({
        key: Buffer.concat([PKCS8_ED25519_PREFIX, pair.subarray(0, 32)]),
        format: 'der',
        type: 'pkcs8',
      }),
    ).export({ format: 'der', type: 'spki' });
    if (!withPrefix(derived, SPKI_ED25519_PREFIX)?.equals(publicKey)) {
      throw new Error('its seed does not make its public key');
    }
    return `${KEY_TYPE} ${blob.toString('base64')}`;
  } catch (err) {
    throw new Error(
      `malformed OpenSSH ed25519 private key: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
}
