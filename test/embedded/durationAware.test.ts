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

async function place(harness: Harness, id: string, seconds?: number): Promise<string> {
  await harness.send({
    kind: 'request',
    id,
    labels: ['small-node'],
    ...(seconds === undefined ? {} : { 'expected-duration': seconds }),
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
  });

  it('refuses an expected duration that is not a positive number of seconds within a week', async () => {
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
      expect.stringContaining('expected-duration: must be more than 0 seconds'),
      expect.stringContaining('expected-duration: must be at most 604800 seconds (7 days)'),
      expect.stringContaining('expected-duration: must be a number, not a string'),
    ]);
  });
});
