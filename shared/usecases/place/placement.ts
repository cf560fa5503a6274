import {
  claimOf,
  compareByExpectedEnd,
  compareCandidates,
  compareOldestFirst,
  hashOf,
  isClaimable,
  markDrained,
  newBackingRecord,
  slotOf,
  spreadSlot,
  takeOverClaim,
} from '../../core/backing.ts';
import { Claimants, ticketTarget } from '../../core/claimants.ts';
import {
  BusyError,
  CapacityError,
  ConflictError,
  DeadlineError,
  LaunchAttemptError,
  LaunchFailedError,
  RetryableError,
} from '../../core/errors.ts';
import { backingNodeId, parseNodeId, supersedes } from '../../core/ids.ts';
import { needsMaxAgeDrain } from '../../core/lifecycle.ts';
import type { MetastaticLabel, MetastaticPool } from '../../core/model.ts';
import type { Page } from '../../core/poolStore.ts';
import type { BackingRecord } from '../../core/records.ts';
import { holdsSlot } from '../../core/request.ts';
import { AGAIN, MAX_CONFLICT_RETRIES, retryOnConflict, unlessConflict } from '../conflicts.ts';
import { deliveryDead, type ServeContext, timeLeft } from '../context.ts';
import { ensureLaunched, giveBackSlot, providerOf, reserveBacking, scanKeys } from './backingNodes.ts';
import {
  CANDIDATES_PER_QUERY,
  type Candidates,
  forgetPlacement,
  rememberedCandidates,
  rememberPlacement,
} from './candidates.ts';
import type { Placement, PlaceOptions } from './placeOptions.ts';

export type { Placement, PlaceOptions } from './placeOptions.ts';

/**
 * Pages read before launching instead: candidates that cannot take the node (max-age drained on the
 * way, lost to concurrent claims) are rare, so a few pages bound the cost without ever scanning.
 */
const MAX_CANDIDATE_PAGES = 5;

/**
 * Places one node of a pool's label: onto the fullest existing backing node with a free slot (a
 * launching one counts), else onto a new backing node launched for it. Claiming is one conditional
 * write on the backing node's item.
 */
export async function placeNode(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: MetastaticLabel,
  nodeId: string,
  options: PlaceOptions,
): Promise<Placement> {
  const attempt = (options.previousAttempts ?? 0) + 1;
  if (attempt > pool.launchRetries) {
    throw new LaunchFailedError(`node ${nodeId} used all ${pool.launchRetries} attempt(s)`);
  }
  const placed = await inThisProcess.during(`${pool.key}#${label.name}`, (ticket) =>
    claimFromCandidates(ctx, pool, label, nodeId, attempt, options, ticket),
  );
  if (placed) {
    rememberPlacement(ctx, pool, label.name, placed.backing);
    return placed;
  }
  // No launch once the invocation's time is up: its outcome could not be recorded (Recording.write
  // refuses), and the next delivery or reaper run takes the node up with a fresh deadline.
  checkTimeToLaunch(ctx, nodeId);
  // A launch is the one side effect a duplicate must never repeat: the caller checks first.
  await options.beforeLaunch?.();
  const launched = await launchFor(ctx, pool, label, nodeId, attempt, options);
  rememberPlacement(ctx, pool, label.name, launched.backing);
  return launched;
}

/** The claimants placing nodes in this process at the moment, per pool and label (core/claimants.ts). */
const inThisProcess = new Claimants();

/**
 * Claims a free slot for the node on an existing backing node, fullest first (or as `options` orders),
 * a claimant among others of this process aiming first at its ticket's slot; undefined when none of the
 * candidates read took it.
 */
async function claimFromCandidates(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: MetastaticLabel,
  nodeId: string,
  attempt: number,
  options: PlaceOptions,
  ticket: number,
): Promise<Placement | undefined> {
  const order =
    ctx.placementPolicy === 'oldest'
      ? compareOldestFirst
      : options.expectedEnd !== undefined && options.orderByExpectedEnd !== false
        ? compareByExpectedEnd(options.expectedEnd, ctx.clock.now())
        : compareCandidates;
  let losses = 0;
  /** Tries a page's candidates in order; the first page's claimants of this process spread out. */
  const claimFrom = async (found: Page<BackingRecord>, first: boolean): Promise<Placement | undefined> => {
    const queue = found.items.sort(order);
    // Another claimant of this label is placing in this process too: each aims at a free slot of its
    // own among the fullest few, the one a lone claimant after the others would take.
    const now = ctx.clock.now();
    const target = first ? ticketTarget(queue, ticket, (b) => isClaimable(b, now)) : undefined;
    if (target) queue.unshift(...queue.splice(target.index, 1));
    let aim = target?.slot;
    for (let next = queue.shift(); next; next = queue.shift()) {
      const contention: Contention = { losses, ...(aim === undefined ? {} : { slot: aim }) };
      aim = undefined;
      const placed = await claimOn(ctx, pool, label, next, nodeId, attempt, options, contention);
      if (placed) return placed;
      const lost = contention.lost;
      if (!lost) continue;
      // Lost a slot to a concurrent claimant: the others that lost move on too, so go on from a point
      // of the remaining candidates chosen by node id instead of all to the next fullest, and come
      // back to this one (as it is now) last. Every loss is someone else's win, so this ends.
      if (++losses > MAX_CONFLICT_RETRIES)
        throw new ConflictError(`gave up placing ${nodeId} after ${losses} lost claims`);
      if (queue.length > 1) queue.push(...queue.splice(0, hashOf(nodeId) % queue.length));
      if (isClaimable(lost, ctx.clock.now())) queue.push(lost);
    }
    return undefined;
  };
  let prefetched: Candidates | undefined = await options.firstPage;
  // Fullest first, the backing node this process placed the label's last node on (candidates.ts) is
  // tried before any Query while it has a free slot: it was the fullest then, and is one fuller now.
  // Placed by another order, the index is asked.
  // Not for a node placed before (a move off a failed backing node, a retry holding a claim): where it
  // is, and what happened to it, are read, not remembered. Nor while other claimants of this label are
  // placing in this process (a ticket above 0): they spread over the index's fullest few by their tickets
  // (bench contention: 0.61 conflicts per allocation at 16-way when they all started from it, 0.25 when
  // as many as it had free slots did).
  if (order === compareCandidates && attempt === 1 && ticket === 0) {
    const remembered = prefetched?.remembered ? prefetched : rememberedCandidates(ctx, pool, label.name);
    if (remembered?.items.every((b) => slotOf(b, nodeId) === undefined)) {
      const placed = await claimFrom(remembered, true);
      if (placed) return placed;
      forgetPlacement(ctx, pool, label.name); // it changed elsewhere (filled, drained, ended)
    }
  }
  if (prefetched?.remembered) prefetched = undefined;
  let cursor: Record<string, unknown> | undefined;
  for (let page = 0; page < MAX_CANDIDATE_PAGES; page++) {
    const found =
      (page === 0 ? prefetched : undefined) ??
      (await ctx.store.findCandidates(pool.key, label.name, CANDIDATES_PER_QUERY, cursor));
    const placed = await claimFrom(found, page === 0);
    if (placed) return placed;
    cursor = found.cursor;
    if (!cursor) break;
  }
  return undefined;
}

/**
 * Claims a slot for `nodeId` on one given backing node, as placeNode claims on a candidate (the same
 * conditional write, host-key scan included), and nothing else: no other candidate, no launch. For
 * moving a free spare onto a fuller backing node (usecases/ready/minReady.ts moveSpare).
 */
export function claimSlotOn(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: MetastaticLabel,
  candidate: BackingRecord,
  nodeId: string,
  options: PlaceOptions,
): Promise<Placement | undefined> {
  return claimOn(ctx, pool, label, candidate, nodeId, 1, options, { losses: 0 });
}

/** What a claim attempt learnt of concurrent claimants. */
interface Contention {
  /** Claims this placement lost so far (varies the slot it aims at next). */
  readonly losses: number;
  /** The free slot to aim at first (its ticket's, ticketTarget), instead of one chosen by node id. */
  readonly slot?: number;
  /** The candidate as it was when the claim lost its slot to a concurrent write. */
  lost?: BackingRecord;
}

/**
 * Claims a slot on one backing node. A claim that loses its slot to a concurrent write leaves the
 * candidate, reporting it as it is now (placeNode comes back to it last).
 */
async function claimOn(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: MetastaticLabel,
  candidate: BackingRecord,
  nodeId: string,
  attempt: number,
  options: PlaceOptions,
  contention: Contention,
): Promise<Placement | undefined> {
  const owner = options.owner;
  // Goes round again only when taking over an earlier claim for this node lost to a concurrent write.
  return retryOnConflict(
    `claiming a slot for ${nodeId} on ${candidate.id}`,
    async (round) => {
      const b = round === 0 ? candidate : await ctx.store.getBacking(candidate.id);
      if (!b) return undefined;
      const held = slotOf(b, nodeId);
      if (held !== undefined) {
        // An earlier claim for this node: ours (a retry), or a dead or superseded delivery's, taken over.
        const mine = await ownClaim(ctx, b, held, nodeId, options);
        return mine ? finishOwnClaim(ctx, mine, held, nodeId, attempt, owner) : AGAIN;
      }
      const now = ctx.clock.now();
      if (needsMaxAgeDrain(b, now)) {
        // Past max-age: take it out of the free index on the way (the reaper does it too).
        await unlessConflict(() =>
          ctx.store.putBacking(markDrained(b, `max-age of ${label.maxAge}s reached`), { version: b.version }),
        );
        return undefined;
      }
      if (!isClaimable(b, now)) return undefined;
      // Concurrent claimants of one backing node aim at different free slots (by node id), and a claim
      // is conditioned on its slot only, so they rarely conflict; a loser gets the item as it is now.
      const slot =
        (round === 0 ? contention.slot : undefined) ??
        (spreadSlot(b, `${nodeId}#${contention.losses + round}`) as number);
      const out = await ctx.store.claimSlot(b, slot, nodeId, { at: now, by: owner }, options.expectedEnd);
      if (!out.claimed) {
        // Lost the slot (or the item changed): leave this candidate for now, as it is now.
        contention.lost = out.current;
        return undefined;
      }
      const next = out.record;
      ctx.log.debug('slot claimed', { nodeId, backingNodeId: b.id, slot });
      if (!label.hostKeyChecking || next.state !== 'ready') return { nodeId, backing: next, slot, attempt };
      // host-key-checking: every allocation on a ready backing node scans its keys first.
      try {
        const hostKeys = await scanKeys(ctx, pool.bootTimeout, next);
        return { nodeId, backing: next, slot, attempt, hostKeys };
      } catch (err) {
        await giveBackSlot(ctx, next.id, nodeId, { owner });
        if (err instanceof RetryableError) throw err; // out of time: no verdict on the backing node
        await options.failBacking(ctx, next.id, `host-key scan failed: ${(err as Error).message}`);
        return undefined;
      }
    },
    () => undefined,
  );
}

/** A claim this delivery holds (now): its backing node's launch finished if it was deferred or cut short. */
async function finishOwnClaim(
  ctx: ServeContext,
  mine: BackingRecord,
  slot: number,
  nodeId: string,
  attempt: number,
  owner: string,
): Promise<Placement | undefined> {
  let backing: BackingRecord;
  try {
    backing = await ensureLaunched(ctx, mine);
  } catch (err) {
    if (!(err instanceof LaunchAttemptError)) throw err; // deferred: keep the claim for the retry
    await giveBackSlot(ctx, mine.id, nodeId, { owner });
    return undefined;
  }
  if (backing.state !== 'launching' && backing.state !== 'ready') {
    await giveBackSlot(ctx, backing.id, nodeId, { owner });
    return undefined;
  }
  return { nodeId, backing, slot, attempt };
}

/**
 * Makes sure the claim `nodeId` holds on `slot` of `b` is this delivery's: it is already (a retry
 * within the delivery), or it belongs to a delivery this one supersedes (an earlier receive of the same
 * message: taken over at once, after `beforeTakeover` fenced it off) or to one known dead (older than
 * CLAIM_TAKEOVER_MS), its node not recorded there, and is taken over with one conditional write. Returns
 * the record after that, undefined when the record changed meanwhile (re-read and look again), and
 * throws BusyError when a live delivery holds the claim or the node is recorded there (a placed
 * request: the caller finds out).
 */
async function ownClaim(
  ctx: ServeContext,
  b: BackingRecord,
  slot: number,
  nodeId: string,
  options: PlaceOptions,
): Promise<BackingRecord | undefined> {
  const owner = options.owner;
  const claim = claimOf(b, slot);
  if (claim?.by === owner) return b;
  const now = ctx.clock.now();
  const superseded =
    claim !== undefined && options.beforeTakeover !== undefined && supersedes(owner, claim.by);
  if (!claim || !(superseded || deliveryDead(claim.at, now, ctx.deliveriesDeadBefore))) {
    throw new BusyError(`node ${nodeId} is being placed by another delivery (on ${b.id}); retrying later`);
  }
  if (superseded) await options.beforeTakeover?.();
  const parsed = parseNodeId(nodeId);
  const n = parsed ? (await ctx.store.getRequest(parsed.requestId))?.nodes[parsed.index] : undefined;
  if (holdsSlot(n, b.id, slot)) throw new BusyError(`node ${nodeId} is already recorded on ${b.id}`);
  const next = takeOverClaim(b, slot, owner, now);
  if (!(await unlessConflict(() => ctx.store.putBacking(next, { version: b.version })))) return undefined;
  ctx.log.info('abandoned claim taken over', { nodeId, backingNodeId: b.id, slot, from: claim.by });
  return next;
}

async function launchFor(
  ctx: ServeContext,
  pool: MetastaticPool,
  label: MetastaticLabel,
  nodeId: string,
  firstAttempt: number,
  options: PlaceOptions,
): Promise<Placement> {
  const owner = options.owner;
  const backingPool = ctx.config.backingPoolByLabel.get(label.backingLabel);
  if (!backingPool) throw new RetryableError(`no backing pool provides label ${label.backingLabel}`);
  // Attempt n launches the backing node derived from (node, n): a redelivery finds the same record,
  // and a failed attempt is never reused. launch-retries is the total number of attempts.
  let lastReason = '';
  for (let attempt = firstAttempt; attempt <= pool.launchRetries; attempt++) {
    checkTimeToLaunch(ctx, nodeId); // each attempt may launch (the one before may have failed)
    const id = backingNodeId(pool.key, label.name, nodeId, attempt);
    let record = await ctx.store.getBacking(id);
    if (!record) {
      // A provider that paused launching for this pool (quota) makes the request wait, not fail.
      const blocked = providerOf(ctx, backingPool.key)?.launchBlocked?.(backingPool.key, label.backingLabel);
      if (blocked) throw new CapacityError(`launching in ${backingPool.key} is paused: ${blocked}`);
      if (backingPool.maxServers !== undefined) {
        await reserveBacking(ctx, backingPool.key, backingPool.maxServers, id, options, label.backingLabel);
      }
      // Intent first: the record exists before the resource, so a crash never leaves an unknown machine.
      const fresh = newBackingRecord({
        id,
        poolKey: pool.key,
        label,
        backingPoolKey: backingPool.key,
        firstNodeId: nodeId,
        owner,
        attempt,
        now: ctx.clock.now(),
        firstEnd: options.expectedEnd,
        contract: backingPool.labels.get(label.backingLabel)?.contract,
      });
      // Another delivery of the same message may have created it since our read: then use theirs.
      record = (await ctx.store.createBacking(fresh)) ?? fresh;
    }
    const slot = slotOf(record, nodeId);
    if (record.state !== 'launching' && record.state !== 'ready') {
      lastReason = record.reason ?? `backing node ${id} is ${record.state}`;
      if (slot !== undefined) await giveBackSlot(ctx, id, nodeId, { owner });
      continue;
    }
    if (slot === undefined) {
      throw new RetryableError(`backing node ${id} exists without node ${nodeId}; retrying placement`);
    }
    const mine = await ownClaim(ctx, record, slot, nodeId, options);
    if (!mine) throw new RetryableError(`backing node ${id} changed while being taken over; retrying`);
    try {
      record = await ensureLaunched(ctx, mine);
    } catch (err) {
      if (!(err instanceof LaunchAttemptError)) throw err; // deferred: keep the claim for the retry
      await giveBackSlot(ctx, id, nodeId, { owner });
      lastReason = err.message;
      continue;
    }
    if (record.state !== 'launching' && record.state !== 'ready') {
      // Failed meanwhile (another delivery's launch of it failed, or its deadline passed).
      lastReason = record.reason ?? `backing node ${id} is ${record.state}`;
      await giveBackSlot(ctx, id, nodeId, { owner });
      continue;
    }
    return { nodeId, backing: record, slot, attempt };
  }
  throw new LaunchFailedError(
    `backing node for ${nodeId} failed to launch ${pool.launchRetries} time(s); last: ${lastReason}`,
  );
}

/** Throws DeadlineError when the invocation has no time left to launch (Context.deadline). */
function checkTimeToLaunch(ctx: ServeContext, nodeId: string): void {
  if (timeLeft(ctx) <= 0) {
    throw new DeadlineError(
      `no time left in this invocation to launch a backing node for ${nodeId}; retrying`,
    );
  }
}
