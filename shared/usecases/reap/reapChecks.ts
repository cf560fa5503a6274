/**
 * What one reaper run (reap.ts) does to a single backing node: mark an idle one retiring when its rules
 * say so, enforce a launching one's deadlines, give back claims no node confirmed; and the batched look-up
 * of failed ones' resources.
 */
import { confirmClaims, markRetiring } from '../../core/backing.ts';
import { DeadlineError, LaunchAttemptError, RetryableError } from '../../core/errors.ts';
import { parseNodeId } from '../../core/ids.ts';
import { claimDue, deadlineDecision, reapDecision } from '../../core/lifecycle.ts';
import type { BackingProvider } from '../../core/provider.ts';
import type { BackingRecord } from '../../core/records.ts';
import { holdsSlot } from '../../core/request.ts';
import { CLAIM_TAKEOVER_MS } from '../../core/timing.ts';
import { retryOnConflict, unlessConflict } from '../conflicts.ts';
import { leaseExpired, type ServeContext } from '../context.ts';
import { ensureLaunched, giveBackSlot } from '../place/backingNodes.ts';
import { failBackingNode } from '../release/failure.ts';
import type { MutableReport } from './reapReport.ts';
import { lookUpMany, providerFor } from './resourceLook.ts';

/**
 * What lookUp finds of each failed backing node's resource, a batch per provider (by backing node id).
 * One whose provider cannot be had or failed to answer has none (its settle reports it); running out of
 * the invocation's time ends the step.
 */
export async function lookUpAll(
  ctx: ServeContext,
  records: readonly BackingRecord[],
): Promise<Map<string, { gone: boolean }>> {
  const byProvider = new Map<BackingProvider, BackingRecord[]>();
  for (const b of records) {
    if (!b.resourceId) continue;
    try {
      const provider = providerFor(ctx, b);
      byProvider.set(provider, [...(byProvider.get(provider) ?? []), b]);
    } catch {
      // No provider for its pool: left without a look, reported by its settle.
    }
  }
  const looks = new Map<string, { gone: boolean }>();
  for (const [provider, batch] of byProvider) {
    try {
      for (const [id, look] of await lookUpMany(ctx, provider, batch)) looks.set(id, look);
    } catch (err) {
      if (err instanceof DeadlineError) throw err;
      ctx.log.warn('reaper: could not look up failed backing nodes', { error: (err as Error).message });
    }
  }
  return looks;
}

/** Marks an idle backing node retiring if its rules say it is due (two-phase: stopMany terminates it). */
export async function markRetiringIfDue(
  ctx: ServeContext,
  b: BackingRecord,
  report: MutableReport,
): Promise<BackingRecord | undefined> {
  const label = ctx.config.metastaticPools.find((p) => p.key === b.poolKey)?.labels.get(b.label);
  const decision = reapDecision(b, label, ctx.clock.now());
  if (!decision.retire) {
    if (decision.recheckAt !== undefined) {
      report.nextCheckAt = Math.min(report.nextCheckAt ?? Number.POSITIVE_INFINITY, decision.recheckAt);
    }
    return undefined;
  }
  const next = markRetiring(b, ctx.clock.now(), decision.reason);
  const retired = await unlessConflict(() =>
    ctx.store.putBacking(next, {
      version: b.version,
      states: ['launching', 'ready'],
      used: 0,
    }),
  );
  if (!retired) {
    report.conflicts++; // an allocation won: the backing node stays
    return undefined;
  }
  report.retired.push(b.id);
  ctx.log.info('backing node retiring', { backingNodeId: b.id, reason: decision.reason });
  return next;
}

/** How long after a backing node became ready the reaper checks it for nodes left pending. */
export const READYING_WINDOW_MS = 3 * CLAIM_TAKEOVER_MS;

/** A launch recorded but never handed to the provider (deferred, or cut short by a crash) is finished here. */
export const UNFINISHED_LAUNCH_MS = 60_000;

/** Enforces a launching backing node's deadlines; whether it failed it (its slots changed). */
export async function enforceDeadlines(
  ctx: ServeContext,
  b: BackingRecord,
  report: MutableReport,
): Promise<boolean> {
  if (!b.resourceId && ctx.clock.now() - b.launchedAt >= UNFINISHED_LAUNCH_MS) {
    try {
      await ensureLaunched(ctx, b);
    } catch (err) {
      if (!(err instanceof RetryableError) && !(err instanceof LaunchAttemptError)) throw err;
    }
  }
  const pool = ctx.config.metastaticPools.find((p) => p.key === b.poolKey);
  const timeouts = { launchTimeout: pool?.launchTimeout ?? 3600, bootTimeout: pool?.bootTimeout ?? 120 };
  if (!deadlineDecision(b, timeouts, ctx.clock.now()).fail) return false;
  // `b` is as the run read it at its start: the run's own check of running backing nodes (reconcile.ts
  // readyRunning) or a fulfil delivery may have made it ready since (its host keys showed in time, seen
  // late). Decided again on the record as it is now (one read, only for a backing node past a deadline).
  const current = await ctx.store.getBacking(b.id);
  const decision = current ? deadlineDecision(current, timeouts, ctx.clock.now()) : { fail: false as const };
  if (!decision.fail) return false;
  const settled = await failBackingNode(ctx, b.id, decision.reason, { resourceGone: false });
  report.failed.push(b.id);
  report.moved += settled?.rehomed ?? 0;
  return true;
}

/**
 * Gives back slots whose claim no recorded node confirmed in time (core/lifecycle.ts, claimDue: the slot
 * lease, or sooner once the delivery is known dead for a claim a redelivery would not find); confirms
 * the others. Returns whether it gave back a slot.
 */
export async function checkClaims(
  ctx: ServeContext,
  b: BackingRecord,
  report: MutableReport,
): Promise<boolean> {
  const now = ctx.clock.now();
  const expired = Object.entries(b.claims ?? {}).filter(([slot, claim]) => {
    const nodeId = b.slotMap[slot];
    return nodeId === undefined
      ? leaseExpired(claim.at, now)
      : claimDue(b, nodeId, claim, now, ctx.deliveriesDeadBefore);
  });
  if (expired.length === 0) return false;
  const confirmed: number[] = [];
  let gaveBack = false;
  for (const [slotText, claim] of expired) {
    const slot = Number(slotText);
    const nodeId = b.slotMap[slotText];
    if (nodeId === undefined) {
      confirmed.push(slot); // a stale claim entry with no holder
      continue;
    }
    const parsed = parseNodeId(nodeId);
    const n = parsed ? (await ctx.store.getRequest(parsed.requestId))?.nodes[parsed.index] : undefined;
    if (holdsSlot(n, b.id, slot)) {
      confirmed.push(slot);
    } else if (await giveBackSlot(ctx, b.id, nodeId, { owner: claim.by, claimedAt: claim.at })) {
      report.reclaimedSlots++;
      gaveBack = true;
      ctx.log.warn('slot given back: its claim was never recorded', { backingNodeId: b.id, slot, nodeId });
    }
  }
  if (confirmed.length === 0) return gaveBack;
  await retryOnConflict(
    `confirming claims on ${b.id}`,
    async () => {
      const current = await ctx.store.getBacking(b.id);
      if (current)
        await ctx.store.putBacking(confirmClaims(current, confirmed), { version: current.version });
    },
    () => undefined,
  );
  return gaveBack;
}
