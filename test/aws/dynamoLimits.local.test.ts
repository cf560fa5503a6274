import {
  type AttributeValue,
  BatchGetItemCommand,
  BatchWriteItemCommand,
  CreateTableCommand,
  DeleteItemCommand,
  DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  QueryCommand,
  type TransactGetItem,
  TransactGetItemsCommand,
  type TransactWriteItem,
  TransactWriteItemsCommand,
  UpdateItemCommand,
} from '@aws-sdk/client-dynamodb';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { guardDynamoLimits } from '../../shared/runtime/dynamoLimits.ts';
import { localDynamoClient, localEngineClientConfig, startDynalite } from '../../shared/runtime/engines.ts';
import { tableDefinition } from '../../shared/store/table.ts';
import {
  type DynamoDbLocal,
  describeWithDynamoDbLocal,
  startDynamoDbLocal,
} from '../../testkit/dynamoDbLocal.ts';
import { MOTO_CREDENTIALS, motoUnavailable, startMoto } from '../../testkit/moto.ts';

/**
 * The limits guard (shared/runtime/dynamoLimits.ts) against AWS's own engine: each request that breaks a
 * DynamoDB limit is refused by DynamoDB Local as it is (no guard), and by dynalite and moto with the
 * guard, with the same error and words; and a request just under the limit is accepted by all three.
 * dynalite's client is the pool's (engines.ts localDynamoClient: its transactions run by
 * localTransactions.ts); moto joins where it is installed.
 */

const TABLE = 'limits';
/** Every send, and so every case, may take a few seconds on a busy machine (4 MB transactions). */
const CASE_TIMEOUT = 60_000;

interface Target {
  readonly name: string;
  readonly client: DynamoDBClient;
  /** Operations the engine does not have (the guard's part is then that it lets the request through). */
  readonly lacks: ReadonlySet<string>;
  stop(): Promise<void>;
}

/** What a request came to: accepted, or the error's name, message and cancellation reason codes. */
interface Outcome {
  readonly ok?: true;
  readonly name?: string;
  readonly message?: string;
  readonly reasons?: string[];
  /** The HTTP status of an error (kept apart: compared only where a case says). */
  readonly status?: number;
}

type AnyCommand =
  | PutItemCommand
  | UpdateItemCommand
  | GetItemCommand
  | QueryCommand
  | BatchGetItemCommand
  | BatchWriteItemCommand
  | TransactGetItemsCommand
  | TransactWriteItemsCommand;

async function outcome(client: DynamoDBClient, command: AnyCommand): Promise<Outcome> {
  try {
    await client.send(command as never);
    return { ok: true };
  } catch (err) {
    const e = err as Error & {
      CancellationReasons?: Array<{ Code?: string }>;
      $metadata?: { httpStatusCode?: number };
    };
    return {
      name: e.name,
      message: e.message,
      ...(e.CancellationReasons ? { reasons: e.CancellationReasons.map((r) => r.Code ?? '') } : {}),
      ...(e.$metadata?.httpStatusCode ? { status: e.$metadata.httpStatusCode } : {}),
    };
  }
}

/** An outcome without its status, to compare with a case's. */
const answer = ({ status: _status, ...rest }: Outcome): Outcome => rest;

const key = (pk: string, sk = 's'): Record<string, AttributeValue> => ({ pk: { S: pk }, sk: { S: sk } });
const pad = (expression: string, bytes: number) => expression + ' '.repeat(bytes - expression.length);
const item = (pk: string, bytes: number): Record<string, AttributeValue> => {
  const base = key(pk);
  const fixed = 2 + pk.length + 2 + 1 + 1; // pk, sk ('s') and the name d
  return { ...base, d: { S: 'x'.repeat(bytes - fixed) } };
};

/**
 * A limit: a request just under it (`under(run)`, `run` a name unique per engine and case, for fresh
 * keys) and one just over, and DynamoDB's answer to the one over (what DynamoDB Local answers; asserted).
 */
interface Case {
  readonly limit: string;
  readonly under: (run: string) => AnyCommand;
  readonly over: (run: string) => AnyCommand;
  readonly refused: Outcome;
  /**
   * Where moto refuses the request under the limit, which DynamoDB accepts: what it answers, and why
   * (moto 5.2.1's own stricter limits). Asserted, so that a moto that stops doing it is noticed.
   */
  readonly motoUnder?: { readonly why: string; readonly answer: Outcome };
}

const MOTO_ITEM_LIMIT = {
  why: "moto refuses items over 405,000 bytes by its own measure (dynamo_type.py: 'to be safe')",
  answer: {
    name: 'ValidationException',
    message: 'Item size has exceeded the maximum allowed size',
    status: 400,
  },
};

const KEY_TOO_LARGE =
  'Hash primary key values must be under 2048 bytes, and range primary key values must be under 1024 bytes';
const validation = (message: string): Outcome => ({ name: 'ValidationException', message });

const cases: Case[] = [
  {
    limit: 'ConditionExpression of 4 KB',
    under: (r) =>
      new PutItemCommand({
        TableName: TABLE,
        Item: key(r),
        ConditionExpression: pad('attribute_not_exists(nope)', 4096),
      }),
    over: (r) =>
      new PutItemCommand({
        TableName: TABLE,
        Item: key(r),
        ConditionExpression: pad('attribute_not_exists(nope)', 4097),
      }),
    refused: validation(
      'Invalid ConditionExpression: Expression size has exceeded the maximum allowed size; expression size: 4097',
    ),
  },
  {
    limit: 'UpdateExpression of 4 KB',
    under: (r) =>
      new UpdateItemCommand({
        TableName: TABLE,
        Key: key(r),
        UpdateExpression: pad('SET a = :v', 4096),
        ExpressionAttributeValues: { ':v': { N: '1' } },
      }),
    over: (r) =>
      new UpdateItemCommand({
        TableName: TABLE,
        Key: key(r),
        UpdateExpression: pad('SET a = :v', 4097),
        ExpressionAttributeValues: { ':v': { N: '1' } },
      }),
    refused: validation('Invalid UpdateExpression: Expression size has exceeded the maximum allowed size;'),
  },
  {
    limit: 'KeyConditionExpression of 4 KB',
    under: (r) =>
      new QueryCommand({
        TableName: TABLE,
        KeyConditionExpression: pad('pk = :p', 4096),
        ExpressionAttributeValues: { ':p': { S: r } },
      }),
    over: (r) =>
      new QueryCommand({
        TableName: TABLE,
        KeyConditionExpression: pad('pk = :p', 4097),
        ExpressionAttributeValues: { ':p': { S: r } },
      }),
    refused: validation(
      'Invalid KeyConditionExpression: Expression size has exceeded the maximum allowed size; expression size: 4097',
    ),
  },
  {
    limit: 'FilterExpression of 4 KB',
    under: (r) =>
      new QueryCommand({
        TableName: TABLE,
        KeyConditionExpression: 'pk = :p',
        FilterExpression: pad('a = :v', 4096),
        ExpressionAttributeValues: { ':p': { S: r }, ':v': { N: '1' } },
      }),
    over: (r) =>
      new QueryCommand({
        TableName: TABLE,
        KeyConditionExpression: 'pk = :p',
        FilterExpression: pad('a = :v', 4097),
        ExpressionAttributeValues: { ':p': { S: r }, ':v': { N: '1' } },
      }),
    refused: validation(
      'Invalid FilterExpression: Expression size has exceeded the maximum allowed size; expression size: 4097',
    ),
  },
  {
    limit: 'ProjectionExpression of 4 KB',
    under: (r) => new GetItemCommand({ TableName: TABLE, Key: key(r), ProjectionExpression: pad('a', 4096) }),
    over: (r) => new GetItemCommand({ TableName: TABLE, Key: key(r), ProjectionExpression: pad('a', 4097) }),
    refused: validation(
      'Invalid ProjectionExpression: Expression size has exceeded the maximum allowed size;',
    ),
  },
  {
    limit: 'an expression of 4 KB in a write transaction',
    under: (r) => transactUpdate(r, pad('SET a = :v', 4096)),
    over: (r) => transactUpdate(r, pad('SET a = :v', 4097)),
    refused: validation('Invalid UpdateExpression: Expression size has exceeded the maximum allowed size;'),
  },
  {
    limit: "BatchGetItem's ProjectionExpression of 4 KB",
    under: (r) =>
      new BatchGetItemCommand({
        RequestItems: { [TABLE]: { Keys: [key(r)], ProjectionExpression: pad('a', 4096) } },
      }),
    over: (r) =>
      new BatchGetItemCommand({
        RequestItems: { [TABLE]: { Keys: [key(r)], ProjectionExpression: pad('a', 4097) } },
      }),
    refused: validation(
      'Invalid ProjectionExpression: Expression size has exceeded the maximum allowed size;',
    ),
  },
  {
    limit: '300 operators in a ConditionExpression (150 comparisons, 149 OR, NOT)',
    // True for a new item: NOT of a comparison with an attribute it does not have.
    under: (r) => conditionalPut(r, comparisons(1)),
    over: (r) => conditionalPut(r, comparisons(2)),
    refused: validation(
      'Invalid ConditionExpression: The expression contains too many operators; operator count: 301',
    ),
  },
  {
    limit: '300 operators in a FilterExpression',
    under: (r) => queryFilter(r, comparisons(1)),
    over: (r) => queryFilter(r, comparisons(2)),
    refused: validation(
      'Invalid FilterExpression: The expression contains too many operators; operator count: 301',
    ),
  },
  {
    limit: '300 operators (+) in an UpdateExpression',
    under: (r) => setSums(r, 300),
    over: (r) => setSums(r, 301),
    refused: validation(
      'Invalid UpdateExpression: The expression contains too many operators; operator count: 301',
    ),
    motoUnder: {
      why: 'moto answers HTTP 500 (an HTML page) to a SET of some 200 clauses or more (its parser fails)',
      answer: { name: 'SyntaxError', status: 500 },
    },
  },
  {
    limit: '100 operands of IN',
    under: (r) => queryFilter(r, `a IN (${Array(100).fill(':v').join(', ')})`),
    over: (r) => queryFilter(r, `a IN (${Array(101).fill(':v').join(', ')})`),
    refused: validation(
      'Invalid FilterExpression: The IN operator is provided with too many operands; number of operands: 101',
    ),
  },
  {
    limit: 'an ExpressionAttributeNames key of 255 bytes',
    under: (r) => projectName(r, 255),
    over: (r) => projectName(r, 256),
    refused: validation(
      'ExpressionAttributeNames contains invalid key: The expression attribute map contains a key that is too long; size of key: 256',
    ),
  },
  {
    limit: 'an ExpressionAttributeValues key of 255 bytes',
    under: (r) => conditionValue(r, 255),
    over: (r) => conditionValue(r, 256),
    refused: validation(
      'ExpressionAttributeValues contains invalid key: The expression attribute map contains a key that is too long;',
    ),
  },
  {
    limit: 'an item of 400 KB (PutItem)',
    under: (r) => new PutItemCommand({ TableName: TABLE, Item: item(r, 409_600) }),
    over: (r) => new PutItemCommand({ TableName: TABLE, Item: item(r, 409_601) }),
    refused: validation('Item size has exceeded the maximum allowed size'),
    motoUnder: MOTO_ITEM_LIMIT,
  },
  {
    limit: 'an item of 400 KB (a write transaction)',
    under: (r) =>
      new TransactWriteItemsCommand({
        TransactItems: [{ Put: { TableName: TABLE, Item: item(r, 409_600) } }],
      }),
    over: (r) =>
      new TransactWriteItemsCommand({
        TransactItems: [{ Put: { TableName: TABLE, Item: item(r, 409_601) } }],
      }),
    refused: validation('Item size has exceeded the maximum allowed size'),
    motoUnder: MOTO_ITEM_LIMIT,
  },
  {
    limit: 'an item of 400 KB (BatchWriteItem)',
    under: (r) =>
      new BatchWriteItemCommand({ RequestItems: { [TABLE]: [{ PutRequest: { Item: item(r, 409_600) } }] } }),
    over: (r) =>
      new BatchWriteItemCommand({ RequestItems: { [TABLE]: [{ PutRequest: { Item: item(r, 409_601) } }] } }),
    refused: validation('Item size has exceeded the maximum allowed size'),
    motoUnder: MOTO_ITEM_LIMIT,
  },
  {
    limit: 'a partition key of 2048 bytes (PutItem)',
    under: (r) => new PutItemCommand({ TableName: TABLE, Item: key(r.padEnd(2048, 'p')) }),
    over: (r) => new PutItemCommand({ TableName: TABLE, Item: key(r.padEnd(2049, 'p')) }),
    refused: validation(KEY_TOO_LARGE),
  },
  {
    limit: 'a sort key of 1024 bytes (GetItem)',
    under: (r) => new GetItemCommand({ TableName: TABLE, Key: key(r, 's'.repeat(1024)) }),
    over: (r) => new GetItemCommand({ TableName: TABLE, Key: key(r, 's'.repeat(1025)) }),
    refused: validation(KEY_TOO_LARGE),
  },
  {
    limit: 'a partition key of 2048 bytes (BatchWriteItem)',
    under: (r) =>
      new BatchWriteItemCommand({
        RequestItems: { [TABLE]: [{ DeleteRequest: { Key: key(r.padEnd(2048, 'p')) } }] },
      }),
    over: (r) =>
      new BatchWriteItemCommand({
        RequestItems: { [TABLE]: [{ DeleteRequest: { Key: key(r.padEnd(2049, 'p')) } }] },
      }),
    refused: validation(KEY_TOO_LARGE),
  },
  {
    limit: 'a sort key of 1024 bytes (a write transaction: cancelled)',
    under: (r) =>
      new TransactWriteItemsCommand({
        TransactItems: [
          { Put: { TableName: TABLE, Item: key(`${r}-a`) } },
          { Delete: { TableName: TABLE, Key: key(r, 's'.repeat(1024)) } },
        ],
      }),
    over: (r) =>
      new TransactWriteItemsCommand({
        TransactItems: [
          { Put: { TableName: TABLE, Item: key(`${r}-a`) } },
          { Delete: { TableName: TABLE, Key: key(r, 's'.repeat(1025)) } },
        ],
      }),
    refused: {
      name: 'TransactionCanceledException',
      message:
        'Transaction cancelled, please refer cancellation reasons for specific reasons [None, ValidationError]',
      reasons: ['None', 'ValidationError'],
    },
  },
  {
    limit: '100 actions of a write transaction',
    under: (r) => new TransactWriteItemsCommand({ TransactItems: puts(r, 100) }),
    over: (r) => new TransactWriteItemsCommand({ TransactItems: puts(r, 101) }),
    refused: validation('Member must have length less than or equal to 100'),
  },
  {
    limit: '100 actions of a read transaction',
    under: (r) => new TransactGetItemsCommand({ TransactItems: gets(r, 100) }),
    over: (r) => new TransactGetItemsCommand({ TransactItems: gets(r, 101) }),
    refused: validation('Member must have length less than or equal to 100'),
    motoUnder: {
      why: "moto allows 25 actions in a TransactGetItems, DynamoDB's limit before 2022 (responses.py)",
      answer: { name: 'ValidationException', status: 400 },
    },
  },
  {
    limit: '4 MB of a write transaction',
    under: (r) => new TransactWriteItemsCommand({ TransactItems: fourMegabytes(r, 0) }),
    over: (r) => new TransactWriteItemsCommand({ TransactItems: fourMegabytes(r, 1) }),
    refused: validation('Transaction payload size cannot exceed 4MB. Payload Size: 4194305'),
  },
  {
    limit: 'one action per item in a write transaction',
    under: (r) =>
      new TransactWriteItemsCommand({
        TransactItems: [
          { Put: { TableName: TABLE, Item: key(r) } },
          { Delete: { TableName: TABLE, Key: key(r, 't') } },
        ],
      }),
    over: (r) =>
      new TransactWriteItemsCommand({
        TransactItems: [
          { Put: { TableName: TABLE, Item: key(r) } },
          { Delete: { TableName: TABLE, Key: key(r) } },
        ],
      }),
    refused: validation('Transaction request cannot include multiple operations on one item'),
  },
  {
    limit: 'one action per item in a read transaction',
    under: (r) =>
      new TransactGetItemsCommand({
        TransactItems: [
          { Get: { TableName: TABLE, Key: key(r) } },
          { Get: { TableName: TABLE, Key: key(r, 't') } },
        ],
      }),
    over: (r) =>
      new TransactGetItemsCommand({
        TransactItems: [
          { Get: { TableName: TABLE, Key: key(r) } },
          { Get: { TableName: TABLE, Key: key(r) } },
        ],
      }),
    refused: validation('Transaction request cannot include multiple operations on one item'),
  },
  {
    limit: '25 requests of BatchWriteItem',
    under: (r) => batchWrite(r, 25),
    over: (r) => batchWrite(r, 26),
    refused: validation('Too many items requested for the BatchWriteItem call'),
  },
  {
    limit: '100 keys of BatchGetItem',
    under: (r) => batchGet(r, 100),
    over: (r) => batchGet(r, 101),
    refused: validation('Too many items requested for the BatchGetItem call'),
  },
];

function transactUpdate(r: string, updateExpression: string) {
  return new TransactWriteItemsCommand({
    TransactItems: [
      {
        Update: {
          TableName: TABLE,
          Key: key(r),
          UpdateExpression: updateExpression,
          ExpressionAttributeValues: { ':v': { N: '1' } },
        },
      },
    ],
  });
}

/** 150 comparisons of an attribute no item has, joined by OR, the first `nots` negated: 299 + nots operators. */
function comparisons(nots: number): string {
  return Array.from({ length: 150 }, (_, i) => (i < nots ? 'NOT a = :v' : 'a = :v')).join(' OR ');
}

function conditionalPut(r: string, condition: string) {
  return new PutItemCommand({
    TableName: TABLE,
    Item: key(r),
    ConditionExpression: condition,
    ExpressionAttributeValues: { ':v': { N: '1' } },
  });
}

function queryFilter(r: string, filter: string) {
  return new QueryCommand({
    TableName: TABLE,
    KeyConditionExpression: 'pk = :p',
    FilterExpression: filter,
    ExpressionAttributeValues: { ':p': { S: r }, ':v': { N: '1' } },
  });
}

/** SET of `n` attributes, each `:v + :v`: n operators. */
function setSums(r: string, n: number) {
  return new UpdateItemCommand({
    TableName: TABLE,
    Key: key(r),
    UpdateExpression: `SET ${Array.from({ length: n }, (_, i) => `a${i}=:v+:v`).join(',')}`,
    ExpressionAttributeValues: { ':v': { N: '1' } },
  });
}

/** A GetItem projecting one attribute through a name placeholder of `bytes` bytes. */
function projectName(r: string, bytes: number) {
  const placeholder = `#${'n'.repeat(bytes - 1)}`;
  return new GetItemCommand({
    TableName: TABLE,
    Key: key(r),
    ProjectionExpression: placeholder,
    ExpressionAttributeNames: { [placeholder]: 'a' },
  });
}

/** A PutItem whose condition uses a value placeholder of `bytes` bytes. */
function conditionValue(r: string, bytes: number) {
  const placeholder = `:${'v'.repeat(bytes - 1)}`;
  return new PutItemCommand({
    TableName: TABLE,
    Item: key(r),
    ConditionExpression: `attribute_not_exists(nope) OR nope = ${placeholder}`,
    ExpressionAttributeValues: { [placeholder]: { N: '1' } },
  });
}

function puts(r: string, n: number): TransactWriteItem[] {
  return Array.from({ length: n }, (_, i) => ({ Put: { TableName: TABLE, Item: key(`${r}-${i}`) } }));
}

function gets(r: string, n: number): TransactGetItem[] {
  return Array.from({ length: n }, (_, i) => ({ Get: { TableName: TABLE, Key: key(`${r}-${i}`) } }));
}

/**
 * Ten items of 404,000 bytes (under moto's own item limit) and an update, 4,194,304 bytes and `extra`
 * more as DynamoDB sizes a transaction (its items, the update's key, expression and value; dynamoLimits.ts
 * actionPayload).
 */
function fourMegabytes(r: string, extra: number): TransactWriteItem[] {
  const ten = Array.from({ length: 10 }, (_, i) => ({
    Put: { TableName: TABLE, Item: item(`${r}-${i}`, 404_000) },
  }));
  const updateKey = key(`${r}-u`);
  const keyBytes = 2 + r.length + 2 + 2 + 1;
  const expression = 'SET a=:v';
  const value = 4 * 1024 * 1024 - 10 * 404_000 - keyBytes - expression.length + extra;
  return [
    ...ten,
    {
      Update: {
        TableName: TABLE,
        Key: updateKey,
        UpdateExpression: expression,
        ExpressionAttributeValues: { ':v': { S: 'y'.repeat(value) } },
      },
    },
  ];
}

function batchWrite(r: string, n: number) {
  return new BatchWriteItemCommand({
    RequestItems: {
      [TABLE]: Array.from({ length: n }, (_, i) => ({ PutRequest: { Item: key(`${r}-${i}`) } })),
    },
  });
}

function batchGet(r: string, n: number) {
  return new BatchGetItemCommand({
    RequestItems: { [TABLE]: { Keys: Array.from({ length: n }, (_, i) => key(`${r}-${i}`)) } },
  });
}

describeWithDynamoDbLocal('DynamoDB limits: DynamoDB Local, and dynalite and moto with the guard', () => {
  let local: DynamoDbLocal | undefined;
  const targets: Target[] = [];

  beforeAll(async () => {
    const started: Array<Promise<Target>> = [
      startDynamoDbLocal().then((l) => {
        local = l;
        return { name: 'DynamoDB Local', client: l.client, lacks: new Set<string>(), stop: () => l.stop() };
      }),
      startDynalite().then((engine) => {
        const { client } = localDynamoClient(
          localEngineClientConfig(engine.endpoint, 'us-east-1'),
          engine.endpoint,
        );
        return {
          name: 'dynalite',
          client: guardDynamoLimits(client),
          // dynalite has no TransactGetItems (its TransactWriteItems is localTransactions.ts').
          lacks: new Set(['TransactGetItemsCommand']),
          stop: async () => {
            client.destroy();
            await engine.close();
          },
        };
      }),
    ];
    const why = motoUnavailable();
    if (why === undefined) {
      started.push(
        startMoto().then((moto) => {
          const client = new DynamoDBClient({
            region: 'us-east-1',
            credentials: MOTO_CREDENTIALS,
            endpoint: moto.endpoint,
          });
          return {
            name: 'moto',
            client: guardDynamoLimits(client),
            lacks: new Set<string>(),
            stop: async () => {
              client.destroy();
              await moto.stop();
            },
          };
        }),
      );
    } else {
      console.warn(`DynamoDB limits: moto left out: ${why}`);
    }
    const settled = await Promise.allSettled(started);
    for (const s of settled) if (s.status === 'fulfilled') targets.push(s.value);
    const failed = settled.find((s) => s.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    await Promise.all(
      targets.map((t) => t.client.send(new CreateTableCommand({ TableName: TABLE, ...tableDefinition }))),
    );
  });

  afterAll(async () => {
    await Promise.all(targets.map((t) => t.stop()));
    if (local && !targets.some((t) => t.name === 'DynamoDB Local')) await local.stop();
  });

  it.each(cases.map((c) => [c.limit, c] as const))(
    '%s',
    async (_limit, c) => {
      const results = await Promise.all(
        targets.map(async (t, i) => {
          const run = `${c.limit.replace(/\W+/g, '-')}-${i}`;
          const over = answer(await outcome(t.client, c.over(run)));
          const underCommand = c.under(run);
          let under = await outcome(t.client, underCommand);
          // An operation the engine lacks: the guard's part is that it let the request through.
          if (t.lacks.has(underCommand.constructor.name) && under.name === 'UnknownOperationException')
            under = { ok: true };
          return { target: t.name, over, under };
        }),
      );
      // Refused just over the limit by DynamoDB Local itself, and with its words by the others' guard.
      expect(results.map((r) => [r.target, r.over])).toEqual(results.map((r) => [r.target, c.refused]));
      // Accepted just under it (but where moto is stricter than DynamoDB, as the case says).
      for (const r of results) {
        const expected = r.target === 'moto' && c.motoUnder ? c.motoUnder.answer : { ok: true };
        expect([r.target, r.under]).toMatchObject([r.target, expected]);
      }
    },
    CASE_TIMEOUT,
  );

  it(
    'is not needed for what dynalite and moto refuse themselves: an item over 400 KB after an update',
    async () => {
      // The guard does not size the item an UpdateItem makes (it has not read it): the engines do.
      const results = await Promise.all(
        targets.map(async (t) => {
          await t.client.send(new PutItemCommand({ TableName: TABLE, Item: item('grown', 300_000) }));
          const grown = await outcome(
            t.client,
            new UpdateItemCommand({
              TableName: TABLE,
              Key: key('grown'),
              UpdateExpression: 'SET e = :v',
              ExpressionAttributeValues: { ':v': { S: 'y'.repeat(200_000) } },
            }),
          );
          await t.client.send(new DeleteItemCommand({ TableName: TABLE, Key: key('grown') }));
          return [t.name, grown.name] as const;
        }),
      );
      expect(results).toEqual(results.map(([name]) => [name, 'ValidationException']));
    },
    CASE_TIMEOUT,
  );
});
