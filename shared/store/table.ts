import { createHash } from 'node:crypto';
import type { CreateTableCommandInput } from '@aws-sdk/client-dynamodb';
import { isLeaseLive } from '../core/leases.ts';
import { priorityOf, requestClass, type ServiceOrder } from '../core/priority.ts';
import type { BackingRecord, RequestRecord } from '../core/records.ts';
import { isLive } from '../core/request.ts';
import { RECORD_RETENTION_SECONDS } from '../core/timing.ts';
import { queueOf, type WaitingQueue } from '../core/waitingQueue.ts';

/**
 * The single-table design (documented in docs/table.md). Keys:
 *   pk                              sk        item
 *   REQUEST#<requestId>             REQUEST   a request and its nodes (node id = <requestId>/<index>)
 *   BACKING#<backingNodeId>         BACKING   a backing node and its slot map
 *   POOL#<provider/pool>            NODES     the counter of the pool's capacity set (max-servers): `used`,
 *                                             changed only in one transaction with its places (capacitySets.ts)
 *   POOL#<provider/pool>            PLACE#NODES#<nodeId>  a place in it: one live node's, with its owner
 *   BACKINGPOOL#<provider/pool>     BACKING   the counter of the backing pool's capacity set (its max-servers)
 *   BACKINGPOOL#<provider/pool>     PLACE#BACKING#<backingNodeId>  a place in it: one backing node's
 *   RESOURCE#<resourceId>           RESOURCE  which backing node records this provider resource (the fulfil
 *                                             function's look-up of an EC2 event's instance, before any EC2 call)
 *   SEATS#<label>                   SEAT#<n>  a min-ready seat: the generation of its spare (core/minReady.ts)
 *   SEATS#<label>                   BACKOFF   the label's min-ready launch backoff (core/minReady.ts)
 *   SEATS#<label>                   HOLD      min-ready auto: how many spares the reaper holds, and why (core/forecast.ts)
 *   FORECAST#<label>                MODEL     the label's arrival model (core/forecast.ts), for min-ready auto
 *   ESTIMATE#<label>                ALL       the label's learned duration estimate (core/estimates.ts)
 *   ESTIMATE#<label>                REQUESTOR#<requestor>  the same, for one requestor's nodes of the label
 *   QUEUES                          <queue id>  a waiting queue that may hold requests (core/waitingQueue.ts)
 *   REAPER                          CURSOR    the step the next reaper run starts with (usecases/reap/reap.ts)
 * Sparse indexes (attributes present only when the item belongs in them):
 *   free (fpk, fsk): backing nodes that can take a node, per pool and label, fullest then oldest first
 *                    and, in partitions LEASE#<shard>, every leased request that still holds something,
 *                    by when its lease lapses (a new index could not be added to an embedded table: dynalite's
 *                    UpdateTable creates none; and `free` never held request items)
 *   reap (rpk, rsk): IDLE (empty), LAUNCHING (by launch time), ACTIVE (ready, in use), RETIRING and
 *                    FAILED (to terminate): every backing node that is not stopped is in exactly one;
 *                    WAITING#<queue id>: every request still `requested`, one partition per node-set
 *                    shape, in service order (priority, then age); WAITING (no id): the same, written by
 *                    an earlier version, oldest first, until the reaper moves them to their queues;
 *                    PENDING: every request `pending`, by placement time (its deadline)
 */
export const FREE_INDEX = 'free';
export const REAP_INDEX = 'reap';

/**
 * The table's TTL attribute (lib/poolTable.ts enables TTL on it; a table has one): epoch seconds after
 * which DynamoDB may delete the item. Ended requests and stopped backing nodes carry it (`expiresAtOf`),
 * and so do requestor duration estimates (their lapse, core/estimates.ts). For requests and backing nodes
 * it is storage housekeeping, never read by the pool (time-based rules read the records' own timestamps).
 */
export const TTL_ATTRIBUTE = 'expiresAt';

/** When an item ended at `endedAt` (epoch ms) may be deleted: `retention` seconds later, epoch seconds. */
export function expiresAtOf(endedAt: number, retention: number): number {
  return Math.ceil(endedAt / 1000) + retention;
}

/**
 * Whether a request has ended for good: failed, or placed with every node released or failed (a node
 * never comes back from either). A `requested` one has not.
 */
export function requestEnded(r: RequestRecord): boolean {
  return r.state === 'failed' || (r.state !== 'requested' && !r.nodes.some(isLive));
}

export const keys = {
  request: (id: string) => ({ pk: `REQUEST#${id}`, sk: 'REQUEST' }),
  backing: (id: string) => ({ pk: `BACKING#${id}`, sk: 'BACKING' }),
  poolNodes: (poolKey: string) => ({ pk: `POOL#${poolKey}`, sk: 'NODES' }),
  backingPool: (poolKey: string) => ({ pk: `BACKINGPOOL#${poolKey}`, sk: 'BACKING' }),
  resource: (resourceId: string) => ({ pk: `RESOURCE#${resourceId}`, sk: 'RESOURCE' }),
  /** A label's min-ready seats, one item each (core/minReady.ts). */
  seats: (label: string) => `SEATS#${label}`,
  seat: (label: string, seat: number) => ({
    pk: `SEATS#${label}`,
    sk: `SEAT#${String(seat).padStart(5, '0')}`,
  }),
  /** A waiting queue in the registry of queues (core/waitingQueue.ts). */
  waitingQueue: (q: WaitingQueue) => ({ pk: QUEUES_PK, sk: queueId(q) }),
  /** A label's min-ready launch backoff, beside its seats (one Query reads both). */
  seatsBackoff: (label: string) => ({ pk: `SEATS#${label}`, sk: 'BACKOFF' }),
  /** min-ready auto: the spares held for a label, beside its seats (the same Query reads it). */
  seatsHold: (label: string) => ({ pk: `SEATS#${label}`, sk: 'HOLD' }),
  /** A label's arrival model (core/forecast.ts). */
  forecast: (label: string) => ({ pk: `FORECAST#${label}`, sk: 'MODEL' }),
  /** The step the next reaper run starts with (usecases/reap/reap.ts). */
  reaperCursor: { pk: 'REAPER', sk: 'CURSOR' },
  /** A learned duration estimate: the label's, or one requestor's for the label (core/estimates.ts). */
  estimate: (label: string, requestor?: string) => ({
    pk: `ESTIMATE#${label}`,
    sk: requestor === undefined ? 'ALL' : `REQUESTOR#${requestor}`,
  }),
} as const;

export const reapPartition = {
  idle: 'IDLE',
  launching: 'LAUNCHING',
  /** Ready and holding nodes: checked for vanished resources, unconfirmed claims and max-age. */
  active: 'ACTIVE',
  retiring: 'RETIRING',
  failed: 'FAILED',
  /**
   * Requests not placed yet (state `requested`) as an earlier version wrote them, by creation time; now
   * each waits in its queue's partition (`queuePartition`), and the reaper moves these there.
   */
  waiting: 'WAITING',
  /** Requests placed and not yet fulfilled (`pending`), by placement time: the reaper ends those past their deadline. */
  pending: 'PENDING',
} as const;

/** The registry of waiting queues: one item per queue, `sk` its id, in one item collection. */
export const QUEUES_PK = 'QUEUES';

/**
 * A queue's id: its node count and a hash of its labels (labels are up to 255 characters each and a set
 * may hold 64 of them, too long for a key). Two shapes meeting in one id would only share a partition.
 */
export function queueId(q: WaitingQueue): string {
  return `${q.count}#${createHash('sha256').update(q.labels.join('\n')).digest('hex').slice(0, 16)}`;
}

/** The reap index partition of a waiting queue. */
export function queuePartition(q: WaitingQueue): string {
  return `${reapPartition.waiting}#${queueId(q)}`;
}

/**
 * A waiting request's place in its queue, a sort key in service order (servedBefore in
 * core/priority.ts): class, priority, creation time, id. The priority is written as the 16 hex digits of
 * its IEEE 754 bits, sign bit flipped (every bit for a negative number), so that any number sorts as it
 * compares, not only the bounded integers a message may carry now. Request ids are ASCII, so their byte
 * order is the order servedBefore compares them in.
 */
export function serviceKey(r: ServiceOrder): string {
  return `${requestClass(r)}#${sortableNumber(priorityOf(r))}#${pad(r.createdAt, 15)}#${r.id}`;
}

function sortableNumber(x: number): string {
  const bytes = Buffer.alloc(8);
  bytes.writeDoubleBE(x === 0 ? 0 : x); // -0 as 0: they compare equal
  if ((bytes[0] ?? 0) & 0x80) for (let i = 0; i < 8; i++) bytes[i] = ~(bytes[i] ?? 0) & 0xff;
  else bytes[0] = (bytes[0] ?? 0) | 0x80;
  return bytes.toString('hex');
}

/**
 * The `free` index's partitions of leased requests (no backing node is ever in them: theirs start
 * `FREE#`): LEASE_SHARDS of them, a request's chosen by its id. Every renewal moves its request within its
 * partition (a delete and a put of the index entry, the whole item projected): in one partition, 10,000
 * leased nodes renewed every 20 s would write it at about 3,000 units a second, three times what DynamoDB
 * gives a partition (1,000), and an index throttled throttles the table's writes. Spread over 16, the
 * hottest takes about 1/16 (bench/leases.ts measures it). The reaper reads the lapsed leases of each.
 */
export const LEASE_SHARDS = 16;

/** The LEASE partition of a request (`LEASE#00` to `LEASE#15`). */
export function leasePartition(requestId: string): string {
  const shard = createHash('sha256').update(requestId).digest().readUInt32BE(0) % LEASE_SHARDS;
  return `LEASE#${String(shard).padStart(2, '0')}`;
}

/** Every LEASE partition, in order. */
export const leasePartitions: readonly string[] = Array.from(
  { length: LEASE_SHARDS },
  (_, i) => `LEASE#${String(i).padStart(2, '0')}`,
);

/** LEASE's sort key: the lease's expiry first, so "lapsed before T" is one key condition (`fsk < T`). */
export function leaseSortKey(expiresAt: number, id = ''): string {
  return `${pad(expiresAt, 15)}#${id}`;
}

/**
 * A request's `free` index attributes: in LEASE exactly while it is leased and holds something
 * (core/leases.ts isLeaseLive). Whole-item puts follow the record; the renewal's update moves `fsk`;
 * the release's node update can leave an ended request there, which the reaper drops (dropLease).
 */
export function leaseIndexAttributes(r: RequestRecord): { fpk?: string; fsk?: string } {
  if (!isLeaseLive(r) || r.leaseExpiresAt === undefined) return {};
  return { fpk: leasePartition(r.id), fsk: leaseSortKey(r.leaseExpiresAt, r.id) };
}

export function freePartition(poolKey: string, label: string): string {
  return `FREE#${poolKey}#${label}`;
}

const pad = (n: number, width: number) => String(Math.max(0, Math.floor(n))).padStart(width, '0');

/** The index attributes a backing record carries, derived from its state so they can never disagree. */
export function backingIndexAttributes(b: BackingRecord): Record<string, string | undefined> {
  const allocatable = (b.state === 'launching' || b.state === 'ready') && !b.drained && b.used < b.slots;
  // noNewNodesAfter (max-age) cannot drop an item from the index by itself; the claim re-checks it
  // and the reaper removes expired items (they stop being claimable).
  const free = allocatable
    ? {
        fpk: freePartition(b.poolKey, b.label),
        fsk: `${pad(b.slots - b.used, 5)}#${pad(b.launchedAt, 15)}#${b.id}`,
      }
    : { fpk: undefined, fsk: undefined };
  let reap: { rpk?: string; rsk?: string } = {};
  if ((b.state === 'launching' || b.state === 'ready') && b.used === 0) {
    reap = { rpk: reapPartition.idle, rsk: `${pad(b.lastUsedAt, 15)}#${b.id}` };
  } else if (b.state === 'launching') {
    reap = { rpk: reapPartition.launching, rsk: `${pad(b.launchedAt, 15)}#${b.id}` };
  } else if (b.state === 'ready') {
    reap = { rpk: reapPartition.active, rsk: `${pad(b.launchedAt, 15)}#${b.id}` };
  } else if (b.state === 'retiring') {
    reap = { rpk: reapPartition.retiring, rsk: `${pad(b.retiredAt ?? 0, 15)}#${b.id}` };
  } else if (b.state === 'failed') {
    reap = { rpk: reapPartition.failed, rsk: `${pad(b.retiredAt ?? 0, 15)}#${b.id}` };
  }
  return { ...free, ...reap };
}

export function backingItem(
  b: BackingRecord,
  retention: number = RECORD_RETENTION_SECONDS.default,
): Record<string, unknown> {
  // claims and ends are always maps (maybe empty): a slot claim sets one entry of each in place.
  return stripUndefined({
    ...keys.backing(b.id),
    type: 'backing',
    ...b,
    claims: b.claims ?? {},
    ends: b.ends ?? {},
    ...backingIndexAttributes(b),
    ...(b.state === 'stopped'
      ? { [TTL_ATTRIBUTE]: expiresAtOf(b.stoppedAt ?? b.lastUsedAt, retention) }
      : {}),
  });
}

/** A resource pointer: resource id -> the backing node that records it (no index attributes). */
export function resourceItem(resourceId: string, backingNodeId: string, recordedAt: number) {
  return { ...keys.resource(resourceId), type: 'resource', resourceId, backingNodeId, recordedAt };
}

/**
 * The reap index attributes of a request: in its waiting queue exactly while it is `requested`, in
 * PENDING exactly while it is `pending`. Every request write but the release's node update is a whole-item
 * put, so they follow its state; the release's update never meets a `requested` request and never changes
 * a request's state (a pending request it leaves all ready is settled by a put), and PENDING's sort key
 * does not change while a request is pending.
 */
export function requestIndexAttributes(r: RequestRecord): { rpk?: string; rsk?: string } {
  if (r.state === 'requested') return { rpk: queuePartition(queueOf(r)), rsk: serviceKey(r) };
  if (r.state === 'pending') {
    return { rpk: reapPartition.pending, rsk: waitingSortKey(r.placedAt ?? r.updatedAt, r.id) };
  }
  return {};
}

/**
 * PENDING's sort key (and the earlier WAITING's): the time first, so "before T" is one key condition
 * (`rsk < T`).
 */
export function waitingSortKey(createdAt: number, id = ''): string {
  return `${pad(createdAt, 15)}#${id}`;
}

export function requestItem(
  r: RequestRecord,
  retention: number = RECORD_RETENTION_SECONDS.default,
): Record<string, unknown> {
  return stripUndefined({
    ...keys.request(r.id),
    type: 'request',
    ...r,
    ...requestIndexAttributes(r),
    ...leaseIndexAttributes(r),
    ...(requestEnded(r) ? { [TTL_ATTRIBUTE]: expiresAtOf(r.updatedAt, retention) } : {}),
  });
}

function stripUndefined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}

/** Table definition shared by the embedded pool (CreateTable) and the CDK construct (lib/poolTable.ts). */
export const tableDefinition: Omit<CreateTableCommandInput, 'TableName'> = {
  AttributeDefinitions: [
    { AttributeName: 'pk', AttributeType: 'S' },
    { AttributeName: 'sk', AttributeType: 'S' },
    { AttributeName: 'fpk', AttributeType: 'S' },
    { AttributeName: 'fsk', AttributeType: 'S' },
    { AttributeName: 'rpk', AttributeType: 'S' },
    { AttributeName: 'rsk', AttributeType: 'S' },
  ],
  KeySchema: [
    { AttributeName: 'pk', KeyType: 'HASH' },
    { AttributeName: 'sk', KeyType: 'RANGE' },
  ],
  GlobalSecondaryIndexes: [
    {
      IndexName: FREE_INDEX,
      KeySchema: [
        { AttributeName: 'fpk', KeyType: 'HASH' },
        { AttributeName: 'fsk', KeyType: 'RANGE' },
      ],
      Projection: { ProjectionType: 'ALL' },
    },
    {
      IndexName: REAP_INDEX,
      KeySchema: [
        { AttributeName: 'rpk', KeyType: 'HASH' },
        { AttributeName: 'rsk', KeyType: 'RANGE' },
      ],
      Projection: { ProjectionType: 'ALL' },
    },
  ],
  BillingMode: 'PAY_PER_REQUEST',
};
