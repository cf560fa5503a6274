import { setTimeout as sleep } from 'node:timers/promises';
import { type AttributeValue, ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import {
  BatchGetCommand,
  type DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  UpdateCommand,
  type UpdateCommandOutput,
} from '@aws-sdk/lib-dynamodb';
import { unmarshall } from '@aws-sdk/util-dynamodb';
import { ConflictError, LostWriteError } from '../core/errors.ts';
import { RequestRecord } from '../core/records.ts';
import { expiresAtOf, keys, requestEnded, requestItem } from './table.ts';
import type { WaitingQueues } from './waitingQueues.ts';
import {
  conditions,
  dropLeaseUpdate,
  expiresAtUpdate,
  lapseLeaseUpdate,
  releaseNodeUpdate,
  renewLeaseUpdate,
  takeSpareUpdate,
} from './writes.ts';

/** BatchGetItem's limit of keys per call. */
const BATCH_GET_KEYS = 100;
/** Calls for one batch's keys, unprocessed ones asked again after 50, 100, 200 ms; then one by one. */
const BATCH_GET_ATTEMPTS = 4;
const BATCH_GET_BACKOFF_MS = 50;

/**
 * The request items (docs/table.md, Request; Request items): their reads by id and conditional writes, a
 * whole request (created once, then replaced on its version) and the one-node updates that need no read
 * first (a spare taken, a node released, the client's lease renewed, lapsed or dropped). A whole-item write
 * announces the request's waiting queue first (waitingQueues.ts: a queue is registered before a request is
 * written into it); an ended request gets its purge time (`record-retention`, table.ts expiresAtOf).
 */
export class RequestItems {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly queues: WaitingQueues,
    /** Seconds an ended record stays before DynamoDB's TTL deletes it. */
    private readonly retention: number,
  ) {}

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

  /**
   * BatchGetItem, 100 keys a call (its limit), strongly consistent. Keys DynamoDB leaves unprocessed
   * (throttling, the 16 MB response limit) are asked again with a growing wait, a few times; any still
   * left are read one by one, so the answer is always complete.
   */
  async getRequests(ids: readonly string[]): Promise<Map<string, RequestRecord>> {
    const found = new Map<string, RequestRecord>();
    const unique = [...new Set(ids)];
    for (let at = 0; at < unique.length; at += BATCH_GET_KEYS) {
      const idOf = new Map(unique.slice(at, at + BATCH_GET_KEYS).map((id) => [keys.request(id).pk, id]));
      let keysLeft: Array<Record<string, unknown>> = [...idOf.values()].map((id) => keys.request(id));
      for (let attempt = 0; keysLeft.length > 0 && attempt < BATCH_GET_ATTEMPTS; attempt++) {
        if (attempt > 0) await sleep(BATCH_GET_BACKOFF_MS * 2 ** (attempt - 1));
        const out = await this.doc.send(
          new BatchGetCommand({
            RequestItems: { [this.tableName]: { Keys: keysLeft, ConsistentRead: true } },
          }),
        );
        for (const item of out.Responses?.[this.tableName] ?? []) {
          const r = RequestRecord.parse(item);
          found.set(r.id, r);
        }
        keysLeft = out.UnprocessedKeys?.[this.tableName]?.Keys ?? [];
      }
      for (const key of keysLeft) {
        const id = idOf.get(String(key.pk));
        const r = id === undefined ? undefined : await this.getRequest(id);
        if (r) found.set(r.id, r);
      }
    }
    return found;
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

  // ---- client leases (docs/table.md, Leases) -----------------------------------------------------

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
}
