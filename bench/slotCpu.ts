/**
 * The CPU a contained slot gets when its backing node is full (issue 42): a local backing node run as
 * root with `isolation: contain` and slots of half a core, every slot running a CPU-bound job for a few
 * seconds. Each slot's CPU time is read from its own cgroup (cpuacct.usage on cgroup v1, cpu.stat
 * usage_usec on v2) and given as a share of what its `cores` promise: 1.0 is exactly its quota. Alone:
 * `npx tsx bench/slotCpu.ts [--slots N] [--seconds S]` (root on Linux only; says why not elsewhere).
 */
import { existsSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { containmentUnavailable, slotGroup } from '../shared/providers/local/slotIsolation.ts';
import { nodeFiles, slotExec, startBackingNode } from '../testkit/backingNodeProcess.ts';

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
  const live = Object.fromEntries(Array.from({ length: slots }, (_, s) => [s, `n-${s}`]));
  const files = await nodeFiles('metastatic-slot-cpu-', live);
  const id = 'b-slot-cpu';
  const node = await startBackingNode(files, id, [
    '--isolation',
    'contain',
    '--slot-limits',
    `${MILLICORES},0,0`,
  ]);
  try {
    const { port } = node;
    if (port === undefined) throw new Error(`backing node exited: ${node.stderr()}`);
    const busy = (slot: number) =>
      slotExec(
        port,
        files.privateKey,
        slot,
        `end=$(($(date +%s) + ${seconds})); while [ "$(date +%s)" -lt "$end" ]; do :; done`,
      );
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
    node.process.kill('SIGTERM');
    if (node.process.exitCode === null) await new Promise((resolve) => node.process.once('exit', resolve));
    await rm(files.dir, { recursive: true, force: true });
  }
}

void main();
