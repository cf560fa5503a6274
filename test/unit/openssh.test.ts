import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { badHost, loginOf, sshArgs } from '../../client/openssh.ts';
import { toPoolNode } from '../../client/records.ts';

/**
 * What a node's record may put on ssh's command line (issue 41, defect 2): a host is an address or a
 * host name, never something ssh reads as an option (`-G` printed ssh's configuration and exited 0,
 * `-Ekhlog` appended to a file); the destination comes after `--`.
 */

const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAX6KXqDdN6CVw710zrfJwiqCI16xI07DWIdiaUpjx42';
const record = (over: { host?: string; username?: string }) =>
  toPoolNode({
    id: 'job/0',
    label: 'small-node',
    state: 'ready',
    host: '127.0.0.1',
    port: 40000,
    username: 'slot0',
    hostKeys: [KEY],
    ...over,
  });

describe('a host from a record', () => {
  it('is an address or a host name: nothing starting with "-", a space or another option', () => {
    for (const ok of [
      '127.0.0.1',
      'node-1.example.com',
      'ip-10-0-0-1',
      '::1',
      '::ffff:10.0.0.1',
      '2001:db8::1',
    ]) {
      expect(badHost(ok), ok).toBeUndefined();
    }
    for (const bad of ['-G', '-Ekhlog', '-oProxyCommand=x', '--', '.x', ':x', '_x', '', 'a b']) {
      expect(badHost(bad), bad).toMatch(/is not an address or a host name/);
    }
  });

  it('is refused before ssh runs (loginOf), as is a recorded user that is no user name', () => {
    expect(() => loginOf(record({ host: '-G' }))).toThrow('is not an address or a host name');
    expect(() => loginOf(record({ username: '-oProxyCommand=x' }))).toThrow('is not a user name');
    expect(() => loginOf(record({ username: 'a b' }))).toThrow('is not a user name');
    // A user named on the command line (--user) is the caller's own choice, passed as -l's argument.
    expect(loginOf(record({}), 'root').user).toBe('root');
    expect(loginOf(record({ host: '::1' })).host).toBe('::1');
  });
});

describe('sshArgs', () => {
  it('puts the destination after "--", then the command', () => {
    const args = sshArgs({ host: 'node1', port: 2222, user: 'slot0' }, '/k', '/kh', ['-V', 'x']);
    const end = args.indexOf('--');
    expect(end).toBeGreaterThan(0);
    expect(args.slice(end)).toEqual(['--', 'node1', '-V', 'x']);
    expect(args.slice(0, end)).not.toContain('node1');
    const login = sshArgs({ host: 'node1', port: 22, user: 'slot0' }, '/k', '/kh', []);
    expect(login.slice(-2)).toEqual(['--', 'node1']);
  });

  it('so a host "-G" reaches OpenSSH as a host, not an option: no configuration printed', ({ skip }) => {
    if (spawnSync('ssh', ['-V']).error) return skip('no OpenSSH client here');
    const args = sshArgs({ host: '-G', port: 22, user: 'u' }, '/dev/null', '/dev/null', ['true']);
    const r = spawnSync('ssh', ['-F', '/dev/null', '-o', 'BatchMode=yes', ...args], {
      encoding: 'utf8',
      timeout: 10_000,
    });
    expect(r.stdout).not.toMatch(/^stricthostkeychecking /m);
    expect(r.status).not.toBe(0);
  });
});
