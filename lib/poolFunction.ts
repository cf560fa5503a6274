import { fileURLToPath } from 'node:url';
import { Duration, Validations } from 'aws-cdk-lib';
import type { ISecurityGroup, IVpc, SubnetSelection } from 'aws-cdk-lib/aws-ec2';
import { type IRole, ManagedPolicy, Role, ServicePrincipal } from 'aws-cdk-lib/aws-iam';
import { Architecture, LoggingFormat, Runtime, Tracing } from 'aws-cdk-lib/aws-lambda';
import { NodejsFunction, OutputFormat } from 'aws-cdk-lib/aws-lambda-nodejs';
import { LogGroup, RetentionDays } from 'aws-cdk-lib/aws-logs';
import { Construct } from 'constructs';
import { cfnResource } from './cfnResource.ts';

/** The Lambda functions of the pool: each has its entry point at `functions/<name>/index.ts`. */
export const POOL_FUNCTION_NAMES = ['request', 'fulfil', 'reaper'] as const;
export type PoolFunctionName = (typeof POOL_FUNCTION_NAMES)[number];

/** The repository root (lib/..): entry points and the lock file are found from here, not from the cwd. */
const PROJECT_ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Node.js runtime of every pool function (the newest aws-cdk-lib knows; cdk-nag checks it is the newest). */
export const POOL_RUNTIME = Runtime.NODEJS_24_X;

export interface PoolFunctionProps {
  /** Which entry point: `functions/<name>/index.ts`. */
  readonly name: PoolFunctionName;
  /**
   * @default 30 seconds for request and fulfil, 60 seconds for reaper
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
   * Environment variables, in addition to NODE_OPTIONS (source maps).
   * @default - none
   */
  readonly environment?: Readonly<Record<string, string>>;
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
 * tested with, not the runtime's), active X-Ray tracing, an explicit log group with retention, and a
 * role of its own that can write to that log group and nothing else until granted more.
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

    this.function = new NodejsFunction(this, 'Function', {
      entry: fileURLToPath(new URL(`../functions/${props.name}/index.ts`, import.meta.url)),
      handler: 'handler',
      projectRoot: PROJECT_ROOT,
      depsLockFilePath: fileURLToPath(new URL('../package-lock.json', import.meta.url)),
      runtime: POOL_RUNTIME,
      architecture: Architecture.ARM_64,
      memorySize: props.memorySize ?? 512,
      timeout: props.timeout ?? (props.name === 'reaper' ? Duration.seconds(60) : Duration.seconds(30)),
      role,
      logGroup: this.logGroup,
      loggingFormat: LoggingFormat.JSON,
      tracing: Tracing.ACTIVE,
      ...(props.reservedConcurrentExecutions !== undefined
        ? { reservedConcurrentExecutions: props.reservedConcurrentExecutions }
        : {}),
      environment: { NODE_OPTIONS: '--enable-source-maps', ...props.environment },
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
      },
    });

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

  get timeout(): Duration {
    // NodejsFunction keeps the timeout it was given; fall back to Lambda's default only for the type.
    return this.function.timeout ?? Duration.seconds(3);
  }
}
