import { claimOf } from '../../core/backing.ts';
import { BusyError, CapacityError, LaunchFailedError, PermanentError } from '../../core/errors.ts';
import { ownerToken, parseNodeId } from '../../core/ids.ts';
import type { BackingRecord, RequestRecord } from '../../core/records.ts';
import { placedNode, withNodes } from '../../core/request.ts';
import { DELIVERY_DEADLINE_MS } from '../../core/timing.ts';
import { retryOnConflict } from '../conflicts.ts';
import { leaseExpired, type ServeContext, timeLeft } from '../context.ts';
import { type FailBacking, giveBackSlot, markBackingFailed } from '../place/backingNodes.ts';
import { type Placement, placeNode } from '../place/placement.ts';
import { failNodes, failTakerOf, requestSettled } from '../place/requests.ts';
import { markNodesReady, unrecordableReason } from '../ready/nodesReady.ts';

/**
 * A backing node that failed, and the nodes on it. This is where the domain recurses: settling a failed
 * backing node moves its waiting nodes (placeNode, markNodesReady), and placing or readying a node can
 * find another backing node bad and fail it, which settles that one's nodes in turn. placement.ts and
 * nodesReady.ts do not import this module: the step is passed to them as `failBadBacking` (FailBacking).
 * It ends: each step fails a backing node that was live before, and a node moves at most launch-retries
 * times.
 */

export interface FailOptions {
  /**
   * The resource is gone or going (terminated, spot reclaim, vanished): ready nodes fail too. When
   * false (a boot or host-key failure of a resource that still runs), ready nodes keep running.
   */
  readonly resourceGone: boolean;
  /** Leave the nodes waiting on it in place for the reaper to move (the embedded pool is shutting down). */
  readonly deferRehoming?: boolean;
}

export interface SettleReport {
  rehomed: number;
  failed: number;
  waiting: number;
}

/**
 * Marks a backing node failed (no more slots on it) and settles the nodes on it: nodes still waiting
 * move to another backing node under the same node ids (until launch-retries attempts are spent, then
 * their request fails); ready nodes fail when the resource is gone (their users learn it) and run to
 * completion otherwise. Idempotent and resumable: the reaper calls settleFailedNodes again for every
 * failed backing node that still holds slots.
 */
export async function failBackingNode(
  ctx: ServeContext,
  backingId: string,
  reason: string,
  options: FailOptions,
): Promise<SettleReport | undefined> {
  const failed = await markBackingFailed(ctx, backingId, reason);
  if (!failed) return undefined;
  return settleFailedNodes(ctx, failed, options.resourceGone, options.deferRehoming);
}

/** The step placement and readiness take to fail a backing node they found bad (its resource still runs). */
export const failBadBacking: FailBacking = (ctx, backingId, reason) =>
  failBackingNode(ctx, backingId, reason, { resourceGone: false });

/** Settles every slot of a failed backing node (see failBackingNode). */
export async function settleFailedNodes(
  ctx: ServeContext,
  b: BackingRecord,
  resourceGone: boolean,
  deferRehoming = false,
): Promise<SettleReport> {
  const report: SettleReport = { rehomed: 0, failed: 0, waiting: 0 };
  const reason = b.reason ?? `backing node ${b.id} failed`;
  for (const [slotText, nodeId] of Object.entries(b.slotMap)) {
    const slot = Number(slotText);
    const parsed = parseNodeId(nodeId);
    const r = parsed ? await ctx.store.getRequest(parsed.requestId) : undefined;
    const n = parsed ? r?.nodes[parsed.index] : undefined;
    if (!r || !n || !parsed || n.backingNodeId !== b.id || n.slot !== slot) {
      // A claim no recorded node confirms: a placement in progress, or one that crashed. Give it
      // back once the lease has passed (a live placement records its node long before).
      const claim = claimOf(b, slot);
      if (!claim)
        await giveBackSlot(ctx, b.id, nodeId); // confirmed once, recorded elsewhere since
      else if (leaseExpired(claim.at, ctx.clock.now()))
        await giveBackSlot(ctx, b.id, nodeId, { owner: claim.by, claimedAt: claim.at });
      else report.waiting++;
      continue;
    }
    if (n.state === 'pending' && deferRehoming) {
      report.waiting++;
    } else if (n.state === 'pending') {
      const outcome = await rehomeNode(ctx, r.id, parsed.index, b.id, reason);
      if (outcome === 'rehomed') report.rehomed++;
      else if (outcome === 'failed') report.failed++;
      else report.waiting++;
    } else if (n.state === 'ready') {
      if (resourceGone) {
        await failNodes(ctx, r.id, reason, (node) => node.id === n.id);
        report.failed++;
      }
    } else {
      // Ended (released or failed) but still on its slot: a release or failure cut short. A min-ready
      // node's taker runs on this slot: it fails first (failNodes does so too; this finishes it).
      if (n.state === 'failed') await failTakerOf(ctx, n, n.reason ?? reason);
      await giveBackSlot(ctx, b.id, nodeId);
    }
  }
  return report;
}

/**
 * Moves a waiting node off a failed backing node, under the same node id: onto another backing node
 * with a free slot, or a new one (its next launch attempt). When every attempt is spent, the node's
 * request fails with the reason and gives back everything it holds.
 */
export async function rehomeNode(
  ctx: ServeContext,
  requestId: string,
  index: number,
  fromBackingId: string,
  reason: string,
): Promise<'rehomed' | 'failed' | 'waiting' | 'moved-already'> {
  // No time left in this invocation: the node keeps waiting, for the reaper's next run to move.
  if (timeLeft(ctx) <= 0) return 'waiting';
  const r = await ctx.store.getRequest(requestId);
  const n = r?.nodes[index];
  if (!r || !n || n.state !== 'pending' || n.backingNodeId !== fromBackingId) return 'moved-already';
  const pool = ctx.config.metastaticPools.find((p) => p.key === r.poolKey);
  const label = pool?.labels.get(n.label);
  const attempts = n.attempts ?? 1;
  if (!pool || !label) {
    await failNodes(ctx, requestId, `${reason}; label ${n.label} is no longer configured`, () => true);
    return 'failed';
  }
  // This re-homing is a delivery of its own: its claim is given back only by it (see placement.ts).
  const startedAt = ctx.clock.now();
  const owner = ownerToken(startedAt);
  let placement: Placement;
  try {
    // The recursion (see the top of this module): placing it may fail another backing node.
    placement = await placeNode(ctx, pool, label, n.id, {
      owner,
      previousAttempts: attempts,
      failBacking: failBadBacking,
    });
  } catch (err) {
    // No room now, or another re-homing of this node is under way: retried on the reaper's next run.
    if (err instanceof CapacityError || err instanceof BusyError) return 'waiting';
    if (!(err instanceof LaunchFailedError)) throw err;
    const why = `node ${n.id} failed after ${pool.launchRetries} attempt(s): ${reason}`;
    await failNodes(ctx, requestId, why, () => true);
    return 'failed';
  }
  let moved: RequestRecord | 'waiting' | 'moved-already';
  try {
    moved = await moveOnto(ctx, requestId, index, fromBackingId, placement, pool.nodeAttributes, startedAt);
  } catch (err) {
    // The store refuses the moved node for good (placed ready, it carries its attributes): the request
    // ends with the reason rather than be retried by every reaper run.
    if (!(err instanceof PermanentError)) throw err;
    await giveBackSlot(ctx, placement.backing.id, n.id, { owner });
    await failNodes(ctx, requestId, unrecordableReason(err), () => true);
    return 'failed';
  }
  if (typeof moved === 'string') {
    await giveBackSlot(ctx, placement.backing.id, n.id, { owner });
    return moved;
  }
  await giveBackSlot(ctx, fromBackingId, n.id);
  // Its node waited for another backing node after its first failed.
  if (moved.state === 'fulfilled') await requestSettled(ctx, moved, 'after-boot');
  ctx.log.info('node moved to another backing node', {
    nodeId: n.id,
    from: fromBackingId,
    to: placement.backing.id,
    attempt: placement.attempt,
    reason,
  });
  if (placement.backing.state !== 'ready') {
    const b = await ctx.store.getBacking(placement.backing.id);
    if (b?.state === 'ready') await markNodesReady(ctx, b, failBadBacking);
  }
  return 'rehomed';
}

/** Records a waiting node on its new placement (one version-checked write of its request). */
async function moveOnto(
  ctx: ServeContext,
  requestId: string,
  index: number,
  fromBackingId: string,
  placement: Placement,
  nodeAttributes: Readonly<Record<string, unknown>>,
  startedAt: number,
): Promise<RequestRecord | 'waiting' | 'moved-already'> {
  return retryOnConflict(`moving node ${requestId}/${index}`, async () => {
    const current = await ctx.store.getRequest(requestId);
    const node = current?.nodes[index];
    // Our claim may be taken over, or the invocation is about to end: give it back and wait.
    const late = ctx.clock.now() - startedAt > DELIVERY_DEADLINE_MS || timeLeft(ctx) <= 0;
    if (!current || !node || node.state !== 'pending' || node.backingNodeId !== fromBackingId || late) {
      return late ? 'waiting' : 'moved-already'; // someone else moved it first
    }
    const now = ctx.clock.now();
    const nodes = current.nodes.map((x, j) =>
      j === index ? placedNode(x, placement, nodeAttributes, now) : x,
    );
    const next = withNodes(current, nodes, now);
    await ctx.store.putRequest(next, current.version);
    return next;
  });
}
