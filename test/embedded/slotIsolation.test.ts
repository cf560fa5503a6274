import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import ssh2 from 'ssh2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  containmentUnavailable,
  removeSlotGroups,
  slotGroup,
  slotUid,
} from '../../shared/providers/local/slotIsolation.ts';
import { type NodeFiles, nodeFiles, slotExec, startBackingNode } from '../../testkit/backingNodeProcess.ts';
import { killBackingNode, processesOf, until } from '../../testkit/processes.ts';

/**
 * Slots that contain their jobs (issue 42), on a local backing node run as root with `isolation:
 * contain` and a slot of half a core and 64 MiB: two jobs on two slots neither read, write nor signal
 * each other's files and processes; a job over its memory is the one killed; a released slot keeps no
 * process (setsid ones included) and no file (/tmp included) for its next node; the cgroups go with the
 * backing node. Skipped, with the reason, where slots cannot be contained (not root, not Linux).
 */
const unavailable = containmentUnavailable();
const ID = 'b-contained';
const MEMORY_MIB = 64;

describe.skipIf(unavailable !== undefined)(
  'contained slots of a local backing node',
  { timeout: 120_000 },
  () => {
    let files: NodeFiles;
    let dir: string;
    let node: ChildProcess;
    let port: number;
    let privateKey: string;
    const live = (slots: Record<number, string>) => files.live(slots);
    const exec = (slot: number, command: string) => slotExec(port, privateKey, slot, command);

    /** Starts a contained backing node `id` on the test's files; its port in `port`. */
    const startNode = async (id: string): Promise<void> => {
      const started = await startBackingNode(files, id, [
        ...['--isolation', 'contain', '--slot-limits', `500,${MEMORY_MIB},256`],
      ]);
      if (started.port === undefined) throw new Error(`backing node exited: ${started.stderr()}`);
      node = started.process;
      port = started.port;
    };

    beforeAll(async () => {
      files = await nodeFiles('metastatic-contained-', { 0: 'n-0', 1: 'n-1' });
      ({ dir, privateKey } = files);
      await startNode(ID);
    });

    afterAll(async () => {
      if (node?.pid) killBackingNode(node.pid);
      await rm(dir, { recursive: true, force: true });
    });

    it('runs each slot as a uid of its own, at /home/slot<N>, seeing only its own processes', async () => {
      const ran = await exec(0, 'id -u; echo "$HOME"; pwd; ls /home; ps -e -o pid= | wc -l');
      expect(ran.stderr).toBe('');
      const [uid, home, pwd, homes, processes] = ran.stdout.trim().split('\n');
      expect(Number(uid)).toBe(slotUid(ID, 0));
      expect([home, pwd, homes]).toEqual(['/home/slot0', '/home/slot0', 'slot0']);
      // The namespace's shell, ps and wc (and the shell of the pipe): nothing of the machine's.
      expect(Number(processes)).toBeLessThan(6);
      const work = await stat(join(dir, 'node.work', 'slot0'));
      expect([work.uid, work.mode & 0o777]).toEqual([slotUid(ID, 0), 0o700]);
      // The slot's cgroup holds the label's half core, its 64 MiB and the pids cap (v2, or v1 here).
      const group = slotGroup(ID, 0);
      const read = (hierarchy: string, file: string) =>
        readFile(join('/sys/fs/cgroup', hierarchy, 'metastatic', group, file), 'utf8').then((t) => t.trim());
      if (existsSync('/sys/fs/cgroup/cgroup.controllers')) {
        expect(await read('', 'cpu.max')).toBe('50000 100000');
        expect(await read('', 'memory.max')).toBe(String(MEMORY_MIB * 1048576));
        expect(await read('', 'pids.max')).toBe('256');
      } else {
        expect(await read('cpu', 'cpu.cfs_quota_us')).toBe('50000');
        expect(await read('memory', 'memory.limit_in_bytes')).toBe(String(MEMORY_MIB * 1048576));
        expect(await read('pids', 'pids.max')).toBe('256');
      }
    });

    it("keeps a slot's files and processes from its neighbour", async () => {
      const holder = exec(
        0,
        'echo secret > mine; chmod 644 mine; echo shm > /dev/shm/mine; echo started; sleep 3; cat mine',
      );
      const mine = join(dir, 'node.work', 'slot0', 'mine');
      await until('slot 0 to write its file', () => (existsSync(mine) ? true : undefined));
      const other = await exec(
        1,
        `cat ${mine}; echo x > ${join(dir, 'node.work', 'slot0', 'theirs')}; kill -9 -1; ls /home /dev/shm; echo end`,
      );
      expect(other.stdout).toBe('/dev/shm:\n\n/home:\nslot1\nend\n');
      // Its path is not even there for slot 1 (the host's /tmp is slot 1's own; elsewhere: permission denied).
      expect(other.stderr).toMatch(/No such file or directory|Permission denied/);
      expect(existsSync(join(dir, 'node.work', 'slot0', 'theirs'))).toBe(false);
      // slot 0's job outlived slot 1's kill -9 -1.
      expect(await holder).toEqual({ code: 0, stdout: 'started\nsecret\n', stderr: '' });
    });

    it("serves SFTP under the slot's own names: /home/slot<N> is its directory, as its jobs see it", async () => {
      const sftpSession = await new Promise<{ client: ssh2.Client; sftp: ssh2.SFTPWrapper }>((done, fail) => {
        const client = new ssh2.Client();
        client.on('error', fail);
        client.on('ready', () => client.sftp((err, sftp) => (err ? fail(err) : done({ client, sftp }))));
        client.connect({ host: '127.0.0.1', port, username: 'slot1', privateKey, readyTimeout: 60_000 });
      });
      const { client, sftp } = sftpSession;
      try {
        const home = await new Promise<string>((done, fail) =>
          sftp.realpath('.', (err, path) => (err ? fail(err) : done(path))),
        );
        expect(home).toBe('/home/slot1');
        await new Promise<void>((done, fail) =>
          sftp.writeFile('/home/slot1/put-absolute', 'by sftp\n', (err) => (err ? fail(err) : done())),
        );
        const outside = await new Promise<unknown>((done) =>
          sftp.readFile('/etc/hostname', (err) => done(err)),
        );
        expect(outside).toBeInstanceOf(Error);
      } finally {
        client.end();
      }
      const read = await exec(1, 'cat /home/slot1/put-absolute; stat -c %u put-absolute');
      expect(read.stdout).toBe(`by sftp\n${slotUid(ID, 1)}\n`);
    });

    it('kills the job that goes over its memory, and only it', async () => {
      const neighbour = exec(1, 'sleep 1; echo neighbour done');
      const hog = await exec(
        0,
        `dd if=/dev/zero of=/dev/null bs=${MEMORY_MIB * 4}M count=1 2>/dev/null; echo $?`,
      );
      // dd is killed by the OOM killer (SIGKILL: 137 from the shell); the shell itself goes on.
      expect(hog.stdout.trim()).toBe('137');
      expect((await neighbour).stdout).toBe('neighbour done\n');
    });

    it('leaves nothing of a released node to the next node on its slot: no process, no file', async () => {
      const job = exec(0, 'setsid sleep 300 & echo in-tmp > /tmp/left; echo home > left-home; sleep 300');
      const uid0 = String(slotUid(ID, 0));
      const running = () => processesOf(uid0);
      await until('the job and its setsid child to run', () => (running() >= 2 ? true : undefined));
      await live({ 0: 'n-0b', 1: 'n-1' });
      node.kill('SIGHUP');
      await job; // its connection ends with its node
      await until('the released slot to have no process', () => (running() === 0 ? true : undefined));
      const next = await exec(0, 'ls -A /tmp; ls -A; echo end');
      expect(next).toEqual({ code: 0, stdout: '~slot0\nend\n', stderr: '' });
    });

    it('removes its cgroups when it stops', async () => {
      const groups = ['memory', 'pids', 'cpu', 'unified', '']
        .map((h) => join('/sys/fs/cgroup', h, 'metastatic', slotGroup(ID, 1)))
        .filter((p) => existsSync(p));
      expect(groups.length).toBeGreaterThan(0);
      node.kill('SIGTERM');
      await new Promise((resolve) => node.once('exit', resolve));
      expect(groups.filter((p) => existsSync(p))).toEqual([]);
      const parent = await readdir('/sys/fs/cgroup/memory/metastatic').catch(() => []);
      expect(parent.filter((name) => name.startsWith(ID))).toEqual([]);
    });

    it("ends a crashed backing node's slot processes and cgroups once its record is found stale", async () => {
      const crashed = `${ID}-crashed`;
      await startNode(crashed);
      const job = exec(0, 'setsid sleep 300 & sleep 300').catch(() => undefined);
      const uid = String(slotUid(crashed, 0));
      const running = () => processesOf(uid);
      await until('the job to run', () => (running() >= 2 ? true : undefined));
      node.kill('SIGKILL');
      await job;
      expect(running()).toBeGreaterThanOrEqual(2); // a SIGKILL leaves them: nothing of the node ran
      await removeSlotGroups(crashed); // what RecordFiles.remove does with a stale record
      await until('the slot to have no process', () => (running() === 0 ? true : undefined));
      const left = ['memory', 'pids', 'cpu', 'unified', ''].map((h) =>
        join('/sys/fs/cgroup', h, 'metastatic', slotGroup(crashed, 0)),
      );
      expect(left.filter((p) => existsSync(p))).toEqual([]);
    });
  },
);

describe.skipIf(unavailable !== undefined)('a machine whose cgroups refuse a slot', () => {
  /** Starts a backing node whose slot program finds no cgroup hierarchy it can write; its end or READY. */
  const start = async (
    isolation: string,
  ): Promise<{ code: number | null; stderr: string; ready: boolean }> => {
    const files = await nodeFiles('metastatic-refused-', {});
    await writeFile(join(files.dir, 'not-a-hierarchy'), '');
    const env = { ...process.env, METASTATIC_CGROUP_ROOT: join(files.dir, 'not-a-hierarchy') };
    const started = await startBackingNode(
      files,
      'b-refused',
      ['--isolation', isolation, '--slot-limits', '500,64,256'],
      { env },
    );
    const { process: node } = started;
    if (node.exitCode === null && node.signalCode === null && started.port === undefined) {
      await new Promise((resolve) => node.once('exit', resolve));
    }
    try {
      return { code: node.exitCode, stderr: started.stderr(), ready: started.port !== undefined };
    } finally {
      if (node.exitCode === null) node.kill('SIGKILL');
      await rm(files.dir, { recursive: true, force: true });
    }
  };

  it('fails a backing node of isolation: contain at its start, saying why', async () => {
    const ended = await start('contain');
    expect(ended.ready).toBe(false);
    expect(ended.code).toBe(2);
    expect(ended.stderr).toMatch(/isolation: contain, but probe of a slot failed: .*no cgroup hierarchy at/);
  });

  it('runs one of isolation: auto contained without root (namespaces, no limits), and says why', async () => {
    const ended = await start('auto');
    expect(ended.ready).toBe(true);
    expect(ended.stderr).toMatch(
      /slots are contained without root \(probe of a slot failed: .*no cgroup hierarchy at.*\): .*with no cores or memory limit/,
    );
  });
});

describe.skipIf(unavailable === undefined)('contained slots (unavailable here)', () => {
  it('says why slots cannot be contained', () => {
    expect(unavailable).toMatch(/contained/);
  });
});
