import { BusyError } from '../../core/errors.ts';
import type { BackingRecord, RequestRecord } from '../../core/records.ts';
import { type ServeContext, timeLeft } from '../context.ts';
import { failBadBacking } from '../release/failure.ts';
import { moveSpare, usableSpareHost } from './minReady.ts';

/** A free spare (one nobody took) and the backing node it is on, as the reaper read them. */
export interface FreeSpare {
  readonly spare: RequestRecord;
  readonly host: BackingRecord;
}

/** Candidates read when moving spares: the fullest backing nodes of the label with a free slot. */
const MOVE_CANDIDATES = 25;

/** A backing node as consolidate sees it: slots used, and whether anything but a free spare holds one. */
interface Room {
  b: BackingRecord;
  used: number;
  readonly pinned: boolean;
}

/**
 * Keeps a label's free spares on the fullest backing nodes, so spares cost slots, not instances: a
 * backing node that holds a spare is never idle, so spares left scattered by takes and releases would
 * each keep a part-empty instance running (for ever with max-age unset). A spare moves (moveSpare) from
 * a backing node to another of its pool and label, ready and taking nodes, with a free slot, when that
 * one is "fuller": it runs something besides free spares and the spare's does not, or both alike and it
 * holds at least as many slots. Emptiest first, onto the fullest. Each move strictly increases the
 * packing (more spares beside busy nodes, or a larger sum of squares of slots used), so moves never go
 * back and forth.
 */
export async function consolidateSpares(
  ctx: ServeContext,
  label: string,
  spares: readonly FreeSpare[],
  report: { moved: number; deferred: number },
): Promise<void> {
  const freeIds = new Set(spares.map((f) => f.spare.nodes[0]?.id));
  const roomOf = (b: BackingRecord): Room => ({
    b,
    used: b.used,
    pinned: Object.values(b.slotMap).some((id) => !freeIds.has(id)),
  });
  const fuller = (to: Room, from: Room) =>
    (to.pinned && !from.pinned) || (to.pinned === from.pinned && to.used >= from.used);
  const byPool = new Map<string, FreeSpare[]>();
  for (const f of spares) {
    const key = f.spare.poolKey ?? '';
    byPool.set(key, [...(byPool.get(key) ?? []), f]);
  }
  for (const [poolKey, free] of byPool) {
    const pool = ctx.config.metastaticPools.find((p) => p.key === poolKey);
    const config = pool?.labels.get(label);
    if (!pool || !config) continue;
    const now = ctx.clock.now();
    const rooms = new Map<string, Room>();
    for (const f of free) if (!rooms.has(f.host.id)) rooms.set(f.host.id, roomOf(f.host));
    const found = await ctx.store.findCandidates(pool.key, label, MOVE_CANDIDATES);
    for (const b of found.items) if (usableSpareHost(b, now)) rooms.set(b.id, roomOf(b));
    const key = (r: Room) => (r.pinned ? 1_000_000 : 0) + r.used;
    // Always a spare of the emptiest backing node left, so one is emptied before the next is touched.
    const left = [...free];
    while (left.length > 0) {
      if (timeLeft(ctx) <= 0) {
        report.deferred++;
        return;
      }
      const at = (f: (typeof left)[number]) => key(rooms.get(f.host.id) as Room);
      left.sort((x, y) => at(x) - at(y));
      const f = left.shift() as (typeof left)[number];
      const from = rooms.get(f.host.id);
      if (!from) continue;
      const to = [...rooms.values()]
        .filter((r) => r.b.id !== from.b.id && r.used < r.b.slots && fuller(r, from))
        .sort((x, y) => key(y) - key(x))[0];
      if (!to) continue;
      let onto: BackingRecord | undefined;
      try {
        onto = await moveSpare(ctx, pool, config, f.spare, to.b, failBadBacking);
      } catch (err) {
        if (err instanceof BusyError) continue; // a move of it in flight elsewhere: left to that one
        throw err;
      }
      if (!onto) {
        // Lost a race (its slot, or the spare taken): the next move there starts from it as it is now.
        const current = await ctx.store.getBacking(to.b.id);
        if (current && usableSpareHost(current, ctx.clock.now())) to.b = current;
        else rooms.delete(to.b.id);
        continue;
      }
      report.moved++;
      from.used--;
      to.used++;
      to.b = onto;
    }
  }
}
