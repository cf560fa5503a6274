import type { Rule } from 'aws-cdk-lib/aws-events';
import type { CfnEventSourceMapping } from 'aws-cdk-lib/aws-lambda';
import { Validations } from 'aws-cdk-lib/core';
import { cfnResource } from './cfnResource.ts';
import type { PoolFunction } from './poolFunction.ts';
import type { QueueWithDlq } from './queueWithDlq.ts';

/** cdk-nag findings that do not apply, each on the one resource it is about, with the reason. */
export function acknowledgeFindings(pool: {
  readonly requestFunction: PoolFunction;
  readonly requestQueue: QueueWithDlq;
  readonly leaseQueue: QueueWithDlq;
  readonly fulfilFunction: PoolFunction;
  readonly fulfilQueue: QueueWithDlq;
  readonly reaperFunction: PoolFunction;
  readonly reaperSchedule: Rule;
}): void {
  const sqsConsumers: Array<[PoolFunction, QueueWithDlq[]]> = [
    [pool.requestFunction, [pool.requestQueue, pool.leaseQueue]],
    [pool.fulfilFunction, [pool.fulfilQueue]],
  ];
  for (const [fn, queues] of sqsConsumers) {
    Validations.of(cfnResource(fn.function)).acknowledge({
      id: 'Serverless-LambdaDLQ',
      reason:
        'Invoked synchronously by an SQS event source mapping; a function DLQ applies only to asynchronous ' +
        "invocations. Failed messages go to the source queue's dead-letter queue.",
    });
    const mappings = fn.function.node.children.filter((c) => c.node.id.startsWith('SqsEventSource'));
    if (mappings.length === 0) throw new Error(`${fn.node.path}: no SQS event source mapping found`);
    for (const mapping of mappings) {
      // Which queue the mapping reads: one of the function's queues, or one's dead-letter queue.
      const arn = (cfnResource(mapping) as CfnEventSourceMapping).eventSourceArn;
      const source = queues.find((q) => q.queue.queueArn === arn);
      const deadLettersOf = queues.find((q) => q.deadLetterQueue.queueArn === arn);
      if (!source && !deadLettersOf) throw new Error(`${mapping.node.path}: reads a queue of no known kind`);
      Validations.of(cfnResource(mapping)).acknowledge({
        id: 'Serverless-LambdaEventSourceMappingDestination',
        reason: source
          ? 'SQS event source mappings support no on-failure destination; the queue redrives a message to ' +
            `its dead-letter queue after ${source.maxReceiveCount} receives.`
          : 'The dead-letter queue is the last stop: a message the function cannot handle there stays in it ' +
            '(its DeadLetterAlarm fires) and comes back until its retention ends.',
      });
    }
  }
  Validations.of(cfnResource(pool.reaperFunction.function)).acknowledge({
    id: 'Serverless-LambdaDLQ',
    reason:
      'The reaper is idempotent and runs on a schedule: a failed run is superseded by the next one, and ' +
      'repeated failures raise ReaperErrorsAlarm.',
  });
  Validations.of(cfnResource(pool.reaperFunction.function.node.findChild('EventInvokeConfig'))).acknowledge({
    id: 'Serverless-LambdaAsyncFailureDestination',
    reason:
      'A failed scheduled reaper run is neither retried nor kept: the next run does the same work, and ' +
      'ReaperErrorsAlarm reports runs that keep failing.',
  });
  Validations.of(cfnResource(pool.reaperSchedule)).acknowledge({
    id: 'Serverless-EventBusDLQ',
    reason:
      'A schedule tick that cannot be delivered is superseded by the next one; there is nothing to replay.',
  });
}
