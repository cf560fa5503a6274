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
  /** A place created counted by a count-first reserve: the count-up that counted it (countIdOf). */
  readonly countedBy?: string;
}

export interface Pending {
  readonly op: 'reserve' | 'release';
  readonly owner: string;
  readonly at: number;
  /** A count-up made before its member's place (a count-first reserve, CapacitySets.reserve). */
  readonly first?: boolean;
}

/** Names a count-up (its owner and time): a place created counted after it carries it as `countedBy`. */
export const countIdOf = (e: Pick<Pending, 'owner' | 'at'>) => `${e.owner}@${e.at}`;

/** The owner and time a `countedBy` names (owner tokens may hold `@`: the time is after the last one). */
export function parseCountId(id: string | undefined): Pick<Pending, 'owner' | 'at'> | undefined {
  if (id === undefined) return undefined;
  const cut = id.lastIndexOf('@');
  const at = Number(id.slice(cut + 1));
  return cut < 0 || !Number.isFinite(at) ? undefined : { owner: id.slice(0, cut), at };
}

/**
 * A count-first reserve (the request path: CapacitySets.reserve `countFirst`) counts up before its places
 * exist (none/reserve, its entries marked `first`), then creates each place counted, naming the count-up
 * (`countedBy`): counted/reserve. Its entry is stray when the member's place does not name it (the place
 * was there before: another holder's, or an earlier one of its owner's): it counts 1 of its own beside
 * what the place counts. Only its owner (undoing it at once) or recover (once it is stale) removes it,
 * with its count; no other step takes it for the place's own (a count-down leaves it, a reserve sees the
 * member busy). Without a place it is none/reserve.
 */
export function isStray(entry: Pending | undefined, place: Place | undefined): boolean {
  return (
    entry?.op === 'reserve' &&
    entry.first === true &&
    place !== undefined &&
    place.countedBy !== countIdOf(entry)
  );
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

export function toPlace(item: Record<string, unknown>): Place {
  const phase = item.phase === 'counted' || item.phase === 'releasing' ? item.phase : 'counting';
  return {
    member: String(item.member),
    owner: String(item.owner),
    phase,
    at: typeof item.at === 'number' ? item.at : 0,
    ...(typeof item.countedBy === 'string' ? { countedBy: item.countedBy } : {}),
  };
}

/**
 * How many of the set's places count against its cap, by the table of capacitySteps.ts: a place counted,
 * releasing and not counted down yet, or counting with its own reserve entry (a count-up made for it).
 * A place a dead operation left part-way holding no count (counting, never counted up; releasing,
 * counted down) holds no capacity: an audit of the set (`used` is never below this).
 */
export function placesThatCount(places: readonly Place[], counter: Counter): number {
  return places.filter((p) => {
    const entry = counter.pending[p.member];
    if (p.phase === 'counted') return true;
    if (p.phase === 'releasing') return entry?.op !== 'release';
    return entry?.op === 'reserve' && !isStray(entry, p);
  }).length;
}

export interface SetAudit {
  readonly members: Set<string>;
  readonly used: number;
  /** The places that count against the cap (placesThatCount). */
  readonly counting: number;
}

/** A set read once (its places and its counter): its members, `used`, and the places that count. */
export async function auditSet(doc: DynamoDBDocumentClient, tableName: string, key: Key): Promise<SetAudit> {
  const [places, counter] = await Promise.all([
    readPlaces(doc, tableName, key),
    readCounter(doc, tableName, key),
  ]);
  return {
    members: new Set(places.map((p) => p.member)),
    used: counter.used,
    counting: placesThatCount(places, counter),
  };
}

/** A conditional write's refusal: its condition failed (every step answers it as a domain answer). */
export const isConditionFailure = (err: unknown) => err instanceof ConditionalCheckFailedException;
