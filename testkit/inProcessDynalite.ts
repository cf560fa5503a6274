/**
 * dynalite (the real DynamoDB engine of the embedded pool), in this process, in memory, for the cost
 * simulator and the chaos suite: many thousands of calls each, where the transport is not what is tested.
 *
 * By default the client reaches dynalite's own request handler directly (no socket): the requests and
 * responses are the same as over HTTP, minus the loopback HTTP work (about half of a call's time on
 * 2 cores). `http: true` uses the embedded pool's startDynalite() on a loopback port instead. Either
 * way requests are signed as the embedded pool's are (engines.ts, localEngineClientConfig): dynalite
 * checks that a signature is there, not what it is. The client refuses what DynamoDB would refuse for
 * breaking one of its limits, as DynamoDB does (shared/runtime/dynamoLimits.ts): dynalite does not.
 */
import type { DynamoDBClient, DynamoDBClientConfig } from '@aws-sdk/client-dynamodb';
import dynalite from 'dynalite';
import { localDynamoClient, localEngineClientConfig, startDynalite } from '../shared/runtime/engines.ts';
import { inProcessHandler } from '../shared/runtime/inProcessTransport.ts';
import type { LocalTransactions } from '../shared/runtime/localTransactions.ts';

export interface InProcessDynalite {
  readonly client: DynamoDBClient;
  /** Runs the client's transactions (dynalite has none: localTransactions.ts). */
  readonly transactions: LocalTransactions;
  /** DynamoDB calls made through `client` so far. */
  calls(): number;
  close(): Promise<void>;
}

const REGION = 'us-east-1';
/** Engines started in this process: each its own lock (localTransactions.ts). */
let engines = 0;

export async function startInProcessDynalite(options: { http?: boolean } = {}): Promise<InProcessDynalite> {
  let transport: Pick<DynamoDBClientConfig, 'endpoint' | 'requestHandler'>;
  let closeEngine: () => Promise<void>;
  if (options.http) {
    const engine = await startDynalite();
    transport = { endpoint: engine.endpoint };
    closeEngine = () => engine.close();
  } else {
    const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
    transport = { endpoint: 'http://dynalite.in-process', requestHandler: inProcessHandler(server) };
    closeEngine = () => new Promise<void>((resolve) => server.close(() => resolve()));
  }
  const { client, transactions } = localDynamoClient(
    { ...localEngineClientConfig('', REGION), ...transport },
    `in-process-${++engines}`,
  );
  let calls = 0;
  client.middlewareStack.add(
    (next) => async (args) => {
      calls++;
      return next(args);
    },
    { step: 'initialize', name: 'inProcessDynaliteCallCounter' },
  );
  return {
    client,
    transactions,
    calls: () => calls,
    async close() {
      client.destroy();
      await closeEngine();
    },
  };
}
