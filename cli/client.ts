import { join } from 'node:path';
import { CloudFormationClient } from '@aws-sdk/client-cloudformation';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SendMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { formatConfigErrors, loadConfigFile } from '../shared/config/load.ts';
import { systemClock } from '../shared/core/clock.ts';
import type { PoolMessage } from '../shared/core/messages.ts';
import { awsContext } from '../shared/runtime/awsContext.ts';
import { embeddedContext } from '../shared/runtime/embeddedContext.ts';
import { embeddedInfoPath, readEmbeddedInfo } from '../shared/runtime/embeddedInfo.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { consoleLog } from './consoleLog.ts';
import { CliError } from './errors.ts';
import { readStack } from './stack.ts';

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
  const cfn = new CloudFormationClient({ region });
  const info = await readStack(cfn, stackName, region).finally(() => cfn.destroy());
  const dynamodb = new DynamoDBClient({ region });
  // The SQS client would otherwise send to the queue URL's host (https://sqs.<region>.amazonaws.com/...,
  // whatever the endpoint): an endpoint set in the environment (AWS_ENDPOINT_URL[_SQS], e.g. a VPC
  // endpoint or an AWS-protocol server) must win. On AWS both name the same regional endpoint.
  const sqs = new SQSClient({ region, useQueueUrlAsEndpoint: false });
  const store = new DynamoStore(dynamodb, info.tableName);
  return {
    store,
    async send(message) {
      await sqs.send(
        new SendMessageCommand({ QueueUrl: info.requestQueueUrl, MessageBody: JSON.stringify(message) }),
      );
    },
    async operatorContext() {
      if (!t.config) {
        throw new CliError(
          'operator verbs against a stack need its configuration: pass --stack-config FILE',
          2,
        );
      }
      const loaded = await loadConfigFile(t.config);
      if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
      const context = awsContext({
        config: loaded.config,
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
  const sqs = new SQSClient({ endpoint: info.sqsEndpoint, region: info.region, credentials });
  const store = new DynamoStore(dynamodb, info.tableName);
  return {
    store,
    eventsFile: join(info.stateDir, 'events.jsonl'),
    async send(message) {
      await sqs.send(
        new SendMessageCommand({ QueueUrl: info.requestQueueUrl, MessageBody: JSON.stringify(message) }),
      );
    },
    async operatorContext() {
      if (!info.configPath) throw new CliError('the running pool did not record its configuration path');
      const loaded = await loadConfigFile(info.configPath);
      if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
      const { context, localProvider } = embeddedContext({
        config: loaded.config,
        stateDir: info.stateDir,
        store,
        sqs,
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

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
