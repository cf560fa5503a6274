import type { SQSEvent, SQSRecord } from 'aws-lambda';
import type { Clock } from '../shared/core/clock.ts';
import type { Random } from './chaosRandom.ts';

/**
 * An in-memory SQS queue with at-least-once delivery, on virtual time, for the chaos suite:
 * - every message sent is delivered (at least) `copies` times: each copy is its own message with its
 *   own receive count, visible after its own random delay, so copies arrive in random order, apart or
 *   in the same batch;
 * - a received message is invisible for the visibility timeout; acked, it is gone; failed (reported in
 *   batchItemFailures, or its invocation crashed), it comes back when the timeout ends;
 * - a message that fails on its maxReceiveCount-th receive goes to the dead-letter list.
 */
export interface QueuedMessage {
  readonly messageId: string;
  readonly body: string;
  /** 1 for the first copy of a message, 2.. for the duplicates. */
  readonly copy: number;
  readonly sentAt: number;
  receives: number;
  visibleAt: number;
}

export interface ChaosQueueOptions {
  readonly name: string;
  readonly visibilityMs: number;
  readonly maxReceiveCount: number;
  /** Each copy becomes visible after a random delay in [0, maxDelayMs]. */
  readonly maxDelayMs: number;
  readonly copies: number;
}

export class ChaosQueue {
  private readonly messages = new Map<string, QueuedMessage>();
  private nextId = 0;
  readonly deadLetters: QueuedMessage[] = [];
  /** Messages ever moved to the dead letters (a consumer may have taken them out since). */
  deadLettered = 0;
  sent = 0;
  deliveries = 0;
  /** Deliveries of a copy beyond the first (the duplicates at-least-once delivery makes). */
  duplicateDeliveries = 0;
  /** Deliveries of a copy that had been received before (after a failure or a crash). */
  redeliveries = 0;

  constructor(
    private readonly options: ChaosQueueOptions,
    private readonly clock: Clock,
    private readonly random: Random,
  ) {}

  get size(): number {
    return this.messages.size;
  }

  send(body: string): void {
    this.sent++;
    const id = `${this.options.name}-${++this.nextId}`;
    const now = this.clock.now();
    for (let copy = 1; copy <= this.options.copies; copy++) {
      const messageId = `${id}#${copy}`;
      this.messages.set(messageId, {
        messageId,
        body,
        copy,
        sentAt: now,
        receives: 0,
        visibleAt: now + this.random.int(0, this.options.maxDelayMs),
      });
    }
  }

  /** Up to `max` visible messages, in random order; they are in flight until acked or failed. */
  receive(max: number): QueuedMessage[] {
    const now = this.clock.now();
    const visible = [...this.messages.values()].filter((m) => m.visibleAt <= now);
    const out: QueuedMessage[] = [];
    while (out.length < max && visible.length > 0) {
      const [m] = visible.splice(this.random.int(0, visible.length - 1), 1) as [QueuedMessage];
      m.receives++;
      m.visibleAt = now + this.options.visibilityMs;
      this.deliveries++;
      if (m.copy > 1 && m.receives === 1) this.duplicateDeliveries++;
      if (m.receives > 1) this.redeliveries++;
      out.push(m);
    }
    return out;
  }

  ack(m: QueuedMessage): void {
    this.messages.delete(m.messageId);
  }

  /** The message comes back after its visibility timeout, or goes to the dead letters. */
  fail(m: QueuedMessage): void {
    if (m.receives >= this.options.maxReceiveCount) {
      this.messages.delete(m.messageId);
      this.deadLetters.push(m);
      this.deadLettered++;
    }
  }

  pending(): QueuedMessage[] {
    return [...this.messages.values()];
  }
}

/** The SQS event Lambda would pass for a batch (the attributes the handlers read). */
export function toSqsEvent(batch: readonly QueuedMessage[], arn: string): SQSEvent {
  return {
    Records: batch.map(
      (m): SQSRecord => ({
        messageId: m.messageId,
        receiptHandle: `${m.messageId}@${m.receives}`,
        body: m.body,
        attributes: {
          ApproximateReceiveCount: String(m.receives),
          SentTimestamp: String(m.sentAt),
          SenderId: 'chaos',
          ApproximateFirstReceiveTimestamp: String(m.sentAt),
        },
        messageAttributes: {},
        md5OfBody: '',
        eventSource: 'aws:sqs',
        eventSourceARN: arn,
        awsRegion: 'eu-west-1',
      }),
    ),
  };
}
