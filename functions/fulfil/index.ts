import type { Context as LambdaContext, SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { makeFulfilHandler } from '../../shared/handlers/fulfilHandler.ts';
import { sendBackLater } from '../../shared/runtime/fulfilRetry.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';
import { queueUrlOfArn } from '../../shared/runtime/sqsVisibility.ts';

/** The fulfil function: EC2 state-change and spot interruption events, from EventBridge through SQS. */
let runtime: { rt: LambdaRuntime; handle: ReturnType<typeof makeFulfilHandler> } | undefined;

/**
 * `context` gives the invocation's remaining time, from which every deadline of the batch is derived
 * (Lambda always passes it; a caller outside Lambda without one gets DELIVERY_DEADLINE_MS).
 */
export const handler = async (event: SQSEvent, context?: LambdaContext): Promise<SQSBatchResponse> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = {
      rt,
      handle: makeFulfilHandler(rt.context, {
        // A backing node not ready yet is tried again within seconds: its event goes back to the fulfil
        // queue (the one the record came from), delayed, not after the 180 s visibility timeout.
        retryLater: (record, seconds) =>
          sendBackLater(
            rt.sqs(),
            rt.env.FULFIL_QUEUE_URL ?? queueUrlOfArn(record.eventSourceARN),
            record,
            seconds,
          ),
      }),
    };
  }
  try {
    return await runtime.handle(event, context);
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
};
