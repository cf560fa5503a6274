import { claimOf, markFailed } from '../core/backing.ts';
import { BusyError, CapacityError, ConflictError, LaunchFailedError } from '../core/errors.ts';
import { ownerToken, parseNodeId } from '../core/ids.ts';
import { nodeAttributes } from '../core/pools.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../core/records.ts';
import { assertTransition } from '../core/states.ts';
import { boundedReason } from '../core/text.ts';
import { keys } from '../store/table.ts';
import {
  type Context,
  DELIVERY_DEADLINE_MS,
  leaseExpired,
  MAX_CONFLICT_RETRIES,
  timeLeft,
} from './context.ts';
import { markNodesReady } from './fulfil.ts';
import { giveBackSlot, type Placement, placeNode } from './placement.ts';
import { requestSettled } from './requestEvents.ts';

export interface FailOptions {
  /** The resource is gone (terminated, reclaimed, killed): its ready nodes fail too. */
  readonly resourceGone: boolean;
  /** Settle the nodes on it now (default); the launch path leaves that to its caller. */
  readonly handleNodes?: boolean;
  /** Leave waiting nodes where they are, for the reaper to move later (the pool is shutting down). */
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
  ctx: Context,
  backingId: string,
  reason: string,
  options: FailOptions,
): Promise<SettleReport | undefined> {
  let failed: BackingRecord | undefined;
  for (let i = 0; i < MAX_CONFLICT_RETRIES && !failed; i++) {
    const b = await ctx.store.getBacking(backingId);
    if (!b) return undefined;
    if (b.state === 'failed') {
      failed = b;
      break;
    }
    if (b.state !== 'launching' && b.state !== 'ready') return undefined;
    const next = markFailed(b, ctx.clock.now(), reason);
    try {
      await ctx.store.putBacking(next, { version: b.version, states: ['launching', 'ready'] });
      failed = next;
      ctx.log.warn('backing node failed', { backingNodeId: backingId, resourceId: b.resourceId, reason });
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  if (!failed) throw new ConflictError(`gave up failing backing node ${backingId}`);
  if (options.handleNodes === false) return undefined;
  return settleFailedNodes(ctx, failed, options.resourceGone, options.deferRehoming);
}

/** Settles every slot of a failed backing node (see failBackingNode). */
export async function settleFailedNodes(
  ctx: Context,
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
  ctx: Context,
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
    placement = await placeNode(ctx, pool, label, n.id, { owner, previousAttempts: attempts });
  } catch (err) {
    // No room now, or another re-homing of this node is under way: retried on the reaper's next run.
    if (err instanceof CapacityError || err instanceof BusyError) return 'waiting';
    if (!(err instanceof LaunchFailedError)) throw err;
    const why = `node ${n.id} failed after ${pool.launchRetries} attempt(s): ${reason}`;
    await failNodes(ctx, requestId, why, () => true);
    return 'failed';
  }
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const current = await ctx.store.getRequest(requestId);
    const node = current?.nodes[index];
    // Our claim may be taken over, or the invocation is about to end: give it back and wait.
    const late = ctx.clock.now() - startedAt > DELIVERY_DEADLINE_MS || timeLeft(ctx) <= 0;
    if (!current || !node || node.state !== 'pending' || node.backingNodeId !== fromBackingId || late) {
      await giveBackSlot(ctx, placement.backing.id, n.id, { owner }); // someone else moved it first
      return late ? 'waiting' : 'moved-already';
    }
    const ready = placement.backing.state === 'ready';
    const moved: NodeRecord = {
      ...node,
      state: ready ? 'ready' : 'pending',
      backingNodeId: placement.backing.id,
      slot: placement.slot,
      attempts: placement.attempt,
      ...(ready
        ? {
            host: placement.backing.host,
            port: placement.backing.port,
            attributes: nodeAttributes(placement.backing.attributes, pool.nodeAttributes),
            hostKeys: placement.hostKeys ?? hostKeysOf(placement.backing),
            readyAt: ctx.clock.now(),
          }
        : {}),
    };
    const nodes = current.nodes.map((x, j) => (j === index ? moved : x));
    const next: RequestRecord = {
      ...current,
      nodes,
      updatedAt: ctx.clock.now(),
      version: current.version + 1,
    };
    if (current.state === 'pending' && nodes.every((x) => x.state === 'ready' || x.state === 'released')) {
      assertTransition('request', current.state, 'fulfilled');
      next.state = 'fulfilled';
    }
    try {
      await ctx.store.putRequest(next, current.version);
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
      continue;
    }
    await giveBackSlot(ctx, fromBackingId, n.id);
    if (next.state === 'fulfilled') await requestSettled(ctx, next);
    ctx.log.info('node moved to another backing node', {
      nodeId: n.id,
      from: fromBackingId,
      to: placement.backing.id,
      attempt: placement.attempt,
      reason,
    });
    if (!ready) {
      const b = await ctx.store.getBacking(placement.backing.id);
      if (b?.state === 'ready') await markNodesReady(ctx, b);
    }
    return 'rehomed';
  }
  throw new ConflictError(`gave up moving node ${n.id}`);
}

/**
 * Fails the matching live nodes of a request, with the reason. A request not yet fulfilled fails as a
 * whole (a node set is all or nothing): all its live nodes fail. Every failed node gives back its slot
 * and its place in the pool's max-servers.
 */
export async function failNodes(
  ctx: Context,
  requestId: string,
  why: string,
  which: (n: NodeRecord) => boolean,
): Promise<void> {
  const reason = boundedReason(why); // stored on every failing node: keep the item within DynamoDB's limit
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const r = await ctx.store.getRequest(requestId);
    if (!r) return;
    const wholeRequest = r.state === 'pending' || r.state === 'requested';
    const live = (n: NodeRecord) => n.state === 'pending' || n.state === 'ready' || n.state === 'requested';
    const failing = r.nodes.filter((n) => live(n) && (wholeRequest || which(n)));
    if (failing.length === 0) return;
    const ids = new Set(failing.map((n) => n.id));
    const nodes = r.nodes.map((n): NodeRecord => {
      if (!ids.has(n.id)) return n;
      assertTransition('node', n.state, 'failed');
      return { ...n, state: 'failed', reason };
    });
    const next: RequestRecord = { ...r, nodes, updatedAt: ctx.clock.now(), version: r.version + 1 };
    if (wholeRequest) {
      assertTransition('request', r.state, 'failed');
      next.state = 'failed';
      next.reason = reason;
    }
    try {
      await ctx.store.putRequest(next, r.version);
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
      continue;
    }
    ctx.log.warn(wholeRequest ? 'request failed' : 'node failed', { requestId, nodes: [...ids], reason });
    if (wholeRequest) await requestSettled(ctx, next);
    for (const n of failing) if (n.backingNodeId) await giveBackSlot(ctx, n.backingNodeId, n.id);
    if (r.poolKey) await ctx.store.unreserve(keys.poolNodes(r.poolKey), [...ids]);
    return;
  }
  throw new ConflictError(`gave up failing nodes of request ${requestId}`);
}

/** The backing node's own host keys, which a node takes when host-key-checking is off. */
export function hostKeysOf(b: BackingRecord): string[] | undefined {
  const keys = b.attributes?.hostKeys;
  return Array.isArray(keys) && keys.every((k) => typeof k === 'string') ? (keys as string[]) : undefined;
}
