import {
  Annotations,
  Aws,
  CfnRule,
  Duration,
  Fn,
  Names,
  Resource,
  Stack,
  Token,
  Validations,
} from 'aws-cdk-lib';
import {
  Alarm,
  ComparisonOperator,
  type IAlarmAction,
  type IMetric,
  MathExpression,
  Metric,
  Stats,
  TreatMissingData,
} from 'aws-cdk-lib/aws-cloudwatch';
import { SnsAction } from 'aws-cdk-lib/aws-cloudwatch-actions';
import { type ISecurityGroup, type IVpc, SecurityGroup, type SubnetSelection } from 'aws-cdk-lib/aws-ec2';
import { EventBus, type EventPattern, type IEventBus, Rule, Schedule } from 'aws-cdk-lib/aws-events';
import { LambdaFunction, SqsQueue } from 'aws-cdk-lib/aws-events-targets';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import type { RetentionDays } from 'aws-cdk-lib/aws-logs';
import type { ITopic } from 'aws-cdk-lib/aws-sns';
import { Construct, type IConstruct } from 'constructs';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import type { ResolvedConfig } from '../shared/config/model.ts';
import type { InstanceState } from '../shared/core/events.ts';
import { FUNCTION_CONFIG_FILE } from '../shared/runtime/functionConfig.ts';
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
/** The EventBridge detail types the fulfil function consumes (state changes, spot interruption warnings). */
export const EC2_DETAIL_TYPES = [
  'EC2 Instance State-change Notification',
  'EC2 Spot Instance Interruption Warning',
] as const;
/**
 * The instance states the fulfil function acts on (shared/usecases/fulfil.ts handleStateChange): running
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
/** The request function's mapping of its dead-letter queue: the least Lambda allows. */
const DEAD_LETTER_MAX_CONCURRENCY = 2;

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
   * The most request-function invocations the request queue's event source mapping runs at once (2 to
   * 1000): messages beyond it wait in the queue rather than in parallel launches and table conflicts.
   * @default REQUEST_MAX_CONCURRENCY (10)
   */
  readonly requestMaxConcurrency?: number;
  /**
   * The most fulfil-function invocations the fulfil queue's event source mapping runs at once (2 to
   * 1000). Each EC2 event of a pool instance costs a DescribeInstances, whose rate EC2 limits per account
   * and region: a burst of events waits in the queue instead of spending the account's budget.
   * @default FULFIL_MAX_CONCURRENCY (5)
   */
  readonly fulfilMaxConcurrency?: number;
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
   * events.amazonaws.com (from CDK's SqsQueue target, for events of this account); for an imported key
   * synth warns, and that statement must be added to its policy by hand.
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
  /** EC2 instance state changes (only the states the fulfil function acts on) to the fulfil queue. */
  readonly ec2EventsRule: Rule;
  /** EC2 spot interruption warnings to the fulfil queue. */
  readonly spotInterruptionsRule: Rule;
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
    // Before the functions (whose bundling takes seconds): the checks of the aws pools, of
    // instanceRoles, ebsKmsKeyArn and the mappings' concurrency fail fast.
    this.launcher = new LauncherPermissions(this, 'Launcher', {
      labels: awsLabels(this.config),
      poolId: this.poolId,
      instanceRoles: props.instanceRoles,
      ebsKmsKeyArn: props.ebsKmsKeyArn,
    });
    this.checkRegion(this.launcher.resources.region);
    const requestMaxConcurrency = checkMaxConcurrency(
      'requestMaxConcurrency',
      props.requestMaxConcurrency ?? REQUEST_MAX_CONCURRENCY,
    );
    const fulfilMaxConcurrency = checkMaxConcurrency(
      'fulfilMaxConcurrency',
      props.fulfilMaxConcurrency ?? FULFIL_MAX_CONCURRENCY,
    );

    this.table = new PoolTable(
      this,
      'Table',
      props.encryptionKey ? { encryptionKey: props.encryptionKey } : {},
    );

    // The configuration is a file in each function's asset (FUNCTION_CONFIG_FILE), not a variable:
    // Lambda allows 4 KB for the whole environment, which PoolFunction checks at synth.
    const common = {
      TABLE_NAME: this.table.tableName,
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
      files: { [FUNCTION_CONFIG_FILE]: props.config },
    };
    this.requestFunction = new PoolFunction(this, 'Request', {
      name: 'request',
      ...functionDefaults,
      environment: { ...common, MAX_RECEIVE_COUNT: String(REQUEST_MAX_RECEIVE_COUNT) },
    });
    this.fulfilFunction = new PoolFunction(this, 'Fulfil', {
      name: 'fulfil',
      ...functionDefaults,
      environment: common,
    });
    // Invoked asynchronously by its schedule. Lambda would retry a failed run twice (the reaper throws
    // when a step failed) and keep a run that could not start for up to 6 hours; the next scheduled run
    // does the same work, so neither is wanted.
    const reaperRate = props.reaperRate ?? Duration.minutes(1);
    const reaperEventAge = clampDuration(reaperRate, Duration.minutes(1), Duration.hours(6));
    this.reaperFunction = new PoolFunction(this, 'Reaper', {
      name: 'reaper',
      ...functionDefaults,
      environment: common,
      retryAttempts: 0,
      maxEventAge: reaperEventAge,
    });
    const functions = [this.requestFunction, this.fulfilFunction, this.reaperFunction];

    const encryption = props.encryptionKey ? { encryptionKey: props.encryptionKey } : {};
    const alarms = alarmAction ? { alarmAction } : {};
    this.requestQueue = new QueueWithDlq(this, 'RequestQueue', {
      description: 'metastatic request queue',
      maxReceiveCount: REQUEST_MAX_RECEIVE_COUNT,
      consumerTimeout: this.requestFunction.timeout,
      // The request function consumes its dead-letter queue, so its alarm counts what arrives there.
      deadLetterQueueConsumed: true,
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
      new SqsEventSource(this.requestQueue.queue, {
        batchSize: 10,
        reportBatchItemFailures: true,
        maxConcurrency: requestMaxConcurrency,
      }),
    );
    this.fulfilFunction.function.addEventSource(
      new SqsEventSource(this.fulfilQueue.queue, {
        reportBatchItemFailures: true,
        maxConcurrency: fulfilMaxConcurrency,
      }),
    );
    // The request function also ends what reaches the request dead-letter queue: a message whose last
    // delivery died before it could fail the request would otherwise leave the request waiting forever.
    this.requestFunction.function.addEnvironment(
      'REQUEST_DLQ_ARN',
      this.requestQueue.deadLetterQueue.queueArn,
    );
    this.requestFunction.function.addEventSource(
      new SqsEventSource(this.requestQueue.deadLetterQueue, {
        batchSize: 10,
        reportBatchItemFailures: true,
        maxConcurrency: DEAD_LETTER_MAX_CONCURRENCY,
      }),
    );

    // AWS service events reach only the account's default bus, whatever bus the pool publishes to.
    // They carry no instance tags, so these rules forward the EC2 events of every instance in the
    // region (state changes only in the states the fulfil function acts on); the fulfil function keeps
    // only the pool's instances. Two rules rather than one "$or" pattern: each is a plain pattern.
    const toFulfilQueue = () =>
      // An event EventBridge cannot deliver lands in the fulfil dead-letter queue, next to the events
      // the fulfil function gave up on: one place to look and redrive.
      new SqsQueue(this.fulfilQueue.queue, { deadLetterQueue: this.fulfilQueue.deadLetterQueue });
    const [stateChange, spotWarning] = EC2_DETAIL_TYPES;
    const ec2Rules: Array<[string, string, EventPattern]> = [
      [
        'Ec2Events',
        `EC2 instance state changes (${EC2_EVENT_STATES.join(', ')}), to the metastatic fulfil queue`,
        { source: ['aws.ec2'], detailType: [stateChange], detail: { state: [...EC2_EVENT_STATES] } },
      ],
      [
        'SpotInterruptions',
        'EC2 spot interruption warnings, to the metastatic fulfil queue',
        { source: ['aws.ec2'], detailType: [spotWarning] },
      ],
    ];
    [this.ec2EventsRule, this.spotInterruptionsRule] = ec2Rules.map(
      ([id, description, eventPattern]) =>
        new Rule(this, id, { description, eventPattern, targets: [toFulfilQueue()] }),
    ) as [Rule, Rule];
    if (props.encryptionKey) this.checkKeyAdmitsEventBridge(props.encryptionKey);

    this.reaperSchedule = new Rule(this, 'ReaperSchedule', {
      description: 'Runs the metastatic reaper',
      schedule: Schedule.rate(reaperRate),
      // A tick EventBridge could not hand to Lambda within one period is superseded by the next.
      targets: [new LambdaFunction(this.reaperFunction.function, { maxEventAge: reaperEventAge })],
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

    const reaperPeriod = clampDuration(reaperRate, Duration.minutes(1), Duration.days(1));
    const reaperRuns = Math.max(
      1,
      Math.min(5, Math.floor(Duration.days(1).toSeconds() / reaperPeriod.toSeconds())),
    );
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
      // One period per scheduled run (a failed run is not retried), so 5 periods are 5 runs in a row;
      // CloudWatch evaluates at most one day, so a slow schedule is judged on fewer runs.
      this.addAlarm('ReaperErrorsAlarm', alarmAction, {
        alarmDescription: `metastatic: the reaper failed in ${reaperRuns} consecutive scheduled runs.`,
        metric: this.reaperFunction.function.metricErrors({
          statistic: Stats.SUM,
          period: reaperPeriod,
        }),
        threshold: 0,
        evaluationPeriods: reaperRuns,
      }),
      // EventBridge could not deliver EC2 events to the fulfil queue, nor to its dead-letter queue (a
      // customer-managed key EventBridge may not use fails both): the pool stops hearing of its instances.
      this.addAlarm('Ec2EventsDeliveryAlarm', alarmAction, {
        alarmDescription:
          'metastatic: EventBridge failed to deliver EC2 events to the fulfil queue (FailedInvocations or ' +
          "InvocationsFailedToBeSentToDlq of the EC2 rules > 0); check the queues' key policy and queue policy.",
        metric: ec2DeliveryFailures([this.ec2EventsRule.ruleName, this.spotInterruptionsRule.ruleName]),
        threshold: 0,
      }),
    ];

    this.acknowledgeFindings();
  }

  private addAlarm(
    id: string,
    action: IAlarmAction | undefined,
    props: { alarmDescription: string; metric: IMetric; threshold: number; evaluationPeriods?: number },
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
   * EventBridge sends to an SQS queue encrypted with a customer-managed key only if the key policy lets
   * events.amazonaws.com use the key (kms:GenerateDataKey to send, kms:Decrypt as AWS documents for SQS
   * targets); without it every EC2 event fails, silently but for Ec2EventsDeliveryAlarm. For a key this
   * app creates, CDK's SqsQueue target adds that statement to the key policy (for events from this
   * account). An imported key's policy cannot be changed from here, and CDK drops the grant without a
   * word: say what to add.
   */
  private checkKeyAdmitsEventBridge(key: IKey): void {
    if (Resource.isOwnedResource(key)) return;
    Annotations.of(this).addWarningV2(
      'metastatic:encryption-key-policy',
      `encryptionKey ${key.node.path} is imported, and this stack cannot change its policy: add a statement ` +
        'that allows principal {"Service": "events.amazonaws.com"} "kms:GenerateDataKey" and "kms:Decrypt" on ' +
        '"*" (condition {"StringEquals": {"aws:SourceAccount": "<this account>"}}). Without it EventBridge ' +
        'cannot deliver EC2 events to the encrypted fulfil queue and the pool never learns that its instances run.',
    );
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
    Validations.of(cfnResource(this.reaperFunction.function.node.findChild('EventInvokeConfig'))).acknowledge(
      {
        id: 'Serverless-LambdaAsyncFailureDestination',
        reason:
          'A failed scheduled reaper run is neither retried nor kept: the next run does the same work, and ' +
          'ReaperErrorsAlarm reports runs that keep failing.',
      },
    );
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

/** An event source mapping's maxConcurrency: Lambda accepts 2 to 1000. */
function checkMaxConcurrency(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 2 || value > 1000) {
    throw new Error(`${name} must be an integer from 2 to 1000 (Lambda's limits), got ${value}`);
  }
  return value;
}

function clampDuration(value: Duration, min: Duration, max: Duration): Duration {
  const seconds = value.toSeconds();
  if (seconds < min.toSeconds()) return min;
  if (seconds > max.toSeconds()) return max;
  return value;
}

/**
 * Failed deliveries of the EC2 rules (AWS/Events, dimension RuleName: the default bus), per 5 minutes:
 * FailedInvocations (failed for good) plus InvocationsFailedToBeSentToDlq (the dead-letter queue refused
 * them too). EventBridge sends these only when they are not zero, hence FILL.
 */
function ec2DeliveryFailures(ruleNames: readonly string[]): IMetric {
  const usingMetrics: Record<string, IMetric> = {};
  const terms: string[] = [];
  ruleNames.forEach((RuleName, i) => {
    for (const [prefix, metricName] of [
      ['failed', 'FailedInvocations'],
      ['lost', 'InvocationsFailedToBeSentToDlq'],
    ] as const) {
      const id = `${prefix}${i}`;
      usingMetrics[id] = new Metric({
        namespace: 'AWS/Events',
        metricName,
        dimensionsMap: { RuleName },
        statistic: Stats.SUM,
        period: Duration.minutes(5),
      });
      terms.push(`FILL(${id}, 0)`);
    }
  });
  return new MathExpression({
    label: 'EC2 events EventBridge failed to deliver',
    expression: terms.join(' + '),
    usingMetrics,
    period: Duration.minutes(5),
  });
}
