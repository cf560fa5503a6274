import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import { type DynamoDBDocumentClient, GetCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import type { Reservation } from '../core/poolStore.ts';

/** The room a capacity set has left for `n` more members (its size is at most `:room` before). */
const roomInMap = '(attribute_not_exists(#owners) OR size(#owners) <= :room)';

type Key = { pk: string; sk: string };

/**
 * Capacity sets (max-servers): one item per pool holding a map member -> owner token (docs/table.md),
 * so a delivery can tell its own reservations from a concurrent delivery's of the same ids, and gives
 * back only its own. The store's named places (DynamoStore.reserveNodePlaces, ...) are these sets.
 */
export class CapacitySets {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
  ) {}

  /**
   * Adds members to a capacity set, held by `owner`, if the set stays within `limit`. A capacity set
   * is a map member -> owner token on one item, so a delivery can tell its own reservations from a
   * concurrent delivery's of the same ids, and gives back only its own. Members this owner already
   * holds count as reserved even when the set is full; members another owner holds are reported.
   */
  async reserve(key: Key, members: readonly string[], limit: number, owner: string): Promise<Reservation> {
    const names: Record<string, string> = { '#owners': 'owners' };
    const set: string[] = [];
    const free: string[] = [];
    members.forEach((m, i) => {
      names[`#m${i}`] = m;
      set.push(`#owners.#m${i} = :owner`);
      free.push(`attribute_not_exists(#owners.#m${i})`);
    });
    const update = new UpdateCommand({
      TableName: this.tableName,
      Key: key,
      UpdateExpression: `SET ${set.join(', ')}`,
      ConditionExpression: [roomInMap, ...free].join(' AND '),
      ExpressionAttributeNames: names,
      ExpressionAttributeValues: { ':owner': owner, ':room': limit - members.length },
    });
    try {
      await this.sendCreatingMap(key, update);
      return { kind: 'reserved' };
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
    }
    const held = await this.reservations(key);
    const holders = new Map<string, string>();
    for (const m of members) {
      const by = held.get(m);
      if (by !== undefined && by !== owner) holders.set(m, by);
    }
    if (holders.size > 0) return { kind: 'held', holders };
    const missing = members.filter((m) => held.get(m) !== owner);
    if (missing.length === 0) return { kind: 'reserved' };
    // Some were ours already (a retry within this delivery): ask again for the rest alone.
    return missing.length < members.length ? this.reserve(key, missing, limit, owner) : { kind: 'full' };
  }

  /** Hands a reservation over from an owner known to be dead; false when it is no longer theirs. */
  async takeOverReservation(key: Key, member: string, from: string, to: string): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: 'SET #owners.#m = :to',
          ConditionExpression: '#owners.#m = :from',
          ExpressionAttributeNames: { '#owners': 'owners', '#m': member },
          ExpressionAttributeValues: { ':from': from, ':to': to },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }

  /**
   * Removes members from a capacity set (idempotent). With `owner`, only the members that owner
   * still holds: a delivery undoing its own work never removes a concurrent delivery's reservation.
   */
  async unreserve(key: Key, members: readonly string[], owner?: string): Promise<void> {
    if (members.length === 0) return;
    if (owner === undefined) {
      const names: Record<string, string> = { '#owners': 'owners' };
      members.forEach((m, i) => {
        names[`#m${i}`] = m;
      });
      try {
        await this.doc.send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: key,
            UpdateExpression: `REMOVE ${members.map((_, i) => `#owners.#m${i}`).join(', ')}`,
            ConditionExpression: 'attribute_exists(#owners)',
            ExpressionAttributeNames: names,
          }),
        );
      } catch (err) {
        if (!(err instanceof ConditionalCheckFailedException)) throw err; // no set: nothing to remove
      }
      return;
    }
    for (const m of members) {
      try {
        await this.doc.send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: key,
            UpdateExpression: 'REMOVE #owners.#m',
            ConditionExpression: '#owners.#m = :owner',
            ExpressionAttributeNames: { '#owners': 'owners', '#m': m },
            ExpressionAttributeValues: { ':owner': owner },
          }),
        );
      } catch (err) {
        if (!(err instanceof ConditionalCheckFailedException)) throw err; // not (or no longer) ours
      }
    }
  }

  /** Who holds each member of a capacity set (member -> owner token). */
  async reservations(key: Key): Promise<Map<string, string>> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: key, ConsistentRead: true }),
    );
    const owners = out.Item?.owners as Record<string, unknown> | undefined;
    return new Map(Object.entries(owners ?? {}).map(([m, by]) => [m, String(by)]));
  }

  async members(key: Key): Promise<Set<string>> {
    return new Set((await this.reservations(key)).keys());
  }

  /** Sends an update that sets map entries, creating the map first when the item has none yet. */
  private async sendCreatingMap(key: Key, update: UpdateCommand): Promise<void> {
    try {
      await this.doc.send(update);
      return;
    } catch (err) {
      // DynamoDB cannot SET a path inside a map that does not exist yet.
      if (!(err instanceof Error && err.name === 'ValidationException' && /document path/i.test(err.message)))
        throw err;
    }
    await this.doc.send(
      new UpdateCommand({
        TableName: this.tableName,
        Key: key,
        UpdateExpression: 'SET #owners = if_not_exists(#owners, :empty)',
        ExpressionAttributeNames: { '#owners': 'owners' },
        ExpressionAttributeValues: { ':empty': {} },
      }),
    );
    await this.doc.send(update);
  }
}
