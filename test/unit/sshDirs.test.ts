import { spawnSync } from 'node:child_process';
import { chown, mkdir, mkdtemp, readdir, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runSsh } from '../../client/openssh.ts';
import { removeStaleSshDirs } from '../../client/sshDirs.ts';

/**
 * Issue 41, defect 7: `metastatic run` (or `ssh`) killed with kill -9 left its private
 * `metastatic-ssh-*` directory (the known_hosts written for the call) in the temporary directory. Each
 * is named after the process that made it, and the next run removes those of a dead process of this
 * user, old enough that no process of another pid namespace sharing /tmp can still be reading it.
 */
const deadPid = () => spawnSync('true').pid as number;
const HOUR = 3_600_000;

describe('leftover ssh directories', () => {
  let tmp: string;
  let savedTmp: string | undefined;

  beforeEach(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'metastatic-tmp-'));
    savedTmp = process.env.TMPDIR;
  });
  afterEach(async () => {
    if (savedTmp === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = savedTmp;
    await rm(tmp, { recursive: true, force: true });
  });

  const make = async (name: string, ageMs: number) => {
    const dir = join(tmp, name);
    await mkdir(dir);
    await writeFile(join(dir, 'known_hosts'), 'x');
    const at = new Date(Date.now() - ageMs);
    await utimes(dir, at, at);
    return dir;
  };

  it("removes only an old directory of this user's dead process", async () => {
    const dead = deadPid();
    await make(`metastatic-ssh-${dead}-Ab12Cd`, HOUR);
    await make(`metastatic-ssh-${dead}-young1`, 1000); // maybe another pid namespace's, still in use
    await make(`metastatic-ssh-${process.pid}-live01`, HOUR); // a live process's
    await make('metastatic-ssh-oldstyle', HOUR); // no pid: whose it is cannot be told
    await make(`other-${dead}-Ab12Cd`, HOUR);
    await writeFile(join(tmp, `metastatic-ssh-${dead}-file01`), 'a file, not a directory');
    const target = await make('target', HOUR);
    await symlink(target, join(tmp, `metastatic-ssh-${dead}-link01`));
    if (process.getuid?.() === 0) {
      const theirs = await make(`metastatic-ssh-${dead}-theirs`, HOUR);
      await chown(theirs, 65534, 65534);
    }
    const removed = await removeStaleSshDirs({ dir: tmp });
    expect(removed).toEqual([join(tmp, `metastatic-ssh-${dead}-Ab12Cd`)]);
    const left = (await readdir(tmp)).sort();
    expect(left).not.toContain(`metastatic-ssh-${dead}-Ab12Cd`);
    expect(left).toContain(`metastatic-ssh-${dead}-young1`);
    expect(left).toContain(`metastatic-ssh-${process.pid}-live01`);
    expect(left).toContain(`metastatic-ssh-${dead}-link01`);
    expect(left).toContain('target');
    if (process.getuid?.() === 0) expect(left).toContain(`metastatic-ssh-${dead}-theirs`);
  });

  it('runSsh names its directory after this process, and clears a dead one’s leftovers first', async () => {
    process.env.TMPDIR = tmp;
    const dead = deadPid();
    await make(`metastatic-ssh-${dead}-Zz99Zz`, HOUR);
    const key = join(tmp, 'key');
    await writeFile(key, 'not a key', { mode: 0o600 });
    let knownHosts = '';
    const login = { nodeId: 'x/0', host: '127.0.0.1', port: 1, user: 'u', hostKeys: ['ssh-ed25519 AAAA'] };
    await runSsh(login, ['true'], {
      identity: key,
      stdio: 'ignore',
      onSpawn: (child) => {
        knownHosts = child.spawnargs.find((a) => a.startsWith('UserKnownHostsFile=')) ?? '';
      },
    });
    expect(basename(dirname(knownHosts))).toMatch(new RegExp(`^metastatic-ssh-${process.pid}-\\w{6}$`));
    expect(await readdir(tmp)).toEqual(['key']);
  });
});
