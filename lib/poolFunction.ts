import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Duration, Stack, Validations } from 'aws-cdk-lib';
import type { ISecurityGroup, IVpc, SubnetSelection } from 'aws-cdk-lib/aws-ec2';
import { type IRole, ManagedPolicy, Role, ServicePrincipal } from 'aws-cdk-lib/aws-iam';
import { Architecture, type CfnFunction, LoggingFormat, Runtime, Tracing } from 'aws-cdk-lib/aws-lambda';
import { type ICommandHooks, NodejsFunction, OutputFormat } from 'aws-cdk-lib/aws-lambda-nodejs';
import { LogGroup, RetentionDays } from 'aws-cdk-lib/aws-logs';
import { Construct } from 'constructs';
import { FUNCTION_TIMEOUT_SECONDS } from '../shared/core/timing.ts';
import { cfnResource } from './cfnResource.ts';

/** The Lambda functions of the pool: each has its entry point at `functions/<name>/index.ts`. */
export const POOL_FUNCTION_NAMES = ['request', 'fulfil', 'reaper'] as const;
export type PoolFunctionName = (typeof POOL_FUNCTION_NAMES)[number];

/** The repository root (lib/..): entry points and the lock file are found from here, not from the cwd. */
const PROJECT_ROOT = fileURLToPath(new URL('..', import.meta.url));

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
 * The defaults every pool function shares: Node.js 24 on ARM64, bundled locally with esbuild (no Docker)
 * to one minified CommonJS file with its source map and the AWS SDK inside (the version the code was
 * tested with, not the runtime's), the timeouts of the timing contract, active X-Ray tracing, an
 * explicit log group with retention, and a role of its own that can write to that log group and nothing
 * else until granted more. Its environment is checked against Lambda's limit at synth, as Lambda
 * measures it.
 */
export class PoolFunction extends Construct {
  readonly function: NodejsFunction;
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

    // Bundling runs inside the NodejsFunction constructor, so the staged files are needed only until it returns.
    const staged = stageFiles(props.files ?? {});
    try {
      this.function = this.bundle(props, role, staged?.hooks);
    } finally {
      staged?.remove();
    }
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

  private bundle(props: PoolFunctionProps, role: IRole, hooks: ICommandHooks | undefined): NodejsFunction {
    return new NodejsFunction(this, 'Function', {
      entry: fileURLToPath(new URL(`../functions/${props.name}/index.ts`, import.meta.url)),
      handler: 'handler',
      projectRoot: PROJECT_ROOT,
      depsLockFilePath: fileURLToPath(new URL('../package-lock.json', import.meta.url)),
      runtime: POOL_RUNTIME,
      architecture: Architecture.ARM_64,
      memorySize: props.memorySize ?? 512,
      timeout: props.timeout ?? Duration.seconds(FUNCTION_TIMEOUT_SECONDS[props.name]),
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
      bundling: {
        // CommonJS: the code has no top-level await or import.meta on the Lambda path, and CJS output
        // needs no createRequire banner for the dependencies that call require() (ssh2, the SDK).
        format: OutputFormat.CJS,
        minify: true,
        sourceMap: true,
        sourcesContent: false,
        target: 'node24',
        // The SDK goes into the bundle. The only externals are native addons (ssh2's optional crypto
        // binding, cpu-features): built for this machine, not for Lambda's ARM64, and required inside
        // try/catch, so in Lambda the require fails and ssh2 uses its JavaScript implementation.
        bundleAwsSDK: true,
        externalModules: ['*.node'],
        forceDockerBundling: false,
        ...(hooks ? { commandHooks: hooks } : {}),
      },
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
    // NodejsFunction keeps the timeout it was given; fall back to Lambda's default only for the type.
    return this.function.timeout ?? Duration.seconds(3);
  }
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

/** Staged files and the bundling hooks that copy them into the bundle's output. */
interface StagedFiles {
  readonly hooks: ICommandHooks;
  readonly remove: () => void;
}

/**
 * Writes the files to a new private directory (0700, files 0600) and returns command hooks that copy
 * them, by quoted path, into the bundle's output. The hooks also carry a digest of the files: CDK
 * caches a staged asset by its bundling options (functions do not count), and two functions bundled
 * from one entry point with different files must not share one.
 */
function stageFiles(files: Readonly<Record<string, string>>): StagedFiles | undefined {
  const names = Object.keys(files).sort();
  if (names.length === 0) return undefined;
  const dir = mkdtempSync(join(tmpdir(), 'metastatic-asset-'));
  try {
    const digest = createHash('sha256');
    const copies: Array<readonly [string, string]> = [];
    for (const name of names) {
      if (!/^[A-Za-z0-9][\w.-]*$/.test(name) || /^index\.js/.test(name)) {
        throw new Error(`files: ${JSON.stringify(name)} is not a plain file name beside the bundle`);
      }
      const text = files[name] ?? '';
      const source = join(dir, name);
      writeFileSync(source, text, { mode: 0o600, flag: 'wx' });
      digest.update(`${name}\0${text}\0`);
      copies.push([source, name]);
    }
    const hooks: ICommandHooks & { readonly filesDigest: string } = {
      filesDigest: digest.digest('hex'),
      beforeBundling: () => [],
      beforeInstall: () => [],
      // Local bundling runs these with bash -c: only paths are in the command, each quoted.
      afterBundling: (_inputDir, outputDir) =>
        copies.map(([source, name]) => `cp -- ${shellQuote(source)} ${shellQuote(join(outputDir, name))}`),
    };
    return { hooks, remove: () => rmSync(dir, { recursive: true, force: true }) };
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

/** A POSIX shell single-quoted word. */
function shellQuote(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}
