import { type DynamoDBDocumentClient, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { isConditionFailure, type Key, type Pending, parseCountId } from './capacityReads.ts';
import { DeferredEntries } from './deferredEntries.ts';

/** The steps CapacityCounter takes itself, reported to CapacitySteps.afterStep (a CapacityStep each). */
export type CounterStep = 'counted up' | 'reserve finished' | 'release finished';

/**
 * The writes of a capacity set's counter item (`used` and the `pending` entries of the member operations
 * in flight), the steps of capacitySteps.ts that change `used` (its table gives each member's
 * contribution): the count-up, the one gate of max-servers; the count-down of members being released; the
 * removal of pending entries once their operation ended. The counter is the hottest item of a set, written
 * by every reservation and release: a count-up or count-down writes all its members at once, and carries
 * the removal of this instance's deferred entries (deferredEntries.ts) rather than a write of its own.
 */
export class CapacityCounter {
  /**
   * Entries whose operation ended (a reserve's place counted, a release's place deleted): removed with
   * this instance's next count-up or count-down of the set, not by a write of their own (deferredEntries.ts).
   */
  private readonly deferred = new DeferredEntries();

  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly now: () => number,
    /** Called after each step that took effect (CapacitySteps.afterStep). */
    private readonly stepped: (step: CounterStep, member: string) => void,
  ) {}

  /** Leaves the removal of ended operations' entries to the next count-up or count-down of the set. */
  defer(key: Key, members: readonly string[], entry: Omit<Pending, 'at'>): void {
    this.deferred.add(key, members, entry);
  }

  /**
   * counting/none -> counting/reserve for every member at once (0 -> 1 each), within `limit`; false: full,
   * or the set is still of the earlier form or has legacy members without their places yet (a member
   * there has a holder no place shows; a condition on the whole map keeps the expression's length
   * independent of the members, far below DynamoDB's 4 KB for the largest node set).
   */
  async countUp(key: Key, members: readonly string[], limit: number, owner: string): Promise<boolean> {
    return (await this.countUpWith(key, members, limit, { op: 'reserve', owner })) !== undefined;
  }

  /**
   * none/none -> none/reserve (0 -> 1 each), the entries marked `first` (made before the places): a
   * count-first reserve's count-up, on the same conditions as countUp. Returns the entries' time (their
   * count-up's id with the owner, which the places created after it carry), undefined when refused.
   */
  countUpFirst(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
  ): Promise<number | undefined> {
    return this.countUpWith(key, members, limit, { op: 'reserve', owner, first: true });
  }

  private async countUpWith(
    key: Key,
    members: readonly string[],
    limit: number,
    entry: Omit<Pending, 'at'>,
  ): Promise<number | undefined> {
    const names: Record<string, string> = {
      '#used': 'used',
      '#pending': 'pending',
      '#legacy': 'legacy',
      ...earlierNames,
    };
    const values: Record<string, unknown> = {
      ':k': members.length,
      ':room': limit - members.length,
      ':zero': 0,
    };
    const set = ['#used = if_not_exists(#used, :zero) + :k'];
    const at = this.now();
    const free = this.addPendingEntries(members, entry, names, values, set, at);
    const written = await this.writeTogether(key, members, {
      set,
      condition: `(attribute_not_exists(#used) OR #used <= :room) AND ${notEarlier} AND ${settled} AND ${free.join(' AND ')}`,
      names,
      values,
    });
    if (!written) return undefined;
    for (const m of members) this.stepped('counted up', m);
    return at;
  }

  /**
   * A count-first entry of `from`'s (a dead delivery's count-up whose place was never created) becomes
   * `to`'s, made now (`used` unchanged): one write conditioned on the entry being still `from`'s, so of
   * two adopters one wins, and an entry ended meanwhile (its place released, recovered) is not revived.
   * Returns the new entry's time; undefined when refused.
   */
  async handOver(
    key: Key,
    member: string,
    from: Pick<Pending, 'owner' | 'at'>,
    to: string,
  ): Promise<number | undefined> {
    const at = this.now();
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: 'SET #pending.#m = :entry',
          ConditionExpression:
            '#pending.#m.#op = :reserve AND #pending.#m.#first = :yes AND #pending.#m.#owner = :from AND #pending.#m.#at = :at',
          ExpressionAttributeNames: {
            '#pending': 'pending',
            '#m': member,
            '#op': 'op',
            '#first': 'first',
            '#owner': 'owner',
            '#at': 'at',
          },
          ExpressionAttributeValues: {
            ':entry': { op: 'reserve', owner: to, at, first: true } satisfies Pending,
            ':reserve': 'reserve',
            ':yes': true,
            ':from': from.owner,
            ':at': from.at,
          },
        }),
      );
    } catch (err) {
      if (isConditionFailure(err)) return undefined;
      throw err;
    }
    this.stepped('counted up', member);
    return at;
  }

  /**
   * The one counter write of CapacitySteps.countDownAll; false when its condition failed. A member's
   * reserve entry is taken over only when it is its place's own count: an entry of the earlier form
   * (not `first`), or the count-up named by the place's `countedBy` (`countedBy[i]`), never a stray one
   * (capacityReads.ts isStray), which counts beside the place.
   */
  async countDownTogether(
    key: Key,
    members: readonly string[],
    owner: string | undefined,
    countedBy: readonly (string | undefined)[] = [],
  ) {
    const names: Record<string, string> = {
      '#used': 'used',
      '#pending': 'pending',
      '#op': 'op',
      '#first': 'first',
    };
    const values: Record<string, unknown> = { ':k': members.length, ':reserve': 'reserve' };
    const set = ['#used = #used - :k'];
    const entry = { op: 'release', owner: owner ?? 'any' } as const;
    const free = this.addPendingEntries(members, entry, names, values, set, this.now()).map((none, i) => {
      const path = `#pending.#m${i}`;
      const by = parseCountId(countedBy[i]);
      let own = `attribute_not_exists(${path}.#first)`;
      if (by) {
        names['#owner'] = 'owner';
        names['#at'] = 'at';
        values[`:bo${i}`] = by.owner;
        values[`:ba${i}`] = by.at;
        own = `(${own} OR (${path}.#owner = :bo${i} AND ${path}.#at = :ba${i}))`;
      }
      return `(${none} OR (${path}.#op = :reserve AND ${own}))`;
    });
    return this.writeTogether(key, members, { set, condition: free.join(' AND '), names, values });
  }

  /**
   * One conditional update of a set's counter for several members at once: `set` and `condition` with
   * the removals of deferred entries (and their conditions) the write carries along; false when the
   * condition failed.
   */
  private async writeTogether(
    key: Key,
    members: readonly string[],
    w: {
      set: readonly string[];
      condition: string;
      names: Record<string, string>;
      values: Record<string, unknown>;
    },
  ): Promise<boolean> {
    try {
      await this.deferred.sendWith(key, members, (extra) =>
        this.sendCreatingPending(
          key,
          new UpdateCommand({
            TableName: this.tableName,
            Key: key,
            UpdateExpression: `SET ${w.set.join(', ')}${extra.remove}`,
            ConditionExpression: [w.condition, ...extra.conditions].filter((c) => c !== '').join(' AND '),
            ExpressionAttributeNames: { ...w.names, ...extra.names },
            ExpressionAttributeValues: { ...w.values, ...extra.values },
          }),
        ),
      );
      return true;
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
  }

  /**
   * Removes a member's pending entry of `op`, changing `used` by `delta`; false when there is none (or,
   * with `expect`, when it is not that count-up's entry any more).
   */
  async removePending(
    key: Key,
    member: string,
    op: Pending['op'],
    delta: number,
    expect?: Pick<Pending, 'owner' | 'at'>,
  ): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: `${delta === 0 ? '' : 'SET #used = #used + :delta '}REMOVE #pending.#m`,
          ConditionExpression: `#pending.#m.#op = :op${expect ? ' AND #pending.#m.#owner = :owner AND #pending.#m.#at = :at' : ''}`,
          ExpressionAttributeNames: {
            '#pending': 'pending',
            '#m': member,
            '#op': 'op',
            ...(delta === 0 ? {} : { '#used': 'used' }),
            ...(expect ? { '#owner': 'owner', '#at': 'at' } : {}),
          },
          ExpressionAttributeValues: {
            ':op': op,
            ...(delta === 0 ? {} : { ':delta': delta }),
            ...(expect ? { ':owner': expect.owner, ':at': expect.at } : {}),
          },
        }),
      );
      return true;
    } catch (err) {
      if (isConditionFailure(err)) return false;
      throw err;
    }
  }

  /**
   * Removes the pending entries of `op` of all `members` in one write (used unchanged); when one of them is
   * gone already (finished by someone else: a recovery, a new owner), each is removed on its own.
   */
  async removePendings(key: Key, members: readonly string[], op: Pending['op']): Promise<void> {
    const done: Record<Pending['op'], CounterStep> = {
      reserve: 'reserve finished',
      release: 'release finished',
    };
    if (members.length === 0) return;
    const names: Record<string, string> = { '#pending': 'pending', '#op': 'op' };
    members.forEach((m, i) => {
      names[`#m${i}`] = m;
    });
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: `REMOVE ${members.map((_, i) => `#pending.#m${i}`).join(', ')}`,
          ConditionExpression: members.map((_, i) => `#pending.#m${i}.#op = :op`).join(' AND '),
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: { ':op': op },
        }),
      );
    } catch (err) {
      if (!isConditionFailure(err)) throw err;
      if (members.length === 1) return;
      for (const m of members) if (await this.removePending(key, m, op, 0)) this.stepped(done[op], m);
      return;
    }
    for (const m of members) this.stepped(done[op], m);
  }

  /**
   * Adds a pending entry for each member to an update of the counter (`#m<i>` = the member, `:e<i>` = its
   * entry, each set in `set`), and returns the conditions that none of them has one already.
   */
  private addPendingEntries(
    members: readonly string[],
    entry: Omit<Pending, 'at'>,
    names: Record<string, string>,
    values: Record<string, unknown>,
    set: string[],
    at: number,
  ): string[] {
    return members.map((m, i) => {
      names[`#m${i}`] = m;
      values[`:e${i}`] = { ...entry, at } satisfies Pending;
      set.push(`#pending.#m${i} = :e${i}`);
      return `attribute_not_exists(#pending.#m${i})`;
    });
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
    // Never onto an item of the earlier form: `used` would start at 0 beside members it does not count.
    // The condition failure goes to the caller, as its own update's would.
    await this.doc.send(
      new UpdateCommand({
        TableName: this.tableName,
        Key: key,
        UpdateExpression:
          'SET #pending = if_not_exists(#pending, :empty), #used = if_not_exists(#used, :zero)',
        ConditionExpression: notEarlier,
        ExpressionAttributeNames: { '#pending': 'pending', '#used': 'used', ...earlierNames },
        ExpressionAttributeValues: { ':empty': {}, ':zero': 0 },
      }),
    );
    await this.doc.send(update);
  }
}

/** The condition that a counter item is not of the one-item form of an earlier version. */
const notEarlier = 'attribute_not_exists(#owners) AND attribute_not_exists(#members)';
const earlierNames = { '#owners': 'owners', '#members': 'members' } as const;
/** ... and that every member of such a form has its place (`legacy` empty or gone; needs `#legacy`, `:zero`). */
const settled = '(attribute_not_exists(#legacy) OR size(#legacy) = :zero)';
