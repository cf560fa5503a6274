import { DynamoDBDocumentClient, PutCommand } from '@aws-sdk/lib-dynamodb';
import { afterEach, describe, expect, it } from 'vitest';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys } from '../../shared/store/table.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * A table written by an earlier version keeps each max-servers set in one item (a map member -> owner).
 * `metastatic dev` moves such sets to places as it starts; the Lambda functions run no start step, so the
 * handlers themselves must count an old item's members before they admit anything (issue 22, defect 6).
 * The old item is written after the pool started, as the functions of a deployed pool find it.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const request = (id: string) => JSON.stringify({ kind: 'request', id, labels: ['small-node'] });

describe('a max-servers set of the one-item form, met by the request handler', () => {
  it('admits no node past max-servers 2 while the old item holds two live nodes', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 2 }), { maxReceiveCount: 5 });
    const store = h.pool.context.store;
    const table = new DynamoStore(h.pool.dynamodb, h.pool.info.tableName);
    await DynamoDBDocumentClient.from(h.pool.dynamodb).send(
      new PutCommand({
        TableName: h.pool.info.tableName,
        Item: { ...keys.poolNodes('meta/main'), owners: { 'old-1/0': 'o1', 'old-2/0': 'o2' } },
      }),
    );

    const out = await h.pool.handlers.request(sqsEvent([request('new-1'), request('new-2')]));

    // Both wait (retried), none is placed: the two old members fill the pool.
    expect(out.batchItemFailures).toHaveLength(2);
    for (const id of ['new-1', 'new-2']) {
      const r = await store.getRequest(id);
      expect(r?.state, id).toBe('requested'); // not placed: waits for its next delivery
      expect(
        r?.nodes.filter((n) => n.backingNodeId !== undefined),
        id,
      ).toEqual([]);
    }
    expect(Object.fromEntries(await store.nodePlaces('meta/main'))).toEqual({
      'old-1/0': 'o1',
      'old-2/0': 'o2',
    });
    expect(await table.capacity.used(keys.poolNodes('meta/main'))).toBe(2);
  });

  it('stays within the cap when reservations and migrations meet the old item at once', async () => {
    h = await startHarness(baseConfig({ maxServers: 5 }));
    const table = new DynamoStore(h.pool.dynamodb, h.pool.info.tableName);
    const set = keys.poolNodes('meta/main');
    await DynamoDBDocumentClient.from(h.pool.dynamodb).send(
      new PutCommand({
        TableName: h.pool.info.tableName,
        Item: { ...set, owners: { 'old-1/0': 'o1', 'old-2/0': 'o1', 'old-3/0': 'o2' } },
      }),
    );

    const results = await Promise.all([
      ...Array.from({ length: 6 }, (_, i) => table.capacity.reserve(set, [`new-${i}/0`], 5, `n${i}`)),
      ...Array.from({ length: 3 }, () => table.capacity.migrate(set).then(() => undefined)),
    ]);

    expect(results.filter((r) => r?.kind === 'reserved')).toHaveLength(2);
    const places = await table.capacity.reservations(set);
    expect(places.size).toBe(5);
    expect([...places.keys()].filter((m) => m.startsWith('old-')).sort()).toEqual([
      'old-1/0',
      'old-2/0',
      'old-3/0',
    ]);
    expect(await table.capacity.used(set)).toBe(5);
    expect(await table.capacity.recover(set, Number.POSITIVE_INFINITY)).toBe(0);
    expect(await table.capacity.used(set)).toBe(5);
  });
});
