import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { ISecurityGroup, IVpc, SubnetSelection } from 'aws-cdk-lib/aws-ec2';
import { type IRole, ManagedPolicy, Role, ServicePrincipal } from 'aws-cdk-lib/aws-iam';
import {
  Architecture,
  type CfnFunction,
  Code,
  Function as LambdaFunction,
  LoggingFormat,
  Runtime,
  Tracing,
} from 'aws-cdk-lib/aws-lambda';
import { LogGroup, RetentionDays } from 'aws-cdk-lib/aws-logs';
import {
  AssetHashType,
  DockerImage,
  Duration,
  type ILocalBundling,
  Stack,
  Validations,
} from 'aws-cdk-lib/core';
import { Construct } from 'constructs';
import { FUNCTION_TIMEOUT_SECONDS } from '../shared/core/timing.ts';
import { cfnResource } from './cfnResource.ts';
import {
  BUNDLE_FILE,
  functionEntry,
  makeReadableByAll,
  type PoolFunctionName,
  prebuiltBundleDir,
  writeBundle,
} from './lambdaBundle.ts';

export { POOL_FUNCTION_NAMES, type PoolFunctionName } from './lambdaBundle.ts';

/** Node.js runtime of every pool function (the newest aws-cdk-lib knows; cdk-nag checks it is the newest). */
export const POOL_RUNTIME = Runtime.NODEJS_24_X;

/** Lambda's limit on a function's environment: its variables serialized as JSON, in bytes. */
export const LAMBDA_ENVIRONMENT_LIMIT = 4096;
/**
 * What a value unknown at synth (a table name, a queue ARN) is counted as in the environment's size:
 * an upper bound for the names and ARNs the stack passes (resource names stop at 256 characters).
 */
export const TOKEN_ALLOWANCE = 256;

export interface PoolFunctionProps {
  /** Which entry point: `functions/<name>/index.ts`. */
  readonly name: PoolFunctionName;
  /**
   * Required for a function the timing contract has no timeout for (github).
   * @default FUNCTION_TIMEOUT_SECONDS[name] (shared/core/timing.ts: 30 s for request and fulfil, 60 s
   *   for the reaper), the timing contract the use cases' deadlines are derived from
   */
  readonly timeout?: Duration;
  /**
   * @default 512 MB
   */
  readonly memorySize?: number;
  /**
   * Retention of the function's log group.
   * @default RetentionDays.ONE_MONTH
   */
  readonly logRetention?: RetentionDays;
  /**
   * Reserved concurrent executions.
   * @default - none: the function draws on the account's unreserved concurrency
   */
  readonly reservedConcurrentExecutions?: number;
  /**
   * Environment variables, in addition to NODE_OPTIONS (source maps). Synth fails when the function's
   * whole environment, with what is added later, would exceed Lambda's 4 KB.
   * @default - none
   */
  readonly environment?: Readonly<Record<string, string>>;
  /**
   * Files shipped in the function's asset next to the bundle, by file name: the asset hash (and so the
   * deployed code) changes when one does. Written at synth to a private temporary directory and copied
   * into the bundle's output by path; their contents never pass through a shell.
   * @default - none
   */
  readonly files?: Readonly<Record<string, string>>;
  /**
   * Retries of a failed asynchronous invocation (Lambda's default is 2).
   * @default - Lambda's default
   */
  readonly retryAttempts?: number;
  /**
   * How long an asynchronous invocation may wait in Lambda's queue before it is dropped.
   * @default - Lambda's default (6 hours)
   */
  readonly maxEventAge?: Duration;
  /**
   * Runs the function in this VPC (its subnets and security groups below).
   * @default - outside any VPC
   */
  readonly vpc?: IVpc;
  /** @default - the VPC's private subnets (CDK's default selection) */
  readonly vpcSubnets?: SubnetSelection;
  /** @default - a security group of its own, all outbound allowed */
  readonly securityGroups?: readonly ISecurityGroup[];
}

/**
 * The defaults every pool function shares: Node.js 24 on ARM64, its code the bundle of lambdaBundle.ts
 * (prebuilt in an installed package; built from the sources with the local esbuild, no Docker, at synth
 * in this repository) with the given files beside it, the timeouts of the timing contract, active X-Ray
 * tracing, an explicit log group with retention, and a role of its own that can write to that log group
 * and nothing else until granted more. Its environment is checked against Lambda's limit at synth, as
 * Lambda measures it.
 */
export class PoolFunction extends Construct {
  readonly function: LambdaFunction;
  readonly role: IRole;
  readonly logGroup: LogGroup;

  constructor(scope: Construct, id: string, props: PoolFunctionProps) {
    super(scope, id);
    this.logGroup = new LogGroup(this, 'Logs', {
      retention: props.logRetention ?? RetentionDays.ONE_MONTH,
    });
    // A role of our own instead of the default one: the default attaches AWSLambdaBasicExecutionRole
    // (logs:CreateLogGroup and writes to every log group); this one writes to its own log group only.
    const role = new Role(this, 'Role', { assumedBy: new ServicePrincipal('lambda.amazonaws.com') });
    this.role = role;
    this.logGroup.grantWrite(role);
    this.function = this.create(props, role);
    this.function.node.addValidation({ validate: () => this.checkEnvironment() });

    if (props.vpc) {
      // Lambda creates and deletes the function's network interfaces with the function's role, and
      // CloudFormation refuses a VPC function whose role cannot (a role of our own gets nothing by default).
      role.addManagedPolicy(
        ManagedPolicy.fromAwsManagedPolicyName('service-role/AWSLambdaVPCAccessExecutionRole'),
      );
      Validations.of(cfnResource(role)).acknowledge({
        id: 'AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole]',
        reason:
          "AWS's policy for a function's network interfaces in a VPC (ec2:CreateNetworkInterface and friends on *): the permissions Lambda needs, kept current by AWS.",
      });
    }

    // Active tracing adds xray:PutTraceSegments and xray:PutTelemetryRecords on "*" to the role's
    // default policy; everything else in that policy is granted on named resources.
    const defaultPolicy = role.node.tryFindChild('DefaultPolicy');
    if (defaultPolicy) {
      Validations.of(cfnResource(defaultPolicy)).acknowledge({
        id: 'AwsSolutions-IAM5[Resource::*]',
        reason:
          'X-Ray PutTraceSegments and PutTelemetryRecords (active tracing) support no resource-level permissions.',
      });
    }
  }

  private create(props: PoolFunctionProps, role: IRole): LambdaFunction {
    return new LambdaFunction(this, 'Function', {
      code: functionCode(props.name, props.files ?? {}),
      handler: `${BUNDLE_FILE.replace(/\.js$/, '')}.handler`,
      runtime: POOL_RUNTIME,
      architecture: Architecture.ARM_64,
      memorySize: props.memorySize ?? 512,
      timeout: props.timeout ?? contractTimeout(props.name),
      role,
      logGroup: this.logGroup,
      loggingFormat: LoggingFormat.JSON,
      tracing: Tracing.ACTIVE,
      ...(props.reservedConcurrentExecutions !== undefined
        ? { reservedConcurrentExecutions: props.reservedConcurrentExecutions }
        : {}),
      environment: { NODE_OPTIONS: '--enable-source-maps', ...props.environment },
      ...(props.retryAttempts !== undefined ? { retryAttempts: props.retryAttempts } : {}),
      ...(props.maxEventAge ? { maxEventAge: props.maxEventAge } : {}),
      ...(props.vpc
        ? {
            vpc: props.vpc,
            ...(props.vpcSubnets ? { vpcSubnets: props.vpcSubnets } : {}),
            ...(props.securityGroups ? { securityGroups: [...props.securityGroups] } : {}),
          }
        : {}),
    });
  }

  /**
   * Lambda refuses an environment whose variables, serialized as JSON, exceed 4 KB; checked when the app
   * is validated, after every variable was added (addEnvironment included), with the sizes.
   */
  private checkEnvironment(): string[] {
    const cfn = this.function.node.defaultChild as CfnFunction;
    const resolved = Stack.of(this).resolve(cfn.environment) as
      | { variables?: Record<string, unknown> }
      | undefined;
    const variables = resolved?.variables ?? {};
    const size = environmentSize(variables);
    if (size <= LAMBDA_ENVIRONMENT_LIMIT) return [];
    const largest = Object.entries(variables)
      .map(([name, value]) => [name, environmentSize({ [name]: value }) - 2] as const)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 3)
      .map(([name, bytes]) => `${name} ${bytes}`)
      .join(', ');
    return [
      `the environment of ${this.node.path} takes ${size} bytes as Lambda measures it (its variables as ` +
        `JSON, a value unknown at synth counted as ${TOKEN_ALLOWANCE}); Lambda allows ${LAMBDA_ENVIRONMENT_LIMIT}. ` +
        `Largest: ${largest}.`,
    ];
  }

  get timeout(): Duration {
    // The function keeps the timeout it was given; fall back to Lambda's default only for the type.
    return this.function.timeout ?? Duration.seconds(3);
  }
}

/** A function's timeout in the timing contract (shared/core/timing.ts); one it has none for must be given. */
function contractTimeout(name: PoolFunctionName): Duration {
  const seconds = (FUNCTION_TIMEOUT_SECONDS as Partial<Record<PoolFunctionName, number>>)[name];
  if (seconds === undefined) {
    throw new Error(
      `the ${name} function has no timeout in the timing contract: give PoolFunctionProps.timeout`,
    );
  }
  return Duration.seconds(seconds);
}

/**
 * The size Lambda measures for an environment: the variables map serialized as JSON (quotes, colons,
 * commas and escapes count), in UTF-8 bytes. A value CloudFormation resolves at deploy time (a Ref, a
 * GetAtt) counts as TOKEN_ALLOWANCE characters; literal parts of a Fn::Join count as they are.
 */
export function environmentSize(variables: Readonly<Record<string, unknown>>): number {
  const estimated = Object.fromEntries(Object.entries(variables).map(([k, v]) => [k, deployedValue(v)]));
  return Buffer.byteLength(JSON.stringify(estimated));
}

function deployedValue(value: unknown): string {
  if (typeof value === 'string') return value;
  const join = (value as { 'Fn::Join'?: [string, unknown[]] } | null)?.['Fn::Join'];
  if (join) return join[1].map(deployedValue).join(join[0]);
  return 'x'.repeat(TOKEN_ALLOWANCE);
}

/**
 * The function's code package: its bundle and `files` beside it, written by a local bundling step (plain
 * file writes, no shell, no Docker) when the stack is synthesized with bundling (`cdk synth` and
 * `deploy` do; tests skip it for stacks not named in `aws:cdk:bundling-stacks`). Every file is written
 * readable by all (0644, set after writing, so the umask of whoever synthesizes does not count): Lambda
 * runs the code as a user other than the package's owner and fails with EACCES on a file it cannot read. The asset hash is the output's, so a change in the code or in a file
 * changes the deployed package, and two functions with different files never share one.
 */
function functionCode(name: PoolFunctionName, files: Readonly<Record<string, string>>): Code {
  const names = Object.keys(files).sort();
  for (const file of names) {
    if (!/^[A-Za-z0-9][\w.-]*$/.test(file) || file.startsWith(BUNDLE_FILE)) {
      throw new Error(`files: ${JSON.stringify(file)} is not a plain file name beside the bundle`);
    }
  }
  const digest = createHash('sha256');
  for (const file of names) digest.update(`${file}\0${files[file]}\0`);
  const local: ILocalBundling & { readonly filesDigest: string } = {
    // Part of the asset cache key: CDK caches a bundled asset by its bundling options (functions do not
    // count), and two functions bundled from one entry point with different files must not share one.
    filesDigest: digest.digest('hex'),
    tryBundle(outputDir: string): boolean {
      writeBundle(name, outputDir);
      for (const file of names) {
        writeFileSync(join(outputDir, file), files[file] ?? '', { flag: 'wx' });
      }
      makeReadableByAll(outputDir);
      return true;
    },
  };
  const source = prebuiltBundleDir(name) ?? dirname(functionEntry(name) ?? missingBundle(name));
  return Code.fromAsset(source, {
    assetHashType: AssetHashType.OUTPUT,
    bundling: {
      local,
      // Never used: the local step above always bundles (or throws). CDK requires an image.
      image: DockerImage.fromRegistry('public.ecr.aws/docker/library/node:24'),
    },
  });
}

function missingBundle(name: PoolFunctionName): never {
  throw new Error(
    `no code for the ${name} function: neither dist/lambda/${name} nor functions/${name}/index.ts`,
  );
}
