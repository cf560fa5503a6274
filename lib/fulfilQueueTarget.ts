import type { IRuleTarget, RuleTargetConfig } from 'aws-cdk-lib/aws-events';
import { PolicyStatement, ServicePrincipal } from 'aws-cdk-lib/aws-iam';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import type { Function as LambdaFunction } from 'aws-cdk-lib/aws-lambda';
import type { IQueue } from 'aws-cdk-lib/aws-sqs';
import { Resource, Stack } from 'aws-cdk-lib/core';
import type { aws_events } from 'aws-cdk-lib/interfaces';
import type { Construct } from 'constructs';

const EVENTS = 'events.amazonaws.com';

/**
 * A work queue as the target of an events rule (the fulfil queue of the EC2 events rules, the github
 * queue of the github rules: lib/poolGithub.ts); an event EventBridge cannot deliver goes to the queue's
 * dead-letter queue. What EventBridge may do is granted here rather than by CDK's `SqsQueue`
 * target: on an encrypted queue that target conditions its grant only when the app sets the feature flag
 * `@aws-cdk/aws-events:eventsTargetQueueSameAccount`, and this construct is built in other people's apps.
 * Each queue's policy lets events.amazonaws.com send only for this rule (`aws:SourceArn`), with or
 * without a key.
 */
export class QueueTarget implements IRuleTarget {
  constructor(
    private readonly queue: IQueue,
    private readonly deadLetterQueue: IQueue,
  ) {}

  bind(rule: aws_events.IRuleRef): RuleTargetConfig {
    for (const queue of [this.queue, this.deadLetterQueue]) {
      queue.addToResourcePolicy(
        new PolicyStatement({
          principals: [new ServicePrincipal(EVENTS)],
          actions: ['sqs:SendMessage'],
          resources: [queue.queueArn],
          conditions: { ArnEquals: { 'aws:SourceArn': rule.ruleRef.ruleArn } },
        }),
      );
    }
    return {
      arn: this.queue.queueArn,
      targetResource: this.queue,
      deadLetterConfig: { arn: this.deadLetterQueue.queueArn },
    };
  }
}

/**
 * Lets EventBridge use the queues' customer-managed key to send to them (SQS encrypts with it on the
 * sender's behalf: kms:GenerateDataKey, and kms:Decrypt as AWS documents for SQS targets), for events of
 * this account only (`aws:SourceAccount`). Not `aws:SourceArn`: the key policy naming the rules would be a
 * cycle (key -> queue -> rule -> key). False when the key is imported: its policy cannot be changed here.
 */
export function admitEventBridgeToKey(scope: Construct, key: IKey): boolean {
  if (!Resource.isOwnedResource(key)) return false;
  key.addToResourcePolicy(
    new PolicyStatement({
      principals: [new ServicePrincipal(EVENTS)],
      actions: ['kms:Decrypt', 'kms:GenerateDataKey'],
      resources: ['*'],
      conditions: { StringEquals: { 'aws:SourceAccount': Stack.of(scope).account } },
    }),
  );
  return true;
}

/**
 * Lets the fulfil function send an event back to its own queue, delayed, to try a backing node that is
 * not ready yet again within seconds (shared/runtime/fulfilRetry.ts): SendMessage on that queue, and with
 * a customer-managed key what SQS needs to encrypt for the sender (kms:GenerateDataKey; its event source
 * mapping granted kms:Decrypt); the queue's URL in its environment (FULFIL_QUEUE_URL). Not
 * grantSendMessages: its key grant adds wildcard actions (`kms:GenerateDataKey*`, `kms:ReEncrypt*`).
 */
export function letSendBack(fn: LambdaFunction, queue: IQueue, key: IKey | undefined): void {
  fn.addToRolePolicy(new PolicyStatement({ actions: ['sqs:SendMessage'], resources: [queue.queueArn] }));
  key?.grant(fn, 'kms:GenerateDataKey');
  fn.addEnvironment('FULFIL_QUEUE_URL', queue.queueUrl);
}
