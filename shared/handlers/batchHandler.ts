import { BatchProcessor, EventType, processPartialResponse } from '@aws-lambda-powertools/batch';
import type { SQSBatchResponse, SQSEvent, SQSRecord } from 'aws-lambda';
import { DeadlineError } from '../core/errors.ts';
import { DELIVERY_DEADLINE_MS, deadlineOf, type InvocationTime, invocationFor } from '../core/timing.ts';
import type { Context } from '../usecases/context.ts';

/**
 * An SQS batch handler. `invocation` is Lambda's context (its remaining time); the embedded pool has
 * none and passes nothing: the batch then gets DELIVERY_DEADLINE_MS from its start, on the use cases' clock.
 */
export type SqsBatchHandler = (event: SQSEvent, invocation?: InvocationTime) => Promise<SQSBatchResponse>;

/** One record's work, given the Context of its invocation (which carries the invocation's deadline). */
export type RecordHandler = (record: SQSRecord, ctx: Context) => Promise<void>;

export interface BatchOptions {
  /**
   * Handle the records one after the other (the request queues: records of one batch would otherwise race
   * each other for the same free slots and each launch a backing node, where in order the second packs
   * onto the first's), or all at once (the fulfil queue: events about different machines).
   */
  readonly inOrder: boolean;
  /**
   * The end of each invocation, after its records, on the invocation's context (its deadline): what the
   * records left in the container's memory to write out before Lambda freezes it (the request function's
   * arrival counts, shared/usecases/ready/forecasts.ts). Best effort: what it throws is logged, the records'
   * outcomes stand.
   */
  readonly atEnd?: (ctx: Context) => Promise<void>;
}

/**
 * Runs a batch's records, each on its own (Powertools' batch processor reports the failed ones, so only
 * they come back), under the invocation's deadline (core/timing.ts): each record's use case gets a
 * Context carrying it, so its checks and writes end before the function would be killed, and a record
 * not started while INVOCATION_SAFETY_MARGIN_MS or less is left is reported failed without any work
 * (DeadlineError): it comes back after the visibility timeout, in a fresh invocation.
 */
export function makeBatchHandler(
  context: Context,
  recordHandler: RecordHandler,
  options: BatchOptions,
): SqsBatchHandler {
  return async (event, invocation) => {
    const deadline = deadlineOf(invocation ?? invocationFor(context.clock, DELIVERY_DEADLINE_MS));
    const ctx: Context = { ...context, deadline };
    let notStarted = 0;
    const handle = async (record: SQSRecord): Promise<void> => {
      if (deadline.remainingMs() <= 0) {
        notStarted++;
        throw new DeadlineError(
          `record ${record.messageId} not started: too little of the invocation is left; retried later`,
        );
      }
      await recordHandler(record, ctx);
    };
    // A processor per invocation: it holds the batch's records and outcomes while it runs.
    const response = await processPartialResponse(event, handle, new BatchProcessor(EventType.SQS), {
      throwOnFullBatchFailure: false,
      processInParallel: !options.inOrder,
    });
    if (options.atEnd) {
      await options.atEnd(ctx).catch((err: unknown) => {
        context.log.warn('the end of an invocation failed', { error: (err as Error).message });
      });
    }
    if (notStarted > 0) {
      context.log.info('batch cut short by the invocation deadline; the rest comes back', {
        notStarted,
        records: event.Records.length,
      });
    }
    return response;
  };
}
