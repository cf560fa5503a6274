import { CreateTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ItemTooLargeError } from '../../shared/core/errors.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { startDynalite } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { tableDefinition } from '../../shared/store/table.ts';
import { describeWithMoto, MOTO_CREDENTIALS, startMoto } from '../../testkit/moto.ts';

/**
 * The store's reads and answers that issue 10 added, on DynamoDB as moto speaks it and on dynalite, with
 * the same assertions: the WAITING partition of the reap index (requests still `requested`, oldest first,
 * read with a key condition on the creation time) and DynamoDB's refusal of an item over 400 KB, which the
 * store turns into a permanent error.
 */
function waitingConformance(start: () => Promise<{ client: DynamoDBClient; stop(): Promise<void> }>) {
  return () => {
    let engine: { client: DynamoDBClient; stop(): Promise<void> };
    let store: DynamoStore;
    let tables = 0;
    beforeAll(async () => {
      engine = await start();
    });
    afterAll(async () => {
      engine?.client.destroy();
      await engine?.stop();
    });
    beforeEach(async () => {
      const tableName = `waiting-${++tables}`;
      await engine.client.send(new CreateTableCommand({ TableName: tableName, ...tableDefinition }));
      store = new DynamoStore(engine.client, tableName);
    });

    const request = (
      id: string,
      createdAt: number,
      state: RequestRecord['state'] = 'requested',
    ): RequestRecord => ({
      id,
      labels: ['small-node'],
      bodyHash: 'h',
      state,
      createdAt,
      updatedAt: createdAt,
      version: 0,
      nodes: [{ id: `${id}/0`, label: 'small-node', state: state === 'failed' ? 'failed' : 'requested' }],
    });
    const ids = async (before: number) => {
      const out: string[] = [];
      let cursor: Record<string, unknown> | undefined;
      do {
        const page = await store.waitingRequests(before, cursor);
        out.push(...page.items.map((r) => r.id));
        cursor = page.cursor;
      } while (cursor);
      return out;
    };

    it('lists the requests still waiting that were created before a time, oldest first', async () => {
      await store.createRequest(request('late', 3_000));
      await store.createRequest(request('early', 1_000));
      await store.createRequest(request('mid', 2_000));
      await store.createRequest(request('ended', 500, 'failed'));
      expect(await ids(Number.MAX_SAFE_INTEGER)).toEqual(['early', 'mid', 'late']);
      expect(await ids(2_000)).toEqual(['early']); // strictly before
      expect(await ids(2_001)).toEqual(['early', 'mid']);
    });

    it('drops a request from WAITING when a whole-item write moves it on', async () => {
      await store.createRequest(request('r', 1_000));
      expect(await ids(Number.MAX_SAFE_INTEGER)).toEqual(['r']);
      await store.putRequest({ ...request('r', 1_000, 'failed'), reason: 'why', version: 1 }, 0);
      expect(await ids(Number.MAX_SAFE_INTEGER)).toEqual([]);
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
      client: new DynamoDBClient({ ...fakeRegion, endpoint: dynalite.endpoint }),
      stop: () => dynalite.close(),
    };
  }),
);

describeWithMoto(
  'waiting requests and item size on moto',
  waitingConformance(async () => {
    const moto = await startMoto();
    return {
      client: new DynamoDBClient({ ...fakeRegion, endpoint: moto.endpoint }),
      stop: () => moto.stop(),
    };
  }),
);
