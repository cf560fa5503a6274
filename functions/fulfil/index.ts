import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { makeFulfilHandler } from '../../shared/handlers/fulfilHandler.ts';
import { lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';

/** The fulfil function: EC2 state-change events delivered by EventBridge through SQS. */
let handle: ((event: SQSEvent) => Promise<SQSBatchResponse>) | undefined;

export const handler = async (event: SQSEvent): Promise<SQSBatchResponse> => {
  handle ??= makeFulfilHandler(lambdaRuntimeFromEnv().context);
  return handle(event);
};
