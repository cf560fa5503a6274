import { afterEach, describe, expect, it } from 'vitest';
import { CapacityError } from '../../shared/core/errors.ts';
import type { RequestMessage } from '../../shared/core/messages.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { requestedRecord } from '../../shared/core/request.ts';
import { ChoseOtherLabels } from '../../shared/usecases/place/recording.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { releaseNode } from '../../shared/usecases/release/release.ts';
import { type ConfigFixture, largeNode, poolConfig, smallNode } from '../../testkit/configs.ts';
import { type Harness, startHarness } from '../../testkit/harness.ts';

/**
 * Requests by shape (issue 15, part 1): a request names what each node needs (cores, memory, disk) and
 * the pool picks the label whose slot fits at the lowest cost per slot-hour, preferring a label with a
 * free slot now when it costs at most shape-cost-margin percent more. On dynalite + fauxqs + local
 * processes, through the request handler.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

/** Backing `mid` costs 0.4 an hour, `big` 0.8; `two` slots: 2 cores / 4GiB at 0.2, `four`: 4 / 16GiB at 0.4. */
function shapedPool(extra: Partial<ConfigFixture> = {}): string {
  return poolConfig({
    backing: {
      labels: [
        largeNode({ name: 'mid', 'hourly-cost': 0.4 }),
        largeNode({ name: 'big', 'hourly-cost': 0.8 }),
      ],
    },
    meta: {
      ...extra.meta,
      labels: [
        smallNode({
          name: 'four',
          'backing-label': 'big',
          'max-parallel-jobs': 2,
          'grace-time': 0,
          cores: 4,
          memory: '16GiB',
        }),
        smallNode({ name: 'two', 'backing-label': 'mid', 'max-parallel-jobs': 2, cores: 2, memory: '4GiB' }),
        smallNode({ name: 'plain', 'backing-label': 'mid', 'max-parallel-jobs': 2 }), // no shape: never chosen for one
      ],
    },
    top: extra.top,
  });
}

async function settle(harness: Harness, id: string): Promise<RequestRecord> {
  await harness.drainRequests();
  await harness.fulfilUntil(async () => {
    const r = await harness.pool.context.store.getRequest(id);
    return r?.state === 'fulfilled' || r?.state === 'failed';
  });
  return (await harness.pool.context.store.getRequest(id)) as RequestRecord;
}

describe('requests by shape', () => {
  it('picks the cheapest label whose slot fits, records it on the node, and fails a shape nothing fits', async () => {
    h = await startHarness(shapedPool());
    await h.send({ kind: 'request', id: 'small', shapes: [{ cores: 2, memory: '4GiB' }] });
    const small = await settle(h, 'small');
    expect(small.state).toBe('fulfilled');
    expect(small.labels).toEqual(['two']);
    expect(small.nodes[0]?.label).toBe('two');
    expect(small.shapes).toEqual([{ cores: 2, memory: '4GiB' }]);

    await h.send({ kind: 'request', id: 'set', shapes: [{ cores: 3 }, { memory: '2G' }] });
    const set = await settle(h, 'set');
    expect(set.state).toBe('fulfilled');
    expect(set.nodes.map((n) => n.label)).toEqual(['four', 'two']);

    await h.send({ kind: 'request', id: 'huge', shapes: [{ cores: 2 }, { cores: 64, memory: '1TiB' }] });
    const huge = await settle(h, 'huge');
    expect(huge.state).toBe('failed');
    expect(huge.reason).toContain("no label's slot fits shape 2 (64 cores, 1TiB memory)");
    expect(huge.reason).toContain('"four" (4 cores, 16GiB memory)');
    expect(huge.labels).toEqual([]);
  });

  it('takes a free slot now over a launch when it costs at most shape-cost-margin percent more', async () => {
    // `four` (0.4/slot-hour) has a free slot on a running backing node; `two` (0.2) would launch.
    h = await startHarness(shapedPool({ top: { 'shape-cost-margin': 100 } }));
    await h.send({ kind: 'request', id: 'first', labels: ['four'] });
    const first = await settle(h, 'first');
    await h.send({ kind: 'request', id: 'within', shapes: [{ cores: 1 }] });
    const within = await settle(h, 'within');
    expect(within.nodes[0]?.label).toBe('four');
    expect(within.nodes[0]?.backingNodeId).toBe(first.nodes[0]?.backingNodeId);
    await h.close();

    // The same with a margin of 50%: 0.4 is 100% above 0.2, so the cheaper label is launched.
    h = await startHarness(shapedPool({ top: { 'shape-cost-margin': 50 } }));
    await h.send({ kind: 'request', id: 'first', labels: ['four'] });
    await settle(h, 'first');
    await h.send({ kind: 'request', id: 'beyond', shapes: [{ cores: 1 }] });
    expect((await settle(h, 'beyond')).nodes[0]?.label).toBe('two');
  });

  it('keeps its first choice on every later delivery: a duplicate allocates nothing', async () => {
    h = await startHarness(shapedPool({ top: { 'shape-cost-margin': 100 } }));
    const body = { kind: 'request', id: 'dup', shapes: [{ cores: 1 }], 'expected-duration': 600 };
    await h.send(body);
    const placed = await settle(h, 'dup');
    expect(placed.labels).toEqual(['two']); // nothing free anywhere: the cheapest
    // `four` now has a free slot, which the margin would prefer for a new request; the redelivery keeps `two`.
    await h.send({ kind: 'request', id: 'other', labels: ['four'] });
    await settle(h, 'other');
    await h.send(body);
    const again = await settle(h, 'dup');
    expect(again.labels).toEqual(['two']);
    expect(again.version).toBe(placed.version);
    const backing = await h.pool.context.store.listBacking();
    expect(backing.filter((b) => b.label === 'two')).toHaveLength(1);
  });

  it('places a waiting request by shape on the labels it was recorded with, whatever is free later', async () => {
    // One node at a time (max-servers 1): `waits` is recorded on `four`, which had a free slot then.
    h = await startHarness(
      shapedPool({
        top: { 'shape-cost-margin': 100 },
        meta: { pool: { 'max-servers': 1 }, labels: undefined },
      }),
    );
    const ctx = h.pool.context;
    await h.send({ kind: 'request', id: 'first', labels: ['four'] });
    await settle(h, 'first');
    const body: RequestMessage = { kind: 'request', id: 'waits', shapes: [{ cores: 1 }] };
    await expect(requestNodes(ctx, body)).rejects.toThrow(CapacityError);
    expect(await ctx.store.getRequest('waits')).toMatchObject({ state: 'requested', labels: ['four'] });
    // `four`'s backing node goes (grace-time 0): nothing is free now, so a new choice would be `two`.
    await releaseNode(ctx, 'first/0');
    await h.pool.reapNow();
    expect((await ctx.store.listBacking()).filter((b) => b.state === 'ready')).toEqual([]);
    const out = await requestNodes(ctx, body);
    expect(out.kind).toBe('placed');
    expect(out.request.nodes.map((n) => n.label)).toEqual(['four']);
  });

  it('gives back what it took when a concurrent first delivery recorded other labels, then uses those', async () => {
    h = await startHarness(shapedPool());
    const ctx = h.pool.context;
    const body: RequestMessage = { kind: 'request', id: 'raced', shapes: [{ cores: 1 }] };
    // `two` has a free slot: this delivery would choose it (the cheapest) and claim there.
    await h.send({ kind: 'request', id: 'warm', labels: ['two'] });
    const warm = await settle(h, 'warm');
    // Meanwhile another delivery of `raced` chose `four` and recorded the request waiting: this one read
    // the table before that (its first read of the request finds nothing), so it chose `two` and claimed.
    await ctx.store.createRequest({ ...requestedRecord(body, ctx.clock.now(), ['four']), placer: 'other' });
    let reads = 0;
    const racing = new Proxy(ctx.store, {
      get: (target, prop) =>
        prop === 'getRequest'
          ? async (id: string) => (reads++ === 0 ? undefined : target.getRequest(id))
          : Reflect.get(target, prop, target),
    });
    await expect(requestNodes({ ...ctx, store: racing }, body)).rejects.toThrow(ChoseOtherLabels);
    // Its claim on `two` was given back: the warm backing node holds only `warm`.
    const two = await ctx.store.getBacking(warm.nodes[0]?.backingNodeId as string);
    expect(two?.used).toBe(1);
    expect(Object.values(two?.slotMap ?? {})).toEqual(['warm/0']);
    // The next delivery reads the stored choice and places it there.
    const out = await requestNodes(ctx, body);
    expect(out.request.nodes.map((n) => n.label)).toEqual(['four']);
  });

  it('refuses a request with labels and shapes, with neither, or with a shape it cannot read', async () => {
    h = await startHarness(shapedPool());
    const bodies: Record<string, unknown> = {
      both: { labels: ['two'], shapes: [{ cores: 1 }] },
      neither: {},
      empty: { shapes: [{}] },
      unit: { shapes: [{ memory: '4 gigs' }] },
      zero: { shapes: [{ cores: 0 }] },
      extra: { shapes: [{ cores: 1, gpus: 1 }] },
    };
    for (const [id, body] of Object.entries(bodies)) {
      await h.send({ kind: 'request', id, ...(body as object) });
    }
    await h.drainRequests();
    const reasons = Object.fromEntries(
      await Promise.all(
        Object.keys(bodies).map(async (id) => [id, (await h?.pool.context.store.getRequest(id))?.reason]),
      ),
    );
    expect(reasons).toEqual({
      both: expect.stringContaining('shapes: give "labels" or "shapes", not both'),
      neither: expect.stringContaining('labels: a request needs "labels" or "shapes"'),
      empty: expect.stringContaining('shapes.0: a shape needs at least one of cores, memory, disk'),
      unit: expect.stringContaining('shapes.0.memory: must be a size with a unit'),
      zero: expect.stringContaining('shapes.0.cores: must be at least 0.001 (a thousandth of a core)'),
      extra: expect.stringContaining('shapes.0: unknown key "gpus"'),
    });
  });
});
