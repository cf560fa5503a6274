import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import {
  type DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  QueryCommand,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import { DurationEstimate } from '../core/estimates.ts';
import { ArrivalModel } from '../core/forecast.ts';
import { LabelBackoff } from '../core/minReady.ts';
import type { MinReadyState } from '../core/poolStore.ts';
import { ReadyHold } from '../core/readyRoom.ts';
import { keys } from './table.ts';
import { conditions } from './writes.ts';

/**
 * The items a label has besides its requests (docs/table.md): its learned duration estimates (label-wide
 * and per requestor), its min-ready seats with their backoff and ready-room hold, and its arrival
 * forecast. Each is small and written with a condition on the version read (or on the seat's
 * generation), so concurrent reapers and request handlers never overwrite each other's update.
 */
export class LabelItems {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly table: string,
  ) {}

  // ---- learned duration estimates -----------------------------------------------------------------

  async getEstimate(label: string, requestor?: string): Promise<DurationEstimate | undefined> {
    const out = await this.doc.send(
      new GetCommand({
        TableName: this.table,
        Key: keys.estimate(label, requestor),
        ConsistentRead: true,
      }),
    );
    return out.Item ? DurationEstimate.parse(out.Item) : undefined;
  }

  putEstimate(e: DurationEstimate): Promise<boolean> {
    return this.putVersioned({ ...keys.estimate(e.label, e.requestor), type: 'estimate', ...e }, e.version);
  }

  // ---- min-ready seats ----------------------------------------------------------------------------

  async minReadyState(label: string): Promise<MinReadyState> {
    const gens = new Map<number, number>();
    const vacant = new Set<number>();
    let backoff: LabelBackoff | undefined;
    let hold: ReadyHold | undefined;
    let cursor: Record<string, unknown> | undefined;
    do {
      const out = await this.doc.send(
        new QueryCommand({
          TableName: this.table,
          KeyConditionExpression: 'pk = :pk',
          ExpressionAttributeValues: { ':pk': keys.seats(label) },
          ConsistentRead: true,
          ExclusiveStartKey: cursor,
        }),
      );
      for (const item of out.Items ?? []) {
        if (item.type === 'backoff') backoff = LabelBackoff.parse(item);
        else if (item.type === 'hold') hold = ReadyHold.parse(item);
        else {
          gens.set(Number(item.seat), Number(item.gen));
          if (item.vacant === true) vacant.add(Number(item.seat));
        }
      }
      cursor = out.LastEvaluatedKey;
    } while (cursor);
    return { gens, vacant, ...(backoff ? { backoff } : {}), ...(hold ? { hold } : {}) };
  }

  async putReadyHold(label: string, next: ReadyHold): Promise<boolean> {
    return this.putVersioned({ ...keys.seatsHold(label), type: 'hold', label, ...next }, next.version);
  }

  // ---- arrival forecasts ---------------------------------------------------------------------------

  async getForecast(label: string): Promise<ArrivalModel | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.table, Key: keys.forecast(label), ConsistentRead: true }),
    );
    return out.Item ? ArrivalModel.parse(out.Item) : undefined;
  }

  async putForecast(model: ArrivalModel): Promise<boolean> {
    return this.putVersioned({ ...keys.forecast(model.label), type: 'forecast', ...model }, model.version);
  }

  /**
   * Puts an item made from the one at `version - 1` (none for version 1), if that is still the one
   * stored; false when another writer got there first.
   */
  private async putVersioned(item: Record<string, unknown>, version: number): Promise<boolean> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.table,
          Item: item,
          ...(version === 1
            ? { ConditionExpression: conditions.itemDoesNotExist }
            : {
                ConditionExpression: conditions.versionUnchanged,
                ExpressionAttributeNames: { '#version': 'version' },
                ExpressionAttributeValues: { ':expectedVersion': version - 1 },
              }),
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }

  putLabelBackoff(label: string, next: LabelBackoff): Promise<boolean> {
    return this.putVersioned({ ...keys.seatsBackoff(label), type: 'backoff', label, ...next }, next.version);
  }

  async openSeat(label: string, seat: number): Promise<void> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.table,
          Item: { ...keys.seat(label, seat), type: 'seat', label, seat, gen: 0 },
          ConditionExpression: conditions.itemDoesNotExist,
        }),
      );
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err; // recorded already
    }
  }

  async markSeatVacant(label: string, seat: number, gen: number): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.table,
          Key: keys.seat(label, seat),
          UpdateExpression: 'SET vacant = :true',
          // Only the generation whose ended node was read: an advance since (a PutItem without it) wins.
          ConditionExpression: 'attribute_exists(pk) AND gen = :gen',
          ExpressionAttributeValues: { ':true': true, ':gen': gen },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }

  async advanceSeat(label: string, seat: number, from: number): Promise<boolean> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.table,
          Item: { ...keys.seat(label, seat), type: 'seat', label, seat, gen: from + 1 },
          // Generation 0 is the seat with no item yet.
          ConditionExpression: from === 0 ? `${conditions.itemDoesNotExist} OR gen = :from` : 'gen = :from',
          ExpressionAttributeValues: { ':from': from },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }
}
