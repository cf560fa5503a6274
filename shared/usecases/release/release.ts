import { ConflictError, HeldNodeError, SpareInUseError, UnknownNodeError } from '../../core/errors.ts';
import { parseNodeId } from '../../core/ids.ts';
import { PoolEventType } from '../../core/observability.ts';
import type { NodeRecord } from '../../core/records.ts';
import { withNodes } from '../../core/request.ts';
import { retryOnConflict } from '../conflicts.ts';
import { emit, type ServeContext } from '../context.ts';
import { giveBackRoom } from '../place/backingNodes.ts';
import { failRequest, requestSettled } from '../place/requests.ts';
import { learnDuration } from '../ready/estimates.ts';
import { takeBackQuickRelease } from '../ready/forecasts.ts';
import { endSpareOf } from '../ready/minReady.ts';

export type ReleaseOutcome =
  /** `poolKey`: the pool whose room it freed. */
  | { readonly kind: 'released'; readonly node: NodeRecord; readonly poolKey?: string }
  | { readonly kind: 'already-released'; readonly node: NodeRecord }
  /** Its request was still waiting to be placed: the release cancelled it (failed, with the reason). */
  | { readonly kind: 'cancelled'; readonly node: NodeRecord };

/**
 * Releases a node: marks it released (one conditional update of its request), frees its slot
 * (stamping the backing node's last-used time) and gives its place in the pool's max-servers back.
 * Each step is idempotent, so a redelivered release, or one that resumes after a crash, finishes the
 * job without freeing anything twice.
 */
export async function releaseNode(
  ctx: ServeContext,
  id: string,
  force = false,
  /** Recorded on the node and in its event (the reaper's `lease expired`); none for a client's release. */
  reason?: string,
): Promise<ReleaseOutcome> {
  const parsed = parseNodeId(id);
  if (!parsed) throw new UnknownNodeError(`unknown node "${id}": node ids look like <request-id>/<index>`);
  const now = ctx.clock.now();
  let request = await ctx.store.releaseNodeEntry(parsed.requestId, parsed.index, now, force, reason);
  let already = false;
  // The update's condition is the transition check: only a pending or ready node becomes released.
  if (!request) {
    // The condition failed: find out why (rare path).
    const r = await ctx.store.getRequest(parsed.requestId);
    const n = r?.nodes[parsed.index];
    if (!r || !n) throw new UnknownNodeError(`unknown node "${id}"`);
    if (r.state === 'requested') {
      // Released before it was placed (waiting for capacity, or a launch under way): the requestor no
      // longer wants it, so the request ends here. A delivery placing it meanwhile loses its write and
      // gives back what it took; if it won, the request is placed and the release is retried as usual.
      const reason = `cancelled: node ${id} was released before it was placed`;
      const after = await failRequest(ctx, r.id, r.bodyHash, reason);
      if (after?.state !== 'failed') {
        throw new ConflictError(`node ${id} was placed while being released; retrying the release`);
      }
      ctx.log.info('request cancelled by a release', { requestId: r.id, nodeId: id });
      return { kind: 'cancelled', node: after.nodes[parsed.index] as NodeRecord };
    }
    if (n.takenBy && (n.state === 'pending' || n.state === 'ready')) {
      throw new SpareInUseError(
        `node ${id} is a min-ready node in use as ${n.takenBy.node}: release that node instead`,
      );
    }
    if (n.held && !force && (n.state === 'pending' || n.state === 'ready')) {
      throw new HeldNodeError(`node ${id} is held; release it with \`metastatic release ${id} --force\``);
    }
    if (n.state !== 'released' && n.state !== 'failed') {
      throw new ConflictError(`node ${id} is ${n.state} in a ${r.state} request; retrying the release`);
    }
    request = r;
    already = true;
  }
  const node = request.nodes[parsed.index] as NodeRecord;
  if (request.state === 'pending') await settleIfAllReady(ctx, request.id);
  await giveBackRoom(ctx, request.poolKey, node);
  // A node on a spare's slot: that node ends with it (its slot and place are freed there).
  await endSpareOf(ctx, node);
  if (!already) {
    ctx.log.info('node released', {
      nodeId: id,
      backingNodeId: node.backingNodeId,
      ...(reason === undefined ? {} : { reason }),
    });
    await emit(ctx, PoolEventType.nodeReleased, {
      nodeId: id,
      requestId: request.id,
      label: node.label,
      backingNodeId: node.backingNodeId,
      slot: node.slot,
      ...(reason === undefined ? {} : { reason }),
    });
  }
  if (already) return { kind: 'already-released', node };
  // How long it was kept teaches the estimate for nodes of its label without a hint (best effort).
  await learnDuration(ctx, request, node);
  // Released within seconds of its placement: its arrival teaches the forecast's weeks ahead nothing.
  takeBackQuickRelease(ctx, request, node);
  return { kind: 'released', node, ...(request.poolKey ? { poolKey: request.poolKey } : {}) };
}

/** A pending request whose last waiting node was released has nothing left to wait for. */
async function settleIfAllReady(ctx: ServeContext, requestId: string): Promise<void> {
  const settled = await retryOnConflict(
    `settling request ${requestId}`,
    async () => {
      const r = await ctx.store.getRequest(requestId);
      if (r?.state !== 'pending') return undefined;
      const next = withNodes(r, r.nodes, ctx.clock.now());
      if (next.state !== 'fulfilled') return undefined;
      await ctx.store.putRequest(next, r.version);
      return next;
    },
    () => undefined,
  );
  if (settled) await requestSettled(ctx, settled, 'after-boot'); // it was pending: it waited
}
