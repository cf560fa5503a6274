import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import {
  type DynamoDBDocumentClient,
  GetCommand,
  QueryCommand,
  type QueryCommandInput,
} from '@aws-sdk/lib-dynamodb';

/**
 * The items of a capacity set and their reads (the steps that write them: capacitySteps.ts, the places';
 * capacityCounter.ts, the counter's).
 */

export type Key = { readonly pk: string; readonly sk: string };

export type Phase = 'counting' | 'counted' | 'releasing';

export interface Place {
  readonly member: string;
  readonly owner: string;
  readonly phase: Phase;
  readonly at: number;
}

export interface Pending {
  readonly op: 'reserve' | 'release';
  readonly owner: string;
  readonly at: number;
}

export interface Counter {
  readonly used: number;
  readonly pending: Readonly<Record<string, Pending>>;
  /** The item is still in the one-item form of an earlier version (`owners` or `members`): not counted. */
  readonly earlier: boolean;
  /** Members of that form counted in `used` and not given their place yet (member -> owner). */
  readonly legacy: Readonly<Record<string, string>>;
}

const placePrefix = (key: Key) => `PLACE#${key.sk}#`;
export const placeKey = (key: Key, member: string) => ({ pk: key.pk, sk: `${placePrefix(key)}${member}` });

export async function readPlace(
  doc: DynamoDBDocumentClient,
  tableName: string,
  key: Key,
  member: string,
): Promise<Place | undefined> {
  const out = await doc.send(
    new GetCommand({ TableName: tableName, Key: placeKey(key, member), ConsistentRead: true }),
  );
  return out.Item ? toPlace(out.Item) : undefined;
}

export async function readCounter(
  doc: DynamoDBDocumentClient,
  tableName: string,
  key: Key,
): Promise<Counter> {
  const out = await doc.send(new GetCommand({ TableName: tableName, Key: key, ConsistentRead: true }));
  const item = out.Item ?? {};
  return {
    used: typeof item.used === 'number' ? item.used : 0,
    pending: (item.pending as Record<string, Pending> | undefined) ?? {},
    earlier: item.owners !== undefined || item.members !== undefined,
    legacy: (item.legacy as Record<string, string> | undefined) ?? {},
  };
}

/** Every place of the set: one consistent Query of its item collection, page by page. */
export async function readPlaces(doc: DynamoDBDocumentClient, tableName: string, key: Key): Promise<Place[]> {
  const input: QueryCommandInput = {
    TableName: tableName,
    KeyConditionExpression: 'pk = :pk AND begins_with(sk, :prefix)',
    ExpressionAttributeValues: { ':pk': key.pk, ':prefix': placePrefix(key) },
    ConsistentRead: true,
  };
  const out: Place[] = [];
  do {
    const page = await doc.send(new QueryCommand(input));
    for (const item of page.Items ?? []) out.push(toPlace(item));
    input.ExclusiveStartKey = page.LastEvaluatedKey;
  } while (input.ExclusiveStartKey);
  return out;
}

function toPlace(item: Record<string, unknown>): Place {
  const phase = item.phase === 'counted' || item.phase === 'releasing' ? item.phase : 'counting';
  return {
    member: String(item.member),
    owner: String(item.owner),
    phase,
    at: typeof item.at === 'number' ? item.at : 0,
  };
}

/** A conditional write's refusal: its condition failed (every step answers it as a domain answer). */
export const isConditionFailure = (err: unknown) => err instanceof ConditionalCheckFailedException;
