import { join } from 'node:path';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import type { SQSClient, SQSClientConfig } from '@aws-sdk/client-sqs';
import type { ResolvedConfig } from '../shared/config/model.ts';
import { systemClock } from '../shared/core/clock.ts';
import type { PoolMessage } from '../shared/core/messages.ts';
import { embeddedInfoPath, readEmbeddedInfo } from '../shared/runtime/embeddedInfo.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { consoleLog } from './consoleLog.ts';
import { CliError } from './errors.ts';

/*
 * What only some commands need is imported when first used: the SQS client when a message is sent, the
 * CloudFormation client with --stack, the configuration and the use-case contexts for operator verbs.
 * `list` and `status` load the DynamoDB client and the store, nothing more.
 */

/** A connection to a running pool: the store for reads, the request queue for commands. */
export interface PoolClient {
  readonly store: DynamoStore;
  /** Where an embedded pool writes its events (`<state-dir>/events.jsonl`); a deployed one publishes to EventBridge. */
  readonly eventsFile?: string;
  send(message: PoolMessage): Promise<void>;
  /** The use-case context for operator verbs (hold, drain, reap); flush() before exiting. */
  operatorContext(): Promise<{ context: Context; flush(): Promise<void> }>;
  close(): void;
}

/** Where the CLI finds the pool: an embedded pool's state dir, or a deployed stack (--stack). */
export interface Target {
  readonly stateDir: string;
  readonly stack?: string;
  readonly region?: string;
  /** The pool's configuration, needed by operator verbs against a deployed stack. */
  readonly config?: string;
}

export async function connect(target: Target | string): Promise<PoolClient> {
  const t: Target = typeof target === 'string' ? { stateDir: target } : target;
  return t.stack ? connectStack(t, t.stack) : connectLocal(t.stateDir);
}

/** A deployed pool: its stack outputs name the queue and the table; credentials come from the usual chain. */
async function connectStack(t: Target, stackName: string): Promise<PoolClient> {
  const region = t.region ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION;
  if (!region) throw new CliError('--stack needs a region: pass --region or set AWS_REGION', 2);
  const [{ CloudFormationClient }, { readStack }] = await Promise.all([
    import('@aws-sdk/client-cloudformation'),
    import('./stack.ts'),
  ]);
  const cfn = new CloudFormationClient({ region });
  const info = await readStack(cfn, stackName, region).finally(() => cfn.destroy());
  const dynamodb = new DynamoDBClient({ region });
  // The SQS client would otherwise send to the queue URL's host (https://sqs.<region>.amazonaws.com/...,
  // whatever the endpoint): an endpoint set in the environment (AWS_ENDPOINT_URL[_SQS], e.g. a VPC
  // endpoint or an AWS-protocol server) must win. On AWS both name the same regional endpoint.
  const sqs = lazySqs({ region, useQueueUrlAsEndpoint: false });
  const store = new DynamoStore(dynamodb, info.tableName);
  return {
    store,
    send: (message) => sqs.send(info.requestQueueUrl, message),
    async operatorContext() {
      if (!t.config) {
        throw new CliError(
          'operator verbs against a stack need its configuration: pass --stack-config FILE',
          2,
        );
      }
      const config = await loadConfig(t.config);
      const { awsContext } = await import('../shared/runtime/awsContext.ts');
      const context = awsContext({
        config,
        store,
        region,
        poolId: info.poolId,
        eventBusName: info.eventBusName,
        clock: systemClock,
        log: consoleLog('warn'),
      });
      return { context, flush: async () => {} };
    },
    close() {
      dynamodb.destroy();
      sqs.destroy();
    },
  };
}

async function connectLocal(stateDir: string): Promise<PoolClient> {
  const info = await readEmbeddedInfo(stateDir);
  if (!info) {
    throw new CliError(
      `no running pool found: ${embeddedInfoPath(stateDir)} does not exist.\n` +
        'Start one with `npm start` (or `npx metastatic dev`), or point --state-dir / METASTATIC_STATE_DIR at its state directory.',
    );
  }
  if (!isAlive(info.pid)) {
    throw new CliError(
      `the pool that wrote ${embeddedInfoPath(stateDir)} (pid ${info.pid}) is not running; start it with \`npm start\``,
    );
  }
  const credentials = { accessKeyId: 'metastatic', secretAccessKey: 'metastatic' };
  const dynamodb = new DynamoDBClient({ endpoint: info.dynamodbEndpoint, region: info.region, credentials });
  const sqs = lazySqs({ endpoint: info.sqsEndpoint, region: info.region, credentials });
  const store = new DynamoStore(dynamodb, info.tableName);
  return {
    store,
    eventsFile: join(info.stateDir, 'events.jsonl'),
    send: (message) => sqs.send(info.requestQueueUrl, message),
    async operatorContext() {
      if (!info.configPath) throw new CliError('the running pool did not record its configuration path');
      const config = await loadConfig(info.configPath);
      const { embeddedContext } = await import('../shared/runtime/embeddedContext.ts');
      const { context, localProvider } = embeddedContext({
        config,
        sqs: await sqs.client(),
        stateDir: info.stateDir,
        store,
        fulfilQueueUrl: info.fulfilQueueUrl,
        clock: systemClock,
        log: consoleLog('warn'),
        region: info.region,
      });
      // State events of resources a verb terminated must reach the fulfil queue before the CLI exits.
      return { context, flush: () => localProvider.flush() };
    },
    close() {
      dynamodb.destroy();
      sqs.destroy();
    },
  };
}

/** An SQS client made on first use. */
function lazySqs(config: SQSClientConfig) {
  let made: Promise<SQSClient> | undefined;
  let sqs: SQSClient | undefined;
  const client = () => {
    made ??= import('@aws-sdk/client-sqs').then(({ SQSClient }) => {
      sqs = new SQSClient(config);
      return sqs;
    });
    return made;
  };
  return {
    client,
    async send(queueUrl: string, message: PoolMessage): Promise<void> {
      const { SendMessageCommand } = await import('@aws-sdk/client-sqs');
      await (await client()).send(
        new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify(message) }),
      );
    },
    destroy: () => sqs?.destroy(),
  };
}

async function loadConfig(path: string): Promise<ResolvedConfig> {
  const { formatConfigErrors, loadConfigFile } = await import('../shared/config/load.ts');
  const loaded = await loadConfigFile(path);
  if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
  return loaded.config;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
