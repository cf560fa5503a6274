import { CapacityError, LaunchFailedError, PermanentError } from '../../core/errors.ts';
import { type DeliveryOf, ownerToken } from '../../core/ids.ts';
import { withLeaseOf } from '../../core/leases.ts';
import type { RequestMessage } from '../../core/messages.ts';
import { isSpareRequestId, nodeOnSpare } from '../../core/minReady.ts';
import type { MetastaticPool } from '../../core/model.ts';
import { eligiblePools } from '../../core/pools.ts';
import { priorityOf, trustedPriority } from '../../core/priority.ts';
import type { NodeRecord, RequestRecord } from '../../core/records.ts';
import { placedNode, placedRequest, requestedRecord } from '../../core/request.ts';
import { learnsDurations, type ServeContext } from '../context.ts';
import { learnedDuration } from '../ready/estimates.ts';
import { countArrival } from '../ready/forecasts.ts';
import { noSparesSeen, returnSpare, type SparesSeen, takeSpare } from '../ready/minReady.ts';
import { markNodesReady, unrecordableReason } from '../ready/nodesReady.ts';
import { failBadBacking } from '../release/failure.ts';
import { giveBackSlot } from './backingNodes.ts';
import { prefetchCandidates } from './candidates.ts';
import { type Reserved, reserveNodes, unreserveOwn } from './nodePlaces.ts';
import { type Placement, type PlaceOptions, placeNode } from './placement.ts';
import { AlreadyPlaced, isStoredVerdict, Recording } from './recording.ts';
import { failRequest, recordFailure, requestSettled } from './requests.ts';
import { labelsFor } from './shapes.ts';
import { firstWaitingAhead } from './waiting.ts';

export type RequestOutcome =
  | { readonly kind: 'duplicate'; readonly request: RequestRecord }
  | {
      readonly kind: 'placed';
      readonly request: RequestRecord;
      /** What its min-ready takes read and wrote (SparesSeen): the refill that follows starts from it. */
      readonly spares?: SparesSeen;
    }
  | { readonly kind: 'failed'; readonly request: RequestRecord };

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
 *
 * `delivery` names the queue message and receive this is: a redelivery takes the claims and places an
 * earlier receive of the same message left at once (Recording.fence), instead of waiting until they are
 * old enough to be abandoned (CLAIM_TAKEOVER_MS).
 */
export async function requestNodes(
  ctx: ServeContext,
  m: RequestMessage,
  delivery?: DeliveryOf,
): Promise<RequestOutcome> {
  const labels = await labelsFor(ctx, m);
  const now = ctx.clock.now();
  // Its priority within its requestor's priority-ceiling (clamped; the claim kept): core/priority.ts.
  const asked = trustedPriority(ctx.config, requestedRecord(m, now, labels.ok ? labels.labels : []));
  const bodyHash = asked.bodyHash;
  // The lease it takes (its own, else its labels' default-lease), within its labels' max-lease.
  const leased = withLeaseOf(ctx.config, asked, m.lease);
  const fresh = leased.ok ? leased.request : asked;
  const pools = labels.ok ? eligiblePools(ctx.config, labels.labels) : labels;
  const choice = pools.ok && !leased.ok ? leased : pools;
  if (!choice.ok) {
    const recorded = await recordFailure(ctx, fresh, choice.reason);
    // Recorded waiting before the configuration lost its labels: it can never be placed now, so it ends
    // here rather than wait, its message consumed, until its request-timeout.
    if (recorded.state === 'requested' && recorded.bodyHash === bodyHash) {
      return { kind: 'failed', request: (await failRequest(ctx, m.id, bodyHash, choice.reason)) ?? recorded };
    }
    return { kind: 'failed', request: recorded };
  }
  const recording = new Recording(ctx, fresh, ownerToken(now, delivery), now);
  const waits: string[] = [];
  try {
    for (const pool of choice.pools) {
      let result: PoolResult;
      try {
        result = await tryPool(ctx, pool, recording);
      } catch (err) {
        // Every launch attempt failed, or the store refuses the placed request for good (an item past
        // its size: nodes placed ready carry their attributes): the request ends, with the reason (tryPool
        // gave back what it took). Retrying could not succeed, and a request id reused by another
        // request is not this one's to end.
        const refused = err instanceof PermanentError && !isStoredVerdict(err);
        if (!(err instanceof LaunchFailedError) && !refused) throw err;
        await recording.ensure();
        const why = err instanceof LaunchFailedError ? err.message : unrecordableReason(err);
        // The same line as the request function's for a refusal met anywhere else (requestHandler.ts).
        if (refused) ctx.log.warn('request ended: the table refused a write', { reason: why });
        const failed = await failRequest(ctx, m.id, bodyHash, why);
        return { kind: 'failed', request: failed ?? fresh };
      }
      if (result.kind === 'placed') {
        // Placed by this delivery (a redelivery finds it placed): its nodes are arrivals to forecast, of
        // its requestor (each counts at most so many a minute: core/forecast.ts withArrivals).
        if (!isSpareRequestId(m.id))
          for (const n of result.request.nodes) await countArrival(ctx, n.label, result.request.requestor);
        return result;
      }
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
  // The stored record says since when it waits (a redelivery or a re-sent message adopts it).
  const { createdAt, labels: asks } = recording.base;
  throw new CapacityError(`request ${m.id} waits for capacity: ${waits.join('; ')}`, {
    createdAt,
    labels: asks,
  });
}

type PoolResult =
  | { kind: 'placed'; request: RequestRecord; spares?: SparesSeen }
  | { kind: 'full'; reason: string };

async function tryPool(ctx: ServeContext, pool: MetastaticPool, recording: Recording): Promise<PoolResult> {
  const requestId = recording.base.id;
  const owner = recording.owner;
  const ahead = await requestAhead(ctx, pool, recording.base);
  if (ahead) return { kind: 'full', reason: ahead };
  // spares first: a node that takes one is ready at once, on the spare's slot and place.
  const seen = noSparesSeen();
  const spares = await takeSpares(ctx, pool, recording, seen);
  const placing = recording.base.nodes.filter((_, i) => !spares.has(i));
  const nodeIds = placing.map((n) => n.id);
  // With max-servers, the first node's candidates are asked for and its slot claimed while the places are
  // taken (one transaction): a claim on a free slot is made before the transaction answers and given back
  // if the pool turns out full (a crash in between leaves an unrecorded claim, which recovery
  // frees as it frees one left between a claim and the request's write). A launch and a takeover of
  // another delivery's claim wait for the places: neither is made for a node the pool has no room for.
  const [first] = placing;
  const firstPage = pool.maxServers !== undefined && first && prefetchCandidates(ctx, pool, first.label);
  const reservation =
    pool.maxServers !== undefined && nodeIds.length > 0
      ? reserveNodes(ctx, pool, pool.maxServers, nodeIds, recording)
      : undefined;
  // Settled below in every case; a rejection meanwhile is not unhandled.
  reservation?.catch(() => undefined);
  const placesTaken = async (): Promise<void> => {
    const reserved = await reservation;
    if (reserved?.kind === 'full') throw new CapacityError(reserved.reason);
  };
  const placements = new Map<number, Placement>();
  // Settles to what stopped the placement, or undefined once every node has its place.
  const placingAll = (async () => {
    for (const [i, node] of recording.base.nodes.entries()) {
      if (spares.has(i)) continue;
      const label = pool.labels.get(node.label);
      if (!label) throw new Error(`pool ${pool.key} lost label ${node.label}`);
      const expected = await expectationOf(ctx, recording.base, node.label);
      placements.set(
        i,
        await placeNode(ctx, pool, label, node.id, {
          owner,
          beforeLaunch: async () => {
            await placesTaken();
            await recording.ensure();
          },
          beforeTakeover: async () => {
            await placesTaken();
            await recording.fence();
          },
          failBacking: failBadBacking,
          ...(node === first && firstPage ? { firstPage } : {}),
          ...expected,
        }),
      );
    }
  })().then(
    () => undefined,
    (err: unknown) => ({ err }),
  );
  if (reservation) {
    let reserved: Reserved;
    try {
      reserved = await reservation;
    } catch (err) {
      await placingAll;
      await giveBack(ctx, placements, spares, owner, isStoredVerdict(err) ? err.request : undefined);
      throw err;
    }
    if (reserved.kind === 'full') {
      await placingAll;
      await giveBack(ctx, placements, spares, owner);
      return { kind: 'full', reason: reserved.reason };
    }
  }
  let winner: RequestRecord | undefined;
  try {
    const stopped = await placingAll;
    if (stopped) throw stopped.err;
    const now = ctx.clock.now();
    winner = await recording.write((base) =>
      placedRequest(base, pool.key, placedNodes(base, pool, placements, spares, now), now),
    );
  } catch (err) {
    // All or nothing: give back what this delivery took (never what another delivery holds, nor what
    // the stored request records), then let the next pool (or a retry) try.
    let other = isStoredVerdict(err) ? err.request : undefined;
    let found: unknown;
    if (!other) {
      try {
        other = await recording.checkStored();
      } catch (stored) {
        if (!isStoredVerdict(stored)) throw stored;
        other = stored.request;
        found = stored;
      }
    }
    await giveBack(ctx, placements, spares, owner, other);
    if (pool.maxServers !== undefined) await unreserveOwn(ctx, pool, nodeIds, owner, other);
    // Another delivery placed it meanwhile: that is the outcome, whatever stopped this one.
    if (found) throw found;
    if (err instanceof CapacityError) return { kind: 'full', reason: err.message };
    throw err;
  }
  if (winner) {
    await giveBack(ctx, placements, spares, owner, winner);
    if (pool.maxServers !== undefined) await unreserveOwn(ctx, pool, nodeIds, owner, winner);
    throw new AlreadyPlaced(winner);
  }
  const now = ctx.clock.now();
  const placed = placedRequest(
    recording.base,
    pool.key,
    placedNodes(recording.base, pool, placements, spares, now),
    now,
  );
  ctx.log.info(`request ${placed.state}`, {
    requestId,
    pool: pool.key,
    nodes: recording.base.nodes.map((n) => n.id),
    ...(spares.size > 0 ? { minReadyNodes: [...spares.values()].map((s) => s.id) } : {}),
  });
  await requestSettled(ctx, placed);
  const taken = spares.size > 0 ? { spares: seen } : {};
  if (placed.state === 'pending') {
    await recheckPending(ctx, placed);
    return { kind: 'placed', request: (await ctx.store.getRequest(requestId)) ?? placed, ...taken };
  }
  return { kind: 'placed', request: placed, ...taken };
}

/**
 * Takes a spare (core/minReady.ts) for each node of the request whose label keeps some in this
 * pool, while there are free ones: node index -> the spare's node. The pool's own spare requests take
 * none.
 */
async function takeSpares(
  ctx: ServeContext,
  pool: MetastaticPool,
  recording: Recording,
  seen: SparesSeen,
): Promise<Map<number, NodeRecord>> {
  const taken = new Map<number, NodeRecord>();
  const keeps = (label: string) =>
    ctx.config.minReady.has(label) || ctx.config.readyAuto?.has(label) === true;
  if ((ctx.config.minReady.size === 0 && !ctx.config.readyAuto?.size) || isSpareRequestId(recording.base.id))
    return taken;
  const none = new Set<string>(); // labels with no free spare left: not read again for the next node
  for (const [i, node] of recording.base.nodes.entries()) {
    if (!keeps(node.label) || !pool.labels.has(node.label) || none.has(node.label)) continue;
    const spare = await takeSpare(ctx, pool, node.label, node.id, recording.owner, seen);
    if (spare) taken.set(i, spare);
    else none.add(node.label);
  }
  return taken;
}

/**
 * Priority (core/priority.ts): where capacity can run short, a request lets a waiting request that is
 * served before it, and fits, go first, and waits; the one ahead takes the room at its next receive.
 * Capacity runs short only under a cap (the pool's max-servers, or a backing pool's): without one a
 * request is placed at once, on a free slot or a new backing node, and the check (the registry of
 * waiting queues, then one item of each queue that fits: firstWaitingAhead) is skipped. Returns why it
 * waits, or undefined.
 */
async function requestAhead(
  ctx: ServeContext,
  pool: MetastaticPool,
  me: RequestRecord,
): Promise<string | undefined> {
  if (!canRunShort(ctx, pool)) return undefined;
  const first = await firstWaitingAhead(ctx, me, pool);
  if (!first) return undefined;
  return `${pool.key}: request ${first.id} (priority ${priorityOf(first)}) waits ahead of this one (priority ${priorityOf(me)})`;
}

/** Whether a cap can make requests for this pool wait: its max-servers, or a backing pool's. */
export function canRunShort(ctx: ServeContext, pool: MetastaticPool): boolean {
  if (pool.maxServers !== undefined) return true;
  return [...pool.labels.values()].some(
    (l) => ctx.config.backingPoolByLabel.get(l.backingLabel)?.maxServers !== undefined,
  );
}

/**
 * Undoes this delivery's placements and returns the spares it took (free again), except those the
 * stored request (a concurrent winner) records.
 */
async function giveBack(
  ctx: ServeContext,
  placements: ReadonlyMap<number, Placement>,
  spares: ReadonlyMap<number, NodeRecord>,
  owner: string,
  keep?: RequestRecord,
): Promise<void> {
  for (const p of placements.values()) {
    const kept = keep?.nodes.some(
      (n) =>
        n.id === p.nodeId &&
        n.backingNodeId === p.backing.id &&
        n.slot === p.slot &&
        (n.state === 'pending' || n.state === 'ready'),
    );
    if (!kept) await giveBackSlot(ctx, p.backing.id, p.nodeId, { owner });
  }
  for (const spare of spares.values()) {
    if (keep?.nodes.some((n) => n.spare === spare.id)) continue;
    await returnSpare(ctx, spare.id, owner);
  }
}

/**
 * Closes the race with the fulfil flow: a backing node that became ready between our claim and our
 * write of the pending nodes was seen by fulfil before the nodes were pending, so look again.
 */
async function recheckPending(ctx: ServeContext, request: RequestRecord): Promise<void> {
  const backingIds = new Set(request.nodes.filter((n) => n.state === 'pending').map((n) => n.backingNodeId));
  for (const id of backingIds) {
    if (!id) continue;
    const b = await ctx.store.getBacking(id);
    if (b?.state === 'ready') await markNodesReady(ctx, b, failBadBacking);
  }
}

/**
 * When a node is expected to be released, for placement (PlaceOptions.expectedEnd): its request's
 * `expected-duration`, else what the pool learned of its label's (and requestor's) nodes
 * (shared/usecases/ready/estimates.ts; ordered by only when confident), else nothing. The pool's own min-ready
 * requests have no end.
 */
async function expectationOf(
  ctx: ServeContext,
  r: RequestRecord,
  label: string,
): Promise<Pick<PlaceOptions, 'expectedEnd' | 'orderByExpectedEnd'>> {
  const now = ctx.clock.now();
  if (r.expectedDuration !== undefined) return { expectedEnd: now + r.expectedDuration * 1000 };
  if (isSpareRequestId(r.id) || !learnsDurations(ctx)) return {};
  const learned = await learnedDuration(ctx, label, r.requestor);
  if (!learned) return {};
  return { expectedEnd: now + learned.seconds * 1000, orderByExpectedEnd: learned.confident };
}

/** The request's nodes on the places this delivery took and the spares it took, in order. */
function placedNodes(
  base: RequestRecord,
  pool: MetastaticPool,
  placements: ReadonlyMap<number, Placement>,
  spares: ReadonlyMap<number, NodeRecord>,
  now: number,
): NodeRecord[] {
  return base.nodes.map((n, i) => {
    const spare = spares.get(i);
    if (spare) return nodeOnSpare(n, spare, now);
    return placedNode(n, placements.get(i) as Placement, pool.nodeAttributes, now);
  });
}
