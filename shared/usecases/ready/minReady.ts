import { hashOf } from '../../core/backing.ts';
import { ownerToken, parseNodeId } from '../../core/ids.ts';
import { isFreeSpare, spareRequestId, takenSpare } from '../../core/minReady.ts';
import type { MetastaticLabel, MetastaticPool } from '../../core/model.ts';
import type { MinReadyState } from '../../core/poolStore.ts';
import type { ReadyHold } from '../../core/readyRoom.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../../core/records.ts';
import { placedNode, withNodes } from '../../core/request.ts';
import { retryOnConflict, unlessConflict } from '../conflicts.ts';
import type { ServeContext } from '../context.ts';
import { type FailBacking, giveBackRoom, giveBackSlot } from '../place/backingNodes.ts';
import { claimSlotOn } from '../place/placement.ts';

/**
 * min-ready's use cases on one spare (the model is core/minReady.ts): taking it for a request's node,
 * returning it (taken, never recorded), and ending it. Keeping each label's seats filled is replenish.ts.
 */

/**
 * What a delivery's takes read and wrote: each label's seats as the take read them, and each
 * spare's request as the take wrote it. The refill that follows a take (the request function's, at once)
 * starts from these instead of reading them again: the take read the seats a moment before, and a spare
 * taken and recorded by its taker stays so (its seat can only move on: core/minReady.ts seatStep), so
 * what the delivery wrote is what the refill would read, or its seat's advance (conditional on the
 * generation) tells it otherwise.
 */
export interface SparesSeen {
  readonly seats: Map<string, MinReadyState>;
  readonly spares: Map<string, RequestRecord>;
}

export const noSparesSeen = (): SparesSeen => ({ seats: new Map(), spares: new Map() });

/**
 * Takes a free spare of the label in `pool` for node `nodeId`, with one conditional write of the spare's
 * request; undefined when there is none. Concurrent takers start at different seats (by node id), and
 * one that loses a spare to another goes on to the next. What it read of the seats and wrote of the spare
 * goes into `seen`.
 */
export async function takeSpare(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: string,
  nodeId: string,
  owner: string,
  seen: SparesSeen = noSparesSeen(),
): Promise<NodeRecord | undefined> {
  const auto = ctx.config.readyAuto?.has(label) === true;
  if (!auto && !ctx.config.minReady.has(label)) return undefined;
  const state = seen.seats.get(label) ?? (await ctx.store.minReadyState(label));
  seen.seats.set(label, state);
  const { gens } = state;
  const seats = seatsOf(ctx, label, state.hold);
  if (seats === 0) return undefined;
  const start = hashOf(nodeId) % seats;
  const ids = Array.from({ length: seats }, (_, i) => (start + i) % seats).map((k) =>
    spareRequestId(label, k, gens.get(k) ?? 0),
  );
  // The first seat (by node id) is taken at once, with no read: when spares are free (the usual case)
  // that one write takes one. Otherwise the others are read, a few at a time, and the first free one
  // found is taken (a conditional write on its version).
  const [first, ...rest] = ids;
  if (first !== undefined) {
    const taken = await takeAtOnce(ctx, pool, first, nodeId, owner);
    if (taken) {
      seen.spares.set(taken.id, taken);
      return taken.nodes[0];
    }
  }
  for (let at = 0; at < rest.length; at += SEATS_PER_READ) {
    const batch = rest.slice(at, at + SEATS_PER_READ);
    for (const read of await Promise.all(batch.map((id) => ctx.store.getRequest(id)))) {
      const taken = await takeThis(ctx, pool, read, nodeId, owner);
      if (taken) {
        seen.spares.set(taken.id, taken);
        return taken.nodes[0];
      }
    }
  }
  return undefined;
}

/**
 * The seats of a label's min-ready: its number, or with `min-ready: auto` the seats the reaper's last
 * decision holds (none before the first).
 */
export function seatsOf(ctx: ServeContext, label: string, hold: ReadyHold | undefined): number {
  if (ctx.config.readyAuto?.has(label)) return hold?.seats ?? 0;
  return ctx.config.minReady.get(label) ?? 0;
}

/** Seats whose spares are read at once while looking for a free one. */
const SEATS_PER_READ = 4;

/**
 * Takes spare `id` with one conditional update (free, in this pool), then checks its backing node still
 * takes new nodes; one that does not is returned at once (free again: the upkeep replaces it).
 */
async function takeAtOnce(
  ctx: ServeContext,
  pool: MetastaticPool,
  id: string,
  nodeId: string,
  owner: string,
): Promise<RequestRecord | undefined> {
  const taken = await ctx.store.takeSpareNode(id, pool.key, { node: nodeId, by: owner, at: ctx.clock.now() });
  const node = taken?.nodes[0];
  if (!taken || !node?.backingNodeId) return undefined;
  const backing = await ctx.store.getBacking(node.backingNodeId);
  if (!backing || !usableSpareHost(backing, ctx.clock.now())) {
    await returnSpare(ctx, node.id, owner);
    return undefined;
  }
  ctx.log.info('min-ready node taken', { nodeId, spare: node.id, backingNodeId: node.backingNodeId });
  return taken;
}

async function takeThis(
  ctx: ServeContext,
  pool: MetastaticPool,
  read: RequestRecord | undefined,
  nodeId: string,
  owner: string,
): Promise<RequestRecord | undefined> {
  let spare = read;
  for (let round = 0; spare && round < 3; round++) {
    const node = spare.nodes[0];
    if (spare.poolKey !== pool.key || !isFreeSpare(node) || !node.backingNodeId) return undefined;
    const backing = await ctx.store.getBacking(node.backingNodeId);
    if (!backing || !usableSpareHost(backing, ctx.clock.now())) return undefined; // the upkeep replaces it
    const taken = takenSpare(spare, nodeId, owner, ctx.clock.now());
    const version = spare.version;
    if (await unlessConflict(() => ctx.store.putRequest(taken, version))) {
      ctx.log.info('min-ready node taken', { nodeId, spare: node.id, backingNodeId: node.backingNodeId });
      return taken;
    }
    spare = await ctx.store.getRequest(spare.id); // lost it: released, or taken by another; look again
  }
  return undefined;
}

/** Whether a new node may start on this backing node: ready, not drained, within max-age. */
export function usableSpareHost(b: BackingRecord, now: number): boolean {
  return b.state === 'ready' && !b.drained && (b.noNewNodesAfter === undefined || now < b.noNewNodesAfter);
}

/**
 * Ends a spare's node (released) if `mayEnd` says so of it as it is now, and gives back its slot and its
 * place in max-servers (also when it had ended already: a crash may have cut that short). Every write
 * is conditional on the version read, so a spare is never ended under a request that just took it.
 * Returns whether the spare's node is ended now.
 */
export async function endSpare(
  ctx: ServeContext,
  spareNodeId: string,
  mayEnd: (n: NodeRecord) => boolean,
  why: string,
): Promise<boolean> {
  const parsed = parseNodeId(spareNodeId);
  if (!parsed) return false;
  const ended = await retryOnConflict(`ending min-ready node ${spareNodeId}`, async () => {
    const r = await ctx.store.getRequest(parsed.requestId);
    const n = r?.nodes[parsed.index];
    if (!r || !n) return undefined;
    if (n.state === 'released' || n.state === 'failed') return { r, n };
    if (r.state === 'requested') return undefined; // not placed: nothing to end
    if (!mayEnd(n)) return undefined;
    const now = ctx.clock.now();
    const released: NodeRecord = { ...n, state: 'released', releasedAt: now, reason: why };
    const next = withNodes(
      r,
      r.nodes.map((x, i) => (i === parsed.index ? released : x)),
      now,
    );
    await ctx.store.putRequest(next, r.version);
    ctx.log.info('min-ready node ended', { nodeId: spareNodeId, reason: why });
    return { r: next, n: released };
  });
  if (!ended) return false;
  await giveBackRoom(ctx, ended.r.poolKey, ended.n);
  // A move cut short before it gave back the slot it left: that slot goes too.
  const from = ended.n.movedFrom;
  if (from && from.backingNodeId !== ended.n.backingNodeId)
    await giveBackSlot(ctx, from.backingNodeId, ended.n.id);
  return true;
}

/**
 * Gives a spare this delivery took (`owner`) back, free again: its taker never recorded it (it lost the
 * request to another delivery, or could not place the rest of the request). Safe because a seat moves on
 * only once the taker's request records its spare (core/minReady.ts, seatStep): until then the seat
 * still counts this one, so freeing it cannot overshoot. A spare ended or taken over meanwhile is left.
 */
export async function returnSpare(ctx: ServeContext, spareNodeId: string, owner: string): Promise<boolean> {
  const parsed = parseNodeId(spareNodeId);
  if (!parsed) return false;
  return retryOnConflict(`returning min-ready node ${spareNodeId}`, async () => {
    const r = await ctx.store.getRequest(parsed.requestId);
    const n = r?.nodes[parsed.index];
    if (!r || !n || n.takenBy?.by !== owner || (n.state !== 'ready' && n.state !== 'pending')) return false;
    const { takenBy: _returned, ...free } = n;
    const next: RequestRecord = {
      ...r,
      nodes: r.nodes.map((x, i) => (i === parsed.index ? free : x)),
      updatedAt: ctx.clock.now(),
      version: r.version + 1,
    };
    await ctx.store.putRequest(next, r.version);
    ctx.log.info('min-ready node returned', { nodeId: spareNodeId });
    return true;
  });
}

/** Ends the spare a node took, once that node is released or failed (its slot and place go with it). */
export function endSpareOf(ctx: ServeContext, n: NodeRecord): Promise<boolean> {
  if (!n.spare) return Promise.resolve(false);
  return endSpare(ctx, n.spare, (s) => s.takenBy?.node === n.id, `its taker ${n.id} ended`);
}

/**
 * Moves a free spare (its request as read, `spare`) from the backing node it is on onto `onto`, a
 * fuller one with a free slot: min-ready's consolidation (replenish.ts), so that spares fill the free
 * slots of backing nodes that run anyway and the emptier ones can go. The new slot first (a claim, the
 * same conditional write as any placement's), then the spare's request moves to it (a put conditioned
 * on the version read, recording the slot it leaves), then the old slot is given back. A request that
 * takes the spare meanwhile changes that version: its take wins, the move gives its new slot back, and
 * the taker runs where it found the spare. Returns the backing node it moved onto as its claim left
 * it, or undefined when it did not move. `failBacking` fails a backing node the claim finds bad (the
 * caller's: failure.ts, whose imports reach back here).
 */
export async function moveSpare(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: MetastaticLabel,
  spare: RequestRecord,
  onto: BackingRecord,
  failBacking: FailBacking,
): Promise<BackingRecord | undefined> {
  const node = spare.nodes[0];
  if (!isFreeSpare(node) || !node.backingNodeId || node.slot === undefined || node.movedFrom)
    return undefined;
  if (node.backingNodeId === onto.id) return undefined;
  const owner = ownerToken(ctx.clock.now());
  const placement = await claimSlotOn(ctx, pool, label, onto, node.id, {
    owner,
    failBacking,
  });
  if (placement?.backing.state !== 'ready') {
    if (placement) await giveBackSlot(ctx, onto.id, node.id, { owner });
    return undefined;
  }
  const now = ctx.clock.now();
  const from = { backingNodeId: node.backingNodeId, slot: node.slot };
  // Its connection details are the new backing node's; it has been ready since it first was.
  const moved: NodeRecord = {
    ...placedNode(node, placement, pool.nodeAttributes, now),
    ...(node.readyAt === undefined ? {} : { readyAt: node.readyAt }),
    movedFrom: from,
  };
  const next = withNodes(spare, [moved, ...spare.nodes.slice(1)], now);
  if (!(await unlessConflict(() => ctx.store.putRequest(next, spare.version)))) {
    // Taken (or ended) since it was read: that write stands, and the new slot goes back.
    await giveBackSlot(ctx, onto.id, node.id, { owner });
    return undefined;
  }
  ctx.log.info('min-ready node moved', { nodeId: node.id, from: from.backingNodeId, to: onto.id });
  await finishMove(ctx, next);
  return placement.backing;
}

/**
 * The last step of a move (moveSpare): gives back the slot the spare left, then forgets it. Idempotent;
 * an upkeep calls it for a spare whose move was cut short there.
 */
export async function finishMove(ctx: ServeContext, spare: RequestRecord): Promise<void> {
  const node = spare.nodes[0];
  const from = node?.movedFrom;
  if (!node || !from) return;
  // Never the slot it is on now (it cannot be: a spare with movedFrom is not moved again).
  if (from.backingNodeId !== node.backingNodeId) await giveBackSlot(ctx, from.backingNodeId, node.id);
  const { movedFrom: _done, ...settled } = node;
  await unlessConflict(() =>
    ctx.store.putRequest(
      { ...spare, nodes: [settled, ...spare.nodes.slice(1)], version: spare.version + 1 },
      spare.version,
    ),
  ); // lost to a take or an end: that writer's record keeps movedFrom, given back when the spare ends
}
