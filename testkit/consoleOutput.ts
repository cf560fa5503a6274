import { createHash } from 'node:crypto';

/**
 * EC2 console output as a Linux instance with cloud-init prints it (Ubuntu / Amazon Linux through
 * `logger --stderr -t ec2`, CRLF from the serial console): kernel lines, the fingerprints block, then
 * the host-key block cloud-init's write-ssh-key-fingerprints writes. For the fake EC2 and the tests.
 */
export function cloudInitConsole(keys: readonly string[], options: { at?: string } = {}): string {
  const at = options.at ?? 'Jun  1 00:00:42';
  const ec2 = (line: string) => `<14>${at} ec2: ${line}`;
  const lines = [
    '[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-089) #23-Ubuntu SMP',
    '[    0.000000] Command line: BOOT_IMAGE=/vmlinuz-6.8.0-1021-aws root=PARTUUID=1 ro console=tty1 console=ttyS0',
    "[   11.482133] cloud-init[1021]: Cloud-init v. 24.4 running 'modules:final' at Mon, 01 Jun 2026 00:00:40 +0000.",
    ec2(''),
    ec2('#############################################################'),
    ec2('-----BEGIN SSH HOST KEY FINGERPRINTS-----'),
    ...keys.map((k) => ec2(`256 SHA256:${fingerprint(k)} root@ip-10-0-1-23 (${k.split(' ')[0]})`)),
    ec2('-----END SSH HOST KEY FINGERPRINTS-----'),
    ec2('#############################################################'),
    ec2('-----BEGIN SSH HOST KEY KEYS-----'),
    ...keys.map((k) => ec2(`${k} root@ip-10-0-1-23`)),
    ec2('-----END SSH HOST KEY KEYS-----'),
    '[   12.021339] cloud-init[1021]: Cloud-init v. 24.4 finished at Mon, 01 Jun 2026 00:00:42 +0000. Up 12.01 seconds',
    '',
  ];
  return lines.join('\r\n');
}

/** A well-formed ssh-ed25519 public key (`<type> <base64>`) derived from a seed: one per fake instance. */
export function fakeEd25519Key(seed: string): string {
  const name = Buffer.from('ssh-ed25519');
  const point = createHash('sha256').update(seed).digest();
  const blob = Buffer.concat([u32(name.length), name, u32(point.length), point]);
  return `ssh-ed25519 ${blob.toString('base64')}`;
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}

function fingerprint(key: string): string {
  const blob = Buffer.from(key.split(' ')[1] ?? '', 'base64');
  return createHash('sha256').update(blob).digest('base64').replace(/=+$/, '');
}
