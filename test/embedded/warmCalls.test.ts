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

  it('with max-servers counts its place while it claims its slot on the backing node of its last placement, then creates the place counted: 4 calls, 3 round trips', async () => {
    const calls = await of('max-servers-1000');
    // The count-up's pending entry is removed by the next counter write, not by one of its own; the
    // candidates are the backing node of this store's last placement of the label, not a Query.
    expect(calls.map((c) => c.command)).toHaveLength(4);
    expect(calls.filter((c) => c.command === 'Query')).toEqual([]);
    expect(calls.some((c) => c.failed)).toBe(false);
    const countUp = calls.find((c) => c.target.endsWith('/ NODES') && c.command === 'UpdateItem');
    const claim = calls.find((c) => c.target.startsWith('BACKING#') && c.command === 'UpdateItem');
    const place = calls.filter((c) => c.target.includes('/ PLACE#'));
    // The count-up (the gate) and the slot claim go out together (a claim the count refuses is given back).
    expect(countUp?.depth).toBe(1);
    expect(claim?.depth).toBe(1);
    // The place is written once, created counted, after the count-up.
    expect(place.map((c) => c.command)).toEqual(['PutItem']);
    expect(place[0]?.depth).toBe(2);
    // The request's write, the commit point, after the place.
    const commit = calls.find((c) => c.target.startsWith('REQUEST#') && c.command === 'PutItem');
    expect(commit?.depth).toBe(3);
    expect(roundTrips(calls)).toBe(3);
  }, 90_000);

  it('with max-servers, the first allocation of an instance asks the free index while it counts its place', async () => {
    await of('max-servers-1000');
    // The first of the store instance also reads the registry of waiting queues (then reused for 5 s),
    // and this one creates the counter.
    const calls = traces.find((x) => x.variant === 'max-servers-1000')?.first ?? [];
    const query = calls.find((c) => c.command === 'Query' && c.target.startsWith('free '));
    const countUp = calls.find((c) => c.target.endsWith('/ NODES') && c.command === 'UpdateItem');
    const claim = calls.find((c) => c.target.startsWith('BACKING#') && c.command === 'UpdateItem');
    expect(query?.depth).toBe(countUp?.depth);
    expect(claim?.depth).toBe((query?.depth ?? 0) + 1);
  }, 90_000);

  it('with max-servers is released in 6 calls, 4 round trips: the slot and the place given back side by side', async () => {
    await of('max-servers-1000');
    const release = traces.find((x) => x.variant === 'max-servers-1000')?.release ?? [];
    expect(release).toHaveLength(6);
    // The count-down takes the reserve entry over: one counter write.
    expect(release.filter((c) => c.target.endsWith('/ NODES'))).toHaveLength(1);
    const slotRead = release.find((c) => c.command === 'GetItem' && c.target.startsWith('BACKING#'));
    const releasing = release.find((c) => c.target.includes('/ PLACE#') && c.command === 'UpdateItem');
    expect(slotRead?.depth).toBe(releasing?.depth);
    expect(roundTrips(release)).toBe(4);
  }, 90_000);

  it('without max-servers is a claim on the backing node of its last placement and the commit; the first asks the index', async () => {
    const calls = await of('max-servers-unset');
    expect(calls.map((c) => c.command)).toEqual(['UpdateItem', 'PutItem']);
    expect(roundTrips(calls)).toBe(2);
    const first = (traces.find((x) => x.variant === 'max-servers-unset')?.first ?? []).filter(
      (c) => !c.target.includes('QUEUES'), // the registry of waiting queues, read once per 5 s
    );
    expect(first.map((c) => c.command)).toEqual(['Query', 'UpdateItem', 'PutItem']);
    expect(first.map((c) => c.target.split(' ')[0])).toEqual(['free', 'BACKING#bn-warm', expect.any(String)]);
  }, 90_000);
});
