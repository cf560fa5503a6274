import type { Alarm, Dashboard, IAlarmAction } from 'aws-cdk-lib/aws-cloudwatch';
import { SnsAction } from 'aws-cdk-lib/aws-cloudwatch-actions';
import { type ISecurityGroup, SecurityGroup } from 'aws-cdk-lib/aws-ec2';
import { EventBus, type EventPattern, type IEventBus, Rule, Schedule } from 'aws-cdk-lib/aws-events';
import { LambdaFunction } from 'aws-cdk-lib/aws-events-targets';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { Annotations, Aws, CfnOutput, CfnRule, Duration, Fn, Names, Stack, Token } from 'aws-cdk-lib/core';
import { Construct } from 'constructs';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import { FUNCTION_CONFIG_FILE } from '../shared/runtime/functionConfig.ts';
import { STACK_OUTPUTS } from '../shared/runtime/stackOutputs.ts';
import { admitEventBridgeToKey, QueueTarget } from './fulfilQueueTarget.ts';
import { awsLabels, LauncherPermissions } from './launcherPermissions.ts';
import { poolAlarms } from './poolAlarms.ts';
import { poolDashboard } from './poolDashboard.ts';
import { acknowledgeFindings } from './poolFindings.ts';
import { PoolFunction } from './poolFunction.ts';
import { PoolGithub } from './poolGithub.ts';
import {
  checkMaxConcurrency,
  checkPoolId,
  clampDuration,
  EC2_DETAIL_TYPES,
  EC2_EVENT_STATES,
  FULFIL_MAX_CONCURRENCY,
  LEASE_MAX_CONCURRENCY,
  METRICS_NAMESPACE,
  type MetastaticPoolProps,
  POWERTOOLS_SERVICE_NAME,
  REQUEST_MAX_CONCURRENCY,
  REQUEST_MAX_RECEIVE_COUNT,
} from './poolProps.ts';
import { poolQueues } from './poolQueues.ts';
import { PoolTable } from './poolTable.ts';
import type { QueueWithDlq } from './queueWithDlq.ts';

/**
 * A metastatic pool on AWS: the table, the request and fulfil queues with their dead-letter queues,
 * the request, fulfil and reaper functions, the EventBridge rules that feed them, the EC2 permissions
 * bound to the pool's tag, and the alarms an operator needs; with an enabled `github` section, the
 * github function and what it needs (lib/poolGithub.ts).
 */
export class MetastaticPool extends Construct {
  readonly config: ResolvedConfig;
  readonly poolId: string;
  readonly table: PoolTable;
  readonly requestQueue: QueueWithDlq;
  readonly fulfilQueue: QueueWithDlq;
  /** Lease renewals (`renew` messages), consumed by the request function beside its request queue. */
  readonly leaseQueue: QueueWithDlq;
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
  /** The pool's CloudWatch dashboard (undefined with `dashboard: false`). */
  readonly dashboard: Dashboard | undefined;
  /** The functions' security groups when they run in a VPC (empty otherwise): admit these on the instances. */
  readonly functionsSecurityGroups: readonly ISecurityGroup[];
  /** GitHub Actions jobs in packed slots: only with an enabled `github` section (lib/poolGithub.ts). */
  readonly github: PoolGithub | undefined;
  readonly githubFunction: PoolFunction | undefined;
  readonly githubQueue: QueueWithDlq | undefined;
  /** The github function's URL: the GitHub App's webhook URL. */
  readonly githubWebhookUrl: string | undefined;
  /** The stack outputs the CLI reads, and the github ones, by key (empty with `stackOutputs: false`). */
  readonly outputs: Readonly<Record<string, CfnOutput>>;

  constructor(scope: Construct, id: string, props: MetastaticPoolProps) {
    super(scope, id);
    // Where the functions run decides which settings can work (shared/providers/aws/networkRules.ts).
    this.config = parseConfigOrThrow(props.config, props.configName ?? 'config', {
      functionsInVpc: props.vpc !== undefined,
    });
    for (const n of this.config.notices) {
      Annotations.of(this).addWarningV2('metastatic:config-notice', `${n.path}: ${n.message}`);
    }
    const local = this.config.backingPools.filter((p) => p.driver !== 'aws').map((p) => p.key);
    if (local.length > 0) {
      throw new Error(
        `backing pool(s) ${local.join(', ')} use driver local, which runs only in the embedded pool ` +
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
    const leaseMaxConcurrency = checkMaxConcurrency(
      'leaseMaxConcurrency',
      props.leaseMaxConcurrency ?? LEASE_MAX_CONCURRENCY,
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

    ({
      requestQueue: this.requestQueue,
      leaseQueue: this.leaseQueue,
      fulfilQueue: this.fulfilQueue,
    } = poolQueues(this, {
      requestFunction: this.requestFunction,
      fulfilFunction: this.fulfilFunction,
      encryptionKey: props.encryptionKey,
      alarmAction,
      maxConcurrency: {
        request: requestMaxConcurrency,
        lease: leaseMaxConcurrency,
        fulfil: fulfilMaxConcurrency,
      },
    }));

    // AWS service events reach only the account's default bus, whatever bus the pool publishes to.
    // They carry no instance tags, so these rules forward the EC2 events of every instance in the
    // region (state changes only in the states the fulfil function acts on); the fulfil function keeps
    // only the pool's instances. Two rules rather than one "$or" pattern: each is a plain pattern.
    // An event EventBridge cannot deliver lands in the fulfil dead-letter queue, next to the events the
    // fulfil function gave up on: one place to look and redrive. The target grants EventBridge each
    // queue for its rule only (aws:SourceArn), whatever the app's feature flags (fulfilQueueTarget.ts).
    const toFulfilQueue = () => new QueueTarget(this.fulfilQueue.queue, this.fulfilQueue.deadLetterQueue);
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
    if (props.encryptionKey) this.admitEventBridge(props.encryptionKey);

    this.github = this.config.github?.enabled
      ? new PoolGithub(this, 'Github', {
          settings: this.config.github,
          poolId: this.poolId,
          region: this.launcher.resources.region,
          functionDefaults,
          environment: common,
          table: this.table,
          eventBus: this.eventBus,
          requestQueue: this.requestQueue,
          encryptionKey: props.encryptionKey,
          alarmAction,
          instanceRoles: props.instanceRoles,
          instanceProfiles:
            this.launcher.resources.labelsWithProfile.length > 0 || this.launcher.resources.launchTemplate,
        })
      : undefined;
    this.githubFunction = this.github?.function;
    this.githubQueue = this.github?.queue;
    this.githubWebhookUrl = this.github?.functionUrl.url;

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

    this.alarms = poolAlarms(this, {
      poolId: this.poolId,
      reaperRate,
      alarmAction,
      requestQueue: this.requestQueue,
      leaseQueue: this.leaseQueue,
      fulfilQueue: this.fulfilQueue,
      reaperFunction: this.reaperFunction,
      ec2Rules: [this.ec2EventsRule, this.spotInterruptionsRule],
    });
    this.dashboard =
      props.dashboard === false
        ? undefined
        : poolDashboard(this, {
            poolId: this.poolId,
            requestQueue: this.requestQueue,
            fulfilQueue: this.fulfilQueue,
            reaperFunction: this.reaperFunction,
            alarms: this.alarms,
          });

    this.outputs = props.stackOutputs === false ? {} : this.publishOutputs();

    acknowledgeFindings(this);
  }

  /**
   * What `metastatic --stack NAME` and the client library read from the stack (client/stack.ts), as
   * outputs with fixed keys: the construct makes them, so any stack that embeds it can be read, not
   * only MetastaticStack. Their logical ids are the keys themselves (not derived from the construct's
   * path), so a stack can hold only one pool that publishes them: a second one is refused here, by name,
   * rather than by CloudFormation's duplicate-key error.
   */
  private publishOutputs(): Record<string, CfnOutput> {
    const stack = Stack.of(this);
    const other = stack.node
      .findAll()
      .find((c) => c !== this && c instanceof MetastaticPool && Object.keys(c.outputs ?? {}).length > 0);
    if (other) {
      throw new Error(
        `stack ${stack.stackName} already has a MetastaticPool that publishes the stack outputs the CLI reads ` +
          `(${other.node.path}): give ${this.node.path} stackOutputs: false, or put it in a stack of its own`,
      );
    }
    const values: Array<[string, string, string | undefined]> = [
      [
        STACK_OUTPUTS.requestQueueUrl,
        this.requestQueue.queue.queueUrl,
        'Send request and release messages here',
      ],
      [
        STACK_OUTPUTS.leaseQueueUrl,
        this.leaseQueue.queue.queueUrl,
        'Send lease renewals (renew messages) here',
      ],
      [STACK_OUTPUTS.fulfilQueueUrl, this.fulfilQueue.queue.queueUrl, undefined],
      [STACK_OUTPUTS.tableName, this.table.tableName, undefined],
      [
        STACK_OUTPUTS.eventBusName,
        this.eventBus.eventBusName,
        'The pool publishes its events (source "metastatic") here',
      ],
      [STACK_OUTPUTS.poolId, this.poolId, 'Value of the metastatic:pool tag on the pool instances'],
      ...(this.github?.outputValues() ?? []),
    ];
    return Object.fromEntries(
      values.map(([key, value, description]) => {
        const output = new CfnOutput(this, key, { value, ...(description ? { description } : {}) });
        output.overrideLogicalId(key);
        return [key, output];
      }),
    );
  }

  /**
   * EventBridge sends to an SQS queue encrypted with a customer-managed key only if the key policy lets
   * events.amazonaws.com use the key; without it every EC2 event fails, silently but for
   * Ec2EventsDeliveryAlarm. A key this app creates gets the statement (for events of this account:
   * fulfilQueueTarget.ts). An imported key's policy cannot be changed from here: say what to add.
   */
  private admitEventBridge(key: IKey): void {
    if (admitEventBridgeToKey(this, key)) return;
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
}
