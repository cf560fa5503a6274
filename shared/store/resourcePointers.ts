import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import { DeleteCommand, type DynamoDBDocumentClient, GetCommand, PutCommand } from '@aws-sdk/lib-dynamodb';
import { ConflictError } from '../core/errors.ts';
import { keys, resourceItem } from './table.ts';
import { pointsTo } from './writes.ts';

/**
 * The resource pointers (docs/table.md, Resource pointer): one small item per provider resource naming
 * the backing node that records it, so that a provider's event for an instance no backing node records
 * costs one GetItem and no provider call. A pointer is written and removed only while it is absent or
 * names the same backing node (`pointsTo`): two backing nodes never share a resource.
 */
export class ResourcePointers {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
  ) {}

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
}
