import { markStopped } from '../core/backing.ts';
import { ownerSince, parseNodeId } from '../core/ids.ts';
import { MetricName, PoolEventType } from '../core/observability.ts';
import type { BackingProvider, BackingResource } from '../core/provider.ts';
import type { BackingRecord } from '../core/records.ts';
import { ORPHAN_GRACE_MS, SLOT_LEASE_MS } from '../core/timing.ts';
import { unlessConflict } from './conflicts.ts';
import { type Context, emit, leaseExpired, timeLeft } from './context.ts';
import { failBackingNode } from './failure.ts';
import { resourceRunning } from './fulfil.ts';
import type { MutableReport } from './reapReport.ts';
import { isGone, lookUp, providerFor } from './resourceLook.ts';

/**
 * The reaper's side of the truth about what runs: the table against every provider's list of tagged
 * resources (both ways), max-servers places against what is live, and a backing node's end (terminate,
 * confirmed gone, stopped). reap.ts runs these in order.
 */

/**
 * Gives back the places in max-servers sets that nothing live holds: a delivery reserves a place
 * before it records what for (a backing node, a placed node), so one that dies in between leaves its
 * place taken. Only places older than the slot lease are looked at, and each is confirmed against its
 * record before it is given back, conditionally on the owner that took it (a delivery that took it
 * over since keeps it).
 */
export async function reconcileCapacity(
  ctx: Context,
  live: readonly BackingRecord[],
  report: MutableReport,
): Promise<void> {
  const now = ctx.clock.now();
  const deadBefore = ctx.deliveriesDeadBefore;
  const abandoned = (owner: string) =>
    leaseExpired(ownerSince(owner), now) || (deadBefore !== undefined && ownerSince(owner) < deadBefore);
  const liveBacking = new Set(live.map((b) => b.id));
  // Operations on places begun before this by a delivery that died are finished first (the count stays
  // exact whatever; this only clears what they left part-way).
  const stale = Math.max(now - SLOT_LEASE_MS, deadBefore ?? Number.NEGATIVE_INFINITY);
  for (const pool of ctx.config.backingPools) {
    if (pool.maxServers === undefined) continue;
    report.recoveredPlaces += await ctx.store.recoverBackingPlaces(pool.key, stale);
    for (const [id, owner] of await ctx.store.backingPlaces(pool.key)) {
      if (liveBacking.has(id) || !abandoned(owner)) continue;
      const record = await ctx.store.getBacking(id);
      if (record && record.state !== 'stopped') continue; // created since the reap index was read
      await ctx.store.freeBackingPlace(pool.key, id, owner);
      report.reclaimedPlaces++;
      ctx.log.warn('place in a backing pool given back: its backing node was never recorded', {
        backingPool: pool.key,
        backingNodeId: id,
      });
    }
  }
  const onSlots = new Set(live.flatMap((b) => Object.values(b.slotMap)));
  for (const pool of ctx.config.metastaticPools) {
    if (pool.maxServers === undefined) continue;
    report.recoveredPlaces += await ctx.store.recoverNodePlaces(pool.key, stale);
    for (const [nodeId, owner] of await ctx.store.nodePlaces(pool.key)) {
      if (onSlots.has(nodeId) || !abandoned(owner)) continue;
      const parsed = parseNodeId(nodeId);
      const r = parsed ? await ctx.store.getRequest(parsed.requestId) : undefined;
      const n = parsed ? r?.nodes[parsed.index] : undefined;
      if (r?.poolKey === pool.key && (n?.state === 'pending' || n?.state === 'ready')) continue;
      await ctx.store.freeNodePlaces(pool.key, [nodeId], owner);
      report.reclaimedPlaces++;
      ctx.log.warn('place in a pool given back: no live node holds it', { pool: pool.key, nodeId });
    }
  }
}

/** Compares the table with every provider's list of tagged resources, both ways. */
export async function reconcile(
  ctx: Context,
  records: readonly BackingRecord[],
  report: MutableReport,
  gone: Set<string>,
): Promise<void> {
  const providers = new Map<BackingProvider, string>();
  for (const pool of ctx.config.backingPools) {
    try {
      const p = ctx.providers.forPool(pool.key);
      if (!providers.has(p)) providers.set(p, pool.key);
    } catch (err) {
      report.errors.push(`reconcile ${pool.key}: ${(err as Error).message}`);
    }
  }
  const listed = new Map<string, BackingResource>();
  const listedBy = new Map<string, BackingProvider>();
  for (const provider of providers.keys()) {
    for (const r of await provider.list()) {
      listed.set(r.resourceId, r);
      listedBy.set(r.resourceId, provider);
    }
  }
  const recorded = new Map(records.filter((b) => b.resourceId).map((b) => [b.resourceId as string, b]));
  // Records whose resource is gone: fail them (waiting nodes move, ready nodes fail).
  for (const b of records) {
    if (!b.resourceId) continue;
    if (timeLeft(ctx) <= 0) {
      report.deferred++; // the rest is the next run's
      return;
    }
    const listedResource = listed.get(b.resourceId);
    if (listedResource && !isGone(listedResource)) {
      if (b.state === 'launching' && listedResource.state === 'running') {
        await resourceRunning(ctx, listedResource).catch(() => undefined); // an event that never came
      }
      continue;
    }
    let provider: BackingProvider;
    try {
      provider = providerFor(ctx, b);
    } catch {
      continue;
    }
    // Confirm: lists can lag, and a young EC2 instance may be unknown to them for a while.
    if (!(await lookUp(ctx, provider, b)).gone) continue;
    gone.add(b.id);
    const settled = await failBackingNode(ctx, b.id, `backing resource ${b.resourceId} vanished`, {
      resourceGone: true,
    });
    report.failed.push(b.id);
    report.moved += settled?.rehomed ?? 0;
  }
  // Tagged resources with no live record: orphans (or records that were stopped but survived).
  for (const [resourceId, r] of listed) {
    if (recorded.has(resourceId) || isGone(r)) continue;
    const record = await ctx.store.getBacking(r.backingNodeId);
    const live = record && record.state !== 'stopped' && record.resourceId === resourceId;
    const tracked = record && record.resourceId === undefined && record.state === 'launching';
    if (live || tracked) continue; // known, or a launch about to record its resource id
    if (r.launchedAt !== undefined && ctx.clock.now() - r.launchedAt < ORPHAN_GRACE_MS) continue;
    await listedBy.get(resourceId)?.terminate(resourceId);
    report.orphans.push(resourceId);
    ctx.log.warn('orphaned resource terminated', { resourceId, backingNodeId: r.backingNodeId });
  }
}

/**
 * Terminates the resource and, once the provider confirms it gone, records the backing node stopped
 * and frees its place in the backing pool. Until confirmed, it stays retiring/failed and the next run
 * tries again.
 */
export async function stop(ctx: Context, b: BackingRecord, report: MutableReport): Promise<void> {
  if (b.resourceId) {
    const provider = providerFor(ctx, b);
    await provider.terminate(b.resourceId);
    const after = await lookUp(ctx, provider, b);
    if (!after.gone && after.unseen) {
      // A young instance EC2 does not show yet: its terminate may have missed it. The next run again.
      ctx.log.warn('backing resource not confirmed gone; terminated again next run', {
        backingNodeId: b.id,
        resourceId: b.resourceId,
        why: after.why,
      });
      return;
    }
    if (!after.gone) throw new Error(`resource ${b.resourceId} ${after.why} after terminate`);
  }
  const current = await ctx.store.getBacking(b.id);
  if (!current || (current.state !== 'retiring' && current.state !== 'failed')) return;
  // The resource is gone: give its place in the backing pool back first. Done after the record is
  // stopped, a crash in between would leave the place taken for good (stopped records sit in no reap
  // partition, so no later run would retry it); done first, a crash just repeats it (idempotent).
  // Its resource pointer likewise: no event for it needs handling any more.
  await ctx.store.freeBackingPlace(b.backingPoolKey, b.id);
  if (b.resourceId) await ctx.store.forgetResource(b.resourceId, b.id);
  const stopped = await unlessConflict(() =>
    ctx.store.putBacking(markStopped(current, ctx.clock.now()), {
      version: current.version,
      states: [current.state],
    }),
  );
  if (!stopped) return;
  report.stopped.push(b.id);
  ctx.metrics?.count(MetricName.reaped);
  await emit(ctx, PoolEventType.backingStopped, {
    backingNodeId: b.id,
    resourceId: b.resourceId,
    pool: b.poolKey,
    label: b.label,
    reason: current.reason,
    state: current.state,
  });
  ctx.log.info('backing node stopped', { backingNodeId: b.id, resourceId: b.resourceId });
}
