import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';
import {
  DeleteCommand,
  type DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  QueryCommand,
  type QueryCommandInput,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import type { Reservation } from '../core/poolStore.ts';

/**
 * Capacity sets (max-servers) whose cost does not grow with the fleet (docs/table.md, Capacity sets).
 *
 * A set is a counter item (its key: `POOL#<pool>`/`NODES`, `BACKINGPOOL#<pool>`/`BACKING`) holding `used`
 * and a `pending` map of the member operations in flight (bounded by concurrency, not by the fleet),
 * and one small place item per held member (`sk = PLACE#<set sk>#<member>`, in the counter's item
 * collection) carrying its owner token and its phase. Every step is one conditional write on one item;
 * no transactions. A member's contribution to `used` follows from its place's phase and its pending
 * entry, and every step changes `used` by exactly the change of the contributions:
 *
 * | place      | pending  | counts |
 * | ---------- | -------- | ------ |
 * | none       | none     | 0      |
 * | counting   | none     | 0      |
 * | counting   | reserve  | 1      |
 * | counted    | any      | 1      |
 * | releasing  | none     | 1      |
 * | releasing  | reserve  | 1      |
 * | releasing  | release  | 0      |
 * | none       | reserve  | 1      |
 * | none       | release  | 0      |
 *
 * Reserve: place `counting` (create) -> `used + k` with `pending reserve` (conditioned on room: the one
 * gate of max-servers) -> place `counted` -> pending removed. Release: place `releasing` -> `used - 1`
 * with `pending release` -> place deleted -> pending removed. A step that finds a member part-way
 * (a crash, a concurrent delivery) continues it from where it is; `recover` does that for operations
 * older than a given instant, so a crash anywhere leaves `used` exact and the leftovers are finished by
 * the reaper. The cap is never exceeded: only the conditional increment adds to `used`.
 */

type Key = { readonly pk: string; readonly sk: string };

type Phase = 'counting' | 'counted' | 'releasing';

interface Place {
  readonly member: string;
  readonly owner: string;
  readonly phase: Phase;
  readonly at: number;
}

interface Pending {
  readonly op: 'reserve' | 'release';
  readonly owner: string;
  readonly at: number;
}

interface Counter {
  readonly used: number;
  readonly pending: Readonly<Record<string, Pending>>;
}

/** A step of a member operation, for tests that stop an operation part-way (`CapacitySets.afterStep`). */
export type CapacityStep =
  | 'place created'
  | 'counted up'
  | 'place counted'
  | 'reserve finished'
  | 'place releasing'
  | 'counted down'
  | 'place deleted'
  | 'release finished';

const isConditionFailure = (err: unknown) => err instanceof ConditionalCheckFailedException;

export class CapacitySets {
  /** Called after each step that took effect; a test throws here to crash an operation part-way. */
  afterStep: ((step: CapacityStep, member: string) => void) | undefined;

  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * Takes places for `members`, held by `owner`, if the set stays within `limit`: all or none. Members this
   * owner already holds count as reserved (also when the set is full); members another owner holds, or
   * with an operation of another owner in flight, are reported (`held`) and nothing is taken.
   */
  async reserve(key: Key, members: readonly string[], limit: number, owner: string): Promise<Reservation> {
    const holders = new Map<string, string>();
    const created: string[] = [];
    /** Places that existed already (a retry of this owner, or another owner's): read to see where they are. */
    const found = new Map<string, Place>();
    for (const m of members) {
      if (await this.createPlace(key, m, owner)) {
        created.push(m);
        continue;
      }
      const place = await this.place(key, m);
      if (!place) return this.reserveAgain(key, members, limit, owner, created); // deleted meanwhile
      if (place.owner !== owner || place.phase === 'releasing') holders.set(m, place.owner);
      found.set(m, place);
    }
    if (holders.size > 0) {
      await this.dropUncounted(key, created, owner);
      return { kind: 'held', holders };
    }
    // The common case, every place new, needs no read of the counter: its condition says the rest.
    const counter = found.size > 0 ? await this.counter(key) : { used: 0, pending: {} };
    const inFlight = [...found.keys()].filter((m) => counter.pending[m]?.op === 'release');
    if (inFlight.length > 0) {
      await this.dropUncounted(key, created, owner);
      return {
        kind: 'held',
        holders: new Map(inFlight.map((m) => [m, counter.pending[m]?.owner as string])),
      };
    }
    // A reserve counted up for a place this owner now holds (its own, or taken over) is finished, not
    // counted again.
    const toCount = [
      ...created,
      ...[...found.values()]
        .filter((p) => p.phase === 'counting' && !counter.pending[p.member])
        .map((p) => p.member),
    ];
    if (toCount.length > 0 && !(await this.countUp(key, toCount, limit, owner))) {
      // No room, or an operation on one of these members is in flight (a release finishing, a crash's leftover).
      const now = await this.counter(key);
      const busy = toCount.filter((m) => now.pending[m]);
      await this.dropUncounted(key, toCount, owner);
      if (busy.length > 0) {
        return { kind: 'held', holders: new Map(busy.map((m) => [m, now.pending[m]?.owner as string])) };
      }
      return { kind: 'full' };
    }
    for (const m of members) {
      // Only what is still part-way: a failed conditional write costs as much as one that goes through.
      const place = found.get(m);
      if (toCount.includes(m) || place?.phase === 'counting' || counter.pending[m]) {
        await this.finishReserve(key, m, owner);
      }
    }
    return { kind: 'reserved' };
  }

  /** A place seen a moment ago vanished (a concurrent release or recovery): start over, once more at most. */
  private async reserveAgain(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
    created: readonly string[],
  ): Promise<Reservation> {
    await this.dropUncounted(key, created, owner);
    return this.reserve(key, members, limit, owner);
  }

  /** Hands a place over from an owner known to be dead (or superseded); false when it is no longer theirs. */
  async takeOverReservation(key: Key, member: string, from: string, to: string): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: placeKey(key, member),
          UpdateExpression: 'SET #owner = :to',
          ConditionExpression: '#owner = :from AND #phase <> :releasing',
          ExpressionAttributeNames: { '#owner': 'owner', '#phase': 'phase' },
          ExpressionAttributeValues: { ':from': from, ':to': to, ':releasing': 'releasing' },
        }),
      );
      return true;
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
  }

  /**
   * Gives places back (idempotent). With `owner`, only those that owner still holds: a delivery undoing its
   * own work never frees a concurrent delivery's place.
   */
  async unreserve(key: Key, members: readonly string[], owner?: string): Promise<void> {
    for (const m of members) {
      // The common case, a counted place: marked releasing at once; anything else is read and sorted out.
      if (await this.markReleasing(key, m, owner)) {
        await this.countDown(key, m, owner);
        continue;
      }
      const place = await this.place(key, m);
      if (!place || (owner !== undefined && place.owner !== owner)) continue;
      if (place.phase === 'counting') {
        const counter = await this.counter(key);
        if (!counter.pending[m]) {
          await this.deletePlace(key, m, { phase: 'counting', owner: place.owner }); // never counted
          continue;
        }
        await this.finishReserve(key, m, place.owner);
      }
      await this.release(key, m, owner);
    }
  }

  /** Who holds each place (member -> owner token): one Query of the set's places, page by page. */
  async reservations(key: Key): Promise<Map<string, string>> {
    return new Map((await this.places(key)).map((p) => [p.member, p.owner]));
  }

  async members(key: Key): Promise<Set<string>> {
    return new Set((await this.reservations(key)).keys());
  }

  /** The places counted against the cap (the counter's `used`). */
  async used(key: Key): Promise<number> {
    return (await this.counter(key)).used;
  }

  /**
   * Finishes every member operation of the set that began before `before` and is still part-way (its
   * delivery died): a reservation counted up is completed, one never counted is dropped, a release
   * goes on to its end. Returns how many members it finished. Idempotent, and safe beside live
   * operations (they are younger than `before`).
   */
  async recover(key: Key, before: number): Promise<number> {
    let finished = 0;
    const counter = await this.counter(key);
    const places = new Map((await this.places(key)).map((p) => [p.member, p]));
    const stale = new Set<string>();
    for (const p of places.values()) if (p.phase !== 'counted' && p.at < before) stale.add(p.member);
    for (const [m, e] of Object.entries(counter.pending)) if (e.at < before) stale.add(m);
    for (const m of stale) {
      const place = places.get(m);
      const pending = counter.pending[m];
      if (place?.phase === 'counting' && !pending) {
        await this.deletePlace(key, m, { phase: 'counting', owner: place.owner });
      } else if (place?.phase === 'counting' || (place?.phase === 'counted' && pending?.op === 'reserve')) {
        await this.finishReserve(key, m, place.owner);
      } else if (place?.phase === 'releasing') {
        await this.countDown(key, m, undefined); // its releaser died: recover carries the release on
      } else if (!place && pending?.op === 'reserve') {
        await this.removePending(key, m, 'reserve', -1); // counted up, its place never written
      } else if (!place && pending?.op === 'release') {
        await this.removePending(key, m, 'release', 0);
      } else {
        continue;
      }
      finished++;
    }
    return finished;
  }

  /**
   * Moves a set written by an earlier version (one item holding a map `owners` of member -> owner, or a
   * string set `members`) to places and a counter: every member becomes a counted place of its owner.
   * Returns how many members it moved (0 when the set is in the current form). For a state directory of
   * `metastatic dev` started by a newer version; run before anything else uses the table.
   */
  async migrate(key: Key): Promise<number> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: key, ConsistentRead: true }),
    );
    const item = out.Item;
    const owners: Record<string, string> = {};
    if (item?.owners && typeof item.owners === 'object') Object.assign(owners, item.owners);
    if (item?.members instanceof Set) for (const m of item.members as Set<string>) owners[m] ??= 'migrated';
    const entries = Object.entries(owners);
    if (!item || (item.owners === undefined && item.members === undefined)) return 0;
    for (const [member, owner] of entries) {
      await this.doc
        .send(
          new PutCommand({
            TableName: this.tableName,
            Item: {
              ...placeKey(key, member),
              type: 'place',
              member,
              owner,
              phase: 'counted',
              at: this.now(),
            },
            ConditionExpression: 'attribute_not_exists(pk)',
          }),
        )
        .catch((err: unknown) => {
          if (!isConditionFailure(err)) throw err; // moved by an earlier, interrupted migration
        });
    }
    const held = (await this.places(key)).filter((p) => p.phase !== 'counting').length;
    await this.doc.send(
      new UpdateCommand({
        TableName: this.tableName,
        Key: key,
        UpdateExpression:
          'SET #used = :held, #pending = if_not_exists(#pending, :empty) REMOVE #owners, #members',
        ExpressionAttributeNames: {
          '#used': 'used',
          '#pending': 'pending',
          '#owners': 'owners',
          '#members': 'members',
        },
        ExpressionAttributeValues: { ':held': held, ':empty': {} },
      }),
    );
    return entries.length;
  }

  // ---- steps ---------------------------------------------------------------------------------------

  /** none -> counting (0 -> 0). False when a place exists already. */
  private async createPlace(key: Key, member: string, owner: string): Promise<boolean> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: { ...placeKey(key, member), type: 'place', member, owner, phase: 'counting', at: this.now() },
          ConditionExpression: 'attribute_not_exists(pk)',
        }),
      );
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
    this.afterStep?.('place created', member);
    return true;
  }

  /** counting/none -> counting/reserve for every member at once (0 -> 1 each), within `limit`; false: full. */
  private async countUp(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
  ): Promise<boolean> {
    const names: Record<string, string> = { '#used': 'used', '#pending': 'pending' };
    const values: Record<string, unknown> = {
      ':k': members.length,
      ':room': limit - members.length,
      ':zero': 0,
    };
    const set = ['#used = if_not_exists(#used, :zero) + :k'];
    const free: string[] = [];
    members.forEach((m, i) => {
      names[`#m${i}`] = m;
      values[`:e${i}`] = { op: 'reserve', owner, at: this.now() } satisfies Pending;
      set.push(`#pending.#m${i} = :e${i}`);
      free.push(`attribute_not_exists(#pending.#m${i})`);
    });
    try {
      await this.sendCreatingPending(
        key,
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: `SET ${set.join(', ')}`,
          ConditionExpression: `(attribute_not_exists(#used) OR #used <= :room) AND ${free.join(' AND ')}`,
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values,
        }),
      );
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
    for (const m of members) this.afterStep?.('counted up', m);
    return true;
  }

  /**
   * Brings a reserved member to counted/none: counting -> counted (1 -> 1), then its pending entry goes.
   * When the place is not this owner's to mark (taken over meanwhile), the pending entry stays for its new
   * owner, who finishes it rather than count it again; when the place is gone (dropped or released while
   * the count-up was in flight), the count-up is undone with the entry (none/reserve: 1 -> 0).
   */
  private async finishReserve(key: Key, member: string, owner: string): Promise<void> {
    let marked = false;
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: placeKey(key, member),
          UpdateExpression: 'SET #phase = :counted',
          ConditionExpression: '#phase = :counting AND #owner = :owner',
          ExpressionAttributeNames: { '#phase': 'phase', '#owner': 'owner' },
          ExpressionAttributeValues: { ':counted': 'counted', ':counting': 'counting', ':owner': owner },
        }),
      );
      marked = true;
      this.afterStep?.('place counted', member);
    } catch (err) {
      if (!isConditionFailure(err)) throw err;
    }
    let delta = 0;
    if (!marked) {
      const place = await this.place(key, member);
      if (place?.phase === 'counting') return; // another owner's now: it finishes this reserve
      if (!place) delta = -1;
    }
    if (await this.removePending(key, member, 'reserve', delta)) this.afterStep?.('reserve finished', member);
  }

  /**
   * A counted place given back: releasing (1 -> 1), counted down (1 -> 0), deleted, pending removed. Only
   * the release that marked it releasing counts it down: a second release of the member finds it releasing
   * and leaves it to the first (or, if that one died, to recover), so it is never counted down twice.
   */
  private async release(key: Key, member: string, owner: string | undefined): Promise<void> {
    if (await this.markReleasing(key, member, owner)) await this.countDown(key, member, owner);
  }

  /** counted -> releasing (1 -> 1); false when the place is not counted (or not this owner's). */
  private async markReleasing(key: Key, member: string, owner: string | undefined): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: placeKey(key, member),
          UpdateExpression: 'SET #phase = :releasing, #at = :now',
          ConditionExpression:
            owner === undefined ? '#phase = :counted' : '#phase = :counted AND #owner = :owner',
          ExpressionAttributeNames: {
            '#phase': 'phase',
            '#at': 'at',
            ...(owner === undefined ? {} : { '#owner': 'owner' }),
          },
          ExpressionAttributeValues: {
            ':releasing': 'releasing',
            ':counted': 'counted',
            ':now': this.now(),
            ...(owner === undefined ? {} : { ':owner': owner }),
          },
        }),
      );
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
    this.afterStep?.('place releasing', member);
    return true;
  }

  /** releasing/none -> releasing/release (1 -> 0), then the place and the pending entry go. */
  private async countDown(key: Key, member: string, owner: string | undefined): Promise<void> {
    let down = false;
    for (let attempt = 0; attempt < 3 && !down; attempt++) {
      try {
        await this.sendCreatingPending(
          key,
          new UpdateCommand({
            TableName: this.tableName,
            Key: key,
            UpdateExpression: 'SET #used = #used - :one, #pending.#m = :e',
            ConditionExpression: 'attribute_not_exists(#pending.#m)',
            ExpressionAttributeNames: { '#used': 'used', '#pending': 'pending', '#m': member },
            ExpressionAttributeValues: {
              ':one': 1,
              ':e': { op: 'release', owner: owner ?? 'any', at: this.now() } satisfies Pending,
            },
          }),
        );
        this.afterStep?.('counted down', member);
        down = true;
      } catch (err) {
        if (!isConditionFailure(err)) throw err;
        const pending = (await this.counter(key)).pending[member];
        if (pending?.op === 'release')
          down = true; // counted down already, by this release before a crash
        else if (pending?.op === 'reserve') await this.removePending(key, member, 'reserve', 0); // its reserve's end
      }
    }
    if (!down) return; // still contended: the place stays releasing, and recover carries it on
    if (await this.deletePlace(key, member, { phase: 'releasing' }))
      this.afterStep?.('place deleted', member);
    if (await this.removePending(key, member, 'release', 0)) this.afterStep?.('release finished', member);
  }

  private async deletePlace(
    key: Key,
    member: string,
    expect: { phase: Phase; owner?: string },
  ): Promise<boolean> {
    const names: Record<string, string> = { '#phase': 'phase' };
    const values: Record<string, unknown> = { ':phase': expect.phase };
    let condition = '#phase = :phase';
    if (expect.owner !== undefined) {
      names['#owner'] = 'owner';
      values[':owner'] = expect.owner;
      condition += ' AND #owner = :owner';
    }
    try {
      await this.doc.send(
        new DeleteCommand({
          TableName: this.tableName,
          Key: placeKey(key, member),
          ConditionExpression: condition,
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values,
        }),
      );
      return true;
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
  }

  /** Removes a member's pending entry of `op`, changing `used` by `delta`; false when there is none. */
  private async removePending(key: Key, member: string, op: Pending['op'], delta: number): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: `${delta === 0 ? '' : 'SET #used = #used + :delta '}REMOVE #pending.#m`,
          ConditionExpression: '#pending.#m.#op = :op',
          ExpressionAttributeNames: {
            '#pending': 'pending',
            '#m': member,
            '#op': 'op',
            ...(delta === 0 ? {} : { '#used': 'used' }),
          },
          ExpressionAttributeValues: { ':op': op, ...(delta === 0 ? {} : { ':delta': delta }) },
        }),
      );
      return true;
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
  }

  /** Deletes the places this owner created and never counted (a reservation that did not go through). */
  private async dropUncounted(key: Key, members: readonly string[], owner: string): Promise<void> {
    if (members.length === 0) return;
    const counter = await this.counter(key);
    for (const m of members) {
      if (counter.pending[m]) continue; // counted up meanwhile: a reservation, finished by its owner or recover
      await this.deletePlace(key, m, { phase: 'counting', owner });
    }
  }

  // ---- reads ---------------------------------------------------------------------------------------

  private async place(key: Key, member: string): Promise<Place | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: placeKey(key, member), ConsistentRead: true }),
    );
    return out.Item ? toPlace(out.Item) : undefined;
  }

  private async counter(key: Key): Promise<Counter> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: key, ConsistentRead: true }),
    );
    const item = out.Item ?? {};
    return {
      used: typeof item.used === 'number' ? item.used : 0,
      pending: (item.pending as Record<string, Pending> | undefined) ?? {},
    };
  }

  private async places(key: Key): Promise<Place[]> {
    const input: QueryCommandInput = {
      TableName: this.tableName,
      KeyConditionExpression: 'pk = :pk AND begins_with(sk, :prefix)',
      ExpressionAttributeValues: { ':pk': key.pk, ':prefix': placePrefix(key) },
      ConsistentRead: true,
    };
    const out: Place[] = [];
    do {
      const page = await this.doc.send(new QueryCommand(input));
      for (const item of page.Items ?? []) out.push(toPlace(item));
      input.ExclusiveStartKey = page.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    return out;
  }

  /** Sends an update that sets `pending` entries, creating the map (and `used`) first when the item has none. */
  private async sendCreatingPending(key: Key, update: UpdateCommand): Promise<void> {
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
        UpdateExpression:
          'SET #pending = if_not_exists(#pending, :empty), #used = if_not_exists(#used, :zero)',
        ExpressionAttributeNames: { '#pending': 'pending', '#used': 'used' },
        ExpressionAttributeValues: { ':empty': {}, ':zero': 0 },
      }),
    );
    await this.doc.send(update);
  }
}

const placePrefix = (key: Key) => `PLACE#${key.sk}#`;
const placeKey = (key: Key, member: string) => ({ pk: key.pk, sk: `${placePrefix(key)}${member}` });

function toPlace(item: Record<string, unknown>): Place {
  const phase = item.phase === 'counted' || item.phase === 'releasing' ? item.phase : 'counting';
  return {
    member: String(item.member),
    owner: String(item.owner),
    phase,
    at: typeof item.at === 'number' ? item.at : 0,
  };
}
