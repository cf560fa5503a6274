import { describe, expect, it } from 'vitest';
import {
  MAX_CONSOLE_HOST_KEYS,
  MAX_KEY_LINE_CHARS,
  parseConsoleHostKeys,
} from '../../shared/providers/aws/consoleHostKeys.ts';
import { cloudInitConsole, fakeEd25519Key } from '../../testkit/consoleOutput.ts';

// Real keys (ssh-keygen), as /etc/ssh/ssh_host_*_key.pub hold them.
const ED25519 = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFGhuIUcOMbB0uu48laquLMTmgVmLN+ez3bxc/QZZfdV';
const ECDSA =
  'ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBN082efTAawpqqPSs9i9lf44lPkuQI6wjb38ynVQmtAnFGPTb2rEGZ9mE1QzBlja0b+QHSCAme6PLyo3+yysHUA=';
const RSA =
  'ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDe0lIRF89nYNFnpL5mWcf3vxSldOHJ7ObqRCuGdFxhz0sV4jKxbD89iXFULvKUspWU4Y16VkBxZsUPqzChPeRc9hCFVMeXM8KTsdic3qE0Bk+mlPNNxJae7wZazhN9DpgmNugxWoK6tPUubqcTki9dzrxdQ+4A/SWKb0hUwl6D09adoaaZV4R2cPhzn0Fpv5jS5LdrBXINwNAnP2QeN90bNzLiYt3u4jWb8cgTKyOxlfPsfiFDrQv5oSHK9fMQFN8hPHivJfL6DoUVJ8LNTokGT5oqHDO4tOLrnmfCSClsdjBpoeiHAc3lY0TgY2wkcdhWP/3UcXb3IGjRZ95eGXEi30x0zBFd310cE48U6Ae/9+qYsI7zbo/LktvQPiQTV36FlHn5c4pjoqPKrSroYOe8BT0zY5T0Ybwcsu/WVc9F9tF035FFQuSg915vIuqXReXIg5mQBgFuUsDYUUYVU8GsqZpEPxAtpTqxNIMEh4TJcGxXSqBTMjB6TRJe+e4XIeE=';

/** A block as older cloud-init printed it: plain lines, LF only. */
const plain = (...lines: string[]) =>
  ['boot...', '-----BEGIN SSH HOST KEY KEYS-----', ...lines, '-----END SSH HOST KEY KEYS-----', ''].join(
    '\n',
  );

describe('parseConsoleHostKeys: the host keys cloud-init prints to the EC2 console', () => {
  it('reads every key type of the block cloud-init writes through logger, CRLF and syslog prefixes included', () => {
    const out = parseConsoleHostKeys(cloudInitConsole([ECDSA, ED25519, RSA]));
    expect(out).toEqual({ kind: 'keys', keys: [ECDSA, ED25519, RSA] });
  });

  it('reads the block without prefixes (older cloud-init) and drops the comment', () => {
    expect(parseConsoleHostKeys(plain(`${ED25519} root@ip-10-0-1-23`))).toEqual({
      kind: 'keys',
      keys: [ED25519],
    });
    expect(parseConsoleHostKeys(plain(`ec2: ${ED25519}`))).toEqual({ kind: 'keys', keys: [ED25519] });
  });

  it('finds no keys before the block is printed, and none in the fingerprints block alone', () => {
    expect(parseConsoleHostKeys('')).toEqual({ kind: 'none' });
    expect(parseConsoleHostKeys('[    0.000000] Linux version 6.8.0\r\n')).toEqual({ kind: 'none' });
    const fingerprintsOnly = cloudInitConsole([ED25519]).split('-----BEGIN SSH HOST KEY KEYS')[0] as string;
    expect(fingerprintsOnly).toContain('FINGERPRINTS');
    expect(parseConsoleHostKeys(fingerprintsOnly)).toEqual({ kind: 'none' });
  });

  it('waits for a block whose END is not printed yet, even with whole keys in it', () => {
    const full = cloudInitConsole([ECDSA, ED25519]);
    const cut = full.slice(0, full.indexOf('-----END SSH HOST KEY KEYS'));
    expect(cut).toContain(ED25519);
    expect(parseConsoleHostKeys(cut)).toEqual({ kind: 'none' });
  });

  it('ignores an END whose BEGIN fell off the kept output', () => {
    expect(parseConsoleHostKeys(`${ED25519}\n-----END SSH HOST KEY KEYS-----\n`)).toEqual({ kind: 'none' });
  });

  it('skips noise lines inside the block (interleaved kernel messages, blanks) and ssh-dss keys', () => {
    const out = parseConsoleHostKeys(
      plain(
        '[   12.345678] random: crng init done',
        '',
        'ssh-dss AAAAB3NzaC1kc3MAAACBAP root@old',
        ED25519,
        'ec2: #####',
      ),
    );
    expect(out).toEqual({ kind: 'keys', keys: [ED25519] });
  });

  it('refuses a block with a key cut short or garbled, or whose blob names another type', () => {
    const truncated = ED25519.slice(0, 40);
    expect(parseConsoleHostKeys(plain(truncated))).toMatchObject({ kind: 'invalid' });
    expect(parseConsoleHostKeys(plain(`${ED25519}[   12.3] random: crng init done`))).toMatchObject({
      kind: 'invalid',
    });
    // An ed25519 blob labelled ssh-rsa.
    const relabelled = `ssh-rsa ${ED25519.split(' ')[1]}`;
    expect(parseConsoleHostKeys(plain(relabelled))).toEqual({
      kind: 'invalid',
      reason: 'a ssh-rsa line of the host-key block holds a key that is not a ssh-rsa public key',
    });
    // A nistp256 blob labelled nistp384.
    const curve = `ecdsa-sha2-nistp384 ${ECDSA.split(' ')[1]}`;
    expect(parseConsoleHostKeys(plain(curve))).toMatchObject({ kind: 'invalid' });
  });

  it('refuses a complete block with no key in it', () => {
    expect(parseConsoleHostKeys(plain('[   1.0] nothing'))).toEqual({
      kind: 'invalid',
      reason: 'the host-key block lists no key',
    });
  });

  it('takes a block printed twice once, and refuses two blocks that differ', () => {
    const twice = cloudInitConsole([ED25519, ECDSA]) + cloudInitConsole([ECDSA, ED25519]);
    expect(parseConsoleHostKeys(twice)).toEqual({ kind: 'keys', keys: [ED25519, ECDSA] });
    const differ = cloudInitConsole([ED25519]) + cloudInitConsole([ECDSA]);
    expect(parseConsoleHostKeys(differ)).toEqual({
      kind: 'invalid',
      reason: 'the console shows two host-key blocks with different keys',
    });
  });

  it('drops a block cut short by a new BEGIN (a reboot mid-print)', () => {
    const out = `-----BEGIN SSH HOST KEY KEYS-----\n${ECDSA}\n${plain(ED25519)}`;
    expect(parseConsoleHostKeys(out)).toEqual({ kind: 'keys', keys: [ED25519] });
  });

  it('bounds the number of keys and the length of a key line', () => {
    const many = Array.from({ length: MAX_CONSOLE_HOST_KEYS + 1 }, (_, i) => fakeEd25519Key(`k${i}`));
    expect(parseConsoleHostKeys(plain(...many.slice(0, -1)))).toMatchObject({ kind: 'keys' });
    expect(parseConsoleHostKeys(plain(...many))).toEqual({
      kind: 'invalid',
      reason: `the host-key block lists more than ${MAX_CONSOLE_HOST_KEYS} keys`,
    });
    const long = `${ED25519} ${'x'.repeat(MAX_KEY_LINE_CHARS)}`;
    expect(parseConsoleHostKeys(plain(long))).toEqual({
      kind: 'invalid',
      reason: `a ssh-ed25519 line of the host-key block is longer than ${MAX_KEY_LINE_CHARS} characters`,
    });
  });
});
