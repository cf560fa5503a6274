import { ReceiveMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type Engine,
  ensureQueue,
  localEngineClientConfig,
  startSqsEngine,
} from '../../shared/runtime/engines.ts';
import { sendBackLater } from '../../shared/runtime/fulfilRetry.ts';
import { sqsEvent } from '../../testkit/harness.ts';

/**
 * The embedded pool's fulfil queue on fauxqs, as the pool sets it up: an event the fulfil handler sends
 * back (a backing node not ready yet, issue 40 defect 2) is received when its delay is up, not before,
 * as SQS's DelaySeconds says.
 */
let engine: Engine;
let sqs: SQSClient;
beforeAll(async () => {
  engine = await startSqsEngine();
  sqs = new SQSClient(localEngineClientConfig(engine.endpoint, 'us-east-1'));
});
afterAll(async () => {
  sqs.destroy();
  await engine.close();
});

describe('an event sent back to the fulfil queue (fauxqs)', () => {
  it('is received once its delay is up, with the same body, as a new message', async () => {
    const queue = await ensureQueue(sqs, 'metastatic-fulfil', { visibilityTimeout: 5, maxReceiveCount: 5 });
    const body = JSON.stringify({ detail: { 'instance-id': 'i-0123', state: 'running' } });
    const [record] = sqsEvent([body], 3).Records;
    const receive = () =>
      sqs.send(
        new ReceiveMessageCommand({
          QueueUrl: queue.url,
          WaitTimeSeconds: 0,
          MessageSystemAttributeNames: ['ApproximateReceiveCount'],
        }),
      );
    const sentAt = Date.now();
    await sendBackLater(sqs, queue.url, record as NonNullable<typeof record>, 1);
    expect((await receive()).Messages ?? []).toEqual([]);
    let messages = (await receive()).Messages ?? [];
    while (messages.length === 0 && Date.now() - sentAt < 5_000) {
      await new Promise((r) => setTimeout(r, 50));
      messages = (await receive()).Messages ?? [];
    }
    expect(Date.now() - sentAt).toBeGreaterThanOrEqual(900);
    expect(messages.map((m) => m.Body)).toEqual([body]);
    // Its receives count afresh: the queue's maxReceiveCount keeps counting failed deliveries only.
    expect(messages[0]?.Attributes?.ApproximateReceiveCount).toBe('1');
  });
});
