import { afterEach, describe, expect, it } from 'vitest';
import { releaseNode } from '../../shared/usecases/release.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { type Harness, startHarness } from '../../testkit/harness.ts';

/**
 * Duration-aware placement (issue 15, part 2 with hints given): a request's `expected-duration` puts
 * its node on the backing node whose nodes are expected to end closest to when it does, so backing
 * nodes empty together. On dynalite + fauxqs + local processes.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

async function place(harness: Harness, id: string, seconds?: number, requestor?: string): Promise<string> {
  await harness.send({
    kind: 'request',
    id,
    labels: ['small-node'],
    ...(seconds === undefined ? {} : { 'expected-duration': seconds }),
    ...(requestor === undefined ? {} : { requestor }),
  });
  await harness.drainRequests();
  await harness.fulfilUntil(
    async () => (await harness.pool.context.store.getRequest(id))?.state === 'fulfilled',
  );
  return (await harness.pool.context.store.getRequest(id))?.nodes[0]?.backingNodeId as string;
}

describe('duration-aware placement', () => {
  it('puts a short job beside short jobs, not on the older backing node held by a long one', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    const ctx = h.pool.context;
    const longs = await place(h, 'long-1', 3600);
    expect(await place(h, 'long-2', 3600)).toBe(longs); // the same expected end: together
    h.clock.advance(1_000); // longs is the older
    const shorts = await place(h, 'short-1', 60); // longs is full: a second backing node
    expect(shorts).not.toBe(longs);
    await releaseNode(ctx, 'long-2/0');
    // Both have one free slot; without a hint the older (longs) would take the next node.
    expect(await place(h, 'short-2', 60)).toBe(shorts);
    const recorded = await ctx.store.getBacking(shorts);
    expect(Object.keys(recorded?.ends ?? {}).sort()).toEqual(['0', '1']);
    await releaseNode(ctx, 'short-2/0');
    expect(await place(h, 'plain')).toBe(longs); // no hint: fullest first, then the oldest
    // learned-durations is off by default: nothing was learned from the releases.
    expect(await ctx.store.getEstimate('small-node')).toBeUndefined();
  });

  it('learns how long each requestor keeps its nodes and places a request without a hint by it', async () => {
    h = await startHarness(`learned-durations: true\n${baseConfig({ slots: 2 })}`);
    const ctx = h.pool.context;
    // Three nodes each: `quick` keeps its nodes a minute, `slow` an hour.
    for (const [requestor, seconds] of [
      ['quick', 60],
      ['slow', 3600],
    ] as const) {
      for (let i = 0; i < 3; i++) {
        await place(h, `${requestor}-teach-${i}`, undefined, requestor);
        h.clock.advance(seconds * 1000);
        await releaseNode(ctx, `${requestor}-teach-${i}/0`);
      }
    }
    const quick = await ctx.store.getEstimate('small-node', 'quick');
    expect(quick?.samples).toBe(3);
    expect(Math.exp(quick?.logSeconds ?? 0)).toBeCloseTo(60, 6);
    expect((await ctx.store.getEstimate('small-node'))?.samples).toBe(6);
    h.clock.advance(120_000); // past the estimate cache: the next placements read what was learned

    // As the hinted test above, with no hint: slow nodes fill the older backing node, a quick one the next.
    const slows = await place(h, 'slow-1', undefined, 'slow');
    expect(await place(h, 'slow-2', undefined, 'slow')).toBe(slows);
    h.clock.advance(1_000);
    const quicks = await place(h, 'quick-1', undefined, 'quick');
    expect(quicks).not.toBe(slows);
    await releaseNode(ctx, 'slow-2/0');
    // One free slot on each: by age alone the older (slows) would take it; by what was learned, quicks.
    expect(await place(h, 'quick-2', undefined, 'quick')).toBe(quicks);
  });

  it('learns every duration of concurrent releases: the estimate is written from the version it read', async () => {
    h = await startHarness(`learned-durations: true\n${baseConfig({ slots: 3 })}`);
    const ctx = h.pool.context;
    for (const id of ['a', 'b', 'c']) await place(h, id);
    h.clock.advance(600_000);
    await Promise.all(['a/0', 'b/0', 'c/0'].map((id) => releaseNode(ctx, id)));
    expect(await ctx.store.getEstimate('small-node')).toMatchObject({ samples: 3, version: 3 });
  });

  it('refuses an expected duration that is not from 1 second to a week', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    for (const [id, value] of [
      ['zero', 0],
      ['ms', 9_000_000],
      ['text', '60'],
    ] as const) {
      await h.send({ kind: 'request', id, labels: ['small-node'], 'expected-duration': value });
    }
    await h.drainRequests();
    const reasons = await Promise.all(
      ['zero', 'ms', 'text'].map(async (id) => (await h?.pool.context.store.getRequest(id))?.reason),
    );
    expect(reasons).toEqual([
      expect.stringContaining('expected-duration: must be at least 1 second'),
      expect.stringContaining('expected-duration: must be at most 604800 seconds (7 days)'),
      expect.stringContaining('expected-duration: must be a number, not a string'),
    ]);
  });
});
