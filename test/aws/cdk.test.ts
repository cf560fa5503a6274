import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { CloudFormationClient } from '@aws-sdk/client-cloudformation';
import { Annotations, Match, Template } from 'aws-cdk-lib/assertions';
import { SecurityGroup, Vpc } from 'aws-cdk-lib/aws-ec2';
import { Role, ServicePrincipal } from 'aws-cdk-lib/aws-iam';
import { Key } from 'aws-cdk-lib/aws-kms';
import { Queue } from 'aws-cdk-lib/aws-sqs';
import { App, type CfnElement, CfnResource, Duration, Stack } from 'aws-cdk-lib/core';
import { AwsSolutionsChecks, ServerlessChecks } from 'cdk-nag';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readStack } from '../../client/stack.ts';
import { LauncherPermissions } from '../../lib/launcherPermissions.ts';
import { MetastaticPool } from '../../lib/metastaticPool.ts';
import { MetastaticStack } from '../../lib/metastaticStack.ts';
import { environmentSize, LAMBDA_ENVIRONMENT_LIMIT, TOKEN_ALLOWANCE } from '../../lib/poolFunction.ts';
import {
  EC2_EVENT_STATES,
  FULFIL_MAX_CONCURRENCY,
  LEASE_MAX_CONCURRENCY,
  REQUEST_MAX_CONCURRENCY,
} from '../../lib/poolProps.ts';
import { ConfigInvalidError } from '../../shared/config/load.ts';
import { InstanceState } from '../../shared/core/stateChanges.ts';
import { FUNCTION_TIMEOUT_SECONDS, visibilityTimeoutSeconds } from '../../shared/core/timing.ts';
import type { AwsLabelSettings } from '../../shared/providers/aws/settings.ts';
import { FUNCTION_CONFIG_FILE } from '../../shared/runtime/functionConfig.ts';
import { tableDefinition } from '../../shared/store/table.ts';
import {
  asList,
  CDK_CONTEXT,
  dependencyCycle,
  flatten,
  REPO_ROOT,
  TEST_ENV,
} from '../../testkit/cdkTemplates.ts';

/**
 * The CDK app: the stack bin/cdk.ts synthesizes (same ids, same feature flags from cdk.json, the example
 * configuration), asserted resource by resource, and checked with cdk-nag's AWS Solutions and Serverless
 * packs. The three functions are bundled once, with the local esbuild.
 */

const ROOT = REPO_ROOT;
const EXAMPLE = join(ROOT, 'examples/aws.yaml');
const ENV = TEST_ENV;

/** The logical id of the table. It must never change: a new one would replace the table (and its data). */
const TABLE_LOGICAL_ID = 'PoolTableCC5EEF86';

type Json = Record<string, unknown>;
interface Statement {
  readonly Effect: string;
  readonly Action: string | string[];
  readonly Resource: unknown;
  readonly Condition?: Record<string, Record<string, unknown>>;
  readonly Sid?: string;
}

/** An app with cdk.json's context; bundling only for the stacks named (none by default: it takes seconds). */
function newApp(bundlingStacks: string[] = []): App {
  return new App({ context: { ...CDK_CONTEXT, 'aws:cdk:bundling-stacks': bundlingStacks } });
}

/** A configuration with one aws pool and one metastatic label on it; `label` adds keys to the aws label. */
function awsConfig(label = '', pool = 'subnet-id: subnet-11111111'): string {
  return `
providers:
  - name: ec2
    driver: aws
    region: eu-west-1
    pools:
      - name: main
        ${pool}
        labels:
          - name: big
            instance-type: m7g.2xlarge
${label
  .split('\n')
  .filter((line) => line.trim() !== '')
  .map((line) => `            ${line}`)
  .join('\n')}
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
`;
}

function statementsOf(template: Template): Statement[] {
  return Object.values(template.findResources('AWS::IAM::Policy')).flatMap(
    (policy) =>
      ((policy as Json).Properties as { PolicyDocument: { Statement: Statement[] } }).PolicyDocument
        .Statement,
  );
}

function allowing(statements: Statement[], action: string): Statement[] {
  return statements.filter((s) => s.Effect === 'Allow' && asList(s.Action).includes(action));
}

function resourcesOf(statement: Statement): string[] {
  return asList(statement.Resource).map(flatten);
}

/**
 * A template with each IAM policy document as the set of single grants it makes (effect, one action,
 * one resource, principal, condition), and `arn:${AWS::Partition}` joins as `arn:aws`: what an app's
 * feature flags change without changing what is allowed (@aws-cdk/aws-iam:minimizePolicies merges and
 * sorts statements, @aws-cdk/core:enablePartitionLiterals writes the partition).
 */
function withGrantsFlattened(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withGrantsFlattened);
  if (!value || typeof value !== 'object') return value;
  const o = value as Json;
  const join = o['Fn::Join'] as [string, unknown[]] | undefined;
  const partition = (p: unknown) => JSON.stringify(p) === '{"Ref":"AWS::Partition"}';
  if (join?.[0] === '' && join[1].every((p) => typeof p === 'string' || partition(p))) {
    return join[1].map((p) => (typeof p === 'string' ? p : 'aws')).join('');
  }
  if (Array.isArray(o.Statement)) {
    const grants = (o.Statement as Json[]).flatMap(({ Sid: _sid, Action, Resource, ...rest }) =>
      [Action]
        .flat()
        .flatMap((action) =>
          [Resource]
            .flat()
            .map((resource) =>
              JSON.stringify(withGrantsFlattened({ ...rest, Action: action, Resource: resource })),
            ),
        ),
    );
    return { ...o, Statement: [...new Set(grants)].sort() };
  }
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, withGrantsFlattened(v)]));
}

function nagViolations(app: App): string[] {
  return [new AwsSolutionsChecks(), new ServerlessChecks()].flatMap((pack) =>
    pack
      .validateScope(app)
      .violations.flatMap((v) =>
        v.violatingResources.map(
          (r) => `${v.severity} ${v.ruleName} at ${r.constructPath}: ${v.description}`,
        ),
      ),
  );
}

describe('MetastaticStack (the example configuration, as bin/cdk.ts builds it)', () => {
  let app: App;
  let stack: MetastaticStack;
  let template: Template;
  let resources: Record<string, Json>;

  beforeAll(() => {
    app = newApp(['Metastatic']);
    stack = new MetastaticStack(app, 'Metastatic', { configPath: EXAMPLE, env: ENV });
    template = Template.fromStack(stack);
    resources = template.toJSON().Resources as Record<string, Json>;
    // Three bundles built with esbuild and the stack synthesized: 10-20 s on a quiet 2-core machine.
  }, 180_000);

  const props = (logicalId: string) => resources[logicalId]?.Properties as Json;
  const ofType = (type: string) => Object.entries(resources).filter(([, r]) => r.Type === type);
  const refId = (value: unknown) => {
    const o = value as Json;
    return (o.Ref ?? (o['Fn::GetAtt'] as string[] | undefined)?.[0]) as string;
  };

  it('has no cdk-nag finding left unacknowledged (AWS Solutions and Serverless packs)', () => {
    expect(nagViolations(app)).toEqual([]);
  });

  it('reports no CDK errors or warnings', () => {
    expect(Annotations.fromStack(stack).findError('*', Match.anyValue())).toEqual([]);
    expect(Annotations.fromStack(stack).findWarning('*', Match.anyValue())).toEqual([]);
  });

  it("passes CloudFormation's rules as CDK validates them at synth: the example, in a VPC, with a customer-managed key, with a github section", () => {
    // The suite synthesizes with CDK_VALIDATION=false (vitest.config.ts: about 7 CPU-s an app); here the
    // variants are validated in one app, as `cdk synth` validates a user's. A stack with a known fault is
    // in the same app, so a run where validation did not happen cannot pass.
    const outdir = mkdtempSync(join(tmpdir(), 'metastatic-cfn-validate-'));
    const was = process.env.CDK_VALIDATION;
    try {
      process.env.CDK_VALIDATION = 'true';
      const app = new App({ outdir, context: { ...CDK_CONTEXT, 'aws:cdk:bundling-stacks': [] } });
      new MetastaticStack(app, 'Example', { configPath: EXAMPLE, env: ENV });
      new MetastaticStack(app, 'InVpc', {
        configPath: EXAMPLE,
        env: ENV,
        functionsVpc: { vpcId: 'vpc-11111111', subnetIds: ['subnet-aaaaaaaa', 'subnet-bbbbbbbb'] },
      });
      const keyed = new Stack(app, 'Keyed', { env: ENV });
      new MetastaticPool(keyed, 'Pool', {
        config: awsConfig('image-id: ami-1'),
        encryptionKey: new Key(keyed, 'Key', { enableKeyRotation: true }),
      });
      // With a github section (lib/poolGithub.ts: a function URL, secrets, SSM grants, a managed policy).
      const withGithub = new Stack(app, 'Github', { env: ENV });
      new MetastaticPool(withGithub, 'Pool', {
        config: `${awsConfig('image-id: ami-1\niam-instance-profile: { name: builders }')}github:
  app-id: 1
  private-key-file: /dev/null
  webhook-secret-files: [/dev/null]
  routes:
    - runs-on: [self-hosted, small]
      label: small
`,
        poolId: 'gh-pool',
        instanceRoles: ['builder-role'],
        encryptionKey: new Key(withGithub, 'Key', { enableKeyRotation: true }),
      });
      const control = new Stack(app, 'Control', { env: ENV });
      new CfnResource(control, 'Queue', {
        type: 'AWS::SQS::Queue',
        properties: { VisibilityTimeout: 'soon' },
      });
      // With cdk.json's @aws-cdk/core:validateAgainstDefaultRules a violation is an error, and a synth in
      // a test process throws it once the report is written; elsewhere it is printed. Either way the
      // report below says what was found.
      try {
        app.synth();
      } catch (err) {
        if (
          !/^ValidationFailed\b|Validation failed/.test(`${(err as Error).name}: ${(err as Error).message}`)
        )
          throw err;
      }
    } finally {
      if (was === undefined) delete process.env.CDK_VALIDATION;
      else process.env.CDK_VALIDATION = was;
    }
    const report = JSON.parse(readFileSync(join(outdir, 'validation-report.json'), 'utf8')) as {
      pluginReports: Array<{
        violations: Array<{ ruleName: string; violatingConstructs: Array<{ constructPath: string }> }>;
      }>;
    };
    rmSync(outdir, { recursive: true, force: true });
    const found = report.pluginReports.flatMap((p) =>
      p.violations.flatMap((v) => v.violatingConstructs.map((c) => `${v.ruleName} ${c.constructPath}`)),
    );
    expect(found.filter((f) => f.endsWith(' Control/Queue'))).not.toEqual([]);
    expect(found.filter((f) => !f.endsWith(' Control/Queue'))).toEqual([]);
    // Five stacks synthesized and validated: ~8 s quiet, 24 s at load 10 on a 2-core machine.
  }, 120_000);

  it("synthesizes the same stack in an app without cdk.json's feature flags, up to how IAM statements are grouped and the partition written", () => {
    // Embedding apps choose their own flags (CDK's defaults for unset ones are its older behaviours); the
    // assertions of this file run under cdk.json's. The bundles are the ones built above.
    const plain = new MetastaticStack(new App(), 'Metastatic', { configPath: EXAMPLE, env: ENV });
    expect(withGrantsFlattened(Template.fromStack(plain).toJSON())).toEqual(
      withGrantsFlattened(template.toJSON()),
    );
  }, 120_000);

  it('keeps the table logical id stable', () => {
    expect(Object.keys(template.findResources('AWS::DynamoDB::Table'))).toEqual([TABLE_LOGICAL_ID]);
  });

  it('builds the table from tableDefinition: on-demand, point-in-time recovery, encrypted, retained, TTL on expiresAt', () => {
    template.hasResource('AWS::DynamoDB::Table', {
      DeletionPolicy: 'Retain',
      UpdateReplacePolicy: 'Retain',
      Properties: {
        BillingMode: 'PAY_PER_REQUEST',
        KeySchema: tableDefinition.KeySchema,
        AttributeDefinitions: tableDefinition.AttributeDefinitions,
        GlobalSecondaryIndexes: tableDefinition.GlobalSecondaryIndexes,
        PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true },
        SSESpecification: { SSEEnabled: true },
        // Ended records (record-retention after they ended) are deleted by DynamoDB (issue 24).
        TimeToLiveSpecification: { AttributeName: 'expiresAt', Enabled: true },
      },
    });
    expect(tableDefinition.GlobalSecondaryIndexes?.map((i) => i.IndexName)).toEqual(['free', 'reap']);
  });

  it('reports batch item failures from every SQS event source (10 requests per batch)', () => {
    const mappings = ofType('AWS::Lambda::EventSourceMapping');
    expect(mappings).toHaveLength(4);
    for (const [, mapping] of mappings) {
      expect((mapping.Properties as Json).FunctionResponseTypes).toEqual(['ReportBatchItemFailures']);
    }
    template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
      FunctionName: { Ref: Match.stringLikeRegexp('^PoolRequestFunction') },
      EventSourceArn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolRequestQueue[0-9A-F]{8}$'), 'Arn'] },
      BatchSize: 10,
    });
    // Lease renewals on a queue and mapping of their own, consumed by the request function (issue 40).
    template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
      FunctionName: { Ref: Match.stringLikeRegexp('^PoolRequestFunction') },
      EventSourceArn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolLeaseQueue[0-9A-F]{8}$'), 'Arn'] },
      BatchSize: 10,
    });
    template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
      FunctionName: { Ref: Match.stringLikeRegexp('^PoolFulfilFunction') },
      EventSourceArn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolFulfilQueue[0-9A-F]{8}$'), 'Arn'] },
    });
    // The request function ends what reaches its dead-letter queue, and knows that queue by ARN.
    const dlqArn = {
      'Fn::GetAtt': [Match.stringLikeRegexp('^PoolRequestQueueDeadLetterQueue[0-9A-F]{8}$'), 'Arn'],
    };
    template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
      FunctionName: { Ref: Match.stringLikeRegexp('^PoolRequestFunction') },
      EventSourceArn: dlqArn,
      BatchSize: 10,
    });
    template.hasResourceProperties('AWS::Lambda::Function', {
      Environment: { Variables: Match.objectLike({ REQUEST_DLQ_ARN: dlqArn }) },
    });
  });

  it('gives each work queue a dead-letter queue (52 receives for requests, above the 2.5 h waiting budget; 5 for leases and fulfil) kept 14 days', () => {
    const queues = ofType('AWS::SQS::Queue');
    expect(queues).toHaveLength(6);
    const dlqIds = new Set<string>();
    const receives: Record<string, number> = {};
    for (const [id, queue] of queues) {
      const redrive = (queue.Properties as Json).RedrivePolicy as Json | undefined;
      if (!redrive) continue;
      dlqIds.add(refId(redrive.deadLetterTargetArn));
      receives[id.replace(/[0-9A-F]{8}$/, '')] = redrive.maxReceiveCount as number;
    }
    expect(receives).toEqual({ PoolRequestQueue: 52, PoolLeaseQueue: 5, PoolFulfilQueue: 5 });
    expect(dlqIds.size).toBe(3);
    for (const id of dlqIds) expect(props(id).MessageRetentionPeriod).toBe(14 * 24 * 3600);
  });

  it('encrypts every queue and denies every request without TLS', () => {
    const policies = ofType('AWS::SQS::QueuePolicy');
    for (const [id, queue] of ofType('AWS::SQS::Queue')) {
      const p = queue.Properties as Json;
      expect(p.SqsManagedSseEnabled === true || p.KmsMasterKeyId !== undefined, id).toBe(true);
      const policy = policies.find(([, q]) =>
        ((q.Properties as Json).Queues as unknown[]).some((r) => refId(r) === id),
      );
      if (!policy) throw new Error(`no queue policy for ${id}`);
      const statements = ((policy[1].Properties as Json).PolicyDocument as { Statement: Statement[] })
        .Statement;
      expect(statements).toContainEqual(
        expect.objectContaining({
          Effect: 'Deny',
          Action: 'sqs:*',
          Condition: { Bool: { 'aws:SecureTransport': 'false' } },
        }),
      );
    }
  });

  it("sets each consumed queue's visibility timeout from the timing contract (6 x its consumer's timeout)", () => {
    const mappings = ofType('AWS::Lambda::EventSourceMapping');
    expect(mappings).toHaveLength(4);
    for (const [, mapping] of mappings) {
      const p = mapping.Properties as Json;
      const queue = props(refId(p.EventSourceArn));
      const fn = props(refId(p.FunctionName));
      expect(queue.VisibilityTimeout).toBe(visibilityTimeoutSeconds(fn.Timeout as number));
    }
  });

  it('caps how many invocations each event source mapping runs at once', () => {
    const concurrency = Object.fromEntries(
      ofType('AWS::Lambda::EventSourceMapping').map(([, m]) => {
        const p = m.Properties as Json;
        return [refId(p.EventSourceArn).replace(/[0-9A-F]{8}$/, ''), p.ScalingConfig];
      }),
    );
    expect(concurrency).toEqual({
      PoolRequestQueue: { MaximumConcurrency: REQUEST_MAX_CONCURRENCY },
      PoolRequestQueueDeadLetterQueue: { MaximumConcurrency: 2 },
      PoolLeaseQueue: { MaximumConcurrency: LEASE_MAX_CONCURRENCY },
      PoolFulfilQueue: { MaximumConcurrency: FULFIL_MAX_CONCURRENCY },
    });
  });

  it('runs the reaper every minute, never retrying a failed run nor starting one older than a minute', () => {
    template.hasResourceProperties('AWS::Events::Rule', {
      ScheduleExpression: 'rate(1 minute)',
      Targets: [
        Match.objectLike({
          Arn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolReaperFunction'), 'Arn'] },
          RetryPolicy: { MaximumEventAgeInSeconds: 60 },
        }),
      ],
    });
    // The schedule invokes asynchronously: Lambda's own retries (2 by default) and queue age govern it.
    const configs = ofType('AWS::Lambda::EventInvokeConfig');
    expect(configs).toHaveLength(1);
    expect(configs[0]?.[1].Properties).toEqual({
      FunctionName: { Ref: expect.stringMatching(/^PoolReaperFunction/) },
      Qualifier: '$LATEST',
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: 60,
    });
  });

  it('sends EC2 state changes (only the states the fulfil function acts on) and spot warnings to the fulfil queue', () => {
    // Every state but pending: the fulfil function acts on these and ignores pending.
    expect([...EC2_EVENT_STATES].sort()).toEqual(InstanceState.options.filter((s) => s !== 'pending').sort());
    const target = [
      Match.objectLike({
        Arn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolFulfilQueue[0-9A-F]{8}$'), 'Arn'] },
        DeadLetterConfig: {
          Arn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolFulfilQueueDeadLetterQueue'), 'Arn'] },
        },
      }),
    ];
    const patterns = ofType('AWS::Events::Rule')
      .map(([, rule]) => rule.Properties as Json)
      .filter((p) => p.EventPattern !== undefined);
    expect(patterns.map((p) => p.EventPattern)).toEqual([
      {
        source: ['aws.ec2'],
        'detail-type': ['EC2 Instance State-change Notification'],
        detail: { state: ['running', 'shutting-down', 'terminated', 'stopping', 'stopped'] },
      },
      { source: ['aws.ec2'], 'detail-type': ['EC2 Spot Instance Interruption Warning'] },
    ]);
    for (const p of patterns) {
      template.hasResourceProperties('AWS::Events::Rule', { EventPattern: p.EventPattern, Targets: target });
    }
    // The rules are on the default bus: AWS service events reach no other.
    for (const [, rule] of ofType('AWS::Events::Rule')) {
      expect((rule.Properties as Json).EventBusName).toBeUndefined();
    }
  });

  it('runs the functions on Node.js 24, ARM64, 512 MB, traced, with the contract timeouts and environment', () => {
    const functions = ofType('AWS::Lambda::Function');
    expect(functions.map(([id]) => id.replace(/Function[0-9A-F]{8}$/, '')).sort()).toEqual([
      'PoolFulfil',
      'PoolReaper',
      'PoolRequest',
    ]);
    for (const [id, fn] of functions) {
      const p = fn.Properties as Json;
      expect(p.Architectures).toEqual(['arm64']);
      expect(p.Runtime).toBe('nodejs24.x');
      expect(p.MemorySize).toBe(512);
      expect(p.TracingConfig).toEqual({ Mode: 'Active' });
      const name = id.replace(/^Pool(\w+)Function[0-9A-F]{8}$/, '$1').toLowerCase();
      expect(p.Timeout).toBe(FUNCTION_TIMEOUT_SECONDS[name as keyof typeof FUNCTION_TIMEOUT_SECONDS]);
      // The configuration is not in the environment: it is a file in the function's code (below).
      const env = (p.Environment as { Variables: Json }).Variables;
      expect(env).toEqual({
        TABLE_NAME: { Ref: TABLE_LOGICAL_ID },
        POOL_ID: 'Metastatic-Pool-5603C6D5',
        EVENT_BUS_NAME: 'default',
        POWERTOOLS_SERVICE_NAME: 'metastatic',
        POWERTOOLS_METRICS_NAMESPACE: 'Metastatic',
        NODE_OPTIONS: '--enable-source-maps',
        // The fulfil function sends an event back to its queue, delayed (issue 40, defect 2).
        ...(id.startsWith('PoolFulfil')
          ? { FULFIL_QUEUE_URL: { Ref: expect.stringMatching(/^PoolFulfilQueue[0-9A-F]{8}$/) } }
          : {}),
        ...(id.startsWith('PoolRequest')
          ? {
              MAX_RECEIVE_COUNT: '52',
              REQUEST_DLQ_ARN: {
                'Fn::GetAtt': [expect.stringMatching(/^PoolRequestQueueDeadLetterQueue[0-9A-F]{8}$/), 'Arn'],
              },
            }
          : {}),
      });
    }
  });

  it('ships the configuration, as given, next to each function bundle', () => {
    const config = readFileSync(EXAMPLE, 'utf8');
    for (const fn of [stack.pool.requestFunction, stack.pool.fulfilFunction, stack.pool.reaperFunction]) {
      const code = fn.function.node.findChild('Code') as unknown as { assetPath: string };
      const dir = join(app.outdir, code.assetPath);
      expect(readFileSync(join(dir, FUNCTION_CONFIG_FILE), 'utf8')).toBe(config);
      expect(readFileSync(join(dir, 'index.js'), 'utf8')).toContain(FUNCTION_CONFIG_FILE);
    }
  });

  it('logs each function to its own log group, kept one month', () => {
    const groups = ofType('AWS::Logs::LogGroup');
    expect(groups).toHaveLength(3);
    for (const [, group] of groups) expect((group.Properties as Json).RetentionInDays).toBe(30);
    const used = ofType('AWS::Lambda::Function').map(([, fn]) =>
      refId(((fn.Properties as Json).LoggingConfig as Json).LogGroup),
    );
    expect(used.sort()).toEqual(groups.map(([id]) => id).sort());
  });

  it('grants no function a managed policy (its own log group only)', () => {
    for (const [, role] of ofType('AWS::IAM::Role')) {
      expect((role.Properties as Json).ManagedPolicyArns).toBeUndefined();
    }
  });

  it('binds RunInstances on instances and volumes to the pool tag', () => {
    const statements = allowing(statementsOf(template), 'ec2:RunInstances');
    for (const s of statements) {
      const tagged = resourcesOf(s).filter((r) => /:(instance|volume)\/\*$/.test(r));
      if (tagged.length === 0) continue;
      expect(s.Condition).toEqual({
        StringEquals: { 'aws:RequestTag/metastatic:pool': 'Metastatic-Pool-5603C6D5' },
      });
      expect(resourcesOf(s)).toEqual([
        'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:instance/*',
        'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:volume/*',
      ]);
    }
    const untagged = statements.filter((s) => s.Condition === undefined);
    expect(untagged).toHaveLength(1);
    expect(resourcesOf(untagged[0] as Statement).sort()).toEqual([
      'arn:<AWS::Partition>:ec2:eu-west-1::image/ami-0c1bc246476a5572b',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:key-pair/metastatic',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:network-interface/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:security-group/sg-0123456789abcdef0',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:spot-instances-request/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:subnet/subnet-0a1b2c3d4e5f60718',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:subnet/subnet-0f9e8d7c6b5a40312',
    ]);
  });

  it('allows CreateTags only on launch, TerminateInstances and GetConsoleOutput only on tagged instances, Describe* on *', () => {
    const statements = statementsOf(template);
    const createTags = allowing(statements, 'ec2:CreateTags');
    expect(createTags).toHaveLength(1);
    for (const s of createTags)
      expect(s.Condition).toEqual({ StringEquals: { 'ec2:CreateAction': 'RunInstances' } });
    const terminate = allowing(statements, 'ec2:TerminateInstances');
    expect(terminate).toHaveLength(1);
    for (const s of terminate) {
      expect(s.Condition).toEqual({
        StringEquals: { 'aws:ResourceTag/metastatic:pool': 'Metastatic-Pool-5603C6D5' },
      });
      expect(resourcesOf(s)).toEqual(['arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:instance/*']);
    }
    // The console output (host keys) of the pool's own instances only, as for TerminateInstances.
    const consoles = allowing(statements, 'ec2:GetConsoleOutput');
    expect(consoles).toHaveLength(1);
    expect(consoles[0]?.Condition).toEqual(terminate[0]?.Condition);
    expect(resourcesOf(consoles[0] as Statement)).toEqual([
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:instance/*',
    ]);
    const describe = allowing(statements, 'ec2:DescribeInstances');
    expect(describe).toEqual([
      expect.objectContaining({ Action: ['ec2:DescribeImages', 'ec2:DescribeInstances'], Resource: '*' }),
    ]);
    expect(resourcesOf(createTags[0] as Statement)).toEqual([
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:instance/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:volume/*',
    ]);
    // No label has an instance profile: nothing may be passed.
    expect(allowing(statements, 'iam:PassRole')).toEqual([]);
    // No statement grants an EC2 or IAM wildcard action.
    for (const s of statements) for (const a of asList(s.Action)) expect(a).not.toMatch(/^(ec2|iam):.*\*/);
  });

  it('attaches the EC2 permissions to all three function roles', () => {
    const launcher = ofType('AWS::IAM::Policy').find(([id]) => id.startsWith('PoolLauncherPolicy'));
    if (!launcher) throw new Error('no launcher policy');
    const roles = ((launcher[1].Properties as Json).Roles as unknown[]).map(refId).sort();
    expect(roles).toEqual(
      ofType('AWS::IAM::Role')
        .map(([id]) => id)
        .sort(),
    );
  });

  it('lets the fulfil function send to its own queue, and no function send anywhere else (issue 40, defect 2)', () => {
    // A backing node not ready yet: its event goes back to the fulfil queue, delayed (fulfilRetry.ts).
    const senders = ofType('AWS::IAM::Policy').flatMap(([, policy]) => {
      const p = policy.Properties as { Roles: unknown[]; PolicyDocument: { Statement: Statement[] } };
      return allowing(p.PolicyDocument.Statement, 'sqs:SendMessage').map((st) => ({
        roles: p.Roles.map(refId),
        resources: resourcesOf(st),
      }));
    });
    expect(senders).toEqual([
      {
        roles: [expect.stringMatching(/^PoolFulfilRole[0-9A-F]{8}$/)],
        resources: [expect.stringMatching(/^<PoolFulfilQueue[0-9A-F]{8}\.Arn>$/)],
      },
    ]);
  });

  it('grants every function the table items it uses, Query on the two indexes by name, and PutEvents on the bus', () => {
    const statements = statementsOf(template);
    // Exactly what the functions call (shared/store): no Scan (only the CLI's listings scan, with the
    // caller's own credentials), no batch or transaction actions, no DescribeTable (the embedded pool's).
    const perFunction = Object.values(template.findResources('AWS::IAM::Policy'))
      .map((policy) =>
        (
          (policy as Json).Properties as { PolicyDocument: { Statement: Statement[] } }
        ).PolicyDocument.Statement.filter((st) => asList(st.Action).some((a) => a.startsWith('dynamodb:'))),
      )
      .filter((found) => found.length > 0)
      .map((found) =>
        found
          .flatMap((st) => asList(st.Action).flatMap((a) => resourcesOf(st).map((r) => `${a} ${r}`)))
          .sort(),
      );
    const table = `<${TABLE_LOGICAL_ID}.Arn>`;
    expect(perFunction).toEqual(
      Array(3).fill([
        `dynamodb:BatchGetItem ${table}`,
        `dynamodb:ConditionCheckItem ${table}`,
        `dynamodb:DeleteItem ${table}`,
        `dynamodb:GetItem ${table}`,
        `dynamodb:PutItem ${table}`,
        `dynamodb:Query ${table}`,
        `dynamodb:Query ${table}/index/free`,
        `dynamodb:Query ${table}/index/reap`,
        `dynamodb:UpdateItem ${table}`,
      ]),
    );
    const putEvents = allowing(statements, 'events:PutEvents');
    expect(putEvents.map(resourcesOf)).toEqual(
      Array(3).fill(['arn:aws:events:eu-west-1:123456789012:event-bus/default']),
    );
  });

  it('alarms on every dead-letter queue, failed launches, long waits, a stalled queue, a failing reaper and lost EC2 events', () => {
    // The pool's own series: pools in one account and region write the same metric names.
    const poolDimensions = [
      { Name: 'pool', Value: 'Metastatic-Pool-5603C6D5' },
      { Name: 'service', Value: 'metastatic' },
    ];
    const alarms = ofType('AWS::CloudWatch::Alarm');
    expect(alarms.map(([id]) => id.replace(/[0-9A-F]{8}$/, '')).sort()).toEqual([
      'PoolEc2EventsDeliveryAlarm',
      'PoolFulfilQueueDeadLetterAlarm',
      'PoolLaunchFailedAlarm',
      'PoolLeaseQueueDeadLetterAlarm',
      'PoolReaperErrorsAlarm',
      'PoolRequestQueueDeadLetterAlarm',
      'PoolRequestQueueStalledAlarm',
      'PoolRequestsWaitingAlarm',
    ]);
    const alarm = (prefix: string) => alarms.find(([id]) => id.startsWith(prefix))?.[1].Properties as Json;
    for (const [, a] of alarms) {
      expect((a.Properties as Json).ComparisonOperator).toBe('GreaterThanThreshold');
    }
    for (const id of [
      'PoolEc2EventsDeliveryAlarm',
      'PoolFulfilQueueDeadLetterAlarm',
      'PoolLeaseQueueDeadLetterAlarm',
      'PoolRequestQueueDeadLetterAlarm',
    ]) {
      expect(alarm(id).Threshold).toBe(0);
    }
    // Nobody consumes the fulfil dead-letter queue: a message there stays visible.
    expect(alarm('PoolFulfilQueueDeadLetterAlarm')).toMatchObject({
      Namespace: 'AWS/SQS',
      MetricName: 'ApproximateNumberOfMessagesVisible',
      Statistic: 'Maximum',
      Period: 60,
      Dimensions: [
        {
          Name: 'QueueName',
          Value: { 'Fn::GetAtt': [expect.stringMatching(/^PoolFulfilQueueDeadLetterQueue/), 'QueueName'] },
        },
      ],
    });
    // The request function consumes its dead-letter queue within seconds, so a dead letter is rarely
    // visible when SQS samples the queue: the alarm adds what is in flight and what was received.
    const requestDlq = alarm('PoolRequestQueueDeadLetterAlarm');
    expect(requestDlq.MetricName).toBeUndefined();
    const queries = requestDlq.Metrics as Json[];
    expect(queries.find((q) => q.ReturnData !== false)).toMatchObject({
      Expression: 'FILL(visible, 0) + FILL(inFlight, 0) + FILL(received, 0)',
    });
    const stats = Object.fromEntries(
      queries
        .filter((q) => q.MetricStat)
        .map((q) => {
          const stat = q.MetricStat as { Metric: Json; Stat: string; Period: number };
          const [dimension] = stat.Metric.Dimensions as Json[];
          expect(refId((dimension as Json).Value)).toMatch(/^PoolRequestQueueDeadLetterQueue/);
          return [q.Id, `${stat.Metric.Namespace} ${stat.Metric.MetricName} ${stat.Stat} ${stat.Period}`];
        }),
    );
    expect(stats).toEqual({
      visible: 'AWS/SQS ApproximateNumberOfMessagesVisible Maximum 60',
      inFlight: 'AWS/SQS ApproximateNumberOfMessagesNotVisible Maximum 60',
      received: 'AWS/SQS NumberOfMessagesReceived Sum 60',
    });
    // Deliveries EventBridge gave up on, for both EC2 rules, by rule name (the default bus).
    const delivery = alarm('PoolEc2EventsDeliveryAlarm').Metrics as Json[];
    expect(
      delivery
        .filter((q) => q.MetricStat)
        .map((q) => {
          const { Metric, Stat, Period } = q.MetricStat as { Metric: Json; Stat: string; Period: number };
          const [dimension] = Metric.Dimensions as Array<{ Name: string; Value: unknown }>;
          const rule = refId(dimension?.Value).replace(/[0-9A-F]{8}$/, '');
          return `${Metric.Namespace} ${Metric.MetricName} ${dimension?.Name}=${rule} ${Stat} ${Period}`;
        })
        .sort(),
    ).toEqual(
      ['PoolEc2Events', 'PoolSpotInterruptions']
        .flatMap((rule) =>
          ['FailedInvocations', 'InvocationsFailedToBeSentToDlq'].map(
            (metric) => `AWS/Events ${metric} RuleName=${rule} Sum 300`,
          ),
        )
        .sort(),
    );
    expect(delivery.find((q) => q.ReturnData !== false)?.Expression).toBe(
      'FILL(failed0, 0) + FILL(lost0, 0) + FILL(failed1, 0) + FILL(lost1, 0)',
    );
    // One period per scheduled run: five failed runs in a row.
    expect(alarm('PoolReaperErrorsAlarm')).toMatchObject({
      Namespace: 'AWS/Lambda',
      MetricName: 'Errors',
      Period: 60,
      EvaluationPeriods: 5,
    });
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      Namespace: 'Metastatic',
      MetricName: 'LaunchFailed',
      Dimensions: poolDimensions,
      Statistic: 'Sum',
      Period: 300,
      Threshold: 0,
      ComparisonOperator: 'GreaterThanThreshold',
    });
    // Waiting requests are seen through the request function's own metric (SQS's queue age leaves them out).
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      Namespace: 'Metastatic',
      MetricName: 'CapacityWait',
      Dimensions: poolDimensions,
      Statistic: 'Maximum',
      Period: 300,
      Threshold: 900_000,
      ComparisonOperator: 'GreaterThanThreshold',
    });
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      MetricName: 'ApproximateAgeOfOldestMessage',
      Dimensions: [
        {
          Name: 'QueueName',
          Value: { 'Fn::GetAtt': [Match.stringLikeRegexp('^PoolRequestQueue[0-9A-F]{8}$'), 'QueueName'] },
        },
      ],
      Threshold: 900,
      ComparisonOperator: 'GreaterThanThreshold',
    });
  });

  it('has a CloudWatch dashboard of the pool, its name an output', () => {
    const dashboards = ofType('AWS::CloudWatch::Dashboard');
    expect(dashboards).toHaveLength(1);
    const [id, dashboard] = dashboards[0] as [string, Json];
    const outputs = template.toJSON().Outputs as Record<string, { Value: unknown }>;
    expect(outputs.DashboardName?.Value).toEqual({ Ref: id });
    // The body is a Fn::Join of text and references: resolve the references to placeholders, then read it.
    const join = ((dashboard.Properties as Json).DashboardBody as { 'Fn::Join': [string, unknown[]] })[
      'Fn::Join'
    ];
    const body = JSON.parse(join[1].map((p) => (typeof p === 'string' ? p : 'REF')).join(join[0])) as {
      widgets: Array<{ properties: { title: string; metrics?: unknown[][]; alarms?: unknown[] } }>;
    };
    const byTitle = Object.fromEntries(body.widgets.map((w) => [w.properties.title, w.properties]));
    expect(Object.keys(byTitle)).toEqual([
      'Requests',
      'Time to fulfilled',
      'Nodes waiting',
      'Slots',
      'Backing nodes by state',
      'Launches',
      'Waits for a boot',
      'Wait for a boot',
      'Forecast and ready room',
      'Reaper runs',
      'Dead-letter queues',
      'Alarms',
    ]);
    /** A widget's metrics as "namespace name statistic" (the pool's own carry its service and pool dimensions). */
    const metrics = (title: string) =>
      (byTitle[title]?.metrics ?? []).map((m) => {
        const [namespace, name, ...rest] = m as [string, string, ...unknown[]];
        const options = rest.find((r) => typeof r === 'object' && r !== null) as
          | { stat?: string }
          | undefined;
        const dims = rest.filter((r) => typeof r === 'string');
        if (namespace === 'metastatic')
          expect(dims).toEqual(['service', 'metastatic', 'pool', 'Metastatic-Pool-5603C6D5']);
        return `${namespace} ${name} ${options?.stat ?? ''}`.trim();
      });
    expect(metrics('Requests')).toEqual([
      'Metastatic RequestsReceived Sum',
      'Metastatic RequestsFulfilled Sum',
      'Metastatic RequestsFailed Sum',
    ]);
    expect(metrics('Time to fulfilled')).toEqual([
      'Metastatic TimeToFulfilled p50',
      'Metastatic TimeToFulfilled p95',
    ]);
    expect(metrics('Nodes waiting')[0]).toBe('Metastatic NodesWaiting Maximum');
    expect(metrics('Slots')).toEqual(['Metastatic SlotsInUse Maximum', 'Metastatic SlotsFree Maximum']);
    expect(metrics('Backing nodes by state')).toEqual([
      'Metastatic BackingNodesLaunching Maximum',
      'Metastatic BackingNodesActive Maximum',
      'Metastatic IdleBackingNodes Maximum',
      'Metastatic BackingNodesRetiring Maximum',
      'Metastatic BackingNodesFailed Maximum',
    ]);
    expect(metrics('Launches').slice(0, 2)).toEqual([
      'Metastatic LaunchSucceeded Sum',
      'Metastatic LaunchFailed Sum',
    ]);
    // What users feel (issue 27): requests that waited for a boot, against all fulfilled, and how long.
    expect(metrics('Waits for a boot')).toEqual([
      'Metastatic RequestsFulfilled Sum',
      'Metastatic RequestsWaitedForBoot Sum',
    ]);
    expect(metrics('Wait for a boot')).toEqual(['Metastatic WaitForBoot p50', 'Metastatic WaitForBoot p95']);
    expect(metrics('Forecast and ready room')).toEqual([
      'Metastatic ForecastArrivalsPerMinute Maximum',
      'Metastatic ReadyRoomHeld Maximum',
    ]);
    expect(metrics('Reaper runs')).toEqual(['AWS/Lambda Invocations Sum', 'AWS/Lambda Errors Sum']);
    // The dead-letter queues as their alarms count them: the request function empties its DLQ within
    // seconds, so that line adds the messages in flight and received to the visible ones (issue 24,
    // defect 8: the widget plotted visible messages only, and showed nearly nothing for the request DLQ).
    const deadLetters = (byTitle['Dead-letter queues']?.metrics ?? []).map((m) => {
      const o = m.find((x) => typeof x === 'object' && x !== null) as Record<string, unknown>;
      if (o === m[0]) return `= ${o.expression} (${o.label})`;
      const shown = o.visible === false ? ` as ${o.id}, hidden` : ` (${o.label})`;
      return `${m[0]} ${m[1]} ${o.stat}${shown}`;
    });
    expect(deadLetters).toEqual([
      '= FILL(visible, 0) + FILL(inFlight, 0) + FILL(received, 0) (request DLQ)',
      'AWS/SQS ApproximateNumberOfMessagesVisible Maximum as visible, hidden',
      'AWS/SQS ApproximateNumberOfMessagesNotVisible Maximum as inFlight, hidden',
      'AWS/SQS NumberOfMessagesReceived Sum as received, hidden',
      'AWS/SQS ApproximateNumberOfMessagesVisible Maximum (fulfil DLQ)',
    ]);
    expect(byTitle.Alarms?.alarms).toHaveLength(stack.pool.alarms.length);
  });

  it('outputs the queue URLs, table name, event bus and pool id', () => {
    const outputs = template.toJSON().Outputs as Record<string, { Value: unknown }>;
    expect(Object.keys(outputs).sort()).toEqual([
      'DashboardName',
      'EventBusName',
      'FulfilQueueUrl',
      'LeaseQueueUrl',
      'PoolId',
      'RequestQueueUrl',
      'TableName',
    ]);
    expect(outputs.TableName?.Value).toEqual({ Ref: TABLE_LOGICAL_ID });
    expect(outputs.PoolId?.Value).toBe('Metastatic-Pool-5603C6D5');
  });
});

describe('MetastaticPool options and checks', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'metastatic-cdk-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** A pool in its own stack, without bundling. */
  function synth(
    config: string,
    extra: Partial<ConstructorParameters<typeof MetastaticPool>[2]> = {},
    env = ENV,
  ) {
    const app = newApp();
    const stack = new Stack(app, 'Test', { env });
    const pool = new MetastaticPool(stack, 'Pool', { config, ...extra });
    return { app, pool, template: Template.fromStack(stack) };
  }

  it('leaves the dashboard out with dashboard: false', () => {
    const { pool, template } = synth(awsConfig('image-id: ami-1'), { dashboard: false });
    expect(pool.dashboard).toBeUndefined();
    template.resourceCountIs('AWS::CloudWatch::Dashboard', 0);
    expect(
      synth(awsConfig('image-id: ami-1')).template.findResources('AWS::CloudWatch::Dashboard'),
    ).not.toEqual({});
  });

  it('passes exactly the given instance roles, to EC2 only, when a label has an instance profile', () => {
    const { app, template } = synth(awsConfig('image-id: ami-1\niam-instance-profile: { name: builders }'), {
      instanceRoles: ['builder-role', 'arn:aws:iam::123456789012:role/other'],
    });
    const passRole = allowing(statementsOf(template), 'iam:PassRole');
    expect(passRole).toHaveLength(1);
    expect(passRole[0]?.Condition).toEqual({ StringEquals: { 'iam:PassedToService': 'ec2.amazonaws.com' } });
    expect(resourcesOf(passRole[0] as Statement).sort()).toEqual([
      'arn:<AWS::Partition>:iam::<AWS::AccountId>:role/builder-role',
      'arn:aws:iam::123456789012:role/other',
    ]);
    expect(nagViolations(app)).toEqual([]);
  });

  it('runs the functions in the pool VPC when given one, with a security group to admit on the instances', () => {
    const app = newApp();
    const stack = new Stack(app, 'Test', { env: ENV });
    const vpc = Vpc.fromVpcAttributes(stack, 'Vpc', {
      vpcId: 'vpc-11111111',
      availabilityZones: ['eu-west-1a', 'eu-west-1b'],
      privateSubnetIds: ['subnet-11111111', 'subnet-22222222'],
    });
    const pool = new MetastaticPool(stack, 'Pool', { config: awsConfig('image-id: ami-1'), vpc });
    const template = Template.fromStack(stack);
    expect(pool.functionsSecurityGroups).toHaveLength(1);
    const groupId = stack.resolve((pool.functionsSecurityGroups[0] as SecurityGroup).securityGroupId);
    const functions = Object.values(template.findResources('AWS::Lambda::Function'));
    expect(functions).toHaveLength(3);
    for (const fn of functions) {
      const props = fn.Properties as Json;
      expect(props.VpcConfig).toEqual({
        SubnetIds: ['subnet-11111111', 'subnet-22222222'],
        SecurityGroupIds: [groupId],
      });
      // The functions then check ports at private addresses.
      expect((props.Environment as { Variables: Json }).Variables.METASTATIC_IN_VPC).toBe('true');
    }
    template.hasResourceProperties('AWS::EC2::SecurityGroup', {
      VpcId: 'vpc-11111111',
      SecurityGroupEgress: [{ CidrIp: '0.0.0.0/0', IpProtocol: '-1' }],
    });
    expect(
      template.findResources('AWS::EC2::SecurityGroup', {
        Properties: { SecurityGroupIngress: Match.anyValue() },
      }),
    ).toEqual({});
    // Lambda manages the network interfaces with the function's role.
    const roles = Object.values(template.findResources('AWS::IAM::Role')).map((r) => r.Properties as Json);
    for (const role of roles) {
      expect(JSON.stringify(role.ManagedPolicyArns)).toContain(
        'service-role/AWSLambdaVPCAccessExecutionRole',
      );
    }
    expect(nagViolations(app)).toEqual([]);
  });

  it('MetastaticStack places the functions by VPC and subnet ids, offline, and outputs their new group', () => {
    const app = newApp();
    const stack = new MetastaticStack(app, 'InVpc', {
      configPath: EXAMPLE,
      env: ENV,
      functionsVpc: { vpcId: 'vpc-11111111', subnetIds: ['subnet-aaaaaaaa', 'subnet-bbbbbbbb'] },
    });
    const template = Template.fromStack(stack);
    template.resourcePropertiesCountIs(
      'AWS::Lambda::Function',
      { VpcConfig: { SubnetIds: ['subnet-aaaaaaaa', 'subnet-bbbbbbbb'] } },
      3,
    );
    const outputs = template.toJSON().Outputs as Record<string, { Value: unknown }>;
    expect(Annotations.fromStack(stack).findWarning('*', Match.anyValue())).toEqual([]);
    expect(outputs.FunctionsSecurityGroupId?.Value).toEqual({
      'Fn::GetAtt': [expect.stringMatching(/^PoolFunctionsSecurityGroup[0-9A-F]{8}$/), 'GroupId'],
    });
    expect(nagViolations(app)).toEqual([]);
    // Given groups are used as they are, and there is no new group to output.
    const own = new MetastaticStack(newApp(), 'OwnGroups', {
      configPath: EXAMPLE,
      env: ENV,
      functionsVpc: {
        vpcId: 'vpc-11111111',
        subnetIds: ['subnet-aaaaaaaa'],
        securityGroupIds: ['sg-0123456789abcdef0'],
      },
    });
    const ownTemplate = Template.fromStack(own);
    ownTemplate.resourceCountIs('AWS::EC2::SecurityGroup', 0);
    expect(Object.keys(ownTemplate.toJSON().Outputs)).not.toContain('FunctionsSecurityGroupId');
    expect(
      () =>
        new MetastaticStack(newApp(), 'NoSubnets', {
          configPath: EXAMPLE,
          env: ENV,
          functionsVpc: { vpcId: 'vpc-11111111', subnetIds: [] },
        }),
    ).toThrow('functionsVpc.subnetIds: give at least one subnet');
  });

  it('warns at synth about configuration that has no effect (min-ready of a backing label), without failing', () => {
    const config = `labels:\n  - name: big\n    min-ready: 2\n  - name: small\n    min-ready: 3\n${awsConfig('image-id: ami-1')}`;
    const { pool } = synth(config);
    const warnings = Annotations.fromStack(Stack.of(pool)).findWarning('*', Match.anyValue());
    // small's min-ready is served; big is a backing label, which min-ready does not keep.
    expect(warnings.map((w) => String(w.entry.data))).toEqual([
      expect.stringContaining('labels[0].min-ready: no metastatic pool offers label "big"'),
    ]);
  });

  it('uses the security groups it is given, and refuses subnets or groups without a VPC', () => {
    const app = newApp();
    const stack = new Stack(app, 'Test', { env: ENV });
    const vpc = Vpc.fromVpcAttributes(stack, 'Vpc', {
      vpcId: 'vpc-11111111',
      availabilityZones: ['eu-west-1a'],
      privateSubnetIds: ['subnet-11111111'],
    });
    const own = SecurityGroup.fromSecurityGroupId(stack, 'Own', 'sg-0123456789abcdef0');
    const pool = new MetastaticPool(stack, 'Pool', {
      config: awsConfig('image-id: ami-1'),
      vpc,
      securityGroups: [own],
    });
    const template = Template.fromStack(stack);
    expect(pool.functionsSecurityGroups).toEqual([own]);
    template.resourceCountIs('AWS::EC2::SecurityGroup', 0);
    template.hasResourceProperties('AWS::Lambda::Function', {
      VpcConfig: { SecurityGroupIds: ['sg-0123456789abcdef0'], SubnetIds: ['subnet-11111111'] },
    });
    expect(() => synth(awsConfig('image-id: ami-1'), { securityGroups: [own] })).toThrow(
      'vpcSubnets and securityGroups place the functions in a VPC: give vpc too',
    );
  });

  it('refuses an instance profile without instanceRoles, and instanceRoles without a profile', () => {
    expect(() =>
      synth(awsConfig('image-id: ami-1\niam-instance-profile: { arn: arn:aws:iam::1:instance-profile/x }')),
    ).toThrow(/main\/big have an iam-instance-profile: give the role\(s\)/);
    expect(() => synth(awsConfig('image-id: ami-1'), { instanceRoles: ['r'] })).toThrow(
      /remove instanceRoles/,
    );
  });

  it('grants wildcards only for what a launch template by name and a missing security group leave open', () => {
    // LauncherPermissions alone, from launch settings as awsPoolSettings makes them.
    const app = newApp();
    const stack = new Stack(app, 'Launcher', { env: ENV });
    const label: AwsLabelSettings = {
      poolKey: 'ec2/main',
      label: 'big',
      region: 'eu-west-1',
      instanceTypes: ['m7g.2xlarge'],
      subnetIds: ['subnet-11111111'],
      securityGroupIds: [],
      publicIpv4: false,
      image: { kind: 'launch-template', name: 'builders' },
      volumeType: 'gp3',
      tags: {},
      useSpot: false,
      connectionPort: 22,
    };
    const launcher = new LauncherPermissions(stack, 'Launcher', { labels: [label], poolId: 'p' });
    launcher.grantTo(new Role(stack, 'Role', { assumedBy: new ServicePrincipal('lambda.amazonaws.com') }));
    const template = Template.fromStack(stack);
    const [open] = allowing(statementsOf(template), 'ec2:RunInstances').filter(
      (s) => s.Condition === undefined,
    );
    expect(resourcesOf(open as Statement).sort()).toEqual([
      'arn:<AWS::Partition>:ec2:eu-west-1::image/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:key-pair/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:launch-template/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:network-interface/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:security-group/*',
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:subnet/subnet-11111111',
    ]);
    // The provider reads the template's network settings (Describe* has no resource-level permissions).
    expect(allowing(statementsOf(template), 'ec2:DescribeLaunchTemplateVersions')).toEqual([
      expect.objectContaining({ Resource: '*' }),
    ]);
    // Each of those wildcards is acknowledged with its own reason; a template by id is named by ARN.
    expect(nagViolations(app)).toEqual([]);
    const byId = newApp();
    const byIdStack = new Stack(byId, 'Launcher', { env: ENV });
    new LauncherPermissions(byIdStack, 'Launcher', {
      labels: [{ ...label, image: { kind: 'launch-template', id: 'lt-0abc' }, keyName: 'k' }],
      poolId: 'p',
    }).grantTo(new Role(byIdStack, 'Role', { assumedBy: new ServicePrincipal('lambda.amazonaws.com') }));
    const [openById] = allowing(statementsOf(Template.fromStack(byIdStack)), 'ec2:RunInstances').filter(
      (s) => s.Condition === undefined,
    );
    expect(resourcesOf(openById as Statement)).toContain(
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:launch-template/lt-0abc',
    );
    expect(resourcesOf(openById as Statement)).not.toContain(
      'arn:<AWS::Partition>:ec2:eu-west-1:<AWS::AccountId>:key-pair/*',
    );
  });

  it('uses the given pool id, reaper rate and customer-managed encryption', () => {
    const app = newApp();
    const stack = new Stack(app, 'Test', { env: ENV });
    const key = new Key(stack, 'Key', { enableKeyRotation: true });
    new MetastaticPool(stack, 'Pool', {
      config: awsConfig('image-id: ami-1'),
      poolId: 'ci-pool',
      reaperRate: Duration.minutes(5),
      encryptionKey: key,
    });
    const template = Template.fromStack(stack);
    // A run waits at most one period to start, and the error alarm counts runs, not minutes.
    template.hasResourceProperties('AWS::Events::Rule', {
      ScheduleExpression: 'rate(5 minutes)',
      Targets: [Match.objectLike({ RetryPolicy: { MaximumEventAgeInSeconds: 300 } })],
    });
    template.hasResourceProperties('AWS::Lambda::EventInvokeConfig', {
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: 300,
    });
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      MetricName: 'Errors',
      Period: 300,
      EvaluationPeriods: 5,
    });
    // CloudWatch evaluates at most a day: a reaper every 6 hours is judged on its last 4 runs.
    const slow = synth(awsConfig('image-id: ami-1'), { reaperRate: Duration.hours(6) }).template;
    slow.hasResourceProperties('AWS::CloudWatch::Alarm', {
      MetricName: 'Errors',
      Period: 21_600,
      EvaluationPeriods: 4,
    });
    slow.hasResourceProperties('AWS::Lambda::EventInvokeConfig', { MaximumEventAgeInSeconds: 21_600 });
    // EventBridge may use the queues' key to deliver EC2 events, for this account (the stack must not
    // depend on itself through the key policy).
    const [keyResource] = Object.values(template.findResources('AWS::KMS::Key'));
    if (!keyResource) throw new Error('no key in the template');
    const keyPolicy = (
      keyResource.Properties as { KeyPolicy: { Statement: Array<Statement & { Principal?: unknown }> } }
    ).KeyPolicy.Statement;
    const forEvents = keyPolicy.filter(
      (st) => JSON.stringify(st.Principal) === JSON.stringify({ Service: 'events.amazonaws.com' }),
    );
    const allowed = forEvents.flatMap((st) => asList(st.Action));
    expect(allowed).toEqual(['kms:Decrypt', 'kms:GenerateDataKey']);
    expect(forEvents.every((st) => st.Condition?.StringEquals?.['aws:SourceAccount'] === ENV.account)).toBe(
      true,
    );
    expect(dependencyCycle(template)).toBeUndefined();
    expect(Annotations.fromStack(stack).findWarning('*', Match.anyValue())).toEqual([]);
    const [terminate] = allowing(statementsOf(template), 'ec2:TerminateInstances');
    expect(terminate?.Condition).toEqual({ StringEquals: { 'aws:ResourceTag/metastatic:pool': 'ci-pool' } });
    for (const queue of Object.values(template.findResources('AWS::SQS::Queue'))) {
      expect(((queue as Json).Properties as Json).KmsMasterKeyId).toBeDefined();
    }
    template.hasResourceProperties('AWS::DynamoDB::Table', {
      SSESpecification: { SSEEnabled: true, SSEType: 'KMS', KMSMasterKeyId: Match.anyValue() },
    });
    expect(nagViolations(app)).toEqual([]);
  });

  it("conditions EventBridge's access to the encrypted fulfil queues and their key itself, in an app without cdk.json's feature flags (issue 24, defect 6)", () => {
    // A plain App, as a consuming app may be: without @aws-cdk/aws-events:eventsTargetQueueSameAccount,
    // CDK's SqsQueue target gives events.amazonaws.com an encrypted queue and its key with no condition.
    const app = new App();
    const stack = new Stack(app, 'Plain', { env: ENV });
    const key = new Key(stack, 'Key', { enableKeyRotation: true });
    const pool = new MetastaticPool(stack, 'Pool', {
      config: awsConfig('image-id: ami-1'),
      encryptionKey: key,
    });
    const template = Template.fromStack(stack);
    const isEvents = (st: Statement & { Principal?: unknown }) =>
      JSON.stringify(st.Principal) === JSON.stringify({ Service: 'events.amazonaws.com' });
    const ruleArns = [pool.ec2EventsRule, pool.spotInterruptionsRule].map((r) => stack.resolve(r.ruleArn));
    const queueIds = [pool.fulfilQueue.queue, pool.fulfilQueue.deadLetterQueue].map((q) =>
      stack.getLogicalId(q.node.defaultChild as CfnElement),
    );
    for (const queueId of queueIds) {
      const policies = Object.values(template.findResources('AWS::SQS::QueuePolicy')).filter((p) =>
        ((p.Properties as Json).Queues as Json[]).some((q) => q.Ref === queueId),
      );
      const forEvents = policies
        .flatMap((p) => ((p.Properties as Json).PolicyDocument as { Statement: Statement[] }).Statement)
        .filter((st) => st.Effect === 'Allow' && isEvents(st));
      // Each EC2 rule may send, and only they: one statement per rule, on its ARN.
      expect(
        forEvents.map((st) => st.Condition),
        queueId,
      ).toEqual(ruleArns.map((arn) => ({ ArnEquals: { 'aws:SourceArn': arn } })));
      for (const st of forEvents) expect(asList(st.Action)).toContain('sqs:SendMessage');
    }
    // The key policy cannot name the rules (key -> queue -> rule -> key would be a cycle): the account.
    const keys = Object.values(template.findResources('AWS::KMS::Key'));
    expect(keys).toHaveLength(1);
    const keyForEvents = keys
      .flatMap((k) => (k.Properties as { KeyPolicy: { Statement: Statement[] } }).KeyPolicy.Statement)
      .filter(isEvents);
    expect(keyForEvents).toEqual([
      expect.objectContaining({
        Effect: 'Allow',
        Action: ['kms:Decrypt', 'kms:GenerateDataKey'],
        Condition: { StringEquals: { 'aws:SourceAccount': ENV.account } },
      }),
    ]);
    expect(dependencyCycle(template)).toBeUndefined();
    expect(Annotations.fromStack(stack).findWarning('*', Match.anyValue())).toEqual([]);
    expect(nagViolations(app)).toEqual([]);
    // A plain App bundles the functions: built once per process (the first describe's), 10-50 s alone.
  }, 180_000);

  it('warns that an imported queue key must admit EventBridge (its policy cannot be changed here)', () => {
    const app = newApp();
    const stack = new Stack(app, 'Test', { env: ENV });
    const key = Key.fromKeyArn(
      stack,
      'Imported',
      'arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555',
    );
    new MetastaticPool(stack, 'Pool', { config: awsConfig('image-id: ami-1'), encryptionKey: key });
    const warnings = Annotations.fromStack(stack).findWarning('*', Match.anyValue());
    expect(warnings.map((w) => String(w.entry.data))).toEqual([
      expect.stringMatching(
        /encryptionKey Test\/Imported is imported.*events\.amazonaws\.com.*kms:GenerateDataKey.*kms:Decrypt/,
      ),
    ]);
  });

  it('grants what EC2 needs of a customer-managed EBS key, to the launching roles, on that key only', () => {
    const keyArn = 'arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555';
    const { app, template } = synth(awsConfig('image-id: ami-1'), { ebsKmsKeyArn: keyArn });
    const statements = statementsOf(template);
    const grants = allowing(statements, 'kms:CreateGrant');
    expect(grants).toEqual([
      expect.objectContaining({
        Resource: keyArn,
        Condition: { Bool: { 'kms:GrantIsForAWSResource': 'true' } },
      }),
    ]);
    const use = allowing(statements, 'kms:GenerateDataKeyWithoutPlaintext');
    expect(use).toHaveLength(1);
    expect(use[0]).toMatchObject({ Resource: keyArn });
    expect(asList(use[0]?.Action as string | string[]).sort()).toEqual([
      'kms:Decrypt',
      'kms:DescribeKey',
      'kms:GenerateDataKeyWithoutPlaintext',
      'kms:ReEncryptFrom',
      'kms:ReEncryptTo',
    ]);
    expect(use[0]?.Condition).toBeUndefined();
    // In the launcher policy, which every function role carries.
    const launcher = Object.entries(template.findResources('AWS::IAM::Policy')).find(([id]) =>
      id.startsWith('PoolLauncherPolicy'),
    );
    expect(JSON.stringify(launcher?.[1])).toContain('kms:CreateGrant');
    expect(nagViolations(app)).toEqual([]);
    // Without the key nothing of KMS is granted.
    expect(allowing(statementsOf(synth(awsConfig('image-id: ami-1')).template), 'kms:CreateGrant')).toEqual(
      [],
    );
    expect(() => synth(awsConfig('image-id: ami-1'), { ebsKmsKeyArn: 'alias/ebs' })).toThrow(
      /ebsKmsKeyArn: alias\/ebs is not a KMS key ARN/,
    );
    expect(() =>
      synth(awsConfig('image-id: ami-1'), { ebsKmsKeyArn: keyArn.replace('eu-west-1', 'us-east-1') }),
    ).toThrow(/the key is in us-east-1, but the instances launch in eu-west-1/);
  });

  it("takes the event source mappings' concurrency caps, within what Lambda accepts", () => {
    const { template } = synth(awsConfig('image-id: ami-1'), {
      requestMaxConcurrency: 50,
      fulfilMaxConcurrency: 2,
    });
    const caps = Object.values(template.findResources('AWS::Lambda::EventSourceMapping')).map(
      (m) => ((m.Properties as Json).ScalingConfig as Json).MaximumConcurrency,
    );
    expect(caps.sort((a, b) => Number(a) - Number(b))).toEqual([2, 2, LEASE_MAX_CONCURRENCY, 50]);
    expect(() => synth(awsConfig('image-id: ami-1'), { fulfilMaxConcurrency: 1 })).toThrow(
      'fulfilMaxConcurrency must be an integer from 2 to 1000',
    );
  });

  it('measures a function environment as Lambda does: its variables as JSON, after every variable is set', () => {
    expect(environmentSize({ A: 'x' })).toBe(Buffer.byteLength('{"A":"x"}'));
    expect(environmentSize({ A: 'a"b\nc' })).toBe(Buffer.byteLength(JSON.stringify({ A: 'a"b\nc' })));
    expect(environmentSize({ T: { Ref: 'Table' } })).toBe(`{"T":""}`.length + TOKEN_ALLOWANCE);
    expect(environmentSize({ J: { 'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':x']] } })).toBe(
      `{"J":"arn::x"}`.length + TOKEN_ALLOWANCE,
    );

    // A variable added after the pool is built, of quotes and newlines: Lambda's JSON doubles them, a
    // count of key and value bytes (the old check's way) does not.
    const pool = () => {
      const app = newApp();
      const stack = new Stack(app, 'Test', { env: ENV });
      const built = new MetastaticPool(stack, 'Pool', { config: awsConfig('image-id: ami-1') });
      const fulfilEnvironment = () => {
        const functions = Template.fromStack(stack).findResources('AWS::Lambda::Function');
        const fulfil = Object.entries(functions).find(([id]) => id.startsWith('PoolFulfil'));
        if (!fulfil) throw new Error('no fulfil function in the template');
        return (fulfil[1].Properties as { Environment: { Variables: Record<string, unknown> } }).Environment
          .Variables;
      };
      return { fn: built.fulfilFunction.function, fulfilEnvironment };
    };
    const baseline = environmentSize(pool().fulfilEnvironment());
    /** A pool whose fulfil function gets EXTRA, sized so that its environment takes `total` bytes as JSON. */
    const withExtra = (total: number) => {
      const built = pool();
      const escaped = total - baseline - ',"EXTRA":""'.length;
      const pairs = Math.floor(escaped / 4); // '"\n' is 2 bytes, 4 as JSON
      const value = '"\n'.repeat(pairs) + 'x'.repeat(escaped - 4 * pairs);
      built.fn.addEnvironment('EXTRA', value);
      return { ...built, value };
    };
    const fits = withExtra(LAMBDA_ENVIRONMENT_LIMIT);
    expect(environmentSize(fits.fulfilEnvironment())).toBe(LAMBDA_ENVIRONMENT_LIMIT);
    const over = withExtra(LAMBDA_ENVIRONMENT_LIMIT + 1);
    expect(() => over.fulfilEnvironment()).toThrow(
      /environment of Test\/Pool\/Fulfil takes 4097 bytes as Lambda measures it.*Lambda allows 4096.*Largest: EXTRA/s,
    );
    // The old way of counting (key and value bytes, a token as TOKEN_ALLOWANCE) finds it well under.
    const overVariables = { ...fits.fulfilEnvironment(), EXTRA: over.value };
    const counted = Object.entries(overVariables).reduce(
      (n, [k, v]) =>
        n + Buffer.byteLength(k) + (typeof v === 'string' ? Buffer.byteLength(v) : TOKEN_ALLOWANCE),
      0,
    );
    expect(counted).toBeLessThan(LAMBDA_ENVIRONMENT_LIMIT);
  });

  it('validates the configuration at synth', () => {
    expect(() => synth(awsConfig('image-id: ami-1\nmax-parallel-jobs: 2'))).toThrow(ConfigInvalidError);
    const local =
      'providers:\n  - { name: l, driver: local, pools: [{ name: p, labels: [{ name: big }] }] }\n' +
      '  - { name: m, driver: metastatic, pools: [{ name: p, labels: [{ name: small, backing-label: big }] }] }\n';
    expect(() => synth(local)).toThrow(/driver local, which runs only in the embedded pool/);
  });

  it('refuses host-key-checking outside the VPC at synth, naming the YAML path and the fix (issue 22, defect 7)', () => {
    // host-keys: none: the console's keys cannot stand in for the scan (they do by default: issue 23).
    const checking = (label: string) =>
      awsConfig(label).replace(
        'backing-label: big',
        'backing-label: big\n            host-key-checking: true',
      );
    expect(() => synth(checking('image-id: ami-1'))).not.toThrow();
    const scanning = awsConfig('image-id: ami-1\nhost-keys: none').replace(
      'backing-label: big',
      'backing-label: big\n            host-key-checking: true',
    );
    const err = (() => {
      try {
        synth(scanning);
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(err).toBeInstanceOf(ConfigInvalidError);
    expect((err as Error).message).toMatch(
      /^invalid configuration:\nconfig:\d+:\d+: providers\[1\]\.pools\[0\]\.labels\[0\]\.host-key-checking: .*put the functions in the instances' VPC.*host-keys: console.*or set host-key-checking: false$/s,
    );
    // In the VPC, the functions reach the instances: accepted.
    const app = newApp();
    const stack = new Stack(app, 'InVpc', { env: ENV });
    const vpc = Vpc.fromVpcAttributes(stack, 'Vpc', {
      vpcId: 'vpc-11111111',
      availabilityZones: ['eu-west-1a'],
      privateSubnetIds: ['subnet-11111111'],
    });
    expect(() => new MetastaticPool(stack, 'Pool', { config: scanning, vpc })).not.toThrow();
    // And so does a MetastaticStack given functionsVpc (bin/cdk.ts's -c vpcId=... -c functionSubnetIds=...).
    const file = join(dir, 'scanning.yaml');
    writeFileSync(file, scanning);
    expect(() => new MetastaticStack(newApp(), 'NoVpc', { configPath: file, env: ENV })).toThrow(
      /host-key-checking: .*-c vpcId=/s,
    );
    expect(
      () =>
        new MetastaticStack(newApp(), 'Vpc', {
          configPath: file,
          env: ENV,
          functionsVpc: { vpcId: 'vpc-11111111', subnetIds: ['subnet-aaaaaaaa'] },
        }),
    ).not.toThrow();
  });

  it('refuses a stack in another region than the pools, and asserts the region at deploy when it is unknown', () => {
    expect(() => synth(awsConfig('image-id: ami-1'), {}, { ...ENV, region: 'us-east-1' })).toThrow(
      /launch in eu-west-1 but the stack deploys to us-east-1/,
    );
    const app = newApp();
    const stack = new Stack(app, 'Agnostic');
    new MetastaticPool(stack, 'Pool', { config: awsConfig('image-id: ami-1') });
    const rules = Template.fromStack(stack).toJSON().Rules as Json;
    const region = Object.entries(rules).find(([id]) => id.startsWith('PoolRegionMatchesConfig'));
    expect(region?.[1]).toEqual({
      Assertions: [
        {
          Assert: { 'Fn::Equals': [{ Ref: 'AWS::Region' }, 'eu-west-1'] },
          AssertDescription: expect.stringContaining('deploy the stack to eu-west-1'),
        },
      ],
    });
  });

  it('takes the region of the configuration for MetastaticStack', () => {
    const file = join(dir, 'pool.yaml');
    writeFileSync(file, awsConfig('image-id: ami-1'));
    const stack = new MetastaticStack(newApp(), 'Metastatic', { configPath: file });
    expect(stack.region).toBe('eu-west-1');
  });
});

describe("MetastaticPool embedded in an app of the user's (docs/install.md)", () => {
  const INSTALL = readFileSync(join(ROOT, 'docs', 'install.md'), 'utf8');

  /** docs/install.md's example app: a plain App (no cdk.json context), a Stack, the pool in it. */
  function installExample() {
    // No bundling (it takes seconds and changes no output); none of cdk.json's feature flags.
    const app = new App({ context: { 'aws:cdk:bundling-stacks': [] } });
    const stack = new Stack(app, 'CiPool', { env: ENV });
    new MetastaticPool(stack, 'Pool', { config: readFileSync(EXAMPLE, 'utf8'), poolId: 'ci-pool' });
    return stack;
  }

  it('is the app docs/install.md shows', () => {
    expect(INSTALL).toContain(
      "const stack = new Stack(app, 'CiPool', { env: { account: '123456789012', region: 'eu-west-1' } });",
    );
    expect(INSTALL).toContain(
      "new MetastaticPool(stack, 'Pool', { config: readFileSync('pool.yaml', 'utf8'), poolId: 'ci-pool' });",
    );
  });

  it('publishes the outputs `metastatic --stack` reads (issue 24, defect 7)', async () => {
    const template = Template.fromStack(installExample());
    const outputs = template.toJSON().Outputs as Record<string, { Value: unknown }> | undefined;
    // CloudFormation's DescribeStacks, as the deployed stack would answer it (values resolved).
    const cfn = {
      send: async () => ({
        Stacks: [
          {
            Outputs: Object.entries(outputs ?? {}).map(([key, o]) => ({
              OutputKey: key,
              OutputValue: typeof o.Value === 'string' ? o.Value : `resolved ${JSON.stringify(o.Value)}`,
            })),
          },
        ],
      }),
    } as unknown as CloudFormationClient;
    const info = await readStack(cfn, 'CiPool', ENV.region);
    expect(info).toMatchObject({ stackName: 'CiPool', poolId: 'ci-pool' });
    expect(outputs?.TableName?.Value).toEqual({ Ref: expect.stringMatching(/^PoolTable/) });
  });

  it('refuses a second pool publishing the outputs in one stack, and takes one that publishes none', () => {
    const stack = installExample();
    const config = readFileSync(EXAMPLE, 'utf8');
    expect(() => new MetastaticPool(stack, 'Second', { config, poolId: 'second' })).toThrow(
      'stack CiPool already has a MetastaticPool that publishes the stack outputs the CLI reads (CiPool/Pool): give CiPool/Second stackOutputs: false, or put it in a stack of its own',
    );
    const quiet = new MetastaticPool(stack, 'Quiet', { config, poolId: 'quiet', stackOutputs: false });
    expect(quiet.outputs).toEqual({});
    expect(Object.keys(Template.fromStack(stack).toJSON().Outputs).sort()).toEqual([
      'EventBusName',
      'FulfilQueueUrl',
      'LeaseQueueUrl',
      'PoolId',
      'RequestQueueUrl',
      'TableName',
    ]);
  });
});

describe('the cdk-nag harness', () => {
  it('reports a finding that nothing acknowledges (so an empty report means something)', () => {
    const app = newApp();
    new Queue(new Stack(app, 'Bare', { env: ENV }), 'Bare');
    Template.fromStack(app.node.findChild('Bare') as Stack);
    expect(nagViolations(app).some((v) => v.includes('AwsSolutions-SQS4'))).toBe(true);
  });
});
