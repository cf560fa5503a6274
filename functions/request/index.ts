import type { Context as LambdaContext, SQSBatchResponse, SQSEvent } from 'aws-lambda';
import {
  FUNCTION_TIMEOUT_SECONDS,
  visibilityTimeoutSeconds,
  WAITING_BUDGET_SECONDS,
} from '../../shared/core/timing.ts';
import { makeDeadLetterHandler, makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { type LambdaRuntime, lambdaRuntimeFromEnv } from '../../shared/runtime/lambdaContext.ts';
import { comeBackIn } from '../../shared/runtime/sqsVisibility.ts';

type Handle = ReturnType<typeof makeRequestHandler>;

/**
 * The request function: SQS batches of request / release messages (ReportBatchItemFailures), from the
 * request queue or, ending what its last delivery could not, from that queue's dead-letter queue (one
 * event source mapping per queue, so a batch comes from one of them).
 */
let runtime: { rt: LambdaRuntime; handle: Handle; deadLetters: Handle } | undefined;

export const handler = async (event: SQSEvent, context?: LambdaContext): Promise<SQSBatchResponse> => {
  if (!runtime) {
    const rt = lambdaRuntimeFromEnv();
    runtime = {
      rt,
      handle: makeRequestHandler(rt.context, {
        maxReceiveCount: rt.env.MAX_RECEIVE_COUNT,
        // The stack's request queue: its visibility timeout (180 s) is above the back-off's cap, so a
        // waiting message just comes back each time, and the budget ends it within one timeout (2%).
        waitingBudget: {
          seconds: WAITING_BUDGET_SECONDS.aws,
          visibilitySeconds: visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.request),
        },
        // A failed lease renewal comes back within seconds, not after the 180 s visibility timeout.
        retrySoon: (record, seconds) => comeBackIn(rt.sqs(), record, seconds),
      }),
      deadLetters: makeDeadLetterHandler(rt.context),
    };
  }
  const dlq = runtime.rt.env.REQUEST_DLQ_ARN;
  const fromDlq = dlq !== undefined && event.Records[0]?.eventSourceARN === dlq;
  try {
    // The invocation's remaining time bounds the batch (see makeBatchHandler).
    return await (fromDlq ? runtime.deadLetters : runtime.handle)(event, context);
  } finally {
    runtime.rt.metrics.publishStoredMetrics();
  }
};
