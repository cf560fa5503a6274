import { GetItemCommand } from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient } from '@aws-sdk/lib-dynamodb';
import { marshall, unmarshall } from '@aws-sdk/util-dynamodb';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { spreadSlot, withClaimedSlot } from '../../shared/core/backing.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { ConflictError } from '../../shared/core/errors.ts';
import { ownerToken } from '../../shared/core/ids.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { BackingProvider } from '../../shared/core/provider.ts';
import type { BackingRecord } from '../../shared/core/records.ts';
import {
  CLAIM_TAKEOVER_MS,
  deadlineOf,
  FUNCTION_TIMEOUT_SECONDS,
  invocationFor,
  SLOT_LEASE_MS,
} from '../../shared/core/timing.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys } from '../../shared/store/table.ts';
import { forEachBounded, WRITES_IN_FLIGHT } from '../../shared/usecases/bounded.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { releaseNode } from '../../shared/usecases/release/release.ts';
import { baseConfig, largeNode, poolConfig, smallNode } from '../../testkit/configs.ts';
import { crashingStore } from '../../testkit/crashingStore.ts';
import { type Harness, readyNode, sqsEvent, startHarness } from '../../testkit/harness.ts';
import { holdPlaces } from '../../testkit/heldPlaces.ts';
import { startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';
import { alive } from '../../testkit/processes.ts';

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

describe('reaper (dynalite + local processes, manual clock)', () => {
  it('stops an empty backing node once grace-time has passed since its last release, not before', async () => {
    h = await startHarness(baseConfig({ slots: 2, grace: 30 }));
    await readyNode(h, 'g');
    const store = h.pool.context.store;
    const pid = (await store.getRequest('g'))?.nodes[0]?.attributes?.pid as number;
    expect(alive(pid)).toBe(true);

    h.clock.advance(100_000); // long idle while in use: irrelevant, it holds a node
    expect((await h.pool.reapNow()).retired).toEqual([]);
    await h.send({ kind: 'release', nodeId: 'g/0' });
    await h.drainRequests();

    h.clock.advance(29_000);
    expect((await h.pool.reapNow()).retired).toEqual([]);
    h.clock.advance(1_000);
    const report = await h.pool.reapNow();
    expect(report.retired).toHaveLength(1);
    expect(report.stopped).toEqual(report.retired);
    const [b] = await store.listBacking();
    expect(b?.state).toBe('stopped');
    expect(alive(pid)).toBe(false);
    // A stopped backing node is no candidate: the next request launches a new one.
    await h.send({ kind: 'request', id: 'after', labels: ['small-node'] });
    await h.drainRequests();
    expect((await store.getRequest('after'))?.nodes[0]?.backingNodeId).not.toBe(b?.id);
  });

  it('never retires a backing node that a claim reached after the reaper read it', async () => {
    h = await startHarness(baseConfig({ slots: 2, grace: 0 }));
    await readyNode(h, 'x');
    await h.send({ kind: 'release', nodeId: 'x/0' });
    await h.drainRequests();
    const store = h.pool.context.store;
    const [read] = await store.backingInPhase('idle');
    expect(read?.used).toBe(0);
    // An allocation lands between the reaper's read and its write.
    const { next } = withClaimedSlot(read as NonNullable<typeof read>, 'late/0', h.clock.now(), 'late');
    await store.putBacking(next, { version: read?.version as number, states: ['launching', 'ready'] });
    const { markRetiring } = await import('../../shared/core/backing.ts');
    await expect(
      store.putBacking(markRetiring(read as NonNullable<typeof read>, h.clock.now(), 'test'), {
        version: read?.version as number,
        states: ['ready'],
        used: 0,
      }),
    ).rejects.toBeInstanceOf(ConflictError);
    const report = await reap(h.pool.context);
    expect(report.retired).toEqual([]);
    expect((await store.getBacking(read?.id as string))?.state).toBe('ready');
  });

  it('races the reaper against many allocations without ever stopping a backing node that holds a node', async () => {
    h = await startHarness(baseConfig({ slots: 4, grace: 0 }));
    await readyNode(h, 'seed');
    await h.send({ kind: 'release', nodeId: 'seed/0' });
    await h.drainRequests();
    const store = h.pool.context.store;
    const ctx = h.pool.context;
    const { requestNodes } = await import('../../shared/usecases/place/requestNodes.ts');
    // Allocations and reaper runs interleave freely on one nearly-empty backing node.
    const work: Promise<unknown>[] = [];
    for (let i = 0; i < 12; i++) {
      work.push(
        requestNodes(ctx, { kind: 'request', id: `race-${i}`, labels: ['small-node'] }).catch(
          () => undefined,
        ),
      );
      work.push(reap(ctx));
    }
    await Promise.all(work);
    for (const b of await store.listBacking()) {
      if (b.state === 'stopped' || b.state === 'retiring') {
        expect(b.used).toBe(0);
      }
    }
    // Every placed node sits on a backing node that is not stopped, in a slot that names it.
    for (let i = 0; i < 12; i++) {
      const r = await store.getRequest(`race-${i}`);
      for (const n of r?.nodes ?? []) {
        if (n.state !== 'pending' && n.state !== 'ready') continue;
        const b = await store.getBacking(n.backingNodeId as string);
        expect(b?.state === 'ready' || b?.state === 'launching').toBe(true);
        expect(b?.slotMap[String(n.slot)]).toBe(n.id);
      }
    }
  });
});

describe('slot claims under contention (dynalite)', () => {
  it('gives every slot to exactly one node when many claims hit one backing node at once', async () => {
    h = await startHarness(baseConfig({ slots: 8 }));
    await readyNode(h, 'base'); // one ready backing node, slot 0 used
    const store = h.pool.context.store;
    const [b0] = await store.listBacking();
    const id = b0?.id as string;
    const claimers = Array.from({ length: 24 }, (_, i) => `n-${i}/0`);
    // The production claim: one UpdateItem on a slot chosen by node id, retried on what it returns.
    const results = await Promise.all(
      claimers.map(async (nodeId) => {
        let b = await store.getBacking(id);
        for (let i = 0; b && b.used < b.slots; i++) {
          const slot = spreadSlot(b, `${nodeId}#${i}`) as number;
          const out = await store.claimSlot(b, slot, nodeId, { at: Date.now(), by: nodeId });
          if (out.claimed) return true;
          b = out.current;
        }
        return false;
      }),
    );
    expect(results.filter(Boolean)).toHaveLength(7);
    const final = await store.getBacking(id);
    const holders = Object.values(final?.slotMap ?? {});
    expect(final?.used).toBe(8);
    expect(new Set(holders).size).toBe(8);
    expect(holders.filter((n) => n !== 'base/0').sort()).toEqual(
      claimers.filter((_, i) => results[i]).sort(),
    );
  });
});

describe('claims a crashed delivery left (issue 10, defect 8)', () => {
  it('gives back a claim that filled its backing node once its delivery is known dead, not after the slot lease', async () => {
    h = await startHarness(baseConfig({ slots: 2 }), { maxReceiveCount: 50 });
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const [full] = await ctx.store.listBacking();
    // A delivery claims the last slot and dies: the backing node left the free index with it.
    const dying = makeRequestHandler({ ...ctx, store: crashingStore(ctx.store, (m) => m === 'claimSlot') });
    const body = JSON.stringify({ kind: 'request', id: 'lost', labels: ['small-node'] });
    expect((await dying(sqsEvent([body], 1))).batchItemFailures).toHaveLength(1);
    expect((await ctx.store.getBacking(full?.id as string))?.used).toBe(2);
    expect(await ctx.store.findCandidates('meta/main', 'small-node', 10)).toMatchObject({ items: [] });
    h.clock.advance(CLAIM_TAKEOVER_MS - 1);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(0); // its delivery may live
    h.clock.advance(1);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(1);
    expect((await ctx.store.getBacking(full?.id as string))?.slotMap).toEqual({ '0': 'base/0' });
  });

  it('keeps the claim on a backing node launched for its node for the slot lease: a redelivery finds it by id', async () => {
    h = await startHarness(baseConfig({ slots: 2 }), { maxReceiveCount: 50 });
    const ctx = h.pool.context;
    // A delivery writes the intent (the node in slot 0, claimed), launches, and dies before recording.
    const dying = makeRequestHandler({
      ...ctx,
      store: crashingStore(ctx.store, (m) => m === 'pointToBacking'),
    });
    const body = JSON.stringify({ kind: 'request', id: 'launching', labels: ['small-node'] });
    expect((await dying(sqsEvent([body], 1))).batchItemFailures).toHaveLength(1);
    const [b] = await ctx.store.listBacking();
    expect(b?.slotMap).toEqual({ '0': 'launching/0' });
    h.clock.advance(CLAIM_TAKEOVER_MS);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(0);
    h.clock.advance(SLOT_LEASE_MS - CLAIM_TAKEOVER_MS);
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(1);
  });
});

describe('nodes left pending on a backing node that became ready', () => {
  it('are readied by the next reaper run when their readying was cut short', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    await readyNode(h, 'first');
    const store = h.pool.context.store;
    const [b] = await store.listBacking();
    if (!b) throw new Error('no backing node');
    // The state a crash leaves when it cuts markNodesReady short after the backing node was written
    // ready (the reaper's reconciliation swallows the error; the running event was consumed earlier): a
    // node recorded pending on a ready backing node, its slot held.
    const slot = spreadSlot(b, 'late/0') as number;
    const claimed = await store.claimSlot(b, slot, 'late/0', { at: h.clock.now(), by: 'gone' });
    expect(claimed.claimed).toBe(true);
    await store.reserveNodePlaces('meta/main', ['late/0'], 100, 'gone');
    await store.createRequest({
      id: 'late',
      labels: ['small-node'],
      bodyHash: 'x',
      state: 'pending',
      poolKey: 'meta/main',
      createdAt: h.clock.now(),
      updatedAt: h.clock.now(),
      version: 1,
      nodes: [
        { id: 'late/0', label: 'small-node', state: 'pending', backingNodeId: b.id, slot, attempts: 1 },
      ],
    });
    const report = await h.pool.reapNow();
    expect(report.nodesReadied).toBe(1);
    const late = await store.getRequest('late');
    expect(late?.state).toBe('fulfilled');
    expect(late?.nodes[0]).toMatchObject({ state: 'ready', host: b.host, port: b.port });
  });

  it('are looked for by reading a request only while one of its nodes there may be pending', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    await readyNode(h, 'first');
    const ctx = h.pool.context;
    const reads = vi.spyOn(ctx.store, 'getRequest');
    await reap(ctx); // sees first/0 ready: it is never pending again
    reads.mockClear();
    await reap(ctx);
    await reap(ctx);
    expect(reads.mock.calls.filter(([id]) => id === 'first')).toEqual([]);
    reads.mockRestore();
  });
});

describe('what one run reads', () => {
  it('reads the FAILED partition and each max-servers set once', async () => {
    h = await startHarness(baseConfig({ slots: 2, maxServers: 4, backingMax: 2 }));
    await readyNode(h, 'held');
    const store = h.pool.context.store;
    const spies = {
      phases: vi.spyOn(store, 'backingInPhase'),
      nodePlaces: vi.spyOn(store, 'nodePlaces'),
      backingPlaces: vi.spyOn(store, 'backingPlaces'),
    };
    const report = await reap(h.pool.context);
    expect(report.errors).toEqual([]);
    expect(spies.phases.mock.calls.map(([phase]) => phase).sort()).toEqual([
      'active',
      'failed',
      'idle',
      'launching',
      'retiring',
    ]);
    expect(spies.nodePlaces).toHaveBeenCalledTimes(1);
    expect(spies.backingPlaces).toHaveBeenCalledTimes(1);
    // The places the check saw are the set's: the live node's place is kept, none given back.
    expect(report.reclaimedPlaces).toBe(0);
    expect([...(await store.nodePlaces('meta/main')).keys()]).toEqual(['held/0']);
    for (const spy of Object.values(spies)) spy.mockRestore();
  });
});

describe('ended records and DynamoDB TTL (issue 24)', () => {
  const RETENTION = 5 * 86400;
  /** The raw item, as DynamoDB's TTL sees it. */
  const item = async (harness: Harness, key: { pk: string; sk: string }) =>
    unmarshall(
      (
        await harness.pool.dynamodb.send(
          new GetItemCommand({
            TableName: harness.pool.info.tableName,
            Key: marshall(key),
            ConsistentRead: true,
          }),
        )
      ).Item ?? {},
    );
  const expiresAt = (endedAt: number) => Math.ceil(endedAt / 1000) + RETENTION;

  it('gives a request its purge time (record-retention) when it ends and a backing node when it stops, never a live one', async () => {
    h = await startHarness(
      poolConfig({
        top: { 'record-retention': RETENTION },
        backing: { labels: [largeNode({ 'boot-delay': 0 })] },
        meta: { labels: [smallNode({ 'max-parallel-jobs': 2, 'grace-time': 0 })] },
      }),
    );
    const store = h.pool.context.store;
    // A two-node request: live until its last node ends.
    await h.send({ kind: 'request', id: 'pair', labels: ['small-node', 'small-node'] });
    await h.drainRequests();
    await h.fulfilUntil(async () => (await store.getRequest('pair'))?.state === 'fulfilled');
    expect((await item(h, keys.request('pair'))).expiresAt).toBeUndefined();
    await releaseNode(h.pool.context, 'pair/0');
    expect((await item(h, keys.request('pair'))).expiresAt).toBeUndefined();
    await releaseNode(h.pool.context, 'pair/1');
    const released = await store.getRequest('pair');
    expect((await item(h, keys.request('pair'))).expiresAt).toBe(
      expiresAt(released?.nodes[1]?.releasedAt ?? 0),
    );
    // A one-node request (most are): its release gives it its purge time in the same update, no other write.
    await readyNode(h, 'solo');
    const commands: string[] = [];
    h.pool.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        commands.push(String(context.commandName));
        return next(args);
      },
      { step: 'initialize', name: 'ttlTestCommands' },
    );
    await releaseNode(h.pool.context, 'solo/0');
    h.pool.dynamodb.middlewareStack.remove('ttlTestCommands');
    // The release's update, then the slot given back (read, put).
    expect(commands.filter((c) => c.startsWith('Update'))).toHaveLength(1);
    const solo = await store.getRequest('solo');
    expect((await item(h, keys.request('solo'))).expiresAt).toBe(expiresAt(solo?.nodes[0]?.releasedAt ?? 0));
    // A request that can never be served ends at once.
    await h.send({ kind: 'request', id: 'unknown', labels: ['no-such-label'] });
    await h.drainRequests();
    const failed = await store.getRequest('unknown');
    expect(failed?.state).toBe('failed');
    expect((await item(h, keys.request('unknown'))).expiresAt).toBe(expiresAt(failed?.updatedAt ?? 0));
    // The backing node: none while it runs, its purge time once stopped.
    const [b] = await store.listBacking();
    expect((await item(h, keys.backing(b?.id ?? ''))).expiresAt).toBeUndefined();
    h.clock.advance(1_000);
    expect((await h.pool.reapNow()).stopped).toEqual([b?.id]);
    const stopped = await store.getBacking(b?.id ?? '');
    expect((await item(h, keys.backing(b?.id ?? ''))).expiresAt).toBe(expiresAt(stopped?.stoppedAt ?? 0));
  });
});

describe('a fleet of idle backing nodes (issue 26, item 4)', () => {
  /** Ready, empty, long past grace-time, its resource running in `running`. */
  const idleBacking = (i: number, now: number): BackingRecord => ({
    id: `bn-${String(i).padStart(3, '0')}`,
    poolKey: 'meta/main',
    label: 'small-node',
    backingPoolKey: 'local/main',
    backingLabel: 'large-node',
    state: 'ready',
    slots: 2,
    used: 0,
    slotMap: {},
    version: 1,
    attempt: 1,
    resourceId: `res-${i}`,
    host: '127.0.0.1',
    port: 22,
    attributes: {},
    launchedAt: now - 3_600_000,
    runningAt: now - 3_590_000,
    readyAt: now - 3_580_000,
    lastUsedAt: now - 600_000,
  });

  it('retires them with several conditional writes in flight, stops every one and frees every place', async () => {
    const IDLE = 3 * WRITES_IN_FLIGHT;
    const engine = await startInProcessDynalite();
    try {
      await ensureTable(engine.client, 'fleet');
      const clock = new ManualClock();
      const store = new DynamoStore(engine.client, 'fleet', clock);
      const running = new Set<string>();
      const resource = (resourceId: string) => ({
        resourceId,
        backingNodeId: `bn-${resourceId.slice(4).padStart(3, '0')}`,
        poolKey: 'local/main',
        state: running.has(resourceId) ? ('running' as const) : ('terminated' as const),
        attributes: {},
      });
      const terminated: string[][] = [];
      const provider: BackingProvider = {
        launch: async () => {
          throw new Error('no launch expected');
        },
        describe: async (id) => resource(id),
        describeMany: async (ids) => new Map(ids.map((id) => [id, resource(id)])),
        terminate: async (id) => void running.delete(id),
        terminateMany: async (ids) => {
          terminated.push([...ids]);
          for (const id of ids) running.delete(id);
        },
        list: async () => [...running].map(resource),
      };
      const ctx: Context = {
        store,
        config: parseConfigOrThrow(baseConfig({ slots: 2, grace: 60, backingMax: 1000 }), 'fleet.yaml'),
        providers: { forPool: () => provider, forResource: () => provider },
        clock,
        log: silentLog,
      };
      const fleet = Array.from({ length: IDLE }, (_, i) => idleBacking(i, clock.now()));
      await Promise.all(fleet.map((b) => store.createBacking(b)));
      for (const b of fleet) running.add(b.resourceId as string);
      // Their places, as reserves long finished leave them (one reserved through the store, copies of it).
      const owner = ownerToken(clock.now() - 3_600_000);
      const doc = DynamoDBDocumentClient.from(engine.client);
      const set = keys.backingPool('local/main');
      await holdPlaces(
        doc,
        'fleet',
        store.capacity,
        set,
        fleet.map((b) => b.id),
        () => owner,
      );
      // Backing items written (retiring, then stopped) at once, as the SDK sees them.
      let inFlight = 0;
      let most = 0;
      engine.client.middlewareStack.add(
        (next) => async (args) => {
          const item = (args.input as { Item?: { pk?: string } }).Item;
          if (!item?.pk?.startsWith('BACKING#')) return next(args);
          most = Math.max(most, ++inFlight);
          try {
            return await next(args);
          } finally {
            inFlight--;
          }
        },
        { step: 'initialize', name: 'fleetInFlight' },
      );
      const report = await reap(ctx);
      expect(report.errors).toEqual([]);
      expect(report.retired).toHaveLength(IDLE);
      expect(new Set(report.stopped)).toEqual(new Set(report.retired));
      expect(terminated).toHaveLength(1); // one batch
      expect(terminated[0]).toHaveLength(IDLE);
      expect(
        (await store.backingInPhase('idle')).length + (await store.backingInPhase('retiring')).length,
      ).toBe(0);
      expect(await store.backingPlaces('local/main')).toEqual(new Map());
      expect(await store.capacity.used(set)).toBe(0);
      expect(most).toBeGreaterThan(1);
      expect(most).toBeLessThanOrEqual(WRITES_IN_FLIGHT);
    } finally {
      await engine.close();
    }
  });

  it('stops starting them once the invocation runs short, and leaves the rest for the next run', async () => {
    let left = 3;
    const items = Array.from({ length: 40 }, (_, i) => i);
    const started: number[] = [];
    await forEachBounded(items, 4, async (i) => {
      started.push(i);
      await new Promise((r) => setTimeout(r, 1));
      return --left > 0;
    });
    // 4 start; the first two to finish have time left and their workers start 4 and 5; the third finds
    // it gone: those running finish, nothing more starts.
    expect(started).toEqual([0, 1, 2, 3, 4, 5]);
  });
});

describe('launching backing nodes whose resource runs, at scale (issue 40, defect 3)', () => {
  it('checks them several at once within a bounded part of the run, and still retires and ends lapsed leases', async () => {
    const LAUNCHING = 600;
    const engine = await startInProcessDynalite();
    try {
      await ensureTable(engine.client, 'scale-up');
      const clock = new ManualClock();
      const store = new DynamoStore(engine.client, 'scale-up', clock);
      const now = clock.now();
      const base = {
        poolKey: 'meta/main',
        label: 'small-node',
        backingPoolKey: 'local/main',
        backingLabel: 'large-node',
        slots: 2,
        version: 1,
        attempt: 1,
      } as const;
      // A scale-up: each launched for a node, its instance running, its host keys not in the console yet.
      const launching: BackingRecord[] = Array.from({ length: LAUNCHING }, (_, i) => ({
        ...base,
        id: `bn-l${String(i).padStart(3, '0')}`,
        state: 'launching',
        used: 1,
        slotMap: { '0': `scale-${i}/0` },
        resourceId: `res-l${i}`,
        resourceRecordedAt: now - 20_000,
        launchedAt: now - 30_000,
        lastUsedAt: now - 30_000,
      }));
      // An empty backing node past its grace-time, and one holding a node whose client lease lapsed.
      const idle: BackingRecord = {
        ...base,
        id: 'bn-idle',
        state: 'ready',
        used: 0,
        slotMap: {},
        resourceId: 'res-idle',
        host: '127.0.0.1',
        port: 22,
        attributes: {},
        launchedAt: now - 3_600_000,
        runningAt: now - 3_590_000,
        readyAt: now - 3_580_000,
        lastUsedAt: now - 600_000,
      };
      const leased: BackingRecord = {
        ...idle,
        id: 'bn-leased',
        resourceId: 'res-leased',
        used: 1,
        slotMap: { '0': 'leased/0' },
        lastUsedAt: now - 60_000,
      };
      await Promise.all([...launching, idle, leased].map((b) => store.createBacking(b)));
      await store.createRequest({
        id: 'leased',
        labels: ['small-node'],
        bodyHash: 'h',
        state: 'fulfilled',
        poolKey: 'meta/main',
        createdAt: now - 600_000,
        updatedAt: now - 600_000,
        version: 1,
        nodes: [
          {
            id: 'leased/0',
            label: 'small-node',
            state: 'ready',
            backingNodeId: 'bn-leased',
            slot: 0,
            host: '127.0.0.1',
            port: 22,
          },
        ],
        lease: 60,
        leaseExpiresAt: now - 1_000,
      });
      const running = new Set([...launching, idle, leased].map((b) => b.resourceId as string));
      const resource = (resourceId: string) => {
        const b = [...launching, idle, leased].find((x) => x.resourceId === resourceId);
        return {
          resourceId,
          backingNodeId: b?.id ?? 'unknown',
          poolKey: 'local/main',
          state: running.has(resourceId) ? ('running' as const) : ('terminated' as const),
          host: '10.0.0.1',
          port: 22,
          attributes: {},
        };
      };
      // Each console read takes 100 ms of the run's time (as EC2 would): how many at once is counted.
      let reads = 0;
      let inFlight = 0;
      let most = 0;
      const provider: BackingProvider = {
        launch: async () => {
          throw new Error('no launch expected');
        },
        describe: async (id) => resource(id),
        describeMany: async (ids) => new Map(ids.map((id) => [id, resource(id)])),
        terminate: async (id) => void running.delete(id),
        terminateMany: async (ids) => {
          for (const id of ids) running.delete(id);
        },
        list: async () => [...running].map(resource),
        reportedHostKeys: async () => {
          reads++;
          most = Math.max(most, ++inFlight);
          try {
            clock.advance(100);
            await new Promise((r) => setTimeout(r, 1));
            return { kind: 'none' };
          } finally {
            inFlight--;
          }
        },
      };
      const ctx: Context = {
        store,
        config: parseConfigOrThrow(baseConfig({ slots: 2, grace: 60 }), 'scale-up.yaml'),
        providers: { forPool: () => provider, forResource: () => provider },
        hostKeyPlan: () => ({ source: 'console', reachable: false }),
        clock,
        log: silentLog,
        // The reaper function's invocation: 60 s, on this clock.
        deadline: deadlineOf(invocationFor(clock, FUNCTION_TIMEOUT_SECONDS.reaper * 1000)),
      };
      const report = await reap(ctx);
      expect(report.errors).toEqual([]);
      // The other steps ran in the same run: the idle backing node retired, the lapsed lease ended.
      expect(report.retired).toEqual(['bn-idle']);
      expect(report.leasesExpired).toEqual(['leased']);
      // The checks: several at once, within a bounded part of the run; the rest left for the next run.
      expect(most).toBeGreaterThan(1);
      expect(reads).toBeLessThan(LAUNCHING);
      expect(report.deferred).toBeGreaterThan(0);
      // Every one checked has its first `running` report stamped (boot-timeout counts from it).
      const stamped = (await store.backingInPhase('launching')).filter((b) => b.runningAt !== undefined);
      expect(stamped).toHaveLength(reads);
    } finally {
      await engine.close();
    }
  });
});
