import type { MetastaticLabel, MetastaticPool } from '../config/model.ts';
import {
  claimOf,
  compareCandidates,
  compareOldestFirst,
  freeSlot,
  hashOf,
  isClaimable,
  markDrained,
  newBackingRecord,
  slotOf,
  spreadSlot,
  takeOverClaim,
} from '../core/backing.ts';
import {
  BusyError,
  CapacityError,
  ConflictError,
  DeadlineError,
  LaunchAttemptError,
  LaunchFailedError,
  RetryableError,
  TimeoutError,
} from '../core/errors.ts';
import { backingNodeId, ownerSince, parseNodeId, supersedes } from '../core/ids.ts';
import { MetricName, PoolEventType } from '../core/observability.ts';
import type { BackingProvider } from '../core/provider.ts';
import { needsMaxAgeDrain } from '../core/reaper.ts';
import type { BackingRecord } from '../core/records.ts';
import { keys } from '../store/table.ts';
import { type Context, deliveryDead, emit, MAX_CONFLICT_RETRIES, MIN_CHECK_MS, timeLeft } from './context.ts';
import { failBackingNode } from './failure.ts';

/** Where a node went: its backing node as it was right after the claim. */
export interface Placement {
  readonly nodeId: string;
  readonly backing: BackingRecord;
  readonly slot: number;
  /** Host keys scanned at claim time (host-key-checking on a ready backing node). */
  readonly hostKeys?: string[];
  /** Which attempt (backing nodes tried for this node, launch-retries bounds it) this placement is. */
  readonly attempt: number;
}

export interface PlaceOptions {
  /**
   * The owner token of the delivery placing the node: its claims carry it, and only claims it holds
   * are built on or given back by it. A claim another delivery holds makes the placement fail with a
   * BusyError, unless that delivery is known dead (CLAIM_TAKEOVER_MS), when the claim is taken over.
   */
  readonly owner: string;
  /** Called before launching a backing node, the one side effect a duplicate must never repeat. */
  readonly beforeLaunch?: () => Promise<void>;
  /**
   * Called before taking over a claim or place of a delivery this one supersedes (an earlier receive of
   * the same message, core/ids.ts): it must make sure that delivery can record nothing more (the request
   * delivery makes itself the placer). Without it, such claims are taken over only once abandoned.
   */
  readonly beforeTakeover?: () => Promise<void>;
  /** Attempts this node already used (re-homing after a failed backing node). */
  readonly previousAttempts?: number;
}

/** How many candidates one Query brings back; the first claimable one almost always wins. */
const CANDIDATES_PER_QUERY = 10;
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
  ctx: Context,
  pool: MetastaticPool,
  label: MetastaticLabel,
  nodeId: string,
  options: PlaceOptions,
): Promise<Placement> {
  const attempt = (options.previousAttempts ?? 0) + 1;
  if (attempt > pool.launchRetries) {
    throw new LaunchFailedError(`node ${nodeId} used all ${pool.launchRetries} attempt(s)`);
  }
  let cursor: Record<string, unknown> | undefined;
  let losses = 0;
  for (let page = 0; page < MAX_CANDIDATE_PAGES; page++) {
    const found = await ctx.store.findCandidates(pool.key, label.name, CANDIDATES_PER_QUERY, cursor);
    const order = ctx.placementPolicy === 'oldest' ? compareOldestFirst : compareCandidates;
    const queue = found.items.sort(order);
    for (let next = queue.shift(); next; next = queue.shift()) {
      const contention: Contention = { losses };
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
    cursor = found.cursor;
    if (!cursor) break;
  }
  // A launch is the one side effect a duplicate must never repeat: the caller checks first.
  await options.beforeLaunch?.();
  return launchFor(ctx, pool, label, nodeId, attempt, options);
}

/** What a claim attempt learnt of concurrent claimants. */
interface Contention {
  /** Claims this placement lost so far (varies the slot it aims at next). */
  readonly losses: number;
  /** The candidate as it was when the claim lost its slot to a concurrent write. */
  lost?: BackingRecord;
}

/**
 * Claims a slot on one backing node. A claim that loses its slot to a concurrent write leaves the
 * candidate, reporting it as it is now (placeNode comes back to it last).
 */
async function claimOn(
  ctx: Context,
  pool: MetastaticPool,
  label: MetastaticLabel,
  candidate: BackingRecord,
  nodeId: string,
  attempt: number,
  options: PlaceOptions,
  contention: Contention,
): Promise<Placement | undefined> {
  const owner = options.owner;
  let b: BackingRecord | undefined = candidate;
  for (let i = 0; i < MAX_CONFLICT_RETRIES && b; i++) {
    const held = slotOf(b, nodeId);
    if (held !== undefined) {
      // An earlier claim for this node: ours (a retry), or a dead or superseded delivery's, taken over.
      const mine = await ownClaim(ctx, b, held, nodeId, options);
      if (!mine) {
        b = await ctx.store.getBacking(b.id);
        continue;
      }
      // If the launch of its backing node was deferred or cut short, finish it now.
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
      return { nodeId, backing, slot: held, attempt };
    }
    const now = ctx.clock.now();
    if (needsMaxAgeDrain(b, now)) {
      // Past max-age: take it out of the free index on the way (the reaper does it too).
      await ctx.store
        .putBacking(markDrained(b, `max-age of ${label.maxAge}s reached`), { version: b.version })
        .catch((err: unknown) => {
          if (!(err instanceof ConflictError)) throw err;
        });
      return undefined;
    }
    if (!isClaimable(b, now)) return undefined;
    // Concurrent claimants of one backing node aim at different free slots (by node id), and a claim
    // is conditioned on its slot only, so they rarely conflict; a loser gets the item as it is now.
    const slot = spreadSlot(b, `${nodeId}#${contention.losses + i}`) as number;
    const out = await ctx.store.claimSlot(b, slot, nodeId, { at: now, by: owner });
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
      const hostKeys = await scanKeys(ctx, pool, next);
      return { nodeId, backing: next, slot, attempt, hostKeys };
    } catch (err) {
      await giveBackSlot(ctx, next.id, nodeId, { owner });
      if (err instanceof RetryableError) throw err; // out of time: no verdict on the backing node
      const reason = `host-key scan failed: ${(err as Error).message}`;
      await failBackingNode(ctx, next.id, reason, { resourceGone: false });
      return undefined;
    }
  }
  return undefined;
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
  ctx: Context,
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
  if (n?.backingNodeId === b.id && n.slot === slot && (n.state === 'pending' || n.state === 'ready')) {
    throw new BusyError(`node ${nodeId} is already recorded on ${b.id}`);
  }
  const next = takeOverClaim(b, slot, owner, now);
  try {
    await ctx.store.putBacking(next, { version: b.version });
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    return undefined;
  }
  ctx.log.info('abandoned claim taken over', { nodeId, backingNodeId: b.id, slot, from: claim.by });
  return next;
}

/**
 * Scans a ready backing node's SSH host keys, within boot-timeout and the invocation's time (Context.deadline).
 * With less than MIN_CHECK_MS left it does not start, and a scan the deadline cut short that runs out is
 * no verdict while the backing node is within boot-timeout of its first `running` report: both throw
 * DeadlineError (retryable: the record comes back with a fresh deadline). Any other failure is the
 * backing node's.
 */
export async function scanKeys(ctx: Context, pool: MetastaticPool, b: BackingRecord): Promise<string[]> {
  if (!b.host || b.port === undefined) throw new Error(`backing node ${b.id} has no connection details`);
  const scan = ctx.scanHostKeys;
  if (!scan) throw new Error('no host-key scanner is configured');
  const where = `${b.host}:${b.port}`;
  const bootMs = pool.bootTimeout * 1000;
  const left = timeLeft(ctx);
  if (left < Math.min(MIN_CHECK_MS, bootMs)) {
    throw new DeadlineError(`no time left in this invocation to scan the host keys of ${where}; retrying`);
  }
  const budget = Math.min(bootMs, left);
  let keys: string[];
  try {
    keys = await scan(b.host, b.port, budget);
  } catch (err) {
    const booting = ctx.clock.now() - (b.runningAt ?? b.readyAt ?? b.launchedAt) < bootMs;
    if (err instanceof TimeoutError && budget < bootMs && booting) {
      throw new DeadlineError(
        `host-key scan of ${where} used the ${budget} ms this invocation had left, within its boot-timeout of ${pool.bootTimeout}s; retrying`,
        { cause: err },
      );
    }
    throw err;
  }
  if (keys.length === 0) throw new Error(`${where} offered no host key`);
  return keys;
}

async function launchFor(
  ctx: Context,
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

/**
 * Takes a place in a backing pool's max-servers for a backing node about to be launched. A place held
 * by another delivery (same backing id: the same node's placement) is theirs while they live; once
 * they are known dead it is taken over.
 */
async function reserveBacking(
  ctx: Context,
  backingPoolKey: string,
  maxServers: number,
  id: string,
  options: PlaceOptions,
  backingLabel: string,
): Promise<void> {
  const owner = options.owner;
  const key = keys.backingPool(backingPoolKey);
  const reserved = await ctx.store.reserve(key, [id], maxServers, owner);
  if (reserved.kind === 'full') {
    throw new CapacityError(
      `backing pool ${backingPoolKey} is at max-servers (${maxServers}) for label ${backingLabel}`,
    );
  }
  if (reserved.kind === 'held') {
    const holder = reserved.holders.get(id) as string;
    const superseded = options.beforeTakeover !== undefined && supersedes(owner, holder);
    if (!superseded && !deliveryDead(ownerSince(holder), ctx.clock.now(), ctx.deliveriesDeadBefore)) {
      throw new BusyError(`backing node ${id} is being launched by another delivery; retrying later`);
    }
    if (superseded) await options.beforeTakeover?.();
    if (!(await ctx.store.takeOverReservation(key, id, holder, owner))) {
      throw new BusyError(`the place of backing node ${id} changed hands; retrying later`);
    }
  }
}

/**
 * Finishes a launch whose record exists without a resource (deferred by a quota pause or throttling,
 * or cut short by a crash between the intent write and the provider call). Idempotent.
 */
export async function ensureLaunched(ctx: Context, b: BackingRecord): Promise<BackingRecord> {
  return b.resourceId || b.state !== 'launching' ? b : launch(ctx, b);
}

/** Asks the provider for the resource (idempotent per backing id and attempt) and records its id. */
async function launch(ctx: Context, b: BackingRecord): Promise<BackingRecord> {
  let resourceId: string;
  try {
    const provider = ctx.providers.forPool(b.backingPoolKey);
    ({ resourceId } = await provider.launch({
      backingNodeId: b.id,
      attempt: b.attempt,
      poolKey: b.backingPoolKey,
      label: b.backingLabel,
    }));
  } catch (err) {
    if (err instanceof RetryableError) {
      // No capacity now (quota pause) or throttled: the record stays launching with its claim, so the
      // retry calls the provider again with the same idempotency token (an instance that was created
      // after all comes back instead of a second one). The request waits meanwhile.
      ctx.log.warn('backing launch deferred', { backingNodeId: b.id, reason: (err as Error).message });
      throw err;
    }
    const reason = `launch of ${b.backingLabel} failed: ${(err as Error).message}`;
    ctx.log.error('backing launch failed', { backingNodeId: b.id, reason });
    ctx.metrics?.count(MetricName.launchFailed);
    await failBackingNode(ctx, b.id, reason, { resourceGone: true, handleNodes: false });
    throw new LaunchAttemptError(reason, { cause: err });
  }
  let pointed = false;
  // A pointer this delivery wrote for a resource that ends up unrecorded names nothing: removed.
  const unpoint = async () => {
    if (pointed) await ctx.store.forgetResource(resourceId, b.id);
  };
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const current = await ctx.store.getBacking(b.id);
    if (!current) throw new ConflictError(`backing node ${b.id} disappeared during launch`);
    if (current.resourceId) {
      // A concurrent delivery recorded (and announced) it.
      if (current.resourceId !== resourceId) await unpoint();
      return current;
    }
    if (current.state === 'stopped') {
      await unpoint();
      return current; // too late: the orphan check terminates it
    }
    // The pointer first, so every recorded resource id has one: the fulfil function finds the backing
    // node of an EC2 event by it (and ignores, without calling EC2, events for instances not ours).
    const now = ctx.clock.now();
    if (!pointed) {
      await ctx.store.pointToBacking(resourceId, b.id, now);
      pointed = true;
    }
    // Recorded even on a record failed meanwhile, so the reaper terminates the resource with it.
    const next = { ...current, resourceId, resourceRecordedAt: now, version: current.version + 1 };
    if (current.state !== 'launching') {
      try {
        await ctx.store.putBacking(next, { version: current.version });
      } catch (err) {
        if (!(err instanceof ConflictError)) throw err;
        continue; // re-read: recorded by another delivery meanwhile, or write again
      }
      return current;
    }
    try {
      await ctx.store.putBacking(next, { version: current.version });
      // Only the delivery that records the resource announces it: once per backing node.
      ctx.log.info('backing node launching', { backingNodeId: b.id, resourceId, label: b.backingLabel });
      ctx.metrics?.count(MetricName.launchSucceeded);
      await emit(ctx, PoolEventType.backingLaunched, {
        backingNodeId: b.id,
        resourceId,
        pool: b.poolKey,
        label: b.label,
        backingPool: b.backingPoolKey,
        backingLabel: b.backingLabel,
        attempt: b.attempt,
      });
      return next;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  throw new ConflictError(`gave up recording resource ${resourceId} on backing node ${b.id}`);
}

/** Which claim a give-back may free: any (a recorded node's slot), or only one owner's (a claim). */
export interface GiveBackOnly {
  /** Free the slot only while this owner's claim is on it. */
  readonly owner: string;
  /** ...and only the claim taken at this instant (the reaper's lease: a takeover renews it). */
  readonly claimedAt?: number;
}

/**
 * Gives a slot back: the one conditional write of a release, also used to undo the placements of a
 * node set that could not be completed. Stamps last-used, from which grace-time counts. With `only`,
 * the slot is freed only while the given claim is on it: a delivery never frees another's claim.
 */
export async function giveBackSlot(
  ctx: Context,
  backingId: string,
  nodeId: string,
  only?: GiveBackOnly,
): Promise<boolean> {
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const b = await ctx.store.getBacking(backingId);
    if (!b) return false;
    const slot = slotOf(b, nodeId);
    if (slot === undefined) return false; // already given back
    if (only) {
      const claim = claimOf(b, slot);
      if (claim?.by !== only.owner || (only.claimedAt !== undefined && claim.at !== only.claimedAt))
        return false;
    }
    try {
      await ctx.store.putBacking(freeSlot(b, slot, ctx.clock.now()), { version: b.version });
      ctx.log.debug('slot freed', { nodeId, backingNodeId: backingId, slot });
      return true;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  throw new ConflictError(`gave up freeing the slot of ${nodeId} on ${backingId}`);
}

function providerOf(ctx: Context, poolKey: string): BackingProvider | undefined {
  try {
    return ctx.providers.forPool(poolKey);
  } catch {
    return undefined; // launch() reports it as the attempt's failure
  }
}
