import type { EC2Client } from '@aws-sdk/client-ec2';
import { EventBridgeClient } from '@aws-sdk/client-eventbridge';
import type { Clock } from '../core/clock.ts';
import type { Log } from '../core/log.ts';
import type { BackingPool, ResolvedConfig } from '../core/model.ts';
import type { MetricSink } from '../core/observability.ts';
import type { ProviderRegistry } from '../core/provider.ts';
import { isEc2InstanceId } from '../providers/aws/driver.ts';
import { createEc2Client, Ec2Provider } from '../providers/aws/ec2Provider.ts';
import { EventBridgeSink } from '../providers/events/eventBridgeSink.ts';
import { probePort } from '../providers/probe.ts';
import { scanHostKeys } from '../providers/scanHostKeysLazily.ts';
import type { DynamoStore } from '../store/dynamoStore.ts';
import type { Context, HostKeyPlan } from '../usecases/context.ts';

/**
 * The use-case context on AWS: EC2 backing nodes (one provider per region of the configured aws
 * providers), events to an EventBridge bus. Used by the Lambda functions and by the CLI with --stack.
 */
export function awsContext(args: {
  config: ResolvedConfig;
  store: DynamoStore;
  /** The region this runs in: EC2 state events arrive from it, so it owns event routing. */
  region: string;
  poolId: string;
  /** The functions run in the pool's VPC (they reach instances at private addresses). */
  inVpc?: boolean;
  eventBusName?: string;
  clock: Clock;
  log: Log;
  metrics?: MetricSink;
  /** Client factories, so tests and tracing can wrap them. */
  ec2Client?: (region: string) => EC2Client;
  eventBridge?: EventBridgeClient;
}): Context {
  const awsPools = args.config.backingPools.filter((p) => p.driver === 'aws');
  const regions = new Map<string, Ec2Provider>();
  for (const pool of awsPools) {
    const region = String(pool.providerOptions.region ?? args.region);
    if (regions.has(region)) continue;
    regions.set(
      region,
      new Ec2Provider({
        client: (args.ec2Client ?? createEc2Client)(region),
        pools: awsPools.filter((p) => String(p.providerOptions.region ?? args.region) === region),
        poolId: args.poolId,
        clock: args.clock,
        log: args.log,
      }),
    );
  }
  const byPool = new Map(
    awsPools.map((p) => [p.key, regions.get(String(p.providerOptions.region ?? args.region)) as Ec2Provider]),
  );
  const providers: ProviderRegistry = {
    forPool(poolKey) {
      const provider = byPool.get(poolKey);
      if (provider) return provider;
      const pool = args.config.backingPools.find((p) => p.key === poolKey);
      throw new Error(
        pool
          ? `backing pool ${poolKey} uses driver ${pool.driver}, which runs only in the embedded pool (metastatic dev)`
          : `unknown backing pool ${poolKey}`,
      );
    },
    forResource: (resourceId) =>
      isEc2InstanceId(resourceId) ? (regions.get(args.region) ?? [...regions.values()][0]) : undefined,
  };
  // Outside the pool's VPC the functions reach an instance's port only on a public address; with
  // private addresses a probe could never succeed, so readiness is then EC2's `running`.
  const reaches = (pool: BackingPool) => args.inVpc === true || pool.poolOptions['public-ipv4'] === true;
  const reachable = awsPools.length > 0 && awsPools.every(reaches);
  // host-keys, unset: scan where the functions reach the instances, else read them from the console.
  const hostKeyPlan = (poolKey: string, label: string): HostKeyPlan | undefined => {
    const pool = awsPools.find((p) => p.key === poolKey);
    if (!pool) return undefined;
    const canReach = reaches(pool);
    const source = byPool.get(poolKey)?.hostKeysSetting(poolKey, label) ?? (canReach ? 'scan' : 'console');
    return { source, reachable: canReach };
  };
  return {
    store: args.store,
    config: args.config,
    providers,
    clock: args.clock,
    log: args.log,
    ...(reachable ? { probePort } : {}),
    scanHostKeys,
    hostKeyPlan,
    events: new EventBridgeSink(
      args.eventBridge ?? new EventBridgeClient({ region: args.region }),
      args.eventBusName,
      args.poolId,
    ),
    metrics: args.metrics,
  };
}
