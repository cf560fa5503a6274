import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { makeFulfilHandler } from '../../shared/handlers/fulfilHandler.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';

/** The fulfil function: EC2 state-change and spot interruption events, from EventBridge through SQS. */
let runtime: { rt: LambdaRuntime; handle: (event: SQSEvent) => Promise<SQSBatchResponse> } | undefined;

export const handler = async (event: SQSEvent): Promise<SQSBatchResponse> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = { rt, handle: makeFulfilHandler(rt.context) };
  }
  try {
    return await runtime.handle(event);
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
};
