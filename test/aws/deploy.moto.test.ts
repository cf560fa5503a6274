import '../../testkit/loopbackOnly.mjs';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  CloudFormationClient,
  CreateChangeSetCommand,
  DescribeStacksCommand,
} from '@aws-sdk/client-cloudformation';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import {
  DescribeInstancesCommand,
  EC2Client,
  GetConsoleOutputCommand,
  type Instance,
} from '@aws-sdk/client-ec2';
import { SendMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { readyReport } from '../../cli/commands/rehearse.ts';
import { MADE_UP_NOTICE } from '../../cli/rehearse/ec2Proxy.ts';
import { deleteLeftover } from '../../cli/rehearse/leftoverStacks.ts';
import { motoClientConfig, motoEnv } from '../../cli/rehearse/motoEnv.ts';
import { motoAccount, startMotoServer } from '../../cli/rehearse/motoServer.ts';
import { Rehearsal } from '../../cli/rehearse/rehearsal.ts';
import type { RehearsalEvent } from '../../cli/rehearse/rehearsalOptions.ts';
import { FULFIL_MAX_CONCURRENCY } from '../../lib/poolProps.ts';
import { guardDynamoLimits } from '../../shared/runtime/dynamoLimits.ts';
import { STACK_OUTPUTS } from '../../shared/runtime/stackOutputs.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { poolConfig } from '../../testkit/configs.ts';
import { describeWithMoto } from '../../testkit/moto.ts';

/**
 * The deploy smoke, through the code of `metastatic rehearse` (cli/rehearse/): this repository's CDK app
 * (bin/cdk.ts, as cdk.json runs it) synthesized, bootstrapped and deployed into moto, its dashboard
 * included; then the functions it deployed run from the code CDK deployed, each delivery, reaper run and
 * EC2 event stepped by the test: a request launches an instance in the subnet moto made for the one the
 * configuration names, its running event goes through the deployed rule to the fulfil queue and fulfils
 * the request (host key from the console), the CLI with --stack sees it and sends another, releases and
 * the reaper terminate the instance; the dead-letter consumer and a cancel.
 *
 * The rehearsal as a user runs it (the installed CLI, a user's app, the loop, Ctrl-C and the stack's
 * destruction) is tested in test/package/package.test.ts. What neither can prove (IAM, Lambda's own
 * mappings, EC2's timing and events, real capacity) is in docs/deploy.md.
 */

const ROOT = resolve(import.meta.dirname, '..', '..');
const STACK = 'MetastaticMotoSmoke';
const POOL_ID = 'moto-smoke';
/** The ids the configuration names: none exists in moto, which gives what it makes for them its own. */
const SUBNET = 'subnet-0a1b2c3d4e5f60718';
const GROUP = 'sg-0123456789abcdef0';
const IMAGE = 'ami-0c1bc246476a5572b';
/**
 * Every process the rehearsal starts resolves only localhost. The app synthesizes without CloudFormation
 * validation (the rehearsal passes no CDK_* variable of the suite's on, so it would run): 14.4 -> 3.3 CPU-s
 * for this synth, measured. The same stack is validated where that is the point: test/aws/cdk.test.ts
 * (its variants, cdk-nag and cfn-lint) and the package test (a user's app, as a user synthesizes it).
 */
const GUARD = {
  NODE_OPTIONS: `--import ${pathToFileURL(join(ROOT, 'testkit', 'loopbackOnly.mjs')).href}`,
  CDK_VALIDATION: 'false',
};

function smokeConfig(): string {
  return `# metastatic deploy smoke (moto)\n${poolConfig({
    backing: {
      driver: 'aws',
      provider: { region: 'eu-west-1' },
      pool: { 'max-servers': 2, 'subnet-ids': [SUBNET], 'security-group-id': GROUP },
      labels: [
        {
          name: 'arm-large',
          'instance-types': ['m7g.2xlarge'],
          'image-id': IMAGE,
          'volume-size': 8,
          tags: { team: 'ci' },
        },
      ],
    },
    meta: {
      pool: { 'max-servers': 4 },
      labels: [{ name: 'arm-small', 'backing-label': 'arm-large', 'max-parallel-jobs': 2, 'grace-time': 1 }],
    },
  })}`;
}

describeWithMoto('cdk deploy into moto, and the deployed bundles serving a request', () => {
  let dir: string;
  let rehearsal: Rehearsal;
  let sqs: SQSClient;
  let dynamodb: DynamoDBClient;
  let store: DynamoStore;
  const events: RehearsalEvent[] = [];
  const timings: Record<string, number> = {};

  const send = (body: unknown) =>
    sqs.send(
      new SendMessageCommand({ QueueUrl: rehearsal.pool.requestQueueUrl, MessageBody: JSON.stringify(body) }),
    );
  const handleRequests = () => rehearsal.deliver('request', rehearsal.pool.requestQueueArn);
  const handleEvents = () => rehearsal.deliver('fulfil');
  const delivered = async (d: Promise<{ records: number; failed: readonly string[] }>) => {
    const { records, failed } = await d;
    return { records, failed };
  };

  beforeAll(async () => {
    const started = Date.now();
    dir = await mkdtemp(join(tmpdir(), 'metastatic-deploy-'));
    const configPath = join(dir, 'pool.yaml');
    await writeFile(configPath, smokeConfig());
    rehearsal = await Rehearsal.start({
      cwd: ROOT,
      context: { config: configPath, poolId: POOL_ID, stackName: STACK },
      childEnv: GUARD,
      onEvent: (e) => {
        events.push(e);
        if (e.type === 'step' && e.ms !== undefined) timings[e.step] = e.ms;
      },
    });
    const config = motoClientConfig(rehearsal.moto.endpoint, rehearsal.region);
    sqs = new SQSClient({ ...config, useQueueUrlAsEndpoint: false });
    dynamodb = guardDynamoLimits(new DynamoDBClient(config));
    store = new DynamoStore(dynamodb, rehearsal.pool.tableName);
    timings.setup = Date.now() - started;
  }, 420_000);

  afterAll(async () => {
    console.info(
      `deploy smoke timings (ms): ${JSON.stringify(timings)}; ` +
        `resource types moto did not create (untested here): ${rehearsal?.pool.notCreated.join(', ')}`,
    );
    for (const c of [sqs, dynamodb]) c?.destroy();
    await rehearsal?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('deploys the stack, dashboard included, with the outputs the CLI reads and the functions wired to what it created', () => {
    const { pool } = rehearsal;
    expect(Object.keys(pool.outputs).sort()).toEqual(
      [...Object.values(STACK_OUTPUTS), 'DashboardName'].sort(),
    );
    expect(pool.poolId).toBe(POOL_ID);
    expect(pool.physicalId('AWS::CloudWatch::Dashboard', 'PoolDashboard')).toBe(pool.outputs.DashboardName);
    const table = pool.physicalId('AWS::DynamoDB::Table', 'PoolTable');
    expect(pool.tableName).toBe(table);
    for (const fn of Object.values(pool.functions)) {
      expect(fn.environment.TABLE_NAME, fn.logicalId).toBe(table);
      expect(fn.environment.POOL_ID, fn.logicalId).toBe(POOL_ID);
    }
    const { request, fulfil, reaper } = pool.functions;
    expect(request.logicalId).toMatch(/^PoolRequestFunction/);
    expect(fulfil.logicalId).toMatch(/^PoolFulfilFunction/);
    expect(reaper.logicalId).toMatch(/^PoolReaperFunction/);
    // The request queue, the lease queue (renewals, issue 40) and the request dead-letter queue.
    const leaseQueueName = String(pool.outputs.LeaseQueueUrl).split('/').pop();
    expect(request.eventSources.map((s) => s.queueArn).sort()).toEqual(
      [
        pool.requestQueueArn,
        request.environment.REQUEST_DLQ_ARN,
        pool.requestQueueArn.replace(/:[^:]+$/, `:${leaseQueueName}`),
      ].sort(),
    );
    expect(request.eventSources.every((s) => s.reportsItemFailures)).toBe(true);
    // A scale-out elsewhere in the account cannot drain its DescribeInstances rate through this mapping.
    expect(fulfil.eventSources).toEqual([
      expect.objectContaining({
        queueArn: pool.fulfilQueueArn,
        reportsItemFailures: true,
        maxConcurrency: FULFIL_MAX_CONCURRENCY,
      }),
    ]);
    expect(reaper.eventSources).toEqual([]);
    expect(pool.schedule).toMatchObject({ expression: 'rate(1 minute)', seconds: 60 });
    // What the configuration names, made in moto (with moto's ids).
    expect([...rehearsal.network.ids.keys()].sort()).toEqual([IMAGE, GROUP, SUBNET].sort());
  });

  it('runs the code cdk deploy uploaded, unchanged: each asset hashes to its name, the configuration in it as written (issue 40, defect 7)', async () => {
    const dirs = new Set(Object.values(rehearsal.pool.functions).map((f) => f.codeDir));
    expect(rehearsal.assets.problems).toEqual([]);
    expect(rehearsal.assets.verified.length).toBe(dirs.size);
    for (const dir of dirs) {
      // Not rewritten to name moto's ids: the EC2 proxy translates them on the wire instead.
      expect(await readFile(join(dir, 'metastatic.yaml'), 'utf8')).toBe(smokeConfig());
    }
    // And says so when it is up, with what it cannot prove: the host keys are made up.
    const ready = readyReport(rehearsal);
    expect(ready).toMatchObject({ consoleHostKeys: 'made-up', concurrency: 2 });
    expect(ready.env.AWS_ENDPOINT_URL_EC2).toBe(rehearsal.proxy.endpoint);
    expect(ready.proves).toContainEqual(
      expect.stringMatching(
        /^the functions run the code cdk deploy uploads, unchanged: asset\.[0-9a-f]{12}…/,
      ),
    );
    expect(ready.cannotProve[0]).toMatch(/^that your image prints its SSH host keys: .*made-up block/);
  });

  let requestId: string;
  let instance: Instance;

  it('launches an instance for a request sent to the deployed request queue (request bundle)', async () => {
    requestId = 'smoke-1';
    await send({ kind: 'request', id: requestId, labels: ['arm-small'], requestor: 'smoke' });
    expect(await delivered(handleRequests())).toEqual({ records: 1, failed: [] });
    const instances = await rehearsal.poolInstances();
    expect(instances).toHaveLength(1);
    instance = instances[0] as Instance;
    expect(instance.State?.Name).toBe('running'); // moto never shows pending
    expect(instance.InstanceType).toBe('m7g.2xlarge');
    expect(instance.SubnetId).toBe(rehearsal.network.ids.get(SUBNET));
    expect(instance.ImageId).toBe(rehearsal.network.ids.get(IMAGE));
    // Through the functions' EC2 endpoint, the proxy: the configuration's ids.
    const ec2 = new EC2Client(motoClientConfig(rehearsal.proxy.endpoint, rehearsal.region));
    try {
      const seen = await ec2.send(
        new DescribeInstancesCommand({ InstanceIds: [instance.InstanceId as string] }),
      );
      expect(seen.Reservations?.[0]?.Instances?.[0]).toMatchObject({
        SubnetId: SUBNET,
        ImageId: IMAGE,
        SecurityGroups: [expect.objectContaining({ GroupId: GROUP })],
      });
    } finally {
      ec2.destroy();
    }
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
    // What EC2 would publish as the instance came up (moto publishes nothing): pending, then running.
    expect(await rehearsal.publishInstanceChanges()).toEqual([
      { instanceId: instance.InstanceId, state: 'pending' },
      { instanceId: instance.InstanceId, state: 'running' },
    ]);
    // pending is not routed by the deployed rule: one record.
    expect(await delivered(handleEvents())).toEqual({ records: 1, failed: [] });
    const r = await store.getRequest(requestId);
    expect(r?.state).toBe('fulfilled');
    // The host key the rehearsal made up for the console (host-keys: console, the default here), which
    // the console announces as made up (issue 40, defect 7).
    expect(r?.nodes[0]).toMatchObject({
      state: 'ready',
      host: instance.PrivateIpAddress,
      hostKeys: [rehearsal.proxy.hostKey(instance.InstanceId as string)],
    });
    const ec2 = new EC2Client(motoClientConfig(rehearsal.proxy.endpoint, rehearsal.region));
    try {
      const out = await ec2.send(
        new GetConsoleOutputCommand({ InstanceId: instance.InstanceId, Latest: true }),
      );
      expect(Buffer.from(out.Output ?? '', 'base64').toString('utf8')).toContain(MADE_UP_NOTICE);
    } finally {
      ec2.destroy();
    }
    const backing = await store.getBacking(r?.nodes[0]?.backingNodeId as string);
    expect(backing).toMatchObject({ state: 'ready', resourceId: instance.InstanceId, used: 1 });
  });

  it('routes only the EC2 states the pool handles, and the fulfil bundle drops instances it does not record', async () => {
    // Filtered out by the deployed rule: a state the pool does not handle, and another source.
    await rehearsal.publishState(instance.InstanceId as string, 'pending');
    await rehearsal.publishState(instance.InstanceId as string, 'running', 'my.app');
    expect(await delivered(handleEvents())).toEqual({ records: 0, failed: [] });
    // Routed: a handled state of an instance this pool does not record (another team's).
    await rehearsal.publishState('i-0123456789abcdef0', 'stopping');
    expect(await delivered(handleEvents())).toEqual({ records: 1, failed: [] });
    expect((await store.getRequest(requestId))?.state).toBe('fulfilled');
  });

  it('serves the CLI with --stack: lists the request, and a request it sends lands on the same instance', async () => {
    const listed = await cli(['list', 'requests', '--json', '--stack', STACK, '--region', rehearsal.region]);
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
      rehearsal.region,
    ]);
    expect(sent.code, sent.stderr).toBe(0);
    expect(JSON.parse(sent.stdout)).toMatchObject({ id: 'smoke-cli', state: 'requested' });
    expect(await delivered(handleRequests())).toEqual({ records: 1, failed: [] });
    const r = await store.getRequest('smoke-cli');
    expect(r?.state).toBe('fulfilled');
    expect(r?.nodes[0]).toMatchObject({ state: 'ready', host: instance.PrivateIpAddress });
    expect(await rehearsal.poolInstances()).toHaveLength(1);

    // status reads the same table; the events are on EventBridge, not shown.
    const status = await cli(['status', '--json', '--stack', STACK, '--region', rehearsal.region]);
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
    const report = await rehearsal.reap();
    expect(report.retired).toEqual([backingId]);
    expect(report.errors).toEqual([]);
    const [after] = await rehearsal.poolInstances();
    expect(after?.InstanceId).toBe(instance.InstanceId);
    expect(after?.State?.Name).toBe('terminated');
    // EC2 answers a terminate with shutting-down and the record waits for the event; moto answers
    // terminated at once, and the reaper may confirm it in the same run.
    expect(['retiring', 'stopped']).toContain((await store.getBacking(backingId))?.state);

    // EC2's shutting-down and terminated events, through the rule: the backing node is stopped (or stays so).
    expect(await rehearsal.publishInstanceChanges()).toEqual([
      { instanceId: instance.InstanceId, state: 'shutting-down' },
      { instanceId: instance.InstanceId, state: 'terminated' },
    ]);
    let handled = 0;
    for (let i = 0; i < 5 && handled < 2; i++) handled += (await handleEvents()).records;
    expect(handled).toBe(2);
    expect((await store.getBacking(backingId))?.state).toBe('stopped');
  });

  it('ends a request whose message reached the dead-letter queue, launching nothing (request bundle)', async () => {
    // The request function's second mapping: it tells dead letters apart by REQUEST_DLQ_ARN, which
    // must be the ARN the mapping's events carry; otherwise this request would launch an instance.
    const dlq = rehearsal.pool.functions.request.environment.REQUEST_DLQ_ARN as string;
    const dlqUrl = rehearsal.pool.physicalId('AWS::SQS::Queue', 'PoolRequestQueueDeadLetterQueue');
    const body = { kind: 'request', id: 'smoke-dead', labels: ['arm-small'], requestor: 'smoke' };
    await sqs.send(new SendMessageCommand({ QueueUrl: dlqUrl, MessageBody: JSON.stringify(body) }));
    expect(await delivered(rehearsal.deliver('request', dlq))).toEqual({ records: 1, failed: [] });
    const dead = await store.getRequest('smoke-dead');
    expect(dead?.state).toBe('failed');
    expect(dead?.reason).toMatch(/dead-letter queue/);
    expect(dead?.nodes.map((n) => [n.state, n.backingNodeId])).toEqual([['failed', undefined]]);
    expect((await rehearsal.poolInstances()).map((i) => i.State?.Name)).toEqual(['terminated']);
  });

  it('cancels a request through the deployed queue: it ends cancelled and its message, sent later, launches nothing', async () => {
    await send({ kind: 'cancel', id: 'smoke-cancel', reason: 'smoke' });
    expect(await delivered(handleRequests())).toEqual({ records: 1, failed: [] });
    await send({ kind: 'request', id: 'smoke-cancel', labels: ['arm-small'], requestor: 'smoke' });
    expect(await delivered(handleRequests())).toEqual({ records: 1, failed: [] });
    expect(await store.getRequest('smoke-cancel')).toMatchObject({
      state: 'failed',
      reason: 'cancelled: smoke',
      nodes: [],
    });
    expect((await rehearsal.poolInstances()).map((i) => i.State?.Name)).toEqual(['terminated']);
  });

  it('reported each step and delivery as it went', () => {
    expect(events.filter((e) => e.type === 'step').map((e) => (e as { step: string }).step)).toEqual([
      'moto',
      'synth',
      'network',
      'bootstrap',
      'deploy',
    ]);
    expect(events).toContainEqual(
      expect.objectContaining({ type: 'delivery', function: 'fulfil', records: 1, failed: 0 }),
    );
    expect(events).toContainEqual(
      expect.objectContaining({ type: 'reaper', retired: [expect.stringMatching(/^bn-/)] }),
    );
  });

  it('refuses, saying why, an app that does not synthesize', async () => {
    const broken = await cli([
      'rehearse',
      '--endpoint',
      rehearsal.moto.endpoint,
      '--app',
      'node -e "process.exit(3)"',
    ]);
    expect(broken.code).toBe(1);
    expect(broken.stderr).toMatch(/^metastatic: the app does not synthesize: cdk synth failed \(exit 1\):/m);
    // Two CLIs start (metastatic's, then the CDK's): 5 s quiet, 43 s at load 11 on the 2-core machine.
  }, 150_000);

  it('deletes what a failed earlier deploy left (a stack in REVIEW_IN_PROGRESS) before deploying', async () => {
    const cfn = new CloudFormationClient(motoClientConfig(rehearsal.moto.endpoint, rehearsal.region));
    try {
      // What a change-set deploy that failed leaves: a stack that was never created.
      await cfn.send(
        new CreateChangeSetCommand({
          StackName: 'Leftover',
          ChangeSetName: 'failed',
          ChangeSetType: 'CREATE',
          TemplateBody: JSON.stringify({ Resources: { Queue: { Type: 'AWS::SQS::Queue' } } }),
        }),
      );
      const status = async () =>
        (await cfn.send(new DescribeStacksCommand({ StackName: 'Leftover' }))).Stacks?.[0]?.StackStatus;
      expect(await status()).toBe('REVIEW_IN_PROGRESS');
      expect(await deleteLeftover(cfn, 'Leftover')).toBe(true);
      await expect(status()).rejects.toThrow(/does not exist/);
      // A stack that deployed is left alone.
      expect(await deleteLeftover(cfn, STACK)).toBe(false);
    } finally {
      cfn.destroy();
    }
  });

  it('starts moto_server for the account a stack names (CDK deploys a stack only into its own account)', async () => {
    const other = await startMotoServer({ account: '111122223333' });
    try {
      expect(await motoAccount(other.endpoint)).toBe('111122223333');
      expect(await motoAccount(rehearsal.moto.endpoint)).toBe('123456789012');
    } finally {
      await other.stop();
    }
  });

  function cli(args: string[], cwd = ROOT): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((done) => {
      execFile(
        process.execPath,
        [join(ROOT, 'bin', 'metastatic.mjs'), ...args],
        { cwd, env: motoEnv(rehearsal.moto.endpoint, rehearsal.region, GUARD), timeout: 120_000 },
        (err, stdout, stderr) => {
          done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
        },
      );
    });
  }
});
