import { BusyError } from '../../core/errors.ts';
import { ownerSince, supersedes } from '../../core/ids.ts';
import type { MetastaticPool } from '../../core/model.ts';
import type { CapacityPort } from '../../core/poolStore.ts';
import type { RequestRecord } from '../../core/records.ts';
import { type Context, deliveryDead } from '../context.ts';
import type { Recording } from './recording.ts';

/**
 * A request's places in its pool's max-servers (requestNodes.ts): taken, in one atomic write, before its
 * nodes are placed. Returns why not when the pool is full. Places held by another delivery of the same
 * request are theirs while it lives (BusyError: retry later), unless the request is already placed
 * (AlreadyPlaced) or that delivery is superseded or known dead (then taken over, one write a place).
 */
export type Reserved = { readonly kind: 'full'; readonly reason: string } | { readonly kind: 'reserved' };

export async function reserveNodes(
  ctx: Context<CapacityPort>,
  pool: MetastaticPool,
  maxServers: number,
  nodeIds: readonly string[],
  recording: Recording,
): Promise<Reserved> {
  const reserved = await ctx.store.reserveNodePlaces(pool.key, nodeIds, maxServers, recording.owner);
  if (reserved.kind === 'full')
    return { kind: 'full', reason: `${pool.key} is at max-servers (${maxServers})` };
  if (reserved.kind === 'reserved') return reserved;
  await recording.checkStored(); // placed by the holder already: a duplicate
  let fenced = false;
  const now = ctx.clock.now();
  for (const [member, holder] of reserved.holders) {
    if (supersedes(recording.owner, holder)) {
      // An earlier receive of this message: taken over at once, once it can record nothing more.
      if (!fenced) await recording.fence();
      fenced = true;
    } else if (!deliveryDead(ownerSince(holder), now, ctx.deliveriesDeadBefore)) {
      throw new BusyError(`request ${recording.base.id} is being placed by another delivery; retrying later`);
    }
    if (!(await ctx.store.takeOverNodePlace(pool.key, member, holder, recording.owner))) {
      throw new BusyError(`the place of node ${member} changed hands; retrying later`);
    }
  }
  return reserveNodes(ctx, pool, maxServers, nodeIds, recording);
}

/** Takes this delivery's reservations back, except for nodes the stored request holds live in this pool. */
export async function unreserveOwn(
  ctx: Context<CapacityPort>,
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
