import { makeReaperHandler } from '../../shared/handlers/reaperHandler.ts';
import { lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';
import type { ReapReport } from '../../shared/usecases/reap.ts';

/** The reaper function, invoked by an EventBridge schedule. */
let handle: (() => Promise<ReapReport>) | undefined;

export const handler = async (): Promise<ReapReport> => {
  handle ??= makeReaperHandler(lambdaRuntimeFromEnv().context);
  return handle();
};
