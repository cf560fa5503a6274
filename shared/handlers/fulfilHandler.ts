import type { SQSRecord } from 'aws-lambda';
import { NotReadyYetError } from '../core/errors.ts';
import { BackingEvent } from '../core/stateChanges.ts';
import type { Context } from '../usecases/context.ts';
import { handleSpotWarning, handleStateChange } from '../usecases/ready/fulfil.ts';
import { makeBatchHandler, type SqsBatchHandler } from './batchHandler.ts';

export interface FulfilHandlerOptions {
  /**
   * Sends the record's event back to the fulfil queue, to be received `seconds` from now (SQS SendMessage
   * with DelaySeconds: runtime/fulfilRetry.ts). Used for a backing node that runs but is not ready yet
   * (NotReadyYetError): it is tried again within seconds (core/timing.ts bootRetrySeconds) rather than
   * after the queue's visibility timeout (180 s on AWS), and the record is consumed. Handling an event is
   * idempotent, so a copy that meets a backing node ready meanwhile (the reaper was first) changes
   * nothing. Unset, or if the send fails: the record fails and comes back after the visibility timeout.
   */
  readonly retryLater?: (record: SQSRecord, seconds: number) => Promise<void>;
}

/**
 * The fulfil function: a batch of "EC2 Instance State-change Notification" events delivered by
 * EventBridge through SQS (the embedded pool's local provider sends the same bodies). A body that is
 * not such an event is logged and consumed; it would never parse on a retry. The records run at once
 * (events about different machines), under the invocation's deadline (see makeBatchHandler).
 */
export function makeFulfilHandler(context: Context, options: FulfilHandlerOptions = {}): SqsBatchHandler {
  const recordHandler = async (record: SQSRecord, ctx: Context): Promise<void> => {
    let json: unknown;
    try {
      json = JSON.parse(record.body);
    } catch (err) {
      ctx.log.warn('rejected event', {
        messageId: record.messageId,
        reason: `malformed JSON: ${(err as Error).message}`,
      });
      return;
    }
    const parsed = BackingEvent.safeParse(json);
    if (!parsed.success) {
      const reason = parsed.error.issues
        .map((i) => `${i.path.length ? `${i.path.join('.')}: ` : ''}${i.message}`)
        .join('; ');
      ctx.log.warn('rejected event', {
        messageId: record.messageId,
        reason: `not an EC2 state-change or spot interruption event: ${reason}`,
      });
      return;
    }
    const event = parsed.data;
    try {
      const outcome =
        event['detail-type'] === 'EC2 Spot Instance Interruption Warning'
          ? await handleSpotWarning(ctx, event.detail['instance-id'])
          : await handleStateChange(ctx, event);
      ctx.log.debug('state change handled', { messageId: record.messageId, outcome });
    } catch (err) {
      if (err instanceof NotReadyYetError && options.retryLater) {
        try {
          await options.retryLater(record, err.retryInSeconds);
          ctx.log.debug('state change tried again later', {
            messageId: record.messageId,
            seconds: err.retryInSeconds,
            reason: err.message,
          });
          return; // the copy carries the event on
        } catch (sendErr) {
          ctx.log.warn(
            'could not send an event back to try it again soon; it comes back after the visibility timeout',
            {
              messageId: record.messageId,
              seconds: err.retryInSeconds,
              error: (sendErr as Error).message,
            },
          );
        }
      }
      throw err;
    }
  };
  return makeBatchHandler(context, recordHandler, { inOrder: false });
}
