import { Validations } from 'aws-cdk-lib/core';
import type { IConstruct } from 'constructs';
import { cfnResource } from './cfnResource.ts';
import type { PoolFunction } from './poolFunction.ts';
import { GITHUB_RUN_DOCUMENT } from './poolProps.ts';
import type { QueueWithDlq } from './queueWithDlq.ts';

/** The parts of PoolGithub (lib/poolGithub.ts) that carry findings. */
export interface GithubFindingSites {
  readonly webhookSecret: IConstruct;
  readonly appPrivateKey: IConstruct;
  readonly permissions: IConstruct;
  readonly runnerInstancePolicy: IConstruct;
  readonly reconcileSchedule: IConstruct;
  readonly function: PoolFunction;
  readonly queue: QueueWithDlq;
  readonly jitParameterPath: string;
}

/**
 * cdk-nag findings about the github resources (lib/poolGithub.ts) that do not apply, each on the one
 * resource it is about, with the reason. `region` is the pools' (the ARNs' region).
 */
export function acknowledgeGithubFindings(github: GithubFindingSites, region: string): void {
  const on = (construct: IConstruct, id: string, reason: string) =>
    Validations.of(cfnResource(construct)).acknowledge({ id, reason });
  for (const secret of [github.webhookSecret, github.appPrivateKey]) {
    on(
      secret,
      'AwsSolutions-SMG4',
      'The value comes from GitHub (the private key GitHub generates for the App, the webhook secret set ' +
        "in the App's settings) and is rotated there: a rotation function could not change it at GitHub. " +
        'The webhook secret is rotated by putting two lines in it (old, new) while GitHub changes over.',
    );
  }
  // How cdk-nag prints the parameters' ARN (lib/poolGithub.ts); with a pool id unknown at synth the
  // finding names a token and stays for the embedding app to acknowledge.
  const parameters = `arn:<AWS::Partition>:ssm:${region}:<AWS::AccountId>:parameter${github.jitParameterPath}/*`;
  on(
    github.permissions,
    `AwsSolutions-IAM5[Resource::${parameters}]`,
    "One parameter per runner, named when the runner is started: only the pool's own path " +
      `(${github.jitParameterPath}/) is granted.`,
  );
  on(
    github.runnerInstancePolicy,
    `AwsSolutions-IAM5[Resource::${parameters}]`,
    'An instance reads (and then deletes) the JIT configuration of the runner started on it, named when ' +
      "that runner is started: only the pool's own path is granted.",
  );
  on(
    github.permissions,
    `AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:${region}:<AWS::AccountId>:instance/*]`,
    `Instance ids are not known before launch: ssm:SendCommand (${GITHUB_RUN_DOCUMENT} only) requires ` +
      'the resource tag metastatic:pool=<pool id>.',
  );
  on(
    github.permissions,
    'AwsSolutions-IAM5[Resource::*]',
    'ssm:CancelCommand and ssm:GetCommandInvocation name a command id, not a resource: they support no ' +
      'resource-level permissions.',
  );

  const fn = github.function.function;
  on(
    fn,
    'Serverless-LambdaDLQ',
    'Invoked synchronously by its function URL (GitHub retries nothing, the reconcile run redelivers) and ' +
      "its SQS event source mapping (failed messages go to the github queue's dead-letter queue), and " +
      'asynchronously only by its reconcile schedule, whose next run does the same work.',
  );
  on(
    fn.node.findChild('EventInvokeConfig'),
    'Serverless-LambdaAsyncFailureDestination',
    'A failed scheduled reconcile run is neither retried nor kept: the next run does the same work.',
  );
  on(
    github.reconcileSchedule,
    'Serverless-EventBusDLQ',
    'A schedule tick that cannot be delivered is superseded by the next one; there is nothing to replay.',
  );
  const mappings = fn.node.children.filter((c) => c.node.id.startsWith('SqsEventSource'));
  if (mappings.length !== 1) throw new Error(`${fn.node.path}: expected one SQS event source mapping`);
  for (const mapping of mappings) {
    on(
      mapping,
      'Serverless-LambdaEventSourceMappingDestination',
      'SQS event source mappings support no on-failure destination; the github queue redrives a message ' +
        `to its dead-letter queue after ${github.queue.maxReceiveCount} receives.`,
    );
  }
}
