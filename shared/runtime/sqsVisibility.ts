import { ChangeMessageVisibilityCommand, type SQSClient } from '@aws-sdk/client-sqs';
import type { SQSRecord } from 'aws-lambda';

/**
 * A queue's URL from its ARN (`arn:<partition>:sqs:<region>:<account>:<name>`), as a Lambda SQS record
 * names its queue: SQS's endpoint for the region and partition, then the account and the name. No call.
 */
export function queueUrlOfArn(arn: string): string {
  const [prefix, partition, service, region, account, name] = arn.split(':');
  if (prefix !== 'arn' || service !== 'sqs' || !region || !account || !name) {
    throw new Error(`not an SQS queue ARN: ${arn}`);
  }
  const suffix = partition === 'aws-cn' ? 'amazonaws.com.cn' : 'amazonaws.com';
  return `https://sqs.${region}.${suffix}/${account}/${name}`;
}

/**
 * Makes a received message come back `seconds` from now rather than at the queue's visibility timeout
 * (ChangeMessageVisibility on its receipt handle; the event source mapping grants it to the consumer).
 */
export async function comeBackIn(sqs: SQSClient, record: SQSRecord, seconds: number): Promise<void> {
  await sqs.send(
    new ChangeMessageVisibilityCommand({
      QueueUrl: queueUrlOfArn(record.eventSourceARN),
      ReceiptHandle: record.receiptHandle,
      VisibilityTimeout: seconds,
    }),
    // Best effort and never in the way: without a route to SQS (a VPC without an sqs endpoint) the
    // message comes back at the queue's own visibility timeout, rather than the invocation hanging.
    { abortSignal: AbortSignal.timeout(COME_BACK_TIMEOUT_MS) },
  );
}

const COME_BACK_TIMEOUT_MS = 2_000;
