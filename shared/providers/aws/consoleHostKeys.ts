/**
 * The SSH host keys cloud-init prints to an EC2 instance's serial console at first boot (its
 * `write-ssh-key-fingerprints` step, `ssh_keys_to_console`), read back with GetConsoleOutput. Pure: the
 * decoded console text in, the keys or why there are none out; no SDK, no clock.
 *
 * The block, as cloud-init writes it through `logger --stderr -t ec2` (each line may carry the syslog
 * prefix `<14>Jun  1 00:00:00 ec2: `, an older `ec2: `, or none; a serial console ends lines with CRLF):
 *
 *     -----BEGIN SSH HOST KEY KEYS-----
 *     ecdsa-sha2-nistp256 AAAAE2VjZHNh... root@ip-10-0-0-1
 *     ssh-ed25519 AAAAC3NzaC1lZDI1NTE5... root@ip-10-0-0-1
 *     -----END SSH HOST KEY KEYS-----
 *
 * The FINGERPRINTS block printed just before it holds hashes, not keys, and is never read.
 *
 * Strict where a mistake would hand out a wrong key, lenient where the console is only noisy:
 * - Only a complete block counts (BEGIN ... END). None yet, or one whose END has not been printed yet
 *   (the output is read while the instance boots) is "not yet", never an error.
 * - Lines inside the block that are not key lines (kernel messages interleaved on the serial line, empty
 *   lines) are skipped. A line that names a key type but whose key does not decode to that type's SSH
 *   wire form (cut short, garbled) makes the block invalid: a key is taken whole or not at all.
 * - A block printed twice (a reboot runs the step again) must list the same keys; two blocks that differ
 *   are invalid (which boot's keys the host holds now cannot be told from the console).
 * - Bounded: at most MAX_CONSOLE_HOST_KEYS keys, key lines of at most MAX_KEY_LINE_CHARS characters, and
 *   only the last MAX_CONSOLE_CHARS characters of the output are read (EC2 keeps the last 64 KB).
 * - `ssh-dss` keys (OpenSSH no longer accepts them) and key types this does not know are left out.
 */

import type { ReportedHostKeys } from '../../core/provider.ts';

/** More keys than any sshd offers (one per algorithm); a record carries them on every node. */
export const MAX_CONSOLE_HOST_KEYS = 8;
/** A 16384-bit RSA key is about 2,800 characters of base64; a longer key line is not a host key. */
export const MAX_KEY_LINE_CHARS = 4096;
/** EC2 returns at most the last 64 KB of console output; more than this is not read. */
export const MAX_CONSOLE_CHARS = 128 * 1024;

export const BEGIN_KEYS = '-----BEGIN SSH HOST KEY KEYS-----';
export const END_KEYS = '-----END SSH HOST KEY KEYS-----';

/**
 * `none`: no complete host-key block in the output (yet). `keys`: as `<type> <base64>` (the known_hosts
 * form, without the comment), in the order printed. `invalid`: a complete block that cannot be trusted.
 */
export type ConsoleHostKeys = ReportedHostKeys;

/** Key types taken from the block, with the number of SSH strings their public key blob holds. */
const KEY_TYPES: ReadonlyMap<string, number> = new Map([
  ['ssh-ed25519', 2], // name, key
  ['ecdsa-sha2-nistp256', 3], // name, curve, point
  ['ecdsa-sha2-nistp384', 3],
  ['ecdsa-sha2-nistp521', 3],
  ['ssh-rsa', 3], // name, e, n
]);
/** `<14>Jun  1 00:00:00 ` (syslog priority and time, from `logger --stderr`), then `ec2: `, each optional. */
const PREFIX = /^(?:<\d{1,3}>)?(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )?(?:ec2:(?: |$))?/;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** The host keys in decoded console output (see the module comment for the rules). */
export function parseConsoleHostKeys(output: string): ConsoleHostKeys {
  const text = output.length > MAX_CONSOLE_CHARS ? output.slice(-MAX_CONSOLE_CHARS) : output;
  const blocks: string[][] = [];
  let open: string[] | undefined;
  for (const rawLine of text.split('\n')) {
    const line = rawLine.replace(/\r+$/, '').replace(PREFIX, '').trim();
    if (line === BEGIN_KEYS) {
      open = []; // a block cut short by a new one (a reboot mid-print) is dropped
      continue;
    }
    if (open === undefined) continue; // outside a block, or its BEGIN fell off the kept output
    if (line === END_KEYS) {
      blocks.push(open);
      open = undefined;
      continue;
    }
    const key = keyLine(line);
    if (key === undefined) continue;
    if ('invalid' in key) return { kind: 'invalid', reason: key.invalid };
    if (!open.includes(key.key)) open.push(key.key);
    if (open.length > MAX_CONSOLE_HOST_KEYS) {
      return { kind: 'invalid', reason: `the host-key block lists more than ${MAX_CONSOLE_HOST_KEYS} keys` };
    }
  }
  const [first, ...others] = blocks;
  if (first === undefined) return { kind: 'none' };
  if (first.length === 0) return { kind: 'invalid', reason: 'the host-key block lists no key' };
  const same = (keys: readonly string[]) =>
    keys.length === first.length && keys.every((k) => first.includes(k));
  if (!others.every(same)) {
    return { kind: 'invalid', reason: 'the console shows two host-key blocks with different keys' };
  }
  return { kind: 'keys', keys: first };
}

/**
 * A key line of the block: `{ key }`, `{ invalid }` for a line that names a key type but holds no such
 * key, undefined for a line that is not a key line (noise) or a key of a type left out.
 */
function keyLine(line: string): { key: string } | { invalid: string } | undefined {
  // `<type> <base64> [comment]`: the comment (user@host) is not part of the key.
  const [type = '', data] = line.split(/[ \t]+/);
  const parts = KEY_TYPES.get(type);
  if (parts === undefined) return undefined; // noise, or ssh-dss and other types left out
  const bad = (why: string) => ({ invalid: `a ${type} line of the host-key block ${why}` });
  if (line.length > MAX_KEY_LINE_CHARS) return bad(`is longer than ${MAX_KEY_LINE_CHARS} characters`);
  if (data === undefined || !BASE64.test(data)) return bad('holds no base64 key');
  const blob = Buffer.from(data, 'base64');
  const strings = sshStrings(blob);
  if (strings === undefined || strings.length !== parts || strings[0] !== type) {
    return bad(`holds a key that is not a ${type} public key`);
  }
  if (type.startsWith('ecdsa-sha2-') && strings[1] !== type.slice('ecdsa-sha2-'.length)) {
    return bad('names another curve in its key');
  }
  return { key: `${type} ${data}` };
}

/**
 * The SSH wire-format strings (uint32 length + bytes) a public key blob is made of, the first one
 * decoded as text; undefined when the blob is not exactly a sequence of them.
 */
function sshStrings(blob: Buffer): string[] | undefined {
  const out: string[] = [];
  let at = 0;
  while (at < blob.length) {
    if (at + 4 > blob.length) return undefined;
    const length = blob.readUInt32BE(at);
    at += 4;
    if (length === 0 || at + length > blob.length) return undefined;
    out.push(out.length < 2 ? blob.toString('latin1', at, at + length) : '');
    at += length;
    if (out.length > 3) return undefined;
  }
  return out;
}
