import { afterEach, describe, expect, it } from 'vitest';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { waitingRequests } from '../../shared/usecases/place/waiting.ts';
import { CANCELLED_BEFORE_RECEIVED, cancelRequest } from '../../shared/usecases/release/cancel.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * Cancel (issue 14): `{"kind":"cancel","id":...}` ends a request that is not fulfilled yet, whatever its
 * message's receive budget, and gives back everything it held; on dynalite + fauxqs + local processes.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const request = (id: string) => ({ kind: 'request', id, labels: ['small-node'], requestor: 'test' });
const cancel = (id: string, reason?: string) => ({ kind: 'cancel', id, ...(reason ? { reason } : {}) });
const deliver = (harness: Harness, body: unknown, receiveCount = 1) =>
  harness.pool.handlers.request(sqsEvent([JSON.stringify(body)], receiveCount));

describe('cancel', () => {
  it('ends a request waiting for capacity, and its message coming back places nothing', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 1 }), { maxReceiveCount: 50 });
    await h.send(request('first'));
    await h.drainRequests();
    expect((await deliver(h, request('second'))).batchItemFailures).toHaveLength(1); // waits
    const store = h.pool.context.store;
    expect((await store.getRequest('second'))?.state).toBe('requested');

    expect((await deliver(h, cancel('second', 'not needed any more'))).batchItemFailures).toEqual([]);
    expect(await store.getRequest('second')).toMatchObject({
      state: 'failed',
      reason: 'cancelled: not needed any more',
    });
    expect(await waitingRequests(h.pool.context)).toEqual([]);
    // Its message comes back (the wait's redelivery): consumed, nothing placed, the place not taken.
    expect((await deliver(h, request('second'), 2)).batchItemFailures).toEqual([]);
    expect((await store.getRequest('second'))?.state).toBe('failed');
    expect([...(await store.nodePlaces('meta/main')).keys()]).toEqual(['first/0']);
  });

  it('fails a placed request with its nodes and gives back their slots and places', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 4 }));
    await h.send(request('placed'));
    await h.drainRequests(); // placed on a launching backing node: pending
    const store = h.pool.context.store;
    expect((await store.getRequest('placed'))?.state).toBe('pending');
    const outcome = await cancelRequest(h.pool.context, 'placed');
    expect(outcome.cancelled).toBe(true);
    expect(outcome.request).toMatchObject({ state: 'failed', reason: 'cancelled' });
    expect(outcome.request.nodes.map((n) => n.state)).toEqual(['failed']);
    const backing = await store.listBacking();
    expect(backing.map((b) => [b.used, Object.keys(b.slotMap).length])).toEqual([[0, 0]]);
    expect((await store.nodePlaces('meta/main')).size).toBe(0);
  });

  it('cancelled before its request arrives: the request, when it comes, places nothing', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    expect((await deliver(h, cancel('early'))).batchItemFailures).toEqual([]);
    const store = h.pool.context.store;
    expect(await store.getRequest('early')).toMatchObject({
      state: 'failed',
      reason: 'cancelled',
      bodyHash: CANCELLED_BEFORE_RECEIVED,
    });
    expect((await deliver(h, request('early'))).batchItemFailures).toEqual([]);
    expect(await store.getRequest('early')).toMatchObject({
      state: 'failed',
      reason: 'cancelled',
      nodes: [],
    });
    expect(await store.listBacking()).toEqual([]); // nothing launched for it
    // Taken for a late delivery of an ended request (the chaos suite found it refused as a reused id).
    const again = await requestNodes(h.pool.context, {
      kind: 'request',
      id: 'early',
      labels: ['small-node'],
    });
    expect(again.kind).toBe('duplicate');
  });

  it('leaves a fulfilled request as it is, and a second cancel changes nothing', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await h.send(request('done'));
    await h.drainRequests();
    await h.fulfilUntil(async () => (await h?.pool.context.store.getRequest('done'))?.state === 'fulfilled');
    const ctx = h.pool.context;
    const before = await ctx.store.getRequest('done');
    expect(await cancelRequest(ctx, 'done')).toEqual({ request: before, cancelled: false });

    expect((await cancelRequest(ctx, 'twice', 'first')).cancelled).toBe(true);
    const again = await cancelRequest(ctx, 'twice', 'second');
    expect(again.cancelled).toBe(false);
    expect(again.request.reason).toBe('cancelled: first');
  });

  it('rejects a cancel message without a valid id, alone, with the reason', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    const out = await h.pool.handlers.request(
      sqsEvent([JSON.stringify({ kind: 'cancel', id: '../x' }), JSON.stringify(request('fine'))]),
    );
    expect(out.batchItemFailures).toEqual([]);
    expect((await h.pool.context.store.getRequest('fine'))?.state).not.toBe('failed');
  });
});
