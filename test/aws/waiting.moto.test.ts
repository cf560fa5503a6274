import { CreateTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient, PutCommand } from '@aws-sdk/lib-dynamodb';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ItemTooLargeError } from '../../shared/core/errors.ts';
import { servedBefore } from '../../shared/core/priority.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { queueOf, type WaitingQueue } from '../../shared/core/waitingQueue.ts';
import { guardDynamoLimits } from '../../shared/runtime/dynamoLimits.ts';
import { startDynalite } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys, tableDefinition, waitingSortKey } from '../../shared/store/table.ts';
import { describeWithMoto, MOTO_CREDENTIALS, startMoto } from '../../testkit/moto.ts';

/**
 * The store's reads and answers that issues 10 and 24 added, on DynamoDB as moto speaks it and on dynalite,
 * with the same assertions: the waiting queues (requests still `requested`, one partition of the reap index
 * per node-set shape, in service order, read one item at a time by the priority check; the registry that
 * names them; the move of a request an earlier version recorded in the single WAITING partition) and
 * DynamoDB's refusal of an item over 400 KB, which the store turns into a permanent error.
 */
function waitingConformance(start: () => Promise<{ client: DynamoDBClient; stop(): Promise<void> }>) {
  return () => {
    let engine: { client: DynamoDBClient; stop(): Promise<void> };
    let store: DynamoStore;
    let tableName: string;
    let tables = 0;
    beforeAll(async () => {
      engine = await start();
    });
    afterAll(async () => {
      engine?.client.destroy();
      await engine?.stop();
    });
    beforeEach(async () => {
      tableName = `waiting-${++tables}`;
      await engine.client.send(new CreateTableCommand({ TableName: tableName, ...tableDefinition }));
      store = new DynamoStore(engine.client, tableName);
    });

    const request = (
      id: string,
      createdAt: number,
      state: RequestRecord['state'] = 'requested',
      more: Partial<RequestRecord> = {},
    ): RequestRecord => {
      const labels = more.labels ?? ['small-node'];
      return {
        id,
        labels,
        bodyHash: 'h',
        state,
        createdAt,
        updatedAt: createdAt,
        version: 0,
        nodes: labels.map((label, i) => ({
          id: `${id}/${i}`,
          label,
          state: state === 'failed' ? 'failed' : 'requested',
        })),
        ...more,
      };
    };
    const one = queueOf({ labels: ['small-node'] });
    const ids = async (queue: WaitingQueue) => {
      const out: string[] = [];
      let cursor: Record<string, unknown> | undefined;
      do {
        const page = await store.waitingInQueue(queue, cursor);
        out.push(...page.items.map((r) => r.id));
        cursor = page.cursor;
      } while (cursor);
      return out;
    };

    it('keeps a queue in service order: class, priority (any number), age, id', async () => {
      const waiting = [
        request('late', 3_000),
        request('early', 1_000),
        request('early-b', 1_000),
        request('urgent', 5_000, 'requested', { priority: -5 }),
        request('lowest', 500, 'requested', { priority: 2_000_000_000 }), // recorded before the bound
        request('half', 4_000, 'requested', { priority: 99.5 }),
        request('min-ready:small-node:0:1', 1, 'requested', { priority: -1_000_000 }),
        request('ended', 500, 'failed'),
      ];
      for (const r of waiting) await store.createRequest(r);
      const expected = waiting
        .filter((r) => r.state === 'requested')
        .sort((a, b) => (servedBefore(a, b) ? -1 : 1))
        .map((r) => r.id);
      expect(expected).toEqual([
        'urgent',
        'half',
        'early',
        'early-b',
        'late',
        'lowest',
        'min-ready:small-node:0:1',
      ]);
      expect(await ids(one)).toEqual(expected);
      expect((await store.firstWaiting(one))?.id).toBe('urgent');
      // The first served before a request: strictly before, one item read.
      expect((await store.firstWaiting(one, request('x', 2_000)))?.id).toBe('urgent');
      expect(
        (await store.firstWaiting(one, request('x', 0, 'requested', { priority: -6 })))?.id,
      ).toBeUndefined();
      expect((await store.firstWaiting(one, request('early-b', 1_000)))?.id).toBe('urgent');
      expect(
        (await store.firstWaiting(one, { id: 'early-b', createdAt: 1_000, priority: -5 }))?.id,
      ).toBeUndefined();
    });

    it('names every queue in the registry before a request is written to it, once each', async () => {
      await store.createRequest(request('a', 1_000));
      await store.createRequest(
        request('pair', 1_000, 'requested', { labels: ['small-node', 'small-node'] }),
      );
      await store.createRequest(request('mixed', 1_000, 'requested', { labels: ['b', 'a', 'b'] }));
      await store.createRequest(request('b', 2_000));
      await store.createRequest(request('done', 2_000, 'failed', { labels: ['other'] }));
      const queues = (await store.waitingQueues()).map(({ labels, count }) => ({ labels, count }));
      expect(
        queues.sort((x, y) => x.count - y.count || x.labels.join().localeCompare(y.labels.join())),
      ).toEqual([
        { labels: ['small-node'], count: 1 },
        { labels: ['small-node'], count: 2 },
        { labels: ['a', 'b'], count: 3 },
      ]);
      expect(await ids(queueOf({ labels: ['a', 'b', 'b'] }))).toEqual(['mixed']);
      expect(await ids(one)).toEqual(['a', 'b']);
    });

    it('drops a request from its queue when a whole-item write moves it on', async () => {
      await store.createRequest(request('r', 1_000));
      expect(await ids(one)).toEqual(['r']);
      await store.putRequest({ ...request('r', 1_000, 'failed'), reason: 'why', version: 1 }, 0);
      expect(await ids(one)).toEqual([]);
      expect(await store.firstWaiting(one)).toBeUndefined();
    });

    it('forgets a queue only if nobody announced it since it was read', async () => {
      await store.createRequest(request('r', 1_000));
      const [read] = await store.waitingQueues();
      if (!read) throw new Error('no queue registered');
      expect(await store.forgetQueue({ ...read, registeredAt: read.registeredAt - 1 })).toBe(false);
      expect(await store.waitingQueues()).toHaveLength(1);
      expect(await store.forgetQueue(read)).toBe(true);
      expect(await store.waitingQueues()).toEqual([]);
      // Announced again before the next request is written to it (this store forgot its announcement too).
      await store.createRequest(request('s', 2_000));
      expect((await store.waitingQueues()).map((q) => q.labels)).toEqual([['small-node']]);
    });

    it('moves a request an earlier version recorded in WAITING to its queue, once', async () => {
      const old = request('old', 1_000);
      await DynamoDBDocumentClient.from(engine.client).send(
        new PutCommand({
          TableName: tableName,
          Item: {
            ...keys.request('old'),
            type: 'request',
            ...old,
            rpk: 'WAITING',
            rsk: waitingSortKey(1_000, 'old'),
          },
        }),
      );
      expect((await store.legacyWaiting()).items.map((r) => r.id)).toEqual(['old']);
      expect(await store.waitingQueues()).toEqual([]);
      expect(await store.requeueWaiting(old)).toBe(true);
      expect((await store.legacyWaiting()).items).toEqual([]);
      expect(await ids(one)).toEqual(['old']);
      expect((await store.waitingQueues()).map((q) => q.count)).toEqual([1]);
      expect(await store.requeueWaiting(old)).toBe(false);
      expect(await store.getRequest('old')).toEqual(old); // the record itself is unchanged
    });

    it('answers an item over 400 KB with a permanent ItemTooLargeError', async () => {
      const huge = { ...request('huge', 1), reason: 'r'.repeat(420_000) };
      await expect(store.createRequest(huge)).rejects.toBeInstanceOf(ItemTooLargeError);
      expect(await store.getRequest('huge')).toBeUndefined();
    });
  };
}

const fakeRegion = { region: 'eu-west-1', credentials: MOTO_CREDENTIALS };

describe(
  'waiting requests and item size on dynalite',
  waitingConformance(async () => {
    const dynalite = await startDynalite();
    return {
      client: guardDynamoLimits(new DynamoDBClient({ ...fakeRegion, endpoint: dynalite.endpoint })),
      stop: () => dynalite.close(),
    };
  }),
);

describeWithMoto(
  'waiting requests and item size on moto',
  waitingConformance(async () => {
    const moto = await startMoto();
    return {
      client: guardDynamoLimits(new DynamoDBClient({ ...fakeRegion, endpoint: moto.endpoint })),
      stop: () => moto.stop(),
    };
  }),
);
