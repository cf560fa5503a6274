import { join } from 'node:path';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import type { SQSClient, SQSClientConfig } from '@aws-sdk/client-sqs';
import type { PoolMessage } from '../shared/core/messages.ts';
import {
  type EmbeddedInfo,
  embeddedInfoPath,
  readEmbeddedInfo,
  stateDirFrom,
} from '../shared/runtime/embeddedInfo.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import { cliCommand } from './cliCommand.ts';
import { InvalidInputError, PoolNotFoundError, PoolStoppedError } from './errors.ts';
import type { StackInfo } from './stack.ts';

/**
 * Where a pool is: an embedded pool (`metastatic dev`) by its state dir, or a pool deployed with
 * `cdk deploy` by its stack name. With neither, the embedded pool of `$METASTATIC_STATE_DIR` or
 * `.metastatic`.
 */
export interface PoolTarget {
  /** The embedded pool's state dir (its dev.json says where its engines listen). */
  readonly stateDir?: string;
  /** A deployed pool's CloudFormation stack: its outputs name the request queue and the table. */
  readonly stack?: string;
  /** With `stack`: its region (default: $AWS_REGION, $AWS_DEFAULT_REGION). */
  readonly region?: string;
  /**
   * With `stack`: an endpoint and credentials for every AWS client (CloudFormation, DynamoDB, SQS);
   * by default the SDK's own (AWS_ENDPOINT_URL*, the credential chain).
   */
  readonly aws?: { readonly endpoint?: string; readonly credentials?: AwsCredentials };
}

/** Static AWS credentials (default: the SDK's credential chain). */
export interface AwsCredentials {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly sessionToken?: string;
}

/**
 * A connection to a running pool: the store for reads, the request queue for messages. The client
 * library's PoolClient is built on it, and the CLI's read-only commands (list, status) use it directly.
 */
export interface PoolConnection {
  readonly store: DynamoStore;
  /** Which pool: an embedded one (its dev.json) or a stack (its outputs). */
  readonly pool:
    | { readonly kind: 'embedded'; readonly info: EmbeddedInfo }
    | { readonly kind: 'stack'; readonly info: StackInfo };
  /** Where an embedded pool writes its events (`<state-dir>/events.jsonl`); a deployed one publishes to EventBridge. */
  readonly eventsFile?: string;
  send(message: PoolMessage): Promise<void>;
  /**
   * Throws PoolStoppedError when the embedded pool this connection was made to has stopped (its dev.json
   * is gone, or names another or a dead process). A stack's end shows as its queue or table missing.
   */
  checkRunning(): Promise<void>;
  close(): void;
}

/*
 * What only some callers need is imported when first used: the SQS client when a message is sent, the
 * CloudFormation client for a stack. `list` and `status` load the DynamoDB client and the store only.
 */

export async function openConnection(target: PoolTarget = {}): Promise<PoolConnection> {
  return target.stack ? connectStack(target, target.stack) : connectLocal(stateDirFrom(target.stateDir));
}

/** A deployed pool: its stack outputs name the queue and the table; credentials come from the usual chain. */
async function connectStack(t: PoolTarget, stackName: string): Promise<PoolConnection> {
  const region = t.region ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION;
  if (!region) throw new InvalidInputError('--stack needs a region: pass --region or set AWS_REGION');
  const common = {
    region,
    ...(t.aws?.endpoint ? { endpoint: t.aws.endpoint } : {}),
    ...(t.aws?.credentials ? { credentials: t.aws.credentials } : {}),
  };
  const [{ CloudFormationClient }, { readStack }] = await Promise.all([
    import('@aws-sdk/client-cloudformation'),
    import('./stack.ts'),
  ]);
  const cfn = new CloudFormationClient(common);
  const info = await readStack(cfn, stackName, region).finally(() => cfn.destroy());
  const dynamodb = new DynamoDBClient(common);
  // The SQS client would otherwise send to the queue URL's host (https://sqs.<region>.amazonaws.com/...,
  // whatever the endpoint): an endpoint set in the environment (AWS_ENDPOINT_URL[_SQS], e.g. a VPC
  // endpoint or an AWS-protocol server) must win. On AWS both name the same regional endpoint.
  const sqs = lazySqs({ ...common, useQueueUrlAsEndpoint: false });
  return {
    store: new DynamoStore(dynamodb, info.tableName),
    pool: { kind: 'stack', info },
    // Renewals on their own queue (a stack without one: the request queue, as before).
    send: (message) => sqs.send(queueFor(message, info), message),
    checkRunning: async () => {},
    close() {
      dynamodb.destroy();
      sqs.destroy();
    },
  };
}

async function connectLocal(stateDir: string): Promise<PoolConnection> {
  const info = await readEmbeddedInfo(stateDir);
  if (!info) {
    throw new PoolNotFoundError(
      `no running pool found: ${embeddedInfoPath(stateDir)} does not exist.\n` +
        `Start one with \`${cliCommand()} dev\`, or point --state-dir / METASTATIC_STATE_DIR at its state directory.`,
    );
  }
  if (!isAlive(info.pid)) {
    throw new PoolNotFoundError(
      `the pool that wrote ${embeddedInfoPath(stateDir)} (pid ${info.pid}) is not running; start it with \`${cliCommand()} dev\``,
    );
  }
  const credentials = { accessKeyId: 'metastatic', secretAccessKey: 'metastatic' };
  const dynamodb = new DynamoDBClient({ endpoint: info.dynamodbEndpoint, region: info.region, credentials });
  const sqs = lazySqs({ endpoint: info.sqsEndpoint, region: info.region, credentials });
  return {
    store: new DynamoStore(dynamodb, info.tableName),
    pool: { kind: 'embedded', info },
    eventsFile: join(info.stateDir, 'events.jsonl'),
    send: (message) => sqs.send(queueFor(message, info), message),
    async checkRunning() {
      const now = await readEmbeddedInfo(stateDir).catch(() => undefined);
      if (!now || now.pid !== info.pid || now.startedAt !== info.startedAt || !isAlive(info.pid)) {
        throw new PoolStoppedError(`the embedded pool on ${stateDir} (pid ${info.pid}) stopped`);
      }
    },
    close() {
      dynamodb.destroy();
      sqs.destroy();
    },
  };
}

/** The queue a message goes to: lease renewals to the lease queue where the pool has one. */
export function queueFor(
  message: { readonly kind: string },
  info: { readonly requestQueueUrl: string; readonly leaseQueueUrl?: string | undefined },
): string {
  return message.kind === 'renew' && info.leaseQueueUrl ? info.leaseQueueUrl : info.requestQueueUrl;
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
    async send(queueUrl: string, message: PoolMessage): Promise<void> {
      const { SendMessageCommand } = await import('@aws-sdk/client-sqs');
      await (await client()).send(
        new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify(message) }),
      );
    },
    destroy: () => sqs?.destroy(),
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
