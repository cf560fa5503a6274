import { countIdOf } from './capacityReads.ts';
import type { CapacitySteps, Key } from './capacitySteps.ts';

/**
 * CapacitySets.takeOverReservation: a place handed over from `from` (known dead, or superseded) to `to`;
 * false when it is no longer theirs.
 *
 * With `adoptSince`, for an owner known dead (not one merely superseded, which may still create its place):
 * its count-first entry made at `adoptSince` or later with no place (cut between its count-up and its
 * place) becomes `to`'s in one conditional write of the counter, and the place is created counted, naming
 * it; before, the request waited for the reaper's recovery (a slot lease). `adoptSince` keeps clear of
 * recovery (COUNT_ADOPTION_MS). An entry beside a place is never adopted: it is that place's own count
 * (finished here) or stray (its owner's undo, or the recovery's).
 */
export async function takeOverOrAdopt(
  steps: CapacitySteps,
  key: Key,
  member: string,
  from: string,
  to: string,
  adoptSince: number,
): Promise<boolean> {
  if (await steps.takeOver(key, member, from, to)) return true;
  const entry = (await steps.counter(key)).pending[member];
  if (entry?.op !== 'reserve' || !entry.first || entry.owner !== from || entry.at < adoptSince) return false;
  const place = await steps.place(key, member);
  if (place) {
    // Its place was made (and taken over since): the entry is not a count without a place. When the
    // place names it, it is that place's own count, left by an owner that died before removing it:
    // finished here (counted/reserve -> counted/none, 1 -> 1), so that the next attempt takes the place
    // over from its holder at once rather than wait for the reaper's recovery. Adopting it would have
    // undone the place's count (seed 1, 100 requests, the reaper every 20 ticks: two places counted
    // without their count). Beside any other place it is stray: its owner's undo, or the recovery's.
    if (place.phase === 'counted' && place.countedBy === countIdOf(entry)) {
      await steps.removePending(key, member, 'reserve', 0, entry);
    }
    return false;
  }
  const at = await steps.handOverCount(key, member, entry, to);
  if (at === undefined) return false;
  if (await steps.createCountedPlace(key, member, to, countIdOf({ owner: to, at }))) return true;
  // A place appeared meanwhile (its owner was not dead after all): the entry handed over is that place's
  // own count when the place names the count-up it was (1 -> 1: only the entry goes), else stray (-1).
  const made = await steps.place(key, member);
  const own = made?.countedBy === countIdOf(entry);
  await steps.removePending(key, member, 'reserve', own ? 0 : -1, { owner: to, at });
  return false;
}
