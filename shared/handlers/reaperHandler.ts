import type { Context } from '../usecases/context.ts';
import { type ReapReport, reap } from '../usecases/reap.ts';

/** The reaper function, run on a schedule (EventBridge on AWS, a timer in the embedded stack). */
export function makeReaperHandler(ctx: Context): () => Promise<ReapReport> {
  return async () => {
    const report = await reap(ctx);
    if (report.retired.length || report.stopped.length || report.errors.length) {
      ctx.log.info('reaper run', { ...report });
    }
    return report;
  };
}
