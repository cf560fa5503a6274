import type { MetastaticPool } from '../config/model.ts';
import { BusyError } from '../core/errors.ts';
import { ownerSince, supersedes } from '../core/ids.ts';
import type { RequestRecord } from '../core/records.ts';
import { COUNT_ADOPTION_MS } from '../core/timing.ts';
import { type Context, deliveryDead } from './context.ts';
import type { Recording } from './recording.ts';

/** A request's places in its pool's max-servers (requestNodes.ts): taken before its nodes are placed. */

/**
 * Takes the nodes' places in a pool's max-servers (counted; their bookkeeping may still be under way:
 * Reservation.finishing). Returns why not when the pool is full. Places held
 * by another delivery of the same request are theirs while it lives (BusyError: retry later), unless
 * the request is already placed (AlreadyPlaced) or that delivery is known dead (taken over).
 */
export type Reserved =
  | { readonly kind: 'full'; readonly reason: string }
  | { readonly kind: 'reserved'; readonly finishing?: Promise<Error | undefined> };

export async function reserveNodes(
  ctx: Context,
  pool: MetastaticPool,
  maxServers: number,
  nodeIds: readonly string[],
  recording: Recording,
  tookOver = false,
): Promise<Reserved> {
  // Count first (two writes a place) unless this delivery took places over: then the places are there,
  // its own now, and the place-first reserve finishes what their earlier holder counted.
  const reserved = await ctx.store.reserveNodePlaces(pool.key, nodeIds, maxServers, recording.owner, {
    overlap: true,
    countFirst: !tookOver,
  });
  if (reserved.kind === 'full')
    return { kind: 'full', reason: `${pool.key} is at max-servers (${maxServers})` };
  if (reserved.kind === 'reserved') return reserved;
  await recording.checkStored(); // placed by the holder already: a duplicate
  let fenced = false;
  const now = ctx.clock.now();
  for (const [member, holder] of reserved.holders) {
    const dead = deliveryDead(ownerSince(holder), now, ctx.deliveriesDeadBefore);
    if (supersedes(recording.owner, holder)) {
      // An earlier receive of this message: taken over at once, once it can record nothing more.
      if (!fenced) await recording.fence();
      fenced = true;
    } else if (!dead) {
      throw new BusyError(`request ${recording.base.id} is being placed by another delivery; retrying later`);
    }
    // A count-up a dead holder made, its place never written, is adopted while the reaper's recovery
    // cannot take it for abandoned: younger than COUNT_ADOPTION_MS, and in the embedded pool made in this
    // process's life (recovery ends those of the process before at once).
    const adoptSince = dead
      ? Math.max(now - COUNT_ADOPTION_MS, ctx.deliveriesDeadBefore ?? Number.NEGATIVE_INFINITY)
      : undefined;
    if (!(await ctx.store.takeOverNodePlace(pool.key, member, holder, recording.owner, adoptSince))) {
      throw new BusyError(`the place of node ${member} changed hands; retrying later`);
    }
  }
  return reserveNodes(ctx, pool, maxServers, nodeIds, recording, true);
}

/** Takes this delivery's reservations back, except for nodes the stored request holds live in this pool. */
export async function unreserveOwn(
  ctx: Context,
  pool: MetastaticPool,
  nodeIds: readonly string[],
  owner: string,
  other: RequestRecord | undefined,
): Promise<void> {
  const live = new Set(
    other?.poolKey === pool.key
      ? other.nodes.filter((n) => n.state === 'pending' || n.state === 'ready').map((n) => n.id)
      : [],
  );
  await ctx.store.freeNodePlaces(
    pool.key,
    nodeIds.filter((id) => !live.has(id)),
    owner,
  );
}
