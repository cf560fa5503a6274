/**
 * The CDK app: one MetastaticStack from a YAML configuration, checked with cdk-nag's AWS Solutions and
 * Serverless packs (synth fails on any finding not acknowledged in the constructs).
 *
 *   npx cdk synth -c config=path/to/pool.yaml [-c poolId=...] [-c instanceRoles=role-a,role-b]
 *                 [-c vpcId=vpc-... -c functionSubnetIds=subnet-a,subnet-b [-c functionSecurityGroupIds=sg-...]]
 *                 [-c ebsKmsKeyArn=arn:aws:kms:<region>:<account>:key/<id>] [-c dashboard=false]
 *
 * The only place that reads the environment: the account the CDK CLI resolved. The region is the one
 * the configuration's aws pools name (CDK_DEFAULT_REGION is the CLI profile's, us-east-1 without one,
 * and a pool elsewhere would never see its instances' EC2 events); `-c region=...` must agree with it.
 */
import { App, Validations } from 'aws-cdk-lib/core';
import { AwsSolutionsChecks, ServerlessChecks } from 'cdk-nag';
import { MetastaticStack } from '../lib/metastaticStack.ts';

const app = new App();

const configPath = stringContext('config') ?? 'examples/aws.yaml';
const poolId = stringContext('poolId');
const instanceRoles = listContext('instanceRoles');
const vpcId = stringContext('vpcId');
const functionSubnetIds = listContext('functionSubnetIds');
const functionSecurityGroupIds = listContext('functionSecurityGroupIds');
if (!vpcId && (functionSubnetIds || functionSecurityGroupIds)) {
  throw new Error('context functionSubnetIds and functionSecurityGroupIds need vpcId (the instances VPC)');
}
if (vpcId && !functionSubnetIds) {
  throw new Error('context vpcId needs functionSubnetIds: the subnets the functions run in');
}

new MetastaticStack(app, stringContext('stackName') ?? 'Metastatic', {
  description: 'metastatic: a pool of small nodes packed as slots onto larger EC2 instances',
  configPath,
  poolId,
  instanceRoles,
  ebsKmsKeyArn: stringContext('ebsKmsKeyArn'),
  dashboard: booleanContext('dashboard') ?? true,
  ...(vpcId && functionSubnetIds
    ? { functionsVpc: { vpcId, subnetIds: functionSubnetIds, securityGroupIds: functionSecurityGroupIds } }
    : {}),
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: stringContext('region') },
});

Validations.of(app).addPlugins(new AwsSolutionsChecks(app), new ServerlessChecks(app));

/** A comma-separated context value as a list (blank entries dropped). */
function listContext(key: string): string[] | undefined {
  return stringContext(key)
    ?.split(',')
    .map((item) => item.trim())
    .filter((item) => item !== '');
}

function booleanContext(key: string): boolean | undefined {
  const value: unknown = app.node.tryGetContext(key);
  if (value === undefined) return undefined;
  if (value === true || value === 'true') return true;
  if (value === false || value === 'false') return false;
  throw new Error(`context ${key} must be true or false`);
}

function stringContext(key: string): string | undefined {
  const value: unknown = app.node.tryGetContext(key);
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || value === '') throw new Error(`context ${key} must be a non-empty string`);
  return value;
}
