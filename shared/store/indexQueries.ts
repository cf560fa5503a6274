import {
  type DynamoDBDocumentClient,
  QueryCommand,
  type QueryCommandInput,
  ScanCommand,
  type ScanCommandInput,
} from '@aws-sdk/lib-dynamodb';
import type { BackingPhase, Page, PageCursor } from '../core/poolStore.ts';
import type { ServiceOrder } from '../core/priority.ts';
import { BackingRecord, RequestRecord } from '../core/records.ts';
import type { WaitingQueue } from '../core/waitingQueue.ts';
import {
  FREE_INDEX,
  freePartition,
  leasePartitions,
  leaseSortKey,
  queuePartition,
  REAP_INDEX,
  reapPartition,
  serviceKey,
  waitingSortKey,
} from './table.ts';

/**
 * The store's reads of many items: Queries of the sparse indexes (free, reap; docs/table.md) for the
 * request path and the reaper, and the operator listings (a Scan, never on a request path).
 */
export class IndexQueries {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
  ) {}

  /**
   * Backing nodes of a pool's label that can take a node, fullest first then oldest: one Query of
   * `limit` items; pass the returned cursor to read the next page (rarely needed: the first claimable
   * candidate almost always wins).
   */
  async findCandidates(
    poolKey: string,
    label: string,
    limit: number,
    cursor?: PageCursor,
  ): Promise<Page<BackingRecord>> {
    const out = await this.doc.send(
      new QueryCommand({
        TableName: this.tableName,
        IndexName: FREE_INDEX,
        KeyConditionExpression: 'fpk = :p',
        ExpressionAttributeValues: { ':p': freePartition(poolKey, label) },
        Limit: limit,
        ExclusiveStartKey: cursor,
      }),
    );
    return { items: (out.Items ?? []).map((i) => BackingRecord.parse(i)), cursor: out.LastEvaluatedKey };
  }

  /** Every backing node in a phase (its partition of the reap index), optionally only those sorted before `before`. */
  async backingInPhase(phase: BackingPhase, before?: string): Promise<BackingRecord[]> {
    const partition = reapPartition[phase];
    const input: QueryCommandInput = {
      TableName: this.tableName,
      IndexName: REAP_INDEX,
      KeyConditionExpression: before === undefined ? 'rpk = :p' : 'rpk = :p AND rsk < :b',
      ExpressionAttributeValues:
        before === undefined ? { ':p': partition } : { ':p': partition, ':b': before },
    };
    const items: BackingRecord[] = [];
    do {
      const out = await this.doc.send(new QueryCommand(input));
      for (const i of out.Items ?? []) items.push(BackingRecord.parse(i));
      input.ExclusiveStartKey = out.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    return items;
  }

  /**
   * The first request of a waiting queue in service order, or the first served before `before`: one Query
   * of one item, however many wait.
   */
  async firstWaiting(queue: WaitingQueue, before?: ServiceOrder): Promise<RequestRecord | undefined> {
    const out = await this.doc.send(
      new QueryCommand({
        TableName: this.tableName,
        IndexName: REAP_INDEX,
        KeyConditionExpression: before === undefined ? 'rpk = :p' : 'rpk = :p AND rsk < :b',
        ExpressionAttributeValues: {
          ':p': queuePartition(queue),
          ...(before === undefined ? {} : { ':b': serviceKey(before) }),
        },
        Limit: 1,
      }),
    );
    const [first] = out.Items ?? [];
    return first ? RequestRecord.parse(first) : undefined;
  }

  /** One page of a waiting queue's requests, in service order; pass the returned cursor for the next page. */
  async waitingInQueue(queue: WaitingQueue, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    const out = await this.doc.send(
      new QueryCommand({
        TableName: this.tableName,
        IndexName: REAP_INDEX,
        KeyConditionExpression: 'rpk = :p',
        ExpressionAttributeValues: { ':p': queuePartition(queue) },
        ExclusiveStartKey: cursor,
      }),
    );
    return { items: (out.Items ?? []).map((i) => RequestRecord.parse(i)), cursor: out.LastEvaluatedKey };
  }

  /**
   * One page of the requests an earlier version recorded waiting (the single WAITING partition), oldest
   * first; pass the returned cursor for the next page.
   */
  async legacyWaiting(cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.requestsPage(
      REAP_INDEX,
      'r',
      reapPartition.waiting,
      waitingSortKey(Number.MAX_SAFE_INTEGER),
      cursor,
    );
  }

  /**
   * One page of the requests placed and not yet fulfilled (PENDING partition of the reap index) that were
   * placed before `placedBefore` (epoch ms), oldest first; pass the returned cursor for the next page.
   */
  async pendingRequests(placedBefore: number, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    return this.requestsPage(REAP_INDEX, 'r', reapPartition.pending, waitingSortKey(placedBefore), cursor);
  }

  /**
   * One page of the leased requests (the LEASE partitions of the free index) whose lease lapses before
   * `before` (epoch ms): partition by partition, soonest first in each. Only lapsed leases are read, never
   * every leased request; the cursor says which partition and where in it.
   */
  async leasesBefore(before: number, cursor?: PageCursor): Promise<Page<RequestRecord>> {
    let at: LeaseCursor = { shard: typeof cursor?.shard === 'number' ? cursor.shard : 0 };
    if (cursor?.key) at = { ...at, key: cursor.key as PageCursor };
    while (at.shard < leasePartitions.length) {
      const partition = leasePartitions[at.shard] as string;
      const page = await this.requestsPage(FREE_INDEX, 'f', partition, leaseSortKey(before), at.key);
      const next: LeaseCursor | undefined = page.cursor
        ? { shard: at.shard, key: page.cursor }
        : at.shard + 1 < leasePartitions.length
          ? { shard: at.shard + 1 }
          : undefined;
      // An empty page is passed over: a page comes back empty only when no partition ahead has any.
      if (page.items.length > 0 || !next)
        return { items: page.items, ...(next ? { cursor: { ...next } } : {}) };
      at = next;
    }
    return { items: [] };
  }

  /**
   * One page of the requests in an index partition whose sort key is below `below`, in sort-key order
   * (`r`: the reap index's rpk/rsk, `f`: the free index's fpk/fsk).
   */
  private async requestsPage(
    index: string,
    key: 'r' | 'f',
    partition: string,
    below: string,
    cursor: PageCursor | undefined,
  ): Promise<Page<RequestRecord>> {
    const out = await this.doc.send(
      new QueryCommand({
        TableName: this.tableName,
        IndexName: index,
        KeyConditionExpression: `${key}pk = :p AND ${key}sk < :b`,
        ExpressionAttributeValues: { ':p': partition, ':b': below },
        ExclusiveStartKey: cursor,
      }),
    );
    return { items: (out.Items ?? []).map((i) => RequestRecord.parse(i)), cursor: out.LastEvaluatedKey };
  }

  async listRequests(): Promise<RequestRecord[]> {
    return (await this.scanType('request')).map((i) => RequestRecord.parse(i));
  }

  async listBacking(): Promise<BackingRecord[]> {
    return (await this.scanType('backing')).map((i) => BackingRecord.parse(i));
  }

  private async scanType(type: string): Promise<Record<string, unknown>[]> {
    const input: ScanCommandInput = {
      TableName: this.tableName,
      FilterExpression: '#type = :t',
      ExpressionAttributeNames: { '#type': 'type' },
      ExpressionAttributeValues: { ':t': type },
    };
    const items: Record<string, unknown>[] = [];
    do {
      const out = await this.doc.send(new ScanCommand(input));
      items.push(...(out.Items ?? []));
      input.ExclusiveStartKey = out.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    return items;
  }
}

/** Where a read of the LEASE partitions is: which partition, and where in it. */
interface LeaseCursor {
  readonly shard: number;
  readonly key?: PageCursor;
}
