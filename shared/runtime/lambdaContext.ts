import { Logger } from '@aws-lambda-powertools/logger';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { z } from 'zod';
import { parseConfigOrThrow } from '../config/load.ts';
import type { ResolvedConfig } from '../config/model.ts';
import { systemClock } from '../core/clock.ts';
import type { ProviderRegistry } from '../core/provider.ts';
import { probePort } from '../providers/probe.ts';
import { DynamoStore } from '../store/dynamoStore.ts';
import type { Context } from '../usecases/context.ts';

/** The environment a metastatic Lambda function reads (set by the CDK stack). */
export const LambdaEnv = z.object({
  TABLE_NAME: z.string().min(1),
  /** The pool configuration as YAML text, embedded at deploy time. */
  METASTATIC_CONFIG: z.string().min(1),
  /** The request queue's maxReceiveCount (see RequestHandlerOptions). */
  MAX_RECEIVE_COUNT: z.coerce.number().int().positive().optional(),
  /** Only for running the functions against a local DynamoDB (tests, the embedded stack). */
  DYNAMODB_ENDPOINT: z.string().url().optional(),
  AWS_REGION: z.string().default('us-east-1'),
});
export type LambdaEnv = z.infer<typeof LambdaEnv>;

export interface LambdaRuntime {
  readonly context: Context;
  readonly env: LambdaEnv;
}

/**
 * Builds the use-case context of a Lambda function from its environment, once per container. The
 * backing-node providers available in Lambda are those of driver `aws`; the EC2 adapter is not built
 * yet, so until it is a launch there fails with a clear error while the warm path (existing backing
 * nodes), release and the reaper's bookkeeping work.
 */
export function lambdaRuntimeFromEnv(raw: NodeJS.ProcessEnv = process.env): LambdaRuntime {
  const parsed = LambdaEnv.safeParse(raw);
  if (!parsed.success) {
    throw new Error(
      `invalid function environment: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
    );
  }
  const env = parsed.data;
  const config = parseConfigOrThrow(env.METASTATIC_CONFIG, 'METASTATIC_CONFIG');
  const log = new Logger({ serviceName: 'metastatic' });
  const dynamodb = new DynamoDBClient({
    region: env.AWS_REGION,
    ...(env.DYNAMODB_ENDPOINT ? { endpoint: env.DYNAMODB_ENDPOINT } : {}),
  });
  const context: Context = {
    store: new DynamoStore(dynamodb, env.TABLE_NAME),
    config,
    providers: lambdaProviders(config),
    clock: systemClock,
    log,
    probePort,
  };
  return { context, env };
}

function lambdaProviders(config: ResolvedConfig): ProviderRegistry {
  return {
    forPool(poolKey) {
      const pool = config.backingPools.find((p) => p.key === poolKey);
      if (!pool) throw new Error(`unknown backing pool ${poolKey}`);
      throw new Error(
        pool.driver === 'local'
          ? `backing pool ${poolKey} uses driver local, which runs only in the embedded stack (metastatic dev)`
          : `backing pool ${poolKey} uses driver aws, whose EC2 provider is not available in this release`,
      );
    },
    forResource: () => undefined,
  };
}
