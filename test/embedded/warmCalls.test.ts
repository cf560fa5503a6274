import { describe, expect, it } from 'vitest';
import { roundTrips, traceWarmCalls, type WarmTrace } from '../../bench/warmCalls.ts';

/**
 * The DynamoDB calls of one warm allocation (issues 26 and 39), as bench/warmCalls.ts traces them through the
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

  it('with max-servers takes its place in one transaction while it claims its slot on the backing node of its last placement: 3 calls, 2 round trips', async () => {
    const calls = await of('max-servers-1000');
    // The candidates are the backing node of this store's last placement of the label, not a Query.
    expect(calls.map((c) => c.command).sort()).toEqual(['PutItem', 'TransactWriteItems', 'UpdateItem']);
    expect(calls.some((c) => c.failed)).toBe(false);
    const places = calls.find((c) => c.command === 'TransactWriteItems');
    const claim = calls.find((c) => c.target.startsWith('BACKING#') && c.command === 'UpdateItem');
    // The transaction (the gate: the place and the count) and the slot claim go out together (a claim
    // the count refuses is given back).
    expect(places?.target).toMatch(
      /^transaction of 2: Put POOL#meta\/main \/ PLACE#NODES#.*, Update POOL#meta\/main \/ NODES$/,
    );
    expect(places?.depth).toBe(1);
    expect(claim?.depth).toBe(1);
    // The request's write, the commit point, after both.
    const commit = calls.find((c) => c.target.startsWith('REQUEST#') && c.command === 'PutItem');
    expect(commit?.depth).toBe(2);
    expect(roundTrips(calls)).toBe(2);
  }, 90_000);

  it('with max-servers, the first allocation of an instance asks the free index, then claims', async () => {
    await of('max-servers-1000');
    // The first of the store instance also reads the registry of waiting queues (then reused for 5 s).
    const calls = traces.find((x) => x.variant === 'max-servers-1000')?.first ?? [];
    const query = calls.find((c) => c.command === 'Query' && c.target.startsWith('free '));
    const places = calls.find((c) => c.command === 'TransactWriteItems');
    const claim = calls.find((c) => c.target.startsWith('BACKING#') && c.command === 'UpdateItem');
    expect(places?.depth).toBe(query?.depth);
    expect(claim?.depth).toBe((query?.depth ?? 0) + 1);
  }, 90_000);

  it('with max-servers is released in 4 calls, 3 round trips: the slot and the place given back side by side', async () => {
    await of('max-servers-1000');
    const release = traces.find((x) => x.variant === 'max-servers-1000')?.release ?? [];
    expect(release).toHaveLength(4);
    // The place and the count: one transaction.
    const places = release.filter((c) => c.command === 'TransactWriteItems');
    expect(places.map((c) => c.target)).toEqual([
      expect.stringMatching(
        /^transaction of 2: Delete POOL#meta\/main \/ PLACE#NODES#.*, Update POOL#meta\/main \/ NODES$/,
      ),
    ]);
    const slotRead = release.find((c) => c.command === 'GetItem' && c.target.startsWith('BACKING#'));
    expect(slotRead?.depth).toBe(places[0]?.depth);
    expect(roundTrips(release)).toBe(3);
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
