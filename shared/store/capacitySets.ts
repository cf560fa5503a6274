import type { DynamoDBDocumentClient } from '@aws-sdk/lib-dynamodb';
import type { RecoveredPlaces, Reservation } from '../core/poolStore.ts';
import { migrateCapacitySet } from './capacityMigration.ts';
import { auditSet, countIdOf, isStray, type SetAudit } from './capacityReads.ts';
import { CapacitySteps, type Counter, type Key, type Place } from './capacitySteps.ts';
import { takeOverOrAdopt } from './countAdoption.ts';

export type { CapacityStep } from './capacitySteps.ts';

/**
 * Capacity sets (max-servers) whose cost does not grow with the fleet (docs/table.md, Capacity sets).
 *
 * A set is a counter item (its key: `POOL#<pool>`/`NODES`, `BACKINGPOOL#<pool>`/`BACKING`) holding `used`
 * and a `pending` map of the member operations in flight (bounded by concurrency, not by the fleet),
 * and one small place item per held member (`sk = PLACE#<set sk>#<member>`, in the counter's item
 * collection) carrying its owner token and its phase. Every step is one conditional write on one item;
 * no transactions. A member's contribution to `used` follows from its place's phase and its pending
 * entry, and every step changes `used` by exactly the change of the contributions
 * (the table of contributions is in capacitySteps.ts, with the steps).
 *
 * Reserve: place `counting` (create) -> `used + k` with `pending reserve` (conditioned on room: the one
 * gate of max-servers) -> place `counted` -> pending removed. The request path counts first instead
 * (`countFirst`: `used + k` with `pending reserve` marked `first` -> each place created `counted`, naming
 * that count-up -> pending removed), two writes a place rather than three, and falls back to the
 * place-first reserve when the count-up is refused or a member has a place already. Release: place `releasing` -> `used - k`
 * with `pending release` -> place deleted -> pending removed. The counter is written twice per operation
 * whatever the number of members (count, finish), each place a few times. A step that finds a member part-way
 * (a crash, a concurrent delivery) continues it from where it is; `recover` does that for operations
 * older than a given instant, so a crash anywhere leaves `used` exact and the leftovers are finished by
 * the reaper. The cap is never exceeded: only the conditional increment adds to `used`.
 */
export class CapacitySets {
  private readonly steps: CapacitySteps;

  constructor(
    private readonly doc: DynamoDBDocumentClient,
    private readonly tableName: string,
    private readonly now: () => number = Date.now,
  ) {
    this.steps = new CapacitySteps(doc, tableName, now);
  }

  /** Called after each step that took effect; a test throws here to crash an operation part-way. */
  get afterStep(): CapacitySteps['afterStep'] {
    return this.steps.afterStep;
  }

  set afterStep(hook: CapacitySteps['afterStep']) {
    this.steps.afterStep = hook;
  }

  /**
   * Takes places for `members`, held by `owner`, if the set stays within `limit`: all or none. Members this
   * owner already holds count as reserved (also when the set is full); members another owner holds, or
   * with an operation of another owner in flight, are reported (`held`) and nothing is taken.
   */
  async reserve(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
    migrated = false,
    options: {
      readonly overlap?: boolean;
      readonly clearedEnded?: boolean;
      /** Count first, then create the places counted (reserveCountFirst): one write per place fewer. */
      readonly countFirst?: boolean;
    } = {},
  ): Promise<Reservation> {
    if (options.countFirst) {
      const counted = await this.reserveCountFirst(key, members, limit, owner);
      if (counted.length === members.length) return { kind: 'reserved' };
      if (counted.length === 0) {
        const refused = await this.refusal(key, members, limit, owner);
        if (refused) return refused;
      }
      // Refused (full, a member busy, a set of an earlier form), or some members had places (a concurrent
      // delivery's): the place-first reserve sorts it out as it always has (the places taken here are this
      // owner's, counted), and what was taken here is given back unless it reserves all (all or none).
      const rest = await this.reserve(key, members, limit, owner, migrated, {
        ...options,
        countFirst: false,
      });
      if (rest.kind !== 'reserved' && counted.length > 0) await this.unreserve(key, counted, owner);
      return rest;
    }
    const holders = new Map<string, string>();
    const created: string[] = [];
    /** Places that existed already (a retry of this owner, or another owner's): read to see where they are. */
    const found = new Map<string, Place>();
    for (const m of members) {
      if (await this.steps.createPlace(key, m, owner)) {
        created.push(m);
        continue;
      }
      const place = await this.steps.place(key, m);
      if (!place) return this.reserveAgain(key, members, limit, owner, created); // deleted meanwhile
      if (place.owner !== owner || place.phase === 'releasing') holders.set(m, place.owner);
      found.set(m, place);
    }
    if (holders.size > 0) {
      await this.steps.dropUncounted(key, created, owner);
      return { kind: 'held', holders };
    }
    // The common case, every place new, needs no read of the counter: its condition says the rest.
    const counter: Counter =
      found.size > 0 ? await this.steps.counter(key) : { used: 0, pending: {}, earlier: false, legacy: {} };
    // An uncounted place of this owner's beside an earlier place's ended release (its entry's removal
    // deferred, or its releaser dead after deleting that place): the entry goes (none/release and
    // counting/release count 0), and the place is counted up as any uncounted one.
    const ended = [...found.values()].filter(
      (p) => p.phase === 'counting' && counter.pending[p.member]?.op === 'release',
    );
    for (const p of ended) await this.steps.removePending(key, p.member, 'release', 0);
    const pending = { ...counter.pending };
    for (const p of ended) delete pending[p.member];
    // A release in flight, or a count-first reserve's stray count (its owner undoes it, or recover): the
    // member is another operation's for now.
    const inFlight = [...found.keys()].filter(
      (m) => pending[m]?.op === 'release' || isStray(pending[m], found.get(m)),
    );
    if (inFlight.length > 0) {
      await this.steps.dropUncounted(key, created, owner);
      return {
        kind: 'held',
        holders: new Map(inFlight.map((m) => [m, pending[m]?.owner as string])),
      };
    }
    // A reserve counted up for a place this owner now holds (its own, or taken over) is finished, not
    // counted again.
    const toCount = [
      ...created,
      ...[...found.values()].filter((p) => p.phase === 'counting' && !pending[p.member]).map((p) => p.member),
    ];
    if (toCount.length > 0 && !(await this.steps.countUp(key, toCount, limit, owner))) {
      // No room, or an operation on one of these members is in flight (a release finishing, a crash's leftover).
      const now = await this.steps.counter(key);
      if (!migrated && (now.earlier || Object.keys(now.legacy).length > 0)) {
        // The set is of an earlier version's form (or its migration is under way), which no count-up
        // passes: moved to places first, then asked again, so its members count before any more is admitted.
        await this.steps.dropUncounted(key, toCount, owner);
        await this.migrate(key);
        return this.reserve(key, members, limit, owner, true, options);
      }
      // A release that ended but for its entry (its place was gone: this reserve created one), whose
      // releaser left the entry's removal for later (CapacityCounter.defer), or died: none/release counts
      // 0 as none/none does. Removed, and the reserve asked again once.
      const ended = toCount.filter((m) => created.includes(m) && now.pending[m]?.op === 'release');
      if (!options.clearedEnded && ended.length > 0) {
        for (const m of ended) await this.steps.removePending(key, m, 'release', 0);
        const again = await this.reserve(key, members, limit, owner, migrated, {
          ...options,
          clearedEnded: true,
        });
        // Not taken after all (full, or held meanwhile): the places this one created go, uncounted.
        if (again.kind !== 'reserved') await this.steps.dropUncounted(key, toCount, owner);
        return again;
      }
      const busy = toCount.filter((m) => now.pending[m]);
      await this.steps.dropUncounted(key, toCount, owner);
      if (busy.length > 0) {
        return { kind: 'held', holders: new Map(busy.map((m) => [m, now.pending[m]?.owner as string])) };
      }
      return { kind: 'full' };
    }
    // Only what is still part-way: a failed conditional write costs as much as one that goes through.
    const unfinished = members.filter((m) => {
      const place = found.get(m);
      return toCount.includes(m) || place?.phase === 'counting' || pending[m] !== undefined;
    });
    if (options.overlap) {
      // Counted: the rest is bookkeeping, which the caller overlaps with its placement (Reservation).
      const finishing = this.steps.finishReserves(key, unfinished, owner, { defer: toCount }).then(
        () => undefined,
        (err: unknown) => (err instanceof Error ? err : new Error(String(err))),
      );
      return { kind: 'reserved', finishing };
    }
    await this.steps.finishReserves(key, unfinished, owner, { defer: toCount });
    return { kind: 'reserved' };
  }

  /**
   * The common reservation, every member new, in two writes whatever their number: the counter's count-up
   * first (none/none -> none/reserve, its entries marked `first`; the one gate of max-servers), then each
   * member's place created counted, naming that count-up (none/reserve -> counted/reserve: 1 -> 1), where
   * the place-first reserve writes a place three times (created, counted up, marked counted). The entries
   * go with this instance's next counter write, as a place-first reserve's do. Returns the members it
   * took; none when the count-up was refused. A member whose place existed already (another holder's, or
   * this owner's from an earlier try) has its count undone at once (the entry was stray: it counted 1
   * beside the place, capacityReads.ts isStray), and is left to the place-first reserve.
   *
   * A crash between the count-up and a place's creation leaves none/reserve (1), which recover undoes
   * once stale, as it undoes a place-first reserve's whose place went: nothing was recorded for a member
   * without its place, since the caller records only after the reservation answered.
   */
  private async reserveCountFirst(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
  ): Promise<string[]> {
    const at = await this.steps.countUpFirst(key, members, limit, owner);
    if (at === undefined) return [];
    const countedBy = countIdOf({ owner, at });
    const taken: string[] = [];
    for (const m of members) {
      if (await this.steps.createCountedPlace(key, m, owner, countedBy)) taken.push(m);
      // Placed already: the entry is stray, counting 1 beside the place; it goes with its count.
      else await this.steps.removePending(key, m, 'reserve', -1, { owner, at });
    }
    this.steps.deferReserved(key, taken, owner);
    return taken;
  }

  /**
   * Why a count-first reserve's count-up was refused, from the counter as it is now, when that answers
   * without places: full (no entry for the members, no room), or held (every member's entry is another
   * owner's reserve: a concurrent delivery between its count-up and its places, or one that ended and
   * whose entry waits for its next write). Creating places then, as the place-first reserve does, would
   * take the member from under that delivery's place creation (its place refused, both deliveries
   * retried: +40-60% time in chaos at 100 requests, measured). Undefined: anything else (room now, a set
   * of an earlier form, release entries, this owner's entries), which the place-first reserve sorts out.
   */
  private async refusal(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
  ): Promise<Reservation | undefined> {
    const counter = await this.steps.counter(key);
    if (counter.earlier || Object.keys(counter.legacy).length > 0) return undefined;
    const entries = members.flatMap((m) => {
      const e = counter.pending[m];
      return e ? [[m, e] as const] : [];
    });
    if (entries.length === 0) return counter.used + members.length > limit ? { kind: 'full' } : undefined;
    if (entries.every(([, e]) => e.op === 'reserve' && e.owner !== owner))
      return { kind: 'held', holders: new Map(entries.map(([m, e]) => [m, e.owner])) };
    return undefined;
  }

  /** A place seen a moment ago vanished (a concurrent release or recovery): start over, once more at most. */
  private async reserveAgain(
    key: Key,
    members: readonly string[],
    limit: number,
    owner: string,
    created: readonly string[],
  ): Promise<Reservation> {
    await this.steps.dropUncounted(key, created, owner);
    return this.reserve(key, members, limit, owner);
  }

  /**
   * Gives places back (idempotent). With `owner`, only those that owner still holds: a delivery undoing its
   * own work never frees a concurrent delivery's place.
   */
  async unreserve(key: Key, members: readonly string[], owner?: string): Promise<void> {
    // The common case, a counted place: marked releasing at once, and all of those counted down together
    // (one write of the counter for the set, not one per member); anything else is read and sorted out.
    const releasing: string[] = [];
    const countedBy = new Map<string, string | undefined>();
    for (const m of members) {
      const marked = await this.steps.markReleasing(key, m, owner);
      if (marked) {
        releasing.push(m);
        countedBy.set(m, marked.countedBy);
        continue;
      }
      const place = await this.steps.place(key, m);
      if (!place || (owner !== undefined && place.owner !== owner)) continue;
      if (place.phase === 'counting') {
        const counter = await this.steps.counter(key);
        const entry = counter.pending[m];
        if (entry?.op !== 'reserve' || isStray(entry, place)) {
          // Never counted (beside a release entry: an earlier place's ended release).
          await this.steps.deletePlace(key, m, { phase: 'counting', owner: place.owner });
          continue;
        }
        await this.steps.finishReserve(key, m, place.owner);
      }
      await this.steps.release(key, m, owner);
    }
    await this.steps.countDownAll(key, releasing, owner, countedBy);
  }

  /** Who holds each place (member -> owner token): one Query of the set's places, page by page. */
  async reservations(key: Key): Promise<Map<string, string>> {
    return new Map((await this.steps.places(key)).map((p) => [p.member, p.owner]));
  }

  async members(key: Key): Promise<Set<string>> {
    return new Set((await this.reservations(key)).keys());
  }

  /** The set read once: its members, `used`, and the places that count (capacityReads.ts auditSet). */
  audit(key: Key): Promise<SetAudit> {
    return auditSet(this.doc, this.tableName, key);
  }

  /** The places counted against the cap (the counter's `used`). */
  async used(key: Key): Promise<number> {
    return (await this.steps.counter(key)).used;
  }

  /**
   * Finishes every member operation of the set that began before `before` and is still part-way (its
   * delivery died): a reservation counted up is completed, one never counted is dropped, a release
   * goes on to its end. Returns how many members it finished. Idempotent, and safe beside live
   * operations (they are younger than `before`).
   */
  async recover(key: Key, before: number): Promise<number> {
    return (await this.recoverAndRead(key, before)).finished;
  }

  /**
   * recover, and who holds each place once it is done (member -> owner): the places it read, read again
   * only when it had part-way operations to finish (the reaper's check of every place after its
   * recovery was a second Query of the set each run).
   */
  async recoverAndRead(key: Key, before: number): Promise<RecoveredPlaces> {
    let finished = 0;
    let counter = await this.steps.counter(key);
    if (counter.earlier || Object.keys(counter.legacy).length > 0) {
      // A set of an earlier version's form, or a migration that stopped part-way: finished first.
      finished += await this.migrate(key);
      counter = await this.steps.counter(key);
    }
    const places = new Map((await this.steps.places(key)).map((p) => [p.member, p]));
    const stale = new Set<string>();
    for (const p of places.values()) if (p.phase !== 'counted' && p.at < before) stale.add(p.member);
    for (const [m, e] of Object.entries(counter.pending)) if (e.at < before) stale.add(m);
    if (finished === 0 && stale.size === 0) {
      return { finished, places: new Map([...places.values()].map((p) => [p.member, p.owner])) };
    }
    for (const m of stale) {
      const place = places.get(m);
      let pending = counter.pending[m];
      if (pending && isStray(pending, place)) {
        // A count-first reserve's count beside a place that was there before it, its owner dead before it
        // undid it (a young one is left to its owner): it goes with its count, then the place is seen to.
        if (pending.at >= before) continue;
        if (await this.steps.removePending(key, m, 'reserve', -1, pending)) finished++;
        pending = undefined;
        if (place?.phase === 'counted' || (place?.at ?? 0) >= before) continue;
      }
      if (place?.phase === 'counting' && pending?.op !== 'reserve') {
        // Never counted; a release entry beside it is an earlier place's ended release, and goes. The
        // place goes only once stale itself: a young one is a live reserve's (which clears such an entry
        // and counts its place up: deleting that place then would undo the count it relies on).
        if (pending) await this.steps.removePending(key, m, 'release', 0);
        if (place.at >= before) continue;
        await this.steps.deletePlace(key, m, { phase: 'counting', owner: place.owner });
      } else if (place?.phase === 'counted' && pending?.op === 'reserve') {
        // An ended reserve whose entry's removal was left to a counter write that has not come (its
        // instance idle or gone, CapacityCounter.defer), or a crash just before it: only the entry goes,
        // not reported as a recovered place.
        await this.steps.finishReserve(key, m, place.owner);
        continue;
      } else if (place?.phase === 'counting') {
        await this.steps.finishReserve(key, m, place.owner);
      } else if (place?.phase === 'releasing') {
        // Its releaser died: recover carries the release on.
        await this.steps.countDown(key, m, undefined, place.countedBy);
      } else if (!place && pending?.op === 'reserve') {
        await this.steps.removePending(key, m, 'reserve', -1); // counted up, its place never written
      } else if (!place && pending?.op === 'release') {
        await this.steps.removePending(key, m, 'release', 0); // an ended release's entry, as above
        continue;
      } else {
        continue;
      }
      finished++;
    }
    return { finished, places: await this.reservations(key) };
  }

  /** Hands a place over from a dead or superseded owner, or adopts a dead one's count-up (countAdoption.ts). */
  takeOverReservation(
    key: Key,
    member: string,
    from: string,
    to: string,
    adoptSince = Number.POSITIVE_INFINITY,
  ): Promise<boolean> {
    return takeOverOrAdopt(this.steps, key, member, from, to, adoptSince);
  }

  /**
   * Moves a set written by an earlier version (one item holding a map `owners` of member -> owner, or a
   * string set `members`) to places and a counter (capacityMigration.ts). Returns how many members it moved.
   */
  migrate(key: Key): Promise<number> {
    return migrateCapacitySet(this.doc, this.tableName, this.now, this.steps, key);
  }
}
