import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient } from '@aws-sdk/lib-dynamodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nodeId, ownerSince, ownerToken } from '../../shared/core/ids.ts';
import { MAX_NODE_SET } from '../../shared/core/messages.ts';
import { MAX_SERVERS } from '../../shared/fields/fields.ts';
import {
  ensureTable,
  localDynamoClient,
  localEngineClientConfig,
  startDynalite,
} from '../../shared/runtime/engines.ts';
import type { LocalTransactions } from '../../shared/runtime/localTransactions.ts';
import { type CapacitySets, MAX_SET_CHANGE } from '../../shared/store/capacitySets.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys } from '../../shared/store/table.ts';
import { holdPlaces } from '../../testkit/heldPlaces.ts';
import { consumedUnits } from '../../testkit/sdkWatch.ts';

/**
 * Capacity sets (max-servers) on dynalite, through the embedded pool's transactions (issue 39): a counter
 * item and one small place item per held member, every change of the count one transaction with its
 * places. What is checked: the cap is never exceeded, under concurrency too; a crash between any two
 * actions of a reserve or a release leaves the set as it was (rolled back when the transaction's
 * intent is found, at once or at the next start); a reserve and a release cost the same write units
 * with 20 or 5,000 places held; node sets up to the largest a transaction holds; and the largest pool the
 * configuration admits (max-servers MAX_SERVERS) is exact at its limit.
 */
let engine: Awaited<ReturnType<typeof startDynalite>>;
let client: DynamoDBClient;
let transactions: LocalTransactions;
let store: DynamoStore;
let sets: CapacitySets;
let doc: DynamoDBDocumentClient;

/** The longest node id a request can have (requestIdPattern: 128 characters; index up to 4 digits). */
const longest = (i: number) => nodeId(`${'r'.repeat(120)}${String(i).padStart(8, '0')}`, 9000 + (i % 1000));
const owner = (at: number, n: number) => ownerToken(at, { messageId: `m-${n}`, receiveCount: 9 });
const config = () => localEngineClientConfig(engine.endpoint, 'eu-west-1');

beforeAll(async () => {
  engine = await startDynalite();
  ({ client, transactions } = localDynamoClient(config(), engine.endpoint));
  await ensureTable(client, 'scale');
  store = new DynamoStore(client, 'scale');
  doc = DynamoDBDocumentClient.from(client);
  sets = store.capacity;
});
afterAll(async () => {
  client?.destroy();
  await engine?.close();
});

/** Runs `work` with its transaction crashing right after its action `index` was applied. */
async function crashAfterAction(index: number, work: () => Promise<unknown>): Promise<void> {
  transactions.afterAction = (i) => {
    if (i === index) throw new Error(`crashed after action ${index}`);
  };
  try {
    await expect(work()).rejects.toThrow(`crashed after action ${index}`);
  } finally {
    transactions.afterAction = undefined;
  }
}

describe('a crash inside a transaction', () => {
  // A reserve of two members is three actions (two places, the counter); a release of one, two.
  it.each([0, 1, 2])('of a reserve (after action %i) leaves the set as it was', async (index) => {
    const set = keys.poolNodes(`crash/reserve/${index}`);
    expect(await sets.reserve(set, ['held/0'], 3, 'a')).toEqual({ kind: 'reserved' });
    await crashAfterAction(index, () => sets.reserve(set, ['r/0', 'r/1'], 3, 'dead'));
    expect(await sets.audit(set)).toEqual({ members: new Set(['held/0']), used: 1 });
    // Its redelivery takes the places as if the first try never was.
    expect(await sets.reserve(set, ['r/0', 'r/1'], 3, 'redelivery')).toEqual({ kind: 'reserved' });
    expect(await sets.reserve(set, ['late/0'], 3, 'b')).toEqual({ kind: 'full' });
    expect(await sets.used(set)).toBe(3);
  });

  it.each([0, 1])('of a release (after action %i) leaves the set as it was', async (index) => {
    const set = keys.poolNodes(`crash/release/${index}`);
    expect(await sets.reserve(set, ['n/0', 'n/1'], 2, 'a')).toEqual({ kind: 'reserved' });
    await crashAfterAction(index, () => sets.unreserve(set, ['n/0']));
    expect(await sets.audit(set)).toEqual({ members: new Set(['n/0', 'n/1']), used: 2 });
    await sets.unreserve(set, ['n/0']); // redelivered: given back once
    await sets.unreserve(set, ['n/0']);
    expect(await sets.audit(set)).toEqual({ members: new Set(['n/1']), used: 1 });
    expect(await sets.reserve(set, ['m/0'], 2, 'b')).toEqual({ kind: 'reserved' });
    expect(await sets.reserve(set, ['m/1'], 2, 'b')).toEqual({ kind: 'full' });
  });

  it('killed before its commit is rolled back by the next start (the intent left in the table)', async () => {
    const set = keys.poolNodes('crash/restart');
    expect(await sets.reserve(set, ['held/0'], 5, 'a')).toEqual({ kind: 'reserved' });
    // A process killed inside the transaction: nothing runs after the kill, the intent stays.
    const killed = localDynamoClient(config(), `killed-${engine.endpoint}`);
    killed.transactions.recoverAfterCrash = false;
    killed.transactions.afterAction = (i) => {
      if (i === 1) throw new Error('killed');
    };
    const dying = new DynamoStore(killed.client, 'scale').capacity;
    await expect(dying.reserve(set, ['k/0', 'k/1'], 5, 'dead')).rejects.toThrow('killed');
    killed.client.destroy();
    // Its writes are in the table meanwhile (its actions run at once, and each was sent), its intent too:
    // not committed.
    expect((await sets.members(set)).size).toBe(3);
    expect(await sets.used(set)).toBe(3);
    // The next start rolls it back before anything reads the table.
    const restarted = localDynamoClient(config(), `restarted-${engine.endpoint}`);
    expect(await restarted.transactions.recover('scale')).toBe(1);
    expect(await restarted.transactions.recover('scale')).toBe(0);
    restarted.client.destroy();
    expect(await sets.audit(set)).toEqual({ members: new Set(['held/0']), used: 1 });
  });
});

describe('concurrent reservations', () => {
  it('never take more places than the cap, and the count matches the places', async () => {
    const set = keys.poolNodes('race');
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) => sets.reserve(set, [`q${i}/0`, `q${i}/1`], 25, `o${i}`)),
    );
    const reserved = results.filter((r) => r.kind === 'reserved').length;
    expect(reserved).toBe(12);
    expect(await sets.used(set)).toBe(reserved * 2);
    expect((await sets.members(set)).size).toBe(reserved * 2);
    // Releases racing each other (a message delivered twice) give each place back once.
    const held = [...(await sets.members(set))];
    await Promise.all([...held, ...held].map((m) => sets.unreserve(set, [m])));
    expect(await sets.used(set)).toBe(0);
    expect((await sets.members(set)).size).toBe(0);
  });
});

/** Write units a call consumed, as DynamoDB bills them (a transaction's writes twice each). */
const writeUnits = (work: () => Promise<unknown>) =>
  consumedUnits(client, /Put|Update|Delete|Transact/, work);

describe('the cost of a place', () => {
  it('is the same with 20 or 5,000 places held', async () => {
    const costs: Record<number, { reserve: number; release: number }> = {};
    for (const held of [20, 5_000]) {
      const set = keys.poolNodes(`cost/${held}`);
      const members = Array.from({ length: held }, (_, i) => longest(i));
      await holdPlaces(doc, 'scale', sets, set, members, (_, i) => owner(1_000_000_000, Math.floor(i / 50)));
      expect(await sets.used(set)).toBe(held);
      expect((await sets.members(set)).size).toBe(held);
      const reserve = await writeUnits(() =>
        sets.reserve(set, ['one/0'], MAX_SERVERS, owner(2_000_000_000, 1)),
      );
      const release = await writeUnits(() => sets.unreserve(set, ['one/0']));
      costs[held] = { reserve, release };
    }
    expect(costs[5_000]).toEqual(costs[20]);
    // One transaction of two small items (the place, the counter) each way: 2 units an item.
    expect(costs[20]).toEqual({ reserve: 4, release: 4 });
  });
});

describe('node sets up to the most one transaction holds (issue 39)', () => {
  it('are taken and given back in one transaction each, exactly', async () => {
    for (const size of [24, MAX_NODE_SET, MAX_SET_CHANGE]) {
      const set = keys.poolNodes(`set/${size}`);
      const members = Array.from({ length: size }, (_, i) => longest(i));
      await sets.reserve(set, ['other/0'], MAX_SERVERS, owner(1_000_000_000, 1));
      const reserve = await writeUnits(() =>
        sets.reserve(set, members, MAX_SERVERS, owner(2_000_000_000, 2)),
      );
      expect(await sets.used(set)).toBe(size + 1);
      const release = await writeUnits(() => sets.unreserve(set, members));
      expect(await sets.audit(set)).toEqual({ members: new Set(['other/0']), used: 1 });
      // The counter and each place, 2 units an item (a 64-node set: 130 each way).
      expect({ size, reserve, release }).toEqual({ size, reserve: 2 * (size + 1), release: 2 * (size + 1) });
    }
  });

  it('refuses a change of more places than one transaction holds, before any write', async () => {
    const set = keys.poolNodes('set/too-many');
    const members = Array.from({ length: MAX_SET_CHANGE + 1 }, (_, i) => `m${i}/0`);
    await expect(sets.reserve(set, members, MAX_SERVERS, 'o')).rejects.toThrow(
      `at most ${MAX_SET_CHANGE} (one transaction)`,
    );
    expect(await sets.audit(set)).toEqual({ members: new Set(), used: 0 });
  });
});

describe('the largest pool: max-servers at its maximum', () => {
  it('keeps allocation, release, takeover and giving back exact with thousands of places held', async () => {
    const set = keys.poolNodes('meta/largest');
    const max = MAX_SERVERS;
    // 3,000 places held in node sets of 50, the first 10 sets by dead deliveries.
    const held = 3_000;
    const members = Array.from({ length: held }, (_, i) => longest(i));
    await holdPlaces(doc, 'scale', sets, set, members, (_, i) => {
      const d = Math.floor(i / 50);
      return owner(d < 10 ? 1_000 : 1_000_000_000, d);
    });
    expect(await sets.used(set)).toBe(held);
    // Still room below the cap, reserved through the store as any request's places are.
    expect(await sets.reserve(set, ['next/0', 'next/1'], max, owner(1_500_000_000, 1))).toEqual({
      kind: 'reserved',
    });
    await sets.unreserve(set, ['next/0', 'next/1']);
    expect(await sets.used(set)).toBe(held);
    // The cap holds at this size as at any: a set that would pass it is refused whole.
    expect(await sets.reserve(set, ['late/0', 'late/1'], held + 1, owner(1_600_000_000, 1))).toEqual({
      kind: 'full',
    });
    expect(await sets.reserve(set, ['late/0'], held + 1, owner(1_600_000_000, 1))).toEqual({
      kind: 'reserved',
    });
    await sets.unreserve(set, ['late/0']);
    // A redelivery takes a dead delivery's place over; the dead one can no longer give it back.
    const first = longest(0);
    const redelivery = owner(1_700_000_000, 2);
    const holder = (await store.nodePlaces('meta/largest')).get(first) as string;
    expect(await sets.takeOverReservation(set, first, holder, redelivery)).toBe(true);
    await sets.unreserve(set, [first], holder);
    expect((await store.nodePlaces('meta/largest')).get(first)).toBe(redelivery);
    // What the reaper's reconciliation does: read the holders, give back the dead ones' places.
    const holders = await store.nodePlaces('meta/largest');
    expect(holders.size).toBe(held);
    const dead = [...holders].filter(([, by]) => ownerSince(by) === 1_000);
    expect(dead.length).toBe(499);
    for (const [m, by] of dead) await sets.unreserve(set, [m], by);
    expect(await sets.audit(set)).toEqual({
      members: new Set([...holders.keys()].filter((m) => ownerSince(holders.get(m) as string) !== 1_000)),
      used: held - 499,
    });
  }, 300_000);
});
