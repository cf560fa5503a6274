import type { MetastaticPool } from '../config/model.ts';
import { CapacityError, ConflictError, PermanentError, RetryableError } from '../core/errors.ts';
import { contentHash, nodeId } from '../core/ids.ts';
import type { RequestMessage } from '../core/messages.ts';
import { eligiblePools, nodeAttributes } from '../core/pools.ts';
import type { NodeRecord, RequestRecord } from '../core/records.ts';
import { assertTransition } from '../core/states.ts';
import { keys } from '../store/table.ts';
import type { Context } from './context.ts';
import { markNodesReady } from './fulfil.ts';
import { giveBackSlot, type Placement, placeNode } from './placement.ts';

export type RequestOutcome =
  | { readonly kind: 'duplicate'; readonly request: RequestRecord }
  | { readonly kind: 'placed'; readonly request: RequestRecord }
  | { readonly kind: 'failed'; readonly request: RequestRecord };

export function requestBodyHash(m: RequestMessage): string {
  return contentHash({ labels: m.labels, requestor: m.requestor, priority: m.priority });
}

/**
 * Serves a request message: records it, reserves room in the first pool (by priority) that has it,
 * places every node (existing backing nodes first, new ones launched otherwise), all or nothing.
 * Safe to run twice on the same message, at once or later: ids are derived from the request id and
 * every write is conditional.
 *
 * Throws CapacityError when no pool has room now (the message comes back later), PermanentError for
 * a request id reused with another body.
 */
export async function requestNodes(ctx: Context, m: RequestMessage): Promise<RequestOutcome> {
  const now = ctx.clock.now();
  const bodyHash = requestBodyHash(m);
  const fresh: RequestRecord = {
    id: m.id,
    labels: m.labels,
    requestor: m.requestor,
    priority: m.priority,
    bodyHash,
    state: 'requested',
    createdAt: now,
    updatedAt: now,
    version: 0,
    nodes: m.labels.map((label, i) => ({ id: nodeId(m.id, i), label, state: 'requested' })),
  };
  const choice = eligiblePools(ctx.config, m.labels);
  if (!choice.ok) {
    return { kind: 'failed', request: await recordFailure(ctx, fresh, choice.reason) };
  }
  const existing = await ctx.store.createRequest(fresh);
  if (existing && existing.bodyHash !== bodyHash) {
    throw new PermanentError(
      `request id "${m.id}" is already used by a request with a different body (labels ${existing.labels.join(', ')})`,
    );
  }
  const request = existing ?? fresh;
  if (request.state !== 'requested') {
    // Placed already (a redelivery): only make sure no ready backing node was missed.
    if (request.state === 'pending') await recheckPending(ctx, request);
    return { kind: 'duplicate', request: (await ctx.store.getRequest(m.id)) ?? request };
  }

  const waits: string[] = [];
  for (const pool of choice.pools) {
    let result: PoolResult;
    try {
      result = await tryPool(ctx, pool, request);
    } catch (err) {
      if (!(err instanceof PermanentError)) throw err;
      // Every launch attempt failed: the request ends, with the reason (tryPool gave back what it took).
      const failed = await failRequest(ctx, request.id, bodyHash, err.message);
      return { kind: 'failed', request: failed ?? request };
    }
    if (result.kind === 'placed') return result;
    waits.push(result.reason);
  }
  throw new CapacityError(`request ${m.id} waits for capacity: ${waits.join('; ')}`);
}

type PoolResult = { kind: 'placed'; request: RequestRecord } | { kind: 'full'; reason: string };

async function tryPool(ctx: Context, pool: MetastaticPool, request: RequestRecord): Promise<PoolResult> {
  const nodeIds = request.nodes.map((n) => n.id);
  const counter = keys.poolNodes(pool.key);
  if (pool.maxServers !== undefined) {
    const reserved = await ctx.store.reserve(counter, nodeIds, pool.maxServers);
    if (reserved === 'full')
      return { kind: 'full', reason: `${pool.key} is at max-servers (${pool.maxServers})` };
  }
  const placements: Placement[] = [];
  try {
    for (const node of request.nodes) {
      const label = pool.labels.get(node.label);
      if (!label) throw new Error(`pool ${pool.key} lost label ${node.label}`);
      placements.push(await placeNode(ctx, pool, label, node.id));
    }
  } catch (err) {
    // All or nothing: give back what this attempt took, then let the next pool (or a retry) try.
    await giveBack(ctx, placements);
    if (pool.maxServers !== undefined) await ctx.store.unreserve(counter, nodeIds);
    if (err instanceof CapacityError) return { kind: 'full', reason: err.message };
    throw err;
  }

  const now = ctx.clock.now();
  const nodes = request.nodes.map((n, i): NodeRecord => {
    const p = placements[i] as Placement;
    const ready = p.backing.state === 'ready';
    const state = ready ? 'ready' : 'pending';
    assertTransition('node', n.state, state);
    return {
      ...n,
      state,
      backingNodeId: p.backing.id,
      slot: p.slot,
      ...(ready
        ? {
            host: p.backing.host,
            port: p.backing.port,
            attributes: nodeAttributes(p.backing.attributes, pool.nodeAttributes),
            readyAt: now,
          }
        : {}),
    };
  });
  const state = nodes.every((n) => n.state === 'ready') ? 'fulfilled' : 'pending';
  assertTransition('request', request.state, state);
  const next: RequestRecord = {
    ...request,
    state,
    poolKey: pool.key,
    nodes,
    updatedAt: now,
    version: request.version + 1,
  };
  try {
    await ctx.store.putRequest(next, request.version);
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    // A concurrent delivery of the same message placed it first: undo ours, keep theirs.
    const winner = await ctx.store.getRequest(request.id);
    await giveBack(ctx, placements, winner);
    if (pool.maxServers !== undefined && winner?.poolKey !== pool.key)
      await ctx.store.unreserve(counter, nodeIds);
    if (!winner) throw new RetryableError(`request ${request.id} vanished while being placed`);
    return { kind: 'placed', request: winner };
  }
  ctx.log.info(`request ${state}`, { requestId: request.id, pool: pool.key, nodes: nodes.map((n) => n.id) });
  if (state === 'pending') await recheckPending(ctx, next);
  return {
    kind: 'placed',
    request: (state === 'pending' && (await ctx.store.getRequest(request.id))) || next,
  };
}

/** Undoes placements, except those the recorded request (a concurrent winner) also uses. */
async function giveBack(ctx: Context, placements: readonly Placement[], keep?: RequestRecord): Promise<void> {
  for (const p of placements) {
    const kept = keep?.nodes.some(
      (n) => n.id === p.nodeId && n.backingNodeId === p.backing.id && n.slot === p.slot,
    );
    if (!kept) await giveBackSlot(ctx, p.backing.id, p.nodeId);
  }
}

/**
 * Closes the race with the fulfil flow: a backing node that became ready between our claim and our
 * write of the pending nodes was seen by fulfil before the nodes were pending, so look again.
 */
async function recheckPending(ctx: Context, request: RequestRecord): Promise<void> {
  const backingIds = new Set(request.nodes.filter((n) => n.state === 'pending').map((n) => n.backingNodeId));
  for (const id of backingIds) {
    if (!id) continue;
    const b = await ctx.store.getBacking(id);
    if (b?.state === 'ready') await markNodesReady(ctx, b);
  }
}

/** Records a request that can never be served, unless its id is already taken (never overwrite). */
export async function recordFailure(
  ctx: Context,
  fresh: RequestRecord,
  reason: string,
): Promise<RequestRecord> {
  const failed: RequestRecord = {
    ...fresh,
    state: 'failed',
    reason,
    nodes: fresh.nodes.map((n) => ({ ...n, state: 'failed', reason })),
  };
  const existing = await ctx.store.createRequest(failed);
  ctx.log.warn('request failed', { requestId: fresh.id, reason });
  return existing ?? failed;
}

/** Ends a request that is still waiting (state requested) as failed with a reason; idempotent. */
export async function failRequest(
  ctx: Context,
  requestId: string,
  bodyHash: string,
  reason: string,
): Promise<RequestRecord | undefined> {
  const r = await ctx.store.getRequest(requestId);
  if (r?.state !== 'requested' || r.bodyHash !== bodyHash) return r;
  assertTransition('request', r.state, 'failed');
  const next: RequestRecord = {
    ...r,
    state: 'failed',
    reason,
    nodes: r.nodes.map((n) => ({ ...n, state: 'failed', reason })),
    updatedAt: ctx.clock.now(),
    version: r.version + 1,
  };
  try {
    await ctx.store.putRequest(next, r.version);
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    return ctx.store.getRequest(requestId);
  }
  ctx.log.warn('request failed', { requestId, reason });
  return next;
}
