import {
  type AttributeValue,
  BatchGetItemCommand,
  BatchWriteItemCommand,
  DynamoDBClient,
  type DynamoDBClientConfig,
  DynamoDBServiceException,
  GetItemCommand,
  PutItemCommand,
  TransactionCanceledException,
  type TransactWriteItem,
  TransactWriteItemsCommand,
} from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient, PutCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { describe, expect, it } from 'vitest';
import {
  attributeValueSize,
  countOperators,
  DYNAMO_LIMITS,
  guardDynamoLimits,
  itemSize,
  numberSize,
  refusalOf,
} from '../../shared/runtime/dynamoLimits.ts';

/**
 * The DynamoDB limits guard as pure checks (each limit just under and just over), and as installed on a
 * client: DynamoDB's error, nothing sent, installed once, and the marshalled input of a document client.
 * The numbers and words are DynamoDB Local's (test/aws/dynamoLimits.local.test.ts sends the same cases
 * to it).
 */

const KEYS = { partition: 'pk', sort: 'sk' };
const T = 'pool';
const key = (pk = 'p', sk = 's'): Record<string, AttributeValue> => ({ pk: { S: pk }, sk: { S: sk } });
const refusal = (command: string, input: object) => refusalOf(command, input, KEYS);
const message = (command: string, input: object) => refusal(command, input)?.message;
const pad = (expression: string, bytes: number) => expression + ' '.repeat(bytes - expression.length);

describe('expression size', () => {
  it('accepts 4096 bytes and refuses 4097, in DynamoDB words for each expression', () => {
    const put = (bytes: number) => ({
      TableName: T,
      Item: key(),
      ConditionExpression: pad('attribute_not_exists(pk)', bytes),
    });
    expect(refusal('PutItemCommand', put(4096))).toBeUndefined();
    expect(message('PutItemCommand', put(4097))).toBe(
      'Invalid ConditionExpression: Expression size has exceeded the maximum allowed size; expression size: 4097',
    );
    const update = (bytes: number) => ({
      TableName: T,
      Key: key(),
      UpdateExpression: pad('SET a = :v', bytes),
      ExpressionAttributeValues: { ':v': { N: '1' } },
    });
    expect(refusal('UpdateItemCommand', update(4096))).toBeUndefined();
    expect(message('UpdateItemCommand', update(4097))).toBe(
      'Invalid UpdateExpression: Expression size has exceeded the maximum allowed size;',
    );
    expect(
      message('GetItemCommand', { TableName: T, Key: key(), ProjectionExpression: pad('a', 4097) }),
    ).toBe('Invalid ProjectionExpression: Expression size has exceeded the maximum allowed size;');
    const values = { ':v': { S: 'x' } };
    expect(
      message('QueryCommand', {
        TableName: T,
        KeyConditionExpression: pad('pk = :v', 4097),
        ExpressionAttributeValues: values,
      }),
    ).toBe(
      'Invalid KeyConditionExpression: Expression size has exceeded the maximum allowed size; expression size: 4097',
    );
    expect(
      message('ScanCommand', {
        TableName: T,
        FilterExpression: pad('a = :v', 4100),
        ExpressionAttributeValues: values,
      }),
    ).toBe(
      'Invalid FilterExpression: Expression size has exceeded the maximum allowed size; expression size: 4100',
    );
  });

  it('counts UTF-8 bytes', () => {
    const expression = `${pad('a = :v', 4095)}é`; // 4096 characters, 4097 bytes
    expect(message('ScanCommand', { TableName: T, FilterExpression: expression })).toMatch(
      /expression size: 4097$/,
    );
  });

  it('checks the filter, then the projection, then the key condition of a query (DynamoDB order)', () => {
    const long = pad('a', 4097);
    expect(
      message('QueryCommand', {
        TableName: T,
        KeyConditionExpression: long,
        FilterExpression: long,
        ProjectionExpression: long,
      }),
    ).toMatch(/^Invalid FilterExpression/);
    expect(
      message('QueryCommand', { TableName: T, KeyConditionExpression: long, ProjectionExpression: long }),
    ).toMatch(/^Invalid ProjectionExpression/);
  });

  it('checks the expressions of a transaction action, and the projection of a batch get', () => {
    const actions: TransactWriteItem[] = [
      {
        ConditionCheck: { TableName: T, Key: key(), ConditionExpression: pad('attribute_exists(pk)', 4120) },
      },
    ];
    expect(message('TransactWriteItemsCommand', { TransactItems: actions })).toMatch(
      /expression size: 4120$/,
    );
    expect(
      message('TransactGetItemsCommand', {
        TransactItems: [{ Get: { TableName: T, Key: key(), ProjectionExpression: pad('a', 4097) } }],
      }),
    ).toMatch(/^Invalid ProjectionExpression/);
    expect(
      message('BatchGetItemCommand', {
        RequestItems: { [T]: { Keys: [key()], ProjectionExpression: pad('a', 4097) } },
      }),
    ).toMatch(/^Invalid ProjectionExpression/);
  });
});

describe('operators', () => {
  it('counts what DynamoDB counts (calibrated on DynamoDB Local)', () => {
    const condition: Array<[string, number]> = [
      ['#a = :v', 1],
      ['#a <> :v', 1],
      ['#a <= :v AND #b >= :w', 3],
      ['#a BETWEEN :v AND :w', 1],
      ['#a IN (:v, :w, :x)', 1],
      ['attribute_exists(#a)', 1],
      ['attribute_not_exists(#a)', 1],
      ['attribute_type(#a, :s)', 1],
      ['begins_with(#a, :s)', 1],
      ['contains(#a, :s)', 1],
      ['size(#a) = :v', 2],
      ['size(#a) > size(#b)', 3],
      ['#a.#b[1].c = :v', 1],
      ['(#a = :v) OR (#b = :v)', 3],
      ['NOT NOT (#a = #b)', 3],
      ['#a BETWEEN size(#b) AND :v AND #c = :w', 4],
      ['#a = :v and #b = :w or not #c = :x', 6],
    ];
    for (const [expression, n] of condition) {
      expect([expression, countOperators(expression, 'condition').operators]).toEqual([expression, n]);
    }
    const update: Array<[string, number]> = [
      ['SET a = :v, b = :w', 0],
      ['SET a = a + :v', 1],
      ['SET a = a - :v', 1],
      ['SET a = if_not_exists(b, :v)', 1],
      ['SET a = list_append(:l, :l)', 1],
      ['SET a = if_not_exists(b, :v) + :v', 2],
      ['SET a = list_append(if_not_exists(b, :l), :l)', 2],
      ['REMOVE a, b ADD c :v DELETE d :s', 0],
    ];
    for (const [expression, n] of update) {
      expect([expression, countOperators(expression, 'update').operators]).toEqual([expression, n]);
    }
  });

  it('accepts 300 and refuses 301, in a condition and in an update', () => {
    const condition = (n: number) => Array(n).fill('#a = :v').join(' OR ');
    const names = { '#a': 'a' };
    const values = { ':v': { N: '1' } };
    const put = (expression: string) => ({
      TableName: T,
      Item: key(),
      ConditionExpression: expression,
      ExpressionAttributeNames: names,
      ExpressionAttributeValues: values,
    });
    expect(refusal('PutItemCommand', put(condition(150)))).toBeUndefined(); // 150 = and 149 OR
    expect(message('PutItemCommand', put(condition(151)))).toBe(
      'Invalid ConditionExpression: The expression contains too many operators; operator count: 301',
    );
    expect(refusal('PutItemCommand', put(`${'NOT '.repeat(299)}#a = :v`))).toBeUndefined();
    expect(message('PutItemCommand', put(`${'NOT '.repeat(300)}#a = :v`))).toMatch(/operator count: 301$/);
    // DynamoDB stops counting at the first operator past 300: 399 are reported as 301.
    expect(message('PutItemCommand', put(condition(200)))).toMatch(/operator count: 301$/);

    const update = (n: number) => ({
      TableName: T,
      Key: key(),
      UpdateExpression: `SET ${Array.from({ length: n }, (_, i) => `a${i}=:v+:v`).join(',')}`,
      ExpressionAttributeValues: values,
    });
    expect(refusal('UpdateItemCommand', update(300))).toBeUndefined();
    expect(message('UpdateItemCommand', update(301))).toBe(
      'Invalid UpdateExpression: The expression contains too many operators; operator count: 301',
    );
    // Each expression of a request has its own 300.
    expect(
      refusal('UpdateItemCommand', { ...update(300), ConditionExpression: condition(150) }),
    ).toBeUndefined();
  });

  it('refuses an IN of more than 100 operands, before counting operators', () => {
    const scan = (n: number) => ({
      TableName: T,
      FilterExpression: `a IN (${Array(n).fill(':v').join(', ')})`,
    });
    expect(refusal('ScanCommand', scan(100))).toBeUndefined();
    expect(message('ScanCommand', scan(101))).toBe(
      'Invalid FilterExpression: The IN operator is provided with too many operands; number of operands: 101',
    );
    expect(
      message('ScanCommand', {
        TableName: T,
        FilterExpression: `${'NOT '.repeat(300)}${scan(150).FilterExpression}`,
      }),
    ).toMatch(/number of operands: 150$/);
  });
});

describe('placeholders', () => {
  it('accepts 255 bytes and refuses 256, names first', () => {
    const get = (names: Record<string, string>, values?: Record<string, AttributeValue>) => ({
      TableName: T,
      Key: key(),
      ProjectionExpression: 'a',
      ExpressionAttributeNames: names,
      ...(values ? { ExpressionAttributeValues: values } : {}),
    });
    expect(refusal('GetItemCommand', get({ [`#${'n'.repeat(254)}`]: 'a' }))).toBeUndefined();
    expect(message('GetItemCommand', get({ [`#${'n'.repeat(255)}`]: 'a' }))).toBe(
      'ExpressionAttributeNames contains invalid key: The expression attribute map contains a key that is too long; size of key: 256',
    );
    expect(message('GetItemCommand', get({}, { [`:${'v'.repeat(255)}`]: { N: '1' } }))).toBe(
      'ExpressionAttributeValues contains invalid key: The expression attribute map contains a key that is too long;',
    );
    expect(
      message(
        'GetItemCommand',
        get({ [`#${'n'.repeat(299)}`]: 'a' }, { [`:${'v'.repeat(255)}`]: { N: '1' } }),
      ),
    ).toMatch(/size of key: 300$/);
    // Before the expressions' sizes (an unused placeholder too).
    expect(
      message('GetItemCommand', {
        ...get({ [`#${'n'.repeat(299)}`]: 'a' }),
        ProjectionExpression: pad('a', 5000),
      }),
    ).toMatch(/^ExpressionAttributeNames/);
  });
});

describe('item size', () => {
  it('sizes numbers as DynamoDB does (base-100 digits, calibrated on DynamoDB Local)', () => {
    const sizes: Array<[string, number]> = [
      ['0', 1],
      ['-0', 1],
      ['1', 2],
      ['12', 2],
      ['123', 3],
      ['1234', 3],
      ['12345', 4],
      ['1234567', 5],
      ['100', 2],
      ['1000000', 2],
      ['10', 2],
      ['0.001', 2],
      ['0.05', 2],
      ['0.5', 2],
      ['1.5', 3],
      ['12.34', 3],
      ['00012', 2],
      ['1.0', 2],
      ['-1', 3],
      ['-10', 3],
      ['-123', 4],
      ['-0.5', 3],
      ['1e10', 2],
      ['1E-130', 2],
      ['12345678901234567890123456789012345678', 20],
      ['-12345678901234567890123456789012345678', 21],
      ['-1234567890123456789012345678901234567', 21],
      ['9.9999999999999999999999999999999999999E+125', 20],
      ['12345678901234567890', 11],
      ['123456789012345678901', 12],
    ];
    for (const [n, size] of sizes) expect([n, numberSize(n)]).toEqual([n, size]);
  });

  it('sizes every type as DynamoDB does', () => {
    const sizes: Array<[AttributeValue, number]> = [
      [{ S: 'é' }, 2],
      [{ S: '€' }, 3],
      [{ B: new Uint8Array(3) }, 3],
      [{ BOOL: true }, 1],
      [{ NULL: true }, 1],
      [{ L: [] }, 3],
      [{ L: [{ S: 'a' }, { S: 'b' }] }, 7],
      [{ L: [{ L: [] }] }, 7],
      [{ L: [{ N: '1' }] }, 6],
      [{ M: {} }, 3],
      [{ M: { kk: { S: 'a' }, k: { N: '1' } } }, 11],
      [{ SS: ['a', 'bb'] }, 3],
      [{ NS: ['1', '12'] }, 4],
      [{ BS: [new Uint8Array(2)] }, 2],
    ];
    for (const [value, size] of sizes) expect([value, attributeValueSize(value)]).toEqual([value, size]);
    expect(itemSize({ é: { S: 'a' }, pk: { S: 'p' } })).toBe(2 + 1 + 2 + 1);
  });

  const itemOf = (bytes: number): Record<string, AttributeValue> => ({
    ...key(),
    d: { S: 'x'.repeat(bytes - 7) },
  });

  it('accepts an item of 400 KB and refuses one byte more: put, transaction put, batch put', () => {
    expect(itemSize(itemOf(409_600))).toBe(409_600);
    expect(refusal('PutItemCommand', { TableName: T, Item: itemOf(409_600) })).toBeUndefined();
    expect(message('PutItemCommand', { TableName: T, Item: itemOf(409_601) })).toBe(
      'Item size has exceeded the maximum allowed size',
    );
    const tx = (bytes: number) => ({ TransactItems: [{ Put: { TableName: T, Item: itemOf(bytes) } }] });
    expect(refusal('TransactWriteItemsCommand', tx(409_600))).toBeUndefined();
    expect(message('TransactWriteItemsCommand', tx(409_601))).toBe(
      'Item size has exceeded the maximum allowed size',
    );
    const batch = (bytes: number) => ({ RequestItems: { [T]: [{ PutRequest: { Item: itemOf(bytes) } }] } });
    expect(refusal('BatchWriteItemCommand', batch(409_600))).toBeUndefined();
    expect(message('BatchWriteItemCommand', batch(409_601))).toBe(
      'Item size has exceeded the maximum allowed size',
    );
  });
});

describe('key size', () => {
  const KEY_TOO_LARGE =
    'Hash primary key values must be under 2048 bytes, and range primary key values must be under 1024 bytes';

  it('accepts a partition key of 2048 bytes and a sort key of 1024, refuses one byte more, in every request', () => {
    const ok = [key('p'.repeat(2048)), key('p', 's'.repeat(1024)), key('é'.repeat(1024))];
    const over = [key('p'.repeat(2049)), key('p', 's'.repeat(1025)), key(`${'é'.repeat(1024)}x`)];
    const requests: Array<[string, (k: Record<string, AttributeValue>) => object]> = [
      ['PutItemCommand', (k) => ({ TableName: T, Item: { ...k, a: { N: '1' } } })],
      ['GetItemCommand', (k) => ({ TableName: T, Key: k })],
      ['DeleteItemCommand', (k) => ({ TableName: T, Key: k })],
      ['UpdateItemCommand', (k) => ({ TableName: T, Key: k, UpdateExpression: 'REMOVE a' })],
      ['BatchGetItemCommand', (k) => ({ RequestItems: { [T]: { Keys: [k] } } })],
      ['BatchWriteItemCommand', (k) => ({ RequestItems: { [T]: [{ DeleteRequest: { Key: k } }] } })],
      ['TransactGetItemsCommand', (k) => ({ TransactItems: [{ Get: { TableName: T, Key: k } }] })],
    ];
    for (const [command, input] of requests) {
      for (const k of ok) expect([command, refusal(command, input(k))]).toEqual([command, undefined]);
      for (const k of over) expect([command, message(command, input(k))]).toEqual([command, KEY_TOO_LARGE]);
    }
  });

  it('cancels a write transaction with a reason per action, as DynamoDB does', () => {
    expect(
      refusal('TransactWriteItemsCommand', {
        TransactItems: [
          { Put: { TableName: T, Item: key('a') } },
          { Delete: { TableName: T, Key: key('b', 's'.repeat(1025)) } },
        ],
      }),
    ).toEqual({
      name: 'TransactionCanceledException',
      message:
        'Transaction cancelled, please refer cancellation reasons for specific reasons [None, ValidationError]',
      reasons: [{ Code: 'None' }, { Code: 'ValidationError', Message: KEY_TOO_LARGE }],
    });
  });

  it('takes the key names from the options', () => {
    const input = { TableName: T, Key: { id: { S: 'i'.repeat(2049) } } };
    expect(refusalOf('GetItemCommand', input, KEYS)).toBeUndefined();
    expect(refusalOf('GetItemCommand', input, { partition: 'id' })?.message).toMatch(/^Hash primary key/);
  });
});

describe('transactions', () => {
  const puts = (n: number): TransactWriteItem[] =>
    Array.from({ length: n }, (_, i) => ({ Put: { TableName: T, Item: key(`p${i}`) } }));

  it('accepts 100 actions and refuses 101', () => {
    expect(refusal('TransactWriteItemsCommand', { TransactItems: puts(100) })).toBeUndefined();
    expect(message('TransactWriteItemsCommand', { TransactItems: puts(101) })).toBe(
      'Member must have length less than or equal to 100',
    );
    const gets = (n: number) => ({
      TransactItems: Array.from({ length: n }, (_, i) => ({ Get: { TableName: T, Key: key(`p${i}`) } })),
    });
    expect(refusal('TransactGetItemsCommand', gets(100))).toBeUndefined();
    expect(message('TransactGetItemsCommand', gets(101))).toBe(
      'Member must have length less than or equal to 100',
    );
  });

  it('sizes the payload as DynamoDB does, and accepts 4 MB and refuses one byte more', () => {
    // Ten items of 409,598 bytes (4,095,980), and an update of key 8 + expression 8 + value bytes.
    const ten = Array.from({ length: 10 }, (_, i) => ({
      Put: { TableName: T, Item: { ...key(`p${i}`), d: { S: 'x'.repeat(409_590) } } },
    }));
    const tx = (valueBytes: number) => ({
      TransactItems: [
        ...ten,
        {
          Update: {
            TableName: T,
            Key: key('p20'),
            UpdateExpression: 'SET a=:v',
            ExpressionAttributeValues: { ':v': { S: 'y'.repeat(valueBytes) } },
          },
        },
      ],
    });
    expect(refusal('TransactWriteItemsCommand', tx(98_308))).toBeUndefined();
    expect(message('TransactWriteItemsCommand', tx(98_309))).toBe(
      'Transaction payload size cannot exceed 4MB. Payload Size: 4194305',
    );
    // Each use of a placeholder counts its name or value (calibrated: 4,194,821 on DynamoDB Local).
    const names = {
      TransactItems: [
        ...ten,
        {
          ConditionCheck: {
            TableName: T,
            Key: key('p20'),
            ConditionExpression: 'attribute_exists(#n) AND #n <> :v',
            ExpressionAttributeNames: { '#n': 'n'.repeat(200) },
            ExpressionAttributeValues: { ':v': { S: 'y'.repeat(98_400) } },
          },
        },
      ],
    };
    expect(message('TransactWriteItemsCommand', names)).toMatch(/Payload Size: 4194821$/);
  });

  it('refuses two actions on one item, after the other checks', () => {
    const same = (second: TransactWriteItem) => ({
      TransactItems: [{ Put: { TableName: T, Item: key('a') } }, second],
    });
    const SAME = 'Transaction request cannot include multiple operations on one item';
    expect(message('TransactWriteItemsCommand', same({ Delete: { TableName: T, Key: key('a') } }))).toBe(
      SAME,
    );
    expect(
      message(
        'TransactWriteItemsCommand',
        same({
          ConditionCheck: { TableName: T, Key: key('a'), ConditionExpression: 'attribute_exists(pk)' },
        }),
      ),
    ).toBe(SAME);
    // Another item of the partition, or the same key in another table, is another item.
    expect(
      refusal('TransactWriteItemsCommand', same({ Delete: { TableName: T, Key: key('a', 't') } })),
    ).toBeUndefined();
    expect(
      refusal('TransactWriteItemsCommand', same({ Delete: { TableName: 'other', Key: key('a') } })),
    ).toBeUndefined();
    expect(
      message('TransactGetItemsCommand', {
        TransactItems: [{ Get: { TableName: T, Key: key('a') } }, { Get: { TableName: T, Key: key('a') } }],
      }),
    ).toBe(SAME);
    // The size of an expression of the second action comes first (DynamoDB's order).
    expect(
      message(
        'TransactWriteItemsCommand',
        same({ ConditionCheck: { TableName: T, Key: key('a'), ConditionExpression: pad('a', 4097) } }),
      ),
    ).toMatch(/^Invalid ConditionExpression/);
  });
});

describe('batches', () => {
  it('accepts 25 writes and refuses 26, over all tables', () => {
    const writes = (n: number, table: string) =>
      Array.from({ length: n }, (_, i) => ({ PutRequest: { Item: key(`${table}${i}`) } }));
    expect(
      refusal('BatchWriteItemCommand', { RequestItems: { a: writes(20, 'a'), b: writes(5, 'b') } }),
    ).toBeUndefined();
    expect(
      message('BatchWriteItemCommand', { RequestItems: { a: writes(20, 'a'), b: writes(6, 'b') } }),
    ).toBe('Too many items requested for the BatchWriteItem call');
  });

  it('accepts 100 keys and refuses 101, over all tables', () => {
    const keys = (n: number, table: string) => ({
      Keys: Array.from({ length: n }, (_, i) => key(`${table}${i}`)),
    });
    expect(
      refusal('BatchGetItemCommand', { RequestItems: { a: keys(60, 'a'), b: keys(40, 'b') } }),
    ).toBeUndefined();
    expect(message('BatchGetItemCommand', { RequestItems: { a: keys(60, 'a'), b: keys(41, 'b') } })).toBe(
      'Too many items requested for the BatchGetItem call',
    );
  });
});

/** A client whose requests reach no engine: each is recorded and answered `{}`. */
function offlineClient(): { client: DynamoDBClient; sent: string[] } {
  const sent: string[] = [];
  const requestHandler = {
    async handle(request: { headers: Record<string, string> }) {
      sent.push(request.headers['x-amz-target'] ?? '');
      return {
        response: {
          statusCode: 200,
          headers: { 'content-type': 'application/x-amz-json-1.0' },
          body: Buffer.from('{}'),
        },
      };
    },
    updateHttpClientConfig() {},
    httpHandlerConfigs: () => ({}),
    destroy() {},
  };
  const client = new DynamoDBClient({
    endpoint: 'http://offline.invalid',
    region: 'us-east-1',
    credentials: { accessKeyId: 'x', secretAccessKey: 'x' },
    requestHandler: requestHandler as unknown as DynamoDBClientConfig['requestHandler'],
  });
  return { client, sent };
}

describe('the guard on a client', () => {
  it("throws DynamoDB's ValidationException and sends nothing", async () => {
    const { client, sent } = offlineClient();
    guardDynamoLimits(client);
    const err = await client
      .send(
        new PutItemCommand({
          TableName: T,
          Item: key(),
          ConditionExpression: pad('attribute_not_exists(pk)', 4365),
        }),
      )
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DynamoDBServiceException);
    expect(err).toMatchObject({
      name: 'ValidationException',
      $fault: 'client',
      $metadata: { httpStatusCode: 400 },
      message:
        'Invalid ConditionExpression: Expression size has exceeded the maximum allowed size; expression size: 4365',
    });
    expect(sent).toEqual([]);
    await client.send(new GetItemCommand({ TableName: T, Key: key() }));
    expect(sent).toEqual(['DynamoDB_20120810.GetItem']);
  });

  it('cancels a transaction as DynamoDB does (TransactionCanceledException, reasons)', async () => {
    const { client, sent } = offlineClient();
    guardDynamoLimits(client);
    const err = await client
      .send(
        new TransactWriteItemsCommand({
          TransactItems: [{ Delete: { TableName: T, Key: key('p'.repeat(2049)) } }],
        }),
      )
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransactionCanceledException);
    expect(err).toMatchObject({
      name: 'TransactionCanceledException',
      $fault: 'client',
      CancellationReasons: [{ Code: 'ValidationError' }],
    });
    expect(sent).toEqual([]);
  });

  it('is installed once however often it is added', async () => {
    const { client, sent } = offlineClient();
    expect(guardDynamoLimits(guardDynamoLimits(client))).toBe(client);
    guardDynamoLimits(client, { keys: { partition: 'id' } });
    expect(client.middlewareStack.identify().filter((m) => m.startsWith('dynamoLimitsGuard '))).toHaveLength(
      1,
    );
    await client.send(new BatchGetItemCommand({ RequestItems: { [T]: { Keys: [key()] } } }));
    await expect(
      client.send(
        new BatchWriteItemCommand({
          RequestItems: {
            [T]: Array.from({ length: 26 }, (_, i) => ({ DeleteRequest: { Key: key(`p${i}`) } })),
          },
        }),
      ),
    ).rejects.toThrow('Too many items requested for the BatchWriteItem call');
    expect(sent).toHaveLength(1);
  });

  it("sees a document client's input marshalled (an initialize middleware would not)", async () => {
    const { client, sent } = offlineClient();
    // What an `initialize` middleware of low priority sees: lib-dynamodb marshals just before the
    // serializer, so it is the document client's JavaScript values. The guard runs after the serializer.
    const seen: Record<string, unknown>[] = [];
    client.middlewareStack.add(
      (next) => async (args) => {
        seen.push((args.input as { Item?: Record<string, unknown> }).Item ?? {});
        return next(args);
      },
      { step: 'initialize', priority: 'low', name: 'initializeProbe' },
    );
    const doc = DynamoDBDocumentClient.from(guardDynamoLimits(client));
    await doc.send(new PutCommand({ TableName: T, Item: { pk: 'p', sk: 's', n: 12 } }));
    expect(seen).toEqual([{ pk: 'p', sk: 's', n: 12 }]);
    // An item of 409,601 bytes (n: 1 takes 3) as JavaScript values: only its AttributeValues can be sized.
    await expect(
      doc.send(new PutCommand({ TableName: T, Item: { pk: 'p', sk: 's', d: 'x'.repeat(409_591), n: 1 } })),
    ).rejects.toThrow('Item size has exceeded the maximum allowed size');
    await doc.send(
      new PutCommand({ TableName: T, Item: { pk: 'p', sk: 's', d: 'x'.repeat(409_590), n: 1 } }),
    );
    await expect(
      doc.send(
        new UpdateCommand({
          TableName: T,
          Key: { pk: 'p'.repeat(2049), sk: 's' },
          UpdateExpression: 'SET a = :v',
          ExpressionAttributeValues: { ':v': 1 },
        }),
      ),
    ).rejects.toThrow(/^Hash primary key values must be under 2048 bytes/);
    expect(sent).toEqual(['DynamoDB_20120810.PutItem', 'DynamoDB_20120810.PutItem']);
  });

  it('knows every limit it enforces by its documented value', () => {
    expect(DYNAMO_LIMITS).toMatchObject({
      expressionBytes: 4096,
      operators: 300,
      itemBytes: 409_600,
      transactionBytes: 4_194_304,
    });
  });
});
