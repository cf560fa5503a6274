import { randomUUID } from 'node:crypto';
import {
  type AttributeValue,
  BatchGetItemCommand,
  type BatchGetItemCommandOutput,
  ConditionalCheckFailedException,
  DeleteItemCommand,
  DescribeTableCommand,
  type DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  QueryCommand,
  TransactionCanceledException,
  type TransactWriteItemsCommandInput,
  type UpdateItemCommand,
  type WriteRequest,
} from '@aws-sdk/client-dynamodb';
import { EngineLocks } from './engineLocks.ts';
import {
  type Action,
  type Applied,
  actionOf,
  decodeImages,
  encodeImages,
  type Image,
  type Item,
  type KeyNames,
  keyId,
  keyOf,
  validationError,
} from './transactionParts.ts';

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
  private readonly locks: EngineLocks;
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
    this.locks = locksOf(options.engine ?? 'unnamed');
    client.middlewareStack.add(
      (next, context) => async (args) => {
        const command = context.commandName ?? '';
        const input = args.input as Record<string, unknown>;
        if (command === 'TransactWriteItemsCommand') {
          const actions = ((input as unknown as TransactWriteItemsCommandInput).TransactItems ?? []).map(
            actionOf,
          );
          if (actions.length === 0) throw validationError('TransactItems must hold at least 1 action');
          const keys = await Promise.all(actions.map((a) => this.keyOfAction(a)));
          const ids = actions.map((a, i) => keyId(a.table, keys[i] as Item));
          const units = await this.locks.transaction(ids, () => this.run(actions, keys));
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
        if (SINGLE_ITEM.has(command)) {
          const table = String(input.TableName);
          const key =
            (input.Key as Item | undefined) ?? keyOf(input.Item as Item, await this.keyNames(table));
          return this.locks.item(keyId(table, key), () => next(args));
        }
        if (command === 'BatchWriteItemCommand') {
          const ids: string[] = [];
          for (const [table, writes] of Object.entries(
            input.RequestItems as Record<string, WriteRequest[]>,
          )) {
            const names = await this.keyNames(table);
            for (const w of writes) {
              const key = w.DeleteRequest?.Key ?? keyOf(w.PutRequest?.Item ?? {}, names);
              ids.push(keyId(table, key));
            }
          }
          return this.locks.itemsApart(ids, () => next(args));
        }
        if (MANY_ITEMS.has(command)) return this.locks.manyItems(() => next(args));
        return next(args);
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
    return this.locks.recovery(() => this.rollBackLeft(table));
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
  private async run(actions: readonly Action[], keys: readonly Item[]): Promise<Map<string, number>> {
    const images = await this.beforeImages(actions, keys);
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
    // The actions at once (their items are distinct: none sees another's effect, as in DynamoDB, where
    // every condition is checked against the items as they were).
    const outcomes = await Promise.allSettled(
      actions.map(async (a, i) => {
        const out = await this.apply(a, images[i] as Image);
        if (out.reason.Code === 'None') await this.afterAction?.(i);
        return out;
      }),
    );
    const thrown = outcomes.find((o) => o.status === 'rejected');
    if (thrown) {
      // A crash inside the transaction, or an error of the engine: rolled back from the intent in the
      // table, as a restart does (unless a test leaves that to the restart itself).
      if (this.recoverAfterCrash) await this.rollBackIntent(intentTable, intentKey);
      throw thrown.reason;
    }
    const results = outcomes.map((o) => (o as PromiseFulfilledResult<Applied>).value);
    const reasons = results.map((r) => r.reason);
    const units = new Map<string, number>();
    for (const [i, r] of results.entries()) {
      const table = actions[i]?.table as string;
      units.set(table, (units.get(table) ?? 0) + 2 * r.consumed);
    }
    const failed = reasons.some((r) => r.Code !== 'None');
    if (failed) await this.restore(images.filter((_, i) => reasons[i]?.Code === 'None'));
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
  private async apply(a: Action, before: Image): Promise<Applied> {
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

  /** Puts each item back as it was (deleted where there was none), all at once. */
  private async restore(images: readonly Image[]): Promise<void> {
    await Promise.all(
      images.map((image) =>
        image.item
          ? this.steps.send(new PutItemCommand({ TableName: image.table, Item: image.item }))
          : this.steps.send(new DeleteItemCommand({ TableName: image.table, Key: image.key })),
      ),
    );
  }

  /** Each action's item as it is now (absent: none), in one consistent BatchGetItem a page at a time. */
  private async beforeImages(actions: readonly Action[], keys: readonly Item[]): Promise<Image[]> {
    const found = new Map<string, Item>();
    let request: Record<string, { Keys: Item[]; ConsistentRead: true }> | undefined = {};
    for (const [i, a] of actions.entries()) {
      const entry = request[a.table] ?? { Keys: [], ConsistentRead: true as const };
      entry.Keys.push(keys[i] as Item);
      request[a.table] = entry;
    }
    while (request && Object.keys(request).length > 0) {
      const out: BatchGetItemCommandOutput = await this.steps.send(
        new BatchGetItemCommand({ RequestItems: request }),
      );
      for (const [table, items] of Object.entries(out.Responses ?? {})) {
        for (const item of items) {
          const names = await this.keyNames(table);
          found.set(keyId(table, keyOf(item, names)), item);
        }
      }
      request = out.UnprocessedKeys as typeof request;
    }
    return actions.map((a, i) => {
      const key = keys[i] as Item;
      const item = found.get(keyId(a.table, key));
      return { table: a.table, key, ...(item ? { item } : {}) };
    });
  }

  private async keyOfAction(a: Action): Promise<Item> {
    return a.key ?? keyOf(a.item ?? {}, await this.keyNames(a.table));
  }

  /** Rolls back one transaction from its intent (a crash inside it, in a process that lives on). */
  private async rollBackIntent(table: string, key: Item): Promise<void> {
    const intent = await this.steps.send(
      new GetItemCommand({ TableName: table, Key: key, ConsistentRead: true }),
    );
    if (!intent.Item) return;
    await this.restore(decodeImages(intent.Item.images?.S ?? '[]'));
    await this.steps.send(new DeleteItemCommand({ TableName: table, Key: key }));
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

const SINGLE_ITEM = new Set(['GetItemCommand', 'PutItemCommand', 'UpdateItemCommand', 'DeleteItemCommand']);
const MANY_ITEMS = new Set(['QueryCommand', 'ScanCommand', 'BatchGetItemCommand', 'TransactGetItemsCommand']);

/** The partition of the intents (no pool item's partition key is without a `#`). */
export const INTENT_PARTITION = 'LOCALTXN';

/**
 * One set of locks per engine: the clients of one engine (a test may build two on one) share it. Clients
 * that do not name their engine share one set, which only serializes more than needed.
 */
const engines = new Map<string, EngineLocks>();

function locksOf(engine: string): EngineLocks {
  let locks = engines.get(engine);
  if (!locks) {
    locks = new EngineLocks();
    engines.set(engine, locks);
  }
  return locks;
}
