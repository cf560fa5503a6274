import { markFailed, markReady } from '../core/backing.ts';
import { ConflictError } from '../core/errors.ts';
import type { StateChangeEvent } from '../core/events.ts';
import { parseNodeId } from '../core/ids.ts';
import { nodeAttributes } from '../core/pools.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../core/records.ts';
import { assertTransition } from '../core/states.ts';
import { keys } from '../store/table.ts';
import { type Context, MAX_CONFLICT_RETRIES } from './context.ts';

export type FulfilOutcome =
  | { readonly kind: 'ignored'; readonly reason: string }
  | { readonly kind: 'ready'; readonly backingNodeId: string; readonly nodesReady: number }
  | { readonly kind: 'failed'; readonly backingNodeId: string; readonly nodesFailed: number };

/**
 * Reacts to a backing node's state change: running -> the backing node is ready, then its nodes, then
 * the requests all of whose nodes are ready. A resource that vanished fails its backing node and the
 * nodes on it. Every step is idempotent, so a duplicated or re-ordered event is harmless.
 */
export async function handleStateChange(ctx: Context, event: StateChangeEvent): Promise<FulfilOutcome> {
  const resourceId = event.detail['instance-id'];
  const state = event.detail.state;
  const provider = ctx.providers.forResource(resourceId);
  if (!provider) return { kind: 'ignored', reason: `no provider owns resource ${resourceId}` };

  if (state === 'running') {
    const resource = await provider.describe(resourceId);
    if (!resource) return { kind: 'ignored', reason: `resource ${resourceId} no longer exists` };
    if (resource.state !== 'running')
      return { kind: 'ignored', reason: `resource ${resourceId} is ${resource.state}` };
    const backing = await backingReady(ctx, resource.backingNodeId, resourceId, {
      host: resource.host,
      port: resource.port,
      attributes: { ...resource.attributes },
    });
    if (!backing) return { kind: 'ignored', reason: `no launching backing node for resource ${resourceId}` };
    const nodesReady = await markNodesReady(ctx, backing);
    return { kind: 'ready', backingNodeId: backing.id, nodesReady };
  }
  if (state === 'terminated' || state === 'shutting-down' || state === 'stopped' || state === 'stopping') {
    const resource = await provider.describe(resourceId);
    // Providers keep describing a gone resource for a while (EC2 does for about an hour), tags included.
    const backingId = resource?.backingNodeId;
    if (!backingId)
      return { kind: 'ignored', reason: `resource ${resourceId} is not a recorded backing node` };
    return backingLost(ctx, backingId, resourceId, `backing resource ${resourceId} is ${state}`);
  }
  return { kind: 'ignored', reason: `state ${state} needs no action` };
}

async function backingReady(
  ctx: Context,
  backingId: string,
  resourceId: string,
  details: { host?: string; port?: number; attributes: Record<string, unknown> },
): Promise<BackingRecord | undefined> {
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const b = await ctx.store.getBacking(backingId);
    if (!b) return undefined;
    if (b.state === 'ready') return b; // duplicate event
    if (b.state !== 'launching') return undefined;
    const next = markReady({ ...b, resourceId: b.resourceId ?? resourceId }, details, ctx.clock.now());
    try {
      await ctx.store.putBacking(next, { version: b.version, states: ['launching'] });
      ctx.log.info('backing node ready', {
        backingNodeId: b.id,
        resourceId,
        host: details.host,
        port: details.port,
      });
      return next;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  throw new ConflictError(
    `gave up marking backing node ${backingId} ready after ${MAX_CONFLICT_RETRIES} conflicts`,
  );
}

/**
 * Marks every pending node on a ready backing node ready, and fulfils the requests whose nodes are
 * now all ready. Called by the fulfil flow and, to close the race with it, by the request flow after
 * it records pending nodes.
 */
export async function markNodesReady(ctx: Context, backing: BackingRecord): Promise<number> {
  const byRequest = new Map<string, string[]>();
  for (const nodeId of Object.values(backing.slotMap)) {
    const parsed = parseNodeId(nodeId);
    if (!parsed) continue;
    byRequest.set(parsed.requestId, [...(byRequest.get(parsed.requestId) ?? []), nodeId]);
  }
  let count = 0;
  for (const requestId of byRequest.keys()) {
    count += await updateRequestNodes(ctx, requestId, (r) => {
      const pool = ctx.config.metastaticPools.find((p) => p.key === r.poolKey);
      let changed = 0;
      const nodes = r.nodes.map((n): NodeRecord => {
        if (n.backingNodeId !== backing.id || n.state !== 'pending') return n;
        assertTransition('node', n.state, 'ready');
        changed++;
        return {
          ...n,
          state: 'ready',
          host: backing.host,
          port: backing.port,
          attributes: nodeAttributes(backing.attributes, pool?.nodeAttributes ?? {}),
          readyAt: ctx.clock.now(),
        };
      });
      return { nodes, changed };
    });
  }
  return count;
}

/** Applies a change to a request's nodes (re-reading on conflict) and settles the request's state. */
export async function updateRequestNodes(
  ctx: Context,
  requestId: string,
  change: (r: RequestRecord) => { nodes: NodeRecord[]; changed: number },
): Promise<number> {
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const r = await ctx.store.getRequest(requestId);
    if (!r || r.state === 'requested') return 0; // not placed yet: the request flow re-checks after placing
    const { nodes, changed } = change(r);
    if (changed === 0) return 0;
    const next: RequestRecord = { ...r, nodes, updatedAt: ctx.clock.now(), version: r.version + 1 };
    if (r.state === 'pending' && nodes.every((n) => n.state === 'ready' || n.state === 'released')) {
      assertTransition('request', r.state, 'fulfilled');
      next.state = 'fulfilled';
    } else if (r.state === 'pending' && nodes.some((n) => n.state === 'failed')) {
      assertTransition('request', r.state, 'failed');
      next.state = 'failed';
      next.reason = nodes.find((n) => n.state === 'failed')?.reason ?? 'a node failed';
    }
    try {
      await ctx.store.putRequest(next, r.version);
      if (next.state !== r.state) {
        ctx.log.info(`request ${next.state}`, { requestId, reason: next.reason });
      }
      return changed;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  throw new ConflictError(`gave up updating request ${requestId} after ${MAX_CONFLICT_RETRIES} conflicts`);
}

/**
 * A backing node's resource is gone: the backing node fails (no more slots), its nodes fail so their
 * users learn it, and a request still waiting on them fails with the reason. (Re-homing waiting nodes
 * onto another backing node is the lifecycle issue's launch-retry logic.)
 */
export async function backingLost(
  ctx: Context,
  backingId: string,
  resourceId: string,
  reason: string,
): Promise<FulfilOutcome> {
  let failed: BackingRecord | undefined;
  for (let i = 0; i < MAX_CONFLICT_RETRIES && !failed; i++) {
    const b = await ctx.store.getBacking(backingId);
    if (!b || (b.state !== 'launching' && b.state !== 'ready')) {
      return { kind: 'ignored', reason: `backing node ${backingId} is ${b?.state ?? 'unknown'}` };
    }
    const next = markFailed(b, ctx.clock.now(), reason);
    try {
      await ctx.store.putBacking(next, { version: b.version, states: ['launching', 'ready'] });
      failed = next;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  if (!failed) throw new ConflictError(`gave up failing backing node ${backingId}`);
  ctx.log.warn('backing node lost', { backingNodeId: backingId, resourceId, reason });
  let nodesFailed = 0;
  const requestIds = new Set(
    Object.values(failed.slotMap)
      .map((id) => parseNodeId(id)?.requestId)
      .filter((id): id is string => id !== undefined),
  );
  for (const requestId of requestIds) {
    nodesFailed += await updateRequestNodes(ctx, requestId, (r) => {
      let changed = 0;
      const nodes = r.nodes.map((n): NodeRecord => {
        if (n.backingNodeId !== backingId || (n.state !== 'pending' && n.state !== 'ready')) return n;
        changed++;
        return { ...n, state: 'failed', reason };
      });
      return { nodes, changed };
    });
    // Failed nodes no longer count against max-servers.
    const r = await ctx.store.getRequest(requestId);
    const pool = ctx.config.metastaticPools.find((p) => p.key === r?.poolKey);
    if (r && pool) {
      const gone = r.nodes
        .filter((n) => n.backingNodeId === backingId && n.state === 'failed')
        .map((n) => n.id);
      await ctx.store.unreserve(keys.poolNodes(pool.key), gone);
    }
  }
  return { kind: 'failed', backingNodeId: backingId, nodesFailed };
}
