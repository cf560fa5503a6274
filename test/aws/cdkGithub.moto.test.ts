import '../../testkit/loopbackOnly.mjs';
import {
  CloudFormationClient,
  CreateStackCommand,
  type Stack as DeployedStack,
  DescribeStacksCommand,
  paginateListStackResources,
  type StackResourceSummary,
} from '@aws-sdk/client-cloudformation';
import {
  DescribeRuleCommand,
  EventBridgeClient,
  ListTargetsByRuleCommand,
} from '@aws-sdk/client-eventbridge';
import { GetQueueAttributesCommand, SQSClient } from '@aws-sdk/client-sqs';
import { Template as Synthesized } from 'aws-cdk-lib/assertions';
import { App, DefaultStackSynthesizer, Stack } from 'aws-cdk-lib/core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  patchTemplateForMoto,
  REHEARSAL_NO_FUNCTION_URL,
  type Template,
} from '../../cli/rehearse/assembly.ts';
import { motoClientConfig } from '../../cli/rehearse/motoEnv.ts';
import { MOTO_CREDENTIALS } from '../../cli/rehearse/motoServer.ts';
import { MetastaticPool } from '../../lib/metastaticPool.ts';
import { CDK_CONTEXT, TEST_ENV } from '../../testkit/cdkTemplates.ts';
import { describeWithMoto, type Moto, startMoto } from '../../testkit/moto.ts';

/**
 * A stack with a github section (lib/poolGithub.ts) created by moto's CloudFormation (moto 5.2.1), the
 * template as synthesized (no bundling: the functions' code is an empty zip in moto's S3, nothing runs),
 * with the one change the rehearsal makes too (the dashboard's alarm references: cli/rehearse/assembly.ts).
 * What moto creates is checked through its APIs; what it does not implement is listed, so a moto that
 * starts creating one shows here. The stack without github deploys into moto in deploy.moto.test.ts.
 */

const ENV = TEST_ENV;
const CONFIG = `
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
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
github:
  app-id: 1
  private-key-file: /dev/null
  webhook-secret-files: [/dev/null]
  routes:
    - runs-on: [self-hosted, small]
      label: small
`;

type Json = Record<string, unknown>;
type TemplateJson = Template & { Resources: NonNullable<Template['Resources']> };

/** The template of a pool with the github section (no bootstrap-version rule: moto has no bootstrap). */
function synth(name: string, stackOutputs: boolean, patch = true): TemplateJson {
  const app = new App({ context: { ...CDK_CONTEXT, 'aws:cdk:bundling-stacks': [] } });
  const stack = new Stack(app, name, {
    env: ENV,
    synthesizer: new DefaultStackSynthesizer({ generateBootstrapVersionRule: false }),
  });
  new MetastaticPool(stack, 'Pool', { config: CONFIG, poolId: 'gh-moto', stackOutputs });
  const template = Synthesized.fromStack(stack).toJSON() as TemplateJson;
  if (patch) patchTemplateForMoto(template);
  return template;
}

describeWithMoto("a stack with a github section in moto's CloudFormation", () => {
  let moto: Moto;
  let cfn: CloudFormationClient;
  let template: TemplateJson;
  const resources: StackResourceSummary[] = [];
  const timings: Record<string, number> = {};

  /** The physical id of the one resource of this type whose logical id starts with `prefix`. */
  const physical = (type: string, prefix: string): string => {
    const found = resources.filter((r) => r.ResourceType === type && r.LogicalResourceId?.startsWith(prefix));
    if (found.length !== 1 || !found[0]?.PhysicalResourceId) throw new Error(`not one ${type} ${prefix}*`);
    return found[0].PhysicalResourceId;
  };
  /** A GET on moto's Lambda REST API (moto picks the service from the credential scope, checks no signature). */
  const lambdaApi = async (path: string): Promise<{ status: number; body: Json }> => {
    const res = await fetch(`${moto.endpoint}${path}`, {
      headers: {
        authorization: `AWS4-HMAC-SHA256 Credential=${MOTO_CREDENTIALS.accessKeyId}/20260101/${ENV.region}/lambda/aws4_request, SignedHeaders=host, Signature=0`,
      },
    });
    return { status: res.status, body: (await res.json().catch(() => ({}))) as Json };
  };

  beforeAll(async () => {
    let started = Date.now();
    moto = await startMoto();
    timings.moto = Date.now() - started;
    started = Date.now();
    template = synth('GithubMoto', false);
    timings.synth = Date.now() - started;
    started = Date.now();
    cfn = new CloudFormationClient({ ...motoClientConfig(moto.endpoint, ENV.region), maxAttempts: 1 });
    // The functions' code where the template says it is (the CDK bootstrap bucket): an empty zip.
    const codes = Object.values(template.Resources)
      .filter((r) => r.Type === 'AWS::Lambda::Function')
      .map((r) => r.Properties?.Code as { S3Bucket: string; S3Key: string });
    const bucket = codes[0]?.S3Bucket as string;
    expect((await fetch(`${moto.endpoint}/${bucket}`, { method: 'PUT' })).status).toBe(200);
    const emptyZip = Buffer.concat([Buffer.from('PK\x05\x06'), Buffer.alloc(18)]);
    for (const { S3Key } of codes) {
      const put = await fetch(`${moto.endpoint}/${bucket}/${S3Key}`, { method: 'PUT', body: emptyZip });
      expect(put.status).toBe(200);
    }
    await cfn.send(
      new CreateStackCommand({
        StackName: 'GithubMoto',
        TemplateBody: JSON.stringify(template),
        Capabilities: ['CAPABILITY_IAM', 'CAPABILITY_NAMED_IAM'],
      }),
    );
    for await (const page of paginateListStackResources({ client: cfn }, { StackName: 'GithubMoto' }))
      resources.push(...(page.StackResourceSummaries ?? []));
    timings.create = Date.now() - started;
  }, 120_000);

  afterAll(async () => {
    console.info(`cdkGithub moto timings (ms): ${JSON.stringify(timings)}`);
    cfn?.destroy();
    await moto?.stop();
  });

  it('creates the stack, the github function, its queues, rules, policies and permissions; not its URL, secrets, invoke config, queue policies or alarm', async () => {
    const stack = (await cfn.send(new DescribeStacksCommand({ StackName: 'GithubMoto' }))).Stacks?.[0];
    expect(stack?.StackStatus).toBe('CREATE_COMPLETE');
    const created = new Set(resources.map((r) => r.LogicalResourceId));
    const github = Object.entries(template.Resources).filter(([id]) => id.startsWith('PoolGithub'));
    const byType = (made: boolean) =>
      [...new Set(github.filter(([id]) => created.has(id) === made).map(([, r]) => r.Type))].sort();
    expect(byType(true)).toEqual([
      'AWS::Events::Rule',
      'AWS::IAM::ManagedPolicy',
      'AWS::IAM::Policy',
      'AWS::IAM::Role',
      'AWS::Lambda::EventSourceMapping',
      'AWS::Lambda::Function',
      'AWS::Lambda::Permission',
      'AWS::Logs::LogGroup',
      'AWS::SQS::Queue',
    ]);
    // moto 5.2.1's CloudFormation skips these types (a warning in its log): untested here.
    expect(byType(false)).toEqual([
      'AWS::CloudWatch::Alarm',
      'AWS::Lambda::EventInvokeConfig',
      'AWS::Lambda::Url',
      'AWS::SQS::QueuePolicy',
      'AWS::SecretsManager::Secret',
    ]);
  });

  it('gives the github function its environment and its queue mapping (10 a batch, item failures, 2 at once)', async () => {
    const name = physical('AWS::Lambda::Function', 'PoolGithubFunction');
    const config = await lambdaApi(`/2015-03-31/functions/${name}/configuration`);
    expect(config.body).toMatchObject({ Timeout: 120, Handler: 'index.handler', MemorySize: 512 });
    const env = (config.body.Environment as { Variables: Record<string, string> }).Variables;
    expect(env).toMatchObject({
      POOL_ID: 'gh-moto',
      GITHUB_JIT_PARAMETER_PATH: '/metastatic/gh-moto/github/jit',
      REQUEST_QUEUE_URL: physical('AWS::SQS::Queue', 'PoolRequestQueueC'),
    });
    // The Ref of a secret moto did not create resolves to nothing: moto leaves both variables out.
    expect([env.GITHUB_WEBHOOK_SECRET_ARN, env.GITHUB_APP_KEY_SECRET_ARN]).toEqual([undefined, undefined]);
    const mappings = await lambdaApi(`/2015-03-31/event-source-mappings/?FunctionName=${name}`);
    const sqs = new SQSClient({
      ...motoClientConfig(moto.endpoint, ENV.region),
      useQueueUrlAsEndpoint: false,
    });
    try {
      const queue = await sqs.send(
        new GetQueueAttributesCommand({
          QueueUrl: physical('AWS::SQS::Queue', 'PoolGithubQueue4'),
          AttributeNames: ['QueueArn', 'VisibilityTimeout', 'RedrivePolicy'],
        }),
      );
      expect(mappings.body.EventSourceMappings).toEqual([
        expect.objectContaining({
          EventSourceArn: queue.Attributes?.QueueArn,
          BatchSize: 10,
          FunctionResponseTypes: ['ReportBatchItemFailures'],
          ScalingConfig: { MaximumConcurrency: 2 },
        }),
      ]);
      expect(queue.Attributes?.VisibilityTimeout).toBe('720');
      expect(JSON.parse(queue.Attributes?.RedrivePolicy ?? '{}')).toMatchObject({ maxReceiveCount: 5 });
    } finally {
      sqs.destroy();
    }
    // No URL: moto's CloudFormation made none.
    expect((await lambdaApi(`/2021-10-31/functions/${name}/url`)).status).toBe(404);
  });

  it('deploys the three rules with their patterns and targets (the github queue, its dead-letter queue)', async () => {
    const events = new EventBridgeClient(motoClientConfig(moto.endpoint, ENV.region));
    try {
      const rules: Record<string, { pattern?: Json; schedule?: string; targets: Json[] }> = {};
      for (const id of [
        'PoolGithubPoolEventsRule',
        'PoolGithubCommandStatusRule',
        'PoolGithubReconcileSchedule',
      ]) {
        const name = physical('AWS::Events::Rule', id);
        const rule = await events.send(new DescribeRuleCommand({ Name: name }));
        const targets = await events.send(new ListTargetsByRuleCommand({ Rule: name }));
        rules[id] = {
          ...(rule.EventPattern ? { pattern: JSON.parse(rule.EventPattern) as Json } : {}),
          ...(rule.ScheduleExpression ? { schedule: rule.ScheduleExpression } : {}),
          targets: (targets.Targets ?? []) as unknown as Json[],
        };
      }
      expect(rules.PoolGithubPoolEventsRule?.pattern).toEqual({
        source: ['metastatic'],
        'detail-type': ['Request Fulfilled', 'Node Released'],
        detail: { requestId: [{ prefix: 'github-job-' }] },
      });
      expect(rules.PoolGithubCommandStatusRule?.pattern).toMatchObject({
        source: ['aws.ssm'],
        'detail-type': ['EC2 Command Invocation Status-change Notification'],
      });
      expect(rules.PoolGithubReconcileSchedule?.schedule).toBe('rate(2 minutes)');
      for (const id of ['PoolGithubPoolEventsRule', 'PoolGithubCommandStatusRule']) {
        expect(rules[id]?.targets).toEqual([
          expect.objectContaining({
            Arn: expect.stringMatching(/:GithubMoto-PoolGithubQueue4/),
            DeadLetterConfig: { Arn: expect.stringMatching(/:GithubMoto-PoolGithubQueueDeadLetterQueue/) },
          }),
        ]);
      }
    } finally {
      events.destroy();
    }
  });

  it('creates it with the stack outputs once the rehearsal stands a placeholder in for the webhook URL, which moto cannot make', async () => {
    const raw = synth('GithubMotoRaw', true, false);
    expect(raw.Outputs?.GithubWebhookUrl).toEqual({
      Description: expect.any(String),
      Value: { 'Fn::GetAtt': [expect.stringMatching(/^PoolGithubFunctionFunctionUrl/), 'FunctionUrl'] },
    });
    // moto 5.2.1 validates each output's Fn::GetAtt against the resource type's class, which it has
    // none of for AWS::Lambda::Url: an internal error (HTTP 500), not a validation error.
    await expect(
      cfn.send(
        new CreateStackCommand({
          StackName: 'GithubMotoRaw',
          TemplateBody: JSON.stringify(raw),
          Capabilities: ['CAPABILITY_IAM', 'CAPABILITY_NAMED_IAM'],
        }),
      ),
    ).rejects.toMatchObject({ $metadata: { httpStatusCode: 500 } });
    // What `metastatic rehearse` deploys (patchTemplateForMoto): the URL resource, which moto skips, and
    // an output that says there is none.
    const patched = synth('GithubMotoOutputs', true);
    await cfn.send(
      new CreateStackCommand({
        StackName: 'GithubMotoOutputs',
        TemplateBody: JSON.stringify(patched),
        Capabilities: ['CAPABILITY_IAM', 'CAPABILITY_NAMED_IAM'],
      }),
    );
    let stack: DeployedStack | undefined;
    for (let i = 0; i < 100; i += 1) {
      stack = (await cfn.send(new DescribeStacksCommand({ StackName: 'GithubMotoOutputs' }))).Stacks?.[0];
      if (stack?.StackStatus !== 'CREATE_IN_PROGRESS') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(stack?.StackStatus).toBe('CREATE_COMPLETE');
    expect(stack?.Outputs?.find((o) => o.OutputKey === 'GithubWebhookUrl')?.OutputValue).toBe(
      REHEARSAL_NO_FUNCTION_URL,
    );
  });
});
