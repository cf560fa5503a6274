import type { Context as LambdaContext, SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { makeFulfilHandler } from '../../shared/handlers/fulfilHandler.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';

/** The fulfil function: EC2 state-change and spot interruption events, from EventBridge through SQS. */
let runtime: { rt: LambdaRuntime; handle: ReturnType<typeof makeFulfilHandler> } | undefined;

/**
 * `context` gives the invocation's remaining time, from which every deadline of the batch is derived
 * (Lambda always passes it; a caller outside Lambda without one gets DELIVERY_DEADLINE_MS).
 */
export const handler = async (event: SQSEvent, context?: LambdaContext): Promise<SQSBatchResponse> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = { rt, handle: makeFulfilHandler(rt.context) };
  }
  try {
    return await runtime.handle(event, context);
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
};
