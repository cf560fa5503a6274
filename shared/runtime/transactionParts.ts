/**
 * The parts of a local transaction (localTransactions.ts): its actions as the single-item writes they
 * are applied as, items' keys and identities, and the before-images its intent holds.
 */
import {
  type AttributeValue,
  type CancellationReason,
  DeleteItemCommand,
  type DeleteItemCommandInput,
  PutItemCommand,
  type PutItemCommandInput,
  type TransactWriteItem,
  UpdateItemCommand,
  type UpdateItemCommandInput,
} from '@aws-sdk/client-dynamodb';

export type Item = Record<string, AttributeValue>;
export interface KeyNames {
  readonly partition: string;
  readonly sort?: string | undefined;
}
export interface Image {
  readonly table: string;
  readonly key: Item;
  readonly item?: Item;
}
export interface Applied {
  readonly reason: CancellationReason;
  /** Write units the engine says the write consumed. */
  readonly consumed: number;
}
/** An item's identity: its table and key, the key's attributes in order of name. */
export const keyId = (table: string, key: Item) =>
  JSON.stringify([
    table,
    ...Object.keys(key)
      .sort()
      .map((name) => [name, key[name]]),
  ]);
export interface Action {
  readonly kind: 'Put' | 'Update' | 'Delete' | 'ConditionCheck';
  readonly table: string;
  readonly key?: Item;
  readonly item?: Item;
  readonly returnOld: boolean;
  command(): PutItemCommand | UpdateItemCommand | DeleteItemCommand;
}

export function keyOf(item: Item, names: KeyNames): Item {
  const key: Item = {};
  for (const name of [names.partition, names.sort]) {
    const value = name === undefined ? undefined : item[name];
    if (name !== undefined && value !== undefined) key[name] = value;
  }
  return key;
}

/**
 * A transaction's action as the single-item write it is applied as: a ConditionCheck is an update
 * without updates (the engine evaluates its condition as for any write).
 */
export function actionOf(t: TransactWriteItem): Action {
  for (const kind of ['Put', 'Update', 'Delete', 'ConditionCheck'] as const) {
    const action = t[kind];
    if (!action) continue;
    const { ReturnValuesOnConditionCheckFailure: returned, ...write } = action;
    const input = { ...write, ReturnConsumedCapacity: 'TOTAL' as const };
    return {
      kind,
      table: write.TableName as string,
      ...('Item' in write ? { item: write.Item as Item } : { key: write.Key as Item }),
      returnOld: returned === 'ALL_OLD',
      command: () =>
        kind === 'Put'
          ? new PutItemCommand(input as PutItemCommandInput)
          : kind === 'Delete'
            ? new DeleteItemCommand(input as DeleteItemCommandInput)
            : new UpdateItemCommand(input as UpdateItemCommandInput),
    };
  }
  throw validationError('TransactItems: an action must be one of Put, Update, Delete, ConditionCheck');
}

export const validationError = (message: string) =>
  Object.assign(new Error(message), { name: 'ValidationException' });

/** Before-images as JSON (binary values as base64, so that an image comes back as it was). */
export function encodeImages(images: readonly Image[]): string {
  return JSON.stringify(images, (_k, v: unknown) =>
    v instanceof Uint8Array ? { $b64: Buffer.from(v).toString('base64') } : v,
  );
}

export function decodeImages(json: string): Image[] {
  return JSON.parse(json, (_k, v: unknown) =>
    v && typeof v === 'object' && '$b64' in v ? new Uint8Array(Buffer.from(String(v.$b64), 'base64')) : v,
  ) as Image[];
}
