import type { Context } from '../usecases/context.ts';
import { type ReapReport, reap } from '../usecases/reap.ts';

/** The reaper function, run on a schedule (EventBridge on AWS, a timer in the embedded stack). */
export function makeReaperHandler(ctx: Context): () => Promise<ReapReport> {
  return async () => {
    const report = await reap(ctx);
    const { nextCheckAt: _next, conflicts: _c, ...counts } = report;
    if (Object.values(counts).some((v) => (Array.isArray(v) ? v.length > 0 : v > 0))) {
      ctx.log.info('reaper run', { ...report });
    }
    return report;
  };
}
