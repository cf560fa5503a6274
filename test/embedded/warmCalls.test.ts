import { describe, expect, it } from 'vitest';
import { roundTrips, traceWarmCalls, type WarmTrace } from '../../bench/warmCalls.ts';

/**
 * The DynamoDB calls of one warm allocation (issue 26), as bench/warmCalls.ts traces them through the
 * real use cases on dynalite: how many, and how many round trips they take one after another (the
 * allocation's latency on DynamoDB, where every call is a network round trip).
 */
describe('one warm allocation', () => {
  let traces: WarmTrace[];
  const of = async (variant: string) => {
    traces ??= await traceWarmCalls();
    const t = traces.find((x) => x.variant === variant);
    if (!t) throw new Error(`no trace of ${variant}`);
    return t.allocation;
  };

  it('with max-servers asks for its candidates while it creates its place and claims its slot while the place is counted: 3 round trips, as without', async () => {
    const calls = await of('max-servers-1000');
    // The count-up's pending entry is removed by the next counter write, not by one of its own.
    expect(calls.map((c) => c.command)).toHaveLength(6);
    expect(calls.some((c) => c.failed)).toBe(false);
    // The free-index Query goes with the place's creation, before the count-up answers.
    const query = calls.find((c) => c.command === 'Query');
    const countUp = calls.find((c) => c.target.endsWith('/ NODES') && c.command === 'UpdateItem');
    expect(query?.depth).toBeLessThan(countUp?.depth ?? 0);
    // The slot claim goes out with the count-up (given back if the pool turns out full), not after it.
    const claim = calls.find((c) => c.target.startsWith('BACKING#') && c.command === 'UpdateItem');
    expect(claim?.depth).toBe(countUp?.depth);
    // The request's write, the commit point, after both.
    const commit = calls.find((c) => c.target.startsWith('REQUEST#') && c.command === 'PutItem');
    expect(commit?.depth).toBeGreaterThan(countUp?.depth ?? Number.POSITIVE_INFINITY);
    expect(roundTrips(calls)).toBe(3);
  }, 90_000);

  it('with max-servers is released in 6 calls: the count-down takes the reserve entry over', async () => {
    await of('max-servers-1000');
    const release = traces.find((x) => x.variant === 'max-servers-1000')?.release ?? [];
    expect(release).toHaveLength(6);
    expect(release.filter((c) => c.target.endsWith('/ NODES'))).toHaveLength(1);
  }, 90_000);

  it('without max-servers is its 3 calls one after another', async () => {
    const calls = await of('max-servers-unset');
    expect(calls.map((c) => c.command)).toEqual(['Query', 'UpdateItem', 'PutItem']);
    expect(roundTrips(calls)).toBe(3);
  }, 90_000);
});
