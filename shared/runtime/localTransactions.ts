import { randomUUID } from 'node:crypto';
import {
  type AttributeValue,
  type CancellationReason,
  ConditionalCheckFailedException,
  DeleteItemCommand,
  type DeleteItemCommandInput,
  DescribeTableCommand,
  type DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  type PutItemCommandInput,
  QueryCommand,
  TransactionCanceledException,
  type TransactWriteItem,
  type TransactWriteItemsCommandInput,
  UpdateItemCommand,
  type UpdateItemCommandInput,
} from '@aws-sdk/client-dynamodb';
import { ReadWriteLock } from './readWriteLock.ts';

/**
 * TransactWriteItems for an engine that has none (dynalite, the embedded pool's DynamoDB), with the
 * guarantees the pool relies on from DynamoDB's: all actions or none, every condition checked, the
 * per-action CancellationReasons of a cancelled one, and no reader seeing half of one.
 *
 * Isolation: every request of the clients this is installed on, to one engine, goes through one
 * readers-writer lock: a transaction runs alone; any other request (a single-item write or a read) runs
 * beside other such requests, as the engine itself orders them. The embedded pool's writes all come from
 * its one process (the CLI sends messages; it reads the table only), so this serializes what DynamoDB
 * serializes. Another process writing to the same engine directly is not covered.
 *
 * Atomicity: under the lock, each action's item is read first (its before-image), the images are written
 * in one intent item (`LOCALTXN` / <id>, in the table of its first action), then each action is applied as the
 * single-item conditional write it is. A condition that fails restores the images of what was applied,
 * deletes the intent and cancels the transaction with a reason per action (`None` or
 * `ConditionalCheckFailed`, with the item when ReturnValuesOnConditionCheckFailure asks for it). Once all
 * are applied the intent is deleted: that delete is the commit. A process killed before it leaves the
 * intent, and `recover()` (run when the pool starts, before any handler) puts every image back: a
 * transaction that did not commit is rolled back, never half-applied. It is rolled back rather than
 * forward because the images after it are not known before its actions run (the engine evaluates the
 * update expressions), and its caller died without an answer, as after a timeout on AWS.
 *
 * Not emulated: ClientRequestToken's 10-minute idempotency (the pool's transactions are idempotent by their
 * conditions: a retry finds its own items), and TransactionConflict (the lock leaves none). The intent is
 * an item: a transaction whose before-images pass DynamoDB's 400 KB item limit is refused as such an item
 * would be (the pool's are a few KB).
 */
export class LocalTransactions {
  /**
   * Test hook, called after each action is applied (index in TransactItems). Throwing here is a crash
   * inside the transaction: the intent is left, then rolled back from the table (recoverAfterCrash).
   */
  afterAction: ((index: number) => void | Promise<void>) | undefined;
  /**
   * Whether a crash inside a transaction (afterAction threw) is rolled back at once, as a restart would,
   * before the error reaches the caller; false leaves the intent, as a kill does (a test of the restart).
   */
  recoverAfterCrash = true;
  private readonly lock: ReadWriteLock;
  private readonly keySchemas = new Map<string, Promise<KeyNames>>();

  constructor(
    client: DynamoDBClient,
    /**
     * A second client of the same engine, without this one's middleware, that runs the steps of each
     * transaction (its reads, intent and single-item writes): what watches or counts the first client's
     * calls sees one TransactWriteItems, as DynamoDB would receive it.
     */
    private readonly steps: DynamoDBClient,
    options: {
      /** Names the engine (its endpoint): the clients of one engine share its lock. */
      readonly engine?: string;
    } = {},
  ) {
    this.lock = lockOf(options.engine ?? 'unnamed');
    client.middlewareStack.add(
      (next, context) => async (args) => {
        if (context.commandName === 'TransactWriteItemsCommand') {
          const input = args.input as TransactWriteItemsCommandInput;
          const units = await this.lock.write(() => this.run(input));
          const consumed =
            input.ReturnConsumedCapacity && input.ReturnConsumedCapacity !== 'NONE'
              ? {
                  ConsumedCapacity: [...units].map(([TableName, CapacityUnits]) => ({
                    TableName,
                    CapacityUnits,
                  })),
                }
              : {};
          return { output: { $metadata: {}, ...consumed }, response: undefined } as never;
        }
        return this.lock.read(() => next(args));
      },
      // After the serializer, which a DynamoDBDocumentClient's marshalling precedes: the input is DynamoDB's
      // (AttributeValues), as a step sends it again.
      { step: 'build', priority: 'high', name: 'localTransactions' },
    );
  }

  /**
   * Rolls back every transaction a crash left uncommitted whose intent is in `table` (a transaction's
   * intent is in the table of its first action); returns how many. Run before anything reads the table.
   */
  async recover(table: string): Promise<number> {
    return this.lock.write(() => this.rollBackLeft(table));
  }

  private async rollBackLeft(table: string): Promise<number> {
    const keys = await this.keyNames(table);
    let rolledBack = 0;
    let start: Record<string, AttributeValue> | undefined;
    do {
      const page = await this.steps.send(
        new QueryCommand({
          TableName: table,
          KeyConditionExpression: '#pk = :pk',
          ExpressionAttributeNames: { '#pk': keys.partition },
          ExpressionAttributeValues: { ':pk': { S: INTENT_PARTITION } },
          ConsistentRead: true,
          ExclusiveStartKey: start,
        }),
      );
      for (const item of page.Items ?? []) {
        const images = decodeImages(item.images?.S ?? '[]');
        await this.restore(images);
        await this.steps.send(new DeleteItemCommand({ TableName: table, Key: keyOf(item, keys) }));
        rolledBack++;
      }
      start = page.LastEvaluatedKey;
    } while (start);
    return rolledBack;
  }

  /** Runs a transaction; returns the write units it consumed per table, as DynamoDB bills them (twice a write's). */
  private async run(input: TransactWriteItemsCommandInput): Promise<Map<string, number>> {
    const actions = (input.TransactItems ?? []).map(actionOf);
    if (actions.length === 0) throw validationError('TransactItems must hold at least 1 action');
    const images: Image[] = [];
    for (const a of actions) {
      const key = a.key ?? keyOf(a.item ?? {}, await this.keyNames(a.table));
      const got = await this.steps.send(
        new GetItemCommand({ TableName: a.table, Key: key, ConsistentRead: true }),
      );
      images.push({ table: a.table, key, ...(got.Item ? { item: got.Item } : {}) });
    }
    const intentTable = actions[0]?.table as string;
    const intentKeys = await this.keyNames(intentTable);
    const intentKey = {
      [intentKeys.partition]: { S: INTENT_PARTITION },
      ...(intentKeys.sort ? { [intentKeys.sort]: { S: randomUUID() } } : {}),
    };
    await this.steps.send(
      new PutItemCommand({
        TableName: intentTable,
        Item: { ...intentKey, images: { S: encodeImages(images) } },
      }),
    );
    const reasons: CancellationReason[] = [];
    const units = new Map<string, number>();
    let applied = 0;
    try {
      for (const [i, a] of actions.entries()) {
        const { reason, consumed } = await this.apply(a, images[i] as Image);
        reasons.push(reason);
        units.set(a.table, (units.get(a.table) ?? 0) + 2 * consumed);
        applied = i + 1;
        await this.afterAction?.(i);
      }
    } catch (err) {
      if (!this.recoverAfterCrash) throw err;
      // A crash inside the transaction: rolled back from the intent in the table, as a restart does.
      await this.rollBackLeft(intentTable);
      throw err;
    }
    const failed = reasons.some((r) => r.Code !== 'None');
    if (failed) await this.restore(images.slice(0, applied));
    await this.steps.send(new DeleteItemCommand({ TableName: intentTable, Key: intentKey }));
    if (failed) {
      throw new TransactionCanceledException({
        $metadata: { httpStatusCode: 400 },
        message: `Transaction cancelled, please refer cancellation reasons for specific reasons [${reasons.map((r) => r.Code).join(', ')}]`,
        CancellationReasons: reasons,
      });
    }
    return units;
  }

  /**
   * One action as its single-item write, and the write units the engine says it consumed; a failed
   * condition is its reason (anything else is thrown).
   */
  private async apply(a: Action, before: Image): Promise<{ reason: CancellationReason; consumed: number }> {
    try {
      const out = await this.steps.send(a.command() as UpdateItemCommand);
      // A ConditionCheck is an update without updates, which creates a key-only item where there was none.
      if (a.kind === 'ConditionCheck' && !before.item) {
        await this.steps.send(new DeleteItemCommand({ TableName: a.table, Key: before.key }));
      }
      return { reason: { Code: 'None' }, consumed: out.ConsumedCapacity?.CapacityUnits ?? 0 };
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      return {
        reason: {
          Code: 'ConditionalCheckFailed',
          Message: 'The conditional request failed',
          ...(a.returnOld && before.item ? { Item: before.item } : {}),
        },
        consumed: 0,
      };
    }
  }

  private async restore(images: readonly Image[]): Promise<void> {
    for (const image of images) {
      if (image.item) await this.steps.send(new PutItemCommand({ TableName: image.table, Item: image.item }));
      else await this.steps.send(new DeleteItemCommand({ TableName: image.table, Key: image.key }));
    }
  }

  private keyNames(table: string): Promise<KeyNames> {
    let names = this.keySchemas.get(table);
    if (!names) {
      names = this.steps.send(new DescribeTableCommand({ TableName: table })).then((out) => {
        const schema = out.Table?.KeySchema ?? [];
        const name = (type: string) => schema.find((k) => k.KeyType === type)?.AttributeName;
        return { partition: name('HASH') as string, sort: name('RANGE') };
      });
      names.catch(() => this.keySchemas.delete(table));
      this.keySchemas.set(table, names);
    }
    return names;
  }
}

/** The partition of the intents (no pool item's partition key is without a `#`). */
export const INTENT_PARTITION = 'LOCALTXN';

type Item = Record<string, AttributeValue>;
interface KeyNames {
  readonly partition: string;
  readonly sort?: string | undefined;
}
interface Image {
  readonly table: string;
  readonly key: Item;
  readonly item?: Item;
}
interface Action {
  readonly kind: 'Put' | 'Update' | 'Delete' | 'ConditionCheck';
  readonly table: string;
  readonly key?: Item;
  readonly item?: Item;
  readonly returnOld: boolean;
  command(): PutItemCommand | UpdateItemCommand | DeleteItemCommand;
}

function keyOf(item: Item, names: KeyNames): Item {
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
function actionOf(t: TransactWriteItem): Action {
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

const validationError = (message: string) =>
  Object.assign(new Error(message), { name: 'ValidationException' });

/** Before-images as JSON (binary values as base64, so that an image comes back as it was). */
function encodeImages(images: readonly Image[]): string {
  return JSON.stringify(images, (_k, v: unknown) =>
    v instanceof Uint8Array ? { $b64: Buffer.from(v).toString('base64') } : v,
  );
}

function decodeImages(json: string): Image[] {
  return JSON.parse(json, (_k, v: unknown) =>
    v && typeof v === 'object' && '$b64' in v ? new Uint8Array(Buffer.from(String(v.$b64), 'base64')) : v,
  ) as Image[];
}

/**
 * One lock per engine: the clients of one engine (a test may build two on one) share it. Clients that do
 * not name their engine share one lock, which only serializes more than needed.
 */
const locks = new Map<string, ReadWriteLock>();

function lockOf(key: string): ReadWriteLock {
  let lock = locks.get(key);
  if (!lock) {
    lock = new ReadWriteLock();
    locks.set(key, lock);
  }
  return lock;
}
