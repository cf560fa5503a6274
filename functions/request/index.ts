import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';

/** The request function: SQS batches of request / release messages (ReportBatchItemFailures). */
let handle: ((event: SQSEvent) => Promise<SQSBatchResponse>) | undefined;

export const handler = async (event: SQSEvent): Promise<SQSBatchResponse> => {
  if (!handle) {
    const { context, env } = lambdaRuntimeFromEnv();
    handle = makeRequestHandler(context, { maxReceiveCount: env.MAX_RECEIVE_COUNT });
  }
  return handle(event);
};
