import { readFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { join, resolve } from 'node:path';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import type { SQSClient, SQSClientConfig } from '@aws-sdk/client-sqs';
import { z } from 'zod';
import type { ResolvedConfig } from '../shared/config/model.ts';
import { systemClock } from '../shared/core/clock.ts';
import type { PoolMessage } from '../shared/core/messages.ts';
import { BackingRecord, NodeRecord } from '../shared/core/records.ts';
import {
  configHash,
  type EmbeddedInfo,
  embeddedInfoPath,
  readEmbeddedInfo,
} from '../shared/runtime/embeddedInfo.ts';
import { OperatorAnswer, type OperatorCall } from '../shared/runtime/operatorEndpoint.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import { consoleLog } from './consoleLog.ts';
import { CliError } from './errors.ts';
import { printError } from './output.ts';

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
  /** The operator verbs (hold, drain, reap), done with the pool's configuration. */
  operator(): Promise<Operator>;
  close(): void;
}

/** A reaper run's report as the CLI reads it (the pool's ReapReport; other fields are passed through). */
export const ReapReportJson = z.looseObject({
  retired: z.array(z.string()),
  stopped: z.array(z.string()),
  failed: z.array(z.string()),
  moved: z.number(),
  orphans: z.array(z.string()),
  reclaimedSlots: z.number(),
  reclaimedPlaces: z.number(),
  conflicts: z.number(),
  errors: z.array(z.string()),
});
export type ReapReportJson = z.infer<typeof ReapReportJson>;

/**
 * What the operator verbs do. Against an embedded pool each is run by the running `metastatic dev`
 * (its operator endpoint): the CLI never starts a backing process, and acts with the configuration dev
 * started with. Against a stack, here, with the configuration given (--stack-config): EC2 instances have
 * no parent process on this machine.
 */
export interface Operator {
  hold(nodeId: string): Promise<NodeRecord>;
  drain(backingId: string): Promise<BackingRecord>;
  reap(): Promise<ReapReportJson>;
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
  return t.stack ? connectStack(t, t.stack) : connectLocal(t);
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
    async operator() {
      if (!t.config) {
        throw new CliError(
          'operator verbs against a stack need its configuration: pass --stack-config FILE',
          2,
        );
      }
      const config = await loadConfig(t.config);
      const [{ awsContext }, { holdNode, drainBacking }, { reap }] = await Promise.all([
        import('../shared/runtime/awsContext.ts'),
        import('../shared/usecases/operator.ts'),
        import('../shared/usecases/reap.ts'),
      ]);
      const context = awsContext({
        config,
        store,
        region,
        poolId: info.poolId,
        eventBusName: info.eventBusName,
        clock: systemClock,
        log: consoleLog('warn'),
      });
      return {
        hold: (id) => holdNode(context, id),
        drain: (id) => drainBacking(context, id),
        reap: async () => ReapReportJson.parse(await reap(context)),
      };
    },
    close() {
      dynamodb.destroy();
      sqs.destroy();
    },
  };
}

async function connectLocal(t: Target): Promise<PoolClient> {
  const stateDir = t.stateDir;
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
    async operator() {
      await checkConfiguration(info, t.config);
      const call = (c: OperatorCall) => callPool(info, c);
      return {
        hold: async (id) => NodeRecord.parse(await call({ verb: 'hold', id })),
        drain: async (id) => BackingRecord.parse(await call({ verb: 'drain', id })),
        reap: async () => ReapReportJson.parse(await call({ verb: 'reap' })),
      };
    },
    close() {
      dynamodb.destroy();
      sqs.destroy();
    },
  };
}

/**
 * The configuration an operator verb acts with is the running pool's. A file given to the verb
 * (--stack-config) must be that one, or the verb is refused, naming both; the pool's own file edited
 * since it started is only noted (the pool acts with what it read at start, and so does the verb).
 */
async function checkConfiguration(info: EmbeddedInfo, given: string | undefined): Promise<void> {
  const poolFile = info.configPath ?? 'the configuration it started with';
  const hashOf = async (file: string) => configHash(await readFile(file, 'utf8'));
  if (given !== undefined) {
    let same: boolean;
    try {
      same = info.configHash !== undefined && (await hashOf(given)) === info.configHash;
    } catch (err) {
      throw new CliError(`cannot read ${given}: ${(err as Error).message}`, 2);
    }
    if (!same) {
      throw new CliError(
        `${resolve(given)} is not the configuration the running pool uses (${poolFile}, as it was when ` +
          "the pool started): operator verbs act with the running pool's configuration. Leave out " +
          '--stack-config, or restart `metastatic dev` with this file.',
        2,
      );
    }
    return;
  }
  if (info.configPath === undefined || info.configHash === undefined) return;
  const now = await hashOf(info.configPath).catch(() => undefined);
  if (now !== info.configHash) {
    printError(
      `metastatic: note: ${info.configPath} changed since the pool started; the pool, and this ` +
        'command, act with the configuration it started with (restart `metastatic dev` to apply the file)',
    );
  }
}

/** Posts an operator call to the running pool and waits for its answer (as long as the verb runs). */
async function callPool(info: EmbeddedInfo, call: OperatorCall): Promise<unknown> {
  if (!info.operatorUrl || !info.operatorToken) {
    throw new CliError(
      `the pool running on ${info.stateDir} (pid ${info.pid}) is of an earlier version that does not run ` +
        'operator verbs itself; restart it (`metastatic dev`)',
    );
  }
  const body = JSON.stringify(call);
  const { status, text } = await new Promise<{ status: number; text: string }>((done, failed) => {
    const req = httpRequest(
      info.operatorUrl as string,
      {
        method: 'POST',
        headers: {
          authorization: `Bearer ${info.operatorToken}`,
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(body),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
        });
        res.on('end', () => done({ status: res.statusCode ?? 0, text }));
        res.on('error', failed);
      },
    );
    req.on('error', failed);
    req.end(body);
  }).catch((err: Error) => {
    throw new CliError(
      `cannot reach the running pool (pid ${info.pid}) at ${info.operatorUrl}: ${err.message}`,
    );
  });
  let answer: OperatorAnswer;
  try {
    answer = OperatorAnswer.parse(JSON.parse(text));
  } catch {
    throw new CliError(
      `the running pool answered ${call.verb} with HTTP ${status} and no answer it could read`,
    );
  }
  if (answer.ok) return answer.result;
  throw new CliError(
    answer.permanent ? answer.message : `the pool could not ${call.verb}: ${answer.message}`,
  );
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
