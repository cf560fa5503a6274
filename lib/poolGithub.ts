import {
  Alarm,
  ComparisonOperator,
  type IAlarmAction,
  Stats,
  TreatMissingData,
} from 'aws-cdk-lib/aws-cloudwatch';
import { type IEventBus, Rule, Schedule } from 'aws-cdk-lib/aws-events';
import { LambdaFunction } from 'aws-cdk-lib/aws-events-targets';
import { type IRole, ManagedPolicy, Policy, PolicyStatement, Role } from 'aws-cdk-lib/aws-iam';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { type FunctionUrl, FunctionUrlAuthType, InvokeMode } from 'aws-cdk-lib/aws-lambda';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import { Secret } from 'aws-cdk-lib/aws-secretsmanager';
import { Annotations, Aws, Duration, Token } from 'aws-cdk-lib/core';
import { Construct } from 'constructs';
import type { GithubSettings } from '../shared/core/model.ts';
import { POOL_EVENT_SOURCE, PoolEventType } from '../shared/core/observability.ts';
import { QueueTarget } from './fulfilQueueTarget.ts';
import { POOL_TAG_KEY } from './launcherPermissions.ts';
import { PoolFunction, type PoolFunctionProps } from './poolFunction.ts';
import { acknowledgeGithubFindings } from './poolGithubFindings.ts';
import {
  clampDuration,
  GITHUB_FUNCTION_TIMEOUT_SECONDS,
  GITHUB_MAX_CONCURRENCY,
  GITHUB_MAX_RECEIVE_COUNT,
  GITHUB_RUN_DOCUMENT,
  SSM_FINAL_STATUSES,
} from './poolProps.ts';
import type { PoolTable } from './poolTable.ts';
import { QueueWithDlq } from './queueWithDlq.ts';

/** The ids of the requests the github function makes (`github-job-<job id>`): the pool events it acts on. */
export const GITHUB_REQUEST_PREFIX = 'github-job-';

export interface PoolGithubProps {
  /** The configuration's `github` section (enabled). */
  readonly settings: GithubSettings;
  readonly poolId: string;
  /** The region of the pools' instances (the stack's: MetastaticPool checks they agree). */
  readonly region: string;
  /** What every pool function is made with: the configuration file, the network, log retention. */
  readonly functionDefaults: Omit<PoolFunctionProps, 'name'>;
  /** The variables every pool function gets. */
  readonly environment: Readonly<Record<string, string>>;
  readonly table: PoolTable;
  readonly eventBus: IEventBus;
  /** Where the github function sends request, cancel, release and renew messages. */
  readonly requestQueue: QueueWithDlq;
  readonly encryptionKey?: IKey | undefined;
  readonly alarmAction?: IAlarmAction | undefined;
  /** The backing instances' roles (MetastaticPoolProps.instanceRoles): given the runner instance policy. */
  readonly instanceRoles?: readonly string[] | undefined;
  /** Some aws label launches with an instance profile (or from a launch template, which may have one). */
  readonly instanceProfiles: boolean;
}

/**
 * GitHub Actions jobs in packed slots, on AWS (docs/github.md): the github function behind a function
 * URL (GitHub's `workflow_job` webhooks, checked against the webhook secret by the function itself), the
 * two secrets it reads (the webhook secret, the App's private key), the github queue that brings it the
 * pool's `Request Fulfilled` events of its own requests and SSM's command status changes, its reconcile
 * schedule, and the policy the backing instances need to fetch a runner's JIT configuration.
 */
export class PoolGithub extends Construct {
  readonly function: PoolFunction;
  readonly functionUrl: FunctionUrl;
  readonly queue: QueueWithDlq;
  /** Generated; copied into the GitHub App's webhook settings. Two lines (old, new) while rotating. */
  readonly webhookSecret: Secret;
  /** The App's private key (PEM), put by the user; created with a random placeholder. */
  readonly appPrivateKey: Secret;
  /** `/metastatic/<pool id>/github/jit`: where the function puts each runner's JIT configuration. */
  readonly jitParameterPath: string;
  /** What the github function may do besides the table and the bus (SSM, the secrets, the request queue). */
  readonly permissions: Policy;
  /** What a backing instance needs to run a runner: read and delete its JIT configuration parameter. */
  readonly runnerInstancePolicy: ManagedPolicy;
  /**
   * The pool's events of `github-job-` requests the function acts on, to the github queue: `Request
   * Fulfilled` (a runner is started on the node), `Node Released` (a runner still running is stopped).
   */
  readonly poolEventsRule: Rule;
  /** SSM Run Command invocations that ended (a runner exited), from the default bus, to the github queue. */
  readonly commandStatusRule: Rule;
  /** Runs the function every `reconcile-interval` (rounded up to minutes): lost webhooks are redelivered. */
  readonly reconcileSchedule: Rule;
  /** The function failed in three 5-minute periods in a row. */
  readonly errorsAlarm: Alarm;

  constructor(scope: Construct, id: string, props: PoolGithubProps) {
    super(scope, id);
    checkParameterSegment(props.poolId);
    const key = props.encryptionKey;
    const encryption = key ? { encryptionKey: key } : {};
    this.jitParameterPath = `/metastatic/${props.poolId}/github/jit`;
    const parameters = `arn:${Aws.PARTITION}:ssm:${props.region}:${Aws.ACCOUNT_ID}:parameter${this.jitParameterPath}/*`;

    this.webhookSecret = new Secret(this, 'WebhookSecret', {
      description:
        `metastatic pool ${props.poolId}: the GitHub App's webhook secret (generated). Copy it into the ` +
        "App's webhook settings. To rotate it: put two lines, the old secret then the new one, set the new " +
        'one in the App, then put the new one alone.',
      generateSecretString: { excludePunctuation: true, passwordLength: 40 },
      ...encryption,
    });
    this.appPrivateKey = new Secret(this, 'AppPrivateKey', {
      description:
        `metastatic pool ${props.poolId}: the GitHub App's private key (PEM). Created with a random ` +
        'placeholder: put the key with aws secretsmanager put-secret-value --secret-id <this ARN> ' +
        '--secret-string file://<the .pem GitHub gave>.',
      generateSecretString: { excludePunctuation: true, passwordLength: 32 },
      ...encryption,
    });

    // Invoked asynchronously by its schedule too: a reconcile run that failed or waited a whole period is
    // superseded by the next one, as the reaper's (metastaticPool.ts).
    const rate = Duration.minutes(Math.max(1, Math.ceil(props.settings.reconcileInterval / 60)));
    const eventAge = clampDuration(rate, Duration.minutes(1), Duration.hours(6));
    this.function = new PoolFunction(this, 'Function', {
      ...props.functionDefaults,
      name: 'github',
      timeout: Duration.seconds(GITHUB_FUNCTION_TIMEOUT_SECONDS),
      retryAttempts: 0,
      maxEventAge: eventAge,
      environment: {
        ...props.environment,
        REQUEST_QUEUE_URL: props.requestQueue.queue.queueUrl,
        GITHUB_WEBHOOK_SECRET_ARN: this.webhookSecret.secretArn,
        GITHUB_APP_KEY_SECRET_ARN: this.appPrivateKey.secretArn,
        GITHUB_JIT_PARAMETER_PATH: this.jitParameterPath,
        // Its containers space their GitHub writes for each other (shared/github/githubApi.ts).
        GITHUB_MAX_CONCURRENCY: String(GITHUB_MAX_CONCURRENCY),
      },
    });
    const fn = this.function.function;
    // GitHub cannot sign an AWS request: the function checks X-Hub-Signature-256 (HMAC of the raw body
    // with the webhook secret) before it acts on a delivery.
    this.functionUrl = fn.addFunctionUrl({
      authType: FunctionUrlAuthType.NONE,
      invokeMode: InvokeMode.BUFFERED,
    });

    this.queue = new QueueWithDlq(this, 'Queue', {
      description: 'metastatic github queue (github-job- requests fulfilled, SSM runner commands ended)',
      maxReceiveCount: GITHUB_MAX_RECEIVE_COUNT,
      consumerTimeout: this.function.timeout,
      ...encryption,
      ...(props.alarmAction ? { alarmAction: props.alarmAction } : {}),
    });
    fn.addEventSource(
      new SqsEventSource(this.queue.queue, {
        batchSize: 10,
        reportBatchItemFailures: true,
        maxConcurrency: GITHUB_MAX_CONCURRENCY,
      }),
    );
    const toQueue = () => new QueueTarget(this.queue.queue, this.queue.deadLetterQueue);
    this.poolEventsRule = new Rule(this, 'PoolEventsRule', {
      description:
        'metastatic github-job- requests fulfilled (a runner is started) and their nodes released (a runner still running is stopped), to the github queue',
      eventBus: props.eventBus,
      eventPattern: {
        source: [POOL_EVENT_SOURCE],
        detailType: [PoolEventType.requestFulfilled, PoolEventType.nodeReleased],
        detail: { requestId: [{ prefix: GITHUB_REQUEST_PREFIX }] },
      },
      targets: [toQueue()],
    });
    // AWS service events reach only the account's default bus, whatever bus the pool publishes to. The
    // function keeps only the commands it started (their ids are in its table).
    this.commandStatusRule = new Rule(this, 'CommandStatusRule', {
      description: `SSM ${GITHUB_RUN_DOCUMENT} invocations that ended, to the metastatic github queue (a runner exited)`,
      eventPattern: {
        source: ['aws.ssm'],
        detailType: ['EC2 Command Invocation Status-change Notification'],
        detail: { 'document-name': [GITHUB_RUN_DOCUMENT], status: [...SSM_FINAL_STATUSES] },
      },
      targets: [toQueue()],
    });
    this.reconcileSchedule = new Rule(this, 'ReconcileSchedule', {
      description: 'Runs the metastatic github function: lost webhooks are redelivered',
      schedule: Schedule.rate(rate),
      targets: [new LambdaFunction(fn, { maxEventAge: eventAge })],
    });

    props.table.grantReadWriteData(fn);
    props.eventBus.grantPutEventsTo(fn);
    this.permissions = new Policy(this, 'Permissions', {
      statements: functionStatements({
        region: props.region,
        poolId: props.poolId,
        parameters,
        requestQueueArn: props.requestQueue.queue.queueArn,
        secretArns: [this.webhookSecret.secretArn, this.appPrivateKey.secretArn],
        key,
      }),
    });
    this.permissions.attachToRole(this.function.role);
    // SendMessage to an encrypted request queue: SQS encrypts for the sender (as letSendBack's).
    key?.grant(fn, 'kms:GenerateDataKey');
    // Not invoked (its mapping starts as soon as it exists, the URL as soon as it is out) before it may act.
    fn.node.addDependency(this.permissions);

    this.runnerInstancePolicy = new ManagedPolicy(this, 'RunnerInstancePolicy', {
      description:
        `metastatic pool ${props.poolId}: what a backing instance needs to run a GitHub runner (its JIT ` +
        "configuration from SSM Parameter Store). Its role needs AWS's AmazonSSMManagedInstanceCore too.",
      statements: [
        new PolicyStatement({
          sid: 'ReadRunnerJitConfig',
          actions: ['ssm:GetParameter', 'ssm:DeleteParameter'],
          resources: [parameters],
        }),
      ],
      roles: instanceRoles(this, props.instanceRoles ?? []),
    });

    // Its errors: a webhook answered 5xx (GitHub then marks the delivery failed), a runner not started,
    // a schedule that cannot read the App's key (the stack's placeholder still in its secret). Three
    // periods of 5 minutes in a row: one failing call among many is retried or redelivered anyway.
    this.errorsAlarm = new Alarm(this, 'ErrorsAlarm', {
      alarmDescription:
        `metastatic pool ${props.poolId}: the github function failed in 3 consecutive 5-minute periods ` +
        "(its logs say why; a schedule failing with 'holds no PEM private key' waits for the App's key in its secret).",
      metric: fn.metricErrors({ statistic: Stats.SUM, period: Duration.minutes(5) }),
      threshold: 0,
      evaluationPeriods: 3,
      comparisonOperator: ComparisonOperator.GREATER_THAN_THRESHOLD,
      treatMissingData: TreatMissingData.NOT_BREACHING,
    });
    if (props.alarmAction) this.errorsAlarm.addAlarmAction(props.alarmAction);

    acknowledgeGithubFindings(this, props.region);
    if (!props.instanceProfiles) {
      Annotations.of(this).addWarningV2(
        'metastatic:github-instance-profile',
        'no aws label has an iam-instance-profile (or a launch template): a runner is started by SSM Run ' +
          "Command, whose agent needs an instance role with AWS's AmazonSSMManagedInstanceCore and this " +
          "pool's GithubRunnerInstancePolicy (name the role in instanceRoles to attach the latter)",
      );
    }
  }

  /** The stack outputs of the github resources: key, value, description (MetastaticPool publishes them). */
  outputValues(): Array<[string, string, string]> {
    return [
      [
        'GithubWebhookUrl',
        this.functionUrl.url,
        "The GitHub App's webhook URL (content type application/json, event Workflow job)",
      ],
      [
        'GithubWebhookSecretArn',
        this.webhookSecret.secretArn,
        "The webhook secret (generated): copy its value into the GitHub App's webhook settings",
      ],
      [
        'GithubAppKeySecretArn',
        this.appPrivateKey.secretArn,
        "Put the GitHub App's private key (PEM) here: aws secretsmanager put-secret-value --secret-id <arn> --secret-string file://key.pem",
      ],
      [
        'GithubRunnerInstancePolicyArn',
        this.runnerInstancePolicy.managedPolicyArn,
        "For the backing instances' role (attached to instanceRoles), which also needs AWS's AmazonSSMManagedInstanceCore (attach it yourself)",
      ],
    ];
  }
}

interface StatementsProps {
  readonly region: string;
  readonly poolId: string;
  /** The ARN pattern of the JIT configuration parameters. */
  readonly parameters: string;
  readonly requestQueueArn: string;
  readonly secretArns: readonly string[];
  readonly key: IKey | undefined;
}

function functionStatements(o: StatementsProps): PolicyStatement[] {
  return [
    new PolicyStatement({
      sid: 'SendToRequestQueue',
      actions: ['sqs:SendMessage'],
      resources: [o.requestQueueArn],
    }),
    new PolicyStatement({
      sid: 'ReadGithubSecrets',
      actions: ['secretsmanager:GetSecretValue'],
      resources: [...o.secretArns],
    }),
    ...(o.key
      ? [
          new PolicyStatement({
            sid: 'DecryptGithubSecrets',
            actions: ['kms:Decrypt'],
            resources: [o.key.keyArn],
            conditions: { StringEquals: { 'kms:ViaService': `secretsmanager.${o.region}.amazonaws.com` } },
          }),
        ]
      : []),
    // A runner's JIT configuration: put before its command is sent, deleted once it ended (the instance
    // deletes it as soon as it read it).
    new PolicyStatement({
      sid: 'RunnerJitConfig',
      actions: ['ssm:PutParameter', 'ssm:DeleteParameter'],
      resources: [o.parameters],
    }),
    new PolicyStatement({
      sid: 'RunShellScript',
      actions: ['ssm:SendCommand'],
      resources: [`arn:${Aws.PARTITION}:ssm:${o.region}::document/${GITHUB_RUN_DOCUMENT}`],
    }),
    // Only on the pool's instances. SSM's own tag key, as AWS's Run Command guide restricts by tag
    // ("Restricting Run Command access based on tags"): SSM documents that a policy conditioning
    // SendCommand on a global key (aws:ResourceTag is one) needs an extra aws:ViaAWSService statement.
    new PolicyStatement({
      sid: 'RunOnPoolInstances',
      actions: ['ssm:SendCommand'],
      resources: [`arn:${Aws.PARTITION}:ec2:${o.region}:${Aws.ACCOUNT_ID}:instance/*`],
      conditions: { StringEquals: { [`ssm:resourceTag/${POOL_TAG_KEY}`]: o.poolId } },
    }),
    // Stop a runner whose node was released under it (CancelCommand takes no resource-level condition
    // the function could use: a command id is known only once sent).
    new PolicyStatement({
      sid: 'CommandInvocations',
      actions: ['ssm:CancelCommand'],
      resources: ['*'],
    }),
  ];
}

/** Role names (this account) or role ARNs, as roles to attach a managed policy to (by name). */
function instanceRoles(scope: Construct, roles: readonly string[]): IRole[] {
  return roles.map((role, i) =>
    role.startsWith('arn:')
      ? Role.fromRoleArn(scope, `InstanceRole${i}`, role, { mutable: false })
      : Role.fromRoleName(scope, `InstanceRole${i}`, role),
  );
}

/**
 * The pool id is a segment of the JIT parameters' names (`/metastatic/<pool id>/github/jit/...`): SSM
 * takes letters, digits and `_ . -` there (a tag value may also hold spaces and `: / = + @`).
 */
function checkParameterSegment(poolId: string): void {
  if (Token.isUnresolved(poolId)) return;
  if (!/^[A-Za-z0-9_.-]{1,200}$/.test(poolId)) {
    throw new Error(
      `poolId ${JSON.stringify(poolId)} cannot name SSM parameters (/metastatic/<pool id>/github/jit/...): ` +
        'with a github section, give a pool id of letters, digits and _ . - (at most 200)',
    );
  }
}
