import { type AttributeValue, ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import { type DynamoDBDocumentClient, GetCommand, PutCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { unmarshall } from '@aws-sdk/util-dynamodb';
import { ConflictError, LostWriteError } from '../core/errors.ts';
import type { BackingExpectation, SlotClaim } from '../core/poolStore.ts';
import { BackingRecord, type Claim } from '../core/records.ts';
import { backingItem, keys } from './table.ts';
import { backingExpected, claimSlotUpdate, conditions } from './writes.ts';

/**
 * The backing-node items (docs/table.md, Backing node; Backing items): their reads by id, the whole-item
 * writes of a backing node's life (created as the intent before its launch, then replaced on its version
 * and expected state), and the slot claim: an UpdateItem of one slot, so that claims of different slots
 * never conflict, which takes a full backing node out of the `free` index (and repairs what concurrent
 * claims left there), so that membership in `free` stays exact.
 */
export class BackingItems {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    /** Seconds an ended record stays before DynamoDB's TTL deletes it (`record-retention`). */
    private readonly retention: number,
  ) {}

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
}
