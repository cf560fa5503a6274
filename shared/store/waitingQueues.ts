import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import {
  DeleteCommand,
  type DynamoDBDocumentClient,
  PutCommand,
  QueryCommand,
  type QueryCommandInput,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import type { RequestRecord } from '../core/records.ts';
import {
  QUEUE_REANNOUNCE_MS,
  queueOf,
  REGISTRY_REUSE_MS,
  RegisteredQueue,
  type WaitingQueue,
} from '../core/waitingQueue.ts';
import { keys, QUEUES_PK, queuePartition, reapPartition, serviceKey } from './table.ts';

/**
 * The registry of waiting queues (docs/table.md, Waiting queues): one small item per node-set shape that
 * may have requests waiting, so that the readers of the queues (a delivery's priority check, the
 * hand-off of a freed place, the reaper) know which partitions of the reap index to read without reading
 * every waiting request.
 *
 * The one rule: a queue is in the registry before any request is written into it. A writer announces
 * its request's queue (a PutItem) before it writes the request, unless this store announced it less than
 * QUEUE_REANNOUNCE_MS ago; the reaper forgets a queue only when it found it empty and no writer announced
 * it for QUEUE_FORGET_MS (three times longer), conditioned on the announcement it read. So a request in a
 * queue the registry lacks would need a writer to stall ten minutes between its check and its write.
 *
 * A delivery's own checks (priority, the hand-off of a freed place) may reuse this store's last read of
 * the registry for REGISTRY_REUSE_MS (`list({ reuse: true })`): on the warm path that read was one
 * DynamoDB call of every allocation, for a registry that changes only when a new shape starts waiting.
 * What this store announces or forgets drops the reused read, so within one process (the embedded pool)
 * the answer is as fresh as a read; another writer's new queue is seen at most REGISTRY_REUSE_MS late.
 */
export class WaitingQueues {
  /** Queues this store announced, and when. */
  private readonly announced = new Map<string, number>();
  /** The last read of the registry, and when (this store's clock), for readers that may reuse it. */
  private lastRead: { readonly at: number; readonly queues: readonly RegisteredQueue[] } | undefined;
  /** Queues this store found empty, and when (queue sk -> time), for readers that may reuse it. */
  private readonly emptyAt = new Map<string, number>();

  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly now: () => number,
  ) {}

  /** Announces the queue of a request about to be written `requested` (nothing for any other state). */
  async announce(r: RequestRecord): Promise<void> {
    if (r.state !== 'requested') return;
    const queue = queueOf(r);
    const key = keys.waitingQueue(queue);
    const now = this.now();
    this.emptyAt.delete(key.sk); // a request is about to wait in it
    const last = this.announced.get(key.sk);
    if (last !== undefined && last <= now && now - last < QUEUE_REANNOUNCE_MS) return;
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: { ...key, type: 'queue', labels: queue.labels, count: queue.count, registeredAt: now },
          // Never back in time (another writer's clock may be ahead): the reaper's test reads the newest.
          ConditionExpression: 'attribute_not_exists(pk) OR registeredAt < :now',
          ExpressionAttributeValues: { ':now': now },
        }),
      );
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err; // announced later by another writer
    }
    this.announced.set(key.sk, now);
    this.lastRead = undefined; // a reused read may lack it: the next reader reads again
  }

  /**
   * Every queue in the registry (one Query of one item collection, small items). With `reuse`, this
   * store's last read when it is younger than REGISTRY_REUSE_MS and nothing was announced or forgotten
   * through this store since.
   */
  async list(options: { readonly reuse?: boolean } = {}): Promise<RegisteredQueue[]> {
    const now = this.now();
    const last = this.lastRead;
    if (options.reuse && last && last.at <= now && now - last.at < REGISTRY_REUSE_MS) return [...last.queues];
    const input: QueryCommandInput = {
      TableName: this.tableName,
      KeyConditionExpression: 'pk = :pk',
      ExpressionAttributeValues: { ':pk': QUEUES_PK },
    };
    const out: RegisteredQueue[] = [];
    do {
      const page = await this.doc.send(new QueryCommand(input));
      for (const item of page.Items ?? []) out.push(RegisteredQueue.parse(item));
      input.ExclusiveStartKey = page.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    this.lastRead = { at: now, queues: out };
    return [...out];
  }

  /**
   * Whether this store found queue `q` empty less than REGISTRY_REUSE_MS ago and has written no waiting
   * request into it since (`reuse` readers of a queue's first request, like those of the registry).
   */
  seenEmpty(q: WaitingQueue): boolean {
    const at = this.emptyAt.get(keys.waitingQueue(q).sk);
    const now = this.now();
    return at !== undefined && at <= now && now - at < REGISTRY_REUSE_MS;
  }

  /** This store's clock. */
  clockNow(): number {
    return this.now();
  }

  /** Notes that queue `q` was read empty at `at` (this store's clock, taken before the read). */
  noteEmpty(q: WaitingQueue, at: number): void {
    this.emptyAt.set(keys.waitingQueue(q).sk, at);
  }

  /** Removes a queue from the registry if no writer announced it since `q` was read; false otherwise. */
  async forget(q: RegisteredQueue): Promise<boolean> {
    const key = keys.waitingQueue(q);
    try {
      await this.doc.send(
        new DeleteCommand({
          TableName: this.tableName,
          Key: key,
          ConditionExpression: 'registeredAt = :at',
          ExpressionAttributeValues: { ':at': q.registeredAt },
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
    this.announced.delete(key.sk);
    this.lastRead = undefined;
    return true;
  }

  /**
   * Moves a request an earlier version recorded in the single WAITING partition to its queue (announced
   * first). Not a new version of the record: only its index keys change, and only while it is still
   * `requested` there; false when it is not (placed or ended meanwhile, or moved already).
   */
  async requeue(r: RequestRecord): Promise<boolean> {
    await this.announce(r);
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.request(r.id),
          UpdateExpression: 'SET rpk = :queue, rsk = :place',
          ConditionExpression: 'rpk = :legacy AND #state = :requested',
          ExpressionAttributeNames: { '#state': 'state' },
          ExpressionAttributeValues: {
            ':queue': queuePartition(queueOf(r)),
            ':place': serviceKey(r),
            ':legacy': reapPartition.waiting,
            ':requested': 'requested',
          },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }
}
