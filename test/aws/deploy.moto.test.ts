import '../../testkit/loopbackOnly.mjs';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CloudFormationClient, DescribeStacksCommand } from '@aws-sdk/client-cloudformation';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DescribeInstancesCommand, EC2Client, type Instance } from '@aws-sdk/client-ec2';
import {
  EventBridgeClient,
  ListTargetsByRuleCommand,
  PutEventsCommand,
  RemoveTargetsCommand,
} from '@aws-sdk/client-eventbridge';
import {
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  SendMessageCommand,
  SQSClient,
} from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { FULFIL_MAX_CONCURRENCY } from '../../lib/poolProps.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { ReapReport } from '../../shared/usecases/reapReport.ts';
import {
  describeWithMoto,
  MOTO_ACCOUNT,
  MOTO_CREDENTIALS,
  type Moto,
  startMoto,
} from '../../testkit/moto.ts';
import {
  BundleRunner,
  cdk,
  createNetwork,
  DEPLOY_REGION,
  type DeployedStack,
  describeDeployed,
  motoProcessEnv,
  type Network,
  pollQueue,
  writePoolConfig,
} from '../../testkit/motoDeploy.ts';

/**
 * The deploy smoke: the CDK app deployed into moto (`cdk bootstrap`, `cdk deploy`, `cdk destroy` with
 * AWS_ENDPOINT_URL), then the synthesized bundles run in this process against the resources that
 * deploy created, fed by the deployed queues and the deployed EC2 rule: a request launches an
 * instance, its running event goes through the rule to the fulfil queue and fulfils the request, the
 * CLI with --stack sees it and sends another, releases and the reaper terminate the instance.
 *
 * What this cannot prove (moto does not do it): IAM evaluation of the functions' roles and of the
 * fulfil queue's policy for EventBridge (moto's CloudFormation skips AWS::SQS::QueuePolicy and
 * AWS::CloudWatch::Alarm, and its EventBridge delivers without checking), Lambda running the functions
 * (no Docker: the event source mappings are played by pollQueue, their batching and concurrency are
 * not), EC2's own events and timing (moto emits none, never shows `pending` and terminates at once: the
 * test publishes the state changes with PutEvents, as EC2 would, and the deployed rule routes them).
 */

const ROOT = resolve(import.meta.dirname, '..', '..');
const STACK = 'MetastaticMotoSmoke';
const POOL_ID = 'moto-smoke';
const clientConfig = (moto: Moto) => ({
  region: DEPLOY_REGION,
  endpoint: moto.endpoint,
  credentials: MOTO_CREDENTIALS,
});

describeWithMoto('cdk deploy into moto, and the deployed bundles serving a request', () => {
  let moto: Moto;
  let dir: string;
  let network: Network;
  let stack: DeployedStack;
  let runner: BundleRunner;
  let sqs: SQSClient;
  let ec2: EC2Client;
  let events: EventBridgeClient;
  let dynamodb: DynamoDBClient;
  let store: DynamoStore;
  const timings: Record<string, number> = {};

  /** Queue ARNs by stack output, as SQS reports them. */
  const arns: Record<string, string> = {};
  const queueArn = (output: 'RequestQueueUrl' | 'FulfilQueueUrl') => arns[output] as string;
  const poolInstances = async (): Promise<Instance[]> => {
    const out = await ec2.send(
      new DescribeInstancesCommand({ Filters: [{ Name: 'tag:metastatic:pool', Values: [POOL_ID] }] }),
    );
    return (out.Reservations ?? []).flatMap((r) => r.Instances ?? []);
  };
  /** What EC2 would publish on the default bus; the deployed rule routes it. */
  const publishState = async (instanceId: string, state: string, source = 'aws.ec2') => {
    const out = await events.send(
      new PutEventsCommand({
        Entries: [
          {
            Source: source,
            DetailType: 'EC2 Instance State-change Notification',
            Detail: JSON.stringify({ 'instance-id': instanceId, state }),
            Resources: [`arn:aws:ec2:${DEPLOY_REGION}:${MOTO_ACCOUNT}:instance/${instanceId}`],
          },
        ],
      }),
    );
    expect(out.FailedEntryCount ?? 0).toBe(0);
  };
  const send = (body: unknown) =>
    sqs.send(
      new SendMessageCommand({ QueueUrl: stack.outputs.RequestQueueUrl, MessageBody: JSON.stringify(body) }),
    );
  const handleRequests = () => pollQueue(runner, sqs, stack.functions.request, queueArn('RequestQueueUrl'));
  const handleEvents = () => pollQueue(runner, sqs, stack.functions.fulfil, queueArn('FulfilQueueUrl'));

  beforeAll(async () => {
    const started = Date.now();
    moto = await startMoto();
    dir = await mkdtemp(join(tmpdir(), 'metastatic-deploy-'));
    network = await createNetwork(moto);
    const configPath = await writePoolConfig(dir, network);
    const cdkOut = join(dir, 'cdk.out');
    // Synthesized once; bootstrap and deploy use this assembly (--app), and the bundles run from it.
    timings.synth = (
      await cdk(moto, [
        'synth',
        '-q',
        '-o',
        cdkOut,
        '-c',
        `config=${configPath}`,
        '-c',
        `poolId=${POOL_ID}`,
        '-c',
        `stackName=${STACK}`,
        // moto's CloudFormation skips AWS::CloudWatch::Alarm, and the dashboard's alarm widget refers to
        // the alarms (Fn::GetAtt), which moto then refuses: the dashboard is checked with Template
        // assertions in cdk.test.ts instead.
        '-c',
        'dashboard=false',
      ])
    ).ms;
    timings.bootstrap = (
      await cdk(moto, ['bootstrap', `aws://${MOTO_ACCOUNT}/${DEPLOY_REGION}`, '--app', cdkOut])
    ).ms;
    // moto: a change-set deploy leaves the stack without outputs; a direct one has them.
    timings.deploy = (
      await cdk(moto, ['deploy', STACK, '--app', cdkOut, '--method=direct', '--require-approval', 'never'])
    ).ms;
    stack = await describeDeployed(moto, STACK, cdkOut);
    runner = new BundleRunner(moto);
    sqs = new SQSClient(clientConfig(moto));
    ec2 = new EC2Client(clientConfig(moto));
    events = new EventBridgeClient(clientConfig(moto));
    dynamodb = new DynamoDBClient(clientConfig(moto));
    store = new DynamoStore(dynamodb, stack.outputs.TableName as string);
    for (const output of ['RequestQueueUrl', 'FulfilQueueUrl'] as const) {
      const attributes = await sqs.send(
        new GetQueueAttributesCommand({ QueueUrl: stack.outputs[output], AttributeNames: ['QueueArn'] }),
      );
      arns[output] = attributes.Attributes?.QueueArn as string;
    }
    // moto: a schedule rule has no event pattern and moto matches it against every PutEvents, then
    // fails on its Lambda target (moto/events/models.py: Rule.send_to_targets raises
    // NotImplementedError for a lambda ARN). The reaper's schedule is not what is tested here.
    const schedule = stack.physicalId('AWS::Events::Rule', 'PoolReaperSchedule');
    const targets = await events.send(new ListTargetsByRuleCommand({ Rule: schedule }));
    await events.send(
      new RemoveTargetsCommand({ Rule: schedule, Ids: (targets.Targets ?? []).map((t) => t.Id as string) }),
    );
    timings.setup = Date.now() - started;
  }, 300_000);

  afterAll(async () => {
    console.info(
      `deploy smoke timings (ms): ${JSON.stringify(timings)}; ` +
        `resource types moto did not create (untested here): ${stack?.notCreated.join(', ')}`,
    );
    for (const c of [sqs, ec2, events, dynamodb]) c?.destroy();
    await moto?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('deploys the stack with the outputs the CLI reads and the functions wired to what it created', () => {
    expect(Object.keys(stack.outputs).sort()).toEqual(
      ['EventBusName', 'FulfilQueueUrl', 'PoolId', 'RequestQueueUrl', 'TableName'].sort(),
    );
    expect(stack.outputs.PoolId).toBe(POOL_ID);
    const table = stack.physicalId('AWS::DynamoDB::Table', 'PoolTable');
    expect(stack.outputs.TableName).toBe(table);
    for (const fn of Object.values(stack.functions)) {
      expect(fn.environment.TABLE_NAME, fn.logicalId).toBe(table);
      expect(fn.environment.POOL_ID, fn.logicalId).toBe(POOL_ID);
    }
    const { request, fulfil, reaper } = stack.functions;
    expect(request.eventSources.map((s) => s.queueArn).sort()).toEqual(
      [queueArn('RequestQueueUrl'), request.environment.REQUEST_DLQ_ARN].sort(),
    );
    expect(request.eventSources.every((s) => s.reportsItemFailures)).toBe(true);
    // A scale-out elsewhere in the account cannot drain its DescribeInstances rate through this mapping.
    expect(fulfil.eventSources).toEqual([
      expect.objectContaining({
        queueArn: queueArn('FulfilQueueUrl'),
        reportsItemFailures: true,
        maxConcurrency: FULFIL_MAX_CONCURRENCY,
      }),
    ]);
    expect(reaper.eventSources).toEqual([]);
  });

  let requestId: string;
  let instance: Instance;

  it('launches an instance for a request sent to the deployed request queue (request bundle)', async () => {
    requestId = 'smoke-1';
    await send({ kind: 'request', id: requestId, labels: ['arm-small'], requestor: 'smoke' });
    const handled = await handleRequests();
    expect(handled).toEqual({ records: 1, failed: [] });
    const instances = await poolInstances();
    expect(instances).toHaveLength(1);
    instance = instances[0] as Instance;
    expect(instance.State?.Name).toBe('running'); // moto never shows pending
    expect(instance.InstanceType).toBe('m7g.2xlarge');
    expect(instance.SubnetId).toBe(network.subnetId);
    expect(instance.ImageId).toBe(network.imageId);
    const tags = Object.fromEntries((instance.Tags ?? []).map((t) => [t.Key, t.Value]));
    expect(tags).toMatchObject({ 'metastatic:pool': POOL_ID, 'metastatic:label': 'arm-large', team: 'ci' });
    const r = await store.getRequest(requestId);
    expect(r?.state).toBe('pending');
    expect(r?.nodes[0]).toMatchObject({
      state: 'pending',
      backingNodeId: tags['metastatic:backing-node-id'],
    });
  });

  it('fulfils it when the running event goes through the deployed rule to the fulfil queue (fulfil bundle)', async () => {
    await publishState(instance.InstanceId as string, 'running');
    const handled = await handleEvents();
    expect(handled).toEqual({ records: 1, failed: [] });
    const r = await store.getRequest(requestId);
    expect(r?.state).toBe('fulfilled');
    expect(r?.nodes[0]).toMatchObject({ state: 'ready', host: instance.PrivateIpAddress });
    const backing = await store.getBacking(r?.nodes[0]?.backingNodeId as string);
    expect(backing).toMatchObject({ state: 'ready', resourceId: instance.InstanceId, used: 1 });
  });

  it('routes only the EC2 states the pool handles, and the fulfil bundle drops instances it does not record', async () => {
    // Filtered out by the deployed rule: a state the pool does not handle, and another source.
    await publishState(instance.InstanceId as string, 'pending');
    await publishState(instance.InstanceId as string, 'running', 'my.app');
    expect(await handleEvents()).toEqual({ records: 0, failed: [] });
    // Routed: a handled state of an instance this pool does not record (another team's).
    await publishState('i-0123456789abcdef0', 'stopping');
    expect(await handleEvents()).toEqual({ records: 1, failed: [] });
    expect((await store.getRequest(requestId))?.state).toBe('fulfilled');
  });

  it('serves the CLI with --stack: lists the request, and a request it sends lands on the same instance', async () => {
    const listed = await cli(['list', 'requests', '--json', '--stack', STACK, '--region', DEPLOY_REGION]);
    expect(listed.code, listed.stderr).toBe(0);
    const rows = JSON.parse(listed.stdout) as { id: string; state: string }[];
    expect(rows).toEqual([expect.objectContaining({ id: requestId, state: 'fulfilled' })]);

    const sent = await cli([
      'request',
      'arm-small',
      '--id',
      'smoke-cli',
      '--json',
      '--stack',
      STACK,
      '--region',
      DEPLOY_REGION,
    ]);
    expect(sent.code, sent.stderr).toBe(0);
    expect(JSON.parse(sent.stdout)).toMatchObject({ id: 'smoke-cli', state: 'requested' });
    expect(await handleRequests()).toEqual({ records: 1, failed: [] });
    const r = await store.getRequest('smoke-cli');
    expect(r?.state).toBe('fulfilled');
    expect(r?.nodes[0]).toMatchObject({ state: 'ready', host: instance.PrivateIpAddress });
    expect(await poolInstances()).toHaveLength(1);

    // status reads the same table; the events are on EventBridge, not shown.
    const status = await cli(['status', '--json', '--stack', STACK, '--region', DEPLOY_REGION]);
    expect(status.code, status.stderr).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({
      labels: [{ label: 'arm-small', nodesReady: 2, nodesPending: 0, requestsWaiting: 0, backingNodes: 1 }],
      backing: [expect.objectContaining({ state: 'ready', usedSlots: 2 })],
      waiting: [],
      events: null,
    });
  });

  it('terminates the instance once both nodes are released and grace-time passed (reaper bundle)', async () => {
    await send({ kind: 'release', nodeId: `${requestId}/0` });
    await send({ kind: 'release', nodeId: 'smoke-cli/0' });
    let released = 0;
    for (let i = 0; i < 5 && released < 2; i++) released += (await handleRequests()).records;
    expect(released).toBe(2);
    expect((await store.getRequest(requestId))?.nodes[0]?.state).toBe('released');
    expect((await store.getRequest('smoke-cli'))?.nodes[0]?.state).toBe('released');
    const backingId = (await store.getRequest(requestId))?.nodes[0]?.backingNodeId as string;

    await new Promise((r) => setTimeout(r, 1_200)); // grace-time: 1 (seconds)
    const report = await runner.invoke<ReapReport>(stack.functions.reaper, scheduledEvent());
    expect(report.retired).toEqual([backingId]);
    expect(report.errors).toEqual([]);
    const [after] = await poolInstances();
    expect(after?.InstanceId).toBe(instance.InstanceId);
    expect(after?.State?.Name).toBe('terminated');
    // EC2 answers a terminate with shutting-down and the record waits for the event; moto answers
    // terminated at once, and the reaper may confirm it in the same run.
    expect(['retiring', 'stopped']).toContain((await store.getBacking(backingId))?.state);

    // EC2's terminated event, through the rule: the backing node is stopped (or stays so).
    await publishState(instance.InstanceId as string, 'terminated');
    expect(await handleEvents()).toEqual({ records: 1, failed: [] });
    expect((await store.getBacking(backingId))?.state).toBe('stopped');
  });

  it('ends a request whose message reached the dead-letter queue, launching nothing (request bundle)', async () => {
    // The request function's second mapping: it tells dead letters apart by REQUEST_DLQ_ARN, which
    // must be the ARN the mapping's events carry; otherwise this request would launch an instance.
    const dlq = stack.functions.request.environment.REQUEST_DLQ_ARN as string;
    const dlqUrl = stack.physicalId('AWS::SQS::Queue', 'PoolRequestQueueDeadLetterQueue');
    const body = { kind: 'request', id: 'smoke-dead', labels: ['arm-small'], requestor: 'smoke' };
    await sqs.send(new SendMessageCommand({ QueueUrl: dlqUrl, MessageBody: JSON.stringify(body) }));
    expect(await pollQueue(runner, sqs, stack.functions.request, dlq)).toEqual({ records: 1, failed: [] });
    const dead = await store.getRequest('smoke-dead');
    expect(dead?.state).toBe('failed');
    expect(dead?.reason).toMatch(/dead-letter queue/);
    expect(dead?.nodes.map((n) => [n.state, n.backingNodeId])).toEqual([['failed', undefined]]);
    expect((await poolInstances()).map((i) => i.State?.Name)).toEqual(['terminated']);
  });

  it('cancels a request through the deployed queue: it ends cancelled and its message, sent later, launches nothing', async () => {
    await send({ kind: 'cancel', id: 'smoke-cancel', reason: 'smoke' });
    expect(await handleRequests()).toEqual({ records: 1, failed: [] });
    await send({ kind: 'request', id: 'smoke-cancel', labels: ['arm-small'], requestor: 'smoke' });
    expect(await handleRequests()).toEqual({ records: 1, failed: [] });
    expect(await store.getRequest('smoke-cancel')).toMatchObject({
      state: 'failed',
      reason: 'cancelled: smoke',
      nodes: [],
    });
    expect((await poolInstances()).map((i) => i.State?.Name)).toEqual(['terminated']);
  });

  it('destroys the stack', async () => {
    timings.destroy = (await cdk(moto, ['destroy', STACK, '--app', join(dir, 'cdk.out'), '--force'])).ms;
    const cfn = new CloudFormationClient(clientConfig(moto));
    try {
      await expect(cfn.send(new DescribeStacksCommand({ StackName: STACK }))).rejects.toThrow(
        /does not exist/,
      );
    } finally {
      cfn.destroy();
    }
    const queueName = stack.outputs.RequestQueueUrl?.split('/').pop();
    await expect(sqs.send(new GetQueueUrlCommand({ QueueName: queueName }))).rejects.toThrow(
      /does not exist/,
    );
    // The table is retained (RemovalPolicy.RETAIN): its records outlive the stack.
    expect((await store.getRequest(requestId))?.state).toBe('fulfilled');
  });

  function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((done) => {
      execFile(
        process.execPath,
        [join(ROOT, 'bin', 'metastatic.mjs'), ...args],
        { env: motoProcessEnv(moto), timeout: 60_000 },
        (err, stdout, stderr) => {
          done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
        },
      );
    });
  }
});

function scheduledEvent() {
  return {
    version: '0',
    id: 'smoke',
    'detail-type': 'Scheduled Event',
    source: 'aws.events',
    account: MOTO_ACCOUNT,
    time: new Date().toISOString(),
    region: DEPLOY_REGION,
    resources: [],
    detail: {},
  };
}
