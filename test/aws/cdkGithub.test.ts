import { Annotations, Match, Template } from 'aws-cdk-lib/assertions';
import { EventBus } from 'aws-cdk-lib/aws-events';
import { Key } from 'aws-cdk-lib/aws-kms';
import { App, Stack } from 'aws-cdk-lib/core';
import { AwsSolutionsChecks, ServerlessChecks } from 'cdk-nag';
import { beforeAll, describe, expect, it } from 'vitest';
import { MetastaticPool } from '../../lib/metastaticPool.ts';
import {
  GITHUB_FUNCTION_TIMEOUT_SECONDS,
  GITHUB_MAX_CONCURRENCY,
  GITHUB_MAX_RECEIVE_COUNT,
} from '../../lib/poolProps.ts';
import { visibilityTimeoutSeconds } from '../../shared/core/timing.ts';
import { asList, CDK_CONTEXT, dependencyCycle, flatten, TEST_ENV } from '../../testkit/cdkTemplates.ts';

/**
 * The stack side of GitHub Actions jobs in packed slots (lib/poolGithub.ts): what an enabled `github`
 * section adds to the pool, exactly, and that a configuration without one (or with `enabled: false`)
 * adds nothing. One app, synthesized once (no bundling), holds every variant, and cdk-nag checks it.
 */

const ENV = TEST_ENV;

type Json = Record<string, unknown>;
interface Statement {
  readonly Effect: string;
  readonly Action: string | string[];
  readonly Resource: unknown;
  readonly Condition?: Record<string, Record<string, unknown>>;
  readonly Sid?: string;
}

/** One aws pool with a label `big` and the metastatic label `small` on it; `github` is appended as is. */
function config(github = '', label = ''): string {
  return `
providers:
  - name: ec2
    driver: aws
    region: eu-west-1
    pools:
      - name: main
        subnet-id: subnet-11111111
        labels:
          - name: big
            instance-type: m7g.2xlarge
            image-id: ami-1
${label ? `            ${label}\n` : ''}  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
${github}`;
}

/** The smallest github section: its files are read by `metastatic dev` only, never by the stack. */
function githubSection(extra = ''): string {
  return `github:
  app-id: 1
  private-key-file: /dev/null
  webhook-secret-files: [/dev/null]
${extra}  routes:
    - runs-on: [self-hosted, small]
      label: small
`;
}

/** Every grant of a template's policies (inline and managed) as `action resource [condition]`, by role. */
function grantsOf(template: Template, type: 'AWS::IAM::Policy' | 'AWS::IAM::ManagedPolicy') {
  return Object.entries(template.findResources(type)).map(([id, policy]) => {
    const p = (policy as Json).Properties as {
      Roles?: unknown[];
      PolicyDocument: { Statement: Statement[] };
    };
    return {
      id,
      roles: (p.Roles ?? []).map(flatten),
      grants: p.PolicyDocument.Statement.flatMap((st) =>
        asList(st.Action).flatMap((a) =>
          asList(st.Resource).map(
            (r) => `${a} ${flatten(r)}${st.Condition ? ` ${JSON.stringify(st.Condition)}` : ''}`,
          ),
        ),
      ).sort(),
    };
  });
}

function nagViolations(app: App): string[] {
  return [new AwsSolutionsChecks(), new ServerlessChecks()].flatMap((pack) =>
    pack
      .validateScope(app)
      .violations.flatMap((v) =>
        v.violatingResources.map((r) => `${v.severity} ${v.ruleName} at ${r.constructPath}`),
      ),
  );
}

/**
 * A logical id (or a template's text) without its hashes and the stack's name, which some ids hold (an
 * event source mapping's names its queue by path): what the variants have in common.
 */
const unhashed = (text: string) =>
  text
    .replace(/(Base|Disabled|Github|Keyed)Pool/g, 'Pool')
    .replace(/(?<=[a-z])[0-9A-F]{8}([0-9A-F]{8})?(?![0-9A-Za-z])/g, '');

const PARAMETERS =
  'arn:<AWS::Partition>:ssm:eu-west-1:<AWS::AccountId>:parameter/metastatic/gh-pool/github/jit/*';

describe('MetastaticPool with a github section (lib/poolGithub.ts)', () => {
  const app = new App({ context: { ...CDK_CONTEXT, 'aws:cdk:bundling-stacks': [] } });
  const pools: Record<string, MetastaticPool> = {};
  const templates: Record<string, Template> = {};
  let resources: Record<string, Json>;
  const synthMs: Record<string, number> = {};

  beforeAll(() => {
    // Every stack is built before the app is synthesized (once, by the first Template.fromStack).
    const stacks: Record<string, Stack> = {};
    const add = (name: string, build: (stack: Stack) => MetastaticPool) => {
      const started = Date.now();
      stacks[name] = new Stack(app, name, { env: ENV });
      pools[name] = build(stacks[name]);
      synthMs[name] = Date.now() - started;
    };
    add('Base', (s) => new MetastaticPool(s, 'Pool', { config: config(), poolId: 'gh-pool' }));
    add(
      'Disabled',
      (s) =>
        new MetastaticPool(s, 'Pool', {
          config: config(githubSection('  enabled: false\n')),
          poolId: 'gh-pool',
        }),
    );
    add(
      'Github',
      (s) => new MetastaticPool(s, 'Pool', { config: config(githubSection()), poolId: 'gh-pool' }),
    );
    // A customer-managed key, a bus of its own, instance roles (a label with an instance profile), and a
    // reconcile interval that is not a whole number of minutes.
    add(
      'Keyed',
      (s) =>
        new MetastaticPool(s, 'Pool', {
          config: config(
            githubSection('  reconcile-interval: 301\n'),
            'iam-instance-profile: { name: builders }',
          ),
          poolId: 'gh-pool',
          encryptionKey: new Key(s, 'Key', { enableKeyRotation: true }),
          eventBus: new EventBus(s, 'Bus'),
          instanceRoles: ['builder-role', 'arn:aws:iam::123456789012:role/ci/other-role'],
        }),
    );
    const started = Date.now();
    for (const [name, stack] of Object.entries(stacks)) templates[name] = Template.fromStack(stack);
    synthMs.synth = Date.now() - started;
    resources = templates.Github?.toJSON().Resources as Record<string, Json>;
  });

  const template = (name: string): Template => templates[name] as Template;
  const ofType = (type: string, from = resources) => Object.entries(from).filter(([, r]) => r.Type === type);
  const github = (type: string) => ofType(type).filter(([id]) => id.startsWith('PoolGithub'));
  const count = (name: string, type: string) => Object.keys(template(name).findResources(type)).length;

  it('adds nothing without a github section, nor with enabled: false', () => {
    for (const name of ['Base', 'Disabled']) {
      const t = template(name);
      expect({ name, functions: count(name, 'AWS::Lambda::Function') }).toEqual({ name, functions: 3 });
      for (const type of [
        'AWS::Lambda::Url',
        'AWS::SecretsManager::Secret',
        'AWS::IAM::ManagedPolicy',
        'AWS::Lambda::Permission',
      ]) {
        t.resourceCountIs(type, type === 'AWS::Lambda::Permission' ? 1 : 0); // the reaper's schedule
      }
      expect(count(name, 'AWS::Events::Rule')).toBe(3);
      expect(count(name, 'AWS::SQS::Queue')).toBe(6);
      expect(Object.keys(t.toJSON().Outputs).filter((k) => k.startsWith('Github'))).toEqual([]);
      const pool = pools[name] as MetastaticPool;
      expect([pool.github, pool.githubFunction, pool.githubQueue, pool.githubWebhookUrl]).toEqual([
        undefined,
        undefined,
        undefined,
        undefined,
      ]);
    }
    // The same resources but for the configuration file in the functions' assets.
    const types = (name: string) =>
      Object.entries(template(name).toJSON().Resources as Record<string, Json>)
        .map(([id, r]) => `${unhashed(id)} ${r.Type}`)
        .sort();
    expect(types('Disabled')).toEqual(types('Base'));
  });

  it('adds exactly the github resources with one', () => {
    const byId = (name: string) =>
      Object.fromEntries(
        Object.entries(template(name).toJSON().Resources as Record<string, Json>).map(([id, r]) => [
          unhashed(id),
          unhashed(JSON.stringify(r)).replace(/"S3Key":"[0-9a-f]{64}\.zip"/g, ''),
        ]),
      );
    const base = byId('Base');
    const withGithub = byId('Github');
    const added = Object.entries(resources)
      .filter(([id]) => !(unhashed(id) in base))
      .map(([, r]) => r.Type as string)
      .sort();
    expect(added).toEqual(
      [
        'AWS::CloudWatch::Alarm', // the github dead-letter queue's
        'AWS::CloudWatch::Alarm', // the github function's errors
        'AWS::Events::Rule',
        'AWS::Events::Rule',
        'AWS::Events::Rule',
        'AWS::IAM::ManagedPolicy',
        'AWS::IAM::Policy', // the function role's default policy
        'AWS::IAM::Policy', // its github permissions
        'AWS::IAM::Role',
        'AWS::Lambda::EventInvokeConfig',
        'AWS::Lambda::EventSourceMapping',
        'AWS::Lambda::Function',
        'AWS::Lambda::Permission', // the function URL: lambda:InvokeFunctionUrl
        'AWS::Lambda::Permission', // and lambda:InvokeFunction through it
        'AWS::Lambda::Permission', // the schedule
        'AWS::Lambda::Url',
        'AWS::Logs::LogGroup',
        'AWS::SQS::Queue',
        'AWS::SQS::Queue',
        'AWS::SQS::QueuePolicy',
        'AWS::SQS::QueuePolicy',
        'AWS::SecretsManager::Secret',
        'AWS::SecretsManager::Secret',
      ].sort(),
    );
    // Nothing of the pool's own changed but the configuration in the functions' assets.
    const changed = Object.entries(base)
      .filter(([id, r]) => withGithub[id] !== r)
      .map(([id]) => id);
    expect(changed).toEqual([]);
  });

  it('makes the github function like the others, 120 s, with the queue, the secrets and the JIT path in its environment', () => {
    const [[id, fn] = []] = github('AWS::Lambda::Function');
    expect(id).toMatch(/^PoolGithubFunction[0-9A-F]{8}$/);
    const p = (fn as Json).Properties as Json;
    expect(p).toMatchObject({
      Runtime: 'nodejs24.x',
      Architectures: ['arm64'],
      MemorySize: 512,
      Handler: 'index.handler',
      Timeout: GITHUB_FUNCTION_TIMEOUT_SECONDS,
      TracingConfig: { Mode: 'Active' },
      LoggingConfig: {
        LogFormat: 'JSON',
        LogGroup: { Ref: expect.stringMatching(/^PoolGithubFunctionLogs/) },
      },
    });
    expect(GITHUB_FUNCTION_TIMEOUT_SECONDS).toBe(120);
    const variables = (p.Environment as { Variables: Record<string, unknown> }).Variables;
    expect(Object.fromEntries(Object.entries(variables).map(([k, v]) => [k, flatten(v)]))).toEqual({
      NODE_OPTIONS: '--enable-source-maps',
      TABLE_NAME: '<PoolTableCC5EEF86>',
      POOL_ID: 'gh-pool',
      EVENT_BUS_NAME: 'default',
      POWERTOOLS_SERVICE_NAME: 'metastatic',
      POWERTOOLS_METRICS_NAMESPACE: 'Metastatic',
      REQUEST_QUEUE_URL: expect.stringMatching(/^<PoolRequestQueue[0-9A-F]{8}>$/),
      GITHUB_WEBHOOK_SECRET_ARN: expect.stringMatching(/^<PoolGithubWebhookSecret[0-9A-F]{8}>$/),
      GITHUB_APP_KEY_SECRET_ARN: expect.stringMatching(/^<PoolGithubAppPrivateKey[0-9A-F]{8}>$/),
      GITHUB_JIT_PARAMETER_PATH: '/metastatic/gh-pool/github/jit',
      GITHUB_MAX_CONCURRENCY: '2',
    });
    // The configuration ships beside its bundle, as for the others (a file, not a variable).
    expect(variables.METASTATIC_CONFIG).toBeUndefined();
    // Asynchronous only from its schedule: a failed or late reconcile run is superseded by the next.
    const [[, invokeConfig] = []] = github('AWS::Lambda::EventInvokeConfig');
    expect((invokeConfig as Json).Properties).toMatchObject({
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: 120,
    });
  });

  it('puts it behind a function URL without AWS auth (GitHub signs with the webhook secret instead), buffered', () => {
    const urls = github('AWS::Lambda::Url');
    expect(urls.map(([, u]) => u.Properties)).toEqual([
      {
        AuthType: 'NONE',
        InvokeMode: 'BUFFERED',
        TargetFunctionArn: {
          'Fn::GetAtt': [expect.stringMatching(/^PoolGithubFunction[0-9A-F]{8}$/), 'Arn'],
        },
      },
    ]);
    const permissions = github('AWS::Lambda::Permission').map(([, r]) => r.Properties as Json);
    expect(permissions).toContainEqual(
      expect.objectContaining({
        Action: 'lambda:InvokeFunctionUrl',
        FunctionUrlAuthType: 'NONE',
        Principal: '*',
      }),
    );
    expect(permissions).toContainEqual(
      expect.objectContaining({
        Action: 'lambda:InvokeFunction',
        InvokedViaFunctionUrl: true,
        Principal: '*',
      }),
    );
    // Any other invoke of the function is its schedule's, from that rule only.
    const others = permissions.filter((p) => p.Principal !== '*');
    expect(others).toEqual([
      expect.objectContaining({
        Principal: 'events.amazonaws.com',
        SourceArn: { 'Fn::GetAtt': [expect.stringMatching(/^PoolGithubReconcileSchedule/), 'Arn'] },
      }),
    ]);
    const pool = pools.Github as MetastaticPool;
    expect(flatten(Stack.of(pool).resolve(pool.githubWebhookUrl))).toBe(`<${urls[0]?.[0]}.FunctionUrl>`);
  });

  it('creates the two secrets, generated, encrypted with the pool key when it has one', () => {
    const secrets = Object.fromEntries(
      github('AWS::SecretsManager::Secret').map(([id, s]) => [
        id.replace(/[0-9A-F]{8}$/, ''),
        s.Properties as Json,
      ]),
    );
    expect(Object.keys(secrets).sort()).toEqual(['PoolGithubAppPrivateKey', 'PoolGithubWebhookSecret']);
    expect(secrets.PoolGithubWebhookSecret?.GenerateSecretString).toEqual({
      ExcludePunctuation: true,
      PasswordLength: 40,
    });
    expect(secrets.PoolGithubWebhookSecret?.Description).toMatch(/two lines/);
    expect(secrets.PoolGithubAppPrivateKey?.GenerateSecretString).toMatchObject({ ExcludePunctuation: true });
    expect(secrets.PoolGithubAppPrivateKey?.Description).toMatch(
      /placeholder: put the key with aws secretsmanager put-secret-value/,
    );
    for (const s of Object.values(secrets)) expect(s.KmsKeyId).toBeUndefined();
    const keyed = Object.values(template('Keyed').findResources('AWS::SecretsManager::Secret'));
    expect(keyed).toHaveLength(2);
    for (const s of keyed) {
      expect(((s as Json).Properties as Json).KmsKeyId).toEqual({ 'Fn::GetAtt': ['Key961B73FD', 'Arn'] });
    }
  });

  it('feeds it a github queue with a dead-letter queue, like the pool queues, 10 a batch, at most 2 at once', () => {
    const queues = Object.fromEntries(
      github('AWS::SQS::Queue').map(([id, q]) => [id.replace(/[0-9A-F]{8}$/, ''), q.Properties as Json]),
    );
    expect(Object.keys(queues).sort()).toEqual(['PoolGithubQueue', 'PoolGithubQueueDeadLetterQueue']);
    const visibility = visibilityTimeoutSeconds(GITHUB_FUNCTION_TIMEOUT_SECONDS);
    expect(visibility).toBe(720);
    expect(queues.PoolGithubQueue).toMatchObject({
      SqsManagedSseEnabled: true,
      VisibilityTimeout: visibility,
      RedrivePolicy: {
        deadLetterTargetArn: {
          'Fn::GetAtt': [expect.stringMatching(/^PoolGithubQueueDeadLetterQueue/), 'Arn'],
        },
        maxReceiveCount: GITHUB_MAX_RECEIVE_COUNT,
      },
    });
    expect(queues.PoolGithubQueueDeadLetterQueue).toMatchObject({
      SqsManagedSseEnabled: true,
      MessageRetentionPeriod: 14 * 24 * 3600,
    });
    for (const q of Object.values(template('Keyed').findResources('AWS::SQS::Queue'))) {
      expect(((q as Json).Properties as Json).KmsMasterKeyId).toBeDefined();
    }
    expect(github('AWS::Lambda::EventSourceMapping').map(([, m]) => m.Properties)).toEqual([
      {
        FunctionName: { Ref: expect.stringMatching(/^PoolGithubFunction[0-9A-F]{8}$/) },
        EventSourceArn: { 'Fn::GetAtt': [expect.stringMatching(/^PoolGithubQueue[0-9A-F]{8}$/), 'Arn'] },
        BatchSize: 10,
        FunctionResponseTypes: ['ReportBatchItemFailures'],
        ScalingConfig: { MaximumConcurrency: GITHUB_MAX_CONCURRENCY },
      },
    ]);
    template('Github').hasResourceProperties('AWS::CloudWatch::Alarm', {
      AlarmDescription: Match.stringLikeRegexp('^metastatic github queue .*dead-letter queue'),
      Dimensions: [
        {
          Name: 'QueueName',
          Value: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolGithubQueueDeadLetterQueue'), 'QueueName'] },
        },
      ],
    });
  });

  it('routes the pool events of its requests (fulfilled, node released; pool bus) and ended SSM commands (default bus) to that queue, and runs it on a schedule', () => {
    const rules = Object.fromEntries(
      github('AWS::Events::Rule').map(([id, r]) => [id.replace(/[0-9A-F]{8}$/, ''), r.Properties as Json]),
    );
    expect(Object.keys(rules).sort()).toEqual([
      'PoolGithubCommandStatusRule',
      'PoolGithubPoolEventsRule',
      'PoolGithubReconcileSchedule',
    ]);
    const toQueue = [
      {
        Id: 'Target0',
        Arn: { 'Fn::GetAtt': [expect.stringMatching(/^PoolGithubQueue[0-9A-F]{8}$/), 'Arn'] },
        DeadLetterConfig: {
          Arn: { 'Fn::GetAtt': [expect.stringMatching(/^PoolGithubQueueDeadLetterQueue/), 'Arn'] },
        },
      },
    ];
    expect(rules.PoolGithubPoolEventsRule).toMatchObject({
      EventBusName: 'default',
      EventPattern: {
        source: ['metastatic'],
        'detail-type': ['Request Fulfilled', 'Node Released'],
        detail: { requestId: [{ prefix: 'github-job-' }] },
      },
      Targets: toQueue,
    });
    expect(rules.PoolGithubCommandStatusRule?.EventBusName).toBeUndefined(); // AWS events: the default bus
    expect(rules.PoolGithubCommandStatusRule).toMatchObject({
      EventPattern: {
        source: ['aws.ssm'],
        'detail-type': ['EC2 Command Invocation Status-change Notification'],
        detail: {
          'document-name': ['AWS-RunShellScript'],
          status: [
            'Success',
            'Failed',
            'Cancelled',
            'TimedOut',
            'Delivery Timed Out',
            'Undeliverable',
            'Terminated',
          ],
        },
      },
      Targets: toQueue,
    });
    // Both patterns exactly (no key more).
    expect(Object.keys(rules.PoolGithubPoolEventsRule?.EventPattern as Json).sort()).toEqual([
      'detail',
      'detail-type',
      'source',
    ]);
    expect(rules.PoolGithubReconcileSchedule).toMatchObject({
      ScheduleExpression: 'rate(2 minutes)', // reconcile-interval 120 (the default)
      Targets: [
        {
          Id: 'Target0',
          Arn: { 'Fn::GetAtt': [expect.stringMatching(/^PoolGithubFunction[0-9A-F]{8}$/), 'Arn'] },
          RetryPolicy: { MaximumEventAgeInSeconds: 120 },
        },
      ],
    });
    // With a bus of its own the fulfilled rule listens there; 301 s is every 6 minutes.
    const keyed = template('Keyed');
    keyed.hasResourceProperties('AWS::Events::Rule', {
      EventBusName: { Ref: Match.stringLikeRegexp('^Bus') },
      EventPattern: Match.objectLike({ 'detail-type': ['Request Fulfilled', 'Node Released'] }),
    });
    keyed.hasResourceProperties('AWS::Events::Rule', {
      EventPattern: Match.objectLike({ source: ['aws.ssm'] }),
      EventBusName: Match.absent(),
    });
    keyed.hasResourceProperties('AWS::Events::Rule', {
      ScheduleExpression: 'rate(6 minutes)',
      Targets: [Match.objectLike({ RetryPolicy: { MaximumEventAgeInSeconds: 360 } })],
    });
    // EventBridge may send to the github queues only from those two rules.
    for (const [, policy] of github('AWS::SQS::QueuePolicy')) {
      const statements = ((policy.Properties as Json).PolicyDocument as { Statement: Statement[] }).Statement;
      const fromEvents = statements.filter((st) => st.Effect === 'Allow');
      expect(fromEvents.map((st) => flatten(st.Condition?.ArnEquals?.['aws:SourceArn'])).sort()).toEqual([
        expect.stringMatching(/^<PoolGithubCommandStatusRule[0-9A-F]{8}\.Arn>$/),
        expect.stringMatching(/^<PoolGithubPoolEventsRule[0-9A-F]{8}\.Arn>$/),
      ]);
    }
  });

  it('grants the github function the table, the bus, the request queue, its secrets, its JIT parameters and Run Command on pool instances only', () => {
    const policies = grantsOf(template('Github'), 'AWS::IAM::Policy').filter((p) =>
      p.roles.some((r) => r.startsWith('<PoolGithubFunctionRole')),
    );
    const grants = policies.flatMap((p) => p.grants.map(unhashed)).sort();
    const table = '<PoolTable.Arn>';
    expect(grants).toEqual(
      [
        'logs:CreateLogStream <PoolGithubFunctionLogs.Arn>',
        'logs:PutLogEvents <PoolGithubFunctionLogs.Arn>',
        'xray:PutTelemetryRecords *',
        'xray:PutTraceSegments *',
        ...[
          'ChangeMessageVisibility',
          'DeleteMessage',
          'GetQueueAttributes',
          'GetQueueUrl',
          'ReceiveMessage',
        ].map((a) => `sqs:${a} <PoolGithubQueue.Arn>`),
        `dynamodb:BatchGetItem ${table}`,
        `dynamodb:ConditionCheckItem ${table}`,
        `dynamodb:DeleteItem ${table}`,
        `dynamodb:GetItem ${table}`,
        `dynamodb:PutItem ${table}`,
        `dynamodb:Query ${table}`,
        `dynamodb:Query ${table}/index/free`,
        `dynamodb:Query ${table}/index/reap`,
        `dynamodb:UpdateItem ${table}`,
        'events:PutEvents arn:aws:events:eu-west-1:123456789012:event-bus/default',
        'sqs:SendMessage <PoolRequestQueue.Arn>',
        'secretsmanager:GetSecretValue <PoolGithubWebhookSecret>',
        'secretsmanager:GetSecretValue <PoolGithubAppPrivateKey>',
        `ssm:PutParameter ${PARAMETERS}`,
        `ssm:DeleteParameter ${PARAMETERS}`,
        'ssm:SendCommand arn:<AWS::Partition>:ssm:eu-west-1::document/AWS-RunShellScript',
        'ssm:SendCommand arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:instance/* {"StringEquals":{"ssm:resourceTag/metastatic:pool":"gh-pool"}}',
        'ssm:CancelCommand *',
      ].sort(),
    );
    expect(grants).toHaveLength(27);
    // No EC2 launcher policy for it (it launches nothing), and no other function gets any of it.
    const others = grantsOf(template('Github'), 'AWS::IAM::Policy').filter(
      (p) => !p.roles.some((r) => r.startsWith('<PoolGithubFunctionRole')),
    );
    const otherGrants = others.flatMap((p) => p.grants);
    expect(otherGrants.filter((g) => /^(ssm|secretsmanager):/.test(g))).toEqual([]);
    expect(otherGrants.filter((g) => g.includes('PoolGithub'))).toEqual([]);
    expect(
      others.find((p) => p.id.startsWith('PoolLauncherPolicy'))?.roles.some((r) => r.includes('Github')),
    ).toBe(false);
    // With a key: decrypt the secrets through Secrets Manager only, and encrypt what it sends.
    const keyed = grantsOf(template('Keyed'), 'AWS::IAM::Policy')
      .filter((p) => p.roles.some((r) => r.startsWith('<PoolGithubFunctionRole')))
      .flatMap((p) => p.grants);
    expect(keyed).toContain(
      'kms:Decrypt <Key961B73FD.Arn> {"StringEquals":{"kms:ViaService":"secretsmanager.eu-west-1.amazonaws.com"}}',
    );
    expect(keyed).toContain('kms:GenerateDataKey <Key961B73FD.Arn>');
  });

  it('makes the instances a managed policy to read and delete their JIT configuration, attached to instanceRoles', () => {
    const [policy, ...more] = grantsOf(template('Github'), 'AWS::IAM::ManagedPolicy');
    expect(more).toEqual([]);
    expect(policy).toMatchObject({
      id: expect.stringMatching(/^PoolGithubRunnerInstancePolicy[0-9A-F]{8}$/),
      roles: [],
      grants: [`ssm:DeleteParameter ${PARAMETERS}`, `ssm:GetParameter ${PARAMETERS}`],
    });
    // instanceRoles by name and by ARN (its path dropped: the policy attaches by role name).
    const [keyed] = grantsOf(template('Keyed'), 'AWS::IAM::ManagedPolicy');
    expect(keyed?.roles).toEqual(['builder-role', 'other-role']);
    expect(keyed?.grants).toEqual(policy?.grants);
  });

  it("alarms on the github function's errors three 5-minute periods in a row", () => {
    const [[, alarm] = []] = github('AWS::CloudWatch::Alarm').filter(([id]) => id.includes('ErrorsAlarm'));
    const fn = github('AWS::Lambda::Function').map(([id]) => id)[0];
    expect(alarm?.Properties).toMatchObject({
      MetricName: 'Errors',
      Namespace: 'AWS/Lambda',
      Statistic: 'Sum',
      Period: 300,
      EvaluationPeriods: 3,
      Threshold: 0,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
      Dimensions: [{ Name: 'FunctionName', Value: { Ref: fn } }],
    });
  });

  it('outputs the webhook URL, the two secret ARNs and the instance policy ARN', () => {
    const outputs = template('Github').toJSON().Outputs as Record<
      string,
      { Value: unknown; Description?: string }
    >;
    const ours = Object.fromEntries(
      Object.entries(outputs)
        .filter(([k]) => k.startsWith('Github'))
        .map(([k, o]) => [k, flatten(o.Value)]),
    );
    expect(ours).toEqual({
      GithubWebhookUrl: expect.stringMatching(/^<PoolGithubFunctionFunctionUrl[0-9A-F]{8}\.FunctionUrl>$/),
      GithubWebhookSecretArn: expect.stringMatching(/^<PoolGithubWebhookSecret[0-9A-F]{8}>$/),
      GithubAppKeySecretArn: expect.stringMatching(/^<PoolGithubAppPrivateKey[0-9A-F]{8}>$/),
      GithubRunnerInstancePolicyArn: expect.stringMatching(/^<PoolGithubRunnerInstancePolicy[0-9A-F]{8}>$/),
    });
    expect(outputs.GithubRunnerInstancePolicyArn?.Description).toMatch(/AmazonSSMManagedInstanceCore/);
    expect(Object.keys((pools.Github as MetastaticPool).outputs)).toEqual(
      expect.arrayContaining(Object.keys(ours)),
    );
  });

  it('exposes the github constructs on the pool', () => {
    const pool = pools.Github as MetastaticPool;
    expect(pool.github).toBeDefined();
    expect(pool.githubFunction).toBe(pool.github?.function);
    expect(pool.githubQueue).toBe(pool.github?.queue);
    expect(pool.githubWebhookUrl).toBe(pool.github?.functionUrl.url);
    expect(pool.github?.jitParameterPath).toBe('/metastatic/gh-pool/github/jit');
  });

  it('has no cdk-nag finding left unacknowledged, no dependency cycle, and warns only of a missing instance profile', () => {
    expect(nagViolations(app)).toEqual([]);
    for (const name of Object.keys(templates)) {
      const stack = app.node.findChild(name) as Stack;
      const warnings = Annotations.fromStack(stack)
        .findWarning('*', Match.anyValue())
        .map((w) => `${w.id} ${String(w.entry.data).replace(/ \[ack: .*\]$/, '')}`);
      expect({ name, warnings, cycle: dependencyCycle(template(name)) }).toEqual({
        name,
        // Without an instance profile, SSM cannot reach the instances: said at synth.
        warnings:
          name === 'Github'
            ? [expect.stringMatching(/^\/Github\/Pool\/Github no aws label has an iam-instance-profile/)]
            : [],
        cycle: undefined,
      });
    }
    console.info(`cdkGithub synth (ms, no bundling): ${JSON.stringify(synthMs)}`);
  });

  it('refuses a pool id that cannot name SSM parameters, only with a github section', () => {
    const other = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
    const stack = new Stack(other, 'Ids', { env: ENV });
    expect(
      () => new MetastaticPool(stack, 'Spaced', { config: config(githubSection()), poolId: 'ci pool' }),
    ).toThrow(/poolId "ci pool" cannot name SSM parameters/);
    expect(
      () => new MetastaticPool(stack, 'Plain', { config: config(), poolId: 'ci pool', stackOutputs: false }),
    ).not.toThrow();
  });
});
