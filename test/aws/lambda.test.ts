import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { EventBridgeClient, PutEventsCommand } from '@aws-sdk/client-eventbridge';
import { mockClient } from 'aws-sdk-client-mock';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { newBackingRecord } from '../../shared/core/backing.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { baseConfig } from '../../testkit/configs.ts';
import {
  DYNAMODB_LOCAL_CREDENTIALS,
  type DynamoDbLocal,
  describeWithDynamoDbLocal,
  startDynamoDbLocal,
} from '../../testkit/dynamoDbLocal.ts';
import { sqsEvent } from '../../testkit/harness.ts';

/**
 * The Lambda entry points themselves (functions/*), configured only through their environment, against
 * DynamoDB Local (AWS's own engine: the functions' client is DynamoDB's, with its transactions, not the
 * embedded pool's): the code that runs in Lambda serves the warm path and releases.
 */
describeWithDynamoDbLocal('Lambda entry points', () => {
  let engine: DynamoDbLocal;
  let store: DynamoStore;
  let client: DynamoDBClient;
  // Nothing may reach real AWS: the functions' EventBridge client is mocked, and asserted on.
  const eventBridge = mockClient(EventBridgeClient);
  eventBridge.on(PutEventsCommand).resolves({ FailedEntryCount: 0, Entries: [{ EventId: 'e' }] });

  beforeAll(async () => {
    engine = await startDynamoDbLocal();
    client = new DynamoDBClient({
      endpoint: engine.endpoint,
      region: 'us-east-1',
      credentials: DYNAMODB_LOCAL_CREDENTIALS,
    });
    await ensureTable(client, 'lambda-test');
    store = new DynamoStore(client, 'lambda-test');
    Object.assign(process.env, {
      TABLE_NAME: 'lambda-test',
      METASTATIC_CONFIG: baseConfig({ slots: 2, maxServers: 4 }),
      DYNAMODB_ENDPOINT: engine.endpoint,
      AWS_ACCESS_KEY_ID: DYNAMODB_LOCAL_CREDENTIALS.accessKeyId,
      AWS_SECRET_ACCESS_KEY: DYNAMODB_LOCAL_CREDENTIALS.secretAccessKey,
      AWS_REGION: 'us-east-1',
      POWERTOOLS_LOG_LEVEL: 'SILENT',
      MAX_RECEIVE_COUNT: '5',
      EVENT_BUS_NAME: 'pool-bus',
      POOL_ID: 'test-pool',
      REQUEST_DLQ_ARN: 'arn:test:requests-dlq',
      POWERTOOLS_METRICS_DISABLED: 'true',
    });
  });

  afterAll(async () => {
    eventBridge.restore();
    client?.destroy();
    await engine?.stop();
  });

  it('serves a request on a ready backing node and releases it, through functions/request', async () => {
    const { handler } = await import('../../functions/request/index.ts');
    const now = Date.now();
    const fresh = newBackingRecord({
      id: 'bn-lambda',
      poolKey: 'meta/main',
      owner: 'test',
      label: {
        name: 'small-node',
        backingLabel: 'large-node',
        maxParallelJobs: 2,
        graceTime: 60,
        minRetentionTime: 0,
        maxAge: undefined,
        hostKeyChecking: false,
      },
      backingPoolKey: 'local/main',
      firstNodeId: 'x/0',
      attempt: 1,
      now,
    });
    await store.createBacking({
      ...fresh,
      state: 'ready',
      used: 0,
      slotMap: {},
      claims: {},
      host: '10.0.0.7',
      port: 22,
      attributes: { zone: 'a' },
    });

    const served = await handler(
      sqsEvent([JSON.stringify({ kind: 'request', id: 'lam-1', labels: ['small-node'] }), '{"kind":"nope"}']),
    );
    expect(served.batchItemFailures).toEqual([]);
    const served1 = await store.getRequest('lam-1');
    expect(served1).toMatchObject({
      state: 'fulfilled',
      nodes: [{ id: 'lam-1/0', state: 'ready', host: '10.0.0.7', port: 22, backingNodeId: 'bn-lambda' }],
    });
    const slot = String(served1?.nodes[0]?.slot);
    expect((await store.getBacking('bn-lambda'))?.slotMap).toEqual({ [slot]: 'lam-1/0' });
    const published = eventBridge.commandCalls(PutEventsCommand).map((c) => c.args[0].input.Entries?.[0]);
    expect(published).toContainEqual(
      expect.objectContaining({
        Source: 'metastatic',
        DetailType: 'Request Fulfilled',
        EventBusName: 'pool-bus',
      }),
    );
    const fulfilled = published.find((e) => e?.DetailType === 'Request Fulfilled');
    expect(JSON.parse(fulfilled?.Detail ?? '{}')).toMatchObject({ requestId: 'lam-1', poolId: 'test-pool' });
    const released = await handler(sqsEvent([JSON.stringify({ kind: 'release', nodeId: 'lam-1/0' })]));
    expect(released.batchItemFailures).toEqual([]);
    expect((await store.getBacking('bn-lambda'))?.used).toBe(0);
  });

  it('ends requests that reach the dead-letter queue, told apart by the event source ARN', async () => {
    const { handler } = await import('../../functions/request/index.ts');
    const { DEAD_LETTERED_REASON } = await import('../../shared/handlers/requestHandler.ts');
    const event = sqsEvent([JSON.stringify({ kind: 'request', id: 'lam-dlq', labels: ['small-node'] })]);
    for (const r of event.Records) r.eventSourceARN = 'arn:test:requests-dlq';
    expect((await handler(event)).batchItemFailures).toEqual([]);
    expect(await store.getRequest('lam-dlq')).toMatchObject({
      state: 'failed',
      reason: DEAD_LETTERED_REASON,
    });
  });

  it('writes metrics under the dimensions service and pool (the POOL_ID the stack sets)', async () => {
    const { lambdaRuntimeFromEnv } = await import('../../shared/runtime/lambdaContext.ts');
    const runtime = lambdaRuntimeFromEnv();
    runtime.context.metrics?.count('LaunchFailed');
    const emf = runtime.metrics.serializeMetrics();
    expect(emf._aws.CloudWatchMetrics[0]?.Dimensions).toEqual([['service', 'pool']]);
    expect(emf).toMatchObject({ service: 'metastatic', pool: 'test-pool', LaunchFailed: 1 });
    runtime.metrics.clearMetrics();
  });

  it('fails a request whose launches all fail, after launch-retries attempts, with the reason', async () => {
    const { handler } = await import('../../functions/request/index.ts');
    await handler(
      sqsEvent([JSON.stringify({ kind: 'request', id: 'fill', labels: ['small-node', 'small-node'] })]),
    );
    const out = await handler(
      sqsEvent([JSON.stringify({ kind: 'request', id: 'lam-2', labels: ['small-node'] })]),
    );
    expect(out.batchItemFailures).toEqual([]);
    const why =
      'launch of large-node failed: backing pool local/main uses driver local, which runs only in the embedded pool (metastatic dev)';
    expect(await store.getRequest('lam-2')).toMatchObject({
      state: 'failed',
      reason: `backing node for lam-2/0 failed to launch 3 time(s); last: ${why}`,
    });
    const failed = (await store.listBacking()).filter((b) => b.state === 'failed');
    expect(failed.map((b) => [b.attempt, b.reason, b.used])).toEqual(
      expect.arrayContaining([
        [1, why, 0],
        [2, why, 0],
        [3, why, 0],
      ]),
    );
    expect(failed).toHaveLength(3);
    expect([...(await store.nodePlaces('meta/main')).keys()].sort()).toEqual(['fill/0', 'fill/1']);
  });
});
