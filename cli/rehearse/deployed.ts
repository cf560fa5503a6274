import {
  type CloudFormationClient,
  DescribeStacksCommand,
  paginateListStackResources,
  type StackResourceSummary,
} from '@aws-sdk/client-cloudformation';
import { GetQueueAttributesCommand, type SQSClient } from '@aws-sdk/client-sqs';
import { STACK_OUTPUTS } from '../../shared/runtime/stackOutputs.ts';
import { type FunctionCode, functionCode, type Template } from './assembly.ts';
import { MOTO_CREDENTIALS } from './motoServer.ts';

/** What a deployed pool stack is, read back from moto: what the rehearsal runs and feeds. */

export type PoolFunctionRole = 'request' | 'fulfil' | 'reaper';

/** An SQS event source mapping of a function. */
export interface EventSource {
  readonly queueArn: string;
  readonly batchSize: number;
  readonly reportsItemFailures: boolean;
  readonly maxConcurrency?: number;
}

/** A function of the deployed stack: its deployed configuration and the code CDK deployed for it. */
export interface DeployedFunction {
  readonly logicalId: string;
  readonly functionName: string;
  readonly functionArn: string;
  readonly handler: string;
  readonly timeoutSeconds: number;
  readonly memorySize: number;
  /** The environment CloudFormation gave it (resolved), as moto's Lambda stores it. */
  readonly environment: Readonly<Record<string, string>>;
  /** Its code: the asset directory in the assembly that was zipped and uploaded. */
  readonly codeDir: string;
  readonly eventSources: readonly EventSource[];
}

export interface DeployedPool {
  readonly stackName: string;
  readonly region: string;
  readonly outputs: Readonly<Record<string, string>>;
  readonly requestQueueUrl: string;
  readonly requestQueueArn: string;
  readonly fulfilQueueUrl: string;
  readonly fulfilQueueArn: string;
  readonly tableName: string;
  readonly poolId: string;
  readonly resources: readonly StackResourceSummary[];
  readonly functions: Readonly<Record<PoolFunctionRole, DeployedFunction>>;
  /** The reaper's schedule rule (its name) and rate, in seconds (undefined for a cron expression). */
  readonly schedule: { readonly ruleName: string; readonly expression: string; readonly seconds?: number };
  /**
   * Types of the template's resources that moto's CloudFormation did not create: it skips types it does
   * not implement, with a warning only (moto 5.2.1: AWS::CloudWatch::Alarm, AWS::SQS::QueuePolicy,
   * AWS::Lambda::EventInvokeConfig, AWS::CDK::Metadata).
   */
  readonly notCreated: readonly string[];
  /** The physical id of the one resource of this type whose logical id starts with `prefix`. */
  physicalId(type: string, prefix: string): string;
}

export interface Clients {
  readonly cfn: CloudFormationClient;
  readonly sqs: SQSClient;
  readonly endpoint: string;
  readonly region: string;
}

/** Reads what a deployed pool stack created, through CloudFormation, SQS, EventBridge and Lambda on moto. */
export async function describePool(
  clients: Clients,
  stackName: string,
  assemblyDir: string,
  template: Template,
): Promise<DeployedPool> {
  const { cfn, sqs } = clients;
  const stack = (await cfn.send(new DescribeStacksCommand({ StackName: stackName }))).Stacks?.[0];
  if (!stack) throw new Error(`stack ${stackName} not found`);
  const outputs = Object.fromEntries(
    (stack.Outputs ?? []).map((o) => [o.OutputKey as string, o.OutputValue as string]),
  );
  const resources: StackResourceSummary[] = [];
  for await (const page of paginateListStackResources({ client: cfn }, { StackName: stackName }))
    resources.push(...(page.StackResourceSummaries ?? []));
  const created = new Set(resources.map((r) => r.LogicalResourceId));
  const notCreated = [
    ...new Set(
      Object.entries(template.Resources ?? {})
        .filter(([id]) => !created.has(id))
        .map(([, r]) => r.Type),
    ),
  ].sort();
  const physicalId = (type: string, prefix: string): string => {
    const found = resources.filter((r) => r.ResourceType === type && r.LogicalResourceId?.startsWith(prefix));
    if (found.length !== 1 || !found[0]?.PhysicalResourceId)
      throw new Error(`expected one ${type} ${prefix}* in ${stackName}, found ${found.length}`);
    return found[0].PhysicalResourceId;
  };
  const queueArn = async (url: string) =>
    (await sqs.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['QueueArn'] })))
      .Attributes?.QueueArn as string;
  const requestQueueUrl = outputs[STACK_OUTPUTS.requestQueueUrl] as string;
  const fulfilQueueUrl = outputs[STACK_OUTPUTS.fulfilQueueUrl] as string;
  const tableName = outputs[STACK_OUTPUTS.tableName] as string;
  const poolId = outputs[STACK_OUTPUTS.poolId] as string;
  const [requestQueueArn, fulfilQueueArn] = await Promise.all([
    queueArn(requestQueueUrl),
    queueArn(fulfilQueueUrl),
  ]);

  // The pool's functions: those of the stack whose deployed environment names the pool's table and id.
  const code = new Map<string, FunctionCode>(
    functionCode(assemblyDir, template).map((f) => [f.logicalId, f]),
  );
  const functions: DeployedFunction[] = [];
  for (const r of resources) {
    if (r.ResourceType !== 'AWS::Lambda::Function' || !r.PhysicalResourceId || !r.LogicalResourceId) continue;
    const codeDir = code.get(r.LogicalResourceId)?.codeDir;
    if (!codeDir) continue;
    const fn = await deployedFunction(clients, r.LogicalResourceId, r.PhysicalResourceId, codeDir);
    if (fn.environment.TABLE_NAME === tableName && fn.environment.POOL_ID === poolId) functions.push(fn);
  }
  const consuming = (arn: string) => functions.filter((f) => f.eventSources.some((s) => s.queueArn === arn));
  const [request] = consuming(requestQueueArn);
  const [fulfil] = consuming(fulfilQueueArn);

  // The reaper: the pool function a schedule rule of the template invokes (read from the template: the
  // rehearsal removes the deployed rule's target, see rehearsal.ts) and no queue feeds (the github
  // function, with a github section, has a schedule too, and its queue).
  let reaper: DeployedFunction | undefined;
  let schedule: DeployedPool['schedule'] | undefined;
  for (const [ruleId, rule] of Object.entries(template.Resources ?? {})) {
    const expression = rule.Properties?.ScheduleExpression;
    if (rule.Type !== 'AWS::Events::Rule' || typeof expression !== 'string') continue;
    const targets = (rule.Properties?.Targets ?? []) as Array<{ Arn?: { 'Fn::GetAtt'?: [string, string] } }>;
    const targeted = new Set(targets.map((t) => t.Arn?.['Fn::GetAtt']?.[0]));
    const target = functions.find((f) => targeted.has(f.logicalId) && f.eventSources.length === 0);
    const ruleName = resources.find((r) => r.LogicalResourceId === ruleId)?.PhysicalResourceId;
    if (!target || !ruleName) continue;
    reaper = target;
    const seconds = rateSeconds(expression);
    schedule = { ruleName, expression, ...(seconds !== undefined ? { seconds } : {}) };
  }
  if (!request || !fulfil || !reaper || !schedule) {
    const missing = [
      !request && 'the request function (consumer of the request queue)',
      !fulfil && 'the fulfil function (consumer of the fulfil queue)',
      !reaper && "the reaper function (its schedule's target)",
    ].filter(Boolean);
    throw new Error(`stack ${stackName}: cannot find ${missing.join(', ')} among its functions`);
  }
  return {
    stackName,
    region: clients.region,
    outputs,
    requestQueueUrl,
    requestQueueArn,
    fulfilQueueUrl,
    fulfilQueueArn,
    tableName,
    poolId,
    resources,
    functions: { request, fulfil, reaper },
    schedule,
    notCreated,
    physicalId,
  };
}

/** `rate(5 minutes)` in seconds; undefined for anything else (a cron expression). */
export function rateSeconds(expression: string): number | undefined {
  const m = /^rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)$/.exec(expression.trim());
  if (!m) return undefined;
  const unit = { minute: 60, hour: 3600, day: 86_400 }[(m[2] as string).replace(/s$/, '') as 'minute'];
  return Number(m[1]) * unit;
}

async function deployedFunction(
  clients: Clients,
  logicalId: string,
  functionName: string,
  codeDir: string,
): Promise<DeployedFunction> {
  const config = (await lambdaApi(clients, `/2015-03-31/functions/${functionName}/configuration`)) as {
    FunctionArn: string;
    Handler: string;
    Timeout: number;
    MemorySize: number;
    Environment?: { Variables?: Record<string, string> };
  };
  const mappings = (await lambdaApi(
    clients,
    `/2015-03-31/event-source-mappings/?FunctionName=${encodeURIComponent(functionName)}`,
  )) as {
    EventSourceMappings: {
      EventSourceArn: string;
      BatchSize: number;
      FunctionResponseTypes?: string[];
      ScalingConfig?: { MaximumConcurrency?: number };
    }[];
  };
  return {
    logicalId,
    functionName,
    functionArn: config.FunctionArn,
    handler: config.Handler,
    timeoutSeconds: config.Timeout,
    memorySize: config.MemorySize,
    environment: config.Environment?.Variables ?? {},
    codeDir,
    eventSources: mappings.EventSourceMappings.map((m) => ({
      queueArn: m.EventSourceArn,
      batchSize: m.BatchSize,
      reportsItemFailures: (m.FunctionResponseTypes ?? []).includes('ReportBatchItemFailures'),
      ...(m.ScalingConfig?.MaximumConcurrency !== undefined
        ? { maxConcurrency: m.ScalingConfig.MaximumConcurrency }
        : {}),
    })),
  };
}

/**
 * A GET on moto's Lambda REST API (the SDK's Lambda client is not a dependency of this package). moto
 * picks the service from the credential scope of the Authorization header and checks no signature.
 */
async function lambdaApi(clients: Clients, path: string): Promise<unknown> {
  const res = await fetch(`${clients.endpoint}${path}`, {
    headers: {
      authorization: `AWS4-HMAC-SHA256 Credential=${MOTO_CREDENTIALS.accessKeyId}/20260101/${clients.region}/lambda/aws4_request, SignedHeaders=host, Signature=0`,
    },
  });
  if (!res.ok) throw new Error(`moto lambda GET ${path}: HTTP ${res.status} ${await res.text()}`);
  return res.json();
}
