import {
  DeleteMessageBatchCommand,
  type Message,
  ReceiveMessageCommand,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { SQSBatchResponse, SQSEvent, SQSRecord } from 'aws-lambda';
import type { Log } from '../core/log.ts';

/**
 * What Lambda's SQS event source mapping does, for the embedded pool: long-poll a queue, hand each
 * batch to the handler as a real SQS event, delete the records the handler did not report as failed
 * (ReportBatchItemFailures), and leave the failed ones to reappear after the visibility timeout.
 */
export class SqsPoller {
  private running = false;
  private loop: Promise<void> | undefined;
  private readonly abort = new AbortController();

  constructor(
    private readonly sqs: SQSClient,
    private readonly queueUrl: string,
    private readonly queueArn: string,
    private readonly handler: (event: SQSEvent) => Promise<SQSBatchResponse>,
    private readonly log: Log,
    private readonly options: { batchSize?: number; waitSeconds?: number; region?: string } = {},
  ) {}

  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.running = false;
    this.abort.abort();
    await this.loop;
  }

  /** Receives and handles one batch; returns how many messages it saw. */
  async pollOnce(): Promise<number> {
    const out = await this.sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: this.queueUrl,
        MaxNumberOfMessages: this.options.batchSize ?? 10,
        WaitTimeSeconds: this.options.waitSeconds ?? 1,
        MessageSystemAttributeNames: ['All'],
        MessageAttributeNames: ['All'],
      }),
      { abortSignal: this.abort.signal },
    );
    const messages = out.Messages ?? [];
    if (messages.length === 0) return 0;
    const event: SQSEvent = { Records: messages.map((m) => this.toRecord(m)) };
    const response = await this.handler(event);
    const failed = new Set(response.batchItemFailures.map((f) => f.itemIdentifier));
    const done = messages.filter((m) => !failed.has(m.MessageId as string));
    if (done.length > 0) {
      await this.sqs.send(
        new DeleteMessageBatchCommand({
          QueueUrl: this.queueUrl,
          Entries: done.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle as string })),
        }),
      );
    }
    return messages.length;
  }

  private async run(): Promise<void> {
    let backoff = 100;
    while (this.running) {
      try {
        await this.pollOnce();
        backoff = 100;
      } catch (err) {
        if (!this.running) break;
        this.log.error('queue poll failed', { queueUrl: this.queueUrl, error: err });
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 5_000);
      }
    }
  }

  private toRecord(m: Message): SQSRecord {
    const a = m.Attributes ?? {};
    return {
      messageId: m.MessageId as string,
      receiptHandle: m.ReceiptHandle as string,
      body: m.Body ?? '',
      attributes: {
        ApproximateReceiveCount: a.ApproximateReceiveCount ?? '1',
        SentTimestamp: a.SentTimestamp ?? String(Date.now()),
        SenderId: a.SenderId ?? 'local',
        ApproximateFirstReceiveTimestamp: a.ApproximateFirstReceiveTimestamp ?? String(Date.now()),
      },
      messageAttributes: {},
      md5OfBody: m.MD5OfBody ?? '',
      eventSource: 'aws:sqs',
      eventSourceARN: this.queueArn,
      awsRegion: this.options.region ?? 'us-east-1',
    };
  }
}
