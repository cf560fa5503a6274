import type { SQSRecord } from 'aws-lambda';
import { BackingEvent } from '../core/stateChanges.ts';
import type { Context } from '../usecases/context.ts';
import { handleSpotWarning, handleStateChange } from '../usecases/fulfil.ts';
import { makeBatchHandler, type SqsBatchHandler } from './batchHandler.ts';

/**
 * The fulfil function: a batch of "EC2 Instance State-change Notification" events delivered by
 * EventBridge through SQS (the embedded pool's local provider sends the same bodies). A body that is
 * not such an event is logged and consumed; it would never parse on a retry. The records run at once
 * (events about different machines), under the invocation's deadline (see makeBatchHandler).
 */
export function makeFulfilHandler(context: Context): SqsBatchHandler {
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
    const outcome =
      event['detail-type'] === 'EC2 Spot Instance Interruption Warning'
        ? await handleSpotWarning(ctx, event.detail['instance-id'])
        : await handleStateChange(ctx, event);
    ctx.log.debug('state change handled', { messageId: record.messageId, outcome });
  };
  return makeBatchHandler(context, recordHandler, { inOrder: false });
}
