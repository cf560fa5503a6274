import type { RequestMessage } from '../core/messages.ts';
import { requestTimeoutOf } from '../core/pools.ts';
import { waitingVisibilitySeconds } from '../core/timing.ts';
import type { Context } from './context.ts';
import { endRequestOf } from './requests.ts';
import { requestTimeoutReason } from './waiting.ts';

/**
 * The waiting budget of a request function (core/timing.ts WAITING_BUDGET_SECONDS): how long a request
 * may wait for capacity, and the request queue's visibility timeout (how soon a message comes back when
 * nothing changes it).
 */
export interface WaitingBudget {
  readonly seconds: number;
  readonly visibilitySeconds: number;
}

/** Why a request ends when its waiting budget passed. */
export function waitingBudgetReason(budgetSeconds: number, waitedMs: number, why: string): string {
  return `waiting budget of ${budgetSeconds}s passed: still no capacity ${Math.floor(waitedMs / 1000)}s after it was recorded: ${why}`;
}

/** What becomes of a request a receive could not place. */
export type AfterWait =
  /** Its budget passed: it was ended (or was placed or ended meanwhile), its message is consumed. */
  | { readonly kind: 'ended'; readonly reason: string }
  /** It waits on: its message comes back after `visibilitySeconds` (the queue's own timeout when equal). */
  | { readonly kind: 'waits'; readonly visibilitySeconds: number };

/**
 * After a receive found no room for request `m`, waiting since `since` (its stored `createdAt`): ends it
 * once it has waited its budget, or its request-timeout if that is shorter (the reason the reaper would
 * give), else says when its message should come back (waitingVisibilitySeconds: longer as it waits, so a
 * backlog of waiting requests costs the pool few receives, and never after the budget ends). Idempotent:
 * the end is failRequest's one version-checked write from `requested`, so a delivery placing it at the
 * same moment, or a second delivery ending it, is safe.
 */
export async function afterCapacityWait(
  ctx: Context,
  m: RequestMessage,
  waiting: { readonly createdAt: number; readonly labels: readonly string[] },
  budget: WaitingBudget,
  why: string,
): Promise<AfterWait> {
  const waitedMs = ctx.clock.now() - waiting.createdAt;
  const timeoutSeconds = requestTimeoutOf(ctx.config, waiting.labels);
  const ownSeconds = Math.min(budget.seconds, timeoutSeconds);
  if (waitedMs >= ownSeconds * 1000) {
    const reason =
      timeoutSeconds < budget.seconds
        ? requestTimeoutReason(timeoutSeconds, waitedMs)
        : waitingBudgetReason(budget.seconds, waitedMs, why);
    await endRequestOf(ctx, m, reason);
    return { kind: 'ended', reason };
  }
  return {
    kind: 'waits',
    visibilitySeconds: waitingVisibilitySeconds({
      waitedMs,
      budgetMs: ownSeconds * 1000,
      baseSeconds: budget.visibilitySeconds,
    }),
  };
}
