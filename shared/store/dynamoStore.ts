import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient } from '@aws-sdk/lib-dynamodb';
import { type Clock, systemClock } from '../core/clock.ts';
import type { DurationEstimate } from '../core/estimates.ts';
import type { ArrivalModel } from '../core/forecast.ts';
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
import type { ReadyHold } from '../core/readyRoom.ts';
import type { BackingRecord, Claim, RequestRecord } from '../core/records.ts';
import { RECORD_RETENTION_SECONDS } from '../core/timing.ts';
import type { RegisteredQueue, WaitingQueue } from '../core/waitingQueue.ts';
import { BackingItems } from './backingItems.ts';
import { CapacitySets } from './capacitySets.ts';
import { IndexQueries } from './indexQueries.ts';
import { LabelItems } from './labelItems.ts';
import { ReaperCursorItem } from './reaperCursor.ts';
import { makeRefusalsPermanent } from './refusals.ts';
import { RequestItems } from './requestItems.ts';
import { ResourcePointers } from './resourcePointers.ts';
import { keys } from './table.ts';
import { WaitingQueues } from './waitingQueues.ts';

export interface DynamoStoreOptions {
  /** `record-retention`, seconds (default RECORD_RETENTION_SECONDS.default). */
  readonly recordRetention?: number;
}

/**
 * The DynamoDB adapter. Every write that could race is conditional, built from the named fragments of
 * writes.ts; a failed condition becomes a ConflictError (or a domain answer), anything else is re-thrown.
 * Each write touches one item but the capacity sets' (capacitySets.ts), each one transaction. This class is the port's one face; each kind of
 * item has its own module, which it delegates to (requestItems.ts, backingItems.ts, resourcePointers.ts,
 * capacitySets.ts, labelItems.ts, waitingQueues.ts, reaperCursor.ts; the reads of many items in
 * indexQueries.ts), all sharing one document client.
 */
export class DynamoStore implements PoolStore {
  private readonly doc: DynamoDBDocumentClient;
  /** The capacity sets behind the places in max-servers (also reachable for tests and the bench). */
  readonly capacity: CapacitySets;
  private readonly requests: RequestItems;
  private readonly backing: BackingItems;
  private readonly resources: ResourcePointers;
  private readonly indexes: IndexQueries;
  private readonly queues: WaitingQueues;
  private readonly labels: LabelItems;
  private readonly cursor: ReaperCursorItem;

  constructor(
    client: DynamoDBClient,
    readonly tableName: string,
    /** Stamps the capacity sets' operations: the clock of the contexts using this store. */
    clock: Clock = systemClock,
    options: DynamoStoreOptions = {},
  ) {
    // Seconds an ended record stays before DynamoDB's TTL deletes it (`record-retention`, table.ts expiresAtOf).
    const retention = options.recordRetention ?? RECORD_RETENTION_SECONDS.default;
    this.doc = DynamoDBDocumentClient.from(client, { marshallOptions: { removeUndefinedValues: true } });
    makeRefusalsPermanent(this.doc);
    this.capacity = new CapacitySets(this.doc, tableName, () => clock.now());
    this.indexes = new IndexQueries(this.doc, tableName);
    this.queues = new WaitingQueues(this.doc, tableName, () => clock.now());
    this.labels = new LabelItems(this.doc, tableName);
    this.requests = new RequestItems(this.doc, tableName, this.queues, retention);
    this.backing = new BackingItems(this.doc, tableName, retention);
    this.resources = new ResourcePointers(this.doc, tableName);
    this.cursor = new ReaperCursorItem(this.doc, tableName);
  }

  // ---- requests (requestItems.ts) ---------------------------------------------------------------

  /** Records a new request; returns the existing one instead when the id is taken. */
  createRequest(r: RequestRecord): Promise<RequestRecord | undefined> {
    return this.requests.createRequest(r);
  }

  getRequest(id: string): Promise<RequestRecord | undefined> {
    return this.requests.getRequest(id);
  }

  getRequests(ids: readonly string[]): Promise<Map<string, RequestRecord>> {
    return this.requests.getRequests(ids);
  }

  /** Replaces a request if its stored version is still `expectedVersion`. */
  putRequest(next: RequestRecord, expectedVersion: number): Promise<void> {
    return this.requests.putRequest(next, expectedVersion);
  }

  takeSpareNode(
    requestId: string,
    poolKey: string,
    takenBy: { readonly node: string; readonly by: string; readonly at: number },
  ): Promise<RequestRecord | undefined> {
    return this.requests.takeSpareNode(requestId, poolKey, takenBy);
  }

  releaseNodeEntry(
    requestId: string,
    index: number,
    now: number,
    force = false,
    reason?: string,
  ): Promise<RequestRecord | undefined> {
    return this.requests.releaseNodeEntry(requestId, index, now, force, reason);
  }

  // ---- backing nodes (backingItems.ts) ----------------------------------------------------------

  getBacking(id: string): Promise<BackingRecord | undefined> {
    return this.backing.getBacking(id);
  }

  /** Writes a new backing record (the intent, before the launch); returns the existing one if the id is taken. */
  createBacking(b: BackingRecord): Promise<BackingRecord | undefined> {
    return this.backing.createBacking(b);
  }

  putBacking(next: BackingRecord, expect: BackingExpectation): Promise<void> {
    return this.backing.putBacking(next, expect);
  }

  /** Claims one slot of a backing node in a single conditional UpdateItem (BackingItems.claimSlot). */
  claimSlot(
    read: BackingRecord,
    slot: number,
    nodeId: string,
    claim: Claim,
    end?: number,
  ): Promise<SlotClaim> {
    return this.backing.claimSlot(read, slot, nodeId, claim, end);
  }

  // ---- reads of many items, the waiting queues (indexQueries.ts, waitingQueues.ts) ----------------

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

  // ---- client leases (requestItems.ts) ------------------------------------------------------------

  renewLease(
    requestId: string,
    readExpiry: number,
    seconds: number,
    expiresAt: number,
    now: number,
  ): Promise<boolean> {
    return this.requests.renewLease(requestId, readExpiry, seconds, expiresAt, now);
  }

  lapseLease(requestId: string, readExpiry: number, now: number): Promise<boolean> {
    return this.requests.lapseLease(requestId, readExpiry, now);
  }

  dropLease(requestId: string, readExpiry: number): Promise<boolean> {
    return this.requests.dropLease(requestId, readExpiry);
  }

  leasesBefore(before: number, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.indexes.leasesBefore(before, cursor);
  }

  // ---- resource pointers (resourcePointers.ts) --------------------------------------------------

  pointToBacking(resourceId: string, backingNodeId: string, recordedAt: number): Promise<void> {
    return this.resources.pointToBacking(resourceId, backingNodeId, recordedAt);
  }

  backingIdOfResource(resourceId: string): Promise<string | undefined> {
    return this.resources.backingIdOfResource(resourceId);
  }

  forgetResource(resourceId: string, backingNodeId: string): Promise<void> {
    return this.resources.forgetResource(resourceId, backingNodeId);
  }

  // ---- places in max-servers (capacity sets, capacitySets.ts) ----------------------------------------

  reserveNodePlaces(
    poolKey: string,
    nodeIds: readonly string[],
    max: number,
    owner: string,
  ): Promise<Reservation> {
    return this.capacity.reserve(keys.poolNodes(poolKey), nodeIds, max, owner);
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

  // ---- the reaper's rotation (reaperCursor.ts) ----------------------------------------------------

  reaperCursor(): Promise<ReaperCursor | undefined> {
    return this.cursor.read();
  }

  putReaperCursor(first: string | undefined, readVersion: number | undefined): Promise<boolean> {
    return this.cursor.put(first, readVersion);
  }

  // ---- admin listings (a Scan: for operators only, never on a request path) ---------------------

  listRequests(): Promise<RequestRecord[]> {
    return this.indexes.listRequests();
  }

  listBacking(): Promise<BackingRecord[]> {
    return this.indexes.listBacking();
  }
}
