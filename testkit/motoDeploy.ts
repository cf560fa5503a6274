import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  CloudFormationClient,
  DescribeStacksCommand,
  paginateListStackResources,
  type StackResourceSummary,
} from '@aws-sdk/client-cloudformation';
import {
  CreateSecurityGroupCommand,
  CreateSubnetCommand,
  CreateVpcCommand,
  DescribeImagesCommand,
  EC2Client,
} from '@aws-sdk/client-ec2';
import {
  DeleteMessageBatchCommand,
  GetQueueUrlCommand,
  ReceiveMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { Context as LambdaContext, SQSBatchResponse, SQSEvent } from 'aws-lambda';
import { poolConfig } from './configs.ts';
import { MOTO_ACCOUNT, MOTO_CREDENTIALS, type Moto } from './moto.ts';

/**
 * `cdk bootstrap` + `cdk deploy` of the app (bin/cdk.ts) into moto, and the deployed functions' code
 * (the synthesized bundles in cdk.out) run in this process against what the stack created: the
 * resources a function uses come from its deployed configuration (moto's Lambda keeps the environment
 * CloudFormation resolved), its events from the deployed queues and rules.
 *
 * moto quirks handled here (moto 5.2.1, measured):
 * - services are told apart by host name: endpoints use `localhost`, not 127.0.0.1;
 * - a deploy through a change set leaves the stack without outputs: deploy with `--method=direct`;
 * - Lambda functions are created but never run (no Docker), and event source mappings never poll:
 *   `pollQueue` plays the mapping (receive, invoke, delete what did not fail).
 */

const ROOT = resolve(import.meta.dirname, '..');
const CDK_BIN = join(ROOT, 'node_modules', 'aws-cdk', 'bin', 'cdk');
const LOOPBACK_ONLY = pathToFileURL(join(import.meta.dirname, 'loopbackOnly.mjs')).href;
export const DEPLOY_REGION = 'eu-west-1';

/** Subnet, security group and image made in moto for the pool's instances (what a user already has). */
export interface Network {
  readonly vpcId: string;
  readonly subnetId: string;
  readonly securityGroupId: string;
  readonly imageId: string;
}

export async function createNetwork(moto: Moto): Promise<Network> {
  const ec2 = new EC2Client({
    region: DEPLOY_REGION,
    endpoint: moto.endpoint,
    credentials: MOTO_CREDENTIALS,
  });
  try {
    const vpc = await ec2.send(new CreateVpcCommand({ CidrBlock: '10.20.0.0/16' }));
    const vpcId = vpc.Vpc?.VpcId as string;
    const subnet = await ec2.send(new CreateSubnetCommand({ VpcId: vpcId, CidrBlock: '10.20.1.0/24' }));
    const group = await ec2.send(
      new CreateSecurityGroupCommand({ VpcId: vpcId, GroupName: 'metastatic-nodes', Description: 'nodes' }),
    );
    // One of the images moto knows (it refuses a RunInstances with an image it does not).
    const images = await ec2.send(new DescribeImagesCommand({ Owners: ['amazon'] }));
    const image = images.Images?.find((i) => i.ImageId && i.Name?.includes('ubuntu'));
    if (!image?.ImageId) throw new Error('moto lists no ubuntu image to launch');
    return {
      vpcId,
      subnetId: subnet.Subnet?.SubnetId as string,
      securityGroupId: group.GroupId as string,
      imageId: image.ImageId,
    };
  } finally {
    ec2.destroy();
  }
}

export interface CdkRun {
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

/**
 * The environment every process talking to moto gets: the endpoint, fake credentials and region, no
 * profile or config file of this machine, and the loopback-only guard preloaded.
 */
export function motoProcessEnv(moto: Moto, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!/^(AWS_|CDK_)/.test(k)) env[k] = v;
  }
  return {
    ...env,
    AWS_ENDPOINT_URL: moto.endpoint,
    AWS_ACCESS_KEY_ID: MOTO_CREDENTIALS.accessKeyId,
    AWS_SECRET_ACCESS_KEY: MOTO_CREDENTIALS.secretAccessKey,
    AWS_REGION: DEPLOY_REGION,
    AWS_DEFAULT_REGION: DEPLOY_REGION,
    AWS_CONFIG_FILE: join(ROOT, 'nonexistent-aws-config'),
    AWS_SHARED_CREDENTIALS_FILE: join(ROOT, 'nonexistent-aws-credentials'),
    AWS_EC2_METADATA_DISABLED: 'true',
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    CDK_DISABLE_VERSION_CHECK: 'true',
    NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${LOOPBACK_ONLY}`.trim(),
    ...extra,
  };
}

/** Runs the aws-cdk CLI (from devDependencies) against moto; rejects with its output when it fails. */
export function cdk(moto: Moto, args: string[], timeoutMs = 180_000): Promise<CdkRun> {
  const started = Date.now();
  return new Promise((done, fail) => {
    execFile(
      process.execPath,
      [CDK_BIN, ...args, '--no-notices', '--ci'],
      { cwd: ROOT, env: motoProcessEnv(moto), timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        if (err) fail(new Error(`cdk ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`));
        else done({ stdout, stderr, ms: Date.now() - started });
      },
    );
  });
}

/** A function of the deployed stack: its deployed configuration and the bundle CDK synthesized for it. */
export interface DeployedFunction {
  readonly logicalId: string;
  readonly functionName: string;
  readonly functionArn: string;
  readonly handler: string;
  readonly timeoutSeconds: number;
  readonly memorySize: number;
  /** The environment CloudFormation gave it (resolved), as moto's Lambda stores it. */
  readonly environment: Readonly<Record<string, string>>;
  /** The asset directory in cdk.out that was zipped and uploaded as its code. */
  readonly assetDir: string;
  /** Its SQS event source mappings. */
  readonly eventSources: readonly {
    queueArn: string;
    batchSize: number;
    reportsItemFailures: boolean;
    maxConcurrency?: number;
  }[];
}

export interface DeployedStack {
  readonly stackName: string;
  readonly outputs: Readonly<Record<string, string>>;
  readonly resources: readonly StackResourceSummary[];
  /** Functions by the logical id prefix of lib/metastaticPool.ts: PoolRequest, PoolFulfil, PoolReaper. */
  readonly functions: Readonly<Record<'request' | 'fulfil' | 'reaper', DeployedFunction>>;
  /**
   * Types of the template's resources that moto's CloudFormation did not create: it skips types it does
   * not implement, with a warning only (5.2.1: AWS::CloudWatch::Alarm, AWS::SQS::QueuePolicy,
   * AWS::CDK::Metadata), so nothing about them is tested here.
   */
  readonly notCreated: readonly string[];
  /** The physical id (name) of the one resource of this type whose logical id starts with `prefix`. */
  physicalId(type: string, prefix: string): string;
}

/** Reads what a deployed stack created, through CloudFormation and Lambda's API on moto. */
export async function describeDeployed(
  moto: Moto,
  stackName: string,
  cdkOut: string,
): Promise<DeployedStack> {
  const cfn = new CloudFormationClient({
    region: DEPLOY_REGION,
    endpoint: moto.endpoint,
    credentials: MOTO_CREDENTIALS,
  });
  try {
    const stack = (await cfn.send(new DescribeStacksCommand({ StackName: stackName }))).Stacks?.[0];
    if (!stack) throw new Error(`stack ${stackName} not found`);
    const outputs = Object.fromEntries((stack.Outputs ?? []).map((o) => [o.OutputKey, o.OutputValue]));
    const resources: StackResourceSummary[] = [];
    for await (const page of paginateListStackResources({ client: cfn }, { StackName: stackName }))
      resources.push(...(page.StackResourceSummaries ?? []));
    const template = JSON.parse(await readFile(join(cdkOut, `${stackName}.template.json`), 'utf8')) as {
      Resources: Record<string, { Type: string; Properties: { Code?: { S3Key?: unknown } } }>;
    };
    const created = new Set(resources.map((r) => r.LogicalResourceId));
    const notCreated = [
      ...new Set(
        Object.entries(template.Resources)
          .filter(([id]) => !created.has(id))
          .map(([, r]) => r.Type),
      ),
    ].sort();
    const physicalId = (type: string, prefix: string): string => {
      const found = resources.filter(
        (r) => r.ResourceType === type && r.LogicalResourceId?.startsWith(prefix),
      );
      if (found.length !== 1 || !found[0]?.PhysicalResourceId)
        throw new Error(`expected one ${type} ${prefix}* in ${stackName}, found ${found.length}`);
      return found[0].PhysicalResourceId;
    };
    const fn = async (prefix: string): Promise<DeployedFunction> => {
      const logicalId = resources.find(
        (r) => r.ResourceType === 'AWS::Lambda::Function' && r.LogicalResourceId?.startsWith(prefix),
      )?.LogicalResourceId as string;
      const functionName = physicalId('AWS::Lambda::Function', prefix);
      const config = (await lambdaApi(moto, `/2015-03-31/functions/${functionName}/configuration`)) as {
        FunctionArn: string;
        Handler: string;
        Timeout: number;
        MemorySize: number;
        Environment?: { Variables?: Record<string, string> };
      };
      const mappings = (await lambdaApi(
        moto,
        `/2015-03-31/event-source-mappings/?FunctionName=${encodeURIComponent(functionName)}`,
      )) as {
        EventSourceMappings: {
          EventSourceArn: string;
          BatchSize: number;
          FunctionResponseTypes?: string[];
          ScalingConfig?: { MaximumConcurrency?: number };
        }[];
      };
      // The code CloudFormation deployed is the object the template names: <asset hash>.zip.
      const key = template.Resources[logicalId]?.Properties.Code?.S3Key;
      if (typeof key !== 'string') throw new Error(`${logicalId}: no S3Key in the template`);
      return {
        logicalId,
        functionName,
        functionArn: config.FunctionArn,
        handler: config.Handler,
        timeoutSeconds: config.Timeout,
        memorySize: config.MemorySize,
        environment: config.Environment?.Variables ?? {},
        assetDir: join(cdkOut, `asset.${key.replace(/\.zip$/, '')}`),
        eventSources: mappings.EventSourceMappings.map((m) => ({
          queueArn: m.EventSourceArn,
          batchSize: m.BatchSize,
          reportsItemFailures: (m.FunctionResponseTypes ?? []).includes('ReportBatchItemFailures'),
          maxConcurrency: m.ScalingConfig?.MaximumConcurrency,
        })),
      };
    };
    return {
      stackName,
      outputs: outputs as Record<string, string>,
      resources,
      notCreated,
      functions: {
        request: await fn('PoolRequestFunction'),
        fulfil: await fn('PoolFulfilFunction'),
        reaper: await fn('PoolReaperFunction'),
      },
      physicalId,
    };
  } finally {
    cfn.destroy();
  }
}

/**
 * A GET on moto's Lambda REST API (the SDK's Lambda client is not a dependency of this project).
 * moto picks the service from the credential scope of the Authorization header and checks no signature.
 */
async function lambdaApi(moto: Moto, path: string): Promise<unknown> {
  const res = await fetch(`${moto.endpoint}${path}`, {
    headers: {
      authorization: `AWS4-HMAC-SHA256 Credential=${MOTO_CREDENTIALS.accessKeyId}/20260101/${DEPLOY_REGION}/lambda/aws4_request, SignedHeaders=host, Signature=0`,
    },
  });
  if (!res.ok) throw new Error(`moto lambda GET ${path}: HTTP ${res.status} ${await res.text()}`);
  return res.json();
}

type Handler = (event: unknown, context: LambdaContext) => Promise<unknown>;

/**
 * A deployed function's bundle loaded into this process, as Lambda would run it: its environment is the
 * deployed one plus what the Lambda runtime sets, applied before each invocation (a bundle builds its
 * clients from the environment on its first invocation), with the SDK pointed at moto.
 */
export class BundleRunner {
  private readonly base: NodeJS.ProcessEnv;
  private readonly handlers = new Map<string, Handler>();

  constructor(private readonly moto: Moto) {
    this.base = { ...process.env };
  }

  async invoke<T = unknown>(fn: DeployedFunction, event: unknown): Promise<T> {
    const runtimeEnv = {
      // What the Lambda runtime sets (AWS_EXECUTION_ENV is left out: it would turn X-Ray tracing on).
      AWS_LAMBDA_FUNCTION_NAME: fn.functionName,
      AWS_LAMBDA_FUNCTION_MEMORY_SIZE: String(fn.memorySize),
      AWS_LAMBDA_FUNCTION_VERSION: '$LATEST',
      LAMBDA_TASK_ROOT: fn.assetDir,
      _HANDLER: fn.handler,
      POWERTOOLS_LOG_LEVEL: 'WARN',
      POWERTOOLS_METRICS_DISABLED: 'true',
    };
    for (const k of Object.keys(process.env)) delete process.env[k];
    Object.assign(process.env, motoProcessEnv(this.moto), runtimeEnv, fn.environment);
    delete process.env.NODE_OPTIONS;
    try {
      const deadline = Date.now() + fn.timeoutSeconds * 1000;
      const context: LambdaContext = {
        callbackWaitsForEmptyEventLoop: true,
        functionName: fn.functionName,
        functionVersion: '$LATEST',
        invokedFunctionArn: fn.functionArn,
        memoryLimitInMB: String(fn.memorySize),
        awsRequestId: randomUUID(),
        logGroupName: `/aws/lambda/${fn.functionName}`,
        logStreamName: 'moto',
        getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
        done: () => undefined,
        fail: () => undefined,
        succeed: () => undefined,
      };
      return (await this.handler(fn)(event, context)) as T;
    } finally {
      for (const k of Object.keys(process.env)) delete process.env[k];
      Object.assign(process.env, this.base);
    }
  }

  private handler(fn: DeployedFunction): Handler {
    let h = this.handlers.get(fn.assetDir);
    if (!h) {
      const [file, exported] = fn.handler.split('.') as [string, string];
      const mod = createRequire(import.meta.url)(join(fn.assetDir, `${file}.js`)) as Record<string, unknown>;
      const found = mod[exported];
      if (typeof found !== 'function') throw new Error(`${fn.assetDir}/${file}.js exports no ${exported}`);
      h = found as Handler;
      this.handlers.set(fn.assetDir, h);
    }
    return h;
  }
}

/**
 * What an SQS event source mapping does, once: receive a batch from the queue, invoke the function with
 * it, delete the records it did not report as failed (all of them when it throws: none).
 */
export async function pollQueue(
  runner: BundleRunner,
  sqs: SQSClient,
  fn: DeployedFunction,
  queueArn: string,
): Promise<{ records: number; failed: string[] }> {
  const source = fn.eventSources.find((s) => s.queueArn === queueArn);
  if (!source) throw new Error(`${fn.functionName} has no event source mapping on ${queueArn}`);
  const name = queueArn.split(':').pop() as string;
  const { QueueUrl } = await sqs.send(new GetQueueUrlCommand({ QueueName: name }));
  const out = await sqs.send(
    new ReceiveMessageCommand({
      QueueUrl,
      MaxNumberOfMessages: source.batchSize,
      MessageSystemAttributeNames: ['All'],
      MessageAttributeNames: ['All'],
      WaitTimeSeconds: 1,
    }),
  );
  const messages = out.Messages ?? [];
  if (messages.length === 0) return { records: 0, failed: [] };
  const event: SQSEvent = {
    Records: messages.map((m) => ({
      messageId: m.MessageId as string,
      receiptHandle: m.ReceiptHandle as string,
      body: m.Body as string,
      attributes: {
        ApproximateReceiveCount: m.Attributes?.ApproximateReceiveCount ?? '1',
        SentTimestamp: m.Attributes?.SentTimestamp ?? String(Date.now()),
        SenderId: m.Attributes?.SenderId ?? MOTO_ACCOUNT,
        ApproximateFirstReceiveTimestamp:
          m.Attributes?.ApproximateFirstReceiveTimestamp ?? String(Date.now()),
      },
      messageAttributes: {},
      md5OfBody: m.MD5OfBody as string,
      eventSource: 'aws:sqs',
      eventSourceARN: queueArn,
      awsRegion: DEPLOY_REGION,
    })),
  };
  const response = await runner.invoke<SQSBatchResponse | undefined>(fn, event);
  const failed = source.reportsItemFailures
    ? (response?.batchItemFailures ?? []).map((f) => f.itemIdentifier)
    : [];
  const done = messages.filter((m) => !failed.includes(m.MessageId as string));
  if (done.length > 0) {
    await sqs.send(
      new DeleteMessageBatchCommand({
        QueueUrl,
        Entries: done.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle as string })),
      }),
    );
  }
  return { records: messages.length, failed };
}

/** The pool configuration the smoke deploys: examples/aws.yaml's shape, on moto's network. */
export function deployConfig(network: Network): string {
  return `# metastatic deploy smoke (moto)\n${poolConfig({
    backing: {
      driver: 'aws',
      provider: { region: DEPLOY_REGION },
      pool: {
        'max-servers': 2,
        'subnet-ids': [network.subnetId],
        'security-group-id': network.securityGroupId,
        // moto's instances print no console output of cloud-init (host-keys: console, the default
        // outside the VPC, would wait for keys that never come) and answer no SSH scan: none.
        'host-keys': 'none',
      },
      labels: [
        {
          name: 'arm-large',
          'instance-types': ['m7g.2xlarge'],
          'image-id': network.imageId,
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

export async function writePoolConfig(dir: string, network: Network): Promise<string> {
  const path = join(dir, 'pool.yaml');
  await writeFile(path, deployConfig(network));
  return path;
}
