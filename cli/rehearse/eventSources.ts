import {
  DeleteMessageBatchCommand,
  GetQueueUrlCommand,
  ReceiveMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { SQSBatchResponse, SQSEvent } from 'aws-lambda';
import type { EventSource } from './deployed.ts';
import type { Invoker } from './lambdaRuntime.ts';

/** What one delivery of a mapping did. */
export interface Delivery {
  readonly records: number;
  /** Message ids the function reported failed (all of them when it failed as a whole). */
  readonly failed: readonly string[];
  /** Why the invocation failed as a whole (the handler threw, timed out, its process died). */
  readonly error?: string;
  readonly ms: number;
}

/**
 * What one SQS event source mapping does, as Lambda's does it: receive up to a batch from the queue, invoke
 * the function with it as an SQS event, delete the records it did not report failed (with
 * ReportBatchItemFailures; all of them when it returns without), and none when the invocation fails. What
 * is not deleted comes back after the queue's visibility timeout (moto keeps it, as SQS does), and goes
 * to the dead-letter queue after its maxReceiveCount.
 */
export class QueueMapping {
  private queueUrl: string | undefined;

  constructor(
    private readonly sqs: SQSClient,
    readonly fn: Invoker,
    readonly source: EventSource,
    private readonly region: string,
  ) {}

  /** The queue's URL, from its ARN (its name is the ARN's last part). */
  async url(): Promise<string> {
    if (!this.queueUrl) {
      const name = this.source.queueArn.split(':').pop() as string;
      this.queueUrl = (await this.sqs.send(new GetQueueUrlCommand({ QueueName: name }))).QueueUrl as string;
    }
    return this.queueUrl;
  }

  /** One receive and, when it got messages, one invocation. */
  async deliverOnce(waitSeconds = 1): Promise<Delivery> {
    const QueueUrl = await this.url();
    const out = await this.sqs.send(
      new ReceiveMessageCommand({
        QueueUrl,
        MaxNumberOfMessages: Math.min(this.source.batchSize, 10),
        MessageSystemAttributeNames: ['All'],
        MessageAttributeNames: ['All'],
        WaitTimeSeconds: waitSeconds,
      }),
    );
    const messages = out.Messages ?? [];
    if (messages.length === 0) return { records: 0, failed: [], ms: 0 };
    const started = Date.now();
    const event: SQSEvent = {
      Records: messages.map((m) => ({
        messageId: m.MessageId as string,
        receiptHandle: m.ReceiptHandle as string,
        body: m.Body ?? '',
        attributes: {
          ApproximateReceiveCount: m.Attributes?.ApproximateReceiveCount ?? '1',
          SentTimestamp: m.Attributes?.SentTimestamp ?? String(Date.now()),
          SenderId: m.Attributes?.SenderId ?? 'rehearsal',
          ApproximateFirstReceiveTimestamp:
            m.Attributes?.ApproximateFirstReceiveTimestamp ?? String(Date.now()),
        },
        messageAttributes: {},
        md5OfBody: m.MD5OfBody ?? '',
        eventSource: 'aws:sqs',
        eventSourceARN: this.source.queueArn,
        awsRegion: this.region,
      })),
    };
    let failed: string[];
    let error: string | undefined;
    try {
      const response = await this.fn.invoke<SQSBatchResponse | null>(event);
      failed = this.source.reportsItemFailures
        ? (response?.batchItemFailures ?? []).map((f) => f.itemIdentifier)
        : [];
    } catch (err) {
      error = (err as Error).message;
      failed = messages.map((m) => m.MessageId as string);
    }
    const done = messages.filter((m) => !failed.includes(m.MessageId as string));
    if (done.length > 0) {
      await this.sqs.send(
        new DeleteMessageBatchCommand({
          QueueUrl,
          Entries: done.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle as string })),
        }),
      );
    }
    return { records: messages.length, failed, ...(error ? { error } : {}), ms: Date.now() - started };
  }
}

/** The event EventBridge's schedule hands the reaper. */
export function scheduledEvent(account: string, region: string, ruleArn: string) {
  return {
    version: '0',
    id: crypto.randomUUID(),
    'detail-type': 'Scheduled Event',
    source: 'aws.events',
    account,
    time: new Date().toISOString().replace(/\.\d{3}Z$/, 'Z'),
    region,
    resources: [ruleArn],
    detail: {},
  };
}

/**
 * The state-change events EC2 publishes between two states it was seen in (moto changes an instance's
 * state at once and publishes nothing: never `pending`, terminated without `shutting-down`).
 * `from` undefined: an instance seen for the first time (launched since the last look).
 */
export function stateChanges(from: string | undefined, to: string): string[] {
  if (from === to) return [];
  const path: Record<string, string[]> = {
    pending: ['pending'],
    running: ['pending', 'running'],
    'shutting-down': ['pending', 'running', 'shutting-down'],
    terminated: ['pending', 'running', 'shutting-down', 'terminated'],
    stopping: ['pending', 'running', 'stopping'],
    stopped: ['pending', 'running', 'stopping', 'stopped'],
  };
  const full = path[to] ?? [to];
  if (from === undefined) return full;
  // From a stopped instance, a start goes through pending again.
  if (from === 'stopped' || from === 'stopping')
    return to === 'running' ? ['pending', 'running'] : full.slice(full.indexOf(to));
  const at = full.indexOf(from);
  return at >= 0 ? full.slice(at + 1) : [to];
}
