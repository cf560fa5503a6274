import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { PoolClient } from '../../cli/client.ts';
import { poolStatus } from '../../cli/commands/status.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { ownerToken, parseNodeId } from '../../shared/core/ids.ts';
import { isFreeSpare, isSpareRequestId, takenSpare } from '../../shared/core/minReady.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { CLAIM_TAKEOVER_MS } from '../../shared/core/timing.ts';
import { QUEUE_FORGET_MS } from '../../shared/core/waitingQueue.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { countArrival, flushArrivals } from '../../shared/usecases/ready/forecasts.ts';
import { takeSpare } from '../../shared/usecases/ready/minReady.ts';
import { keepMinReady } from '../../shared/usecases/ready/replenish.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { failBackingNode } from '../../shared/usecases/release/failure.ts';
import { releaseNode } from '../../shared/usecases/release/release.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { crashingStore } from '../../testkit/crashingStore.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * min-ready (issue 14): the pool keeps ready, unassigned nodes of a label; a request takes one at once
 * and the pool replaces it. On dynalite + fauxqs + local processes.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const request = (id: string) => ({ kind: 'request', id, labels: ['small-node'] });

async function spares(harness: Harness): Promise<RequestRecord[]> {
  return (await harness.pool.context.store.listRequests()).filter((r) => isSpareRequestId(r.id));
}
/** Live min-ready nodes nobody took: what min-ready counts. */
async function untaken(harness: Harness): Promise<number> {
  return (await spares(harness)).filter((r) => {
    const n = r.nodes[0];
    return r.state === 'requested' || (n && (n.state === 'pending' || n.state === 'ready') && !n.takenBy);
  }).length;
}
async function freeSpares(harness: Harness): Promise<number> {
  return (await spares(harness)).filter((r) => isFreeSpare(r.nodes[0])).length;
}
const requestOf = (nodeId: string | undefined): string => parseNodeId(nodeId ?? '')?.requestId ?? '';
/** A pool whose reaper made its `n` min-ready nodes, all ready. */
async function withReadyNodes(
  yaml: string,
  n: number,
  options?: { maxReceiveCount?: number },
): Promise<Harness> {
  const harness = await startHarness(yaml, options);
  h = harness;
  await harness.pool.reapNow();
  await harness.fulfilUntil(allFree(harness, n));
  return harness;
}
/** A min-ready node taken by a delivery (for node `ghost/0`) that then records nothing: it died. */
async function takenByGhost(ctx: Context) {
  const pool = ctx.config.metastaticPools[0];
  if (!pool) throw new Error('no pool');
  return takeSpare(ctx, pool, 'small-node', 'ghost/0', ownerToken(ctx.clock.now()));
}
const allFree = (harness: Harness, n: number) => async () => (await freeSpares(harness)) === n;

describe('min-ready', () => {
  it('keeps min-ready nodes ready; a request takes one at once, with no launch, and the pool replaces it', async () => {
    h = await startHarness(baseConfig({ slots: 2, minReady: 2 }));
    const ctx = h.pool.context;
    const report = await h.pool.reapNow();
    expect(report.minReadyMade).toBe(2);
    await h.fulfilUntil(allFree(h, 2));
    const backing = await ctx.store.listBacking();
    expect(backing).toHaveLength(1);
    expect(backing[0]?.used).toBe(2); // min-ready nodes keep their backing node in use (never idle)
    expect(backing[0]?.state).toBe('ready');

    await h.send(request('r1'));
    await h.drainRequests();
    // Fulfilled by the request handler alone: no fulfil event, no launch waited for.
    const r1 = await ctx.store.getRequest('r1');
    expect(r1?.state).toBe('fulfilled');
    const node = r1?.nodes[0];
    expect(node?.spare).toMatch(/^min-ready:small-node:\d+:0\/0$/);
    expect(node?.backingNodeId).toBe(backing[0]?.id);
    expect(node?.host).toBe(backing[0]?.host);
    // The request handler refilled the seat: a new min-ready node, on a new backing node (the first is full).
    expect(await untaken(h)).toBe(2);
    await h.fulfilUntil(allFree(h, 2));
    expect(await ctx.store.listBacking()).toHaveLength(2);
    // `metastatic status`: r1's node is ready, two min-ready nodes are free, nothing counted twice.
    const status = await poolStatus({ store: ctx.store } as unknown as PoolClient, Date.now());
    expect(status.labels).toEqual([
      expect.objectContaining({
        label: 'small-node',
        nodesReady: 1,
        nodesPending: 0,
        minReady: 2,
        requestsWaiting: 0,
      }),
    ]);
    expect(status.waiting).toEqual([]);

    // Releasing the node ends the min-ready node it took: its slot is free again.
    expect((await releaseNode(ctx, 'r1/0')).kind).toBe('released');
    const spare = await ctx.store.getRequest(requestOf(node?.spare));
    expect(spare?.nodes[0]?.state).toBe('released');
    expect((await ctx.store.getBacking(backing[0]?.id as string))?.used).toBe(1);
    expect((await ctx.store.getRequest('r1'))?.nodes[0]?.state).toBe('released');
    expect(await freeSpares(h)).toBe(2);
  });

  it('takes a min-ready node and replaces it in at most 8 DynamoDB calls (issue 26: 15)', async () => {
    const harness = await withReadyNodes(baseConfig({ slots: 4, minReady: 1, backingMax: 4 }), 1);
    // Nothing waited for QUEUE_FORGET_MS (the spare's own launch had): the reaper forgot the queue.
    harness.clock.advance(QUEUE_FORGET_MS);
    await harness.pool.reapNow();
    expect(await harness.pool.context.store.waitingQueues()).toEqual([]);
    // The request function itself (not the embedded pool's sync of its local backing processes).
    const handler = makeRequestHandler(harness.pool.context);
    const deliver = (id: string) => handler(sqsEvent([JSON.stringify(request(id))]));
    // A first take: the registry of waiting queues is read (then reused, REGISTRY_REUSE_MS).
    expect((await deliver('first')).batchItemFailures).toEqual([]);
    const calls: string[] = [];
    const name = 'count-take';
    harness.pool.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        const input = args.input as { Key?: { pk?: unknown }; Item?: { pk?: unknown }; IndexName?: string };
        calls.push(
          `${context.commandName} ${String(input.Key?.pk ?? input.Item?.pk ?? input.IndexName ?? '')}`,
        );
        return next(args);
      },
      { step: 'initialize', name },
    );
    try {
      expect((await deliver('second')).batchItemFailures).toEqual([]);
    } finally {
      harness.pool.dynamodb.middlewareStack.remove(name);
    }
    const second = await harness.pool.context.store.getRequest('second');
    expect(second?.state).toBe('fulfilled');
    expect(second?.nodes[0]?.spare).toMatch(/^min-ready:small-node:0:\d+\/0$/);
    expect(await untaken(harness)).toBe(1); // its seat refilled
    expect(await freeSpares(harness)).toBe(1); // ready at once: the backing node had a free slot
    expect(calls.length, calls.join('\n')).toBeLessThanOrEqual(8);
  });

  it('takes a min-ready node with one conditional update only while it is free in that pool', async () => {
    const harness = await withReadyNodes(baseConfig({ slots: 2, minReady: 1 }), 1);
    const store = harness.pool.context.store;
    const [spare] = await spares(harness);
    if (!spare) throw new Error('no min-ready node');
    const by = { node: 'taker/0', by: ownerToken(harness.clock.now()), at: harness.clock.now() };
    expect(await store.takeSpareNode(spare.id, 'meta/other', by)).toBeUndefined();
    expect(await store.takeSpareNode('min-ready:small-node:9:0', 'meta/main', by)).toBeUndefined();
    // Held by an operator: not free.
    const node = spare.nodes[0];
    if (!node) throw new Error('no node');
    await store.putRequest(
      { ...spare, nodes: [{ ...node, held: true }], version: spare.version + 1 },
      spare.version,
    );
    expect(await store.takeSpareNode(spare.id, 'meta/main', by)).toBeUndefined();
    await store.putRequest({ ...spare, version: spare.version + 2 }, spare.version + 1);
    const taken = await store.takeSpareNode(spare.id, 'meta/main', by);
    expect(taken?.nodes[0]?.takenBy).toEqual(by);
    expect(taken?.version).toBe(spare.version + 3); // every version-checked put of it now loses
    expect(await store.getRequest(spare.id)).toEqual(taken);
    expect(await store.takeSpareNode(spare.id, 'meta/main', { ...by, node: 'other/0' })).toBeUndefined();
  });

  it('refuses to release a min-ready node that a request took', async () => {
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 1 }), 1);
    const ctx = h.pool.context;
    await h.send(request('r1'));
    await h.drainRequests();
    const spareId = (await ctx.store.getRequest('r1'))?.nodes[0]?.spare as string;
    await expect(releaseNode(ctx, spareId, true)).rejects.toThrow(/min-ready node in use as r1\/0/);
    expect((await ctx.store.getRequest('r1'))?.nodes[0]?.state).toBe('ready');
  });

  it('never makes more min-ready nodes than min-ready, however many replenishers race', async () => {
    h = await startHarness(baseConfig({ slots: 4, minReady: 3 }));
    const ctx = h.pool.context;
    await Promise.all(Array.from({ length: 6 }, () => keepMinReady(ctx, 'small-node')));
    expect(await untaken(h)).toBe(3);
    await h.fulfilUntil(allFree(h, 3));
    // Three requests take them while six replenishers race to refill.
    await Promise.all([
      ...['a', 'b', 'c'].map((id) => h?.pool.handlers.request(sqsEvent([JSON.stringify(request(id))]))),
      ...Array.from({ length: 6 }, () => keepMinReady(ctx, 'small-node')),
    ]);
    for (const id of ['a', 'b', 'c']) expect((await ctx.store.getRequest(id))?.state).not.toBe('requested');
    await Promise.all(Array.from({ length: 6 }, () => keepMinReady(ctx, 'small-node')));
    expect(await untaken(h)).toBe(3);
    const seats = await ctx.store.seatGenerations('small-node');
    expect([...seats.keys()].sort()).toEqual([0, 1, 2]);
  });

  it('counts min-ready nodes against max-servers, and a request that takes one needs no other place', async () => {
    h = await withReadyNodes(baseConfig({ slots: 4, maxServers: 2, minReady: 2 }), 2, {
      maxReceiveCount: 50,
    });
    const ctx = h.pool.context;
    expect((await ctx.store.nodePlaces('meta/main')).size).toBe(2);
    await h.send(request('r1'));
    await h.send(request('r2'));
    await h.drainRequests();
    expect((await ctx.store.getRequest('r1'))?.state).toBe('fulfilled');
    expect((await ctx.store.getRequest('r2'))?.state).toBe('fulfilled');
    // Both places are the min-ready nodes' (now r1's and r2's); no room for a new one, nor for r3.
    expect((await ctx.store.nodePlaces('meta/main')).size).toBe(2);
    expect(
      (await h.pool.handlers.request(sqsEvent([JSON.stringify(request('r3'))]))).batchItemFailures,
    ).toHaveLength(1);
    expect((await ctx.store.getRequest('r3'))?.state).toBe('requested');
    // r1 goes: its place serves the waiting request before a new min-ready node (served last).
    await releaseNode(ctx, 'r1/0');
    await h.pool.reapNow();
    expect(
      (await h.pool.handlers.request(sqsEvent([JSON.stringify(request('r3'))], 2))).batchItemFailures,
    ).toEqual([]);
    expect((await ctx.store.getRequest('r3'))?.state).not.toBe('requested');
    expect((await ctx.store.nodePlaces('meta/main')).size).toBe(2);
  });

  it('ends none of the min-ready nodes it made at start while their backing nodes launch (issue 25, defect 5)', async () => {
    h = await startHarness(baseConfig({ slots: 2, minReady: 5 }));
    // The run at start makes every spare on backing nodes still launching.
    const first = await h.pool.reapNow();
    expect(first).toMatchObject({ minReadyMade: 5, minReadyEnded: 0 });
    // The runs after it, as the backing processes come up: each run's reconciliation readies a backing
    // node it read launching (its event not drained here), and the upkeep later in that run finds its
    // spares ready on it. None is ended and made again on the same backing node.
    let ended = 0;
    let made = 0;
    const deadline = Date.now() + 45_000;
    while ((await freeSpares(h)) < 5) {
      if (Date.now() > deadline) throw new Error('the min-ready nodes never became ready');
      const report = await h.pool.reapNow();
      ended += report.minReadyEnded;
      made += report.minReadyMade;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect({ ended, made }).toEqual({ ended: 0, made: 0 });
    expect((await spares(h)).map((r) => r.id).sort()).toEqual(
      [0, 1, 2, 3, 4].map((seat) => `min-ready:small-node:${seat}:0`),
    );
  });

  it('replaces min-ready nodes on a backing node past max-age, which then goes', async () => {
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 1, maxAge: 600, grace: 0 }), 1);
    const ctx = h.pool.context;
    const [old] = await ctx.store.listBacking();
    h.clock.advance(601_000);
    const report = await h.pool.reapNow();
    expect(report.minReadyEnded).toBe(1);
    expect(report.minReadyMade).toBe(1);
    await h.fulfilUntil(allFree(h, 1));
    const free = (await spares(h)).find((r) => isFreeSpare(r.nodes[0]));
    expect(free?.nodes[0]?.backingNodeId).not.toBe(old?.id);
    const again = await h.pool.reapNow();
    expect(again.retired).toContain(old?.id);
  });

  it('ends the free min-ready nodes above a lowered min-ready, and leaves the one in use to its taker', async () => {
    h = await withReadyNodes(baseConfig({ slots: 4, minReady: 3 }), 3);
    const ctx = h.pool.context;
    await h.send(request('r1'));
    await h.drainRequests();
    const inUse = (await ctx.store.getRequest('r1'))?.nodes[0]?.spare;
    const lowered = {
      ...ctx,
      config: parseConfigOrThrow(baseConfig({ slots: 4, minReady: 1 }), 'lowered.yaml'),
    };
    const report = await reap(lowered);
    expect(report.minReadyEnded).toBe(2);
    expect(await untaken(h)).toBe(1);
    const stillTaken = await ctx.store.getRequest(requestOf(inUse));
    expect(stillTaken?.nodes[0]?.state).toBe('ready');
    // And to 0: the last free one goes too; the pool can then empty.
    await reap({ ...ctx, config: parseConfigOrThrow(baseConfig({ slots: 4 }), 'none.yaml') });
    expect(await untaken(h)).toBe(0);
    await releaseNode(ctx, 'r1/0');
    expect((await ctx.store.listBacking()).every((b) => b.used === 0)).toBe(true);
  });

  it('reads no node of a seat above min-ready once its node ended: an upkeep costs the same however many seats were ever opened', async () => {
    h = await withReadyNodes(baseConfig({ slots: 8, minReady: 6 }), 6);
    const ctx = h.pool.context;
    const lowered = {
      ...ctx,
      config: parseConfigOrThrow(baseConfig({ slots: 8, minReady: 1 }), 'lowered.yaml'),
    };
    // The first upkeep at min-ready 1 ends the five spares above it (and marks their seats vacant).
    expect((await keepMinReady(lowered, 'small-node')).ended).toBe(5);
    // The next upkeeps read the seats (one Query) and seat 0's node, not the five ended ones.
    const reads: string[] = [];
    const name = 'count-seat-reads';
    h.pool.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        const key = (args.input as { Key?: { pk?: unknown } }).Key?.pk;
        if (context.commandName === 'GetItemCommand') reads.push(String(key));
        return next(args);
      },
      { step: 'initialize', name },
    );
    try {
      for (let i = 0; i < 3; i++)
        expect(await keepMinReady(lowered, 'small-node')).toMatchObject({ ended: 0 });
    } finally {
      h.pool.dynamodb.middlewareStack.remove(name);
    }
    expect(reads).toEqual(Array(3).fill('REQUEST#min-ready:small-node:0:0'));
    expect((await ctx.store.minReadyState('small-node')).vacant).toEqual(new Set([1, 2, 3, 4, 5]));
    expect(await untaken(h)).toBe(1);
    // Raised again: a vacant seat is filled as any other, and its advance clears the mark.
    expect((await keepMinReady(ctx, 'small-node')).made).toBe(5);
    expect((await ctx.store.minReadyState('small-node')).vacant).toEqual(new Set());
    await h.fulfilUntil(allFree(h, 6));
  }, 120_000);

  it("reads a label's spares in one call and the requests that took them in another, however many seats (not one a seat)", async () => {
    h = await withReadyNodes(baseConfig({ slots: 8, minReady: 6 }), 6);
    const ctx = h.pool.context;
    // Two spares taken by requests that recorded them (as a request delivery does, without its refill).
    const pool = ctx.config.metastaticPools[0];
    if (!pool) throw new Error('no pool');
    for (const id of ['t1', 't2']) {
      const spare = await takeSpare(ctx, pool, 'small-node', `${id}/0`, ownerToken(ctx.clock.now()));
      const record = await ctx.store.getRequest(requestOf(spare?.id));
      if (!spare || !record) throw new Error('no spare taken');
      expect(spare.takenBy?.node).toBe(`${id}/0`);
      const { takenBy: _, ...node } = spare;
      await ctx.store.createRequest({
        ...record,
        id,
        nodes: [{ ...node, id: `${id}/0`, spare: spare.id }],
        version: 0,
      });
    }
    const calls: string[] = [];
    const name = 'count-upkeep-reads';
    h.pool.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        const input = args.input as {
          Key?: { pk?: unknown };
          RequestItems?: Record<string, { Keys: unknown[] }>;
        };
        if (context.commandName === 'GetItemCommand') calls.push(`GetItem ${String(input.Key?.pk)}`);
        if (context.commandName === 'BatchGetItemCommand')
          calls.push(`BatchGetItem ${Object.values(input.RequestItems ?? {})[0]?.Keys.length}`);
        return next(args);
      },
      { step: 'initialize', name },
    );
    let report: Awaited<ReturnType<typeof keepMinReady>>;
    try {
      report = await keepMinReady(ctx, 'small-node');
    } finally {
      h.pool.dynamodb.middlewareStack.remove(name);
    }
    expect(report.made).toBe(2); // the two taken seats moved on and were refilled
    // Six spares in one read, their two takers in another; then only the two new generations' spares
    // (made now, absent until then) are read one by one.
    expect(calls.filter((c) => c.startsWith('BatchGetItem'))).toEqual(['BatchGetItem 6', 'BatchGetItem 2']);
    expect(calls.filter((c) => c.startsWith('GetItem REQUEST#'))).toEqual([
      expect.stringMatching(/^GetItem REQUEST#min-ready:small-node:\d:1$/),
      expect.stringMatching(/^GetItem REQUEST#min-ready:small-node:\d:1$/),
    ]);
    await h.fulfilUntil(allFree(h, 6));
  }, 120_000);

  it('marks a seat vacant only at the generation it read: an advance since wins, and clears the mark', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    const store = h.pool.context.store;
    expect(await store.markSeatVacant('small-node', 0, 0)).toBe(false); // no seat recorded
    await store.openSeat('small-node', 0);
    expect(await store.advanceSeat('small-node', 0, 0)).toBe(true);
    expect(await store.markSeatVacant('small-node', 0, 0)).toBe(false); // moved on meanwhile
    expect(await store.markSeatVacant('small-node', 0, 1)).toBe(true);
    expect((await store.minReadyState('small-node')).vacant).toEqual(new Set([0]));
    expect(await store.advanceSeat('small-node', 0, 1)).toBe(true);
    expect((await store.minReadyState('small-node')).vacant).toEqual(new Set());
  }, 60_000);

  it('returns the min-ready node a losing duplicate delivery took, free, instead of ending it', async () => {
    h = await withReadyNodes(baseConfig({ slots: 4, minReady: 2 }), 2);
    const ctx = h.pool.context;
    const body = JSON.stringify(request('dup'));
    // Two copies of one message at once (SQS at-least-once): each takes a ready node, one records it.
    await Promise.all([h.pool.handlers.request(sqsEvent([body])), h.pool.handlers.request(sqsEvent([body]))]);
    const dup = await ctx.store.getRequest('dup');
    expect(dup?.state).toBe('fulfilled');
    const ended = (await spares(h)).filter((r) => r.nodes[0]?.state === 'released');
    expect(ended).toEqual([]);
    const taken = (await spares(h)).filter((r) => r.nodes[0]?.takenBy);
    expect(taken.map((r) => r.nodes[0]?.id)).toEqual([dup?.nodes[0]?.spare]);
    await keepMinReady(ctx, 'small-node');
    expect(await untaken(h)).toBe(2);
  });

  it('ends a min-ready node taken by a delivery that died before recording it, and refills its seat', async () => {
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 1 }), 1);
    const ctx = h.pool.context;
    const taken = await takenByGhost(ctx);
    expect(taken?.takenBy?.node).toBe('ghost/0');
    // While the delivery may still record it, the node stays taken and the seat waits.
    await keepMinReady(ctx, 'small-node');
    expect(await untaken(h)).toBe(0);
    h.clock.advance(CLAIM_TAKEOVER_MS + 1_000);
    const report = await keepMinReady(ctx, 'small-node');
    expect(report.ended).toBe(1);
    expect((await ctx.store.getRequest(requestOf(taken?.id)))?.nodes[0]?.state).toBe('released');
    expect(await untaken(h)).toBe(1);
  });

  it('ends a min-ready node a dead delivery took, after min-ready was lowered to 0', async () => {
    // Found by the chaos suite: the drain lowers min-ready, and an orphan left at that moment stayed taken.
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 1 }), 1);
    const ctx = h.pool.context;
    const taken = await takenByGhost(ctx);
    const lowered = { ...ctx, config: parseConfigOrThrow(baseConfig({ slots: 2 }), 'none.yaml') };
    await keepMinReady(lowered, 'small-node');
    expect((await ctx.store.getRequest(requestOf(taken?.id)))?.nodes[0]?.state).toBe('ready'); // may be recorded yet
    h.clock.advance(CLAIM_TAKEOVER_MS + 1_000);
    expect((await keepMinReady(lowered, 'small-node')).ended).toBe(1);
    expect((await ctx.store.getRequest(requestOf(taken?.id)))?.nodes[0]?.state).toBe('released');
    expect((await ctx.store.listBacking()).every((b) => b.used === 0)).toBe(true);
  });

  it('moves a free min-ready node onto a fuller backing node, so spares cost slots, not instances (issue 24)', async () => {
    // Two seats on one backing node; a request takes one and the refill goes onto a second backing node;
    // the request's release ends the node it took: one free min-ready node on each backing node.
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 2, grace: 0 }), 2);
    const ctx = h.pool.context;
    await h.send(request('r1'));
    await h.drainRequests();
    await h.fulfilUntil(allFree(h, 2));
    await releaseNode(ctx, 'r1/0');
    const hosts = async () =>
      new Set(
        (await spares(h as Harness))
          .filter((r) => isFreeSpare(r.nodes[0]))
          .map((r) => r.nodes[0]?.backingNodeId),
      );
    expect((await hosts()).size).toBe(2);
    expect(await ctx.store.listBacking()).toHaveLength(2);
    // The reaper moves one (a new slot first, then the old one freed): both on one backing node.
    const report = await h.pool.reapNow();
    expect(report.minReadyMoved).toBe(1);
    expect(report.errors).toEqual([]);
    expect((await hosts()).size).toBe(1);
    expect(await freeSpares(h)).toBe(2);
    // ...and the other, empty, goes (grace-time 0).
    const after = await h.pool.reapNow();
    expect(after.stopped).toHaveLength(1);
    const live = (await ctx.store.listBacking()).filter((b) => b.state !== 'stopped');
    expect(live).toHaveLength(1);
    expect(live[0]?.used).toBe(2);
    // Every free min-ready node holds the slot its record names, on the backing node that maps it back.
    for (const r of await spares(h)) {
      const n = r.nodes[0];
      if (!isFreeSpare(n)) continue;
      expect(live[0]?.slotMap[String(n.slot)]).toBe(n.id);
      expect(n).toMatchObject({ backingNodeId: live[0]?.id, host: live[0]?.host, port: live[0]?.port });
    }
    // A request takes one at once from there.
    await h.send(request('r2'));
    await h.drainRequests();
    expect((await ctx.store.getRequest('r2'))?.nodes[0]).toMatchObject({
      state: 'ready',
      backingNodeId: live[0]?.id,
    });
  });

  it('never loses a min-ready node to a move: one cut short is finished, and a request taking it meanwhile wins', async () => {
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 2, grace: 0 }), 2);
    const ctx = h.pool.context;
    /** One free min-ready node on each of two backing nodes: a take, its refill, then its release. */
    const scatter = async (id: string) => {
      await h?.send(request(id));
      await h?.drainRequests();
      await h?.fulfilUntil(allFree(h, 2));
      await releaseNode(ctx, `${id}/0`);
    };
    const hostsNow = async () => new Map((await ctx.store.listBacking()).map((b) => [b.id, b]));
    await scatter('r1');

    // 1. The move's upkeep dies right after its put of the moved node (the first put a move makes).
    const dying = { ...ctx, store: crashingStore(ctx.store, (m) => m === 'putRequest') };
    const cut = await keepMinReady(dying, 'small-node', { hosts: await hostsNow() });
    expect(cut.errors).toEqual([expect.stringContaining('crashed after putRequest')]);
    const moved = (await spares(h)).find((r) => r.nodes[0]?.movedFrom)?.nodes[0];
    const from = moved?.movedFrom;
    expect(from?.backingNodeId).not.toBe(moved?.backingNodeId);
    // Both backing nodes name it: the old slot is held by nobody who runs there...
    const oldSlot = async () =>
      (await ctx.store.getBacking(from?.backingNodeId as string))?.slotMap[String(from?.slot)];
    expect(await oldSlot()).toBe(moved?.id);
    // ...until the next upkeep gives it back.
    await h.pool.reapNow();
    expect(await oldSlot()).toBeUndefined();
    const settled = (await ctx.store.getRequest(requestOf(moved?.id)))?.nodes[0];
    expect(settled?.movedFrom).toBeUndefined();
    expect(settled).toMatchObject({ state: 'ready', backingNodeId: moved?.backingNodeId, slot: moved?.slot });

    // 2. Scattered again; the next move's new slot is claimed, and before it records the move a delivery
    // takes that min-ready node.
    await scatter('r2');
    let raced: { spareId: string; from: string; to: string } | undefined;
    const store = new Proxy(ctx.store, {
      get(target, prop) {
        const value = Reflect.get(target, prop, target) as unknown;
        if (prop !== 'claimSlot' || typeof value !== 'function') return value;
        return async (...args: Parameters<typeof target.claimSlot>) => {
          const out = await target.claimSlot(...args);
          const [onto, , nodeId] = args;
          const spare = await target.getRequest(requestOf(nodeId));
          if (!raced && out.claimed && spare && isFreeSpare(spare.nodes[0])) {
            raced = { spareId: nodeId, from: spare.nodes[0]?.backingNodeId as string, to: onto.id };
            await target.putRequest(
              takenSpare(spare, 'racer/0', ownerToken(h?.clock.now() ?? 0), Date.now()),
              spare.version,
            );
          }
          return out;
        };
      },
    });
    const report = await keepMinReady({ ...ctx, store }, 'small-node', { hosts: await hostsNow() });
    expect(raced).toBeDefined();
    expect(report.errors).toEqual([]);
    // The take won: the node stays where the taker found it, and the new slot was given back.
    const spare = (await ctx.store.getRequest(requestOf(raced?.spareId)))?.nodes[0];
    expect(spare).toMatchObject({ takenBy: { node: 'racer/0' }, backingNodeId: raced?.from });
    expect((await ctx.store.getBacking(raced?.from as string))?.slotMap[String(spare?.slot)]).toBe(spare?.id);
    expect(Object.values((await ctx.store.getBacking(raced?.to as string))?.slotMap ?? {})).not.toContain(
      spare?.id,
    );
    // (The other one may then move beside it.) Every min-ready node holds exactly the slot it records.
    const backing = await ctx.store.listBacking();
    for (const r of await spares(h)) {
      const n = r.nodes[0];
      if (n?.state !== 'ready') continue;
      const holding = backing.filter((b) => Object.values(b.slotMap).includes(n?.id ?? ''));
      expect(holding.map((b) => b.id)).toEqual([n?.backingNodeId]);
      expect(holding[0]?.slotMap[String(n?.slot)]).toBe(n?.id);
    }
    expect(report.moved).toBeLessThanOrEqual(1);
  });

  it('min-ready auto: holds the ready room its arrival forecast asks for, within max-ready, and lets it go as the forecast falls (issue 27)', async () => {
    h = await startHarness(baseConfig({ slots: 4, grace: 0, readyAuto: { target: 0.9, max: 3 } }));
    const ctx = h.pool.context;
    const gauges: Array<[string, number]> = [];
    Object.assign(ctx, {
      metrics: { count: (name: string, value = 1) => gauges.push([name, value]), milliseconds: () => {} },
    });
    const last = (name: string) => gauges.filter(([n]) => n === name).at(-1)?.[1];
    // No arrival seen yet: nothing held.
    expect((await h.pool.reapNow()).minReadyMade).toBe(0);
    expect(await untaken(h)).toBe(0);

    // A burst: 30 arrivals in a minute (3.9 a minute forecast once the minute is folded, 7.8 arrivals
    // within the 2-minute horizon), far more than max-ready serves: 3 held, on one backing node of 4 slots.
    for (let i = 0; i < 30; i++) await countArrival(ctx, 'small-node');
    await flushArrivals(ctx);
    h.clock.advance(60_000);
    const rising = await h.pool.reapNow();
    expect(rising.minReadyMade).toBe(3);
    const held = (await ctx.store.minReadyState('small-node')).hold;
    expect(held).toMatchObject({ seats: 3, target: 3, freeSlots: 0 });
    expect(held?.perMinute).toBeGreaterThan(3.8);
    // The forecast and the room held, as metrics each run and as an event when the room changes.
    expect([last('ForecastArrivalsPerMinute'), last('ReadyRoomHeld')]).toEqual([held?.perMinute, 3]);
    const roomEvents = async () =>
      (await readFile(join(h?.pool.info.stateDir ?? '', 'events.jsonl'), 'utf8'))
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l))
        .filter((e) => e['detail-type'] === 'Ready Room Changed')
        .map((e) => e.detail);
    expect(await roomEvents()).toMatchObject([
      { label: 'small-node', seats: 3, previousSeats: 0, target: 3 },
    ]);
    await h.fulfilUntil(allFree(h, 3));
    // Held, not made again: the next run keeps the same three.
    expect((await h.pool.reapNow()).minReadyMade).toBe(0);
    expect(await untaken(h)).toBe(3);
    // `metastatic status` shows the forecast, the target and the ready room held.
    const status = await poolStatus({ store: ctx.store } as unknown as PoolClient, Date.now());
    expect(status.labels.find((l) => l.label === 'small-node')?.readyAuto).toEqual({
      perMinute: held?.perMinute,
      target: 3,
      held: 3,
      freeSlots: 0,
      decidedAt: new Date(held?.at ?? 0).toISOString(),
    });

    // Quiet: the short-horizon rate halves every 5 minutes; after three quarters of an hour (below one
    // arrival an hour: 3.9 x 2^-9) the room goes.
    h.clock.advance(45 * 60_000);
    await h.pool.reapNow();
    expect((await ctx.store.minReadyState('small-node')).hold).toMatchObject({ seats: 0, target: 0 });
    expect(await freeSpares(h)).toBe(0);
    expect(last('ReadyRoomHeld')).toBe(0);
    expect((await roomEvents()).map((e) => [e.previousSeats, e.seats])).toEqual([
      [0, 3],
      [3, 0],
    ]);
    await h.pool.reapNow(); // grace-time 0: the backing node they held goes
    expect((await ctx.store.listBacking()).filter((b) => b.state !== 'stopped')).toHaveLength(0);
  }, 150_000);

  it('min-ready auto: a request takes a held ready node at once, as a static one', async () => {
    h = await startHarness(baseConfig({ slots: 4, grace: 0, readyAuto: { target: 0.9, max: 2 } }));
    const ctx = h.pool.context;
    for (let i = 0; i < 30; i++) await countArrival(ctx, 'small-node');
    await flushArrivals(ctx);
    h.clock.advance(60_000);
    expect((await h.pool.reapNow()).minReadyMade).toBe(2);
    await h.fulfilUntil(allFree(h, 2));
    await h.send(request('taker'));
    await h.drainRequests();
    const taker = (await ctx.store.getRequest('taker'))?.nodes[0];
    expect(taker).toMatchObject({ state: 'ready', spare: expect.stringMatching(/^min-ready:small-node:/) });
  });

  it('fails the node that took a min-ready node when its backing node vanishes', async () => {
    h = await withReadyNodes(baseConfig({ slots: 2, minReady: 1 }), 1);
    const ctx = h.pool.context;
    await h.send(request('r1'));
    await h.drainRequests();
    const n = (await ctx.store.getRequest('r1'))?.nodes[0];
    await failBackingNode(ctx, n?.backingNodeId as string, 'vanished', { resourceGone: true });
    expect((await ctx.store.getRequest('r1'))?.nodes[0]?.state).toBe('failed');
    const spare = await ctx.store.getRequest(requestOf(n?.spare));
    expect(spare?.nodes[0]?.state).toBe('failed');
  });
});
