import type { MetastaticPool } from '../config/model.ts';
import {
  CapacityError,
  ConflictError,
  LaunchFailedError,
  PermanentError,
  RetryableError,
} from '../core/errors.ts';
import { contentHash, nodeId } from '../core/ids.ts';
import type { RequestMessage } from '../core/messages.ts';
import { eligiblePools, nodeAttributes } from '../core/pools.ts';
import type { NodeRecord, RequestRecord } from '../core/records.ts';
import { assertTransition } from '../core/states.ts';
import { keys } from '../store/table.ts';
import { type Context, MAX_CONFLICT_RETRIES } from './context.ts';
import { hostKeysOf } from './failure.ts';
import { markNodesReady } from './fulfil.ts';
import { giveBackSlot, type Placement, placeNode } from './placement.ts';
import { requestSettled } from './requestEvents.ts';

export type RequestOutcome =
  | { readonly kind: 'duplicate'; readonly request: RequestRecord }
  | { readonly kind: 'placed'; readonly request: RequestRecord }
  | { readonly kind: 'failed'; readonly request: RequestRecord };

export function requestBodyHash(m: RequestMessage): string {
  return contentHash({ labels: m.labels, requestor: m.requestor, priority: m.priority });
}

/**
 * Serves a request message: reserves room in the first pool (by priority) that has it and places
 * every node (existing backing nodes first, new ones launched otherwise), all or nothing.
 *
 * Safe to run twice on the same message, at once or later. Node ids derive from the request id; the
 * request is written once, conditionally, when placed (on the warm path that write is the only one
 * besides the claim and the reservation), so a duplicate loses that write and gives back what it took.
 * Before anything it cannot give back (a launch) or before waiting, the request is recorded first,
 * which is where a duplicate is stopped.
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
  const recording = new Recording(ctx, fresh);
  const waits: string[] = [];
  try {
    for (const pool of choice.pools) {
      let result: PoolResult;
      try {
        result = await tryPool(ctx, pool, recording);
      } catch (err) {
        if (!(err instanceof LaunchFailedError)) throw err;
        // Every launch attempt failed: the request ends, with the reason (tryPool gave back what it took).
        await recording.ensure();
        const failed = await failRequest(ctx, m.id, bodyHash, err.message);
        return { kind: 'failed', request: failed ?? fresh };
      }
      if (result.kind === 'placed') return result;
      waits.push(result.reason);
    }
    // Record it as waiting, so it is visible and can be failed if the wait never ends.
    await recording.ensure();
  } catch (err) {
    if (err instanceof AlreadyPlaced) {
      if (err.request.state === 'pending') await recheckPending(ctx, err.request);
      return { kind: 'duplicate', request: (await ctx.store.getRequest(m.id)) ?? err.request };
    }
    throw err;
  }
  throw new CapacityError(`request ${m.id} waits for capacity: ${waits.join('; ')}`);
}

/** The request id belongs to a request with another body; its nodes (same ids) are not ours to touch. */
class IdReused extends PermanentError {
  constructor(readonly request: RequestRecord) {
    super(
      `request id "${request.id}" is already used by a request with a different body (labels ${request.labels.join(', ')})`,
    );
  }
}

/** The request was already placed (or ended) by an earlier or concurrent delivery. */
class AlreadyPlaced extends Error {
  constructor(readonly request: RequestRecord) {
    super(`request ${request.id} is already ${request.state}`);
  }
}

/**
 * What this delivery knows of the stored request: nothing yet (the warm path writes it once, at the
 * end) or the `requested` record it wrote or found.
 */
class Recording {
  private stored: RequestRecord | undefined;

  constructor(
    private readonly ctx: Context,
    private readonly fresh: RequestRecord,
  ) {}

  /** The record to build the placed request from. */
  get base(): RequestRecord {
    return this.stored ?? this.fresh;
  }

  /** Makes sure a `requested` record exists; throws AlreadyPlaced if a delivery got further. */
  async ensure(): Promise<void> {
    if (this.stored) return;
    const existing = await this.ctx.store.createRequest(this.fresh);
    this.stored = existing ? this.adopt(existing) : this.fresh;
  }

  /** Writes the placed request; returns the winner instead when another delivery placed it first. */
  async write(next: (base: RequestRecord) => RequestRecord): Promise<RequestRecord | undefined> {
    for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
      const base = this.base;
      const placed = next(base);
      let existing: RequestRecord | undefined;
      if (this.stored) {
        try {
          await this.ctx.store.putRequest(placed, base.version);
          return undefined;
        } catch (err) {
          if (!(err instanceof ConflictError)) throw err;
          existing = await this.ctx.store.getRequest(this.fresh.id);
        }
      } else {
        existing = await this.ctx.store.createRequest(placed);
        if (!existing) return undefined;
      }
      if (!existing) throw new RetryableError(`request ${this.fresh.id} vanished while being placed`);
      try {
        this.stored = this.adopt(existing); // a waiting record: place onto it
      } catch (err) {
        if (err instanceof AlreadyPlaced) return err.request;
        throw err;
      }
    }
    throw new ConflictError(`gave up writing request ${this.fresh.id}`);
  }

  private adopt(existing: RequestRecord): RequestRecord {
    if (existing.bodyHash !== this.fresh.bodyHash) throw new IdReused(existing);
    if (existing.state !== 'requested') throw new AlreadyPlaced(existing);
    return existing;
  }
}

type PoolResult = { kind: 'placed'; request: RequestRecord } | { kind: 'full'; reason: string };

async function tryPool(ctx: Context, pool: MetastaticPool, recording: Recording): Promise<PoolResult> {
  const requestId = recording.base.id;
  const nodeIds = recording.base.nodes.map((n) => n.id);
  const counter = keys.poolNodes(pool.key);
  if (pool.maxServers !== undefined) {
    const reserved = await ctx.store.reserve(counter, nodeIds, pool.maxServers);
    if (reserved === 'full')
      return { kind: 'full', reason: `${pool.key} is at max-servers (${pool.maxServers})` };
  }
  const placements: Placement[] = [];
  let winner: RequestRecord | undefined;
  try {
    for (const node of recording.base.nodes) {
      const label = pool.labels.get(node.label);
      if (!label) throw new Error(`pool ${pool.key} lost label ${node.label}`);
      placements.push(await placeNode(ctx, pool, label, node.id, { beforeLaunch: () => recording.ensure() }));
    }
    const now = ctx.clock.now();
    winner = await recording.write((base) => placedRequest(base, pool, placements, now));
  } catch (err) {
    // All or nothing: give back what this attempt took, then let the next pool (or a retry) try.
    const other = err instanceof AlreadyPlaced || err instanceof IdReused ? err.request : undefined;
    await giveBack(ctx, placements, other);
    if (pool.maxServers !== undefined) await unreserveUnlessLive(ctx, pool, nodeIds, other);
    if (err instanceof CapacityError) return { kind: 'full', reason: err.message };
    throw err;
  }
  if (winner) {
    await giveBack(ctx, placements, winner);
    if (pool.maxServers !== undefined) await unreserveUnlessLive(ctx, pool, nodeIds, winner);
    throw new AlreadyPlaced(winner);
  }
  const placed = placedRequest(recording.base, pool, placements, ctx.clock.now());
  ctx.log.info(`request ${placed.state}`, { requestId, pool: pool.key, nodes: nodeIds });
  await requestSettled(ctx, placed);
  if (placed.state === 'pending') {
    await recheckPending(ctx, placed);
    return { kind: 'placed', request: (await ctx.store.getRequest(requestId)) ?? placed };
  }
  return { kind: 'placed', request: placed };
}

function placedRequest(
  base: RequestRecord,
  pool: MetastaticPool,
  placements: readonly Placement[],
  now: number,
): RequestRecord {
  const nodes = base.nodes.map((n, i): NodeRecord => {
    const p = placements[i] as Placement;
    const ready = p.backing.state === 'ready';
    const state = ready ? 'ready' : 'pending';
    assertTransition('node', n.state, state);
    return {
      ...n,
      state,
      backingNodeId: p.backing.id,
      slot: p.slot,
      attempts: p.attempt,
      ...(ready
        ? {
            host: p.backing.host,
            port: p.backing.port,
            attributes: nodeAttributes(p.backing.attributes, pool.nodeAttributes),
            hostKeys: p.hostKeys ?? hostKeysOf(p.backing),
            readyAt: now,
          }
        : {}),
    };
  });
  const state = nodes.every((n) => n.state === 'ready') ? 'fulfilled' : 'pending';
  assertTransition('request', base.state, state);
  return { ...base, state, poolKey: pool.key, nodes, updatedAt: now, version: base.version + 1 };
}

/** Takes our reservation back, except for the nodes another delivery holds live in this pool. */
async function unreserveUnlessLive(
  ctx: Context,
  pool: MetastaticPool,
  nodeIds: readonly string[],
  other: RequestRecord | undefined,
): Promise<void> {
  const live = new Set(
    other?.poolKey === pool.key
      ? other.nodes.filter((n) => n.state === 'pending' || n.state === 'ready').map((n) => n.id)
      : [],
  );
  await ctx.store.unreserve(
    keys.poolNodes(pool.key),
    nodeIds.filter((id) => !live.has(id)),
  );
}

/** Undoes placements, except those the recorded request (a concurrent winner) also uses. */
async function giveBack(ctx: Context, placements: readonly Placement[], keep?: RequestRecord): Promise<void> {
  for (const p of placements) {
    const kept = keep?.nodes.some(
      (n) =>
        n.id === p.nodeId &&
        n.backingNodeId === p.backing.id &&
        n.slot === p.slot &&
        (n.state === 'pending' || n.state === 'ready'),
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
  if (existing) return existing; // the id is taken: never overwrite, and it is not this one that failed
  ctx.log.warn('request failed', { requestId: fresh.id, reason });
  await requestSettled(ctx, failed);
  return failed;
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
  await requestSettled(ctx, next);
  return next;
}
