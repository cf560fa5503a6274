import { Logger } from '@aws-lambda-powertools/logger';
import { Metrics } from '@aws-lambda-powertools/metrics';
import { Tracer } from '@aws-lambda-powertools/tracer';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { EventBridgeClient } from '@aws-sdk/client-eventbridge';
import { SQSClient } from '@aws-sdk/client-sqs';
import { z } from 'zod';
import { parseConfigOrThrow } from '../config/load.ts';
import { systemClock } from '../core/clock.ts';
import { createEc2Client } from '../providers/aws/ec2Provider.ts';
import { DynamoStore } from '../store/dynamoStore.ts';
import type { Context } from '../usecases/context.ts';
import { awsContext } from './awsContext.ts';
import { readFunctionConfig } from './functionConfig.ts';
import { PowertoolsMetricSink } from './powertoolsMetrics.ts';

/**
 * The environment a metastatic Lambda function reads (set by the CDK stack). The configuration is not
 * in it: it is a file next to the function's code (see functionConfig.ts).
 */
export const LambdaEnv = z.object({
  TABLE_NAME: z.string().min(1),
  /** Set by Lambda: the function's code directory, where the stack put the configuration file. */
  LAMBDA_TASK_ROOT: z.string().min(1).optional(),
  /**
   * The pool configuration as YAML text, read only where LAMBDA_TASK_ROOT holds no configuration file
   * (tests, the handlers run outside Lambda). The stack never sets it.
   */
  METASTATIC_CONFIG: z.string().min(1).optional(),
  /** The value of the `metastatic:pool` tag on this deployment's instances. */
  POOL_ID: z.string().min(1).default('metastatic'),
  /** The EventBridge bus pool events are published to. */
  EVENT_BUS_NAME: z.string().min(1).default('default'),
  /** The request queue's dead-letter queue: records from it go to the dead-letter handler. */
  REQUEST_DLQ_ARN: z.string().min(1).optional(),
  /**
   * The fulfil queue's URL (the fulfil function's environment): where it sends back, delayed, the event of
   * a backing node not ready yet (FulfilHandlerOptions.retryLater). As CloudFormation gives it, so it is
   * right wherever the stack runs (moto's, in a rehearsal); unset, the URL is derived from the record's ARN.
   */
  FULFIL_QUEUE_URL: z.string().url().optional(),
  /** The request queue's maxReceiveCount (see RequestHandlerOptions). */
  MAX_RECEIVE_COUNT: z.coerce.number().int().positive().optional(),
  /**
   * `true` when the stack put the functions in the pool's VPC: they then reach instances at private
   * addresses, so the port check runs whatever `public-ipv4` says.
   */
  METASTATIC_IN_VPC: z
    .enum(['true', 'false'])
    .default('false')
    .transform((v) => v === 'true'),
  /** Only for running the functions against a local DynamoDB (tests). */
  DYNAMODB_ENDPOINT: z.string().url().optional(),
  AWS_REGION: z.string().default('us-east-1'),
});
export type LambdaEnv = z.infer<typeof LambdaEnv>;

export interface LambdaRuntime {
  readonly context: Context;
  readonly env: LambdaEnv;
  /** Flushed by the entry point after each invocation (EMF). */
  readonly metrics: Metrics;
  /** An SQS client of the function's region, made on first use (a message's visibility, rarely changed). */
  readonly sqs: () => SQSClient;
}

/**
 * Builds the use-case context of a Lambda function from its environment and its configuration file,
 * once per container (the entry points keep the result): Powertools logger, metrics and tracer (SDK
 * clients traced), the EC2 provider, the EventBridge sink.
 */
export function lambdaRuntimeFromEnv(raw: NodeJS.ProcessEnv = process.env): LambdaRuntime {
  const parsed = LambdaEnv.safeParse(raw);
  if (!parsed.success) {
    throw new Error(
      `invalid function environment: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
    );
  }
  const env = parsed.data;
  const { text, source } = readFunctionConfig(env);
  const config = parseConfigOrThrow(text, source);
  const log = new Logger({ serviceName: 'metastatic' });
  // `pool` tells pools in one account and region apart (their alarms watch their own series).
  const metrics = new Metrics({
    serviceName: 'metastatic',
    namespace: 'Metastatic',
    defaultDimensions: { pool: env.POOL_ID },
  });
  const tracer = new Tracer({ serviceName: 'metastatic' });
  const dynamodb = tracer.captureAWSv3Client(
    new DynamoDBClient({
      region: env.AWS_REGION,
      ...(env.DYNAMODB_ENDPOINT ? { endpoint: env.DYNAMODB_ENDPOINT } : {}),
    }),
  );
  const context = awsContext({
    config,
    store: new DynamoStore(dynamodb, env.TABLE_NAME, systemClock, {
      recordRetention: config.recordRetention,
    }),
    region: env.AWS_REGION,
    poolId: env.POOL_ID,
    inVpc: env.METASTATIC_IN_VPC,
    eventBusName: env.EVENT_BUS_NAME,
    clock: systemClock,
    log,
    metrics: new PowertoolsMetricSink(metrics),
    ec2Client: (region) => tracer.captureAWSv3Client(createEc2Client(region)),
    eventBridge: tracer.captureAWSv3Client(new EventBridgeClient({ region: env.AWS_REGION })),
  });
  let sqs: SQSClient | undefined;
  const sqsClient = () => {
    // The endpoint is the region's (or AWS_ENDPOINT_URL_SQS's, as in a rehearsal), never a queue URL's
    // host: a URL made from an ARN names AWS's endpoint, which a rehearsal on moto must not reach.
    sqs ??= tracer.captureAWSv3Client(
      new SQSClient({ region: env.AWS_REGION, useQueueUrlAsEndpoint: false }),
    );
    return sqs;
  };
  return { context, env, metrics, sqs: sqsClient };
}
