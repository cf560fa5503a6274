import { join } from 'node:path';
import { SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import type { Clock } from '../core/clock.ts';
import type { Log } from '../core/log.ts';
import type { ResolvedConfig } from '../core/model.ts';
import type { BackingProvider, ProviderRegistry } from '../core/provider.ts';
import { JsonLinesEventSink } from '../providers/events/jsonLinesSink.ts';
import { LocalProvider } from '../providers/local/localProvider.ts';
import { isLocalResourceId } from '../providers/local/localRecords.ts';
import { probePort } from '../providers/probe.ts';
import { scanHostKeys } from '../providers/scanHostKeysLazily.ts';
import type { DynamoStore } from '../store/dynamoStore.ts';
import type { Context } from '../usecases/context.ts';

/**
 * The use-case context of the embedded pool: the local provider (backing nodes as processes under
 * the state dir), whose state events go to the fulfil queue as EventBridge would send them on AWS.
 * Built by `metastatic dev` only: the CLI's operator verbs are run by dev too (operatorEndpoint.ts), so
 * no other process ever starts a backing process of the pool, nor becomes its parent.
 */
export function embeddedContext(args: {
  config: ResolvedConfig;
  stateDir: string;
  store: DynamoStore;
  sqs: SQSClient;
  fulfilQueueUrl: string;
  clock: Clock;
  log: Log;
  region?: string;
  /** Public keys every local backing node lets in besides its pool's (the dev client key). */
  authorizedKeys?: readonly string[];
}): { context: Context; localProvider: LocalProvider } {
  const localProvider = new LocalProvider({
    stateDir: args.stateDir,
    pools: args.config.backingPools,
    region: args.region ?? 'us-east-1',
    host: localHost(args.config),
    clock: args.clock,
    logger: args.log,
    authorizedKeys: args.authorizedKeys,
    onEvent: async (event) => {
      await args.sqs.send(
        new SendMessageCommand({ QueueUrl: args.fulfilQueueUrl, MessageBody: JSON.stringify(event) }),
      );
    },
  });
  const context: Context = {
    store: args.store,
    config: args.config,
    providers: embeddedProviders(args.config, localProvider),
    clock: args.clock,
    log: args.log,
    probePort,
    scanHostKeys,
    events: new JsonLinesEventSink(join(args.stateDir, 'events.jsonl'), args.clock),
  };
  return { context, localProvider };
}

/** The `host` of the first local provider (all local backing nodes listen on it). */
function localHost(config: ResolvedConfig): string | undefined {
  const local = config.backingPools.find((p) => p.driver === 'local');
  const host = local?.providerOptions.host;
  return typeof host === 'string' ? host : undefined;
}

function embeddedProviders(config: ResolvedConfig, local: LocalProvider): ProviderRegistry {
  const byPool = new Map<string, BackingProvider>();
  for (const pool of config.backingPools) {
    if (pool.driver === 'local') byPool.set(pool.key, local);
  }
  return {
    forPool(poolKey) {
      const p = byPool.get(poolKey);
      if (!p) {
        const pool = config.backingPools.find((b) => b.key === poolKey);
        throw new Error(
          pool
            ? `backing pool ${poolKey} uses driver ${pool.driver}, which the embedded pool cannot run (use driver local)`
            : `unknown backing pool ${poolKey}`,
        );
      }
      return p;
    },
    forResource: (resourceId) => (isLocalResourceId(resourceId) ? local : undefined),
  };
}
