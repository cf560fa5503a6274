import {
  type AttributeValue,
  ConditionalCheckFailedException,
  type DynamoDBClient,
} from '@aws-sdk/client-dynamodb';
import {
  DeleteCommand,
  DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  UpdateCommand,
  type UpdateCommandOutput,
} from '@aws-sdk/lib-dynamodb';
import { unmarshall } from '@aws-sdk/util-dynamodb';
import { type Clock, systemClock } from '../core/clock.ts';
import { ConflictError, ItemTooLargeError, LostWriteError, StoreRefusedError } from '../core/errors.ts';
import type { DurationEstimate } from '../core/estimates.ts';
import type { ArrivalModel, ReadyHold } from '../core/forecast.ts';
import type { LabelBackoff } from '../core/minReady.ts';
import type {
  BackingExpectation,
  BackingPhase,
  MinReadyState,
  Page,
  PageCursor,
  PoolStore,
  ReaperCursor,
  Reservation,
  SlotClaim,
} from '../core/poolStore.ts';
import type { ServiceOrder } from '../core/priority.ts';
import { BackingRecord, type Claim, RequestRecord } from '../core/records.ts';
import { RECORD_RETENTION_SECONDS } from '../core/timing.ts';
import type { RegisteredQueue, WaitingQueue } from '../core/waitingQueue.ts';
import { CapacitySets } from './capacitySets.ts';
import { IndexQueries } from './indexQueries.ts';
import { LabelItems } from './labelItems.ts';
import { backingItem, expiresAtOf, keys, requestEnded, requestItem, resourceItem } from './table.ts';
import { WaitingQueues } from './waitingQueues.ts';
import {
  backingExpected,
  claimSlotUpdate,
  conditions,
  dropLeaseUpdate,
  expiresAtUpdate,
  lapseLeaseUpdate,
  pointsTo,
  releaseNodeUpdate,
  renewLeaseUpdate,
  takeSpareUpdate,
} from './writes.ts';

/**
 * The DynamoDB adapter. Every write that could race is conditional, built from the named fragments
 * below; a failed condition becomes a ConflictError (or a domain answer), anything else is re-thrown.
 * No transactions anywhere: each write touches one item.
 */
/**
 * DynamoDB's answer to a request it will never accept as sent (dynalite answers alike): a number out of
 * its range ("Number underflow"), an item over 400 KB, an empty key... Not a throttle, not a conflict.
 * One ValidationException is an answer rather than a refusal: an update of a path inside a map the item
 * does not have yet, which the capacity sets expect and handle (they create the map and send it again).
 */
function isRefusal(err: unknown): err is Error {
  return err instanceof Error && err.name === 'ValidationException' && !/document path/i.test(err.message);
}

/** The ValidationException of a put or update whose item would exceed 400 KB. */
function isItemTooLarge(err: Error): boolean {
  return /item size.*exceeded/i.test(err.message);
}

export interface DynamoStoreOptions {
  /** `record-retention`, seconds (default RECORD_RETENTION_SECONDS.default). */
  readonly recordRetention?: number;
}

export class DynamoStore implements PoolStore {
  private readonly doc: DynamoDBDocumentClient;
  /** The capacity sets behind the places in max-servers (also reachable for tests and the bench). */
  readonly capacity: CapacitySets;
  private readonly indexes: IndexQueries;
  private readonly queues: WaitingQueues;
  private readonly labels: LabelItems;

  /** Seconds an ended record stays before DynamoDB's TTL deletes it (`record-retention`, table.ts expiresAtOf). */
  private readonly retention: number;

  constructor(
    client: DynamoDBClient,
    readonly tableName: string,
    /** Stamps the capacity sets' operations: the clock of the contexts using this store. */
    clock: Clock = systemClock,
    options: DynamoStoreOptions = {},
  ) {
    this.retention = options.recordRetention ?? RECORD_RETENTION_SECONDS.default;
    this.doc = DynamoDBDocumentClient.from(client, { marshallOptions: { removeUndefinedValues: true } });
    // A write DynamoDB refuses as invalid (an item over its size limit, a number out of its range) fails
    // the same way every time: a permanent error, not a transient one retried until the message's
    // receives run out.
    this.doc.middlewareStack.add(
      (next) => async (args) => {
        try {
          return await next(args);
        } catch (err) {
          if (!isRefusal(err)) throw err;
          const message = `the table refused a write: ${err.message}`;
          throw isItemTooLarge(err)
            ? new ItemTooLargeError(message, { cause: err })
            : new StoreRefusedError(message, { cause: err });
        }
      },
      // The document client shares the client's stack: a second store on one client replaces it.
      { step: 'initialize', name: 'metastaticStoreRefused', override: true },
    );
    this.capacity = new CapacitySets(this.doc, tableName, () => clock.now());
    this.indexes = new IndexQueries(this.doc, tableName);
    this.queues = new WaitingQueues(this.doc, tableName, () => clock.now());
    this.labels = new LabelItems(this.doc, tableName);
  }

  // ---- requests -------------------------------------------------------------------------------

  /** Records a new request; returns the existing one instead when the id is taken. */
  async createRequest(r: RequestRecord): Promise<RequestRecord | undefined> {
    await this.queues.announce(r); // a waiting request's queue is in the registry before the request
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: requestItem(r, this.retention),
          ConditionExpression: conditions.itemDoesNotExist,
        }),
      );
      return undefined;
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      const existing = await this.getRequest(r.id);
      if (!existing) throw new ConflictError(`request ${r.id} exists but could not be read`, { cause: err });
      return existing;
    }
  }

  async getRequest(id: string): Promise<RequestRecord | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.request(id), ConsistentRead: true }),
    );
    return out.Item ? RequestRecord.parse(out.Item) : undefined;
  }

  /** Replaces a request if its stored version is still `expectedVersion`. */
  async putRequest(next: RequestRecord, expectedVersion: number): Promise<void> {
    await this.queues.announce(next);
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: requestItem(next, this.retention),
          ConditionExpression: conditions.versionUnchanged,
          ExpressionAttributeNames: { '#version': 'version' },
          ExpressionAttributeValues: { ':expectedVersion': expectedVersion },
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) {
        throw new LostWriteError(`request ${next.id} changed since version ${expectedVersion}`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /**
   * Marks one node of a request released in a single conditional update: the node must still be
   * pending or ready, in a placed request. Returns the updated request, or undefined when the
   * condition failed (unknown, not placed yet, already released or failed: the caller reads and decides).
   */
  async takeSpareNode(
    requestId: string,
    poolKey: string,
    takenBy: { readonly node: string; readonly by: string; readonly at: number },
  ): Promise<RequestRecord | undefined> {
    try {
      const out = await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.request(requestId),
          ...takeSpareUpdate(poolKey, takenBy),
          ReturnValues: 'ALL_NEW',
        }),
      );
      return RequestRecord.parse(out.Attributes);
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return undefined;
      throw err;
    }
  }

  async releaseNodeEntry(
    requestId: string,
    index: number,
    now: number,
    force = false,
    reason?: string,
  ): Promise<RequestRecord | undefined> {
    const expiresAt = expiresAtOf(now, this.retention);
    const release = async (alone: boolean): Promise<UpdateCommandOutput | undefined> => {
      try {
        return await this.doc.send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: keys.request(requestId),
            ...releaseNodeUpdate(index, now, force, reason, alone ? expiresAt : undefined),
            ReturnValues: 'ALL_NEW',
            ...(alone ? { ReturnValuesOnConditionCheckFailure: 'ALL_OLD' as const } : {}),
          }),
        );
      } catch (err) {
        if (!(err instanceof ConditionalCheckFailedException)) throw err;
        // Refused as the only node of its request: it has others (release it as one of them), or the
        // release's own condition failed (the caller reads and decides).
        if (!alone) return undefined;
        const old = (err as { Item?: Record<string, AttributeValue> }).Item;
        const nodes = old ? unmarshall(old).nodes : (await this.getRequest(requestId))?.nodes;
        return Array.isArray(nodes) && nodes.length > 1 ? release(false) : undefined;
      }
    };
    // Most requests have one node, which is node 0: its release ends the request, and the same update
    // gives it its purge time (conditioned on the one node), with no extra write.
    const out = await release(index === 0);
    if (!out) return undefined;
    const released = RequestRecord.parse(out.Attributes);
    // The last live node of several: the request has ended, and gets its purge time now. The release
    // cannot set it itself (it does not know the other nodes); every other write of a request is a
    // whole-item put that computes it (requestItem). Nodes never come back from released or failed, so
    // this cannot race with the request coming back to life.
    if (requestEnded(released) && released.nodes.length > 1) {
      await this.doc
        .send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: keys.request(requestId),
            ...expiresAtUpdate(expiresAt),
          }),
        )
        .catch((err: unknown) => {
          if (!(err instanceof ConditionalCheckFailedException)) throw err; // deleted meanwhile
        });
    }
    return released;
  }

  // ---- backing nodes --------------------------------------------------------------------------

  async getBacking(id: string): Promise<BackingRecord | undefined> {
    const item = await this.getBackingItem(id);
    return item ? BackingRecord.parse(item) : undefined;
  }

  private async getBackingItem(id: string): Promise<Record<string, unknown> | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.backing(id), ConsistentRead: true }),
    );
    return out.Item;
  }

  /** Writes a new backing record (the intent, before the launch); returns the existing one if the id is taken. */
  async createBacking(b: BackingRecord): Promise<BackingRecord | undefined> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: backingItem(b, this.retention),
          ConditionExpression: conditions.itemDoesNotExist,
        }),
      );
      return undefined;
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      const existing = await this.getBacking(b.id);
      if (!existing)
        throw new ConflictError(`backing node ${b.id} exists but could not be read`, { cause: err });
      return existing;
    }
  }

  /**
   * Replaces a backing record if it is unchanged since it was read (same version) and, optionally,
   * still in one of the expected states with the expected number of used slots.
   */
  async putBacking(next: BackingRecord, expect: BackingExpectation): Promise<void> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: backingItem(next, this.retention),
          ...backingExpected(expect),
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) {
        throw new LostWriteError(`backing node ${next.id} changed since version ${expect.version}`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /**
   * Claims one slot of a backing node in a single conditional UpdateItem. The condition is on the slot
   * (free), the state (as read), room (used < slots), no drain and no max-age, not on the item's
   * version: claims of different slots on one backing node never conflict with each other. The version
   * is still bumped, so every whole-item writer (retire, fail, release) sees the claim. The claim that
   * takes the last free slot (by what was read) also takes the item out of the free index, conditioned
   * on `used` being what was read. Returns the record after the claim; on a failed condition, the item
   * as it is now (ReturnValuesOnConditionCheckFailure, no extra read) to choose again from.
   */
  async claimSlot(
    read: BackingRecord,
    slot: number,
    nodeId: string,
    claim: Claim,
    end?: number,
  ): Promise<SlotClaim> {
    try {
      const out = await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.backing(read.id),
          ...claimSlotUpdate(read, slot, nodeId, claim, end),
          ReturnValues: 'ALL_NEW',
          ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
        }),
      );
      const record = BackingRecord.parse(out.Attributes);
      // Concurrent claims filled it, none of them by what it read: take it out of the free index.
      if (record.used >= record.slots && out.Attributes?.fpk !== undefined)
        await this.leaveFreeIndex(read.id);
      return { claimed: true, record };
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      // DynamoDB returns the item with the failure; an engine that does not (dynalite) costs a read.
      const returned = (err as { Item?: Record<string, AttributeValue> }).Item;
      const item = returned ? unmarshall(returned) : await this.getBackingItem(read.id);
      if (!item) return { claimed: false };
      const current = BackingRecord.parse(item);
      if (current.used >= current.slots && item.fpk !== undefined) await this.leaveFreeIndex(read.id);
      return { claimed: false, current };
    }
  }

  /** Takes a full backing node out of the free index (repairs what concurrent claims left behind). */
  private async leaveFreeIndex(id: string): Promise<void> {
    await this.doc
      .send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.backing(id),
          UpdateExpression: 'REMOVE fpk, fsk',
          ConditionExpression: '#used >= slots',
          ExpressionAttributeNames: { '#used': 'used' },
        }),
      )
      .catch((err: unknown) => {
        if (!(err instanceof ConditionalCheckFailedException)) throw err; // freed meanwhile: it stays
      });
  }

  findCandidates(
    poolKey: string,
    label: string,
    limit: number,
    cursor?: PageCursor,
  ): Promise<Page<BackingRecord>> {
    return this.indexes.findCandidates(poolKey, label, limit, cursor);
  }

  backingInPhase(phase: BackingPhase, before?: string): Promise<BackingRecord[]> {
    return this.indexes.backingInPhase(phase, before);
  }

  waitingQueues(options?: { readonly reuse?: boolean }): Promise<RegisteredQueue[]> {
    return this.queues.list(options);
  }

  async firstWaiting(
    queue: WaitingQueue,
    before?: ServiceOrder,
    options: { readonly reuse?: boolean } = {},
  ): Promise<RequestRecord | undefined> {
    const whole = before === undefined;
    if (options.reuse && whole && this.queues.seenEmpty(queue)) return undefined;
    const at = this.queues.clockNow();
    const first = await this.indexes.firstWaiting(queue, before);
    if (whole && !first) this.queues.noteEmpty(queue, at);
    return first;
  }

  waitingInQueue(queue: WaitingQueue, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.indexes.waitingInQueue(queue, cursor);
  }

  forgetQueue(queue: RegisteredQueue): Promise<boolean> {
    return this.queues.forget(queue);
  }

  legacyWaiting(cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.indexes.legacyWaiting(cursor);
  }

  requeueWaiting(r: RequestRecord): Promise<boolean> {
    return this.queues.requeue(r);
  }

  pendingRequests(placedBefore: number, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.indexes.pendingRequests(placedBefore, cursor);
  }

  // ---- client leases ----------------------------------------------------------------------------

  renewLease(
    requestId: string,
    readExpiry: number,
    seconds: number,
    expiresAt: number,
    now: number,
  ): Promise<boolean> {
    return this.updateRequestIf(requestId, renewLeaseUpdate(requestId, readExpiry, seconds, expiresAt, now));
  }

  lapseLease(requestId: string, readExpiry: number, now: number): Promise<boolean> {
    return this.updateRequestIf(requestId, lapseLeaseUpdate(readExpiry, now));
  }

  dropLease(requestId: string, readExpiry: number): Promise<boolean> {
    return this.updateRequestIf(requestId, dropLeaseUpdate(requestId, readExpiry));
  }

  leasesBefore(before: number, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.indexes.leasesBefore(before, cursor);
  }

  /** One conditional UpdateItem of a request; false when its condition failed (a domain answer). */
  private async updateRequestIf(
    requestId: string,
    expression: Omit<ConstructorParameters<typeof UpdateCommand>[0], 'TableName' | 'Key'>,
  ): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({ TableName: this.tableName, Key: keys.request(requestId), ...expression }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }

  // ---- resource pointers ------------------------------------------------------------------------

  /**
   * Records which backing node a provider resource belongs to (written before the resource id is recorded
   * on the backing node, so every recorded id has its pointer). Idempotent for the same backing node; a
   * resource id another backing node claims is a ConflictError.
   */
  async pointToBacking(resourceId: string, backingNodeId: string, recordedAt: number): Promise<void> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: resourceItem(resourceId, backingNodeId, recordedAt),
          ConditionExpression: pointsTo,
          ExpressionAttributeValues: { ':backingNodeId': backingNodeId },
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) {
        throw new ConflictError(`resource ${resourceId} is already recorded by another backing node`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /** The backing node that records a provider resource, or undefined when none does (one GetItem). */
  async backingIdOfResource(resourceId: string): Promise<string | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.resource(resourceId), ConsistentRead: true }),
    );
    const id = out.Item?.backingNodeId;
    return typeof id === 'string' ? id : undefined;
  }

  /** Removes a resource's pointer while it still names this backing node (idempotent). */
  async forgetResource(resourceId: string, backingNodeId: string): Promise<void> {
    try {
      await this.doc.send(
        new DeleteCommand({
          TableName: this.tableName,
          Key: keys.resource(resourceId),
          ConditionExpression: pointsTo,
          ExpressionAttributeValues: { ':backingNodeId': backingNodeId },
        }),
      );
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err; // another's: left alone
    }
  }

  // ---- places in max-servers (capacity sets, capacitySets.ts) ---------------------------------------

  reserveNodePlaces(
    poolKey: string,
    nodeIds: readonly string[],
    max: number,
    owner: string,
    options: { readonly overlap?: boolean } = {},
  ): Promise<Reservation> {
    return this.capacity.reserve(keys.poolNodes(poolKey), nodeIds, max, owner, false, options);
  }

  takeOverNodePlace(poolKey: string, nodeId: string, from: string, to: string): Promise<boolean> {
    return this.capacity.takeOverReservation(keys.poolNodes(poolKey), nodeId, from, to);
  }

  freeNodePlaces(poolKey: string, nodeIds: readonly string[], owner?: string): Promise<void> {
    return this.capacity.unreserve(keys.poolNodes(poolKey), nodeIds, owner);
  }

  nodePlaces(poolKey: string): Promise<Map<string, string>> {
    return this.capacity.reservations(keys.poolNodes(poolKey));
  }

  recoverNodePlaces(poolKey: string, before: number): Promise<number> {
    return this.capacity.recover(keys.poolNodes(poolKey), before);
  }

  reserveBackingPlace(
    backingPoolKey: string,
    backingId: string,
    max: number,
    owner: string,
  ): Promise<Reservation> {
    return this.capacity.reserve(keys.backingPool(backingPoolKey), [backingId], max, owner);
  }

  takeOverBackingPlace(
    backingPoolKey: string,
    backingId: string,
    from: string,
    to: string,
  ): Promise<boolean> {
    return this.capacity.takeOverReservation(keys.backingPool(backingPoolKey), backingId, from, to);
  }

  freeBackingPlace(backingPoolKey: string, backingId: string, owner?: string): Promise<void> {
    return this.capacity.unreserve(keys.backingPool(backingPoolKey), [backingId], owner);
  }

  backingPlaces(backingPoolKey: string): Promise<Map<string, string>> {
    return this.capacity.reservations(keys.backingPool(backingPoolKey));
  }

  recoverBackingPlaces(backingPoolKey: string, before: number): Promise<number> {
    return this.capacity.recover(keys.backingPool(backingPoolKey), before);
  }

  /**
   * Moves the capacity sets of these pools from the one-item form of earlier versions (a map of every
   * member) to places and counters; returns the members moved per set key. See CapacitySets.migrate.
   */
  async migrateCapacitySets(
    poolKeys: readonly string[],
    backingPoolKeys: readonly string[],
  ): Promise<Map<string, number>> {
    const moved = new Map<string, number>();
    for (const key of [...poolKeys.map(keys.poolNodes), ...backingPoolKeys.map(keys.backingPool)]) {
      const n = await this.capacity.migrate(key);
      if (n > 0) moved.set(key.pk, n);
    }
    return moved;
  }

  // ---- per-label items: learned durations, min-ready seats, forecasts (labelItems.ts) -------------

  getEstimate(label: string, requestor?: string): Promise<DurationEstimate | undefined> {
    return this.labels.getEstimate(label, requestor);
  }

  putEstimate(e: DurationEstimate): Promise<boolean> {
    return this.labels.putEstimate(e);
  }

  async seatGenerations(label: string): Promise<Map<number, number>> {
    return (await this.labels.minReadyState(label)).gens;
  }

  minReadyState(label: string): Promise<MinReadyState> {
    return this.labels.minReadyState(label);
  }

  putReadyHold(label: string, next: ReadyHold): Promise<boolean> {
    return this.labels.putReadyHold(label, next);
  }

  getForecast(label: string): Promise<ArrivalModel | undefined> {
    return this.labels.getForecast(label);
  }

  putForecast(model: ArrivalModel): Promise<boolean> {
    return this.labels.putForecast(model);
  }

  putLabelBackoff(label: string, next: LabelBackoff): Promise<boolean> {
    return this.labels.putLabelBackoff(label, next);
  }

  openSeat(label: string, seat: number): Promise<void> {
    return this.labels.openSeat(label, seat);
  }

  markSeatVacant(label: string, seat: number, gen: number): Promise<boolean> {
    return this.labels.markSeatVacant(label, seat, gen);
  }

  advanceSeat(label: string, seat: number, from: number): Promise<boolean> {
    return this.labels.advanceSeat(label, seat, from);
  }

  // ---- the reaper's rotation -------------------------------------------------------------------

  async reaperCursor(): Promise<ReaperCursor | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.reaperCursor, ConsistentRead: true }),
    );
    if (!out.Item) return undefined;
    const first = out.Item.first;
    return { version: Number(out.Item.version), ...(typeof first === 'string' ? { first } : {}) };
  }

  async putReaperCursor(first: string | undefined, readVersion: number | undefined): Promise<boolean> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: {
            ...keys.reaperCursor,
            type: 'reaper',
            ...(first === undefined ? {} : { first }),
            version: (readVersion ?? 0) + 1,
          },
          ...(readVersion === undefined
            ? { ConditionExpression: conditions.itemDoesNotExist }
            : {
                ConditionExpression: conditions.versionUnchanged,
                ExpressionAttributeNames: { '#version': 'version' },
                ExpressionAttributeValues: { ':expectedVersion': readVersion },
              }),
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }

  // ---- admin listings (a Scan: for operators only, never on a request path) ---------------------

  listRequests(): Promise<RequestRecord[]> {
    return this.indexes.listRequests();
  }

  listBacking(): Promise<BackingRecord[]> {
    return this.indexes.listBacking();
  }
}
