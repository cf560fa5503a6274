import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SendMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { formatConfigErrors, loadConfigFile } from '../shared/config/load.ts';
import { systemClock } from '../shared/core/clock.ts';
import type { PoolMessage } from '../shared/core/messages.ts';
import type { LocalProvider } from '../shared/providers/local/localProvider.ts';
import { type DevInfo, devInfoPath, readDevInfo } from '../shared/runtime/devInfo.ts';
import { embeddedContext } from '../shared/runtime/embeddedContext.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { consoleLog } from './consoleLog.ts';
import { CliError } from './errors.ts';

/** A connection to a running pool: the store for reads, the request queue for commands. */
export interface PoolClient {
  readonly info: DevInfo;
  readonly store: DynamoStore;
  send(message: PoolMessage): Promise<void>;
  /** The use-case context for operator verbs (hold, drain, reap), against the same state dir. */
  operatorContext(): Promise<{ context: Context; localProvider: LocalProvider }>;
  close(): void;
}

export async function connect(stateDir: string): Promise<PoolClient> {
  const info = await readDevInfo(stateDir);
  if (!info) {
    throw new CliError(
      `no running pool found: ${devInfoPath(stateDir)} does not exist.\n` +
        'Start one with `npm start` (or `npx metastatic dev`), or point --state-dir / METASTATIC_STATE_DIR at its state directory.',
    );
  }
  if (!isAlive(info.pid)) {
    throw new CliError(
      `the pool that wrote ${devInfoPath(stateDir)} (pid ${info.pid}) is not running; start it with \`npm start\``,
    );
  }
  const credentials = { accessKeyId: 'metastatic', secretAccessKey: 'metastatic' };
  const dynamodb = new DynamoDBClient({ endpoint: info.dynamodbEndpoint, region: info.region, credentials });
  const sqs = new SQSClient({ endpoint: info.sqsEndpoint, region: info.region, credentials });
  const store = new DynamoStore(dynamodb, info.tableName);
  return {
    info,
    store,
    async send(message) {
      await sqs.send(
        new SendMessageCommand({ QueueUrl: info.requestQueueUrl, MessageBody: JSON.stringify(message) }),
      );
    },
    async operatorContext() {
      if (!info.configPath) throw new CliError('the running pool did not record its configuration path');
      const loaded = await loadConfigFile(info.configPath);
      if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
      return embeddedContext({
        config: loaded.config,
        stateDir: info.stateDir,
        store,
        sqs,
        fulfilQueueUrl: info.fulfilQueueUrl,
        clock: systemClock,
        log: consoleLog('warn'),
        region: info.region,
      });
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
