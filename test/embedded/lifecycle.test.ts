import { afterEach, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { withClaimedSlot } from '../../shared/core/backing.ts';
import { scanHostKeys } from '../../shared/providers/hostKeys.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { drainBacking, holdNode } from '../../shared/usecases/reap/operator.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { largeNode, poolConfig, smallNode } from '../../testkit/configs.ts';
import { type Harness, readyNode, sqsEvent, startHarness } from '../../testkit/harness.ts';
import { alive } from '../../testkit/processes.ts';

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const SEC = 1000;

function config(o: {
  grace?: number;
  minRetention?: number;
  maxAge?: number;
  bootDelay?: number;
  launchTimeout?: number;
  retries?: number;
  hostKeyChecking?: boolean;
  label?: string;
}): string {
  return poolConfig({
    backing: { labels: [largeNode({ 'boot-delay': o.bootDelay ?? 0 })] },
    meta: {
      provider: { 'launch-timeout': o.launchTimeout ?? 3600, 'launch-retries': o.retries ?? 3 },
      pool: { 'max-servers': 20, 'host-key-checking': o.hostKeyChecking ?? false },
      labels: [
        smallNode({
          name: o.label ?? 'small-node',
          'max-parallel-jobs': 2,
          'grace-time': o.grace ?? 60,
          'min-retention-time': o.minRetention ?? 0,
          'max-age': o.maxAge,
        }),
      ],
    },
  });
}

const request = (id: string) => ({ kind: 'request', id, labels: ['small-node'] });

async function release(harness: Harness, nodeId: string, force = false): Promise<void> {
  await harness.send({ kind: 'release', nodeId, ...(force ? { force } : {}) });
  await harness.drainRequests();
}

describe('retirement rules (embedded engines, manual clock)', () => {
  it('keeps an empty backing node until min-retention-time since launch, even after grace-time', async () => {
    h = await startHarness(config({ grace: 1, minRetention: 600 }));
    await readyNode(h, 'a');
    await release(h, 'a/0');
    h.clock.advance(300 * SEC);
    expect((await h.pool.reapNow()).retired).toEqual([]);
    h.clock.advance(300 * SEC);
    expect((await h.pool.reapNow()).retired).toHaveLength(1);
  });

  it('takes no new nodes past max-age and retires the backing node at once when its last node goes', async () => {
    h = await startHarness(config({ grace: 600, minRetention: 60, maxAge: 100 }));
    await readyNode(h, 'old');
    const store = h.pool.context.store;
    const first = (await store.getRequest('old'))?.nodes[0]?.backingNodeId;
    h.clock.advance(100 * SEC);
    await readyNode(h, 'new');
    expect((await store.getRequest('new'))?.nodes[0]?.backingNodeId).not.toBe(first);
    expect((await store.getBacking(first as string))?.drained).toBe(true);
    await release(h, 'old/0');
    const report = await h.pool.reapNow();
    expect(report.retired).toEqual([first]); // no grace-time, no min-retention
  });

  it('retires an empty backing node of a label removed from the configuration at once', async () => {
    h = await startHarness(config({ grace: 600 }));
    await readyNode(h, 'r');
    await release(h, 'r/0');
    const renamed: Context = {
      ...h.pool.context,
      config: parseConfigOrThrow(config({ label: 'other-node' }), 'new.yaml'),
    };
    expect((await reap(h.pool.context)).retired).toEqual([]);
    expect((await reap(renamed)).retired).toHaveLength(1);
  });
});

describe('launch deadlines and retries', () => {
  it('moves a waiting node to a new backing node after launch-timeout, then fails the request after launch-retries', async () => {
    // boot-delay far beyond the test: these backing nodes never become ready.
    h = await startHarness(config({ bootDelay: 3600, launchTimeout: 10, retries: 2 }));
    await h.send(request('slow'));
    await h.drainRequests();
    const store = h.pool.context.store;
    const firstBacking = (await store.getRequest('slow'))?.nodes[0]?.backingNodeId as string;
    h.clock.advance(11 * SEC);
    const first = await h.pool.reapNow();
    expect(first.failed).toEqual([firstBacking]);
    expect(first.moved).toBe(1);
    const moved = (await store.getRequest('slow'))?.nodes[0];
    expect(moved).toMatchObject({ state: 'pending', attempts: 2 });
    expect(moved?.backingNodeId).not.toBe(firstBacking);
    expect((await store.getBacking(firstBacking))?.state).toBe('stopped');

    h.clock.advance(11 * SEC);
    await h.pool.reapNow();
    const r = await store.getRequest('slow');
    expect(r?.state).toBe('failed');
    expect(r?.reason).toBe('node slow/0 failed after 2 attempt(s): launch-timeout of 10s exceeded');
    expect((await store.listBacking()).map((b) => b.state)).toEqual(['stopped', 'stopped']);
    expect(await h.pool.localProvider.list()).toEqual([]);
  });
});

describe('host-key-checking', () => {
  it('gives each node the host keys scanned from its backing node', async () => {
    h = await startHarness(config({ hostKeyChecking: true }));
    await readyNode(h, 'hk');
    const node = (await h.pool.context.store.getRequest('hk'))?.nodes[0];
    expect(node?.hostKeys?.[0]).toMatch(/^ssh-ed25519 AAAA/);
    expect(node?.hostKeys).toEqual(node?.attributes?.hostKeys);
  });

  it('marks a backing node failed when its scan fails and moves the node to a new backing node', async () => {
    h = await startHarness(config({ hostKeyChecking: true }));
    let refused: string | undefined;
    // The first backing node's scan fails (as a host whose sshd is broken would); the others are real.
    Object.assign(h.pool.context, {
      scanHostKeys: async (host: string, port: number, timeoutMs: number) => {
        if (refused === undefined) {
          refused = `${port}`;
          throw new Error('host-key scan of the first backing node failed: connection reset');
        }
        return scanHostKeys(host, port, timeoutMs);
      },
    });
    await readyNode(h, 'moved');
    const store = h.pool.context.store;
    const node = (await store.getRequest('moved'))?.nodes[0];
    expect(node).toMatchObject({ state: 'ready', attempts: 2 });
    // Moved, it carries the contract of the backing node it ended on (Nodepool's defaults here).
    expect(node).toMatchObject({ connectionType: 'ssh', pythonPath: 'auto' });
    expect(node?.hostKeys?.[0]).toMatch(/^ssh-/);
    const failed = (await store.listBacking()).find((b) => b.state === 'failed');
    expect(failed?.reason).toMatch(/^host-key scan failed: /);
    expect(failed?.port).toBe(Number(refused));
  });
});

describe('reconciliation', () => {
  it('terminates a resource tagged as ours that has no record, after a short grace', async () => {
    h = await startHarness(config({}));
    const { resourceId } = await h.pool.localProvider.launch({
      backingNodeId: 'bn-orphan',
      attempt: 1,
      poolKey: 'local/main',
      label: 'large-node',
    });
    await h.fulfilUntil(async () => (await h?.pool.localProvider.describe(resourceId))?.state === 'running');
    const pid = (await h.pool.localProvider.describe(resourceId))?.attributes.pid as number;
    // A short grace first: a launch may be about to record it.
    expect((await h.pool.reapNow()).orphans).toEqual([]);
    expect(alive(pid)).toBe(true);
    h.clock.advance(2 * 60 * SEC);
    const report = await h.pool.reapNow();
    expect(report.orphans).toEqual([resourceId]);
    expect(alive(pid)).toBe(false);
  });

  it('fails a backing node whose resource vanished without an event, and moves its waiting nodes', async () => {
    h = await startHarness(config({ bootDelay: 3600 }));
    await h.send(request('w'));
    await h.drainRequests();
    const store = h.pool.context.store;
    const b = (await store.listBacking())[0];
    const pid = (await h.pool.localProvider.describe(b?.resourceId as string))?.attributes.pid as number;
    process.kill(pid, 'SIGKILL'); // the event goes to the fulfil queue, which this test never drains
    await new Promise((r) => setTimeout(r, 200));
    const report = await h.pool.reapNow();
    expect(report.failed).toContain(b?.id);
    expect(report.moved).toBe(1);
    const node = (await store.getRequest('w'))?.nodes[0];
    expect(node?.backingNodeId).not.toBe(b?.id);
    expect(node?.state).toBe('pending');
  });

  it('gives back a slot whose claim was never recorded once its delivery is known dead', async () => {
    h = await startHarness(config({}));
    await readyNode(h, 'kept');
    const store = h.pool.context.store;
    const b = (await store.listBacking())[0];
    if (!b) throw new Error('no backing node');
    // A handler claimed slot 1 (of a backing node it found, not one launched for it) and crashed before
    // recording its node: the claim goes once its delivery is known dead (CLAIM_TAKEOVER_MS, 60 s).
    const { next } = withClaimedSlot(b, 'crashed/0', h.clock.now(), 'crashed-delivery');
    await store.putBacking(next, { version: b.version });
    h.clock.advance(59 * SEC);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(0);
    h.clock.advance(1 * SEC);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(1);
    const after = await store.getBacking(b.id);
    expect(after?.slotMap).toEqual({ '0': 'kept/0' });
    // kept/0's claim is on the backing node launched for it: looked at (and confirmed) after the lease.
    expect(Object.keys(after?.claims ?? {})).toEqual(['0']);
    h.clock.advance(4 * 60 * SEC);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(0);
    expect((await store.getBacking(b.id))?.claims).toEqual({}); // the recorded claim was confirmed
  });
});

describe('operator verbs', () => {
  it('holds a node: a plain release is refused, a forced one frees it', async () => {
    h = await startHarness(config({}));
    await readyNode(h, 'held');
    await holdNode(h.pool.context, 'held/0');
    const store = h.pool.context.store;
    const refused = await h.pool.handlers.request(
      sqsEvent([JSON.stringify({ kind: 'release', nodeId: 'held/0' })]),
    );
    expect(refused.batchItemFailures).toEqual([]); // refused for good, not retried
    expect((await store.getRequest('held'))?.nodes[0]).toMatchObject({ state: 'ready', held: true });
    await release(h, 'held/0', true);
    expect((await store.getRequest('held'))?.nodes[0]?.state).toBe('released');
  });

  it('drains a backing node: new nodes go elsewhere, and it is retired at once when empty', async () => {
    h = await startHarness(config({ grace: 600 }));
    await readyNode(h, 'd1');
    const store = h.pool.context.store;
    const drained = (await store.getRequest('d1'))?.nodes[0]?.backingNodeId as string;
    await drainBacking(h.pool.context, drained);
    await readyNode(h, 'd2');
    expect((await store.getRequest('d2'))?.nodes[0]?.backingNodeId).not.toBe(drained);
    await release(h, 'd1/0');
    expect((await h.pool.reapNow()).retired).toEqual([drained]);
  });
});
