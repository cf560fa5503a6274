import {
  BatchWriteCommand,
  type DynamoDBDocumentClient,
  GetCommand,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import { type CapacitySets, type Key, placeKey } from '../shared/store/capacitySets.ts';

/**
 * A capacity set holding `members`, each counted and held by `ownerOf(member)`, as reserves that finished
 * long ago leave it: for tests that need thousands of places held before they measure or exercise one
 * operation. The first member is reserved through the store (`sets.reserve`, every step real); the
 * others are copies of the place item that reserve wrote, with their own key, member and owner, written
 * 25 to a BatchWriteItem, and the counter's `used` is raised by their number. So the items are exactly
 * what the store makes, at about 1/25 of the calls a reserve per member costs (a transaction each, plus the
 * counter's contention): on dynalite, 5,000 places in a few seconds instead of a minute.
 */
export async function holdPlaces(
  doc: DynamoDBDocumentClient,
  tableName: string,
  sets: CapacitySets,
  key: Key,
  members: readonly string[],
  ownerOf: (member: string, index: number) => string,
): Promise<void> {
  const [first, ...rest] = members;
  if (first === undefined) return;
  const reserved = await sets.reserve(key, [first], Number.MAX_SAFE_INTEGER, ownerOf(first, 0));
  if (reserved.kind !== 'reserved') throw new Error(`holdPlaces: ${first} not reserved: ${reserved.kind}`);
  const { Item: model } = await doc.send(
    new GetCommand({ TableName: tableName, Key: placeKey(key, first), ConsistentRead: true }),
  );
  if (!model) throw new Error(`holdPlaces: no place for ${first}`);
  for (let i = 0; i < rest.length; i += 25) {
    let items: Record<string, unknown>[] = rest.slice(i, i + 25).map((member, j) => ({
      ...model,
      ...placeKey(key, member),
      member,
      owner: ownerOf(member, i + j + 1),
    }));
    // BatchWriteItem may leave some unprocessed (throttling): send those again until none is left.
    while (items.length > 0) {
      const out = await doc.send(
        new BatchWriteCommand({
          RequestItems: { [tableName]: items.map((Item) => ({ PutRequest: { Item } })) },
        }),
      );
      items = (out.UnprocessedItems?.[tableName] ?? []).map((r) => r.PutRequest?.Item ?? {});
    }
  }
  await doc.send(
    new UpdateCommand({
      TableName: tableName,
      Key: key,
      UpdateExpression: 'ADD #used :n',
      ExpressionAttributeNames: { '#used': 'used' },
      ExpressionAttributeValues: { ':n': rest.length },
    }),
  );
}
