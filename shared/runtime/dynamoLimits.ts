/**
 * A guard that refuses, before it is sent, every DynamoDB request that DynamoDB itself would refuse for
 * breaking one of its documented limits, with DynamoDB's own answer. Neither dynalite (the embedded
 * pool's engine) nor moto enforces these limits, so a request that passes every local test can still be
 * refused by AWS (a ConditionExpression over 4 KB, say). Installed on every client of a local engine:
 * the embedded pool's (engines.ts localDynamoClient, so `metastatic dev` refuses what AWS would), and
 * those the tests, chaos runs and benches make against dynalite or moto; never on a client of real AWS,
 * which answers for itself. How DynamoDB measures (item sizes, operator counts) is dynamoMeasures.ts.
 *
 * The limits (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Constraints.html and
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html):
 * - an expression (Condition, Filter, KeyCondition, Projection, Update) at most 4 KB;
 * - at most 300 operators and functions in one expression, and at most 100 operands of an IN;
 * - an ExpressionAttributeNames or ExpressionAttributeValues placeholder at most 255 bytes;
 * - an item at most 400 KB (its names and values, sized as DynamoDB does: dynamoMeasures.ts);
 * - a partition key value at most 2048 bytes, a sort key value at most 1024 bytes;
 * - TransactWriteItems and TransactGetItems: at most 100 actions, no two on one item; TransactWriteItems
 *   at most 4 MB in all (TransactGetItems' 4 MB is of the items it returns: not known before it is sent);
 * - BatchWriteItem at most 25 requests, BatchGetItem at most 100 keys (over all tables).
 *
 * The answers, what is counted and the order of the checks were calibrated against DynamoDB Local 3.3.1
 * (AWS's own engine; test/aws/dynamoLimits.local.test.ts sends every case to it, and to dynalite and moto
 * with this guard): the messages below are its words. Where its wording differs between expressions (an
 * Update or Projection expression's size message has no number) that is DynamoDB Local's, kept as is.
 * DynamoDB Local measures expressions and placeholders in characters, AWS documents bytes: this guard
 * counts UTF-8 bytes, which are the same for every expression DynamoDB can parse (placeholders and
 * unquoted names are ASCII; anything else is a syntax error).
 *
 * Not checked: syntax, the result of an UpdateItem (the item after the update: the engine itself must,
 * and dynalite does: "Item size to update has exceeded the maximum allowed size"), the size of a
 * response, and key sizes of secondary indexes.
 */
import {
  type AttributeValue,
  type CancellationReason,
  type DynamoDBClient,
  DynamoDBServiceException,
  TransactionCanceledException,
} from '@aws-sdk/client-dynamodb';
import { attributeValueSize, countOperators, type ExpressionKind, itemSize, utf8 } from './dynamoMeasures.ts';

export {
  attributeValueSize,
  countOperators,
  type ExpressionCounts,
  type ExpressionKind,
  itemSize,
  numberSize,
} from './dynamoMeasures.ts';

/** DynamoDB's documented limits, as this guard enforces them. */
export const DYNAMO_LIMITS = {
  expressionBytes: 4096,
  operators: 300,
  inOperands: 100,
  placeholderBytes: 255,
  itemBytes: 400 * 1024,
  partitionKeyBytes: 2048,
  sortKeyBytes: 1024,
  transactionActions: 100,
  transactionBytes: 4 * 1024 * 1024,
  batchWriteRequests: 25,
  batchGetKeys: 100,
} as const;

/** The table's key attributes (every table a guarded client reaches has the same ones). */
export interface KeyNames {
  readonly partition: string;
  readonly sort?: string;
}

export interface DynamoLimitsOptions {
  /** The tables' key attribute names; default `pk` and `sk` (the pool's table, shared/store/table.ts). */
  readonly keys?: KeyNames;
}

/** What DynamoDB answers a request it refuses: a ValidationException, or a cancelled transaction. */
export type Refusal =
  | { readonly name: 'ValidationException'; readonly message: string }
  | {
      readonly name: 'TransactionCanceledException';
      readonly message: string;
      readonly reasons: CancellationReason[];
    };

const GUARD_NAME = 'dynamoLimitsGuard';

/**
 * Adds the guard to `client` (and so to every DynamoDBDocumentClient made on it: they share its
 * middleware stack); adding it again is a no-op. Returns the client.
 *
 * Step: after the serializer (`serialize`, priority `low`). A DynamoDBDocumentClient marshals its input
 * just before the serializer (lib-dynamodb adds `DocumentMarshall` before `serializerMiddleware`), so an
 * `initialize` middleware of any priority sees its JavaScript values, not the AttributeValues DynamoDB
 * receives, and could not size an item. The request is still refused before anything is sent, and before
 * every `build` step (localTransactions.ts runs dynalite's transactions there).
 */
export function guardDynamoLimits(client: DynamoDBClient, options: DynamoLimitsOptions = {}): DynamoDBClient {
  const stack = client.middlewareStack;
  if (stack.identify().some((entry) => entry.startsWith(`${GUARD_NAME} `))) return client;
  const keys = options.keys ?? { partition: 'pk', sort: 'sk' };
  stack.add(
    (next, context) => async (args) => {
      const refusal = refusalOf(context.commandName ?? '', args.input, keys);
      if (refusal) throw errorOf(refusal);
      return next(args);
    },
    { step: 'serialize', priority: 'low', name: GUARD_NAME },
  );
  return client;
}

/** The error DynamoDB's answer becomes in the SDK (as its deserializer would build it). */
export function errorOf(refusal: Refusal): DynamoDBServiceException {
  const $metadata = { httpStatusCode: 400 };
  if (refusal.name === 'TransactionCanceledException') {
    return new TransactionCanceledException({
      message: refusal.message,
      $metadata,
      CancellationReasons: refusal.reasons,
    });
  }
  return new DynamoDBServiceException({
    name: 'ValidationException',
    $fault: 'client',
    $metadata,
    message: refusal.message,
  });
}

/**
 * DynamoDB's answer to `input` of the command `command` (the SDK's name: `PutItemCommand`...) when it
 * breaks a limit, else undefined. `input` is the wire form (AttributeValues). Other commands pass.
 */
export function refusalOf(command: string, input: unknown, keys: KeyNames): Refusal | undefined {
  const check = checks[command.replace(/Command$/, '')];
  const message = check?.(input as Input, keys);
  if (message === undefined) return undefined;
  return typeof message === 'string' ? { name: 'ValidationException', message } : message;
}

/**
 * DynamoDB's answer to one expression of a request (`field`: its parameter's name) that breaks a limit:
 * its size first, then its IN operands (found as it is parsed), then its operator count (counted after
 * the parse; DynamoDB stops at the first operator past 300, so it always says 301).
 */
export function expressionRefusal(
  field: string,
  expression: string,
  kind: ExpressionKind,
): string | undefined {
  const size = utf8(expression);
  if (size > DYNAMO_LIMITS.expressionBytes) {
    // DynamoDB Local gives the size for conditions only (Condition, Filter, KeyCondition expressions).
    const tail = kind === 'condition' ? ` expression size: ${size}` : '';
    return `Invalid ${field}: Expression size has exceeded the maximum allowed size;${tail}`;
  }
  if (kind === 'projection') return undefined;
  const counts = countOperators(expression, kind);
  const tooMany = counts.inOperands.find((n) => n > DYNAMO_LIMITS.inOperands);
  if (tooMany !== undefined) {
    return `Invalid ${field}: The IN operator is provided with too many operands; number of operands: ${tooMany}`;
  }
  if (counts.operators > DYNAMO_LIMITS.operators) {
    return `Invalid ${field}: The expression contains too many operators; operator count: ${DYNAMO_LIMITS.operators + 1}`;
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------------
// Requests

/** The parts of a request (or of a transaction's action) this guard reads. */
interface Input {
  TableName?: string;
  Key?: Record<string, AttributeValue>;
  Item?: Record<string, AttributeValue>;
  ConditionExpression?: string;
  UpdateExpression?: string;
  FilterExpression?: string;
  KeyConditionExpression?: string;
  ProjectionExpression?: string;
  ExpressionAttributeNames?: Record<string, string>;
  ExpressionAttributeValues?: Record<string, AttributeValue>;
  TransactItems?: Array<Record<string, Input | undefined>>;
  RequestItems?: Record<string, unknown>;
}

/** The expressions of a request, in the order DynamoDB checks them. */
const EXPRESSIONS: ReadonlyArray<readonly [keyof Input & `${string}Expression`, ExpressionKind]> = [
  ['UpdateExpression', 'update'],
  ['ConditionExpression', 'condition'],
  ['FilterExpression', 'condition'],
  ['ProjectionExpression', 'projection'],
  ['KeyConditionExpression', 'condition'],
];

/** Placeholders over 255 bytes: the names' first, then the values' (DynamoDB's order and words). */
function placeholderRefusal(input: Input): string | undefined {
  for (const key of Object.keys(input.ExpressionAttributeNames ?? {})) {
    const size = utf8(key);
    if (size > DYNAMO_LIMITS.placeholderBytes) {
      return `ExpressionAttributeNames contains invalid key: The expression attribute map contains a key that is too long; size of key: ${size}`;
    }
  }
  for (const key of Object.keys(input.ExpressionAttributeValues ?? {})) {
    if (utf8(key) > DYNAMO_LIMITS.placeholderBytes) {
      return 'ExpressionAttributeValues contains invalid key: The expression attribute map contains a key that is too long;';
    }
  }
  return undefined;
}

/** A request's placeholders, then each of its expressions. */
function expressionsRefusal(input: Input): string | undefined {
  const placeholders = placeholderRefusal(input);
  if (placeholders) return placeholders;
  for (const [field, kind] of EXPRESSIONS) {
    const expression = input[field];
    if (typeof expression !== 'string') continue;
    const refusal = expressionRefusal(field, expression, kind);
    if (refusal) return refusal;
  }
  return undefined;
}

const KEY_TOO_LARGE =
  'Hash primary key values must be under 2048 bytes, and range primary key values must be under 1024 bytes';
const ITEM_TOO_LARGE = 'Item size has exceeded the maximum allowed size';

/** Whether a key (or an item's key attributes) is over DynamoDB's key size limits. */
function keyTooLarge(key: Record<string, AttributeValue> | undefined, keys: KeyNames): boolean {
  if (!key) return false;
  const partition = key[keys.partition];
  const sort = keys.sort === undefined ? undefined : key[keys.sort];
  return (
    (partition !== undefined && attributeValueSize(partition) > DYNAMO_LIMITS.partitionKeyBytes) ||
    (sort !== undefined && attributeValueSize(sort) > DYNAMO_LIMITS.sortKeyBytes)
  );
}

/** Names the item an action is on (its table and key values), to find two actions on one item. */
function itemIdentity(
  table: string | undefined,
  key: Record<string, AttributeValue>,
  keys: KeyNames,
): string {
  const value = (v: AttributeValue | undefined) =>
    v === undefined
      ? ''
      : JSON.stringify(v, (_k, x) => (x instanceof Uint8Array ? Buffer.from(x).toString('base64') : x));
  return JSON.stringify([table ?? '', value(key[keys.partition]), keys.sort ? value(key[keys.sort]) : '']);
}

/**
 * A TransactWriteItems action's share of the transaction's 4 MB (calibrated: DynamoDB Local reports the
 * sum in its message): its item (Put) or key (the others), each expression's bytes, and for each use
 * of a placeholder in them its name's bytes or its value's size.
 */
function actionPayload(action: Input): number {
  let size = itemSize(action.Item ?? action.Key ?? {});
  for (const [field] of EXPRESSIONS) {
    const expression = action[field];
    if (typeof expression !== 'string') continue;
    size += utf8(expression);
    for (const [placeholder] of expression.matchAll(/[#:][A-Za-z0-9_]+/g)) {
      const name = action.ExpressionAttributeNames?.[placeholder];
      const value = action.ExpressionAttributeValues?.[placeholder];
      if (name !== undefined) size += utf8(name);
      else if (value !== undefined) size += attributeValueSize(value);
    }
  }
  return size;
}

const TRANSACTION_SAME_ITEM = 'Transaction request cannot include multiple operations on one item';
const TRANSACTION_TOO_MANY = `Member must have length less than or equal to ${DYNAMO_LIMITS.transactionActions}`;

/** A transaction's actions: what each `{ Put: {...} }` (Update, Delete, ConditionCheck, Get) holds. */
function actionsOf(input: Input): Input[] {
  return (input.TransactItems ?? []).map((entry) => Object.values(entry).find((a) => a !== undefined) ?? {});
}

/** A check per command (the SDK's name without `Command`): DynamoDB's answer, or undefined. */
const checks: Record<string, (input: Input, keys: KeyNames) => string | Refusal | undefined> = {
  PutItem(input, keys) {
    if (itemSize(input.Item ?? {}) > DYNAMO_LIMITS.itemBytes) return ITEM_TOO_LARGE;
    if (keyTooLarge(input.Item, keys)) return KEY_TOO_LARGE;
    return expressionsRefusal(input);
  },
  UpdateItem: keyThenExpressions,
  DeleteItem: keyThenExpressions,
  GetItem: keyThenExpressions,
  Query: (input) => expressionsRefusal(input),
  Scan: (input) => expressionsRefusal(input),

  BatchWriteItem(input, keys) {
    const requests = Object.values(input.RequestItems ?? {}).flatMap(
      (list) => (list ?? []) as Array<{ PutRequest?: Input; DeleteRequest?: Input }>,
    );
    // DynamoDB sizes the items before it counts the requests, and checks keys after.
    for (const r of requests) {
      if (r.PutRequest?.Item && itemSize(r.PutRequest.Item) > DYNAMO_LIMITS.itemBytes) return ITEM_TOO_LARGE;
    }
    if (requests.length > DYNAMO_LIMITS.batchWriteRequests) {
      return 'Too many items requested for the BatchWriteItem call';
    }
    for (const r of requests) {
      if (keyTooLarge(r.PutRequest?.Item ?? r.DeleteRequest?.Key, keys)) return KEY_TOO_LARGE;
    }
    return undefined;
  },

  BatchGetItem(input, keys) {
    const tables = Object.values(input.RequestItems ?? {}) as Input[];
    const keyCount = tables.reduce((sum, t) => sum + ((t as { Keys?: unknown[] }).Keys?.length ?? 0), 0);
    if (keyCount > DYNAMO_LIMITS.batchGetKeys) return 'Too many items requested for the BatchGetItem call';
    for (const t of tables) {
      for (const key of (t as { Keys?: Array<Record<string, AttributeValue>> }).Keys ?? []) {
        if (keyTooLarge(key, keys)) return KEY_TOO_LARGE;
      }
      const refusal = expressionsRefusal(t);
      if (refusal) return refusal;
    }
    return undefined;
  },

  TransactGetItems(input, keys) {
    const actions = actionsOf(input);
    if (actions.length > DYNAMO_LIMITS.transactionActions) return TRANSACTION_TOO_MANY;
    for (const action of actions) {
      if (keyTooLarge(action.Key, keys)) return KEY_TOO_LARGE;
      const refusal = expressionsRefusal(action);
      if (refusal) return refusal;
    }
    return sameItemRefusal(actions, keys);
  },

  /**
   * DynamoDB's order (calibrated): the count of actions; the payload; each action in turn (its item,
   * placeholders and expressions); then the keys, as a cancelled transaction with a reason per action;
   * then two actions on one item.
   */
  TransactWriteItems(input, keys) {
    const actions = actionsOf(input);
    if (actions.length > DYNAMO_LIMITS.transactionActions) return TRANSACTION_TOO_MANY;
    const payload = actions.reduce((sum, action) => sum + actionPayload(action), 0);
    if (payload > DYNAMO_LIMITS.transactionBytes) {
      return `Transaction payload size cannot exceed 4MB. Payload Size: ${payload}`;
    }
    for (const action of actions) {
      if (action.Item && itemSize(action.Item) > DYNAMO_LIMITS.itemBytes) return ITEM_TOO_LARGE;
      const refusal = expressionsRefusal(action);
      if (refusal) return refusal;
    }
    const badKeys = actions.map((action) => keyTooLarge(action.Item ?? action.Key, keys));
    if (badKeys.some(Boolean)) {
      const codes = badKeys.map((bad) => (bad ? 'ValidationError' : 'None'));
      return {
        name: 'TransactionCanceledException',
        message: `Transaction cancelled, please refer cancellation reasons for specific reasons [${codes.join(', ')}]`,
        reasons: badKeys.map((bad) =>
          bad ? { Code: 'ValidationError', Message: KEY_TOO_LARGE } : { Code: 'None' },
        ),
      };
    }
    return sameItemRefusal(actions, keys);
  },
};

function keyThenExpressions(input: Input, keys: KeyNames): string | undefined {
  if (keyTooLarge(input.Key, keys)) return KEY_TOO_LARGE;
  return expressionsRefusal(input);
}

function sameItemRefusal(actions: Input[], keys: KeyNames): string | undefined {
  const seen = new Set<string>();
  for (const action of actions) {
    const key = action.Item ?? action.Key;
    if (!key) continue;
    const identity = itemIdentity(action.TableName, key, keys);
    if (seen.has(identity)) return TRANSACTION_SAME_ITEM;
    seen.add(identity);
  }
  return undefined;
}
