import { ConflictError, StoreRefusedError } from '../../core/errors.ts';
import { parseNodeId } from '../../core/ids.ts';
import type { RequestMessage } from '../../core/messages.ts';
import { isSpareRequestId } from '../../core/minReady.ts';
import { MetricName, PoolEventType } from '../../core/observability.ts';
import { claimedPriorityOf, priorityOf } from '../../core/priority.ts';
import type { NodeRecord, RequestRecord } from '../../core/records.ts';
import {
  failedNode,
  failedRequest,
  isLive,
  requestBodyHash,
  requestedRecord,
  withNodes,
} from '../../core/request.ts';
import { boundedReason } from '../../core/text.ts';
import { retryOnConflict } from '../conflicts.ts';
import { emit, type ServeContext } from '../context.ts';
import { endSpareOf } from '../ready/minReady.ts';
import { giveBackSlot } from './backingNodes.ts';

/**
 * Writes of a request record after it was received: its nodes change, it settles (core/request.ts
 * decides how), it fails. Each is one version-checked write from what was read, retried on conflict;
 * only the writer that wins a change of the request's state publishes its end (requestSettled).
 */

/**
 * How a request reached its end: `at-once` when the delivery that placed it fulfilled it (a free slot on
 * a ready backing node, a spare), `after-boot` when it was placed waiting (pending) for a
 * backing node to boot and a later step fulfilled it.
 */
export type Settled = 'at-once' | 'after-boot';

/**
 * Publishes the end of a request (fulfilled or failed) and counts failures; a request fulfilled after
 * waiting for a boot is counted and published as such too (the figure users feel).
 */
export async function requestSettled(
  ctx: ServeContext,
  r: RequestRecord,
  how: Settled = 'at-once',
): Promise<void> {
  // The pool's own min-ready requests are not anyone's: no events, no request metrics.
  if (isSpareRequestId(r.id)) return;
  if (r.state === 'fulfilled') {
    const now = ctx.clock.now();
    ctx.metrics?.count(MetricName.requestsFulfilled);
    ctx.metrics?.milliseconds(MetricName.timeToFulfilled, Math.max(0, now - r.createdAt));
    await emit(ctx, PoolEventType.requestFulfilled, {
      requestId: r.id,
      requestor: r.requestor,
      labels: r.labels,
      ...priorityDetail(r),
      nodes: r.nodes.map((n) => ({
        id: n.id,
        label: n.label,
        state: n.state,
        host: n.host,
        port: n.port,
        backingNodeId: n.backingNodeId,
        slot: n.slot,
        // The node contract (core/contract.ts): a subscriber can log in, verifying the host, with the
        // event alone. Not the attributes: 64 nodes of them, with their copy of the host keys, could
        // pass EventBridge's 256 KB per event; they stay in the record.
        username: n.username,
        connectionType: n.connectionType,
        pythonPath: n.pythonPath,
        shellType: n.shellType,
        hostKeys: n.hostKeys,
      })),
    });
    if (how === 'after-boot') {
      const waitedMs = Math.max(0, now - (r.placedAt ?? r.createdAt));
      ctx.metrics?.count(MetricName.requestsWaitedForBoot);
      ctx.metrics?.milliseconds(MetricName.waitForBoot, waitedMs);
      await emit(ctx, PoolEventType.requestWaitedForBoot, {
        requestId: r.id,
        requestor: r.requestor,
        labels: r.labels,
        waitedMs,
        backingNodeIds: [...new Set(r.nodes.flatMap((n) => (n.backingNodeId ? [n.backingNodeId] : [])))],
      });
    }
  } else if (r.state === 'failed') {
    ctx.metrics?.count(MetricName.requestsFailed);
    await emit(ctx, PoolEventType.requestFailed, {
      requestId: r.id,
      requestor: r.requestor,
      labels: r.labels,
      ...priorityDetail(r),
      reason: r.reason,
    });
  }
}

/** The priority a request was served at, and the one it claimed when its priority-ceiling clamped it. */
function priorityDetail(r: RequestRecord): Record<string, number> {
  return {
    priority: priorityOf(r),
    ...(r.priorityCeiling === undefined ? {} : { claimedPriority: claimedPriorityOf(r) }),
  };
}

/** Records a request that can never be served, unless its id is already taken (never overwrite). */
export async function recordFailure(
  ctx: ServeContext,
  fresh: RequestRecord,
  why: string,
): Promise<RequestRecord> {
  // Created as it would have been, failed: the first version of the record.
  const failed: RequestRecord = { ...failedRequest(fresh, why, fresh.updatedAt), version: fresh.version };
  const existing = await ctx.store.createRequest(failed);
  if (existing) return existing; // the id is taken: never overwrite, and it is not this one that failed
  ctx.metrics?.count(MetricName.requestsReceived);
  ctx.log.warn('request failed', { requestId: fresh.id, reason: failed.reason });
  await requestSettled(ctx, failed);
  return failed;
}

/** Ends a request that is still waiting (state requested) as failed with a reason; idempotent. */
export async function failRequest(
  ctx: ServeContext,
  requestId: string,
  bodyHash: string,
  why: string,
): Promise<RequestRecord | undefined> {
  const r = await ctx.store.getRequest(requestId);
  if (r?.state !== 'requested' || r.bodyHash !== bodyHash) return r;
  const next = failedRequest(r, why, ctx.clock.now());
  try {
    await ctx.store.putRequest(next, r.version);
  } catch (err) {
    // Placed, or ended, meanwhile: whatever it is now is the answer.
    if (err instanceof ConflictError) return ctx.store.getRequest(requestId);
    throw err;
  }
  ctx.log.warn('request failed', { requestId, reason: next.reason });
  await requestSettled(ctx, next);
  return next;
}

/**
 * Ends the request of a request message as failed with the reason, whatever was recorded of it: a
 * waiting record fails (failRequest), none yet is recorded failed as received (recordFailure). When the
 * store refuses that record itself (a value it cannot hold that no bound caught), the failure is recorded
 * with the request's id, labels and body hash only, so the reason is never lost and a later delivery of
 * the same message finds the request ended. Idempotent; a request placed or ended meanwhile, or an id
 * another body holds, is left as it is (and returned).
 */
export async function endRequestOf(
  ctx: ServeContext,
  m: RequestMessage,
  why: string,
): Promise<RequestRecord | undefined> {
  const bodyHash = requestBodyHash(m);
  const stored = await failRequest(ctx, m.id, bodyHash, why);
  if (stored) return stored;
  const fresh = requestedRecord(m, ctx.clock.now());
  try {
    return await recordFailure(ctx, fresh, why);
  } catch (err) {
    if (!(err instanceof StoreRefusedError)) throw err;
    ctx.log.warn('request recorded without its other fields: the table refused them', {
      requestId: m.id,
      error: err.message,
    });
    const { id, labels, state, createdAt, updatedAt, version, nodes } = fresh;
    return recordFailure(ctx, { id, labels, bodyHash, state, createdAt, updatedAt, version, nodes }, why);
  }
}

/**
 * Applies a change to a placed request's nodes (re-reading on conflict) and settles the request's state
 * by them (core/request.ts settledState). Returns how many nodes changed. A request still waiting to be
 * placed is left alone: the request flow re-checks after placing it.
 */
export async function updateRequestNodes(
  ctx: ServeContext,
  requestId: string,
  change: (r: RequestRecord) => { nodes: NodeRecord[]; changed: number },
): Promise<number> {
  const done = await retryOnConflict(`updating request ${requestId}`, async () => {
    const r = await ctx.store.getRequest(requestId);
    if (!r || r.state === 'requested') return { changed: 0 };
    const { nodes, changed } = change(r);
    if (changed === 0) return { changed: 0 };
    const next = withNodes(r, nodes, ctx.clock.now());
    await ctx.store.putRequest(next, r.version);
    return { changed, settled: next.state !== r.state ? next : undefined };
  });
  if (done.settled) {
    ctx.log.info(`request ${done.settled.state}`, { requestId, reason: done.settled.reason });
    // A placed request is fulfilled here only from pending: its nodes waited for their backing nodes.
    await requestSettled(ctx, done.settled, 'after-boot');
  }
  return done.changed;
}

/**
 * Fails the matching live nodes of a request, with the reason. A request not yet fulfilled fails as a
 * whole (a node set is all or nothing): all its live nodes fail. Every failed node gives back its slot
 * and its place in the pool's max-servers.
 */
export async function failNodes(
  ctx: ServeContext,
  requestId: string,
  why: string,
  which: (n: NodeRecord) => boolean,
): Promise<void> {
  const reason = boundedReason(why);
  const done = await retryOnConflict(`failing nodes of request ${requestId}`, async () => {
    const r = await ctx.store.getRequest(requestId);
    if (!r) return undefined;
    const wholeRequest = r.state === 'pending' || r.state === 'requested';
    const failing = r.nodes.filter((n) => isLive(n) && (wholeRequest || which(n)));
    if (failing.length === 0) return { r, failing };
    const ids = new Set(failing.map((n) => n.id));
    const now = ctx.clock.now();
    const next = wholeRequest
      ? failedRequest(r, reason, now, (n) => ids.has(n.id))
      : withNodes(
          r,
          r.nodes.map((n) => (ids.has(n.id) ? failedNode(n, reason) : n)),
          now,
        );
    await ctx.store.putRequest(next, r.version);
    return { r, next, failing, ids, wholeRequest };
  });
  if (!done) return;
  if (!done.next) {
    // Failed already: a call cut short may have left spares to end (idempotent; rare).
    for (const n of done.r.nodes) if (n.state === 'failed' && n.spare && which(n)) await endSpareOf(ctx, n);
    return;
  }
  const { r, next, failing, ids, wholeRequest } = done;
  ctx.log.warn(wholeRequest ? 'request failed' : 'node failed', { requestId, nodes: [...ids], reason });
  if (wholeRequest) await requestSettled(ctx, next);
  // A spare in use fails its taker first: while this node still holds its slot, a call cut
  // short here is redone by whoever settles the slot (settleFailedNodes).
  for (const n of failing) await failTakerOf(ctx, n, reason);
  for (const n of failing) if (n.backingNodeId) await giveBackSlot(ctx, n.backingNodeId, n.id);
  if (r.poolKey) await ctx.store.freeNodePlaces(r.poolKey, [...(ids ?? [])]);
  // A node on a spare's slot ends that node (its slot and place are freed there).
  for (const n of failing) await endSpareOf(ctx, n);
}

/** Fails the node that took this spare (it runs on the same slot), if any. */
export async function failTakerOf(ctx: ServeContext, n: NodeRecord, reason: string): Promise<void> {
  const taker = n.takenBy?.node;
  const parsed = taker ? parseNodeId(taker) : undefined;
  if (parsed) await failNodes(ctx, parsed.requestId, reason, (x) => x.id === taker && x.spare === n.id);
}
