/**
 * The CPU a contained slot gets when its backing node is full (issue 42): a local backing node run as
 * root with `isolation: contain` and slots of half a core, every slot running a CPU-bound job for a few
 * seconds. Each slot's CPU time is read from its own cgroup (cpuacct.usage on cgroup v1, cpu.stat
 * usage_usec on v2) and given as a share of what its `cores` promise: 1.0 is exactly its quota. Alone:
 * `npx tsx bench/slotCpu.ts [--slots N] [--seconds S]` (root on Linux only; says why not elsewhere).
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import ssh2 from 'ssh2';
import { ed25519PublicKeyOf, newEd25519PrivateKey } from '../shared/providers/local/hostKey.ts';
import { formatLiveSlots } from '../shared/providers/local/liveSlots.ts';
import { containmentUnavailable, slotGroup } from '../shared/providers/local/slotIsolation.ts';
import { backingNodeScript } from '../shared/providers/local/supervisor.ts';

const MILLICORES = 500;

/** CPU seconds the slot's cgroup has used. */
async function cpuSeconds(group: string): Promise<number> {
  if (existsSync('/sys/fs/cgroup/cgroup.controllers')) {
    const stat = await readFile(join('/sys/fs/cgroup/metastatic', group, 'cpu.stat'), 'utf8');
    return Number(/usage_usec (\d+)/.exec(stat)?.[1] ?? 0) / 1e6;
  }
  const ns = await readFile(join('/sys/fs/cgroup/cpuacct/metastatic', group, 'cpuacct.usage'), 'utf8');
  return Number(ns.trim()) / 1e9;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { slots: { type: 'string', default: '4' }, seconds: { type: 'string', default: '5' } },
  });
  const slots = Number(values.slots);
  const seconds = Number(values.seconds);
  const why = containmentUnavailable();
  if (why) {
    console.log(`slot CPU: not measured: ${why}`);
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), 'metastatic-slot-cpu-'));
  const key = newEd25519PrivateKey();
  await writeFile(join(dir, 'node.authorized_keys'), `${ed25519PublicKeyOf(key)}\n`, { mode: 0o600 });
  const live = Object.fromEntries(Array.from({ length: slots }, (_, s) => [s, `n-${s}`]));
  await writeFile(join(dir, 'node.live'), formatLiveSlots(live), { mode: 0o600 });
  const id = 'b-slot-cpu';
  const node = spawn(
    process.execPath,
    [
      await backingNodeScript(),
      ...['--id', id, '--resource', 'r-slot-cpu', '--state-file', join(dir, 'node.json')],
      ...['--isolation', 'contain', '--slot-limits', `${MILLICORES},0,0`],
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  try {
    const port = await new Promise<number>((resolve, reject) => {
      let out = '';
      node.stdout?.on('data', (d: Buffer) => {
        out += d;
        const ready = /READY (\d+)/.exec(out);
        if (ready) resolve(Number(ready[1]));
      });
      node.once('exit', (code) => reject(new Error(`backing node exited ${code}`)));
    });
    const busy = (slot: number) =>
      new Promise<void>((resolve, reject) => {
        const client = new ssh2.Client();
        client.on('error', reject);
        client.on('ready', () =>
          client.exec(
            `end=$(($(date +%s) + ${seconds})); while [ "$(date +%s)" -lt "$end" ]; do :; done`,
            (err, ch) => {
              if (err) return reject(err);
              ch.resume();
              ch.stderr.resume();
              ch.on('close', () => {
                client.end();
                resolve();
              });
            },
          ),
        );
        client.connect({ host: '127.0.0.1', port, username: `slot${slot}`, privateKey: key });
      });
    const started = Date.now();
    await Promise.all(Array.from({ length: slots }, (_, s) => busy(s)));
    const wall = (Date.now() - started) / 1000;
    const shares = await Promise.all(
      Array.from(
        { length: slots },
        async (_, s) => (await cpuSeconds(slotGroup(id, s))) / ((MILLICORES / 1000) * wall),
      ),
    );
    console.log(
      `slot CPU: ${slots} slots of ${MILLICORES / 1000} core, ${wall.toFixed(1)} s busy each: ` +
        `share of the quota used ${shares.map((x) => x.toFixed(2)).join(' / ')}`,
    );
  } finally {
    node.kill('SIGTERM');
    await new Promise((resolve) => node.once('exit', resolve));
    await rm(dir, { recursive: true, force: true });
  }
}

void main();
