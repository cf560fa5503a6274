import { type ChildProcess, execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killBackingNode, startDev, stopDev } from '../../testkit/processes.ts';

/**
 * `request --lease`, `renew` and `release --request` through the CLI a user runs, against a real
 * `metastatic dev` (issue 23): one request taken with a lease, renewed with a new length, released
 * whole, and a renewal of the ended request refused.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { timeout: 60_000 }, (err, stdout, stderr) => {
      done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
    });
  });
}

describe('leases through the CLI against metastatic dev', { timeout: 180_000 }, () => {
  let stateDir: string;
  let dev: ChildProcess;
  let devOutput = () => '';
  const run = (args: string[]) => cli(['--state-dir', stateDir, ...args]);

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-lease-cli-'));
    const started = await startDev(bin, stateDir, ['-c', join(root, 'examples', 'local.yaml')]);
    dev = started.process;
    devOutput = started.log;
  });

  afterAll(async () => {
    await stopDev(dev);
    const local = join(stateDir, 'local');
    for (const f of await readdir(local).catch(() => [] as string[])) {
      if (!f.endsWith('.json')) continue;
      const pid = JSON.parse(await readFile(join(local, f), 'utf8')).pid;
      if (typeof pid === 'number') killBackingNode(pid);
    }
    await rm(stateDir, { recursive: true, force: true });
  });

  it('requests with a lease, renews it, releases the whole request, refuses to renew it then', async () => {
    const bad = await run(['request', 'small-node', '--lease', '5']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('lease: must be a whole number of seconds from 10 to 604800');

    const asked = await run(['request', 'small-node', '--id', 'leased', '--lease', '60', '--wait', '--json']);
    expect(asked.code, `${asked.stderr}\n${devOutput()}`).toBe(0);
    expect(JSON.parse(asked.stdout)).toMatchObject({ id: 'leased', state: 'fulfilled', lease: 60 });

    const renewed = await run(['renew', 'leased', '--lease', '120', '--json']);
    expect(renewed.code, `${renewed.stderr}\n${devOutput()}`).toBe(0);
    const after = JSON.parse(renewed.stdout);
    expect(after.lease).toBe(120);
    expect(Date.parse(after.leaseExpiresAt) - Date.now()).toBeGreaterThan(100_000);

    const released = await run(['release', '--request', 'leased', '--json']);
    expect(released.code, released.stderr).toBe(0);
    expect(JSON.parse(released.stdout).nodes.map((n: { state: string }) => n.state)).toEqual(['released']);
    const again = await run(['release', '--request', 'leased']); // idempotent
    expect(again.code).toBe(0);
    expect(again.stdout).toMatch(/^request leased: released\n/); // not "fulfilled" (issue 41, defect 12)

    const late = await run(['renew', 'leased']);
    expect(late.code).toBe(1);
    expect(late.stderr).toContain('has ended');
    expect((await run(['release', 'leased/0', '--request', 'leased'])).code).toBe(2);
  });
});
