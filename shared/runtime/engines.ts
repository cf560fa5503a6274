import { mkdir } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import {
  CreateTableCommand,
  DescribeTableCommand,
  DynamoDBClient,
  type DynamoDBClientConfig,
  ResourceInUseException,
} from '@aws-sdk/client-dynamodb';
import { CreateQueueCommand, GetQueueAttributesCommand, type SQSClient } from '@aws-sdk/client-sqs';
import dynalite from 'dynalite';
import { buildApp } from 'fauxqs';
import { tableDefinition } from '../store/table.ts';
import { guardDynamoLimits } from './dynamoLimits.ts';
import { inProcessHandler } from './inProcessTransport.ts';
import { LocalTransactions } from './localTransactions.ts';

/**
 * The local engines of the embedded pool: dynalite (DynamoDB, LevelDB on disk when given a path) and
 * fauxqs (SQS, in memory), both in-process on loopback.
 */
export interface Engine {
  readonly endpoint: string;
  close(): Promise<void>;
}

/** dynalite: also reachable without a socket from this process (inProcessTransport.ts). */
export interface DynaliteEngine extends Engine {
  readonly inProcess: NonNullable<DynamoDBClientConfig['requestHandler']>;
}

export async function startDynalite(
  options: { path?: string; host?: string; port?: number } = {},
): Promise<DynaliteEngine> {
  if (options.path) await mkdir(options.path, { recursive: true });
  const server = dynalite({ path: options.path, createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  const host = options.host ?? '127.0.0.1';
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, host, () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://${host}:${port}`,
    inProcess: inProcessHandler(server) as NonNullable<DynamoDBClientConfig['requestHandler']>,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        // dynalite keeps keep-alive sockets; closeAllConnections exists on http servers.
        (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.();
      }),
  };
}

/**
 * fauxqs (SQS) on loopback. Its own `startFauxqs` listens on 0.0.0.0 whatever host it is given (1.9.2),
 * which would let anyone who reaches the machine read, send and delete the pool's messages; so the app is
 * built here and listens on `host` (127.0.0.1 unless a test says otherwise).
 */
export async function startSqsEngine(options: { host?: string; port?: number } = {}): Promise<Engine> {
  const host = options.host ?? '127.0.0.1';
  const app = buildApp({ logger: false, host });
  const address = await app.listen({ port: options.port ?? 0, host });
  const { port } = new URL(address);
  return { endpoint: `http://${host}:${port}`, close: () => app.close() };
}

/**
 * Signs a request to a local engine with a fixed Authorization header of SigV4's form. dynalite checks
 * that a request carries one (and an X-Amz-Date) but not the signature, fauxqs checks neither, and on
 * loopback there is no secret to prove: computing SigV4 (a SHA-256 of the body, a canonical request and
 * four HMACs per call) was a third of the CPU time of each call to the embedded pool's table (measured
 * in one run: 1.6 ms signed, 1.1 ms with this, per GetItem, client and engine in one process).
 */
const localSigner = {
  async sign<R extends { headers: Record<string, string> }>(request: R): Promise<R> {
    request.headers.authorization =
      'AWS4-HMAC-SHA256 Credential=local/20260101/eu-west-1/local/aws4_request, SignedHeaders=host, Signature=local';
    request.headers['x-amz-date'] = '20260101T000000Z';
    return request;
  },
};

/** What an AWS SDK client of a local engine is made with: its endpoint, a region (any), the local signer. */
export function localEngineClientConfig(endpoint: string, region: string) {
  return {
    endpoint,
    region,
    credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
    signer: localSigner,
  };
}

/**
 * A DynamoDB client of a local dynalite as the pool uses one: what DynamoDB would refuse for breaking
 * one of its limits refused the same way (dynamoLimits.ts: dynalite enforces few of them), and
 * TransactWriteItems, which dynalite lacks, run by localTransactions.ts (its steps on a second client of
 * the same engine, destroyed with this one). `engine` names the engine: the clients of one share its lock;
 * `steps`, how the steps reach it (an engine of this process: without a socket, DynaliteEngine.inProcess).
 */
export function localDynamoClient(
  config: DynamoDBClientConfig,
  engine: string,
  steps: DynamoDBClientConfig['requestHandler'] = config.requestHandler,
): { readonly client: DynamoDBClient; readonly transactions: LocalTransactions } {
  const client = guardDynamoLimits(new DynamoDBClient(config));
  // The steps are single-item writes of a transaction the guard has passed (and its intent, an item
  // dynalite itself refuses past 400 KB): not guarded again.
  const stepsClient = new DynamoDBClient({ ...config, requestHandler: steps });
  const transactions = new LocalTransactions(client, stepsClient, { engine });
  const destroy = client.destroy.bind(client);
  client.destroy = () => {
    destroy();
    stepsClient.destroy();
  };
  return { client, transactions };
}

/** Creates the pool's table unless it exists (a restart on the same state dir keeps it). */
export async function ensureTable(client: DynamoDBClient, tableName: string): Promise<void> {
  try {
    await client.send(new CreateTableCommand({ TableName: tableName, ...tableDefinition }));
  } catch (err) {
    if (!(err instanceof ResourceInUseException)) throw err;
  }
  for (let i = 0; i < 100; i++) {
    const out = await client.send(new DescribeTableCommand({ TableName: tableName }));
    if (out.Table?.TableStatus === 'ACTIVE') return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`table ${tableName} did not become ACTIVE`);
}

export interface QueuePair {
  readonly url: string;
  readonly arn: string;
  readonly dlqUrl: string;
  readonly dlqArn: string;
}

/** A queue with its dead-letter queue, as the CDK stack defines them. */
export async function ensureQueue(
  sqs: SQSClient,
  name: string,
  options: { visibilityTimeout: number; maxReceiveCount: number },
): Promise<QueuePair> {
  const dlq = await sqs.send(
    new CreateQueueCommand({
      QueueName: `${name}-dlq`,
      // As the work queue's: the request function consumes its dead letters too.
      Attributes: { VisibilityTimeout: String(options.visibilityTimeout) },
    }),
  );
  const dlqUrl = dlq.QueueUrl as string;
  const dlqAttrs = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl: dlqUrl, AttributeNames: ['QueueArn'] }),
  );
  const q = await sqs.send(
    new CreateQueueCommand({
      QueueName: name,
      Attributes: {
        VisibilityTimeout: String(options.visibilityTimeout),
        RedrivePolicy: JSON.stringify({
          deadLetterTargetArn: dlqAttrs.Attributes?.QueueArn,
          maxReceiveCount: options.maxReceiveCount,
        }),
      },
    }),
  );
  const url = q.QueueUrl as string;
  const attrs = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['QueueArn'] }),
  );
  return {
    url,
    arn: attrs.Attributes?.QueueArn as string,
    dlqUrl,
    dlqArn: dlqAttrs.Attributes?.QueueArn as string,
  };
}
