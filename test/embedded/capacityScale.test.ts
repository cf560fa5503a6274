import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_SERVERS } from '../../shared/config/fields.ts';
import { nodeId, ownerToken } from '../../shared/core/ids.ts';
import { ensureTable, startDynalite } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys } from '../../shared/store/table.ts';

/**
 * The largest pool the configuration admits (issue 12, item 4), on dynalite, which enforces DynamoDB's
 * 400 KB item limit: a pool's capacity set is one item (member -> owner token), so MAX_SERVERS is bounded
 * by how many of the longest members fit in it. Here the set is filled to max-servers = MAX_SERVERS with
 * the longest node ids (a 128-character request id, a 4-digit index) and delivery owner tokens, through
 * the store, and every capacity operation must still be exact at the limit: the cap refuses one more,
 * a release makes room for exactly one, a takeover moves one place, and giving back abandoned places
 * (what the reaper's reconciliation does: read the holders, unreserve conditioned on the owner) leaves
 * the live ones.
 */
const region = { region: 'eu-west-1', credentials: { accessKeyId: 'x', secretAccessKey: 'x' } };
let engine: Awaited<ReturnType<typeof startDynalite>>;
let client: DynamoDBClient;
let store: DynamoStore;

/** The longest node id a request can have (requestIdPattern: 128 characters; index up to 4 digits). */
const longest = (i: number) => nodeId(`${'r'.repeat(120)}${String(i).padStart(8, '0')}`, 9000 + (i % 1000));
/** An owner token of a delivery (the longest shape) that started at `at`. */
const owner = (at: number, n: number) => ownerToken(at, { messageId: `m-${n}`, receiveCount: 9 });

beforeAll(async () => {
  engine = await startDynalite();
  client = new DynamoDBClient({ ...region, endpoint: engine.endpoint });
  await ensureTable(client, 'scale');
  store = new DynamoStore(client, 'scale');
});
afterAll(async () => {
  client?.destroy();
  await engine?.close();
});

describe('the largest pool: max-servers at its maximum, every place taken', () => {
  const set = keys.poolNodes('meta/largest');
  const max = MAX_SERVERS;
  /** Places in sets of 10 (a request's node set), each set by its own delivery; the first 100 by dead ones. */
  const deliveries = Array.from({ length: max / 10 }, (_, d) => ({
    owner: owner(d < 10 ? 1_000 : 1_000_000_000, d),
    members: Array.from({ length: 10 }, (_, j) => longest(d * 10 + j)),
  }));

  it('fills to max-servers and refuses one more place', { timeout: 120_000 }, async () => {
    for (const d of deliveries) {
      expect(await store.capacity.reserve(set, d.members, max, d.owner)).toEqual({ kind: 'reserved' });
    }
    expect((await store.capacity.reservations(set)).size).toBe(max);
    expect(await store.capacity.reserve(set, [longest(max)], max, owner(2_000_000_000, -1))).toEqual({
      kind: 'full',
    });
    // A redelivered reserve of places its owner already holds is still reserved when the set is full.
    const last = deliveries.at(-1) as (typeof deliveries)[number];
    expect(await store.capacity.reserve(set, last.members, max, last.owner)).toEqual({ kind: 'reserved' });
    // A concurrent delivery of the same ids is told who holds them, not "full".
    const held = await store.capacity.reserve(set, last.members.slice(0, 2), max, owner(2_000_000_000, -2));
    expect(held).toEqual({
      kind: 'held',
      holders: new Map(last.members.slice(0, 2).map((m) => [m, last.owner])),
    });
  });

  it('releases one place and admits exactly one more', async () => {
    const d = deliveries[50] as (typeof deliveries)[number];
    await store.capacity.unreserve(set, [d.members[0] as string]);
    const late = owner(2_000_000_000, -3);
    expect(await store.capacity.reserve(set, [longest(max), longest(max + 1)], max, late)).toEqual({
      kind: 'full',
    });
    expect(await store.capacity.reserve(set, [longest(max)], max, late)).toEqual({ kind: 'reserved' });
    expect(await store.capacity.reserve(set, [longest(max + 1)], max, late)).toEqual({ kind: 'full' });
    expect((await store.capacity.reservations(set)).size).toBe(max);
  });

  it('takes one place over from its owner only, at the limit', async () => {
    const d = deliveries[60] as (typeof deliveries)[number];
    const m = d.members[3] as string;
    const redelivery = owner(2_000_000_000, 60);
    expect(await store.capacity.takeOverReservation(set, m, d.owner, redelivery)).toBe(true);
    expect(await store.capacity.takeOverReservation(set, m, d.owner, owner(2_000_000_000, -4))).toBe(false);
    expect((await store.capacity.reservations(set)).get(m)).toBe(redelivery);
    // The earlier delivery, undoing its own work, no longer gives that place back.
    await store.capacity.unreserve(set, [m], d.owner);
    expect((await store.capacity.reservations(set)).get(m)).toBe(redelivery);
  });

  it("gives back the dead deliveries' places, conditioned on their owner, and nothing else", async () => {
    const holders = await store.capacity.reservations(set);
    const dead = [...holders].filter(([, by]) => deliveries.slice(0, 10).some((d) => d.owner === by));
    expect(dead).toHaveLength(100);
    for (const [m, by] of dead) await store.capacity.unreserve(set, [m], by);
    const after = await store.capacity.reservations(set);
    expect(after.size).toBe(max - 100);
    for (const [m] of dead) expect(after.has(m)).toBe(false);
    for (const d of deliveries.slice(10)) {
      for (const m of d.members) if (holders.has(m)) expect(after.get(m)).toBe(holders.get(m));
    }
    // The room they left is usable up to the cap again, and no further.
    const refill = Array.from({ length: 100 }, (_, i) => longest(2 * max + i));
    expect(await store.capacity.reserve(set, refill, max, owner(2_000_000_000, -5))).toEqual({
      kind: 'reserved',
    });
    expect(await store.capacity.reserve(set, [longest(3 * max)], max, owner(2_000_000_000, -6))).toEqual({
      kind: 'full',
    });
  });
});
