import { CapacityError } from '../../core/errors.ts';
import type { RequestMessage } from '../../core/messages.ts';
import { requestTimeoutOf } from '../../core/pools.ts';
import { requestBodyHash } from '../../core/request.ts';
import { waitingVisibilitySeconds } from '../../core/timing.ts';
import type { ServeContext } from '../context.ts';
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

/** Whether a request waiting since `waiting.createdAt` has waited its budget (or its shorter request-timeout). */
export function budgetPassed(
  ctx: ServeContext,
  waiting: { readonly createdAt: number; readonly labels: readonly string[] },
  budget: WaitingBudget,
): boolean {
  const ownSeconds = Math.min(budget.seconds, requestTimeoutOf(ctx.config, waiting.labels));
  return ctx.clock.now() - waiting.createdAt >= ownSeconds * 1000;
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
  ctx: ServeContext,
  m: RequestMessage,
  waiting: { readonly createdAt: number; readonly labels: readonly string[] },
  budget: WaitingBudget,
  why: string,
): Promise<AfterWait> {
  const waitedMs = ctx.clock.now() - waiting.createdAt;
  const timeoutSeconds = requestTimeoutOf(ctx.config, waiting.labels);
  const ownSeconds = Math.min(budget.seconds, timeoutSeconds);
  if (budgetPassed(ctx, waiting, budget)) {
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

/** What a receive that could not place a request saw (LastAttempts). */
interface Attempt {
  readonly bodyHash: string;
  /** The room signal's count read before the attempt began. */
  readonly generation: number;
  readonly at: number;
  readonly error: CapacityError;
}

/**
 * The last placement attempt of each waiting request in this process, so that a receive can skip a
 * full attempt that could only fail the same way: nothing freed since the last one began (the count of
 * room-freeing writes, `generation`, unchanged: runtime/roomSignal.ts) and it is less than
 * `maxAgeMs` old (a full attempt at least that often, whatever the count says). Only sound where every
 * writer counts (the embedded pool, one process); a skipped receive writes nothing, so a wrong skip can
 * only delay a request, never break an invariant. Bounded: the oldest entries go first.
 */
export class LastAttempts {
  private readonly attempts = new Map<string, Attempt>();

  constructor(
    private readonly generation: () => number,
    private readonly maxAgeMs: number,
    private readonly maxEntries = 10_000,
  ) {}

  /**
   * The error of the last attempt if it still holds (nothing freed since, recent enough), or if the
   * request has waited its budget anyway (`due`: it ends now, without one more attempt); else undefined.
   */
  unchanged(
    ctx: ServeContext,
    m: RequestMessage,
    due?: (waiting: NonNullable<CapacityError['waiting']>) => boolean,
  ): CapacityError | undefined {
    const last = this.attempts.get(m.id);
    if (!last || last.bodyHash !== requestBodyHash(m)) return undefined;
    if (last.error.waiting && due?.(last.error.waiting)) return last.error;
    if (last.generation !== this.generation() || ctx.clock.now() - last.at >= this.maxAgeMs) return undefined;
    return last.error;
  }

  /** Runs a full attempt, remembering it when it ends waiting for capacity (forgetting it otherwise). */
  async attempt<T>(ctx: ServeContext, m: RequestMessage, run: () => Promise<T>): Promise<T> {
    const generation = this.generation();
    const at = ctx.clock.now();
    this.attempts.delete(m.id);
    try {
      return await run();
    } catch (err) {
      if (err instanceof CapacityError && err.waiting) {
        this.attempts.set(m.id, { bodyHash: requestBodyHash(m), generation, at, error: err });
        if (this.attempts.size > this.maxEntries) {
          const oldest = this.attempts.keys().next().value;
          if (oldest !== undefined) this.attempts.delete(oldest);
        }
      }
      throw err;
    }
  }
}
