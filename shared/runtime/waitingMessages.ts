import { ChangeMessageVisibilityCommand, SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import type { SQSRecord } from 'aws-lambda';
import type { Log } from '../core/log.ts';
import type { RequestRecord } from '../core/records.ts';
import type { Context } from '../usecases/context.ts';
import { requestMessageOf, waitingRequests } from '../usecases/place/waiting.ts';

/**
 * The messages of waiting requests on the embedded pool's request queue: how one backs off, and how
 * those the in-memory queue lost are sent again at start.
 */

/** A waiting request's back-off: its message stays away `seconds` from now (fauxqs, as SQS, resets the timer). */
export async function keepAway(
  sqs: SQSClient,
  queueUrl: string,
  record: SQSRecord,
  seconds: number,
): Promise<void> {
  await sqs.send(
    new ChangeMessageVisibilityCommand({
      QueueUrl: queueUrl,
      ReceiptHandle: record.receiptHandle,
      VisibilityTimeout: seconds,
    }),
  );
}

/**
 * The queues live in memory: a request still waiting when the previous run stopped (Ctrl-C, a crash)
 * lost its message with them, and nothing would ever serve or end it but its request-timeout. Its
 * message is sent again (the same body: the stored request is continued under its id).
 */
export async function resendWaiting(ctx: Context, sqs: SQSClient, queueUrl: string, log: Log): Promise<void> {
  let waiting: RequestRecord[];
  try {
    waiting = await waitingRequests(ctx);
  } catch (err) {
    log.error('could not list the requests still waiting; they end at their request-timeout', {
      error: err as Error,
    });
    return;
  }
  for (const r of waiting) {
    await sqs.send(
      new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify(requestMessageOf(r)) }),
    );
  }
  if (waiting.length > 0) {
    log.info('requests still waiting from the previous run sent again', {
      requests: waiting.map((r) => r.id),
    });
  }
}
