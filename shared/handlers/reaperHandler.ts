import { deadlineOf, FUNCTION_TIMEOUT_SECONDS, type InvocationTime, invocationFor } from '../core/timing.ts';
import type { Context } from '../usecases/context.ts';
import { reap } from '../usecases/reap/reap.ts';
import type { ReapReport } from '../usecases/reap/reapReport.ts';

/**
 * The reaper function, run on a schedule (EventBridge on AWS, a timer in the embedded pool). `invocation`
 * is Lambda's context: the run ends its work before the function would be killed and leaves the rest to
 * the next run (`deferred`). The embedded pool passes none: the run gets the reaper function's timeout.
 */
export function makeReaperHandler(context: Context): (invocation?: InvocationTime) => Promise<ReapReport> {
  return async (invocation) => {
    const budget = invocation ?? invocationFor(context.clock, FUNCTION_TIMEOUT_SECONDS.reaper * 1000);
    const ctx: Context = { ...context, deadline: deadlineOf(budget) };
    const report = await reap(ctx);
    const { nextCheckAt: _next, conflicts: _c, stepMs: _ms, ...counts } = report;
    if (Object.values(counts).some((v) => (Array.isArray(v) ? v.length > 0 : v > 0))) {
      ctx.log.info('reaper run', { ...report });
    }
    return report;
  };
}
