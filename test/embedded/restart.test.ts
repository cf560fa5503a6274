import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { alive, killBackingNode, until } from '../../testkit/processes.ts';

const bin = join(resolve(import.meta.dirname, '..', '..'), 'bin', 'metastatic.mjs');

describe('kill -9 of metastatic dev and a restart on the same state dir', () => {
  let stateDir: string;
  const devs: ChildProcess[] = [];
  const pids: number[] = [];

  const cli = (args: string[]) =>
    new Promise<{ code: number; stdout: string; stderr: string }>((done) => {
      execFile(
        process.execPath,
        [bin, '--state-dir', stateDir, ...args],
        { timeout: 60_000 },
        (err, stdout, stderr) => done({ code: err ? Number(err.code ?? 1) : 0, stdout, stderr }),
      );
    });

  const startDev = async () => {
    const dev = spawn(process.execPath, [bin, '--state-dir', stateDir, 'dev', '--reaper-interval', '0.5'], {
      stdio: 'ignore',
    });
    devs.push(dev);
    await until('dev.json of the new process', () => {
      const path = join(stateDir, 'dev.json');
      if (!existsSync(path)) return undefined;
      return JSON.parse(readFileSync(path, 'utf8')).pid === dev.pid ? true : undefined;
    });
    return dev;
  };

  afterAll(async () => {
    for (const d of devs) if (d.exitCode === null && d.signalCode === null) d.kill('SIGKILL');
    for (const p of pids) killBackingNode(p);
    await rm(stateDir, { recursive: true, force: true });
  });

  it('loses nothing: the table is kept, live backing processes are adopted, vanished ones reconciled', {
    timeout: 180_000,
  }, async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-restart-'));
    const first = await startDev();
    const nodes = [];
    for (const id of ['r1', 'r2', 'r3']) {
      const out = await cli(['request', 'small-node', '--id', id, '--wait', '--json', '--timeout', '60']);
      expect(out.code, out.stderr).toBe(0);
      nodes.push(JSON.parse(out.stdout).nodes[0]);
    }
    const [n1, n2, n3] = nodes;
    expect(n1.backingNodeId).toBe(n2.backingNodeId);
    const keptPid = n1.attributes.pid as number;
    const lostPid = n3.attributes.pid as number;
    pids.push(keptPid, lostPid);

    first.kill('SIGKILL');
    await until('the first stack to die', () =>
      first.exitCode !== null || first.signalCode !== null ? true : undefined,
    );
    expect(alive(keptPid)).toBe(true); // backing processes outlive the stack
    process.kill(lostPid, 'SIGKILL'); // ... and one vanishes while nobody watches
    await until('the lost backing process to die', () => (alive(lostPid) ? undefined : true));

    await startDev();
    const listed = JSON.parse((await cli(['list', 'nodes', '--json', '--all'])).stdout);
    const byId = new Map(listed.map((n: { id: string }) => [n.id, n]));
    expect(byId.get('r1/0')).toMatchObject({
      state: 'ready',
      port: n1.port,
      backingNodeId: n1.backingNodeId,
    });
    expect(byId.get('r2/0')).toMatchObject({ state: 'ready', port: n2.port });
    expect(byId.get('r3/0')).toMatchObject({ state: 'failed', reason: expect.stringContaining('vanished') });
    expect(alive(keptPid)).toBe(true);

    // The adopted backing node is still managed: released, it goes after grace-time.
    for (const id of ['r1/0', 'r2/0']) expect((await cli(['release', id])).code).toBe(0);
    await until(
      'the adopted backing process to be stopped',
      () => (alive(keptPid) ? undefined : true),
      60_000,
    );
    const backing = JSON.parse((await cli(['list', 'backing', '--json', '--all'])).stdout);
    expect(backing.map((b: { state: string }) => b.state).sort()).toEqual(['stopped', 'stopped']);
  });
});
