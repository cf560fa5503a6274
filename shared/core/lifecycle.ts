import { backingNodeId } from './ids.ts';
import type { MetastaticLabel } from './model.ts';
import type { BackingRecord, Claim } from './records.ts';
import { CLAIM_TAKEOVER_MS, RESOURCE_NOT_FOUND_GRACE_MS, SLOT_LEASE_MS } from './timing.ts';

/**
 * Launch and boot deadlines of a launching backing node: launch-timeout counts from the launch,
 * boot-timeout from the moment the provider reported the machine running (its port must answer by then).
 */
export type DeadlineDecision = { readonly fail: true; readonly reason: string } | { readonly fail: false };

export function deadlineDecision(
  b: BackingRecord,
  timeouts: { readonly launchTimeout: number; readonly bootTimeout: number },
  now: number,
): DeadlineDecision {
  if (b.state !== 'launching') return { fail: false };
  if (b.runningAt !== undefined && now - b.runningAt >= timeouts.bootTimeout * 1000) {
    return {
      fail: true,
      reason: `boot-timeout of ${timeouts.bootTimeout}s exceeded: its port did not answer`,
    };
  }
  if (now - b.launchedAt >= timeouts.launchTimeout * 1000) {
    return { fail: true, reason: `launch-timeout of ${timeouts.launchTimeout}s exceeded` };
  }
  return { fail: false };
}

/** Whether a ready backing node past max-age still sits in the free index (the reaper drains it). */
export function needsMaxAgeDrain(b: BackingRecord, now: number): boolean {
  return !b.drained && b.noNewNodesAfter !== undefined && now >= b.noNewNodesAfter;
}

/**
 * The reaper's decision for one backing node, as a pure function of the record, its label's current
 * configuration (undefined when the label was removed) and the time. Nodepool's rules:
 * - never while a slot is in use;
 * - max-age passed: goes as soon as it is empty (no grace, no min-retention);
 * - label removed from the configuration: goes as soon as it is empty;
 * - otherwise: empty for grace-time since the last release, and launched at least min-retention-time ago.
 */
export type ReapDecision =
  | { readonly retire: true; readonly reason: string }
  | { readonly retire: false; readonly reason: string; readonly recheckAt?: number };

export function reapDecision(
  b: BackingRecord,
  label: MetastaticLabel | undefined,
  now: number,
): ReapDecision {
  if (b.state !== 'ready' && b.state !== 'launching') return { retire: false, reason: `state is ${b.state}` };
  if (b.used > 0) return { retire: false, reason: `${b.used} slot(s) in use` };
  if (label === undefined) return { retire: true, reason: `label ${b.label} is no longer configured` };
  if (b.noNewNodesAfter !== undefined && now >= b.noNewNodesAfter) {
    return { retire: true, reason: `max-age of ${label.maxAge}s reached and empty` };
  }
  if (b.drained) return { retire: true, reason: `drained and empty${b.reason ? ` (${b.reason})` : ''}` };
  // A launching backing node whose nodes were all released keeps its grace like any other.
  const graceEnds = b.lastUsedAt + label.graceTime * 1000;
  const retentionEnds = b.launchedAt + label.minRetentionTime * 1000;
  const at = Math.max(graceEnds, retentionEnds);
  if (now < at) {
    const why = at === graceEnds ? 'within grace-time' : 'within min-retention-time';
    return { retire: false, reason: why, recheckAt: at };
  }
  return {
    retire: true,
    reason: `empty for ${((now - b.lastUsedAt) / 1000).toFixed(1)}s (grace-time ${label.graceTime}s)`,
  };
}

/**
 * Whether an eventually consistent provider's "not found" for a backing node's resource can be believed
 * now: only once the resource id has been recorded for RESOURCE_NOT_FOUND_GRACE_MS (a new EC2 instance
 * can be unknown to DescribeInstances for a while). Records from before `resourceRecordedAt` existed
 * count from their launch.
 */
export function notFoundIsFinal(b: BackingRecord, now: number): boolean {
  return now - (b.resourceRecordedAt ?? b.launchedAt) >= RESOURCE_NOT_FOUND_GRACE_MS;
}

/**
 * Whether the reaper checks an unconfirmed claim now (and gives its slot back unless a recorded node
 * holds it). A claim is never older than its delivery, and a delivery records its nodes within
 * DELIVERY_DEADLINE_MS, so a claim is unconfirmed past CLAIM_TAKEOVER_MS only if its delivery died:
 * - a claim on the backing node launched for its node (its id derives from the node id and attempt): a
 *   redelivery finds it by that id and takes it over, so it is kept for the slot lease (SLOT_LEASE_MS,
 *   longer than the request queue's visibility timeout), lest the backing node go idle and a second
 *   one be launched;
 * - a claim on any other backing node, found on the `free` index: a redelivery cannot find it once the
 *   claim filled that backing node, and needs it no more than any free slot, so it goes as soon as its
 *   delivery is known dead (CLAIM_TAKEOVER_MS);
 * - any claim of a delivery that started before `deadBefore` (Context.deliveriesDeadBefore), at once.
 */
export function claimDue(
  b: BackingRecord,
  nodeId: string,
  claim: Claim,
  now: number,
  deadBefore?: number,
): boolean {
  if (now - claim.at >= SLOT_LEASE_MS) return true;
  if (deadBefore !== undefined && claim.at < deadBefore) return true;
  const launchedForIt = b.id === backingNodeId(b.poolKey, b.label, nodeId, b.attempt);
  return !launchedForIt && now - claim.at >= CLAIM_TAKEOVER_MS;
}
