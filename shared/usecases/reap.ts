import { confirmClaims, markDrained, markRetiring, markStopped } from '../core/backing.ts';
import { ConflictError, DeadlineError, LaunchAttemptError, RetryableError } from '../core/errors.ts';
import { ownerSince, parseNodeId } from '../core/ids.ts';
import { MetricName, PoolEventType } from '../core/observability.ts';
import type { BackingProvider, BackingResource } from '../core/provider.ts';
import {
  claimDue,
  deadlineDecision,
  needsMaxAgeDrain,
  notFoundIsFinal,
  reapDecision,
} from '../core/reaper.ts';
import type { BackingRecord } from '../core/records.ts';
import { keys, reapPartition } from '../store/table.ts';
import {
  type Context,
  emit,
  leaseExpired,
  MAX_CONFLICT_RETRIES,
  ORPHAN_GRACE_MS,
  timeLeft,
} from './context.ts';
import { failBackingNode, settleFailedNodes } from './failure.ts';
import { resourceRunning } from './fulfil.ts';
import { ensureLaunched, giveBackSlot } from './placement.ts';
import { endExpiredRequests } from './waiting.ts';

export interface ReapReport {
  /** Backing nodes marked retiring this run. */
  readonly retired: string[];
  /** Backing nodes whose resource is confirmed gone this run. */
  readonly stopped: string[];
  /** Backing nodes failed this run (deadline passed, resource vanished), with the reason. */
  readonly failed: string[];
  /** Nodes moved off failed backing nodes this run. */
  readonly moved: number;
  /** Resources tagged as ours with no live record, terminated this run. */
  readonly orphans: string[];
  /** Slots given back because no recorded node confirmed their claim within the lease. */
  readonly reclaimedSlots: number;
  /**
   * Places in a max-servers set given back because nothing live holds them: reserved by a delivery that
   * died before it recorded what it reserved them for.
   */
  readonly reclaimedPlaces: number;
  /**
   * Requests ended `failed` this run because they were still waiting past their request-timeout (their
   * message may be gone: see waiting.ts).
   */
  readonly expiredRequests: string[];
  /** Retirements lost to a concurrent change (an allocation won): the backing node stays. */
  readonly conflicts: number;
  readonly errors: string[];
  /**
   * Steps left for the next run because the invocation's time ran short (Context.deadline): not started,
   * or a check cut short. Not errors: the next run does them.
   */
  readonly deferred: number;
  /** The earliest instant an idle backing node seen this run becomes due (schedule the next run by it). */
  readonly nextCheckAt?: number;
}

type MutableReport = { -readonly [K in keyof ReapReport]: ReapReport[K] };

/**
 * One reaper run. Everything it looks at comes from Queries on the reap index (every backing node
 * that is not stopped sits in exactly one partition) and from the providers' own lists of tagged
 * resources, which are the truth about what runs:
 * 1. reconciliation both ways, first (a vanished resource must not be retired as if idle): a record
 *    whose resource is gone fails; a tagged resource with no live record is terminated; a launching
 *    record whose resource runs is made ready (a lost event);
 * 2. empty backing nodes are retired by the rules of core/reaper.ts, two-phase: a conditional write
 *    (still empty, unchanged since read) marks it retiring so no allocation can land on it, then the
 *    resource is terminated and, once the provider confirms it gone, the record is marked stopped;
 * 3. launching backing nodes past launch-timeout / boot-timeout fail and their nodes move elsewhere;
 * 4. ready backing nodes past max-age are drained (no new nodes; they go when empty);
 * 5. claims no recorded node confirmed within the slot lease are given back;
 * 6. failed and retiring backing nodes are settled and terminated until the provider confirms;
 * 7. places in max-servers sets held by no live backing node or node past the slot lease are given back;
 * 8. requests still waiting past their request-timeout end `failed` (WAITING partition, waiting.ts).
 * A crash anywhere leaves records in partitions the next run picks up.
 */
export async function reap(ctx: Context): Promise<ReapReport> {
  const report: MutableReport = {
    retired: [],
    stopped: [],
    failed: [],
    moved: 0,
    orphans: [],
    reclaimedSlots: 0,
    reclaimedPlaces: 0,
    expiredRequests: [],
    conflicts: 0,
    errors: [],
    deferred: 0,
  };
  const guard = async (what: string, id: string, work: () => Promise<void>) => {
    if (timeLeft(ctx) <= 0) {
      report.deferred++;
      return;
    }
    try {
      await work();
    } catch (err) {
      if (err instanceof DeadlineError) {
        report.deferred++;
        return;
      }
      report.errors.push(`${what} ${id}: ${(err as Error).message}`);
      ctx.log.error(`reaper: ${what} failed; retried next run`, { backingNodeId: id, error: err as Error });
    }
  };

  const idle = await ctx.store.queryReap(reapPartition.idle);
  const launching = await ctx.store.queryReap(reapPartition.launching);
  const active = await ctx.store.queryReap(reapPartition.active);

  // 1. Reconciliation first: a vanished resource must not be retired as if it were idle.
  const gone = new Set<string>();
  await guard('reconcile', '-', () => reconcile(ctx, [...idle, ...launching, ...active], report, gone));

  for (const b of idle) {
    if (gone.has(b.id)) continue;
    await guard('retire', b.id, () => retireIfDue(ctx, b, report));
  }
  for (const b of [...launching, ...idle.filter((x) => x.state === 'launching')]) {
    if (gone.has(b.id) || report.retired.includes(b.id)) continue;
    await guard('deadline', b.id, () => enforceDeadlines(ctx, b, report));
  }
  for (const b of active) {
    if (gone.has(b.id) || !needsMaxAgeDrain(b, ctx.clock.now())) continue;
    await guard('drain', b.id, async () => {
      await ctx.store.putBacking(markDrained(b, 'max-age reached'), { version: b.version }).catch((err) => {
        if (!(err instanceof ConflictError)) throw err;
      });
    });
  }
  for (const b of [...launching, ...active]) {
    if (gone.has(b.id)) continue;
    await guard('lease', b.id, () => checkClaims(ctx, b, report));
  }

  // 6. Failed and retiring backing nodes: settle their nodes, then terminate until confirmed gone.
  for (const b of await ctx.store.queryReap(reapPartition.failed)) {
    await guard('settle', b.id, async () => {
      const resourceGone = b.resourceId ? (await lookUp(ctx, providerFor(ctx, b), b)).gone : true;
      const settled = await settleFailedNodes(ctx, b, resourceGone);
      report.moved += settled.rehomed;
      const current = await ctx.store.getBacking(b.id);
      if (current && current.used === 0) await stop(ctx, current, report);
    });
  }
  const retiring = await ctx.store.queryReap(reapPartition.retiring);
  for (const b of retiring) {
    await guard('stop', b.id, () => stop(ctx, b, report));
  }
  // 7. Places in max-servers sets that nothing live holds (their delivery died) are given back.
  await guard('capacity', '-', async () => {
    const failed = await ctx.store.queryReap(reapPartition.failed);
    await reconcileCapacity(ctx, [...idle, ...launching, ...active, ...failed, ...retiring], report);
  });
  // 8. Requests still waiting past their request-timeout end, whatever became of their message.
  await guard('request-timeout', '-', async () => {
    const ended = await endExpiredRequests(ctx);
    report.expiredRequests.push(...ended.expired);
    if (!ended.complete) report.deferred++;
  });
  // Gauges, from what this run read.
  ctx.metrics?.count(
    MetricName.slotsInUse,
    [...launching, ...active].reduce((n, b) => n + b.used, 0),
  );
  ctx.metrics?.count(MetricName.idleBackingNodes, idle.length);
  return report;
}

async function retireIfDue(ctx: Context, b: BackingRecord, report: MutableReport): Promise<void> {
  const label = ctx.config.metastaticPools.find((p) => p.key === b.poolKey)?.labels.get(b.label);
  const decision = reapDecision(b, label, ctx.clock.now());
  if (!decision.retire) {
    if (decision.recheckAt !== undefined) {
      report.nextCheckAt = Math.min(report.nextCheckAt ?? Number.POSITIVE_INFINITY, decision.recheckAt);
    }
    return;
  }
  try {
    await ctx.store.putBacking(markRetiring(b, ctx.clock.now(), decision.reason), {
      version: b.version,
      states: ['launching', 'ready'],
      used: 0,
    });
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    report.conflicts++;
    return;
  }
  report.retired.push(b.id);
  ctx.log.info('backing node retiring', { backingNodeId: b.id, reason: decision.reason });
  await stop(ctx, { ...markRetiring(b, ctx.clock.now(), decision.reason) }, report);
}

/** A launch recorded but never handed to the provider (deferred, or cut short by a crash) is finished here. */
const UNFINISHED_LAUNCH_MS = 60_000;

async function enforceDeadlines(ctx: Context, b: BackingRecord, report: MutableReport): Promise<void> {
  if (!b.resourceId && ctx.clock.now() - b.launchedAt >= UNFINISHED_LAUNCH_MS) {
    try {
      await ensureLaunched(ctx, b);
    } catch (err) {
      if (!(err instanceof RetryableError) && !(err instanceof LaunchAttemptError)) throw err;
    }
  }
  const pool = ctx.config.metastaticPools.find((p) => p.key === b.poolKey);
  const decision = deadlineDecision(
    b,
    { launchTimeout: pool?.launchTimeout ?? 3600, bootTimeout: pool?.bootTimeout ?? 120 },
    ctx.clock.now(),
  );
  if (!decision.fail) return;
  const settled = await failBackingNode(ctx, b.id, decision.reason, { resourceGone: false });
  report.failed.push(b.id);
  report.moved += settled?.rehomed ?? 0;
}

/**
 * Gives back slots whose claim no recorded node confirmed in time (core/reaper.ts, claimDue: the slot
 * lease, or sooner once the delivery is known dead for a claim a redelivery would not find); confirms
 * the others.
 */
async function checkClaims(ctx: Context, b: BackingRecord, report: MutableReport): Promise<void> {
  const now = ctx.clock.now();
  const expired = Object.entries(b.claims ?? {}).filter(([slot, claim]) => {
    const nodeId = b.slotMap[slot];
    return nodeId === undefined
      ? leaseExpired(claim.at, now)
      : claimDue(b, nodeId, claim, now, ctx.deliveriesDeadBefore);
  });
  if (expired.length === 0) return;
  const confirmed: number[] = [];
  for (const [slotText, claim] of expired) {
    const slot = Number(slotText);
    const nodeId = b.slotMap[slotText];
    if (nodeId === undefined) {
      confirmed.push(slot); // a stale claim entry with no holder
      continue;
    }
    const parsed = parseNodeId(nodeId);
    const n = parsed ? (await ctx.store.getRequest(parsed.requestId))?.nodes[parsed.index] : undefined;
    const recordedHere =
      n !== undefined &&
      n.backingNodeId === b.id &&
      n.slot === slot &&
      (n.state === 'pending' || n.state === 'ready');
    if (recordedHere) {
      confirmed.push(slot);
    } else if (await giveBackSlot(ctx, b.id, nodeId, { owner: claim.by, claimedAt: claim.at })) {
      report.reclaimedSlots++;
      ctx.log.warn('slot given back: its claim was never recorded', { backingNodeId: b.id, slot, nodeId });
    }
  }
  if (confirmed.length === 0) return;
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const current = await ctx.store.getBacking(b.id);
    if (!current) return;
    try {
      await ctx.store.putBacking(confirmClaims(current, confirmed), { version: current.version });
      return;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
}

/**
 * Gives back the places in max-servers sets that nothing live holds: a delivery reserves a place
 * before it records what for (a backing node, a placed node), so one that dies in between leaves its
 * place taken. Only places older than the slot lease are looked at, and each is confirmed against its
 * record before it is given back, conditionally on the owner that took it (a delivery that took it
 * over since keeps it).
 */
async function reconcileCapacity(
  ctx: Context,
  live: readonly BackingRecord[],
  report: MutableReport,
): Promise<void> {
  const now = ctx.clock.now();
  const deadBefore = ctx.deliveriesDeadBefore;
  const abandoned = (owner: string) =>
    leaseExpired(ownerSince(owner), now) || (deadBefore !== undefined && ownerSince(owner) < deadBefore);
  const liveBacking = new Set(live.map((b) => b.id));
  for (const pool of ctx.config.backingPools) {
    if (pool.maxServers === undefined) continue;
    const key = keys.backingPool(pool.key);
    for (const [id, owner] of await ctx.store.reservations(key)) {
      if (liveBacking.has(id) || !abandoned(owner)) continue;
      const record = await ctx.store.getBacking(id);
      if (record && record.state !== 'stopped') continue; // created since the reap index was read
      await ctx.store.unreserve(key, [id], owner);
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
    const key = keys.poolNodes(pool.key);
    for (const [nodeId, owner] of await ctx.store.reservations(key)) {
      if (onSlots.has(nodeId) || !abandoned(owner)) continue;
      const parsed = parseNodeId(nodeId);
      const r = parsed ? await ctx.store.getRequest(parsed.requestId) : undefined;
      const n = parsed ? r?.nodes[parsed.index] : undefined;
      if (r?.poolKey === pool.key && (n?.state === 'pending' || n?.state === 'ready')) continue;
      await ctx.store.unreserve(key, [nodeId], owner);
      report.reclaimedPlaces++;
      ctx.log.warn('place in a pool given back: no live node holds it', { pool: pool.key, nodeId });
    }
  }
}

/** Compares the table with every provider's list of tagged resources, both ways. */
async function reconcile(
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

function providerFor(ctx: Context, b: BackingRecord): BackingProvider {
  return ctx.providers.forPool(b.backingPoolKey);
}

/** Gone, or no longer usable: a stopped (not terminated) machine serves nobody either. */
function isGone(r: BackingResource | undefined): boolean {
  return r === undefined || (r.state !== 'pending' && r.state !== 'running');
}

/** What a look at a backing node's resource found: gone, or why not (`unseen`: not found yet). */
type Look = { readonly gone: true } | { readonly gone: false; readonly why: string; readonly unseen?: true };

/**
 * Whether a backing node's resource is gone, as far as its provider can tell now. Described in a state
 * other than pending or running: gone. Not found: gone for a provider whose "not found" is final; for an
 * eventually consistent one (EC2) only once the id has been recorded for RESOURCE_NOT_FOUND_GRACE_MS and
 * a second describe does not find it either. Before that it is `unseen`: a new instance EC2 does not show
 * yet, which must not be failed (nor its terminate taken as done).
 */
async function lookUp(ctx: Context, provider: BackingProvider, b: BackingRecord): Promise<Look> {
  const id = b.resourceId as string;
  const seen = (r: BackingResource | undefined): Look | undefined => {
    if (r === undefined) return undefined;
    return isGone(r) ? { gone: true } : { gone: false, why: `is still ${r.state}` };
  };
  const first = seen(await provider.describe(id));
  if (first) return first;
  if (!provider.eventuallyConsistent) return { gone: true };
  const now = ctx.clock.now();
  if (!notFoundIsFinal(b, now)) {
    const age = Math.round((now - (b.resourceRecordedAt ?? b.launchedAt)) / 1000);
    return { gone: false, unseen: true, why: `is not found yet (recorded ${age}s ago)` };
  }
  return seen(await provider.describe(id)) ?? { gone: true }; // one stale answer is not the last word
}

/**
 * Terminates the resource and, once the provider confirms it gone, records the backing node stopped
 * and frees its place in the backing pool. Until confirmed, it stays retiring/failed and the next run
 * tries again.
 */
async function stop(ctx: Context, b: BackingRecord, report: MutableReport): Promise<void> {
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
  await ctx.store.unreserve(keys.backingPool(b.backingPoolKey), [b.id]);
  if (b.resourceId) await ctx.store.forgetResource(b.resourceId, b.id);
  try {
    await ctx.store.putBacking(markStopped(current, ctx.clock.now()), {
      version: current.version,
      states: [current.state],
    });
  } catch (err) {
    if (err instanceof ConflictError) return;
    throw err;
  }
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
