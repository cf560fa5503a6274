import { pendingTimeoutOf, pendingTimeoutReason, shortestPendingTimeout } from '../../core/pools.ts';
import { PENDING_GRACE_MS } from '../../core/timing.ts';
import { type ServeContext, timeLeft } from '../context.ts';
import { failNodes } from './requests.ts';

/**
 * Requests placed and not yet fulfilled (state `pending`): their nodes wait for backing nodes to become
 * ready. Launch-timeout and boot-timeout bound each attempt, and launch-retries the attempts, so a
 * request pending past all of them (pendingTimeoutOf, plus PENDING_GRACE_MS) is stuck: a readying that
 * never happened (cut short, or a record an older version left so). request-timeout covers only requests
 * still waiting to be placed; this is the same guarantee for placed ones. They sit in the PENDING
 * partition of the reap index by placement time (docs/table.md): the reaper reads only those old enough
 * to be due, never a Scan.
 */

export interface PendingReport {
  /** Requests ended `failed` because they stayed pending past their deadline. */
  readonly expired: string[];
  /** False when the invocation's time ran out before every due request was looked at. */
  readonly complete: boolean;
}

/**
 * Ends, as failed with the reason, every request still pending past its deadline (a reaper step), giving
 * back its slots and places. Safe against its nodes becoming ready at the same time: failNodes re-reads
 * and writes from what it read (version-checked), and fails the whole request only while it is pending
 * (a request fulfilled meanwhile keeps every node: `which` picks none).
 */
export async function endOverduePending(ctx: ServeContext): Promise<PendingReport> {
  const expired: string[] = [];
  const now = ctx.clock.now();
  // Placed at or before this instant: old enough for the shortest budget.
  const due = now - (shortestPendingTimeout(ctx.config) * 1000 + PENDING_GRACE_MS) + 1;
  let cursor: Record<string, unknown> | undefined;
  do {
    if (timeLeft(ctx) <= 0) return { expired, complete: false };
    const page = await ctx.store.pendingRequests(due, cursor);
    for (const r of page.items) {
      if (timeLeft(ctx) <= 0) return { expired, complete: false };
      const pendingMs = now - (r.placedAt ?? r.updatedAt);
      if (pendingMs < pendingTimeoutOf(ctx.config, r.poolKey) * 1000 + PENDING_GRACE_MS) continue;
      const reason = pendingTimeoutReason(ctx.config, r.poolKey, pendingMs, PENDING_GRACE_MS);
      await failNodes(ctx, r.id, reason, () => false);
      const after = await ctx.store.getRequest(r.id);
      if (after?.state === 'failed' && after.reason === reason) expired.push(r.id);
    }
    cursor = page.cursor;
  } while (cursor);
  return { expired, complete: true };
}
