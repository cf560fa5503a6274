import { readFileSync } from 'node:fs';
import { CfnOutput, type Duration, Stack, type StackProps } from 'aws-cdk-lib';
import type { IEventBus } from 'aws-cdk-lib/aws-events';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import type { RetentionDays } from 'aws-cdk-lib/aws-logs';
import type { ITopic } from 'aws-cdk-lib/aws-sns';
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
  /** @default - alarms without actions */
  readonly alarmTopic?: ITopic;
  /** @default - AWS managed encryption */
  readonly encryptionKey?: IKey;
}

/** A stack holding one metastatic pool, configured from a YAML file, with its endpoints as outputs. */
export class MetastaticStack extends Stack {
  readonly pool: MetastaticPool;

  constructor(scope: Construct, id: string, props: MetastaticStackProps) {
    const config = readFileSync(props.configPath, 'utf8');
    // The configuration names the region its instances run in, and the stack must be there to receive
    // their EC2 events: it is the stack's region unless one is given (then the pool checks they agree).
    const region = props.env?.region ?? poolRegion(parseConfigOrThrow(config, props.configPath));
    super(scope, id, { ...props, env: { ...props.env, region } });
    this.pool = new MetastaticPool(this, 'Pool', {
      config,
      configName: props.configPath,
      poolId: props.poolId,
      instanceRoles: props.instanceRoles,
      reaperRate: props.reaperRate,
      eventBus: props.eventBus,
      logRetention: props.logRetention,
      alarmTopic: props.alarmTopic,
      encryptionKey: props.encryptionKey,
    });
    new CfnOutput(this, 'RequestQueueUrl', {
      value: this.pool.requestQueue.queue.queueUrl,
      description: 'Send request and release messages here',
    });
    new CfnOutput(this, 'FulfilQueueUrl', { value: this.pool.fulfilQueue.queue.queueUrl });
    new CfnOutput(this, 'TableName', { value: this.pool.table.tableName });
    new CfnOutput(this, 'EventBusName', {
      value: this.pool.eventBus.eventBusName,
      description: 'The pool publishes its events (source "metastatic") here',
    });
    new CfnOutput(this, 'PoolId', {
      value: this.pool.poolId,
      description: 'Value of the metastatic:pool tag on the pool instances',
    });
  }
}
