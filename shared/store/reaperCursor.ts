import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import { type DynamoDBDocumentClient, GetCommand, PutCommand } from '@aws-sdk/lib-dynamodb';
import type { ReaperCursor } from '../core/poolStore.ts';
import { keys } from './table.ts';
import { conditions } from './writes.ts';

/**
 * The reaper cursor (docs/table.md, Reaper cursor): one item naming the step the next reaper run starts
 * with, so that a run cut short by its time has the next one start after the step it stopped in. Created
 * once, then written on the version read: of two overlapping runs, the one whose write loses leaves the
 * other's.
 */
export class ReaperCursorItem {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
  ) {}

  async read(): Promise<ReaperCursor | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.reaperCursor, ConsistentRead: true }),
    );
    if (!out.Item) return undefined;
    const first = out.Item.first;
    return { version: Number(out.Item.version), ...(typeof first === 'string' ? { first } : {}) };
  }

  async put(first: string | undefined, readVersion: number | undefined): Promise<boolean> {
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
}
