import { SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import type { SQSRecord } from 'aws-lambda';

/**
 * How long sending an event back to the fulfil queue may take. In-region SQS answers in milliseconds;
 * functions in a VPC without a route to SQS (no NAT gateway, no `sqs` endpoint: docs/aws.md) would
 * otherwise wait for the SDK's connection attempt, with no timeout of its own, until Lambda kills the
 * invocation. Well within the invocation's safety margin (core/timing.ts INVOCATION_SAFETY_MARGIN_MS).
 */
export const RESEND_TIMEOUT_MS = 2_000;

/**
 * Sends a fulfil record's event back to its queue, received `seconds` from now (DelaySeconds: SQS takes
 * 0-900): a new message, so it starts its receive count afresh, and the queue's maxReceiveCount keeps
 * meaning failed deliveries, not tries of a backing node that is still booting (those are bounded by its
 * boot-timeout: core/timing.ts bootRetrySeconds). The same body, so handling it is as idempotent as the
 * original's (shared/usecases/ready/fulfil.ts).
 */
export async function sendBackLater(
  sqs: SQSClient,
  queueUrl: string,
  record: SQSRecord,
  seconds: number,
): Promise<void> {
  await sqs.send(
    new SendMessageCommand({
      QueueUrl: queueUrl,
      MessageBody: record.body,
      DelaySeconds: Math.min(900, Math.max(0, Math.round(seconds))),
    }),
    { abortSignal: AbortSignal.timeout(RESEND_TIMEOUT_MS) },
  );
}

/** sendBackLater to one queue, as FulfilHandlerOptions.retryLater takes it. */
export const sendBackTo =
  (sqs: SQSClient, queueUrl: string) =>
  (record: SQSRecord, seconds: number): Promise<void> =>
    sendBackLater(sqs, queueUrl, record, seconds);
