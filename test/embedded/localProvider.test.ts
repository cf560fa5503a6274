import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { systemClock } from '../../shared/core/clock.ts';
import type { BackingPool } from '../../shared/core/model.ts';
import type { LaunchSpec } from '../../shared/core/provider.ts';
import type { StateChangeEvent } from '../../shared/core/stateChanges.ts';
import { LocalProvider } from '../../shared/providers/local/localProvider.ts';
import { isLocalResourceId, localResourceId } from '../../shared/providers/local/localRecords.ts';
import { killBackingNode } from '../../testkit/processes.ts';

const POOL_KEY = 'local/main';

const pool: BackingPool = {
  key: POOL_KEY,
  providerName: 'local',
  poolName: 'main',
  driver: 'local',
  maxServers: undefined,
  providerOptions: {},
  poolOptions: {},
  labels: new Map([
    ['fast', { name: 'fast', options: { attributes: { size: 'small', pool: 'overridden' } } }],
    ['slow', { name: 'slow', options: { 'boot-delay': 1 } }],
  ]),
};

// A backing process boots in about a second; many times that on a loaded machine (a hang detector, not a speed check).
const WAIT = { timeout: 45_000, interval: 20 };

interface Harness {
  readonly provider: LocalProvider;
  readonly events: StateChangeEvent[];
  /** Date.now() when each event reached onEvent. */
  readonly receivedAt: number[];
  /** What the provider warned or erred about (a child that exited early says why: code, signal, stderr). */
  readonly complaints: string[];
}

let stateDir: string;
const providers: LocalProvider[] = [];
const pids = new Set<number>();

function makeProvider(): Harness {
  const events: StateChangeEvent[] = [];
  const receivedAt: number[] = [];
  const complaints: string[] = [];
  const complain = (message: string, fields?: object): void => {
    complaints.push(`${message} ${JSON.stringify(fields ?? {})}`);
  };
  const provider = new LocalProvider({
    stateDir,
    pools: [pool],
    clock: systemClock,
    region: 'test-region',
    onEvent: (event) => {
      events.push(event);
      receivedAt.push(Date.now());
    },
    logger: { info: () => {}, warn: complain, error: complain },
  });
  providers.push(provider);
  return { provider, events, receivedAt, complaints };
}

function spec(backingNodeId: string, label = 'fast', attempt = 1): LaunchSpec {
  return { backingNodeId, attempt, poolKey: POOL_KEY, label };
}

function statesOf(events: readonly StateChangeEvent[], resourceId: string): string[] {
  return events.filter((e) => e.detail['instance-id'] === resourceId).map((e) => e.detail.state);
}

async function waitForState(h: Harness, resourceId: string, state: string): Promise<void> {
  await vi.waitFor(
    () => expect(statesOf(h.events, resourceId), h.complaints.join('\n')).toContain(state),
    WAIT,
  );
}

async function pidOf(provider: LocalProvider, resourceId: string): Promise<number> {
  const resource = await provider.describe(resourceId);
  const pid = resource?.attributes.pid;
  if (typeof pid !== 'number') throw new Error(`no pid for ${resourceId}`);
  pids.add(pid);
  return pid;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Connects and returns the first line the port sends (without CR LF): a backing node serves SSH, so this is
 * its identification string, `SSH-2.0-metastatic_<backingNodeId>`.
 */
function bannerLine(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let received = '';
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no banner line from port ${port}; got ${JSON.stringify(received)}`));
    }, 10_000);
    socket.setEncoding('latin1');
    socket.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    socket.on('data', (chunk: string) => {
      received += chunk;
      const newline = received.indexOf('\n');
      if (newline < 0) return;
      clearTimeout(timer);
      socket.destroy();
      resolve(received.slice(0, newline).replace(/\r$/, ''));
    });
  });
}

function connectionRefused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.on('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.on('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
  });
}

async function stateFiles(): Promise<string[]> {
  try {
    return (await readdir(join(stateDir, 'local'))).filter((f) => f.endsWith('.json'));
  } catch {
    return [];
  }
}

beforeEach(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'metastatic-local-'));
});

afterEach(async () => {
  await Promise.allSettled(providers.splice(0).map((p) => p.shutdown()));
  for (const pid of pids) killBackingNode(pid); // already gone, as it should be
  pids.clear();
  await rm(stateDir, { recursive: true, force: true });
});

describe('LocalProvider', () => {
  it('derives resource ids from (backingNodeId, attempt)', () => {
    const expected = `local-${createHash('sha256').update('bn-1#2').digest('hex').slice(0, 16)}`;
    expect(localResourceId('bn-1', 2)).toBe(expected);
    expect(localResourceId('bn-1', 1)).not.toBe(expected);
    expect(isLocalResourceId(expected)).toBe(true);
    expect(isLocalResourceId('i-0123456789abcdef0')).toBe(false);
  });

  it('launches a backing node: pending, then running, and its port serves SSH naming the backing node', async () => {
    const h = makeProvider();
    const { resourceId } = await h.provider.launch(spec('bn-launch'));
    expect(resourceId).toBe(localResourceId('bn-launch', 1));
    await pidOf(h.provider, resourceId);
    await waitForState(h, resourceId, 'running');
    expect(statesOf(h.events, resourceId)).toEqual(['pending', 'running']);
    const running = h.events.find((e) => e.detail.state === 'running');
    expect(running).toMatchObject({
      'detail-type': 'EC2 Instance State-change Notification',
      source: 'metastatic.local',
      region: 'test-region',
      resources: [resourceId],
    });

    const resource = await h.provider.describe(resourceId);
    expect(resource).toMatchObject({
      resourceId,
      backingNodeId: 'bn-launch',
      poolKey: POOL_KEY,
      state: 'running',
      host: '127.0.0.1',
    });
    expect(resource?.attributes).toMatchObject({
      size: 'small',
      provider: 'local',
      pool: POOL_KEY,
      label: 'fast',
      resourceId,
    });
    const port = resource?.port;
    expect(port).toBeGreaterThan(0);
    expect(await bannerLine(port ?? 0)).toBe('SSH-2.0-metastatic_bn-launch');
    expect(await stateFiles()).toEqual([`${resourceId}.json`]);
    // The SSH host key: private next to the state file (owner-only), public in the attributes.
    const hostKeys = resource?.attributes.hostKeys;
    expect(hostKeys).toEqual([expect.stringMatching(/^ssh-ed25519 AAAA[0-9A-Za-z+/]+=*$/)]);
    const keyFile = await stat(join(stateDir, 'local', `${resourceId}.key`));
    expect(keyFile.mode & 0o777).toBe(0o600);
  });

  it('launching the same spec twice starts one process', async () => {
    const h = makeProvider();
    const [a, b] = await Promise.all([
      h.provider.launch(spec('bn-twice')),
      h.provider.launch(spec('bn-twice')),
    ]);
    const c = await h.provider.launch(spec('bn-twice'));
    expect(a.resourceId).toBe(b.resourceId);
    expect(c.resourceId).toBe(a.resourceId);
    const pid = await pidOf(h.provider, a.resourceId);
    await waitForState(h, a.resourceId, 'running');
    const d = await h.provider.launch(spec('bn-twice'));
    expect(d.resourceId).toBe(a.resourceId);
    expect(await pidOf(h.provider, a.resourceId)).toBe(pid);
    expect(statesOf(h.events, a.resourceId)).toEqual(['pending', 'running']);
    expect(await stateFiles()).toHaveLength(1);
    expect(await h.provider.list()).toHaveLength(1);

    // Another attempt is another resource.
    const other = await h.provider.launch(spec('bn-twice', 'fast', 2));
    expect(other.resourceId).not.toBe(a.resourceId);
    await pidOf(h.provider, other.resourceId);
    expect((await h.provider.list()).map((r) => r.resourceId).sort()).toEqual(
      [a.resourceId, other.resourceId].sort(),
    );
  });

  it('describes a booting node as pending without a port, then as running with one', async () => {
    const h = makeProvider();
    const { resourceId } = await h.provider.launch(spec('bn-describe', 'slow'));
    const booting = await h.provider.describe(resourceId);
    expect(booting?.state).toBe('pending');
    expect(booting?.port).toBeUndefined();
    await pidOf(h.provider, resourceId);
    await waitForState(h, resourceId, 'running');
    const ready = await h.provider.describe(resourceId);
    expect(ready?.state).toBe('running');
    expect(ready?.port).toBeGreaterThan(0);
    expect(await h.provider.describe('local-0000000000000000')).toBeUndefined();
  });

  it('respects the boot delay: running comes no earlier than boot-delay after launch', async () => {
    const h = makeProvider();
    const launchedAt = Date.now();
    const { resourceId } = await h.provider.launch(spec('bn-delay', 'slow'));
    await pidOf(h.provider, resourceId);
    await waitForState(h, resourceId, 'running');
    expect(statesOf(h.events, resourceId)).toEqual(['pending', 'running']);
    const runningIndex = h.events.findIndex((e) => e.detail.state === 'running');
    expect(h.receivedAt[runningIndex]).toBeGreaterThanOrEqual(launchedAt + 1_000);
    const runningTime = Date.parse(h.events[runningIndex]?.time ?? '');
    expect(runningTime).toBeGreaterThanOrEqual(launchedAt + 1_000);
  });

  it('terminates: process gone, port closed, events emitted, state file removed, idempotent', async () => {
    const h = makeProvider();
    const { resourceId } = await h.provider.launch(spec('bn-terminate'));
    const pid = await pidOf(h.provider, resourceId);
    await waitForState(h, resourceId, 'running');
    const port = (await h.provider.describe(resourceId))?.port ?? 0;
    expect(await bannerLine(port)).toBe('SSH-2.0-metastatic_bn-terminate');

    await h.provider.terminate(resourceId);
    expect(isAlive(pid)).toBe(false);
    expect(await connectionRefused(port)).toBe(true);
    expect((await h.provider.describe(resourceId))?.state).toBe('terminated');
    expect(await stateFiles()).toEqual([]);
    // The host key goes with the state file.
    expect(await readdir(join(stateDir, 'local'))).toEqual([]);
    expect(await h.provider.list()).toEqual([]);
    await h.provider.flush();
    expect(statesOf(h.events, resourceId)).toEqual(['pending', 'running', 'shutting-down', 'terminated']);

    await h.provider.terminate(resourceId);
    await h.provider.terminate('local-ffffffffffffffff');
    await h.provider.flush();
    expect(statesOf(h.events, resourceId)).toEqual(['pending', 'running', 'shutting-down', 'terminated']);
    // The same (backingNodeId, attempt) never starts a second resource.
    expect(await h.provider.launch(spec('bn-terminate'))).toEqual({ resourceId });
    expect(await h.provider.describe(resourceId)).toMatchObject({
      state: 'terminated',
      backingNodeId: 'bn-terminate',
    });
  });

  it('terminates a node that is still booting', async () => {
    const h = makeProvider();
    const { resourceId } = await h.provider.launch(spec('bn-terminate-early', 'slow'));
    const pid = await pidOf(h.provider, resourceId);
    await Promise.all([h.provider.terminate(resourceId), h.provider.terminate(resourceId)]);
    expect(isAlive(pid)).toBe(false);
    await h.provider.flush();
    expect(statesOf(h.events, resourceId)).toEqual(['pending', 'shutting-down', 'terminated']);
  });

  it('reports a node killed from outside as terminated', async () => {
    const h = makeProvider();
    const { resourceId } = await h.provider.launch(spec('bn-killed'));
    const pid = await pidOf(h.provider, resourceId);
    await waitForState(h, resourceId, 'running');

    process.kill(pid, 'SIGKILL');
    await waitForState(h, resourceId, 'terminated');
    expect(statesOf(h.events, resourceId)).toEqual(['pending', 'running', 'terminated']);
    // Described as terminated (as EC2 does for a while), so the fulfil flow can find its backing node.
    expect(await h.provider.describe(resourceId)).toMatchObject({
      state: 'terminated',
      backingNodeId: 'bn-killed',
    });
    await vi.waitFor(async () => expect(await readdir(join(stateDir, 'local'))).toEqual([]), WAIT);
    await h.provider.terminate(resourceId);
  });

  it('shutdown stops every child it started, booting or running', async () => {
    const h = makeProvider();
    const running = await h.provider.launch(spec('bn-shutdown-1'));
    const booting = await h.provider.launch(spec('bn-shutdown-2', 'slow'));
    const runningPid = await pidOf(h.provider, running.resourceId);
    const bootingPid = await pidOf(h.provider, booting.resourceId);
    await waitForState(h, running.resourceId, 'running');

    await h.provider.shutdown();
    expect(isAlive(runningPid)).toBe(false);
    expect(isAlive(bootingPid)).toBe(false);
    expect(await stateFiles()).toEqual([]);
    expect(statesOf(h.events, running.resourceId).at(-1)).toBe('terminated');
    expect(statesOf(h.events, booting.resourceId).at(-1)).toBe('terminated');
    await expect(h.provider.launch(spec('bn-shutdown-3'))).rejects.toThrow(/shut down/);
  });

  it('a second provider on the same state dir sees, adopts and terminates existing nodes', async () => {
    const first = makeProvider();
    const { resourceId } = await first.provider.launch(spec('bn-adopt'));
    const pid = await pidOf(first.provider, resourceId);
    await waitForState(first, resourceId, 'running');

    const second = makeProvider();
    const listed = await second.provider.list();
    expect(listed.map((r) => [r.resourceId, r.state, r.backingNodeId])).toEqual([
      [resourceId, 'running', 'bn-adopt'],
    ]);
    expect(await second.provider.launch(spec('bn-adopt'))).toEqual({ resourceId });
    expect(second.events).toEqual([]);
    const adopted = await second.provider.describe(resourceId);
    // The host keys come from the state file.
    expect(adopted?.attributes.hostKeys).toEqual(
      (await first.provider.describe(resourceId))?.attributes.hostKeys,
    );
    expect(adopted?.attributes.hostKeys).toHaveLength(1);
    expect(await bannerLine(adopted?.port ?? 0)).toBe('SSH-2.0-metastatic_bn-adopt');

    await second.provider.terminate(resourceId);
    expect(await second.provider.describe(resourceId)).toBeUndefined();
    await second.provider.flush();
    expect(statesOf(second.events, resourceId)).toEqual(['shutting-down', 'terminated']);
    // The first provider sees its child go away.
    await waitForState(first, resourceId, 'terminated');
    expect(isAlive(pid)).toBe(false);
  });

  it('reports an adopted node that dies as terminated, promptly, as it does for its own children (issue 10, defect 3)', async () => {
    const first = makeProvider();
    const { resourceId } = await first.provider.launch(spec('bn-adopted-dies'));
    const pid = await pidOf(first.provider, resourceId);
    await waitForState(first, resourceId, 'running');

    // A restarted pool: a second provider that did not start the process adopts it from the state file.
    const second = makeProvider();
    expect((await second.provider.describe(resourceId))?.state).toBe('running');
    expect(second.events).toEqual([]);

    process.kill(pid, 'SIGKILL');
    // Without the watch nothing reports it until someone describes it again (the next reaper run); the
    // wait's timeout is a hang detector, not a speed check.
    await vi.waitFor(() => expect(statesOf(second.events, resourceId)).toEqual(['terminated']), {
      timeout: 10_000,
      interval: 20,
    });
    expect(await second.provider.describe(resourceId)).toMatchObject({ state: 'terminated' });
    await second.provider.shutdown();
  });

  it('drops a stale record whose process is gone', async () => {
    const h = makeProvider();
    const { resourceId } = await h.provider.launch(spec('bn-stale'));
    await pidOf(h.provider, resourceId);
    await waitForState(h, resourceId, 'running');
    await h.provider.shutdown();

    // Simulate a record left behind by a crashed run: a dead pid.
    await mkdir(join(stateDir, 'local'), { recursive: true });
    await writeFile(
      join(stateDir, 'local', `${resourceId}.json`),
      JSON.stringify({
        resourceId,
        backingNodeId: 'bn-stale',
        pid: 2 ** 22 + 12345,
        state: 'running',
        port: 1,
      }),
    );
    // And a temporary file of a writer that died mid-write.
    await writeFile(join(stateDir, 'local', `${resourceId}.json.${2 ** 22 + 12345}.tmp`), '{');
    const fresh = makeProvider();
    expect(await fresh.provider.list()).toEqual([]);
    expect(await readdir(join(stateDir, 'local'))).toEqual([]);
  });

  it('rejects unknown pools and labels', async () => {
    const h = makeProvider();
    await expect(h.provider.launch({ ...spec('bn-x'), poolKey: 'local/nope' })).rejects.toThrow(/unknown/);
    await expect(h.provider.launch(spec('bn-x', 'nope'))).rejects.toThrow(/no label/);
    expect(h.events).toEqual([]);
  });
});
