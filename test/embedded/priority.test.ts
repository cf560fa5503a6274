import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { afterEach, describe, expect, it } from 'vitest';
import type { RequestMessage } from '../../shared/core/messages.ts';
import { requestedRecord } from '../../shared/core/request.ts';
import { REGISTRY_REUSE_MS } from '../../shared/core/waitingQueue.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { releaseNode } from '../../shared/usecases/release/release.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { type Harness, readyNode, sqsEvent, startHarness } from '../../testkit/harness.ts';
import { consumedUnits, whileWatching } from '../../testkit/sdkWatch.ts';

/**
 * Request priority (issue 14): when capacity is short, waiting requests are served lowest priority
 * number first, then oldest, whatever order SQS brings their messages back in; on dynalite + fauxqs +
 * local processes.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const request = (id: string, priority?: number) => ({
  kind: 'request',
  id,
  labels: ['small-node'],
  ...(priority === undefined ? {} : { priority }),
});
const deliver = (harness: Harness, body: unknown, receiveCount = 1) =>
  harness.pool.handlers.request(sqsEvent([JSON.stringify(body)], receiveCount));

describe('priority', () => {
  it('gives a freed place to the waiting request with the lowest priority number, not to the first back', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 2 }), { maxReceiveCount: 50 });
    const store = h.pool.context.store;
    for (const id of ['fill-1', 'fill-2']) await h.send(request(id));
    await h.drainRequests();
    // The pool is full: two low-priority requests wait, then a high-priority one.
    for (const id of ['low-1', 'low-2'])
      expect((await deliver(h, request(id, 200))).batchItemFailures).toHaveLength(1);
    expect((await deliver(h, request('high', 10))).batchItemFailures).toHaveLength(1);

    expect((await releaseNode(h.pool.context, 'fill-1/0')).kind).toBe('released');
    // The low ones come back first: each lets the high one go first, and waits.
    for (const id of ['low-1', 'low-2']) {
      expect((await deliver(h, request(id, 200), 2)).batchItemFailures).toHaveLength(1);
      expect((await store.getRequest(id))?.state).toBe('requested');
    }
    expect((await deliver(h, request('high', 10), 2)).batchItemFailures).toEqual([]);
    expect((await store.getRequest('high'))?.state).not.toBe('requested');
    expect([...(await store.nodePlaces('meta/main')).keys()].sort()).toEqual(['fill-2/0', 'high/0']);

    // Next freed place: the older of the two equal ones.
    await releaseNode(h.pool.context, 'fill-2/0');
    expect((await deliver(h, request('low-2', 200), 3)).batchItemFailures).toHaveLength(1);
    expect((await deliver(h, request('low-1', 200), 3)).batchItemFailures).toEqual([]);
    expect((await store.getRequest('low-1'))?.state).not.toBe('requested');
    expect((await store.getRequest('low-2'))?.state).toBe('requested');
  });

  it('makes a new request wait behind one already waiting for the same label', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 1 }), { maxReceiveCount: 50 });
    const store = h.pool.context.store;
    await h.send(request('fill'));
    await h.drainRequests();
    expect((await deliver(h, request('waiting'))).batchItemFailures).toHaveLength(1);
    await releaseNode(h.pool.context, 'fill/0');
    h.clock.advance(1_000);
    // A newcomer with the same priority arrives first after the release: it queues behind.
    expect((await deliver(h, request('newcomer'))).batchItemFailures).toHaveLength(1);
    expect((await deliver(h, request('waiting'), 2)).batchItemFailures).toEqual([]);
    expect((await store.getRequest('waiting'))?.state).not.toBe('requested');
    // A newcomer with a better priority goes first even so.
    await releaseNode(h.pool.context, 'waiting/0');
    expect((await deliver(h, request('urgent', 1))).batchItemFailures).toEqual([]);
    expect((await store.getRequest('newcomer'))?.state).toBe('requested');
  });

  it('hands a place freed by a release message to the first waiting request at once, not at its next receive', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 1 }), { maxReceiveCount: 50 });
    const store = h.pool.context.store;
    await h.send(request('fill'));
    await h.drainRequests();
    expect((await deliver(h, request('low', 200))).batchItemFailures).toHaveLength(1);
    h.clock.advance(1_000);
    expect((await deliver(h, request('high', 10))).batchItemFailures).toHaveLength(1);
    // The release is handled; nobody's message comes back, yet the high one is placed.
    expect((await deliver(h, { kind: 'release', nodeId: 'fill/0' })).batchItemFailures).toEqual([]);
    expect((await store.getRequest('high'))?.state).not.toBe('requested');
    expect((await store.getRequest('low'))?.state).toBe('requested');
    expect([...(await store.nodePlaces('meta/main')).keys()]).toEqual(['high/0']);
    // Its own message, when it comes back, is a duplicate: nothing more is taken.
    expect((await deliver(h, request('high', 10), 2)).batchItemFailures).toEqual([]);
    expect([...(await store.nodePlaces('meta/main')).keys()]).toEqual(['high/0']);
  });

  it("holds a request to its requestor's priority-ceiling: clamped, served behind a trusted one, the claim kept (issue 25, defect 3)", async () => {
    const ceiling = 'priority-ceiling:\n  default: 100\n  requestors:\n    release-bot: -1000\n';
    h = await startHarness(`${ceiling}${baseConfig({ slots: 4, maxServers: 1 })}`, { maxReceiveCount: 50 });
    const ctx = h.pool.context;
    const events: { type: string; detail: Record<string, unknown> }[] = [];
    const withEvents = {
      ...ctx,
      events: {
        publish: async (type: string, detail: Record<string, unknown>) => void events.push({ type, detail }),
      },
    } as typeof ctx;
    await h.send(request('fill'));
    await h.drainRequests();
    // Anyone can claim the best priority there is; the trusted requestor asks for less.
    const sneaky = { ...request('sneaky', -1_000_000), requestor: 'ci' };
    const trusted = { ...request('trusted', -10), requestor: 'release-bot' };
    expect((await deliver(h, sneaky)).batchItemFailures).toHaveLength(1);
    h.clock.advance(1_000);
    expect((await deliver(h, trusted)).batchItemFailures).toHaveLength(1);
    // The claim is kept as sent (it is part of the body), the ceiling it is served at beside it.
    expect(await ctx.store.getRequest('sneaky')).toMatchObject({
      priority: -1_000_000,
      priorityCeiling: 100,
    });
    const kept = await ctx.store.getRequest('trusted');
    expect(kept).toMatchObject({ priority: -10 });
    expect(kept?.priorityCeiling).toBeUndefined();
    // A release message frees the place and hands it to the first waiting request: the trusted one,
    // though the other is older.
    const handler = makeRequestHandler(withEvents, { maxReceiveCount: 50 });
    const send = async (body: unknown, receiveCount = 1) =>
      (await handler(sqsEvent([JSON.stringify(body)], receiveCount))).batchItemFailures;
    expect(await send({ kind: 'release', nodeId: 'fill/0' })).toEqual([]);
    expect((await ctx.store.getRequest('trusted'))?.state).not.toBe('requested');
    expect(await send(sneaky, 2)).toHaveLength(1);
    expect((await ctx.store.getRequest('sneaky'))?.state).toBe('requested');
    // Its event says the priority it was served at and, when a ceiling bound it, the one it claimed.
    expect(await send({ kind: 'cancel', id: 'sneaky', reason: 'test' })).toEqual([]);
    expect(events.find((e) => e.detail.requestId === 'sneaky')).toMatchObject({
      type: 'Request Failed',
      detail: { priority: 100, claimedPriority: -1_000_000 },
    });
  });

  it('reads no more of the waiting requests with 100 waiting than with 10 to know who goes first (issue 24, defect 1)', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 2 }), { maxReceiveCount: 50 });
    const harness = h;
    const store = harness.pool.context.store;
    for (const id of ['fill-1', 'fill-2']) await harness.send(request(id));
    await harness.drainRequests();
    // Requests that wait where a new one-node request would not let them go first: a pair (more nodes
    // than it takes) or a request served after it (a higher priority number). Recorded as a delivery
    // records a request that waits.
    let n = 0;
    const addWaiting = async (count: number) => {
      for (let k = 0; k < count; k++, n++) {
        const m: RequestMessage =
          n % 2 === 0
            ? { kind: 'request', id: `pair-${n}`, labels: ['small-node', 'small-node'] }
            : { kind: 'request', id: `later-${n}`, labels: ['small-node'], priority: 200 };
        await store.createRequest(requestedRecord(m, harness.clock.now() - 600_000 + n));
      }
    };
    const readUnits = async (id: string) => {
      const units = await consumedReadUnits(harness.pool.dynamodb, () => deliver(harness, request(id)));
      expect((await store.getRequest(id))?.state).toBe('requested'); // the pool is full: it waits
      return units;
    };

    await addWaiting(10);
    const few = await readUnits('new-at-10');
    await addWaiting(90);
    const many = await readUnits('new-at-100');
    // (It read every waiting request: 2.5 read units at 10, 4 at 100.)
    expect(many).toBeLessThanOrEqual(few);

    // Still exact: a request served before it that fits is found among them, wherever it sits.
    await store.createRequest(
      requestedRecord(
        { kind: 'request', id: 'urgent', labels: ['small-node'], priority: 50 },
        harness.clock.now(),
      ),
    );
    harness.clock.advance(1);
    await expect(
      requestNodes(harness.pool.context, {
        kind: 'request',
        id: 'next',
        labels: ['small-node'],
        priority: 60,
      }),
    ).rejects.toThrow('request urgent (priority 50) waits ahead of this one (priority 60)');
    await expect(
      requestNodes(harness.pool.context, {
        kind: 'request',
        id: 'first',
        labels: ['small-node'],
        priority: 40,
      }),
    ).rejects.toThrow('meta/main is at max-servers (2)');
  }, 60_000);

  it('reads the registry of waiting queues once per REGISTRY_REUSE_MS, and at once after its own store announced one (issue 26)', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 1 }), { maxReceiveCount: 50 });
    const harness = h;
    const store = harness.pool.context.store;
    await harness.send(request('fill'));
    await harness.drainRequests();
    const registryReads = (work: () => Promise<unknown>) =>
      countQueries(harness.pool.dynamodb, 'QUEUES', work);

    // The fill's delivery read it (and announced the queue of one small-node: the fill was recorded
    // before its launch); once that read is REGISTRY_REUSE_MS old, the next delivery reads it again.
    harness.clock.advance(REGISTRY_REUSE_MS);
    expect(await registryReads(() => deliver(harness, request('first')))).toBe(1);
    // Within REGISTRY_REUSE_MS the read is reused: still exact, the one ahead is found in its queue.
    harness.clock.advance(REGISTRY_REUSE_MS - 1);
    const second = () =>
      expect(
        requestNodes(harness.pool.context, { kind: 'request', id: 'second', labels: ['small-node'] }),
      ).rejects.toThrow('request first (priority 100) waits ahead of this one');
    expect(await registryReads(second)).toBe(0);
    // A queue this store announces (a pair waits) is seen at once: the reused read is dropped.
    await store.createRequest(
      requestedRecord(
        { kind: 'request', id: 'pair', labels: ['small-node', 'small-node'] },
        harness.clock.now(),
      ),
    );
    const counts = async () => (await store.waitingQueues({ reuse: true })).map((q) => q.count).sort();
    expect(await registryReads(async () => expect(await counts()).toEqual([1, 2]))).toBe(1);
    // Another writer's new queue (three nodes) is seen once this store's read is REGISTRY_REUSE_MS old.
    const other = new DynamoStore(harness.pool.dynamodb, harness.pool.info.tableName, harness.clock);
    await other.createRequest(
      requestedRecord(
        { kind: 'request', id: 'trio', labels: ['small-node', 'small-node', 'small-node'] },
        harness.clock.now(),
      ),
    );
    expect(await counts()).toEqual([1, 2]);
    // The reaper's read (no reuse) is always fresh, and so is the next after REGISTRY_REUSE_MS.
    expect((await store.waitingQueues()).map((q) => q.count).sort()).toEqual([1, 2, 3]);
    harness.clock.advance(REGISTRY_REUSE_MS);
    expect(await counts()).toEqual([1, 2, 3]);
  }, 60_000);

  it('knows an empty waiting queue without a read for REGISTRY_REUSE_MS, and sees at once a request its own store records waiting (issue 26)', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 4 }), { maxReceiveCount: 50 });
    const harness = h;
    // Recorded before its launch, so its queue (one small-node) is registered, and empty once placed.
    await readyNode(harness, 'base');
    harness.clock.advance(REGISTRY_REUSE_MS);
    const queueReads = (work: () => Promise<unknown>) =>
      countQueries(harness.pool.dynamodb, 'WAITING#', work, ':p');
    const place = (id: string) => async () =>
      expect((await requestNodes(harness.pool.context, request(id) as RequestMessage)).kind).toBe('placed');
    expect(await queueReads(place('a'))).toBe(1);
    expect(await queueReads(place('b'))).toBe(0); // read empty a moment ago
    // A request this store records waiting in that queue is seen at once.
    await harness.pool.context.store.createRequest(
      requestedRecord(
        { kind: 'request', id: 'urgent', labels: ['small-node'], priority: 1 },
        harness.clock.now(),
      ),
    );
    const waits = () =>
      expect(requestNodes(harness.pool.context, request('c') as RequestMessage)).rejects.toThrow(
        'request urgent (priority 1) waits ahead of this one',
      );
    expect(await queueReads(waits)).toBe(1);
  }, 60_000);
});

/** Queries of the partition `pk` sent while `work` runs. */
async function countQueries(
  client: DynamoDBClient,
  pk: string,
  work: () => Promise<unknown>,
  /** The key value's placeholder; the partition is matched by prefix. */
  placeholder = ':pk',
): Promise<number> {
  let n = 0;
  await whileWatching(
    client,
    (command, input, send) => {
      const value = (input.ExpressionAttributeValues as Record<string, unknown> | undefined)?.[placeholder];
      if (command === 'QueryCommand' && typeof value === 'string' && value.startsWith(pk)) n++;
      return send();
    },
    work,
  );
  return n;
}

/** Read capacity units (GetItem, Query, Scan) consumed while `work` runs, as DynamoDB bills them. */
const consumedReadUnits = (client: DynamoDBClient, work: () => Promise<unknown>) =>
  consumedUnits(client, /Get|Query|Scan/, work);
