import { afterEach, describe, expect, it } from 'vitest';
import { spreadSlot } from '../../shared/core/backing.ts';
import { BusyError } from '../../shared/core/errors.ts';
import { ownerSince, ownerToken, supersedes } from '../../shared/core/ids.ts';
import { Claim } from '../../shared/core/records.ts';
import { CLAIM_TAKEOVER_MS, SLOT_LEASE_MS } from '../../shared/core/timing.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import type { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys } from '../../shared/store/table.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { giveBackSlot } from '../../shared/usecases/place/backingNodes.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { crashingStore } from '../../testkit/crashingStore.ts';
import { type Harness, readyNode, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * Claims and capacity places carry the owner token of the delivery that took them (docs/table.md,
 * "Owners"): slot claims are one UpdateItem conditioned on the slot, a delivery builds on and gives
 * back only its own, a live delivery's claim makes a duplicate back off, a dead one's is taken over,
 * and the reaper gives back places nothing live holds.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

async function readyBacking(harness: Harness) {
  const [b] = await harness.pool.context.store.listBacking();
  if (!b) throw new Error('no backing node');
  return b;
}

describe('owner tokens', () => {
  it('name their delivery and when it started', () => {
    const t = ownerToken(1_700_000_000_123);
    expect(t).toMatch(/^[0-9a-z]+\.[0-9a-f]{12}$/);
    expect(ownerSince(t)).toBe(1_700_000_000_123);
    expect(ownerToken(5)).not.toBe(ownerToken(5));
    expect(ownerSince('not-a-token')).toBe(0); // unknown shape: treated as very old
  });

  it('name the message and receive of a queue delivery: a later receive supersedes an earlier one, nothing else does', () => {
    const first = ownerToken(5, { messageId: 'msg-a', receiveCount: 1 });
    const second = ownerToken(6, { messageId: 'msg-a', receiveCount: 2 });
    expect(first).toMatch(/^[0-9a-z]+\.[0-9a-f]{12}\.[0-9a-f]{12}-1$/);
    expect(ownerSince(second)).toBe(6);
    expect(supersedes(second, first)).toBe(true);
    expect(supersedes(first, second)).toBe(false);
    expect(supersedes(second, ownerToken(7, { messageId: 'msg-a', receiveCount: 2 }))).toBe(false); // a copy
    expect(supersedes(second, ownerToken(1, { messageId: 'msg-b', receiveCount: 1 }))).toBe(false); // a resend
    expect(supersedes(second, ownerToken(1))).toBe(false); // re-homing
    expect(supersedes(ownerToken(9), first)).toBe(false);
    expect(supersedes(second, 'unowned')).toBe(false);
  });

  it('read a claim written before owners existed as an abandoned one', () => {
    expect(Claim.parse(1_000)).toEqual({ at: 1_000, by: 'unowned' });
    expect(ownerSince('unowned')).toBe(0);
    expect(Claim.parse({ at: 5, by: 'x.0a' })).toEqual({ at: 5, by: 'x.0a' });
  });

  it('spread claimants over the free slots, never onto a taken one', () => {
    const b = { slots: 4, slotMap: { '1': 'x/0' } };
    const picks = new Set(Array.from({ length: 50 }, (_, i) => spreadSlot(b, `n-${i}/0`)));
    expect([...picks].sort()).toEqual([0, 2, 3]);
    expect(spreadSlot({ slots: 1, slotMap: { '0': 'x/0' } }, 'n/0')).toBeUndefined();
  });
});

describe('slot claims (one UpdateItem per claim, dynalite)', () => {
  it('lets claims of different slots on one backing node both succeed, and refuses a taken slot', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await readyNode(h, 'base');
    const store = h.pool.context.store;
    const read = await readyBacking(h);
    const now = h.clock.now();
    // Both read the same version: a whole-item version check would fail one of them.
    const [a, b] = await Promise.all([
      store.claimSlot(read, 1, 'a/0', { at: now, by: 'A' }),
      store.claimSlot(read, 2, 'b/0', { at: now, by: 'B' }),
    ]);
    expect(a.claimed && b.claimed).toBe(true);
    const late = await store.claimSlot(read, 1, 'c/0', { at: now, by: 'C' });
    expect(late.claimed).toBe(false);
    // The loser gets the item as it is now, without another read.
    expect(late.claimed ? undefined : late.current?.slotMap).toEqual({
      '0': 'base/0',
      '1': 'a/0',
      '2': 'b/0',
    });
    const after = await store.getBacking(read.id);
    expect(after?.used).toBe(3);
    expect(after?.version).toBe(read.version + 2);
    expect(after?.claims?.['1']).toEqual({ at: now, by: 'A' });
  });

  it('takes a backing node out of the free index when it fills, also when concurrent claims fill it', async () => {
    h = await startHarness(baseConfig({ slots: 3 }));
    await readyNode(h, 'base');
    const store = h.pool.context.store;
    const read = await readyBacking(h);
    const inFree = async () => (await store.findCandidates('meta/main', 'small-node', 10)).items.length;
    expect(await inFree()).toBe(1);
    // Two claimants read used = 1; neither thinks it takes the last slot, yet together they do.
    const outs = await Promise.all([
      store.claimSlot(read, 1, 'a/0', { at: 1, by: 'A' }),
      store.claimSlot(read, 2, 'b/0', { at: 1, by: 'B' }),
    ]);
    expect(outs.every((o) => o.claimed)).toBe(true);
    expect((await store.getBacking(read.id))?.used).toBe(3);
    expect(await inFree()).toBe(0);
  });

  it('refuses a drained or max-aged backing node even when the read was older', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await readyNode(h, 'base');
    const store = h.pool.context.store;
    const read = await readyBacking(h);
    await store.putBacking({ ...read, drained: true, version: read.version + 1 }, { version: read.version });
    expect((await store.claimSlot(read, 1, 'a/0', { at: 1, by: 'A' })).claimed).toBe(false);
    const drained = await readyBacking(h);
    const aged = { ...drained, drained: undefined, noNewNodesAfter: 1_000, version: drained.version + 1 };
    await store.putBacking(aged, { version: drained.version });
    expect((await store.claimSlot(aged, 1, 'a/0', { at: 1_000, by: 'A' })).claimed).toBe(false);
    expect((await store.claimSlot(aged, 1, 'a/0', { at: 999, by: 'A' })).claimed).toBe(true);
  });
});

describe('deliveries never undo each other', () => {
  it('frees a claimed slot only for the owner that claimed it', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await readyNode(h, 'base');
    const store = h.pool.context.store;
    const read = await readyBacking(h);
    await store.claimSlot(read, 1, 'dup/0', { at: h.clock.now(), by: 'first' });
    const ctx = h.pool.context;
    expect(await giveBackSlot(ctx, read.id, 'dup/0', { owner: 'second' })).toBe(false);
    expect((await store.getBacking(read.id))?.slotMap['1']).toBe('dup/0');
    expect(await giveBackSlot(ctx, read.id, 'dup/0', { owner: 'first', claimedAt: 0 })).toBe(false);
    expect(await giveBackSlot(ctx, read.id, 'dup/0', { owner: 'first' })).toBe(true);
    expect((await store.getBacking(read.id))?.slotMap['1']).toBeUndefined();
  });

  it('makes a duplicate back off from a live delivery claim, and take over a dead one', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const read = await readyBacking(h);
    // Another delivery of request "dup" claimed a slot for dup/0 and is still at work.
    const other = ownerToken(h.clock.now());
    await ctx.store.claimSlot(read, 3, 'dup/0', { at: h.clock.now(), by: other });
    const message = { kind: 'request' as const, id: 'dup', labels: ['small-node'] };
    await expect(requestNodes(ctx, message)).rejects.toThrow(BusyError);
    // It backed off without touching the other's claim, and recorded nothing.
    const held = await ctx.store.getBacking(read.id);
    expect(held?.slotMap['3']).toBe('dup/0');
    expect(held?.claims?.['3']?.by).toBe(other);
    expect(held?.used).toBe(2);
    // That delivery died: once its claim is older than the takeover age, the next one takes it over.
    h.clock.advance(CLAIM_TAKEOVER_MS);
    const out = await requestNodes(ctx, message);
    expect(out.kind).toBe('placed');
    expect(out.request.nodes[0]).toMatchObject({ state: 'ready', backingNodeId: read.id, slot: 3 });
    const after = await ctx.store.getBacking(read.id);
    expect(after?.used).toBe(2);
    expect(after?.claims?.['3']?.by).not.toBe(other);
  });

  it('ends a request that is still busy on its last receive with the reason, not in the dead-letter queue', async () => {
    h = await startHarness(baseConfig({ slots: 4 }), { maxReceiveCount: 3 });
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const read = await readyBacking(h);
    await ctx.store.claimSlot(read, 3, 'stuck/0', { at: h.clock.now(), by: ownerToken(h.clock.now()) });
    const body = JSON.stringify({ kind: 'request', id: 'stuck', labels: ['small-node'] });
    expect((await h.pool.handlers.request(sqsEvent([body], 1))).batchItemFailures).toHaveLength(1);
    expect(await ctx.store.getRequest('stuck')).toBeUndefined(); // retried, nothing recorded yet
    expect((await h.pool.handlers.request(sqsEvent([body], 3))).batchItemFailures).toEqual([]);
    expect(await ctx.store.getRequest('stuck')).toMatchObject({
      state: 'failed',
      reason:
        'gave up after 3 attempts: node stuck/0 is being placed by another delivery (on ' +
        `${read.id}); retrying later`,
    });
  });

  it('reports places held by another owner, removes only its own, and hands over a dead one', async () => {
    h = await startHarness(baseConfig({ maxServers: 3 }));
    const store = h.pool.context.store;
    const pool = 'meta/main';
    expect(await store.reserveNodePlaces(pool, ['r/0', 'r/1'], 3, 'A')).toEqual({ kind: 'reserved' });
    expect(await store.reserveNodePlaces(pool, ['r/0', 'r/1'], 3, 'A')).toEqual({ kind: 'reserved' }); // a retry
    const held = await store.reserveNodePlaces(pool, ['r/0', 'r/1'], 3, 'B');
    expect(held.kind === 'held' ? Object.fromEntries(held.holders) : held).toEqual({
      'r/0': 'A',
      'r/1': 'A',
    });
    expect(await store.reserveNodePlaces(pool, ['s/0', 's/1'], 3, 'C')).toEqual({ kind: 'full' });
    await store.freeNodePlaces(pool, ['r/0', 'r/1'], 'B'); // not B's: nothing happens
    expect([...(await store.nodePlaces(pool)).keys()].sort()).toEqual(['r/0', 'r/1']);
    expect(await store.takeOverNodePlace(pool, 'r/0', 'B', 'C')).toBe(false);
    expect(await store.takeOverNodePlace(pool, 'r/0', 'A', 'C')).toBe(true);
    await store.freeNodePlaces(pool, ['r/0', 'r/1'], 'A');
    expect(Object.fromEntries(await store.nodePlaces(pool))).toEqual({ 'r/0': 'C' });
    await store.freeNodePlaces(pool, ['r/0']); // a recorded node's release: whoever holds it
    expect((await store.nodePlaces(pool)).size).toBe(0);
  });

  it('has the reaper give back places no live record holds, once the slot lease has passed', async () => {
    h = await startHarness(baseConfig({ maxServers: 4, backingMax: 2 }));
    await readyNode(h, 'live');
    const store = h.pool.context.store;
    const live = await readyBacking(h);
    // A delivery reserved these and died before it wrote the records they were for.
    const dead = ownerToken(h.clock.now());
    await store.reserveBackingPlace('local/main', 'bn-never-written', 2, dead);
    await store.reserveNodePlaces('meta/main', ['gone/0'], 4, dead);
    h.clock.advance(SLOT_LEASE_MS - 1_000);
    expect((await h.pool.reapNow()).reclaimedPlaces).toBe(0);
    h.clock.advance(1_000);
    expect((await h.pool.reapNow()).reclaimedPlaces).toBe(2);
    // What live records hold stays, however old.
    expect([...(await store.backingPlaces('local/main')).keys()]).toEqual([live.id]);
    expect([...(await store.nodePlaces('meta/main')).keys()]).toEqual(['live/0']);
  });

  it('gives back the place of a claim its own run gave back, in that run (issue 25, defect 10)', async () => {
    h = await startHarness(baseConfig({ slots: 2, maxServers: 4 }), { maxReceiveCount: 50 });
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const b = await readyBacking(h);
    // A delivery reserves its place, claims a slot and dies before it records the node.
    const dying = makeRequestHandler({ ...ctx, store: crashingStore(ctx.store, (m) => m === 'claimSlot') });
    const body = JSON.stringify({ kind: 'request', id: 'cut', labels: ['small-node'] });
    expect((await dying(sqsEvent([body], 1))).batchItemFailures).toHaveLength(1);
    expect([...(await ctx.store.nodePlaces('meta/main')).keys()].sort()).toEqual(['base/0', 'cut/0']);
    // A restart: every delivery before it is dead. One run gives back the claim (step `claims`) and then
    // the place it leaves unheld (step `capacity`), not the place a reaper interval later.
    h.clock.advance(1);
    const restarted = { ...ctx, deliveriesDeadBefore: h.clock.now() };
    const report = await reap(restarted);
    expect(report).toMatchObject({ reclaimedSlots: 1, reclaimedPlaces: 1 });
    expect((await ctx.store.getBacking(b.id))?.slotMap).toEqual({ '0': 'base/0' });
    expect([...(await ctx.store.nodePlaces('meta/main')).keys()]).toEqual(['base/0']);
  });
});

describe('a warm allocation in a pool with max-servers (issue 39)', () => {
  it('takes its place in one transaction before it records the node; a refused one counts nothing', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 4 }));
    const harness = h;
    await readyNode(harness, 'base');
    const ctx = harness.pool.context;
    const sent: string[] = [];
    let refuse = false;
    const name = 'transaction-spy';
    harness.pool.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        const input = args.input as { Key?: { sk?: string }; Item?: { sk?: string } };
        const sk = input.Key?.sk ?? input.Item?.sk ?? '';
        const what = sk === 'REQUEST' ? `request ${context.commandName}` : String(context.commandName);
        sent.push(what);
        if (refuse && what === 'TransactWriteItemsCommand') {
          throw Object.assign(new Error('throttled'), { name: 'ProvisionedThroughputExceededException' });
        }
        return next(args);
      },
      { step: 'initialize', name },
    );
    try {
      sent.length = 0;
      expect((await requestNodes(ctx, { kind: 'request', id: 'warm', labels: ['small-node'] })).kind).toBe(
        'placed',
      );
      // One transaction (the counter and the place), before the request's write; no other write of either.
      expect(sent.filter((c) => c === 'TransactWriteItemsCommand')).toHaveLength(1);
      expect(sent.indexOf('TransactWriteItemsCommand')).toBeLessThan(sent.indexOf('request PutItemCommand'));
      // The transaction fails: nothing is recorded for the node, nothing counted, and the request waits
      // for its next delivery.
      refuse = true;
      await expect(
        requestNodes(ctx, { kind: 'request', id: 'part', labels: ['small-node'] }),
      ).rejects.toThrow('throttled');
      refuse = false;
    } finally {
      harness.pool.dynamodb.middlewareStack.remove(name);
    }
    expect((await ctx.store.getRequest('part'))?.state ?? 'none').not.toBe('fulfilled');
    expect([...(await ctx.store.nodePlaces('meta/main')).keys()].sort()).toEqual(['base/0', 'warm/0']);
    // 2 of 4 counted: two more fit, a third does not.
    expect((await ctx.store.reserveNodePlaces('meta/main', ['x/0', 'z/0'], 4, 'X')).kind).toBe('reserved');
    expect((await ctx.store.reserveNodePlaces('meta/main', ['y/0'], 4, 'Y')).kind).toBe('full');
  });
});

describe('a redelivery continues with the claims of the first try (issue 10, defect 8)', () => {
  it('takes over the claim and place an earlier receive left when it crashed, at once: same slot', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 10 }), { maxReceiveCount: 50 });
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const read = await readyBacking(h);
    const body = JSON.stringify({ kind: 'request', id: 'cut', labels: ['small-node'] });
    // Receive 1 reserves a place, claims a slot, and dies right after the claim.
    const dying = makeRequestHandler({ ...ctx, store: crashingStore(ctx.store, (m) => m === 'claimSlot') });
    expect((await dying(sqsEvent([body], 1))).batchItemFailures).toHaveLength(1);
    const left = await ctx.store.getBacking(read.id);
    const slot = Object.entries(left?.slotMap ?? {}).find(([, n]) => n === 'cut/0')?.[0];
    expect(slot).toBeDefined();
    const firstClaim = left?.claims?.[slot as string];
    expect(firstClaim?.by).toMatch(/-1$/);
    expect(await ctx.store.getRequest('cut')).toBeUndefined(); // it recorded nothing
    // Receive 2 of the same message, no time later: the same slot and place, taken over at once.
    expect((await h.pool.handlers.request(sqsEvent([body], 2))).batchItemFailures).toEqual([]);
    const placed = await ctx.store.getRequest('cut');
    expect(placed).toMatchObject({ state: 'fulfilled' });
    expect(placed?.nodes[0]).toMatchObject({ state: 'ready', backingNodeId: read.id, slot: Number(slot) });
    expect(placed?.placer).toBeUndefined(); // placed: nobody places it any more
    const after = await ctx.store.getBacking(read.id);
    expect(after?.used).toBe(2); // base and cut: no second slot
    expect(after?.claims?.[slot as string]?.by).toMatch(/-2$/);
    const places = await ctx.store.nodePlaces('meta/main');
    expect(places.get('cut/0')).toBe(after?.claims?.[slot as string]?.by);
  });

  it("leaves nothing counted when an earlier receive died inside its places' transaction: counted once", async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 3 }), { maxReceiveCount: 50 });
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const sets = (ctx.store as DynamoStore).capacity;
    const body = JSON.stringify({ kind: 'request', id: 'cut', labels: ['small-node'] });
    // Receive 1 dies after the first action of its transaction (the place written, the count not yet).
    h.pool.transactions.afterAction = () => {
      throw new Error('crashed inside the transaction');
    };
    try {
      const out = await makeRequestHandler(ctx)(sqsEvent([body], 1));
      expect(out.batchItemFailures).toHaveLength(1);
    } finally {
      h.pool.transactions.afterAction = undefined;
    }
    // Rolled back: no place, no count; nothing for a recovery or an adoption to find.
    expect([...(await ctx.store.nodePlaces('meta/main')).keys()]).toEqual(['base/0']);
    expect(await sets.used(keys.poolNodes('meta/main'))).toBe(1);
    // Receive 2 of the same message, no time later, places it: counted once.
    expect((await h.pool.handlers.request(sqsEvent([body], 2))).batchItemFailures).toEqual([]);
    expect(await ctx.store.getRequest('cut')).toMatchObject({ state: 'fulfilled' });
    expect((await ctx.store.nodePlaces('meta/main')).get('cut/0')).toMatch(/-2$/);
    expect(await sets.used(keys.poolNodes('meta/main'))).toBe(2);
    expect((await ctx.store.reserveNodePlaces('meta/main', ['x/0'], 3, 'X')).kind).toBe('reserved');
    expect((await ctx.store.reserveNodePlaces('meta/main', ['y/0'], 3, 'Y')).kind).toBe('full');
  });

  it('leaves an earlier receive that still runs unable to record anything once a later one took over', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const read = await readyBacking(h);
    const message = { kind: 'request' as const, id: 'slow', labels: ['small-node'] };
    // Receive 1 claims a slot, then stalls just before it writes the placed request.
    let resume: () => void = () => {};
    const stalled = new Promise<void>((r) => {
      resume = r;
    });
    let reachedWrite: () => void = () => {};
    const atWrite = new Promise<void>((r) => {
      reachedWrite = r;
    });
    const slowStore = new Proxy(ctx.store, {
      get(target, prop) {
        const value = Reflect.get(target, prop, target) as (...a: unknown[]) => Promise<unknown>;
        if (prop !== 'createRequest') return typeof value === 'function' ? value.bind(target) : value;
        return async (...args: unknown[]) => {
          reachedWrite();
          await stalled;
          return value.apply(target, args);
        };
      },
    });
    const first = requestNodes({ ...ctx, store: slowStore }, message, {
      messageId: 'm-slow',
      receiveCount: 1,
    });
    await atWrite;
    // Receive 2 takes the claim over at once, then runs out of time and gives the slot back.
    let timeUp = false;
    const takenOver = (m: string) => {
      if (m === 'putBacking') timeUp = true; // the takeover's write
      return false;
    };
    const second: Context = {
      ...ctx,
      store: crashingStore(ctx.store, takenOver),
      deadline: { remainingMs: () => (timeUp ? 0 : 10_000) },
    };
    await expect(requestNodes(second, message, { messageId: 'm-slow', receiveCount: 2 })).rejects.toThrow(
      /ran out of invocation time/,
    );
    expect(Object.values((await ctx.store.getBacking(read.id))?.slotMap ?? {})).toEqual(['base/0']);
    // Receive 1 wakes up: the request names receive 2 as its placer, so it records nothing.
    resume();
    await expect(first).rejects.toThrow(/being placed by a later delivery of its message/);
    const r = await ctx.store.getRequest('slow');
    expect(r?.state).toBe('requested');
    expect(r?.placer).toMatch(/-2$/);
    expect(Object.values((await ctx.store.getBacking(read.id))?.slotMap ?? {})).toEqual(['base/0']);
  });

  it('takes over at once what a delivery of the process before this embedded pool holds, for a resend too', async () => {
    h = await startHarness(baseConfig({ slots: 4, maxServers: 10 }));
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    expect(ctx.deliveriesDeadBefore).toBeDefined();
    const before = (ctx.deliveriesDeadBefore as number) - 1_000; // a second before this stack started
    const read = await readyBacking(h);
    // The process before this one died (kill -9) right after reserving a place and claiming a slot for
    // "resent/0"; its queue died with it. The client sends the request again: a new message.
    const dead = ownerToken(before);
    await ctx.store.reserveNodePlaces('meta/main', ['resent/0'], 10, dead);
    await ctx.store.claimSlot(read, 2, 'resent/0', { at: before, by: dead });
    const out = await h.pool.handlers.request(
      sqsEvent([JSON.stringify({ kind: 'request', id: 'resent', labels: ['small-node'] })]),
    );
    expect(out.batchItemFailures).toEqual([]); // not busy for CLAIM_TAKEOVER_MS
    expect((await ctx.store.getRequest('resent'))?.nodes[0]).toMatchObject({
      backingNodeId: read.id,
      slot: 2,
    });
    expect((await ctx.store.getBacking(read.id))?.used).toBe(2);
  });

  it('has the reaper give back at once a claim a delivery of the process before this embedded pool left', async () => {
    h = await startHarness(baseConfig({ slots: 4 }));
    await readyNode(h, 'base');
    const ctx = h.pool.context;
    const before = (ctx.deliveriesDeadBefore as number) - 1;
    const read = await readyBacking(h);
    await ctx.store.claimSlot(read, 1, 'never/0', { at: before, by: ownerToken(before) });
    await ctx.store.claimSlot(read, 3, 'alive/0', { at: h.clock.now(), by: ownerToken(h.clock.now()) });
    expect((await h.pool.reapNow()).reclaimedSlots).toBe(1);
    expect((await ctx.store.getBacking(read.id))?.slotMap).toEqual({ '0': 'base/0', '3': 'alive/0' });
  });
});
