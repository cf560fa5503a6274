import { markStopped } from '../../core/backing.ts';
import { DeadlineError } from '../../core/errors.ts';
import { ownerSince, parseNodeId } from '../../core/ids.ts';
import type { BackingPool, MetastaticPool } from '../../core/model.ts';
import { MetricName, PoolEventType } from '../../core/observability.ts';
import type { BackingProvider, BackingResource } from '../../core/provider.ts';
import type { BackingRecord } from '../../core/records.ts';
import { type Deadline, ORPHAN_GRACE_MS, RUNNING_CHECKS_MS } from '../../core/timing.ts';
import { CHECKS_IN_FLIGHT, forEachBounded, WRITES_IN_FLIGHT } from '../bounded.ts';
import { unlessConflict } from '../conflicts.ts';
import { emit, leaseExpired, type ServeContext, timeLeft } from '../context.ts';
import { resourceRunning } from '../ready/fulfil.ts';
import { failBackingNode } from '../release/failure.ts';
import type { MutableReport } from './reapReport.ts';
import { isGone, type Look, lookUp, lookUpMany, providerFor } from './resourceLook.ts';

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
  ctx: ServeContext,
  live: readonly BackingRecord[],
  report: MutableReport,
): Promise<void> {
  const now = ctx.clock.now();
  const deadBefore = ctx.deliveriesDeadBefore;
  const abandoned = (owner: string) =>
    leaseExpired(ownerSince(owner), now) || (deadBefore !== undefined && ownerSince(owner) < deadBefore);
  const liveBacking = new Set(live.map((b) => b.id));
  // Each set is read and put right on its own (a few calls each, whatever it holds): several sets at once
  // (bounded.ts), not 50 sets one after the other (bench/reaper.ts).
  const backingSets = async (pool: BackingPool) => {
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
  };
  const onSlots = new Set(live.flatMap((b) => Object.values(b.slotMap)));
  const nodeSets = async (pool: MetastaticPool) => {
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
  };
  const sets: Array<() => Promise<void>> = [
    ...ctx.config.backingPools.filter((p) => p.maxServers !== undefined).map((p) => () => backingSets(p)),
    ...ctx.config.metastaticPools.filter((p) => p.maxServers !== undefined).map((p) => () => nodeSets(p)),
  ];
  // A failure of one set is the step's (the others still run): the first is thrown once all are done.
  const failures: unknown[] = [];
  await forEachBounded(sets, WRITES_IN_FLIGHT, async (set) => {
    await set().catch((err: unknown) => void failures.push(err));
  });
  if (failures.length > 0) throw failures[0];
}

/**
 * Compares the table with every provider's list of tagged resources, both ways. Returns the launching
 * backing nodes whose resource the provider lists running, for readyRunning: their checks cost a provider
 * call each and are bounded apart.
 */
export async function reconcile(
  ctx: ServeContext,
  records: readonly BackingRecord[],
  report: MutableReport,
  gone: Set<string>,
): Promise<RunningLaunch[]> {
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
    for (const r of await provider.list(ctx.deadline)) {
      listed.set(r.resourceId, r);
      listedBy.set(r.resourceId, provider);
    }
  }
  const recorded = new Map(records.filter((b) => b.resourceId).map((b) => [b.resourceId as string, b]));
  const running: RunningLaunch[] = [];
  // Records whose resource is gone: fail them (waiting nodes move, ready nodes fail).
  for (const b of records) {
    if (!b.resourceId) continue;
    if (timeLeft(ctx) <= 0) {
      report.deferred++; // the rest is the next run's
      return running;
    }
    const listedResource = listed.get(b.resourceId);
    if (listedResource && !isGone(listedResource)) {
      if (b.state === 'launching' && listedResource.state === 'running') {
        running.push({ backing: b, resource: listedResource }); // an event that never came, or not ready yet
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
  // Tagged resources with no live record: orphans (or records that were stopped but survived),
  // terminated in one batch per provider.
  const orphans = new Map<BackingProvider, BackingResource[]>();
  for (const [resourceId, r] of listed) {
    if (recorded.has(resourceId) || isGone(r)) continue;
    if (r.launchedAt !== undefined && ctx.clock.now() - r.launchedAt < ORPHAN_GRACE_MS) continue;
    if (timeLeft(ctx) <= 0) {
      report.deferred++;
      break;
    }
    const record = await ctx.store.getBacking(r.backingNodeId);
    const live = record && record.state !== 'stopped' && record.resourceId === resourceId;
    const tracked = record && record.resourceId === undefined && record.state === 'launching';
    if (live || tracked) continue; // known, or a launch about to record its resource id
    const provider = listedBy.get(resourceId);
    if (provider) orphans.set(provider, [...(orphans.get(provider) ?? []), r]);
  }
  for (const [provider, resources] of orphans) {
    await terminateAll(
      ctx,
      provider,
      resources.map((r) => r.resourceId),
    );
    for (const r of resources) {
      report.orphans.push(r.resourceId);
      ctx.log.warn('orphaned resource terminated', {
        resourceId: r.resourceId,
        backingNodeId: r.backingNodeId,
      });
    }
  }
  return running;
}

/** A launching backing node whose resource its provider lists running (reconcile). */
export interface RunningLaunch {
  readonly backing: BackingRecord;
  readonly resource: BackingResource;
}

/**
 * Checks launching backing nodes whose resource runs, as their `running` event would (fulfil.ts
 * resourceRunning: the port, the host keys; ready if both are there): the event may have been lost, or
 * its tries may have stopped. Each check is a provider call (EC2's GetConsoleOutput, or a port probe), so
 * they are bounded: CHECKS_IN_FLIGHT at once (EC2's request rates), and no new one
 * after RUNNING_CHECKS_MS of the run, so that a scale-up of hundreds does not hold back every other step
 * run after run. First those no `running` report has reached (nothing else checks them), then those
 * running longest (closest to their boot-timeout, likeliest booted); the rest is the next run's (counted
 * `deferred`), and the fulfil function tries them again every few seconds meanwhile.
 */
export async function readyRunning(
  ctx: ServeContext,
  found: readonly RunningLaunch[],
  report: MutableReport,
): Promise<void> {
  if (found.length === 0) return;
  const order = [...found].sort((a, b) => (a.backing.runningAt ?? 0) - (b.backing.runningAt ?? 0));
  const end = ctx.clock.now() + RUNNING_CHECKS_MS;
  // Each check ends within the run's time and this part's: a probe or a console read not started in time
  // is no verdict (the backing node stays launching, its first report stamped).
  const within: Deadline = { remainingMs: () => Math.min(timeLeft(ctx), end - ctx.clock.now()) };
  const checking: typeof ctx = { ...ctx, deadline: within };
  let started = 0;
  await forEachBounded(order, CHECKS_IN_FLIGHT, async ({ resource }) => {
    if (within.remainingMs() <= 0) return false;
    started++;
    // Not ready yet (the fulfil function tries it again), or no verdict: the next run looks again.
    await resourceRunning(checking, resource).catch(() => undefined);
    return true;
  });
  if (started < order.length) report.deferred++;
}

/** Terminates resources of one provider in as few calls as it allows (terminateMany), within the deadline. */
async function terminateAll(
  ctx: ServeContext,
  provider: BackingProvider,
  ids: readonly string[],
): Promise<void> {
  if (ids.length === 0) return;
  if (provider.terminateMany) {
    await provider.terminateMany(ids, ctx.deadline);
    return;
  }
  for (const id of ids) await provider.terminate(id, ctx.deadline);
}

/**
 * Terminates the resources of retiring and failed backing nodes (holding no slot), a batch per provider
 * (terminateMany: EC2 takes 1,000 ids a call), confirms them gone (lookUpMany), and records each one
 * confirmed stopped, freeing its place in the backing pool. One not confirmed yet (an instance EC2 does
 * not show yet) stays retiring/failed and the next run tries again; so does everything the invocation's
 * time does not reach (counted `deferred`). A failure of one batch or record is reported and the others
 * go on.
 */
export async function stopMany(
  ctx: ServeContext,
  records: readonly BackingRecord[],
  report: MutableReport,
): Promise<void> {
  const byProvider = new Map<BackingProvider, BackingRecord[]>();
  const withoutResource: BackingRecord[] = [];
  for (const b of records) {
    if (!b.resourceId) {
      withoutResource.push(b);
      continue;
    }
    try {
      const provider = providerFor(ctx, b);
      byProvider.set(provider, [...(byProvider.get(provider) ?? []), b]);
    } catch (err) {
      report.errors.push(`stop ${b.id}: ${(err as Error).message}`);
    }
  }
  const finish = async (b: BackingRecord): Promise<boolean> => {
    if (timeLeft(ctx) <= 0) {
      report.deferred++; // the rest is the next run's
      return false;
    }
    try {
      await markGoneStopped(ctx, b, report);
    } catch (err) {
      report.errors.push(`stop ${b.id}: ${(err as Error).message}`);
      ctx.log.error('reaper: stop failed; retried next run', { backingNodeId: b.id, error: err as Error });
    }
    return true;
  };
  // Each record's end is a few conditional writes of its own items (and of its backing pool's set,
  // which concurrent releases of other members do not fail): several records in flight (bounded.ts).
  let outOfTime = false;
  const finishAll = (records: readonly BackingRecord[]) =>
    forEachBounded(records, WRITES_IN_FLIGHT, async (b) => {
      if (await finish(b)) return true;
      outOfTime = true;
      return false;
    });
  await finishAll(withoutResource);
  if (outOfTime) return;
  for (const [provider, batch] of byProvider) {
    if (timeLeft(ctx) <= 0) {
      report.deferred++;
      return;
    }
    let looks: Map<string, Look>;
    try {
      await terminateAll(
        ctx,
        provider,
        batch.map((b) => b.resourceId as string),
      );
      looks = await lookUpMany(ctx, provider, batch);
    } catch (err) {
      if (err instanceof DeadlineError) {
        report.deferred++;
        return;
      }
      report.errors.push(`stop ${batch.map((b) => b.id).join(', ')}: ${(err as Error).message}`);
      ctx.log.error('reaper: terminate failed; retried next run', {
        backingNodeIds: batch.map((b) => b.id),
        error: err as Error,
      });
      continue;
    }
    const confirmed: BackingRecord[] = [];
    for (const b of batch) {
      const after = looks.get(b.id);
      if (!after || (!after.gone && after.unseen)) {
        // A young instance EC2 does not show yet: its terminate may have missed it. The next run again.
        ctx.log.warn('backing resource not confirmed gone; terminated again next run', {
          backingNodeId: b.id,
          resourceId: b.resourceId,
          why: after?.why,
        });
        continue;
      }
      if (!after.gone) {
        report.errors.push(`stop ${b.id}: resource ${b.resourceId} ${after.why} after terminate`);
        continue;
      }
      confirmed.push(b);
    }
    await finishAll(confirmed);
    if (outOfTime) return;
  }
}

/**
 * Records a retiring or failed backing node whose resource is gone as stopped, and frees its place in
 * the backing pool.
 */
async function markGoneStopped(ctx: ServeContext, b: BackingRecord, report: MutableReport): Promise<void> {
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
