import { DeleteCommand, type DynamoDBDocumentClient, PutCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { CapacityCounter } from './capacityCounter.ts';
import {
  type Counter,
  countIdOf,
  isConditionFailure,
  type Key,
  type Pending,
  type Phase,
  type Place,
  placeKey,
  readCounter,
  readPlace,
  readPlaces,
  toPlace,
} from './capacityReads.ts';

/**
 * The steps of the capacity sets' protocol (capacitySets.ts sequences them into operations): each step is
 * one conditional write on one item, a member's place (here) or the set's counter (capacityCounter.ts), and
 * changes the counter's `used` by exactly the change of the member's contribution, which follows from its
 * place's phase and its pending entry:
 *
 * | place      | pending  | counts |
 * | ---------- | -------- | ------ |
 * | none       | none     | 0      |
 * | counting   | none     | 0      |
 * | counting   | reserve  | 1      |
 * | counting   | release  | 0      | (an earlier place's ended release: removed before a count-up)
 * | counted    | any      | 1      |
 * | releasing  | none     | 1      |
 * | releasing  | reserve  | 1      |
 * | releasing  | release  | 0      |
 * | none       | reserve  | 1      |
 * | none       | release  | 0      |
 * | legacy (a member of an earlier form, below) | 1 |
 *
 * A count-first reserve counts up before it creates its places counted; an entry of one that its place
 * does not name is stray and counts 1 of its own (capacityReads.ts isStray). Each step's comment gives
 * its transition as `place/pending (before -> after contribution)`.
 *
 * A set of the one-item form of an earlier version (a map `owners` of member -> owner, or a string set
 * `members`, and no counter) admits nothing: every count-up is conditioned on that form being gone.
 * capacityMigration.ts converts it in one write into a counter whose `used` counts those members and a
 * map `legacy` of them, each counting 1 until it is given its place (`legacy` -> counting/reserve, 1 -> 1);
 * no count-up passes while `legacy` has members.
 */
export type { Counter, Key, Place } from './capacityReads.ts';

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

export class CapacitySteps {
  /** Called after each step that took effect; a test throws here to crash an operation part-way. */
  afterStep: ((step: CapacityStep, member: string) => void) | undefined;

  /** The writes of the set's counter item, with the entries whose removal waits for the next one. */
  private readonly counterItem: CapacityCounter;

  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly now: () => number,
  ) {
    this.counterItem = new CapacityCounter(doc, tableName, now, (step, m) => this.afterStep?.(step, m));
  }

  /** Hands a place over from an owner known to be dead (or superseded); false when it is no longer theirs. */
  async takeOver(key: Key, member: string, from: string, to: string): Promise<boolean> {
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

  // ---- steps ---------------------------------------------------------------------------------------

  /** none/reserve (1 -> 1): a dead owner's count-first entry made `to`'s (CapacityCounter.handOver). */
  handOverCount(key: Key, member: string, from: Pick<Pending, 'owner' | 'at'>, to: string) {
    return this.counterItem.handOver(key, member, from, to);
  }

  /** none -> counting (0 -> 0). False when a place exists already. */
  createPlace(key: Key, member: string, owner: string): Promise<boolean> {
    return this.putNewPlace(key, member, { owner, phase: 'counting' });
  }

  /**
   * none/reserve (first) -> counted/reserve (1 -> 1): the place of a count-first reserve, created counted
   * and naming its count-up (`countedBy`). False when a place exists already: the entry is then stray
   * (counts 1 of its own, capacityReads.ts isStray) until its owner undoes it (CapacitySets.reserveCountFirst).
   */
  createCountedPlace(key: Key, member: string, owner: string, countedBy: string): Promise<boolean> {
    return this.putNewPlace(key, member, { owner, phase: 'counted', countedBy });
  }

  private async putNewPlace(
    key: Key,
    member: string,
    fields: { owner: string; phase: Phase; countedBy?: string },
  ): Promise<boolean> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: { ...placeKey(key, member), type: 'place', member, ...fields, at: this.now() },
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

  /**
   * counting/none -> counting/reserve for every member at once (0 -> 1 each), within `limit`; false: full,
   * or the set is not ready to admit (CapacityCounter.countUp).
   */
  countUp(key: Key, members: readonly string[], limit: number, owner: string): Promise<boolean> {
    return this.counterItem.countUp(key, members, limit, owner);
  }

  /**
   * none/none -> none/reserve (first) for every member at once (0 -> 1 each), within `limit`: a
   * count-first reserve's count-up (CapacityCounter.countUpFirst). Its time, or undefined when refused.
   */
  countUpFirst(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
  ): Promise<number | undefined> {
    return this.counterItem.countUpFirst(key, members, limit, owner);
  }

  /** Places counted by this owner's count-first reserve: their entries go with the next counter write. */
  deferReserved(key: Key, members: readonly string[], owner: string): void {
    this.counterItem.defer(key, members, { op: 'reserve', owner });
  }

  /**
   * Brings reserved members to counted/none: each place counting -> counted (1 -> 1), then their pending
   * entries go in one write of the counter (a node set of 64 wrote it 64 times, one entry at a time: the
   * hottest item of the pool). When a place is not this owner's to mark (taken over meanwhile), its pending
   * entry stays for its new owner, who finishes it rather than count it again; when the place is gone
   * (dropped or released while the count-up was in flight), the count-up is undone with the entry
   * (none/reserve: 1 -> 0).
   */
  async finishReserves(
    key: Key,
    members: readonly string[],
    owner: string,
    /** Members counted up by this owner just now: their entries' removal waits for the next counter write. */
    options: { readonly defer?: readonly string[] } = {},
  ): Promise<void> {
    const marked: string[] = [];
    for (const member of members) {
      if (await this.markCounted(key, member, owner)) {
        marked.push(member);
        continue;
      }
      const place = await this.place(key, member);
      if (place?.phase === 'counting') continue; // another owner's now: it finishes this reserve
      if (await this.removePending(key, member, 'reserve', place ? 0 : -1))
        this.afterStep?.('reserve finished', member);
    }
    // Counted/reserve counts 1 as counted/none does: the entry's removal can wait for the next counter write.
    const later = marked.filter((m) => options.defer?.includes(m));
    this.counterItem.defer(key, later, { op: 'reserve', owner });
    await this.counterItem.removePendings(
      key,
      marked.filter((m) => !later.includes(m)),
      'reserve',
    );
  }

  /** One member's reserve finished (finishReserves). */
  finishReserve(key: Key, member: string, owner: string): Promise<void> {
    return this.finishReserves(key, [member], owner);
  }

  /** counting -> counted (1 -> 1) if the place is still this owner's; false otherwise. */
  private async markCounted(key: Key, member: string, owner: string): Promise<boolean> {
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
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
    this.afterStep?.('place counted', member);
    return true;
  }

  /**
   * A counted place given back: releasing (1 -> 1), counted down (1 -> 0), deleted, pending removed. Only
   * the release that marked it releasing counts it down: a second release of the member finds it releasing
   * and leaves it to the first (or, if that one died, to recover), so it is never counted down twice.
   */
  async release(key: Key, member: string, owner: string | undefined): Promise<void> {
    const place = await this.markReleasing(key, member, owner);
    if (place) await this.countDown(key, member, owner, place.countedBy);
  }

  /**
   * counted -> releasing (1 -> 1): the place as it is now, undefined when the place is not counted (or
   * not this owner's).
   */
  async markReleasing(key: Key, member: string, owner: string | undefined): Promise<Place | undefined> {
    let out: { Attributes?: Record<string, unknown> };
    try {
      out = await this.doc.send(
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
          ReturnValues: 'ALL_NEW',
        }),
      );
    } catch (err) {
      if (isConditionFailure(err)) return undefined;
      throw err;
    }
    this.afterStep?.('place releasing', member);
    return toPlace(out.Attributes ?? {});
  }

  /**
   * releasing/none or releasing/reserve -> releasing/release (1 -> 0; a reserve's entry not removed yet,
   * its place counted since, is taken over) for every member at once, in one write of the counter; then
   * their places go, and their entries' removal is left to the next counter write (none/release counts 0
   * as none/none does). When the one write cannot be made as sent (a member's release entry is there
   * already: a release before a crash), each member is counted down on its own (countDown).
   */
  async countDownAll(
    key: Key,
    members: readonly string[],
    owner: string | undefined,
    /** Each member's place's `countedBy` (a place a count-first reserve created), by member. */
    countedBy: ReadonlyMap<string, string | undefined> = new Map(),
  ): Promise<void> {
    if (members.length === 0) return;
    const by = members.map((m) => countedBy.get(m));
    if (!(await this.counterItem.countDownTogether(key, members, owner, by))) {
      for (const m of members) await this.countDown(key, m, owner, countedBy.get(m));
      return;
    }
    for (const m of members) this.afterStep?.('counted down', m);
    await this.deleteReleased(key, members, owner);
  }

  /**
   * releasing/none (or /reserve) -> releasing/release (1 -> 0), then the place goes, as countDownAll. A
   * stray entry of another count-up (capacityReads.ts isStray) is not this place's to take: the place stays
   * releasing until that entry is gone (undone by its owner, or by recover), and recover carries it on.
   */
  async countDown(key: Key, member: string, owner: string | undefined, countedBy?: string): Promise<void> {
    let down = false;
    for (let attempt = 0; attempt < 3 && !down; attempt++) {
      if (await this.counterItem.countDownTogether(key, [member], owner, [countedBy])) {
        this.afterStep?.('counted down', member);
        down = true;
      } else {
        const entry = (await this.counter(key)).pending[member];
        if (entry?.op === 'release')
          down = true; // counted down already, by this release before a crash
        else if (entry?.first && countedBy !== countIdOf(entry)) return; // stray: see above
      }
    }
    if (!down) return; // still contended: the place stays releasing, and recover carries it on
    await this.deleteReleased(key, [member], owner);
  }

  /** The places of members counted down go; their release entries' removal waits for the next counter write. */
  private async deleteReleased(key: Key, members: readonly string[], owner: string | undefined) {
    const deleted: string[] = [];
    for (const m of members) {
      if (await this.deletePlace(key, m, { phase: 'releasing' })) {
        this.afterStep?.('place deleted', m);
        deleted.push(m);
      }
    }
    this.counterItem.defer(key, deleted, { op: 'release', owner: owner ?? 'any' });
    const rest = members.filter((m) => !deleted.includes(m));
    await this.counterItem.removePendings(key, rest, 'release');
  }

  async deletePlace(key: Key, member: string, expect: { phase: Phase; owner?: string }): Promise<boolean> {
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

  /**
   * Removes a member's pending entry of `op`, changing `used` by `delta`; false when there is none (or,
   * with `expect`, when it is not that count-up's).
   */
  removePending(
    key: Key,
    member: string,
    op: Pending['op'],
    delta: number,
    expect?: Pick<Pending, 'owner' | 'at'>,
  ): Promise<boolean> {
    return this.counterItem.removePending(key, member, op, delta, expect);
  }

  /** Deletes the places this owner created and never counted (a reservation that did not go through). */
  async dropUncounted(key: Key, members: readonly string[], owner: string): Promise<void> {
    if (members.length === 0) return;
    const counter = await this.counter(key);
    for (const m of members) {
      // Counted up meanwhile: a reservation, finished by its owner or recover. (A release entry is an
      // earlier place's ended release, and a count-first reserve's entry never counts a `counting` place,
      // which it did not create: this one is uncounted all the same.)
      const entry = counter.pending[m];
      if (entry?.op === 'reserve' && !entry.first) continue;
      await this.deletePlace(key, m, { phase: 'counting', owner });
    }
  }

  // ---- reads (capacityReads.ts) ---------------------------------------------------------------------

  place(key: Key, member: string): Promise<Place | undefined> {
    return readPlace(this.doc, this.tableName, key, member);
  }

  counter(key: Key): Promise<Counter> {
    return readCounter(this.doc, this.tableName, key);
  }

  places(key: Key): Promise<Place[]> {
    return readPlaces(this.doc, this.tableName, key);
  }
}
