import type { ISecurityGroup, IVpc, SubnetSelection } from 'aws-cdk-lib/aws-ec2';
import type { IEventBus } from 'aws-cdk-lib/aws-events';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import type { RetentionDays } from 'aws-cdk-lib/aws-logs';
import type { ITopic } from 'aws-cdk-lib/aws-sns';
import { type Duration, Token } from 'aws-cdk-lib/core';
import type { InstanceState } from '../shared/core/stateChanges.ts';
import {
  backstopReceiveCount,
  FUNCTION_TIMEOUT_SECONDS,
  visibilityTimeoutSeconds,
  WAITING_BUDGET_SECONDS,
} from '../shared/core/timing.ts';

/** The construct's settings and the constants it is built with (MetastaticPool, metastaticPool.ts). */

/** The `service` dimension and name Powertools gives the functions' logs, traces and metrics. */
export const POWERTOOLS_SERVICE_NAME = 'metastatic';
/** The CloudWatch namespace of the functions' EMF metrics. */
export const METRICS_NAMESPACE = 'Metastatic';
/**
 * Receives of a request message before it is dead-lettered: a backstop above the waiting budget
 * (WAITING_BUDGET_SECONDS.aws, 2.5 hours, which ends a waiting request whatever its receive count). A
 * message comes back no sooner than the visibility timeout, so 9000 / 180 + 2 = 52 receives come only
 * after the budget ended.
 */
export const REQUEST_MAX_RECEIVE_COUNT = backstopReceiveCount(
  WAITING_BUDGET_SECONDS.aws,
  visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.request),
);
export const FULFIL_MAX_RECEIVE_COUNT = 5;
/** The EventBridge detail types the fulfil function consumes (state changes, spot interruption warnings). */
export const EC2_DETAIL_TYPES = [
  'EC2 Instance State-change Notification',
  'EC2 Spot Instance Interruption Warning',
] as const;
/**
 * The instance states the fulfil function acts on (shared/usecases/ready/fulfil.ts handleStateChange): running
 * makes a backing node ready, the others fail it. `pending` needs nothing, so the rule leaves it out.
 */
export const EC2_EVENT_STATES = [
  'running',
  'shutting-down',
  'terminated',
  'stopping',
  'stopped',
] as const satisfies readonly InstanceState[];
/** Defaults of the SQS event source mappings' maxConcurrency (see MetastaticPoolProps). */
export const REQUEST_MAX_CONCURRENCY = 10;
export const FULFIL_MAX_CONCURRENCY = 5;
/**
 * The lease queue's mapping: renewals are two DynamoDB calls each (a read, an update), ten to a batch, so
 * 5 invocations at once renew some 1,000 leases a second, twice what 10,000 leased nodes renewed every
 * 20 s need (bench/leases.ts).
 */
export const LEASE_MAX_CONCURRENCY = 5;
/** A renewal that fails this many times is dropped to the lease dead-letter queue (its alarm fires). */
export const LEASE_MAX_RECEIVE_COUNT = 5;
/** The request function's mapping of its dead-letter queue: the least Lambda allows. */
export const DEAD_LETTER_MAX_CONCURRENCY = 2;
/**
 * The github function (lib/poolGithub.ts): each invocation may wait on GitHub's API (a JIT configuration,
 * the delivery log) and on SSM Run Command, so its timeout is longer than the timing contract's.
 */
export const GITHUB_FUNCTION_TIMEOUT_SECONDS = 120;
/** A pool or SSM event the github function fails this many times is dropped to the github dead-letter queue. */
export const GITHUB_MAX_RECEIVE_COUNT = 5;
/** The github queue's mapping: GitHub's API is rate limited, so few invocations at once (the least Lambda allows). */
export const GITHUB_MAX_CONCURRENCY = 2;
/** The SSM document the github function starts runners with (and whose status changes it listens to). */
export const GITHUB_RUN_DOCUMENT = 'AWS-RunShellScript';
/** The final statuses of an SSM command invocation: the runner it started has ended. */
export const SSM_FINAL_STATUSES = [
  'Success',
  'Failed',
  'Cancelled',
  'TimedOut',
  'Delivery Timed Out',
  'Undeliverable',
  'Terminated',
] as const;

export interface MetastaticPoolProps {
  /**
   * The pool configuration as YAML text. Validated at synth and shipped in each function's code package
   * as `metastatic.yaml` (not in the environment: any size fits; a change deploys new code).
   */
  readonly config: string;
  /**
   * What to call the configuration in validation errors (a file name).
   * @default 'config'
   */
  readonly configName?: string;
  /**
   * The value of the `metastatic:pool` tag on the pool's instances and volumes; the functions may only
   * terminate instances that carry it. Set it explicitly for a long-lived pool: the default changes when
   * the construct moves in the tree or the stack is renamed, and running instances would be orphaned.
   * @default - a unique name derived from the stack name and the construct path
   */
  readonly poolId?: string;
  /**
   * How often the reaper runs. A run that fails is not retried (the next one does its work), and a run
   * that waited longer than this to start is dropped.
   * @default Duration.minutes(1)
   */
  readonly reaperRate?: Duration;
  /**
   * A CloudWatch dashboard of the pool (requests, time to fulfilled, nodes waiting, slots, backing nodes by
   * state, launches, reaper runs, dead letters, alarms): `MetastaticPool.dashboard`.
   * @default true
   */
  readonly dashboard?: boolean;
  /**
   * The stack outputs `metastatic --stack` and the client library read (RequestQueueUrl, FulfilQueueUrl,
   * TableName, EventBusName, PoolId: shared/runtime/stackOutputs.ts), created by the construct with those
   * keys. A stack holds one pool that publishes them: give a second pool in the same stack `false` (the
   * CLI cannot find that one by stack name).
   * @default true
   */
  readonly stackOutputs?: boolean;
  /**
   * The most request-function invocations the request queue's event source mapping runs at once (2 to
   * 1000): messages beyond it wait in the queue rather than in parallel launches and table conflicts.
   * @default REQUEST_MAX_CONCURRENCY (10)
   */
  readonly requestMaxConcurrency?: number;
  /**
   * The most fulfil-function invocations the fulfil queue's event source mapping runs at once (2 to
   * 1000). An EC2 event of a pool instance that can change its backing node is confirmed with a
   * DescribeInstances (events of other instances cost none), whose rate EC2 limits per account and
   * region: a burst of events waits in the queue instead of spending the account's budget.
   * @default FULFIL_MAX_CONCURRENCY (5)
   */
  readonly fulfilMaxConcurrency?: number;
  /**
   * The most request-function invocations the lease queue's event source mapping runs at once (2 to
   * 1000): lease renewals have a queue and a concurrency of their own, so they never wait behind
   * placements (which take seconds each) and a lease does not lapse under a running job for that.
   * @default LEASE_MAX_CONCURRENCY (5)
   */
  readonly leaseMaxConcurrency?: number;
  /**
   * Where the pool publishes its events (request fulfilled, node released, ...).
   * @default - the account's default event bus
   */
  readonly eventBus?: IEventBus;
  /**
   * Retention of the functions' log groups.
   * @default RetentionDays.ONE_MONTH
   */
  readonly logRetention?: RetentionDays;
  /**
   * Topic every alarm notifies when it fires.
   * @default - alarms without actions
   */
  readonly alarmTopic?: ITopic;
  /**
   * The IAM roles in the instance profiles named by the labels' `iam-instance-profile` (or by their
   * launch templates), as role names in this account or role ARNs; iam:PassRole is granted for exactly
   * these. Required when a label has an instance profile (a profile's name or ARN does not say which
   * role it holds).
   * @default - none
   */
  readonly instanceRoles?: readonly string[];
  /**
   * Customer-managed KMS key for the table and the queues. EventBridge must be allowed to use it to
   * deliver EC2 events to the fulfil queue: a key this app creates gets a key-policy statement for
   * events.amazonaws.com (kms:GenerateDataKey and kms:Decrypt, for events of this account:
   * fulfilQueueTarget.ts), whatever the app's feature flags; for an imported key synth warns, and that
   * statement must be added to its policy by hand.
   * @default - AWS managed encryption (DynamoDB) and SSE-SQS (queues)
   */
  readonly encryptionKey?: IKey;
  /**
   * The ARN of the customer-managed KMS key that encrypts the instances' EBS volumes (the account's
   * EBS default key, or a launch template's), in the pools' region. The functions launch the instances,
   * so they are granted what EC2 needs of it on their behalf: kms:CreateGrant (for AWS resources only),
   * kms:Decrypt, kms:DescribeKey, kms:GenerateDataKeyWithoutPlaintext, kms:ReEncryptFrom/To. The key's
   * policy must let IAM policies of the account grant it (the default key policy does).
   * @default - none: volumes use the AWS managed key (aws/ebs), or no encryption
   */
  readonly ebsKmsKeyArn?: string;
  /**
   * The VPC of the backing instances: the functions run in it, so they can check an instance's
   * `connection-port` (and scan its host keys) at its private address. Its subnets need a route to
   * the AWS APIs the functions call (DynamoDB, EC2, EventBridge; they never call SQS, the event source
   * mappings do): a NAT gateway or VPC endpoints (docs/aws.md lists them).
   * The instances' security group must admit `connection-port` from `functionsSecurityGroups`.
   * @default - the functions run outside any VPC and check only public addresses (`public-ipv4: true`);
   *   with private addresses a backing node is ready when EC2 reports it running
   */
  readonly vpc?: IVpc;
  /**
   * Where in `vpc` the functions run.
   * @default - the VPC's private subnets
   */
  readonly vpcSubnets?: SubnetSelection;
  /**
   * The functions' security groups in `vpc`.
   * @default - one new group, all outbound traffic allowed, no inbound
   */
  readonly securityGroups?: readonly ISecurityGroup[];
}

/** Tag values: up to 256 characters of letters, digits, spaces and _ . : / = + - @. */
export function checkPoolId(poolId: string): void {
  if (Token.isUnresolved(poolId)) return;
  if (poolId.length === 0 || poolId.length > 256 || !/^[\p{L}\p{N}\p{Z}_.:/=+\-@]+$/u.test(poolId)) {
    throw new Error(
      `poolId must be a valid tag value (1-256 letters, digits, spaces and _ . : / = + - @), got ${JSON.stringify(poolId)}`,
    );
  }
}

/** An event source mapping's maxConcurrency: Lambda accepts 2 to 1000. */
export function checkMaxConcurrency(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 2 || value > 1000) {
    throw new Error(`${name} must be an integer from 2 to 1000 (Lambda's limits), got ${value}`);
  }
  return value;
}

export function clampDuration(value: Duration, min: Duration, max: Duration): Duration {
  const seconds = value.toSeconds();
  if (seconds < min.toSeconds()) return min;
  if (seconds > max.toSeconds()) return max;
  return value;
}
