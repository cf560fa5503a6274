import { CreateTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient, GetCommand, PutCommand } from '@aws-sdk/lib-dynamodb';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ConflictError } from '../../shared/core/errors.ts';
import { withDuration } from '../../shared/core/estimates.ts';
import { nodeId } from '../../shared/core/ids.ts';
import { MAX_NODE_SET } from '../../shared/core/messages.ts';
import { backoffAfterFailure } from '../../shared/core/minReady.ts';
import type { BackingPhase } from '../../shared/core/poolStore.ts';
import type { BackingRecord, RequestRecord } from '../../shared/core/records.ts';
import { guardDynamoLimits } from '../../shared/runtime/dynamoLimits.ts';
import { localDynamoClient, startDynalite } from '../../shared/runtime/engines.ts';
import { MAX_SET_CHANGE } from '../../shared/store/capacitySets.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { backingItem, keys, tableDefinition } from '../../shared/store/table.ts';
import { describeWithDynamoDbLocal, startDynamoDbLocal } from '../../testkit/dynamoDbLocal.ts';
import { describeWithMoto, MOTO_CREDENTIALS, startMoto } from '../../testkit/moto.ts';

/**
 * Store conformance: every conditional write of DynamoStore, through the real SDK, on DynamoDB as
 * moto speaks it and as dynalite (the embedded pool's engine) speaks it, with the same assertions:
 * a condition that holds on one engine and not on the other, an expression one of them rejects, or an
 * answer the store reads differently, fails here.
 *
 * The engines differ in one way the store must handle: on a failed condition with
 * ReturnValuesOnConditionCheckFailure, moto (like DynamoDB) returns the item with the error, and
 * dynalite returns nothing (the store then reads the item). The claim tests count the reads to show
 * which path each engine took.
 *
 * Contention (many writers on one item at once) is tested on dynalite only (test/embedded/owners.test.ts, the
 * chaos suite): moto applies concurrent updates to one item without a lock, so a lost update there
 * would be moto's, not ours. Everything here is sequential.
 */

interface Engine {
  /** Whether a failed condition returns the item (ReturnValuesOnConditionCheckFailure: ALL_OLD). */
  readonly returnsItemOnConditionFailure: boolean;
  readonly client: DynamoDBClient;
  stop(): Promise<void>;
}

function conformance(start: () => Promise<Engine>): () => void {
  return () => {
    let engine: Engine;
    /** GetItem, Query and BatchGetItem calls the store made (the client counts them). */
    let reads = 0;
    let queries = 0;
    let batches = 0;
    let tables = 0;
    let store: DynamoStore;

    beforeAll(async () => {
      engine = await start();
      engine.client.middlewareStack.add(
        (next, context) => async (args) => {
          if (context.commandName === 'GetItemCommand') reads++;
          if (context.commandName === 'QueryCommand') queries++;
          if (context.commandName === 'BatchGetItemCommand') batches++;
          return next(args);
        },
        { step: 'initialize', name: 'countReads' },
      );
    });
    afterAll(async () => {
      engine?.client.destroy();
      await engine?.stop();
    });
    beforeEach(async () => {
      // A table per test, created from the definition the stack and the embedded engine use.
      const tableName = `conformance-${++tables}`;
      await engine.client.send(new CreateTableCommand({ TableName: tableName, ...tableDefinition }));
      store = new DynamoStore(engine.client, tableName);
      reads = 0;
    });

    /** Writes an item as it is, bypassing the store's conditions (a state only a race could leave). */
    const putRaw = (item: Record<string, unknown>) =>
      DynamoDBDocumentClient.from(engine.client).send(
        new PutCommand({ TableName: store.tableName, Item: item }),
      );

    /** Reads an item as it is stored, index attributes included. */
    const getRaw = async (key: Record<string, unknown>) =>
      (
        await DynamoDBDocumentClient.from(engine.client).send(
          new GetCommand({ TableName: store.tableName, Key: key, ConsistentRead: true }),
        )
      ).Item;

    describe('requests', () => {
      it('records a request once; a second create with the same id returns the first', async () => {
        expect(await store.createRequest(request('r1'))).toBeUndefined();
        const again = await store.createRequest({ ...request('r1'), bodyHash: 'other', labels: ['x'] });
        expect(again).toEqual(request('r1'));
        expect(await store.getRequest('r1')).toEqual(request('r1'));
        expect(await store.getRequest('unknown')).toBeUndefined();
      });

      it('reads several requests at once, 100 keys a call: the ones there, none of the absent, duplicates once', async () => {
        const ids = Array.from({ length: 130 }, (_, i) => `many-${i}`);
        for (const id of ids.filter((_, i) => i % 2 === 0)) await store.createRequest(request(id));
        reads = 0;
        batches = 0;
        const found = await store.getRequests([...ids, 'many-0', 'unknown']);
        expect([...found.keys()].sort()).toEqual(ids.filter((_, i) => i % 2 === 0).sort());
        expect(found.get('many-4')).toEqual(request('many-4'));
        expect(batches).toBe(2); // 131 distinct ids
        expect(reads).toBe(0);
        expect(await store.getRequests([])).toEqual(new Map());
        expect(batches).toBe(2);
      });

      it('replaces a request at the version it read and refuses a stale version', async () => {
        await store.createRequest(request('r1'));
        const next = { ...request('r1'), state: 'failed' as const, reason: 'no', version: 1 };
        await store.putRequest(next, 0);
        expect(await store.getRequest('r1')).toEqual(next);
        const stale = store.putRequest({ ...next, reason: 'stale', version: 1 }, 0);
        await expect(stale).rejects.toBeInstanceOf(ConflictError);
        await expect(stale).rejects.toThrow('request r1 changed since version 0');
        expect(await store.getRequest('r1')).toEqual(next);
      });

      it('reads the lapsed leases of every lease partition, a page at a time, and moves a renewed one in its own', async () => {
        // 40 leased requests, lapsing at 10_000 + i: spread over the LEASE partitions (issue 40, defect 1).
        const leased = Array.from({ length: 40 }, (_, i) => ({
          ...placed(`leased-${i}`, ['ready']),
          lease: 60,
          leaseExpiresAt: 10_000 + i,
        }));
        for (const r of leased) await store.createRequest(r);
        const lapsedBefore = async (before: number) => {
          const ids: string[] = [];
          let cursor: Record<string, unknown> | undefined;
          do {
            const page = await store.leasesBefore(before, cursor);
            ids.push(...page.items.map((r) => r.id));
            cursor = page.cursor;
          } while (cursor);
          return ids.sort();
        };
        expect(await lapsedBefore(10_020)).toEqual(
          leased
            .slice(0, 20)
            .map((r) => r.id)
            .sort(),
        );
        expect(await lapsedBefore(Number.MAX_SAFE_INTEGER)).toHaveLength(40);
        // More than one partition holds them.
        const partitions = new Set(
          await Promise.all(
            leased.map(async (r) => (await getRaw(keys.request(r.id)))?.fpk as string | undefined),
          ),
        );
        expect(partitions.size).toBeGreaterThan(4);
        // A renewal moves the request within its partition: it no longer lapses before 10_020.
        expect(await store.renewLease('leased-0', 10_000, 60, 70_000, 9_000)).toBe(true);
        expect(await lapsedBefore(10_020)).not.toContain('leased-0');
        expect(await lapsedBefore(70_001)).toContain('leased-0');
      });

      it('releases a placed node once, in one conditional update', async () => {
        await store.createRequest(placed('r1', ['pending', 'ready']));
        const released = await store.releaseNodeEntry('r1', 1, 5_000);
        expect(released?.version).toBe(1);
        expect(released?.updatedAt).toBe(5_000);
        expect(released?.nodes[1]).toMatchObject({ state: 'released', releasedAt: 5_000 });
        expect(released?.nodes[0]?.state).toBe('pending');
        expect(await store.getRequest('r1')).toEqual(released);
        // Already released: the condition fails and nothing changes.
        expect(await store.releaseNodeEntry('r1', 1, 6_000)).toBeUndefined();
        // A pending node releases too.
        expect((await store.releaseNodeEntry('r1', 0, 7_000))?.nodes[0]?.state).toBe('released');
        expect((await store.getRequest('r1'))?.version).toBe(2);
      });

      it('gives an ended request its expiresAt (TTL): a one-node one in its release, the last of several after it', async () => {
        const raw = async (id: string) =>
          (
            await DynamoDBDocumentClient.from(engine.client).send(
              new GetCommand({ TableName: store.tableName, Key: keys.request(id), ConsistentRead: true }),
            )
          ).Item;
        const day = 86_400;
        const expiresAt = (ms: number) => Math.ceil(ms / 1000) + 7 * day; // the default record-retention
        // One node: one update releases it and sets expiresAt (condition size(nodes) = 1).
        await store.createRequest(placed('solo', ['ready']));
        expect(await raw('solo')).not.toHaveProperty('expiresAt');
        expect((await store.releaseNodeEntry('solo', 0, 5_000))?.nodes[0]?.state).toBe('released');
        expect((await raw('solo'))?.expiresAt).toBe(expiresAt(5_000));
        // Two nodes: node 0's one-node attempt is refused (moto returns the item, dynalite is read), then
        // it is released as one of several; the last one's release sets expiresAt.
        await store.createRequest(placed('pair', ['ready', 'ready']));
        reads = 0;
        expect((await store.releaseNodeEntry('pair', 0, 6_000))?.nodes[0]?.state).toBe('released');
        expect(reads).toBe(engine.returnsItemOnConditionFailure ? 0 : 1);
        expect(await raw('pair')).not.toHaveProperty('expiresAt');
        expect((await store.releaseNodeEntry('pair', 1, 7_000))?.nodes[1]?.state).toBe('released');
        expect((await raw('pair'))?.expiresAt).toBe(expiresAt(7_000));
        // A node already released: refused, nothing written.
        expect(await store.releaseNodeEntry('solo', 0, 8_000)).toBeUndefined();
        expect((await raw('solo'))?.expiresAt).toBe(expiresAt(5_000));
        // Whole-item puts compute it: a failed request has it, a live one not.
        await store.putRequest({ ...request('solo'), version: 2, state: 'failed', updatedAt: 9_000 }, 1);
        expect((await raw('solo'))?.expiresAt).toBe(expiresAt(9_000));
      });

      it('releases a held node only when forced, and nothing of a request not placed yet', async () => {
        await store.createRequest({
          ...placed('r1', ['ready']),
          nodes: [{ ...node('r1', 0, 'ready'), held: true }],
        });
        expect(await store.releaseNodeEntry('r1', 0, 5_000)).toBeUndefined();
        expect((await store.releaseNodeEntry('r1', 0, 5_000, true))?.nodes[0]?.state).toBe('released');

        await store.createRequest({ ...request('r2'), nodes: [node('r2', 0, 'requested')] });
        expect(await store.releaseNodeEntry('r2', 0, 5_000)).toBeUndefined();
        expect(await store.releaseNodeEntry('r2', 3, 5_000)).toBeUndefined(); // no such node
        expect(await store.releaseNodeEntry('unknown', 0, 5_000)).toBeUndefined();
        expect((await store.getRequest('r2'))?.version).toBe(0);
      });
    });

    describe('backing nodes', () => {
      it('records a backing node once; a second create returns the first', async () => {
        expect(await store.createBacking(backing('b1'))).toBeUndefined();
        expect(await store.createBacking({ ...backing('b1'), label: 'other' })).toEqual(backing('b1'));
        expect(await store.getBacking('b1')).toEqual(backing('b1'));
      });

      it('replaces a backing node only at the version, state and used slots it read', async () => {
        await store.createBacking(backing('b1', { state: 'launching', used: 1, slotMap: { '0': 'r/0' } }));
        const read = (await store.getBacking('b1')) as BackingRecord;
        const ready = { ...read, state: 'ready' as const, version: 1 };
        await expect(store.putBacking(ready, { version: 0, states: ['ready'] })).rejects.toThrow(
          'backing node b1 changed since version 0',
        );
        await expect(store.putBacking(ready, { version: 0, used: 0 })).rejects.toBeInstanceOf(ConflictError);
        await expect(store.putBacking(ready, { version: 3 })).rejects.toBeInstanceOf(ConflictError);
        expect(await store.getBacking('b1')).toEqual(read);
        await store.putBacking(ready, { version: 0, states: ['launching', 'ready'], used: 1 });
        expect(await store.getBacking('b1')).toEqual(ready);
      });

      it("records a claimed node's expected end in the slot's entry (a nested SET both engines accept)", async () => {
        const read = backing('b1', { slots: 3 });
        await store.createBacking(read);
        const out = await store.claimSlot(read, 1, 'r/0', { at: 2_000, by: 'o' }, 62_000);
        expect(out.claimed && out.record.ends).toEqual({ '1': 62_000 });
        const after = (await store.getBacking('b1')) as BackingRecord;
        const next = await store.claimSlot(after, 0, 'q/0', { at: 2_001, by: 'o' }); // no estimate
        expect(next.claimed && next.record.ends).toEqual({ '1': 62_000 });
      });

      it('claims a free slot and bumps the version, keeping the node in the free index', async () => {
        const read = backing('b1', { slots: 3 });
        await store.createBacking(read);
        const out = await store.claimSlot(read, 0, 'r/0', { at: 2_000, by: 'owner-a' });
        expect(out.claimed).toBe(true);
        const record = out.claimed ? out.record : undefined;
        expect(record).toMatchObject({ used: 1, version: 1, slotMap: { '0': 'r/0' } });
        expect(record?.claims).toEqual({ '0': { at: 2_000, by: 'owner-a' } });
        expect(await store.getBacking('b1')).toEqual(record);
        // Fullest first: the index entry was rewritten with the free count after the claim.
        const { items } = await store.findCandidates('meta/main', 'small', 10);
        expect(items.map((b) => [b.id, b.used])).toEqual([['b1', 1]]);
        expect((await store.backingInPhase('active')).map((b) => b.id)).toEqual(['b1']);
        expect(await store.backingInPhase('idle')).toEqual([]);
      });

      it('refuses a claimed slot and answers with the item as it is now', async () => {
        const read = backing('b1', { slots: 3 });
        await store.createBacking(read);
        const first = await store.claimSlot(read, 1, 'r/0', { at: 2_000, by: 'owner-a' });
        reads = 0;
        const second = await store.claimSlot(read, 1, 'q/0', { at: 2_001, by: 'owner-b' });
        expect(second).toEqual({ claimed: false, current: first.claimed ? first.record : undefined });
        // moto returns the item with the failure; dynalite does not, and the store reads it.
        expect(reads).toBe(engine.returnsItemOnConditionFailure ? 0 : 1);
        expect((await store.getBacking('b1'))?.slotMap).toEqual({ '1': 'r/0' });
      });

      it('refuses a claim on a node that changed state, is drained, past max-age or gone', async () => {
        const read = backing('b1', { state: 'launching', slots: 2 });
        await store.createBacking(read);
        await store.putBacking({ ...read, state: 'ready', version: 1 }, { version: 0 });
        const stateChanged = await store.claimSlot(read, 0, 'r/0', { at: 2_000, by: 'o' });
        expect(stateChanged).toMatchObject({ claimed: false, current: { state: 'ready', used: 0 } });

        await store.createBacking(backing('b2', { drained: true }));
        expect((await store.claimSlot(backing('b2'), 0, 'r/0', { at: 2_000, by: 'o' })).claimed).toBe(false);

        await store.createBacking(backing('b3', { noNewNodesAfter: 1_500 }));
        const expired = await store.claimSlot(backing('b3'), 0, 'r/0', { at: 2_000, by: 'o' });
        expect(expired).toMatchObject({ claimed: false, current: { id: 'b3', used: 0 } });
        const inTime = await store.claimSlot(backing('b3'), 0, 'r/0', { at: 1_000, by: 'o' });
        expect(inTime.claimed).toBe(true);

        reads = 0;
        expect(await store.claimSlot(backing('gone'), 0, 'r/0', { at: 2_000, by: 'o' })).toEqual({
          claimed: false,
        });
        // No item to return: both engines answer with nothing, and the store's read finds nothing.
        expect(reads).toBe(1);
      });

      it('takes the node out of the free index with the claim that fills it, and refuses one more', async () => {
        const read = backing('b1', { slots: 2 });
        await store.createBacking(read);
        const one = await store.claimSlot(read, 0, 'r/0', { at: 2_000, by: 'o' });
        const after = one.claimed ? one.record : read;
        const two = await store.claimSlot(after, 1, 'r/1', { at: 2_001, by: 'o' });
        expect(two).toMatchObject({ claimed: true, record: { used: 2, version: 2 } });
        expect((await store.findCandidates('meta/main', 'small', 10)).items).toEqual([]);
        // The filling claim is conditioned on `used` as read: a stale read cannot fill it twice.
        const three = await store.claimSlot(after, 2, 'r/2', { at: 2_002, by: 'o' });
        expect(three).toMatchObject({ claimed: false, current: { used: 2 } });
      });

      it('repairs the free index when claims filled the node behind a stale read', async () => {
        // Read at used 0 of 3; two other claims land; this one (slot 2) fills the node by what is
        // stored, not by what it read, so it does not remove the index entry itself.
        const read = backing('b1', { slots: 3 });
        await store.createBacking(read);
        await store.claimSlot(read, 0, 'x/0', { at: 2_000, by: 'a' });
        await store.claimSlot(read, 1, 'y/0', { at: 2_000, by: 'b' });
        const out = await store.claimSlot(read, 2, 'z/0', { at: 2_000, by: 'c' });
        expect(out).toMatchObject({ claimed: true, record: { used: 3, version: 3 } });
        expect((await store.findCandidates('meta/main', 'small', 10)).items).toEqual([]);
      });

      it('repairs the free index when a refused claim finds the node full but still listed', async () => {
        // A full node whose free-index entry a crash left behind.
        const full = backing('b1', { slots: 1, used: 1, slotMap: { '0': 'r/0' } });
        await putRaw({ ...backingItem(full), fpk: 'FREE#meta/main#small', fsk: '00001#x#b1' });
        expect((await store.findCandidates('meta/main', 'small', 10)).items).toHaveLength(1);
        const out = await store.claimSlot(backing('b1', { slots: 1 }), 0, 'q/0', { at: 2_000, by: 'o' });
        expect(out).toMatchObject({ claimed: false, current: { used: 1 } });
        expect((await store.findCandidates('meta/main', 'small', 10)).items).toEqual([]);
      });

      it('lists candidates fullest first then oldest, a page at a time', async () => {
        await store.createBacking(backing('old-empty', { launchedAt: 100 }));
        await store.createBacking(backing('new-empty', { launchedAt: 300 }));
        await store.createBacking(backing('half', { launchedAt: 200, used: 1, slotMap: { '0': 'r/0' } }));
        await store.createBacking(backing('other-label', { label: 'big' }));
        await store.createBacking(backing('retiring', { state: 'retiring', retiredAt: 50 }));
        const first = await store.findCandidates('meta/main', 'small', 2);
        expect(first.items.map((b) => b.id)).toEqual(['half', 'old-empty']);
        expect(first.cursor).toBeDefined();
        const rest = await store.findCandidates('meta/main', 'small', 2, first.cursor);
        expect(rest.items.map((b) => b.id)).toEqual(['new-empty']);
      });

      it('queries the reap index by partition, before a sort key, across pages', async () => {
        await store.createBacking(backing('idle-1', { lastUsedAt: 1_000 }));
        await store.createBacking(backing('idle-2', { lastUsedAt: 3_000 }));
        await store.createBacking(backing('busy', { used: 1, slotMap: { '0': 'r/0' } }));
        await store.createBacking(backing('boot', { state: 'launching', used: 1, slotMap: { '0': 'q/0' } }));
        await store.createBacking(backing('going', { state: 'retiring', retiredAt: 10 }));
        await store.createBacking(backing('broken', { state: 'failed', retiredAt: 20 }));
        await store.createBacking(backing('gone', { state: 'stopped', stoppedAt: 30 }));
        const ids = async (p: BackingPhase, before?: string) =>
          (await store.backingInPhase(p, before)).map((b) => b.id);
        expect(await ids('idle')).toEqual(['idle-1', 'idle-2']);
        expect(await ids('idle', '000000000002000')).toEqual(['idle-1']);
        expect(await ids('active')).toEqual(['busy']);
        expect(await ids('launching')).toEqual(['boot']);
        expect(await ids('retiring')).toEqual(['going']);
        expect(await ids('failed')).toEqual(['broken']);
        // Many items: backingInPhase follows LastEvaluatedKey (1 MB pages; large items make several).
        const padding = 'x'.repeat(300_000);
        for (let i = 0; i < 5; i++)
          await putRaw({ ...backingItem(backing(`big-${i}`, { lastUsedAt: 5_000 + i })), padding });
        queries = 0;
        expect(await ids('idle')).toHaveLength(7);
        expect(queries).toBeGreaterThan(1);
      });

      it('lists every request and backing node (admin scans)', async () => {
        await store.createRequest(request('r1'));
        await store.createRequest(request('r2'));
        await store.createBacking(backing('b1'));
        expect((await store.listRequests()).map((r) => r.id).sort()).toEqual(['r1', 'r2']);
        expect((await store.listBacking()).map((b) => b.id)).toEqual(['b1']);
      });
    });

    describe('duration estimates', () => {
      it('writes an estimate only from the version it was made from, per label and per requestor', async () => {
        const first = withDuration(undefined, { label: 'small' }, 60, 1_000);
        expect(await store.getEstimate('small')).toBeUndefined();
        expect(await store.putEstimate(first)).toBe(true);
        expect(await store.putEstimate(first)).toBe(false); // version 1 exists already
        const second = withDuration(first, { label: 'small' }, 240, 2_000);
        expect(await store.putEstimate(second)).toBe(true);
        expect(await store.putEstimate(withDuration(first, { label: 'small' }, 30, 3_000))).toBe(false); // stale
        expect(await store.getEstimate('small')).toEqual(second);
        const own = withDuration(undefined, { label: 'small', requestor: 'ci' }, 10, 4_000);
        expect(await store.putEstimate(own)).toBe(true);
        expect(await store.getEstimate('small', 'ci')).toEqual(own);
        expect(await store.getEstimate('small')).toEqual(second); // separate items
        expect(await store.listRequests()).toEqual([]);
      });
    });

    describe('min-ready backoff and the reaper cursor', () => {
      it('writes each only from the version it read, beside the seats and apart', async () => {
        const first = backoffAfterFailure(undefined, 1_000, 'launch failed');
        expect(await store.putLabelBackoff('small', first)).toBe(true);
        expect(await store.putLabelBackoff('small', first)).toBe(false); // version 1 exists already
        await store.openSeat('small', 0);
        await store.advanceSeat('small', 1, 0);
        const state = await store.minReadyState('small');
        expect(state.backoff).toEqual(first);
        expect([...state.gens.entries()].sort()).toEqual([
          [0, 0],
          [1, 1],
        ]);
        expect(await store.seatGenerations('small')).toEqual(state.gens); // the backoff is no seat
        const second = backoffAfterFailure(first, 2_000, 'again');
        expect(await store.putLabelBackoff('small', second)).toBe(true);
        expect(await store.putLabelBackoff('small', backoffAfterFailure(first, 3_000))).toBe(false); // stale
        expect((await store.minReadyState('small')).backoff).toMatchObject({ failures: 2, version: 2 });

        expect(await store.reaperCursor()).toBeUndefined();
        expect(await store.putReaperCursor('deadlines', undefined)).toBe(true);
        expect(await store.putReaperCursor('claims', undefined)).toBe(false); // written meanwhile
        expect(await store.reaperCursor()).toEqual({ first: 'deadlines', version: 1 });
        expect(await store.putReaperCursor(undefined, 1)).toBe(true);
        expect(await store.reaperCursor()).toEqual({ version: 2 });
        expect(await store.listRequests()).toEqual([]);
      });
    });

    describe('resource pointers', () => {
      it('points a resource at one backing node; another backing node is refused', async () => {
        expect(await store.backingIdOfResource('i-1')).toBeUndefined();
        await store.pointToBacking('i-1', 'b1', 1_000);
        await store.pointToBacking('i-1', 'b1', 2_000); // idempotent for the same backing node
        expect(await store.backingIdOfResource('i-1')).toBe('b1');
        const other = store.pointToBacking('i-1', 'b2', 3_000);
        await expect(other).rejects.toBeInstanceOf(ConflictError);
        await expect(other).rejects.toThrow('resource i-1 is already recorded by another backing node');
        expect(await store.backingIdOfResource('i-1')).toBe('b1');
        // Pointers are neither requests nor backing nodes in the admin listings.
        expect(await store.listBacking()).toEqual([]);
        expect(await store.listRequests()).toEqual([]);
      });

      it('forgets a pointer only for the backing node it names, idempotently', async () => {
        await store.pointToBacking('i-1', 'b1', 1_000);
        await store.forgetResource('i-1', 'b2');
        expect(await store.backingIdOfResource('i-1')).toBe('b1');
        await store.forgetResource('i-1', 'b1');
        expect(await store.backingIdOfResource('i-1')).toBeUndefined();
        await store.forgetResource('i-1', 'b1');
        await store.forgetResource('never-recorded', 'b1');
        await store.pointToBacking('i-1', 'b2', 4_000); // free again
        expect(await store.backingIdOfResource('i-1')).toBe('b2');
      });
    });

    describe('capacity sets', () => {
      const set = keys.poolNodes('meta/main');

      it('creates the set with the first reservation and refuses members past the limit', async () => {
        expect(await store.capacity.reserve(set, ['a', 'b'], 3, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.reserve(set, ['c', 'd'], 3, 'o2')).toEqual({ kind: 'full' });
        expect(await store.capacity.reserve(set, ['c'], 3, 'o2')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.reserve(set, ['d'], 3, 'o2')).toEqual({ kind: 'full' });
        expect(Object.fromEntries(await store.capacity.reservations(set))).toEqual({
          a: 'o1',
          b: 'o1',
          c: 'o2',
        });
      });

      it('counts its own members as reserved, reports members held by others, asks again for the rest', async () => {
        await store.capacity.reserve(set, ['a'], 3, 'o1');
        expect(await store.capacity.reserve(set, ['a'], 1, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.reserve(set, ['a', 'b'], 3, 'o2')).toEqual({
          kind: 'held',
          holders: new Map([['a', 'o1']]),
        });
        expect(await store.capacity.reserve(set, ['a', 'b'], 3, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.members(set)).toEqual(new Set(['a', 'b']));
      });

      it('gives back only the members an owner holds; without an owner, any', async () => {
        await store.capacity.reserve(set, ['a', 'b'], 5, 'o1');
        await store.capacity.reserve(set, ['c'], 5, 'o2');
        await store.capacity.unreserve(set, ['a', 'c'], 'o1');
        expect(Object.fromEntries(await store.capacity.reservations(set))).toEqual({ b: 'o1', c: 'o2' });
        await store.capacity.unreserve(set, ['c', 'missing']);
        expect(Object.fromEntries(await store.capacity.reservations(set))).toEqual({ b: 'o1' });
        // No set at all: nothing to remove, and no error.
        await store.capacity.unreserve(keys.poolNodes('other'), ['a']);
        await store.capacity.unreserve(keys.poolNodes('other'), ['a'], 'o1');
        expect(await store.capacity.members(keys.poolNodes('other'))).toEqual(new Set());
      });

      it("finishes a set's reserve and counts its release down in one write of the counter each", async () => {
        const members = ['s/0', 's/1', 's/2', 's/3'];
        expect(await store.capacity.reserve(set, members, 5, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.used(set)).toBe(4);
        await store.capacity.unreserve(set, [...members, 'missing'], 'o1');
        expect(await store.capacity.used(set)).toBe(0);
        expect(await store.capacity.members(set)).toEqual(new Set());
        expect(await store.capacity.reserve(set, ['t/0', 't/1', 't/2', 't/3', 't/4'], 5, 'o2')).toEqual({
          kind: 'reserved',
        });
      });

      it('takes a reservation over only from its current owner', async () => {
        await store.capacity.reserve(set, ['a'], 5, 'dead');
        expect(await store.capacity.takeOverReservation(set, 'a', 'dead', 'alive')).toBe(true);
        expect(await store.capacity.takeOverReservation(set, 'a', 'dead', 'late')).toBe(false);
        expect(await store.capacity.takeOverReservation(set, 'missing', 'dead', 'alive')).toBe(false);
        expect(Object.fromEntries(await store.capacity.reservations(set))).toEqual({ a: 'alive' });
      });

      it('counts the members an owner holds already as taken, also when the set is full (a retry)', async () => {
        expect(await store.capacity.reserve(set, ['a', 'b'], 2, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.reserve(set, ['a', 'b'], 2, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.reserve(set, ['b', 'c'], 3, 'o1')).toEqual({ kind: 'reserved' });
        expect(await store.capacity.used(set)).toBe(3);
        expect(await store.capacity.members(set)).toEqual(new Set(['a', 'b', 'c']));
      });

      // Issue 39: a node set of 64 sent a 7 KB condition DynamoDB refuses; the guard on every engine
      // here refuses what DynamoDB would. One transaction each way, whatever the set's size.
      it('takes and gives back a node set of 64, and of the most one transaction holds, in one transaction each', async () => {
        for (const size of [24, MAX_NODE_SET, MAX_SET_CHANGE]) {
          const members = Array.from({ length: size }, (_, i) => nodeId(`${'r'.repeat(120)}-${size}`, i));
          const sent: string[] = [];
          const reserved = await watching(engine.client, sent, () =>
            store.capacity.reserve(set, members, MAX_SET_CHANGE, 'o1'),
          );
          expect(reserved).toEqual({ kind: 'reserved' });
          expect(sent).toEqual(['TransactWriteItemsCommand']);
          expect(await store.capacity.used(set)).toBe(size);
          sent.length = 0;
          await watching(engine.client, sent, () => store.capacity.unreserve(set, members, 'o1'));
          expect(sent).toEqual(['TransactWriteItemsCommand']);
          expect(await store.capacity.used(set)).toBe(0);
          expect(await store.capacity.members(set)).toEqual(new Set());
        }
        const tooMany = Array.from({ length: MAX_SET_CHANGE + 1 }, (_, i) => `m${i}`);
        await expect(store.capacity.reserve(set, tooMany, 1_000, 'o1')).rejects.toThrow(/at most 99/);
      });
    });
  };
}

/** Runs `work` with the name of each command the client sends meanwhile pushed to `sent`. */
async function watching<T>(client: DynamoDBClient, sent: string[], work: () => Promise<T>): Promise<T> {
  const name = `watching-${Math.random()}`;
  client.middlewareStack.add(
    (next, context) => async (args) => {
      sent.push(context.commandName ?? '');
      return next(args);
    },
    { step: 'initialize', name },
  );
  try {
    return await work();
  } finally {
    client.middlewareStack.remove(name);
  }
}

function request(id: string): RequestRecord {
  return {
    id,
    labels: ['small'],
    requestor: 'test',
    bodyHash: `hash-${id}`,
    state: 'requested',
    createdAt: 1_000,
    updatedAt: 1_000,
    version: 0,
    nodes: [],
  };
}

type NodeEntry = RequestRecord['nodes'][number];

function node(requestId: string, index: number, state: NodeEntry['state']): NodeEntry {
  return { id: `${requestId}/${index}`, label: 'small', state, backingNodeId: 'b1', slot: index };
}

function placed(id: string, states: NodeEntry['state'][]): RequestRecord {
  return {
    ...request(id),
    labels: states.map(() => 'small'),
    state: states.every((s) => s === 'ready') ? 'fulfilled' : 'pending',
    nodes: states.map((s, i) => node(id, i, s)),
  };
}

function backing(id: string, o: Partial<BackingRecord> = {}): BackingRecord {
  return {
    id,
    poolKey: 'meta/main',
    label: 'small',
    backingPoolKey: 'ec2/main',
    backingLabel: 'large',
    state: 'ready',
    slots: 2,
    used: 0,
    slotMap: {},
    claims: {},
    ends: {},
    version: 0,
    attempt: 1,
    launchedAt: 1_000,
    lastUsedAt: 1_000,
    ...o,
  };
}

const fakeRegion = { region: 'eu-west-1', credentials: MOTO_CREDENTIALS };

describe(
  'DynamoStore conformance on dynalite',
  conformance(async () => {
    const dynalite = await startDynalite();
    return {
      returnsItemOnConditionFailure: false,
      // dynalite has no transactions: the embedded pool's client runs them (localTransactions.ts).
      // And DynamoDB's limits, as on every local engine (dynamoLimits.ts).
      client: localDynamoClient({ ...fakeRegion, endpoint: dynalite.endpoint }, dynalite.endpoint).client,
      stop: () => dynalite.close(),
    };
  }),
);

describeWithMoto(
  'DynamoStore conformance on moto',
  conformance(async () => {
    const moto = await startMoto();
    return {
      returnsItemOnConditionFailure: true,
      client: guardDynamoLimits(new DynamoDBClient({ ...fakeRegion, endpoint: moto.endpoint })),
      stop: () => moto.stop(),
    };
  }),
);

// AWS's own engine: its transactions, cancellation reasons and limits are DynamoDB's (no guard needed).
describeWithDynamoDbLocal(
  'DynamoStore conformance on DynamoDB Local',
  conformance(async () => {
    const local = await startDynamoDbLocal();
    return { returnsItemOnConditionFailure: true, client: local.client, stop: () => local.stop() };
  }),
);
