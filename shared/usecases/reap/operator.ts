import { markDrained } from '../../core/backing.ts';
import { InvalidStateError, UnknownNodeError } from '../../core/errors.ts';
import { parseNodeId } from '../../core/ids.ts';
import type { BackingPort, RequestPort } from '../../core/poolStore.ts';
import type { BackingRecord, NodeRecord } from '../../core/records.ts';
import { heldNode } from '../../core/request.ts';
import { retryOnConflict } from '../conflicts.ts';
import type { Context } from '../context.ts';

/**
 * Operator verbs. Each is one conditional write from the state that was read, retried on conflict.
 */

/** Keeps a node (and so its backing node) until an explicit, forced release. */
export async function holdNode(ctx: Context<RequestPort & BackingPort>, id: string): Promise<NodeRecord> {
  const parsed = parseNodeId(id);
  if (!parsed) throw new UnknownNodeError(`unknown node "${id}": node ids look like <request-id>/<index>`);
  return retryOnConflict(`holding node ${id}`, async () => {
    const r = await ctx.store.getRequest(parsed.requestId);
    const n = r?.nodes[parsed.index];
    if (!r || !n) throw new UnknownNodeError(`unknown node "${id}"`);
    if (n.state !== 'pending' && n.state !== 'ready') {
      throw new InvalidStateError(`node ${id} is ${n.state}; only a pending or ready node can be held`);
    }
    if (n.held) return n;
    const held = heldNode(n);
    await ctx.store.putRequest(
      {
        ...r,
        nodes: r.nodes.map((x, j) => (j === parsed.index ? held : x)),
        updatedAt: ctx.clock.now(),
        version: r.version + 1,
      },
      r.version,
    );
    ctx.log.info('node held', { nodeId: id, backingNodeId: n.backingNodeId });
    return held;
  });
}

/** Stops new allocations on a backing node; it goes as soon as it is empty (no grace). */
export async function drainBacking(
  ctx: Context<RequestPort & BackingPort>,
  id: string,
): Promise<BackingRecord> {
  return retryOnConflict(`draining backing node ${id}`, async () => {
    const b = await ctx.store.getBacking(id);
    if (!b) throw new UnknownNodeError(`unknown backing node "${id}"`);
    if (b.state !== 'launching' && b.state !== 'ready') {
      throw new InvalidStateError(
        `backing node ${id} is ${b.state}; only a launching or ready one can be drained`,
      );
    }
    if (b.drained) return b;
    const next = markDrained(b, 'drained by an operator');
    await ctx.store.putBacking(next, { version: b.version, states: ['launching', 'ready'] });
    ctx.log.info('backing node drained', { backingNodeId: id });
    return next;
  });
}
