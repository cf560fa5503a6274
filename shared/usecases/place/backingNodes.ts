import { claimOf, freeSlot, markFailed, slotOf } from '../../core/backing.ts';
import {
  BusyError,
  CapacityError,
  DeadlineError,
  LaunchAttemptError,
  RetryableError,
  TimeoutError,
} from '../../core/errors.ts';
import { ownerSince, supersedes } from '../../core/ids.ts';
import { MetricName, PoolEventType } from '../../core/observability.ts';
import type { BackingPort, CapacityPort } from '../../core/poolStore.ts';
import type { BackingProvider } from '../../core/provider.ts';
import type { BackingRecord, NodeRecord } from '../../core/records.ts';
import { hostKeysOf } from '../../core/request.ts';
import { MIN_CHECK_MS } from '../../core/timing.ts';
import { retryOnConflict } from '../conflicts.ts';
import { type Context, deliveryDead, emit, type ServeContext, timeLeft } from '../context.ts';
import { noteFreedSlot } from './candidates.ts';

/**
 * The operations on one backing node that placing, readying, failing and reaping all use: give a slot
 * back, finish a launch, take a place in a backing pool's max-servers, scan host keys, mark it failed.
 * None of them settles the nodes on a backing node: that is failure.ts, which calls back into placement
 * (see FailBacking).
 */

/**
 * Fails a backing node and settles the nodes on it (failure.ts failBackingNode). Placing and readying
 * nodes can find a backing node bad (its host-key scan fails) and must fail it, and failing one moves its
 * waiting nodes, which places them again: a recursion of the domain (a move can land on another backing
 * node whose scan fails in turn, each step on a backing node not failed before, so it ends). The callers
 * of placement.ts and nodesReady.ts pass this step in instead of those modules importing failure.ts.
 */
export type FailBacking = (ctx: ServeContext, backingId: string, reason: string) => Promise<unknown>;

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
  ctx: Context<BackingPort & CapacityPort>,
  backingId: string,
  nodeId: string,
  only?: GiveBackOnly,
): Promise<boolean> {
  return retryOnConflict(`freeing the slot of ${nodeId} on ${backingId}`, async () => {
    const b = await ctx.store.getBacking(backingId);
    if (!b) return false;
    const slot = slotOf(b, nodeId);
    if (slot === undefined) return false; // already given back
    if (only) {
      const claim = claimOf(b, slot);
      if (claim?.by !== only.owner || (only.claimedAt !== undefined && claim.at !== only.claimedAt))
        return false;
    }
    const next = freeSlot(b, slot, ctx.clock.now());
    await ctx.store.putBacking(next, { version: b.version });
    noteFreedSlot(ctx, next);
    ctx.log.debug('slot freed', { nodeId, backingNodeId: backingId, slot });
    return true;
  });
}

/**
 * Gives back what a node that ended held: its slot (when placed) and its place in its pool's max-servers
 * (pools with max-servers, or a pool removed from the configuration: cleaned up anyway). Idempotent.
 */
export async function giveBackRoom(
  ctx: Context<BackingPort & CapacityPort>,
  poolKey: string | undefined,
  n: NodeRecord,
): Promise<void> {
  const pool = ctx.config.metastaticPools.find((p) => p.key === poolKey);
  // The slot and the place are independent items: given back side by side (a max-servers release in 4
  // round trips, not 6). Both are idempotent; a failure of either is thrown once both have settled, and
  // the release's retry (or the reaper) gives back what is left.
  const settled = await Promise.allSettled([
    n.backingNodeId ? giveBackSlot(ctx, n.backingNodeId, n.id) : undefined,
    poolKey && (!pool || pool.maxServers !== undefined)
      ? ctx.store.freeNodePlaces(poolKey, [n.id])
      : undefined,
  ]);
  for (const s of settled) if (s.status === 'rejected') throw s.reason;
}

/**
 * Marks a backing node failed (no more slots on it), leaving its nodes as they are. Returns the failed
 * record (also when it was failed already), undefined when there is none or it is past failing
 * (retiring, stopped).
 */
export async function markBackingFailed(
  ctx: Context<BackingPort & CapacityPort>,
  backingId: string,
  reason: string,
): Promise<BackingRecord | undefined> {
  return retryOnConflict(`failing backing node ${backingId}`, async () => {
    const b = await ctx.store.getBacking(backingId);
    if (!b || b.state === 'failed') return b;
    if (b.state !== 'launching' && b.state !== 'ready') return undefined;
    const next = markFailed(b, ctx.clock.now(), reason);
    await ctx.store.putBacking(next, { version: b.version, states: ['launching', 'ready'] });
    ctx.log.warn('backing node failed', { backingNodeId: backingId, resourceId: b.resourceId, reason });
    return next;
  });
}

/** Who takes a place in a backing pool's max-servers, and how it treats another delivery's. */
export interface PlaceTaker {
  readonly owner: string;
  /** Set when this delivery may take over an earlier receive's places (see PlaceOptions.beforeTakeover). */
  readonly beforeTakeover?: () => Promise<void>;
}

/**
 * Takes a place in a backing pool's max-servers for a backing node about to be launched. A place held
 * by another delivery (same backing id: the same node's placement) is theirs while they live; once
 * they are known dead (or superseded: an earlier receive of the same message) it is taken over.
 */
export async function reserveBacking(
  ctx: Context<BackingPort & CapacityPort>,
  backingPoolKey: string,
  maxServers: number,
  id: string,
  taker: PlaceTaker,
  backingLabel: string,
): Promise<void> {
  const owner = taker.owner;
  const reserved = await ctx.store.reserveBackingPlace(backingPoolKey, id, maxServers, owner);
  if (reserved.kind === 'full') {
    throw new CapacityError(
      `backing pool ${backingPoolKey} is at max-servers (${maxServers}) for label ${backingLabel}`,
    );
  }
  if (reserved.kind === 'held') {
    const holder = reserved.holders.get(id) as string;
    const superseded = taker.beforeTakeover !== undefined && supersedes(owner, holder);
    if (!superseded && !deliveryDead(ownerSince(holder), ctx.clock.now(), ctx.deliveriesDeadBefore)) {
      throw new BusyError(`backing node ${id} is being launched by another delivery; retrying later`);
    }
    if (superseded) await taker.beforeTakeover?.();
    if (!(await ctx.store.takeOverBackingPlace(backingPoolKey, id, holder, owner))) {
      throw new BusyError(`the place of backing node ${id} changed hands; retrying later`);
    }
  }
}

/**
 * Scans a ready backing node's SSH host keys, within boot-timeout and the invocation's time (Context.deadline).
 * With less than MIN_CHECK_MS left it does not start, and a scan the deadline cut short that runs out is
 * no verdict while the backing node is within boot-timeout of its first `running` report: both throw
 * DeadlineError (retryable: the record comes back with a fresh deadline). Any other failure is the
 * backing node's. Where the backing node's keys come from its console (Context.hostKeyPlan), the scan
 * must answer with one of them, and without a network path those keys are the answer.
 */
export async function scanKeys(
  ctx: Context<BackingPort & CapacityPort>,
  bootTimeoutS: number,
  b: BackingRecord,
): Promise<string[]> {
  const plan = ctx.hostKeyPlan?.(b.backingPoolKey, b.backingLabel);
  const fromConsole = plan?.source === 'console' ? hostKeysOf(b) : undefined;
  if (plan && !plan.reachable) {
    // No network path to scan over: the keys EC2's console output gave (read when the backing node became
    // ready) stand in for the scan. networkRules.ts refuses host-key-checking here with any other source.
    if (fromConsole?.length) return [...fromConsole];
    throw new Error(
      `the functions cannot reach backing node ${b.id}, and it has no host keys from its console`,
    );
  }
  if (!b.host || b.port === undefined) throw new Error(`backing node ${b.id} has no connection details`);
  const scan = ctx.scanHostKeys;
  if (!scan) throw new Error('no host-key scanner is configured');
  const where = `${b.host}:${b.port}`;
  const bootMs = bootTimeoutS * 1000;
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
        `host-key scan of ${where} used the ${budget} ms this invocation had left, within its boot-timeout of ${bootTimeoutS}s; retrying`,
        { cause: err },
      );
    }
    throw err;
  }
  if (keys.length === 0) throw new Error(`${where} offered no host key`);
  // Both ways at hand: the host must answer with a key its console printed (else a host in between).
  if (fromConsole?.length && !keys.every((k) => fromConsole.includes(k))) {
    throw new Error(`${where} answered with a host key its console output does not list`);
  }
  return keys;
}

/**
 * Finishes a launch whose record exists without a resource (deferred by a quota pause or throttling,
 * or cut short by a crash between the intent write and the provider call). Idempotent.
 */
export async function ensureLaunched(
  ctx: Context<BackingPort & CapacityPort>,
  b: BackingRecord,
): Promise<BackingRecord> {
  return b.resourceId || b.state !== 'launching' ? b : launch(ctx, b);
}

/** Asks the provider for the resource (idempotent per backing id and attempt) and records its id. */
async function launch(ctx: Context<BackingPort & CapacityPort>, b: BackingRecord): Promise<BackingRecord> {
  let resourceId: string;
  try {
    const provider = ctx.providers.forPool(b.backingPoolKey);
    const slot = ctx.config.metastaticPools.find((p) => p.key === b.poolKey)?.labels.get(b.label)?.slot;
    ({ resourceId } = await provider.launch(
      {
        backingNodeId: b.id,
        attempt: b.attempt,
        poolKey: b.backingPoolKey,
        label: b.backingLabel,
        slots: b.slots,
        ...(slot ? { slot } : {}),
      },
      ctx.deadline,
    ));
  } catch (err) {
    if (err instanceof RetryableError) {
      // No capacity now (quota pause), throttled, or out of the invocation's time (DeadlineError): the
      // record stays launching with its claim, so the
      // retry calls the provider again with the same idempotency token (an instance that was created
      // after all comes back instead of a second one). The request waits meanwhile.
      ctx.log.warn('backing launch deferred', { backingNodeId: b.id, reason: (err as Error).message });
      throw err;
    }
    const reason = `launch of ${b.backingLabel} failed: ${(err as Error).message}`;
    ctx.log.error('backing launch failed', { backingNodeId: b.id, reason });
    ctx.metrics?.count(MetricName.launchFailed);
    // No node waits on it yet but the one whose placement launched it, which gives its slot back.
    await markBackingFailed(ctx, b.id, reason);
    throw new LaunchAttemptError(reason, { cause: err });
  }
  const recorded = await recordResource(ctx, b, resourceId);
  if (recorded.announce) {
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
  }
  return recorded.record;
}

/**
 * Records a launched resource on its backing node, after a pointer from the resource to it (the fulfil
 * function finds the backing node of an EC2 event by it, and ignores events for instances not ours
 * without calling EC2). `announce` when this write recorded it on a launching backing node.
 */
async function recordResource(
  ctx: Context<BackingPort & CapacityPort>,
  b: BackingRecord,
  resourceId: string,
): Promise<{ record: BackingRecord; announce: boolean }> {
  let pointed = false;
  // A pointer this delivery wrote for a resource that ends up unrecorded names nothing: removed.
  const unpoint = async () => {
    if (pointed) await ctx.store.forgetResource(resourceId, b.id);
  };
  return retryOnConflict(`recording resource ${resourceId} on backing node ${b.id}`, async () => {
    const current = await ctx.store.getBacking(b.id);
    if (!current) throw new RetryableError(`backing node ${b.id} disappeared during launch`);
    if (current.resourceId) {
      // A concurrent delivery recorded (and announced) it.
      if (current.resourceId !== resourceId) await unpoint();
      return { record: current, announce: false };
    }
    if (current.state === 'stopped') {
      await unpoint();
      return { record: current, announce: false }; // too late: the orphan check terminates it
    }
    const now = ctx.clock.now();
    if (!pointed) {
      await ctx.store.pointToBacking(resourceId, b.id, now);
      pointed = true;
    }
    // Recorded even on a record failed meanwhile, so the reaper terminates the resource with it.
    const next = { ...current, resourceId, resourceRecordedAt: now, version: current.version + 1 };
    await ctx.store.putBacking(next, { version: current.version });
    return current.state === 'launching'
      ? { record: next, announce: true }
      : { record: current, announce: false };
  });
}

/** The provider of a backing pool, or undefined when none serves it (launch() reports that). */
export function providerOf(
  ctx: Context<BackingPort & CapacityPort>,
  poolKey: string,
): BackingProvider | undefined {
  try {
    return ctx.providers.forPool(poolKey);
  } catch {
    return undefined;
  }
}
