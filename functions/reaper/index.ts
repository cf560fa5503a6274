import type { Context as LambdaContext } from 'aws-lambda';
import { makeReaperHandler } from '../../shared/handlers/reaperHandler.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';
import type { ReapReport } from '../../shared/usecases/reap/reapReport.ts';

/** The reaper function, invoked by an EventBridge schedule. */
let runtime: { rt: LambdaRuntime; handle: ReturnType<typeof makeReaperHandler> } | undefined;

/**
 * `context` gives the invocation's remaining time: the run leaves what does not fit to the next one
 * (Lambda always passes it; a caller outside Lambda without one gets the function's timeout).
 */
export const handler = async (_event?: unknown, context?: LambdaContext): Promise<ReapReport> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = { rt, handle: makeReaperHandler(rt.context) };
  }
  let report: ReapReport;
  try {
    report = await runtime.handle(context);
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
  // Each step's failure is kept in the report so the others still run; the invocation fails after,
  // so the Errors metric (and its alarm) sees it. A retry is harmless: every step is idempotent.
  if (report.errors.length > 0)
    throw new Error(`reaper run had ${report.errors.length} error(s): ${report.errors.join('; ')}`);
  return report;
};
