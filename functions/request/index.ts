import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';

/** The request function: SQS batches of request / release messages (ReportBatchItemFailures). */
let runtime: { rt: LambdaRuntime; handle: (event: SQSEvent) => Promise<SQSBatchResponse> } | undefined;

export const handler = async (event: SQSEvent): Promise<SQSBatchResponse> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = { rt, handle: makeRequestHandler(rt.context, { maxReceiveCount: rt.env.MAX_RECEIVE_COUNT }) };
  }
  try {
    return await runtime.handle(event);
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
};
