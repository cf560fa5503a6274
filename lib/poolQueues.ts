import type { IAlarmAction } from 'aws-cdk-lib/aws-cloudwatch';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import type { Construct } from 'constructs';
import { letSendBack } from './fulfilQueueTarget.ts';
import type { PoolFunction } from './poolFunction.ts';
import {
  DEAD_LETTER_MAX_CONCURRENCY,
  FULFIL_MAX_RECEIVE_COUNT,
  LEASE_MAX_RECEIVE_COUNT,
  REQUEST_MAX_RECEIVE_COUNT,
} from './poolProps.ts';
import { QueueWithDlq } from './queueWithDlq.ts';

/** What the pool's queues are made with. */
export interface PoolQueuesProps {
  readonly requestFunction: PoolFunction;
  readonly fulfilFunction: PoolFunction;
  readonly encryptionKey?: IKey | undefined;
  readonly alarmAction?: IAlarmAction | undefined;
  /** Each event source mapping's maxConcurrency (checked by the caller). */
  readonly maxConcurrency: { readonly request: number; readonly lease: number; readonly fulfil: number };
}

/**
 * The pool's work queues, each with its dead-letter queue, and the event source mappings that feed the
 * functions: requests (and their dead letters) and lease renewals to the request function, EC2 events to
 * the fulfil function.
 */
export function poolQueues(
  scope: Construct,
  o: PoolQueuesProps,
): { requestQueue: QueueWithDlq; leaseQueue: QueueWithDlq; fulfilQueue: QueueWithDlq } {
  const encryption = o.encryptionKey ? { encryptionKey: o.encryptionKey } : {};
  const alarms = o.alarmAction ? { alarmAction: o.alarmAction } : {};
  const requestQueue = new QueueWithDlq(scope, 'RequestQueue', {
    description: 'metastatic request queue',
    maxReceiveCount: REQUEST_MAX_RECEIVE_COUNT,
    consumerTimeout: o.requestFunction.timeout,
    // The request function consumes its dead-letter queue, so its alarm counts what arrives there.
    deadLetterQueueConsumed: true,
    ...encryption,
    ...alarms,
  });
  const leaseQueue = new QueueWithDlq(scope, 'LeaseQueue', {
    description: 'metastatic lease queue (renewals)',
    maxReceiveCount: LEASE_MAX_RECEIVE_COUNT,
    consumerTimeout: o.requestFunction.timeout,
    ...encryption,
    ...alarms,
  });
  const fulfilQueue = new QueueWithDlq(scope, 'FulfilQueue', {
    description: 'metastatic fulfil queue (EC2 events)',
    maxReceiveCount: FULFIL_MAX_RECEIVE_COUNT,
    consumerTimeout: o.fulfilFunction.timeout,
    ...encryption,
    ...alarms,
  });

  // Event source mappings grant the consumers ReceiveMessage/DeleteMessage/ChangeMessageVisibility.
  o.requestFunction.function.addEventSource(
    new SqsEventSource(requestQueue.queue, {
      batchSize: 10,
      reportBatchItemFailures: true,
      maxConcurrency: o.maxConcurrency.request,
    }),
  );
  // Renewals on a mapping of their own: never behind placements. A failed one comes back within
  // RENEW_RETRY_SECONDS (the function changes its visibility), not at the queue's timeout.
  o.requestFunction.function.addEventSource(
    new SqsEventSource(leaseQueue.queue, {
      batchSize: 10,
      reportBatchItemFailures: true,
      maxConcurrency: o.maxConcurrency.lease,
    }),
  );
  o.fulfilFunction.function.addEventSource(
    new SqsEventSource(fulfilQueue.queue, {
      reportBatchItemFailures: true,
      maxConcurrency: o.maxConcurrency.fulfil,
    }),
  );
  letSendBack(o.fulfilFunction.function, fulfilQueue.queue, o.encryptionKey);
  // The request function also ends what reaches the request dead-letter queue: a message whose last
  // delivery died before it could fail the request would otherwise leave the request waiting forever.
  o.requestFunction.function.addEnvironment('REQUEST_DLQ_ARN', requestQueue.deadLetterQueue.queueArn);
  o.requestFunction.function.addEventSource(
    new SqsEventSource(requestQueue.deadLetterQueue, {
      batchSize: 10,
      reportBatchItemFailures: true,
      maxConcurrency: DEAD_LETTER_MAX_CONCURRENCY,
    }),
  );
  return { requestQueue, leaseQueue, fulfilQueue };
}
