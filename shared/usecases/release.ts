import { ConflictError, RetryableError, UnknownNodeError } from '../core/errors.ts';
import { parseNodeId } from '../core/ids.ts';
import type { NodeRecord, RequestRecord } from '../core/records.ts';
import { assertTransition } from '../core/states.ts';
import { keys } from '../store/table.ts';
import { type Context, MAX_CONFLICT_RETRIES } from './context.ts';
import { giveBackSlot } from './placement.ts';

export type ReleaseOutcome =
  | { readonly kind: 'released'; readonly node: NodeRecord }
  | { readonly kind: 'already-released'; readonly node: NodeRecord };

/**
 * Releases a node: marks it released, frees its slot (stamping the backing node's last-used time) and
 * gives its place in the pool's max-servers back. Each step is idempotent, so a redelivered release,
 * or one that resumes after a crash, finishes the job without freeing anything twice.
 */
export async function releaseNode(ctx: Context, id: string): Promise<ReleaseOutcome> {
  const parsed = parseNodeId(id);
  if (!parsed) throw new UnknownNodeError(`unknown node "${id}": node ids look like <request-id>/<index>`);
  let node: NodeRecord | undefined;
  let request: RequestRecord | undefined;
  let already = false;
  for (let i = 0; i < MAX_CONFLICT_RETRIES && !node; i++) {
    const r = await ctx.store.getRequest(parsed.requestId);
    const n = r?.nodes[parsed.index];
    if (!r || !n) throw new UnknownNodeError(`unknown node "${id}"`);
    if (r.state === 'requested') {
      throw new RetryableError(`node ${id} is still being placed; the release is retried after placement`);
    }
    if (n.state === 'released' || n.state === 'failed') {
      node = n;
      request = r;
      already = n.state === 'released';
      if (n.state === 'failed') already = true;
      break;
    }
    assertTransition('node', n.state, 'released');
    const released: NodeRecord = { ...n, state: 'released', releasedAt: ctx.clock.now() };
    const nodes = r.nodes.map((x, j) => (j === parsed.index ? released : x));
    const next: RequestRecord = { ...r, nodes, updatedAt: ctx.clock.now(), version: r.version + 1 };
    // A pending request whose last waiting node is released has nothing left to wait for.
    if (r.state === 'pending' && nodes.every((x) => x.state === 'ready' || x.state === 'released')) {
      next.state = 'fulfilled';
    }
    try {
      await ctx.store.putRequest(next, r.version);
      node = released;
      request = next;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  if (!node || !request) throw new ConflictError(`gave up releasing node ${id}`);
  if (node.backingNodeId) await giveBackSlot(ctx, node.backingNodeId, node.id);
  if (request.poolKey) await ctx.store.unreserve(keys.poolNodes(request.poolKey), [node.id]);
  if (!already) ctx.log.info('node released', { nodeId: id, backingNodeId: node.backingNodeId });
  return already ? { kind: 'already-released', node } : { kind: 'released', node };
}
