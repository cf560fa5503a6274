import type { MetastaticPool } from '../config/model.ts';
import {
  BusyError,
  CapacityError,
  ConflictError,
  DeadlineError,
  LaunchFailedError,
  PermanentError,
  RetryableError,
} from '../core/errors.ts';
import { contentHash, type DeliveryOf, nodeId, ownerSince, ownerToken, supersedes } from '../core/ids.ts';
import type { RequestMessage } from '../core/messages.ts';
import { eligiblePools, nodeAttributes } from '../core/pools.ts';
import type { NodeRecord, RequestRecord } from '../core/records.ts';
import { assertTransition } from '../core/states.ts';
import { boundedReason } from '../core/text.ts';
import { keys } from '../store/table.ts';
import {
  type Context,
  DELIVERY_DEADLINE_MS,
  deliveryDead,
  MAX_CONFLICT_RETRIES,
  timeLeft,
} from './context.ts';
import { hostKeysOf } from './failure.ts';
import { markNodesReady } from './fulfil.ts';
import { giveBackSlot, type Placement, placeNode } from './placement.ts';
import { requestSettled } from './requestEvents.ts';

export type RequestOutcome =
  | { readonly kind: 'duplicate'; readonly request: RequestRecord }
  | { readonly kind: 'placed'; readonly request: RequestRecord }
  | { readonly kind: 'failed'; readonly request: RequestRecord };

/** The record of a request as received: `requested`, nothing placed, version 0. */
export function requestedRecord(m: RequestMessage, now: number): RequestRecord {
  return {
    id: m.id,
    labels: m.labels,
    requestor: m.requestor,
    priority: m.priority,
    bodyHash: requestBodyHash(m),
    state: 'requested',
    createdAt: now,
    updatedAt: now,
    version: 0,
    nodes: m.labels.map((label, i) => ({ id: nodeId(m.id, i), label, state: 'requested' })),
  };
}

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
 *
 * `delivery` names the queue message and receive this is: a redelivery takes the claims and places an
 * earlier receive of the same message left at once (Recording.fence), instead of waiting until they are
 * old enough to be abandoned (CLAIM_TAKEOVER_MS).
 */
export async function requestNodes(
  ctx: Context,
  m: RequestMessage,
  delivery?: DeliveryOf,
): Promise<RequestOutcome> {
  const now = ctx.clock.now();
  const fresh = requestedRecord(m, now);
  const bodyHash = fresh.bodyHash;
  const choice = eligiblePools(ctx.config, m.labels);
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
  constructor(
    readonly request: RequestRecord,
    sent: Pick<RequestRecord, 'labels' | 'requestor' | 'priority'>,
  ) {
    const differs = [
      request.labels.join('\n') !== sent.labels.join('\n') ? 'labels' : undefined,
      request.requestor !== sent.requestor ? 'requestor' : undefined,
      request.priority !== sent.priority ? 'priority' : undefined,
    ].filter((f) => f !== undefined);
    super(
      `request id "${request.id}" is already used by another request (labels ${request.labels.join(', ')}` +
        `${request.requestor === undefined ? '' : `, requestor ${request.requestor}`}` +
        `${request.priority === undefined ? '' : `, priority ${request.priority}`}); ` +
        `this one differs in ${differs.join(' and ') || 'its body'}: use a new id for a new request`,
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
 * A delivery of a later receive of this message made itself the placer (Recording.fence) to take over
 * what this one holds: this one records nothing and gives back what is still its own.
 */
class Superseded extends BusyError {
  constructor(readonly request: RequestRecord) {
    super(`request ${request.id} is being placed by a later delivery of its message; this one stops`);
  }
}

/** What the stored request says about this delivery's work: it is someone else's to finish, or done. */
const isStoredVerdict = (err: unknown): err is AlreadyPlaced | IdReused | Superseded =>
  err instanceof AlreadyPlaced || err instanceof IdReused || err instanceof Superseded;

/**
 * What this delivery knows of the stored request: nothing yet (the warm path writes it once, at the
 * end) or the `requested` record it wrote or found.
 */
class Recording {
  private stored: RequestRecord | undefined;

  constructor(
    private readonly ctx: Context,
    private readonly fresh: RequestRecord,
    /** This delivery's owner token: its claims and reservations carry it. */
    readonly owner: string,
    private readonly startedAt: number,
  ) {}

  /** The record to build the placed request from. */
  get base(): RequestRecord {
    return this.stored ?? this.fresh;
  }

  /** Makes sure a `requested` record exists; throws AlreadyPlaced if a delivery got further. */
  async ensure(): Promise<void> {
    if (this.stored) return;
    const recorded = { ...this.fresh, placer: this.owner };
    const existing = await this.ctx.store.createRequest(recorded);
    this.stored = existing ? this.adopt(existing) : recorded;
  }

  /**
   * Makes this delivery the request's placer before it takes over what an earlier receive of its message
   * holds (supersedes): a conditional write of the `requested` record (created if need be) naming it.
   * Every write of a placement is conditioned on the record (version, or its absence), and a delivery
   * that finds a later receive's placer stops (Superseded), so the earlier delivery, even if it still
   * runs, can no longer record nodes on claims this one took over and may give back. Throws AlreadyPlaced
   * when a delivery placed it meanwhile, Superseded when a still later receive is the placer.
   */
  async fence(): Promise<void> {
    for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
      const existing = await this.ctx.store.getRequest(this.fresh.id);
      if (!existing) {
        const fenced = { ...this.fresh, placer: this.owner };
        if (!(await this.ctx.store.createRequest(fenced))) {
          this.stored = fenced;
          return;
        }
        continue; // created meanwhile: read it
      }
      const base = this.adopt(existing);
      if (base.placer === this.owner) {
        this.stored = base;
        return;
      }
      const fenced = {
        ...base,
        placer: this.owner,
        updatedAt: this.ctx.clock.now(),
        version: base.version + 1,
      };
      try {
        await this.ctx.store.putRequest(fenced, base.version);
        this.stored = fenced;
        this.ctx.log.info('a later delivery of the message takes over the placement', {
          requestId: base.id,
          from: base.placer,
        });
        return;
      } catch (err) {
        if (!(err instanceof ConflictError)) throw err;
      }
    }
    throw new ConflictError(`gave up taking over the placement of request ${this.fresh.id}`);
  }

  /** Writes the placed request; returns the winner instead when another delivery placed it first. */
  async write(next: (base: RequestRecord) => RequestRecord): Promise<RequestRecord | undefined> {
    // Past the deadline our claims may be taken over as abandoned: record nothing built on them.
    if (this.ctx.clock.now() - this.startedAt > DELIVERY_DEADLINE_MS) {
      throw new RetryableError(
        `placing request ${this.fresh.id} took over ${DELIVERY_DEADLINE_MS / 1000} s; retrying it`,
      );
    }
    // Nor this close to the end of the invocation: the delivery stops cleanly (giving its claims back)
    // rather than be killed with them held.
    if (timeLeft(this.ctx) <= 0) {
      throw new DeadlineError(`placing request ${this.fresh.id} ran out of invocation time; retrying it`);
    }
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

  /** Throws AlreadyPlaced or IdReused when the stored request (if any) is not ours to place. */
  async checkStored(): Promise<RequestRecord | undefined> {
    const existing = await this.ctx.store.getRequest(this.fresh.id);
    if (existing) this.adopt(existing);
    return existing;
  }

  private adopt(existing: RequestRecord): RequestRecord {
    if (existing.bodyHash !== this.fresh.bodyHash) throw new IdReused(existing, this.fresh);
    if (existing.state !== 'requested') throw new AlreadyPlaced(existing);
    if (existing.placer !== undefined && supersedes(existing.placer, this.owner))
      throw new Superseded(existing);
    return existing;
  }
}

type PoolResult = { kind: 'placed'; request: RequestRecord } | { kind: 'full'; reason: string };

async function tryPool(ctx: Context, pool: MetastaticPool, recording: Recording): Promise<PoolResult> {
  const requestId = recording.base.id;
  const nodeIds = recording.base.nodes.map((n) => n.id);
  const owner = recording.owner;
  if (pool.maxServers !== undefined) {
    const full = await reserveNodes(ctx, pool, pool.maxServers, nodeIds, recording);
    if (full) return { kind: 'full', reason: full };
  }
  const placements: Placement[] = [];
  let winner: RequestRecord | undefined;
  try {
    for (const node of recording.base.nodes) {
      const label = pool.labels.get(node.label);
      if (!label) throw new Error(`pool ${pool.key} lost label ${node.label}`);
      placements.push(
        await placeNode(ctx, pool, label, node.id, {
          owner,
          beforeLaunch: () => recording.ensure(),
          beforeTakeover: () => recording.fence(),
        }),
      );
    }
    const now = ctx.clock.now();
    winner = await recording.write((base) => placedRequest(base, pool, placements, now));
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
    await giveBack(ctx, placements, owner, other);
    if (pool.maxServers !== undefined) await unreserveOwn(ctx, pool, nodeIds, owner, other);
    // Another delivery placed it meanwhile: that is the outcome, whatever stopped this one.
    if (found) throw found;
    if (err instanceof CapacityError) return { kind: 'full', reason: err.message };
    throw err;
  }
  if (winner) {
    await giveBack(ctx, placements, owner, winner);
    if (pool.maxServers !== undefined) await unreserveOwn(ctx, pool, nodeIds, owner, winner);
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

/**
 * Takes the nodes' places in a pool's max-servers. Returns why not when the pool is full. Places held
 * by another delivery of the same request are theirs while it lives (BusyError: retry later), unless
 * the request is already placed (AlreadyPlaced) or that delivery is known dead (taken over).
 */
async function reserveNodes(
  ctx: Context,
  pool: MetastaticPool,
  maxServers: number,
  nodeIds: readonly string[],
  recording: Recording,
): Promise<string | undefined> {
  const key = keys.poolNodes(pool.key);
  const reserved = await ctx.store.reserve(key, nodeIds, maxServers, recording.owner);
  if (reserved.kind === 'full') return `${pool.key} is at max-servers (${maxServers})`;
  if (reserved.kind === 'reserved') return undefined;
  await recording.checkStored(); // placed by the holder already: a duplicate
  let fenced = false;
  for (const [member, holder] of reserved.holders) {
    if (supersedes(recording.owner, holder)) {
      // An earlier receive of this message: taken over at once, once it can record nothing more.
      if (!fenced) await recording.fence();
      fenced = true;
    } else if (!deliveryDead(ownerSince(holder), ctx.clock.now(), ctx.deliveriesDeadBefore)) {
      throw new BusyError(`request ${recording.base.id} is being placed by another delivery; retrying later`);
    }
    if (!(await ctx.store.takeOverReservation(key, member, holder, recording.owner))) {
      throw new BusyError(`the place of node ${member} changed hands; retrying later`);
    }
  }
  return reserveNodes(ctx, pool, maxServers, nodeIds, recording);
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
  const { placer: _placed, ...rest } = base; // placed: no delivery places it any more
  return { ...rest, state, poolKey: pool.key, nodes, updatedAt: now, version: base.version + 1 };
}

/** Takes this delivery's reservations back, except for nodes the stored request holds live in this pool. */
async function unreserveOwn(
  ctx: Context,
  pool: MetastaticPool,
  nodeIds: readonly string[],
  owner: string,
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
    owner,
  );
}

/** Undoes this delivery's placements, except those the stored request (a concurrent winner) records. */
async function giveBack(
  ctx: Context,
  placements: readonly Placement[],
  owner: string,
  keep?: RequestRecord,
): Promise<void> {
  for (const p of placements) {
    const kept = keep?.nodes.some(
      (n) =>
        n.id === p.nodeId &&
        n.backingNodeId === p.backing.id &&
        n.slot === p.slot &&
        (n.state === 'pending' || n.state === 'ready'),
    );
    if (!kept) await giveBackSlot(ctx, p.backing.id, p.nodeId, { owner });
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
export async function recordFailure(ctx: Context, fresh: RequestRecord, why: string): Promise<RequestRecord> {
  const reason = boundedReason(why); // stored on the request and each node: within the item limit
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
  why: string,
): Promise<RequestRecord | undefined> {
  const reason = boundedReason(why);
  const r = await ctx.store.getRequest(requestId);
  if (r?.state !== 'requested' || r.bodyHash !== bodyHash) return r;
  assertTransition('request', r.state, 'failed');
  const { placer: _ended, ...rest } = r;
  const next: RequestRecord = {
    ...rest,
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
