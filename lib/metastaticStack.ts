import { readFileSync } from 'node:fs';
import { SecurityGroup, Subnet, Vpc } from 'aws-cdk-lib/aws-ec2';
import type { IEventBus } from 'aws-cdk-lib/aws-events';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import type { RetentionDays } from 'aws-cdk-lib/aws-logs';
import type { ITopic } from 'aws-cdk-lib/aws-sns';
import { CfnOutput, type Duration, Fn, Stack, type StackProps, Validations } from 'aws-cdk-lib/core';
import type { Construct } from 'constructs';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { poolRegion } from './launcherPermissions.ts';
import { MetastaticPool } from './metastaticPool.ts';

/**
 * `env.region` defaults to the region of the configuration's aws pools (not the CLI profile's region:
 * the pool must run where its instances' EC2 events are delivered).
 */
export interface MetastaticStackProps extends StackProps {
  /** Path of the YAML configuration file; it is read and validated at synth. */
  readonly configPath: string;
  /** @default - see MetastaticPoolProps.poolId */
  readonly poolId?: string;
  /** @default - see MetastaticPoolProps.instanceRoles */
  readonly instanceRoles?: readonly string[];
  /** @default Duration.minutes(1) */
  readonly reaperRate?: Duration;
  /** @default - the account's default event bus */
  readonly eventBus?: IEventBus;
  /** @default RetentionDays.ONE_MONTH */
  readonly logRetention?: RetentionDays;
  /**
   * The pool's CloudWatch dashboard, its name in the `DashboardName` output.
   * @default true
   */
  readonly dashboard?: boolean;
  /** @default - alarms without actions */
  readonly alarmTopic?: ITopic;
  /** @default - AWS managed encryption */
  readonly encryptionKey?: IKey;
  /** @default - none; see MetastaticPoolProps.ebsKmsKeyArn */
  readonly ebsKmsKeyArn?: string;
  /**
   * Runs the functions in the instances' VPC, by ids (see MetastaticPoolProps.vpc): the VPC, the subnets
   * the functions run in (they need a route to the AWS APIs: NAT or VPC endpoints) and, optionally,
   * their security groups (default: a new one, output as FunctionsSecurityGroupId).
   * @default - the functions run outside any VPC
   */
  readonly functionsVpc?: {
    readonly vpcId: string;
    readonly subnetIds: readonly string[];
    readonly securityGroupIds?: readonly string[];
  };
}

/**
 * A stack holding one metastatic pool, configured from a YAML file, with its endpoints as outputs (the
 * pool's, and the dashboard's name and the functions' security group).
 */
export class MetastaticStack extends Stack {
  readonly pool: MetastaticPool;

  constructor(scope: Construct, id: string, props: MetastaticStackProps) {
    const config = readFileSync(props.configPath, 'utf8');
    // The configuration names the region its instances run in, and the stack must be there to receive
    // their EC2 events: it is the stack's region unless one is given (then the pool checks they agree).
    const region = props.env?.region ?? poolRegion(parseConfigOrThrow(config, props.configPath));
    super(scope, id, { ...props, env: { ...props.env, region } });
    const network = props.functionsVpc && this.functionsNetwork(props.functionsVpc);
    this.pool = new MetastaticPool(this, 'Pool', {
      ...network,
      config,
      configName: props.configPath,
      poolId: props.poolId,
      instanceRoles: props.instanceRoles,
      reaperRate: props.reaperRate,
      eventBus: props.eventBus,
      logRetention: props.logRetention,
      alarmTopic: props.alarmTopic,
      encryptionKey: props.encryptionKey,
      ebsKmsKeyArn: props.ebsKmsKeyArn,
      dashboard: props.dashboard,
    });
    // The outputs the CLI reads (RequestQueueUrl, FulfilQueueUrl, TableName, EventBusName, PoolId) are the
    // pool's own (MetastaticPool.outputs); these two are the stack's.
    if (this.pool.dashboard) {
      new CfnOutput(this, 'DashboardName', {
        value: this.pool.dashboard.dashboardName,
        description: 'The pool at a glance: CloudWatch > Dashboards > this name',
      });
    }
    const [group] = this.pool.functionsSecurityGroups;
    if (group && !props.functionsVpc?.securityGroupIds?.length) {
      new CfnOutput(this, 'FunctionsSecurityGroupId', {
        value: group.securityGroupId,
        description: 'Admit this group on the instances connection-port: the functions check it',
      });
    }
  }

  private functionsNetwork(given: NonNullable<MetastaticStackProps['functionsVpc']>) {
    if (given.subnetIds.length === 0) throw new Error('functionsVpc.subnetIds: give at least one subnet');
    // By id, without a lookup, so synth stays offline. The subnets are named, so the zones (the region's,
    // resolved at deploy) are never used to select any.
    const vpc = Vpc.fromVpcAttributes(this, 'Vpc', { vpcId: given.vpcId, availabilityZones: Fn.getAzs() });
    Validations.of(vpc).acknowledge({
      id: 'Annotation::@aws-cdk/aws-ec2:vpcAttributeIsListTokenavailabilityZones',
      reason: 'The functions name their subnets; nothing selects subnets of this VPC by zone.',
    });
    const subnets = given.subnetIds.map((id, i) => {
      const subnet = Subnet.fromSubnetId(this, `Subnet${i}`, id);
      Validations.of(subnet).acknowledge({
        id: 'Annotation::@aws-cdk/aws-ec2:noSubnetRouteTableId',
        reason: 'Only the functions run in this subnet; nothing here reads its route table.',
      });
      return subnet;
    });
    return {
      vpc,
      vpcSubnets: { subnets },
      ...(given.securityGroupIds?.length
        ? {
            securityGroups: given.securityGroupIds.map((id, i) =>
              SecurityGroup.fromSecurityGroupId(this, `SecurityGroup${i}`, id),
            ),
          }
        : {}),
    };
  }
}
