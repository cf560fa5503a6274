import { TransactionCanceledException } from '@aws-sdk/client-dynamodb';
import {
  type DynamoDBDocumentClient,
  GetCommand,
  QueryCommand,
  type QueryCommandInput,
  TransactWriteCommand,
  type TransactWriteCommandInput,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import { unmarshall } from '@aws-sdk/util-dynamodb';
import { BusyError } from '../core/errors.ts';
import type { Reservation } from '../core/poolStore.ts';

/**
 * Capacity sets: the places of a pool's max-servers (docs/table.md, Capacity sets). A set is a counter
 * item (`POOL#<pool>`/`NODES`, `BACKINGPOOL#<pool>`/`BACKING`) holding `used`, and one place item per
 * held member in the counter's item collection (`PLACE#<set sk>#<member>`) naming its owner.
 *
 * Invariant: `used` is the number of place items, and never above the cap when it grew. It rests on one
 * rule: every change of `used` is made in one transaction (TransactWriteItems) with the places it counts,
 * the counter's update conditioned on room, each place's put on its absence, each place's delete on its
 * presence (and owner). Nothing is ever part-way, so there is nothing to recover, adopt or finish: a
 * delivery that dies has either taken all its places or none, and the reaper gives back the places of a
 * delivery that died before it recorded what for (usecases/reap/reconcile.ts).
 *
 * A transaction holds at most MAX_TRANSACTION_ITEMS actions: a counter and MAX_SET_CHANGE places, above
 * the largest node set a message may ask for (core/messages.ts MAX_NODE_SET, 64). Every expression is
 * a few dozen bytes whatever the number of members: the limits are met by construction.
 */
export class CapacitySets {
  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * Takes places for `members`, held by `owner`, if the set stays within `limit`: all or none, in one
   * transaction. Members this owner holds already count as taken (also when the set is full: a retry);
   * members another owner holds are reported (`held`) and nothing is taken.
   */
  async reserve(key: Key, members: readonly string[], limit: number, owner: string): Promise<Reservation> {
    const wanted = [...new Set(members)];
    checkSize(wanted.length);
    /** Members found held by this owner: kept (checked to be still theirs), not counted again. */
    const mine = new Set<string>();
    for (let attempt = 1; ; attempt++) {
      const fresh = wanted.filter((m) => !mine.has(m));
      if (fresh.length === 0) return { kind: 'reserved' };
      if (fresh.length > limit) return { kind: 'full' };
      const at = this.now();
      const checked = [...mine];
      const actions: Action[] = [
        ...fresh.map(
          (member): Action => ({
            Put: {
              TableName: this.tableName,
              Item: { ...placeKey(key, member), type: 'place', member, owner, at },
              ConditionExpression: 'attribute_not_exists(pk)',
              ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
            },
          }),
        ),
        ...checked.map(
          (member): Action => ({
            ConditionCheck: { TableName: this.tableName, Key: placeKey(key, member), ...heldBy(owner) },
          }),
        ),
        {
          Update: {
            TableName: this.tableName,
            Key: key,
            UpdateExpression: 'SET #used = if_not_exists(#used, :zero) + :k',
            ConditionExpression: 'attribute_not_exists(#used) OR #used <= :room',
            ExpressionAttributeNames: { '#used': 'used' },
            ExpressionAttributeValues: { ':zero': 0, ':k': fresh.length, ':room': limit - fresh.length },
          },
        },
      ];
      const reasons = await this.transact(actions, attempt);
      if (!reasons) return { kind: 'reserved' };
      if (reasons === 'conflict') continue;
      const holders = new Map<string, string>();
      let changed = false;
      for (const [i, member] of fresh.entries()) {
        if (reasons[i]?.Code !== 'ConditionalCheckFailed') continue;
        // Held by this owner already (a retry), by another, or given back since (then asked again).
        const holder = (reasons[i]?.Item ?? (await this.place(key, member)))?.owner;
        if (holder === owner) mine.add(member);
        else if (holder !== undefined) holders.set(member, String(holder));
        changed = true;
      }
      for (const [j, member] of checked.entries()) {
        if (reasons[fresh.length + j]?.Code !== 'ConditionalCheckFailed') continue;
        mine.delete(member); // not this owner's any more (given back, or taken over): asked for again
        changed = true;
      }
      if (holders.size > 0) return { kind: 'held', holders };
      const full = reasons[actions.length - 1]?.Code === 'ConditionalCheckFailed';
      if (full && !changed) return { kind: 'full' };
      if (attempt >= wanted.length + MAX_CONFLICT_RETRIES)
        throw new BusyError(`${key.pk}: places kept changing`);
    }
  }

  /**
   * Gives places back (idempotent), in one transaction: each place deleted and `used` lowered by their
   * number. With `owner`, only those that owner still holds: a delivery undoing its own work never frees a
   * concurrent delivery's place.
   */
  async unreserve(key: Key, members: readonly string[], owner?: string): Promise<void> {
    let held = [...new Set(members)];
    checkSize(held.length);
    for (let attempt = 1; held.length > 0; attempt++) {
      const actions: Action[] = [
        ...held.map(
          (member): Action => ({
            Delete: {
              TableName: this.tableName,
              Key: placeKey(key, member),
              ...(owner === undefined ? { ConditionExpression: 'attribute_exists(pk)' } : heldBy(owner)),
            },
          }),
        ),
        {
          Update: {
            TableName: this.tableName,
            Key: key,
            UpdateExpression: 'SET #used = #used - :k',
            ConditionExpression: '#used >= :k',
            ExpressionAttributeNames: { '#used': 'used' },
            ExpressionAttributeValues: { ':k': held.length },
          },
        },
      ];
      const reasons = await this.transact(actions, attempt);
      if (!reasons) return;
      if (reasons === 'conflict') continue;
      const kept = held.filter((_, i) => reasons[i]?.Code !== 'ConditionalCheckFailed');
      if (kept.length === held.length) {
        // Every place is there and the count is below them: the invariant is broken, not a race.
        throw new Error(`${key.pk}/${key.sk}: used is below its ${held.length} places being given back`);
      }
      held = kept; // the others are gone, or another owner's: not this call's to give back
      if (attempt >= members.length + MAX_CONFLICT_RETRIES)
        throw new BusyError(`${key.pk}: places kept changing`);
    }
  }

  /** Hands a place over from a dead or superseded owner in one conditional write; false when not theirs. */
  async takeOverReservation(key: Key, member: string, from: string, to: string): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: placeKey(key, member),
          UpdateExpression: 'SET #owner = :to, #at = :at',
          ConditionExpression: '#owner = :from',
          ExpressionAttributeNames: { '#owner': 'owner', '#at': 'at' },
          ExpressionAttributeValues: { ':to': to, ':from': from, ':at': this.now() },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof Error && err.name === 'ConditionalCheckFailedException') return false;
      throw err;
    }
  }

  /** Who holds each place (member -> owner token): one consistent Query of the set's places, page by page. */
  async reservations(key: Key): Promise<Map<string, string>> {
    const input: QueryCommandInput = {
      TableName: this.tableName,
      KeyConditionExpression: 'pk = :pk AND begins_with(sk, :prefix)',
      ExpressionAttributeValues: { ':pk': key.pk, ':prefix': placePrefix(key) },
      ConsistentRead: true,
    };
    const places = new Map<string, string>();
    do {
      const page = await this.doc.send(new QueryCommand(input));
      for (const item of page.Items ?? []) places.set(String(item.member), String(item.owner));
      input.ExclusiveStartKey = page.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    return places;
  }

  async members(key: Key): Promise<Set<string>> {
    return new Set((await this.reservations(key)).keys());
  }

  /** The places counted against the cap (the counter's `used`). */
  async used(key: Key): Promise<number> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: key, ConsistentRead: true }),
    );
    return typeof out.Item?.used === 'number' ? out.Item.used : 0;
  }

  /** The set read once, for the invariant checks: its members and `used` (equal in number, always). */
  async audit(key: Key): Promise<SetAudit> {
    const [places, used] = await Promise.all([this.reservations(key), this.used(key)]);
    return { members: new Set(places.keys()), used };
  }

  private async place(key: Key, member: string): Promise<Record<string, unknown> | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: placeKey(key, member), ConsistentRead: true }),
    );
    return out.Item;
  }

  /**
   * Sends one transaction. Undefined: it took effect. 'conflict': DynamoDB cancelled it for another
   * transaction on one of its items (TransactionConflict), after a pause with jitter. Otherwise the reason
   * of each action, in order, its item unmarshalled (an engine that does not return it leaves it out).
   */
  private async transact(actions: Action[], attempt: number): Promise<Reason[] | 'conflict' | undefined> {
    try {
      await this.doc.send(new TransactWriteCommand({ TransactItems: actions }));
      return undefined;
    } catch (err) {
      if (!(err instanceof TransactionCanceledException) && !isNamed(err, 'TransactionCanceledException')) {
        throw err;
      }
      const reasons = ((err as TransactionCanceledException).CancellationReasons ?? []).map(
        (r): Reason => ({
          Code: r.Code ?? 'None',
          ...(r.Item && Object.keys(r.Item).length > 0 ? { Item: unmarshall(r.Item) } : {}),
        }),
      );
      if (reasons.some((r) => r.Code === 'TransactionConflict')) {
        if (attempt >= MAX_CONFLICT_RETRIES)
          throw new BusyError(`transaction conflicts on ${actions.length} items`);
        await new Promise((resolve) => setTimeout(resolve, Math.random() * 20 * 2 ** attempt));
        return 'conflict';
      }
      const unexpected = reasons.find((r) => r.Code !== 'None' && r.Code !== 'ConditionalCheckFailed');
      if (unexpected) throw err;
      return reasons;
    }
  }
}

/** The most items one transaction may hold (DynamoDB's quota on TransactWriteItems). */
export const MAX_TRANSACTION_ITEMS = 100;
/** The most places one reserve or release changes: one transaction's items but the counter's. */
export const MAX_SET_CHANGE = MAX_TRANSACTION_ITEMS - 1;
/** Transactions cancelled for a conflict (or places changing under it) retried before BusyError. */
const MAX_CONFLICT_RETRIES = 6;

export type Key = { readonly pk: string; readonly sk: string };

export interface SetAudit {
  readonly members: Set<string>;
  readonly used: number;
}

type Action = NonNullable<TransactWriteCommandInput['TransactItems']>[number];
interface Reason {
  readonly Code: string;
  readonly Item?: Record<string, unknown>;
}

/** The condition that a place is held by `owner` (its item is there, naming it). */
const heldBy = (owner: string) => ({
  ConditionExpression: '#owner = :owner',
  ExpressionAttributeNames: { '#owner': 'owner' },
  ExpressionAttributeValues: { ':owner': owner },
});

const placePrefix = (key: Key) => `PLACE#${key.sk}#`;
export const placeKey = (key: Key, member: string) => ({ pk: key.pk, sk: `${placePrefix(key)}${member}` });

function checkSize(n: number): void {
  if (n > MAX_SET_CHANGE) {
    throw new RangeError(
      `${n} places in one change of a capacity set: at most ${MAX_SET_CHANGE} (one transaction)`,
    );
  }
}

const isNamed = (err: unknown, name: string) => err instanceof Error && err.name === name;
