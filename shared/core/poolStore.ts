import type { DurationEstimate } from './estimates.ts';
import type { ArrivalModel } from './forecast.ts';
import type { LabelBackoff } from './minReady.ts';
import type { ServiceOrder } from './priority.ts';
import type { ReadyHold } from './readyRoom.ts';
import type { BackingRecord, Claim, RequestRecord } from './records.ts';
import type { BackingState } from './states.ts';
import type { RegisteredQueue, WaitingQueue } from './waitingQueue.ts';

/**
 * What the use cases need of the table, named for what they do with it (the port; DynamoStore in
 * shared/store is the adapter, docs/table.md the items and indexes behind each method). Every write
 * that could race is conditional: `put*` and `claimSlot` require the version that was read and throw
 * ConflictError when another writer changed the item since; `create*` write only a new item and return
 * the existing one instead. Capacity (max-servers) is held per member by an owner token, so a delivery
 * gives back only what it took itself.
 */
export interface PoolStore extends RequestPort, BackingPort, CapacityPort, ReadinessPort, ReaperPort {}

/** Requests and their nodes, the waiting queues they wait in, and their clients' leases. */
export interface RequestPort {
  /** Records a new request; returns the existing one instead when the id is taken. */
  createRequest(r: RequestRecord): Promise<RequestRecord | undefined>;
  getRequest(id: string): Promise<RequestRecord | undefined>;
  /**
   * Several requests in one read (strongly consistent, as `getRequest` of each at that moment), by id;
   * an id with no request is absent from the map.
   */
  getRequests(ids: readonly string[]): Promise<Map<string, RequestRecord>>;
  /** Replaces a request whose stored version is still `expectedVersion` (ConflictError otherwise). */
  putRequest(next: RequestRecord, expectedVersion: number): Promise<void>;
  /**
   * Takes a free spare (the one node of spare request `requestId`, placed in `poolKey`) for a
   * taker in one conditional update: sets its `takenBy` if it is ready, untaken and not held; returns
   * the request as written, or undefined when it is not free (or not there).
   */
  takeSpareNode(
    requestId: string,
    poolKey: string,
    takenBy: { readonly node: string; readonly by: string; readonly at: number },
  ): Promise<RequestRecord | undefined>;
  /**
   * Marks one node of a placed request released in one conditional update (it must be pending or
   * ready, and not held unless `force`); undefined when the condition failed (the caller reads and decides).
   */
  releaseNodeEntry(
    requestId: string,
    index: number,
    now: number,
    force?: boolean,
    /** Recorded as the node's reason (a lease that lapsed). */
    reason?: string,
  ): Promise<RequestRecord | undefined>;
  // waiting requests, in one queue per node-set shape (core/waitingQueue.ts)
  /**
   * The queues that may hold waiting requests (a queue is registered before any request is written to it).
   * `reuse`: the store's last read may answer when younger than REGISTRY_REUSE_MS and nothing was
   * announced or forgotten through this store since (a delivery's checks; the reaper reads afresh).
   */
  waitingQueues(options?: { readonly reuse?: boolean }): Promise<RegisteredQueue[]>;
  /**
   * The first request of a queue in service order, or the first served before `before`; one item read.
   * `reuse` (without `before`): a queue this store read empty less than REGISTRY_REUSE_MS ago, and wrote
   * no waiting request into since, is answered empty without a read.
   */
  firstWaiting(
    queue: WaitingQueue,
    before?: ServiceOrder,
    options?: { readonly reuse?: boolean },
  ): Promise<RequestRecord | undefined>;
  /** One page of a queue's requests, in service order. */
  waitingInQueue(queue: WaitingQueue, cursor?: PageCursor): Promise<Page<RequestRecord>>;
  /** Removes a queue from the registry if nobody announced it since it was read; false otherwise. */
  forgetQueue(queue: RegisteredQueue): Promise<boolean>;
  /** One page of the requests an earlier version recorded in the single WAITING partition, oldest first. */
  legacyWaiting(cursor?: PageCursor): Promise<Page<RequestRecord>>;
  /** Moves such a request to its queue while it still waits; false when it does not any more. */
  requeueWaiting(r: RequestRecord): Promise<boolean>;
  /** One page of the requests placed and not yet fulfilled, placed before `placedBefore`, oldest first. */
  pendingRequests(placedBefore: number, cursor?: PageCursor): Promise<Page<RequestRecord>>;

  // client leases (core/leases.ts)
  /**
   * Renews a request's lease to `seconds` from now (`expiresAt`) if its expiry is still `readExpiry`, it
   * was not found lapsed and it is still in the lease partition; false otherwise (the caller reads again).
   */
  renewLease(
    requestId: string,
    readExpiry: number,
    seconds: number,
    expiresAt: number,
    now: number,
  ): Promise<boolean>;
  /** Marks a lease lapsed if its expiry is still `readExpiry` (no renewal won) and not marked yet. */
  lapseLease(requestId: string, readExpiry: number, now: number): Promise<boolean>;
  /** Takes a request out of the lease partition if its expiry is still `readExpiry`; false otherwise. */
  dropLease(requestId: string, readExpiry: number): Promise<boolean>;
  /**
   * One page of the leased requests whose lease lapses before `before` (epoch ms): the lease partitions
   * one after another, soonest first in each.
   */
  leasesBefore(before: number, cursor?: PageCursor): Promise<Page<RequestRecord>>;
}

/** Backing nodes and their slots, and the pointers from a provider's resource to its backing node. */
export interface BackingPort {
  getBacking(id: string): Promise<BackingRecord | undefined>;
  /** Records a new backing node (the intent, before its launch); returns the existing one instead. */
  createBacking(b: BackingRecord): Promise<BackingRecord | undefined>;
  /** Replaces a backing node as expected (version, and optionally state and slots used). */
  putBacking(next: BackingRecord, expect: BackingExpectation): Promise<void>;
  /**
   * Claims one free slot of the backing node as read, in one conditional write; `end`: when the node is
   * expected to be released (recorded for duration-aware placement).
   */
  claimSlot(
    read: BackingRecord,
    slot: number,
    nodeId: string,
    claim: Claim,
    end?: number,
  ): Promise<SlotClaim>;
  /** Backing nodes of a pool's label with a free slot, fullest first then oldest, a page at a time. */
  findCandidates(
    poolKey: string,
    label: string,
    limit: number,
    cursor?: PageCursor,
  ): Promise<Page<BackingRecord>>;
  /** Every backing node in one phase of its life (the reaper's view), optionally sorted before `before`. */
  backingInPhase(phase: BackingPhase, before?: string): Promise<BackingRecord[]>;

  // resource pointers (provider resource -> backing node)
  /** Records which backing node a resource belongs to; ConflictError when another one records it. */
  pointToBacking(resourceId: string, backingNodeId: string, recordedAt: number): Promise<void>;
  backingIdOfResource(resourceId: string): Promise<string | undefined>;
  /** Removes a resource's pointer while it still names this backing node (idempotent). */
  forgetResource(resourceId: string, backingNodeId: string): Promise<void>;
}

/** Places in a pool's max-servers: one per live node (a backing pool's: one per live backing node). */
export interface CapacityPort {
  /**
   * Takes places for `nodeIds`, held by `owner`, if the pool stays within `max`: all or none, in one
   * atomic write. Places `owner` holds already count as taken; another owner's are reported (`held`).
   */
  reserveNodePlaces(
    poolKey: string,
    nodeIds: readonly string[],
    max: number,
    owner: string,
  ): Promise<Reservation>;
  /** Hands a node's place over from `from` (known dead or superseded) to `to`; false when not theirs. */
  takeOverNodePlace(poolKey: string, nodeId: string, from: string, to: string): Promise<boolean>;
  /** Gives places back in one atomic write (idempotent); with `owner`, only those that owner still holds. */
  freeNodePlaces(poolKey: string, nodeIds: readonly string[], owner?: string): Promise<void>;
  /** Who holds each place of the pool (node id -> owner token). */
  nodePlaces(poolKey: string): Promise<Map<string, string>>;

  reserveBackingPlace(
    backingPoolKey: string,
    backingId: string,
    max: number,
    owner: string,
  ): Promise<Reservation>;
  takeOverBackingPlace(backingPoolKey: string, backingId: string, from: string, to: string): Promise<boolean>;
  freeBackingPlace(backingPoolKey: string, backingId: string, owner?: string): Promise<void>;
  backingPlaces(backingPoolKey: string): Promise<Map<string, string>>;
}

/**
 * What readiness learns and keeps per label: duration estimates (core/estimates.ts), arrival forecasts
 * and the ready room held (core/forecast.ts, core/readyRoom.ts), min-ready seats and backoff (core/minReady.ts).
 */
export interface ReadinessPort {
  /** The label's estimate, or one requestor's for the label; undefined when none is learned yet. */
  getEstimate(label: string, requestor?: string): Promise<DurationEstimate | undefined>;
  /**
   * Writes an estimate if the stored one is still the one it was made from (version - 1; none for
   * version 1); false when another writer got there first.
   */
  putEstimate(estimate: DurationEstimate): Promise<boolean>;

  // arrival forecasts (core/forecast.ts)
  /** A label's arrival model; undefined when none is recorded yet. */
  getForecast(label: string): Promise<ArrivalModel | undefined>;
  /**
   * Writes a label's arrival model if the stored one is still the one it was made from (version - 1; none
   * for version 1); false when another writer got there first.
   */
  putForecast(model: ArrivalModel): Promise<boolean>;
  /** Writes a label's ready hold (min-ready auto) under the same rule; false when another wrote first. */
  putReadyHold(label: string, next: ReadyHold): Promise<boolean>;

  // min-ready seats (core/minReady.ts)
  /** The generation of each seat of a label's min-ready that has moved on (seat -> generation; absent = 0). */
  seatGenerations(label: string): Promise<Map<number, number>>;
  /** Records a seat (generation 0) if it has no item yet, so a lowered min-ready still finds it. */
  openSeat(label: string, seat: number): Promise<void>;
  /**
   * Marks a seat vacant at generation `gen` (its node there has ended: released or failed, both final),
   * if the seat is still at `gen`; false when it is not (an advance, which clears the mark, came first).
   * An upkeep skips a vacant seat above the seats it fills without reading its node.
   */
  markSeatVacant(label: string, seat: number, gen: number): Promise<boolean>;
  /** Moves a seat from generation `from` to `from + 1` (no longer vacant); false when it is not at `from` any more. */
  advanceSeat(label: string, seat: number, from: number): Promise<boolean>;
  /** A label's seats (as seatGenerations), its launch backoff and its ready hold, in one read. */
  minReadyState(label: string): Promise<MinReadyState>;
  /**
   * Writes a label's backoff if the stored one is still the one it was made from (version - 1; none for
   * version 1); false when another writer got there first.
   */
  putLabelBackoff(label: string, next: LabelBackoff): Promise<boolean>;
}

/** The reaper's own state (the rotation of its steps, usecases/reap/reap.ts) and the operator's listings. */
export interface ReaperPort {
  /** Where the next reaper run starts its steps, with the item's version; undefined when never written. */
  reaperCursor(): Promise<ReaperCursor | undefined>;
  /**
   * Records where the next run starts (`first` undefined: the usual order), if the item is still at
   * `readVersion` (undefined: absent); false when another run wrote it first.
   */
  putReaperCursor(first: string | undefined, readVersion: number | undefined): Promise<boolean>;

  // operator listings (a Scan: never on a request path)
  listRequests(): Promise<RequestRecord[]>;
  listBacking(): Promise<BackingRecord[]>;
}

/**
 * The phases the reaper looks at, each a partition of the reap index: `idle` (empty, launching or
 * ready), `launching` (in use), `active` (ready, in use), `retiring`, `failed`. A stopped backing node
 * is in none.
 */
export type BackingPhase = 'idle' | 'launching' | 'active' | 'retiring' | 'failed';

export type PageCursor = Record<string, unknown>;

/** A label's min-ready seats (seat -> generation; absent = 0) and its launch backoff (core/minReady.ts). */
export interface MinReadyState {
  readonly gens: Map<number, number>;
  /**
   * Seats marked vacant at their generation (markSeatVacant): their node has ended, and no new one is
   * made until an advance. Absent: none known.
   */
  readonly vacant?: ReadonlySet<number>;
  readonly backoff?: LabelBackoff;
  /** min-ready auto: the spares the reaper decided to hold (absent: never decided). */
  readonly hold?: ReadyHold;
}

/** The step the next reaper run starts with (absent: the usual order), and the item's version. */
export interface ReaperCursor {
  readonly first?: string;
  readonly version: number;
}

export interface Page<T> {
  readonly items: T[];
  readonly cursor?: PageCursor;
}

export interface BackingExpectation {
  readonly version: number;
  readonly states?: readonly BackingState[];
  readonly used?: number;
}

export type SlotClaim =
  | { readonly claimed: true; readonly record: BackingRecord }
  /** Lost: the item as it is now (when it still exists), to choose again from. */
  | { readonly claimed: false; readonly current?: BackingRecord };

export type Reservation =
  | { readonly kind: 'reserved' }
  | { readonly kind: 'full' }
  /** Some members are held by other owners: a concurrent (or dead) delivery of the same message. */
  | { readonly kind: 'held'; readonly holders: ReadonlyMap<string, string> };
