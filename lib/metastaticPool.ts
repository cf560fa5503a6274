import { Annotations, Aws, CfnRule, Duration, Fn, Names, Stack, Token, Validations } from 'aws-cdk-lib';
import {
  Alarm,
  ComparisonOperator,
  type IAlarmAction,
  Metric,
  Stats,
  TreatMissingData,
} from 'aws-cdk-lib/aws-cloudwatch';
import { SnsAction } from 'aws-cdk-lib/aws-cloudwatch-actions';
import { type ISecurityGroup, type IVpc, SecurityGroup, type SubnetSelection } from 'aws-cdk-lib/aws-ec2';
import { EventBus, type IEventBus, Rule, Schedule } from 'aws-cdk-lib/aws-events';
import { LambdaFunction, SqsQueue } from 'aws-cdk-lib/aws-events-targets';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import type { RetentionDays } from 'aws-cdk-lib/aws-logs';
import type { ITopic } from 'aws-cdk-lib/aws-sns';
import { Construct, type IConstruct } from 'constructs';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import type { ResolvedConfig } from '../shared/config/model.ts';
import { cfnResource } from './cfnResource.ts';
import { awsLabels, LauncherPermissions } from './launcherPermissions.ts';
import { PoolFunction } from './poolFunction.ts';
import { PoolTable } from './poolTable.ts';
import { QueueWithDlq } from './queueWithDlq.ts';

/** The `service` dimension and name Powertools gives the functions' logs, traces and metrics. */
export const POWERTOOLS_SERVICE_NAME = 'metastatic';
/** The CloudWatch namespace of the functions' EMF metrics. */
export const METRICS_NAMESPACE = 'Metastatic';
/**
 * Receives of a request message before it is dead-lettered. A request that waits for capacity is
 * retried by letting its message come back after the visibility timeout, so this bounds the wait.
 */
export const REQUEST_MAX_RECEIVE_COUNT = 50;
export const FULFIL_MAX_RECEIVE_COUNT = 5;
/** The EventBridge detail types the fulfil function consumes. */
export const EC2_DETAIL_TYPES = [
  'EC2 Instance State-change Notification',
  'EC2 Spot Instance Interruption Warning',
] as const;
/** Lambda's limit on the size of a function's environment (keys and values). */
const LAMBDA_ENVIRONMENT_LIMIT = 4096;
/** What an unresolved token (a table name, a bus name) is assumed to take in the environment. */
const TOKEN_ALLOWANCE = 256;

export interface MetastaticPoolProps {
  /** The pool configuration as YAML text. Validated at synth and passed to the functions as METASTATIC_CONFIG. */
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
   * How often the reaper runs.
   * @default Duration.minutes(1)
   */
  readonly reaperRate?: Duration;
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
   * Customer-managed KMS key for the table and the queues.
   * @default - AWS managed encryption (DynamoDB) and SSE-SQS (queues)
   */
  readonly encryptionKey?: IKey;
  /**
   * The VPC of the backing instances: the functions run in it, so they can check an instance's
   * `connection-port` (and scan its host keys) at its private address. Its subnets need a route to
   * the AWS APIs the functions call (DynamoDB, SQS, EventBridge, EC2): a NAT gateway or VPC endpoints.
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

/**
 * A metastatic pool on AWS: the table, the request and fulfil queues with their dead-letter queues,
 * the request, fulfil and reaper functions, the EventBridge rules that feed them, the EC2 permissions
 * bound to the pool's tag, and the alarms an operator needs.
 */
export class MetastaticPool extends Construct {
  readonly config: ResolvedConfig;
  readonly poolId: string;
  readonly table: PoolTable;
  readonly requestQueue: QueueWithDlq;
  readonly fulfilQueue: QueueWithDlq;
  readonly requestFunction: PoolFunction;
  readonly fulfilFunction: PoolFunction;
  readonly reaperFunction: PoolFunction;
  readonly eventBus: IEventBus;
  readonly launcher: LauncherPermissions;
  readonly ec2EventsRule: Rule;
  readonly reaperSchedule: Rule;
  readonly alarms: readonly Alarm[];
  /** The functions' security groups when they run in a VPC (empty otherwise): admit these on the instances. */
  readonly functionsSecurityGroups: readonly ISecurityGroup[];

  constructor(scope: Construct, id: string, props: MetastaticPoolProps) {
    super(scope, id);
    this.config = parseConfigOrThrow(props.config, props.configName ?? 'config');
    for (const n of this.config.notices) {
      Annotations.of(this).addWarningV2('metastatic:config-notice', `${n.path}: ${n.message}`);
    }
    const local = this.config.backingPools.filter((p) => p.driver !== 'aws').map((p) => p.key);
    if (local.length > 0) {
      throw new Error(
        `backing pool(s) ${local.join(', ')} use driver local, which runs only in the embedded stack ` +
          '(metastatic dev); a pool on AWS launches its backing nodes with driver aws',
      );
    }
    this.poolId = props.poolId ?? Names.uniqueResourceName(this, { maxLength: 128, separator: '-' });
    checkPoolId(this.poolId);
    const alarmAction: IAlarmAction | undefined = props.alarmTopic
      ? new SnsAction(props.alarmTopic)
      : undefined;
    this.eventBus = props.eventBus ?? EventBus.fromEventBusName(this, 'DefaultBus', 'default');
    // Before the functions (whose bundling takes seconds): the checks of the aws pools and of
    // instanceRoles fail fast.
    this.launcher = new LauncherPermissions(this, 'Launcher', {
      labels: awsLabels(this.config),
      poolId: this.poolId,
      instanceRoles: props.instanceRoles,
    });
    this.checkRegion(this.launcher.resources.region);

    this.table = new PoolTable(
      this,
      'Table',
      props.encryptionKey ? { encryptionKey: props.encryptionKey } : {},
    );

    const common = {
      TABLE_NAME: this.table.tableName,
      METASTATIC_CONFIG: props.config,
      POOL_ID: this.poolId,
      EVENT_BUS_NAME: this.eventBus.eventBusName,
      POWERTOOLS_SERVICE_NAME,
      POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
      ...(props.vpc ? { METASTATIC_IN_VPC: 'true' } : {}),
    };
    if (!props.vpc && (props.vpcSubnets || props.securityGroups)) {
      throw new Error('vpcSubnets and securityGroups place the functions in a VPC: give vpc too');
    }
    this.functionsSecurityGroups = props.vpc
      ? (props.securityGroups ?? [
          new SecurityGroup(this, 'FunctionsSecurityGroup', {
            vpc: props.vpc,
            description: 'metastatic pool functions (admit it on the backing instances connection-port)',
            allowAllOutbound: true,
          }),
        ])
      : [];
    const network = props.vpc
      ? {
          vpc: props.vpc,
          securityGroups: this.functionsSecurityGroups,
          ...(props.vpcSubnets ? { vpcSubnets: props.vpcSubnets } : {}),
        }
      : {};
    const functionDefaults = {
      ...(props.logRetention ? { logRetention: props.logRetention } : {}),
      ...network,
    };
    this.requestFunction = new PoolFunction(this, 'Request', {
      name: 'request',
      ...functionDefaults,
      environment: checkedEnvironment({ ...common, MAX_RECEIVE_COUNT: String(REQUEST_MAX_RECEIVE_COUNT) }),
    });
    this.fulfilFunction = new PoolFunction(this, 'Fulfil', {
      name: 'fulfil',
      ...functionDefaults,
      environment: checkedEnvironment(common),
    });
    this.reaperFunction = new PoolFunction(this, 'Reaper', {
      name: 'reaper',
      ...functionDefaults,
      environment: checkedEnvironment(common),
    });
    const functions = [this.requestFunction, this.fulfilFunction, this.reaperFunction];

    const encryption = props.encryptionKey ? { encryptionKey: props.encryptionKey } : {};
    const alarms = alarmAction ? { alarmAction } : {};
    this.requestQueue = new QueueWithDlq(this, 'RequestQueue', {
      description: 'metastatic request queue',
      maxReceiveCount: REQUEST_MAX_RECEIVE_COUNT,
      consumerTimeout: this.requestFunction.timeout,
      ...encryption,
      ...alarms,
    });
    this.fulfilQueue = new QueueWithDlq(this, 'FulfilQueue', {
      description: 'metastatic fulfil queue (EC2 events)',
      maxReceiveCount: FULFIL_MAX_RECEIVE_COUNT,
      consumerTimeout: this.fulfilFunction.timeout,
      ...encryption,
      ...alarms,
    });

    // Event source mappings grant the consumers ReceiveMessage/DeleteMessage/ChangeMessageVisibility.
    this.requestFunction.function.addEventSource(
      new SqsEventSource(this.requestQueue.queue, { batchSize: 10, reportBatchItemFailures: true }),
    );
    this.fulfilFunction.function.addEventSource(
      new SqsEventSource(this.fulfilQueue.queue, { reportBatchItemFailures: true }),
    );
    // The request function also ends what reaches the request dead-letter queue: a message whose last
    // delivery died before it could fail the request would otherwise leave the request waiting forever.
    this.requestFunction.function.addEnvironment(
      'REQUEST_DLQ_ARN',
      this.requestQueue.deadLetterQueue.queueArn,
    );
    this.requestFunction.function.addEventSource(
      new SqsEventSource(this.requestQueue.deadLetterQueue, { batchSize: 10, reportBatchItemFailures: true }),
    );

    // AWS service events reach only the account's default bus, whatever bus the pool publishes to.
    // They carry no instance tags, so this rule forwards every EC2 state change in the region; the
    // fulfil function keeps only the pool's instances by describing each one and checking its
    // metastatic:pool tag (an instance it does not know is dropped).
    this.ec2EventsRule = new Rule(this, 'Ec2Events', {
      description:
        'EC2 instance state changes and spot interruption warnings, to the metastatic fulfil queue',
      eventPattern: { source: ['aws.ec2'], detailType: [...EC2_DETAIL_TYPES] },
      targets: [
        // An event EventBridge cannot deliver lands in the fulfil dead-letter queue, next to the events
        // the fulfil function gave up on: one place to look and redrive.
        new SqsQueue(this.fulfilQueue.queue, { deadLetterQueue: this.fulfilQueue.deadLetterQueue }),
      ],
    });
    this.reaperSchedule = new Rule(this, 'ReaperSchedule', {
      description: 'Runs the metastatic reaper',
      schedule: Schedule.rate(props.reaperRate ?? Duration.minutes(1)),
      targets: [new LambdaFunction(this.reaperFunction.function)],
    });

    for (const fn of functions) {
      this.table.grantReadWriteData(fn.function);
      this.eventBus.grantPutEventsTo(fn.function);
    }
    // Every function may launch: the fulfil and reaper functions move nodes off failed backing nodes
    // onto new ones; the reaper and fulfil functions terminate; all of them describe.
    for (const fn of functions) {
      this.launcher.grantTo(fn.role);
      // Not invoked before it can launch (the event source mappings start as soon as they exist).
      fn.function.node.addDependency(this.launcher.policy);
    }

    this.alarms = [
      this.requestQueue.deadLetterAlarm,
      this.fulfilQueue.deadLetterAlarm,
      this.addAlarm('LaunchFailedAlarm', alarmAction, {
        alarmDescription:
          'metastatic: backing-node launches failed in the last 5 minutes (LaunchFailed > 0).',
        metric: new Metric({
          namespace: METRICS_NAMESPACE,
          metricName: 'LaunchFailed',
          dimensionsMap: { service: POWERTOOLS_SERVICE_NAME, pool: this.poolId },
          statistic: Stats.SUM,
          period: Duration.minutes(5),
        }),
        threshold: 0,
      }),
      // A request waiting for capacity comes back every visibility timeout (3 minutes) and reports its
      // age each time, so every 5-minute period of a wait has a data point.
      this.addAlarm('RequestsWaitingAlarm', alarmAction, {
        alarmDescription:
          'metastatic: a request has waited more than 15 minutes for capacity (CapacityWait).',
        metric: new Metric({
          namespace: METRICS_NAMESPACE,
          metricName: 'CapacityWait',
          dimensionsMap: { service: POWERTOOLS_SERVICE_NAME, pool: this.poolId },
          statistic: Stats.MAXIMUM,
          period: Duration.minutes(5),
        }),
        threshold: Duration.minutes(15).toMilliseconds(),
      }),
      // SQS leaves messages received three times or more out of this metric: it sees requests nobody
      // receives (the request function failing before it reads them), not requests that wait.
      this.addAlarm('RequestQueueStalledAlarm', alarmAction, {
        alarmDescription:
          'metastatic: a message has sat in the request queue for more than 15 minutes without being received.',
        metric: this.requestQueue.queue.metricApproximateAgeOfOldestMessage({
          statistic: Stats.MAXIMUM,
          period: Duration.minutes(1),
        }),
        threshold: Duration.minutes(15).toSeconds(),
      }),
      this.addAlarm('ReaperErrorsAlarm', alarmAction, {
        alarmDescription: 'metastatic: the reaper failed in 5 consecutive minutes.',
        metric: this.reaperFunction.function.metricErrors({
          statistic: Stats.SUM,
          period: Duration.minutes(1),
        }),
        threshold: 0,
        evaluationPeriods: 5,
      }),
    ];

    this.acknowledgeFindings();
  }

  private addAlarm(
    id: string,
    action: IAlarmAction | undefined,
    props: { alarmDescription: string; metric: Metric; threshold: number; evaluationPeriods?: number },
  ): Alarm {
    const alarm = new Alarm(this, id, {
      ...props,
      evaluationPeriods: props.evaluationPeriods ?? 1,
      comparisonOperator: ComparisonOperator.GREATER_THAN_THRESHOLD,
      treatMissingData: TreatMissingData.NOT_BREACHING,
    });
    if (action) alarm.addAlarmAction(action);
    return alarm;
  }

  /**
   * The pools must launch in the stack's region: EC2 state-change events reach EventBridge only there.
   * Checked at synth when the stack has a region, and by a CloudFormation rule at deploy time otherwise.
   */
  private checkRegion(region: string): void {
    const stack = Stack.of(this);
    if (!Token.isUnresolved(stack.region)) {
      if (stack.region !== region) {
        throw new Error(
          `the aws pools launch in ${region} but the stack deploys to ${stack.region}: EC2 state-change ` +
            "events reach EventBridge only in the instance's region, so deploy the stack there",
        );
      }
      return;
    }
    new CfnRule(this, 'RegionMatchesConfig', {
      assertions: [
        {
          assert: Fn.conditionEquals(Aws.REGION, region),
          assertDescription: `The aws pools of this metastatic configuration launch in ${region}; deploy the stack to ${region}.`,
        },
      ],
    });
  }

  /** cdk-nag findings that do not apply, each on the one resource it is about, with the reason. */
  private acknowledgeFindings(): void {
    const sqsConsumers: Array<[PoolFunction, QueueWithDlq]> = [
      [this.requestFunction, this.requestQueue],
      [this.fulfilFunction, this.fulfilQueue],
    ];
    for (const [fn, queue] of sqsConsumers) {
      Validations.of(cfnResource(fn.function)).acknowledge({
        id: 'Serverless-LambdaDLQ',
        reason:
          'Invoked synchronously by an SQS event source mapping; a function DLQ applies only to asynchronous ' +
          "invocations. Failed messages go to the source queue's dead-letter queue.",
      });
      const mappings = fn.function.node.children.filter((c) => c.node.id.startsWith('SqsEventSource'));
      if (mappings.length === 0) throw new Error(`${fn.node.path}: no SQS event source mapping found`);
      const [mapping, deadLetterMapping] = mappings;
      Validations.of(cfnResource(mapping as IConstruct)).acknowledge({
        id: 'Serverless-LambdaEventSourceMappingDestination',
        reason:
          'SQS event source mappings support no on-failure destination; the queue redrives a message to its ' +
          `dead-letter queue after ${queue.maxReceiveCount} receives.`,
      });
      if (deadLetterMapping) {
        Validations.of(cfnResource(deadLetterMapping)).acknowledge({
          id: 'Serverless-LambdaEventSourceMappingDestination',
          reason:
            'The dead-letter queue is the last stop: a message the function cannot handle there stays in it ' +
            '(its DeadLetterAlarm fires) and comes back until its retention ends.',
        });
      }
    }
    Validations.of(cfnResource(this.reaperFunction.function)).acknowledge({
      id: 'Serverless-LambdaDLQ',
      reason:
        'The reaper is idempotent and runs on a schedule: a failed run is superseded by the next one, and ' +
        'repeated failures raise ReaperErrorsAlarm.',
    });
    Validations.of(cfnResource(this.reaperSchedule)).acknowledge({
      id: 'Serverless-EventBusDLQ',
      reason:
        'A schedule tick that cannot be delivered is superseded by the next one; there is nothing to replay.',
    });
  }
}

/** Tag values: up to 256 characters of letters, digits, spaces and _ . : / = + - @. */
function checkPoolId(poolId: string): void {
  if (Token.isUnresolved(poolId)) return;
  if (poolId.length === 0 || poolId.length > 256 || !/^[\p{L}\p{N}\p{Z}_.:/=+\-@]+$/u.test(poolId)) {
    throw new Error(
      `poolId must be a valid tag value (1-256 letters, digits, spaces and _ . : / = + - @), got ${JSON.stringify(poolId)}`,
    );
  }
}

/** Lambda rejects an environment over 4 KB at deploy time; say so at synth, with the sizes. */
function checkedEnvironment(env: Record<string, string>): Record<string, string> {
  let size = 0;
  for (const [key, value] of Object.entries(env)) {
    size += Buffer.byteLength(key) + (Token.isUnresolved(value) ? TOKEN_ALLOWANCE : Buffer.byteLength(value));
  }
  // NODE_OPTIONS, added by PoolFunction.
  size += Buffer.byteLength('NODE_OPTIONS--enable-source-maps');
  if (size > LAMBDA_ENVIRONMENT_LIMIT) {
    const config = Buffer.byteLength(env.METASTATIC_CONFIG ?? '');
    throw new Error(
      `the function environment would take about ${size} bytes (the configuration ${config} of them); ` +
        `Lambda allows ${LAMBDA_ENVIRONMENT_LIMIT}. Shorten the configuration (comments count too).`,
    );
  }
  return env;
}
