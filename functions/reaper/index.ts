import { makeReaperHandler } from '../../shared/handlers/reaperHandler.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';
import type { ReapReport } from '../../shared/usecases/reap.ts';

/** The reaper function, invoked by an EventBridge schedule. */
let runtime: { rt: LambdaRuntime; handle: () => Promise<ReapReport> } | undefined;

export const handler = async (): Promise<ReapReport> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = { rt, handle: makeReaperHandler(rt.context) };
  }
  try {
    return await runtime.handle();
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
};
