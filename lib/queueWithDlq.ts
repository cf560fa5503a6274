import {
  Alarm,
  ComparisonOperator,
  type IAlarmAction,
  type IMetric,
  MathExpression,
  Stats,
  TreatMissingData,
} from 'aws-cdk-lib/aws-cloudwatch';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { Queue, QueueEncryption } from 'aws-cdk-lib/aws-sqs';
import { Duration, Token, Validations } from 'aws-cdk-lib/core';
import { Construct } from 'constructs';
import { VISIBILITY_TIMEOUT_FACTOR, visibilityTimeoutSeconds } from '../shared/core/timing.ts';
import { cfnResource } from './cfnResource.ts';

export interface QueueWithDlqProps {
  /** Receives of a message before it moves to the dead-letter queue. */
  readonly maxReceiveCount: number;
  /**
   * The timeout of the function that consumes the queue. The visibility timeout is derived from it so
   * that a message is never redelivered while a batch that holds it may still be running.
   */
  readonly consumerTimeout: Duration;
  /**
   * Visibility timeout of the queue; must be at least VISIBILITY_TIMEOUT_FACTOR (6) x `consumerTimeout`.
   * @default visibilityTimeoutSeconds(consumerTimeout) of the timing contract (shared/core/timing.ts)
   */
  readonly visibilityTimeout?: Duration;
  /**
   * How long an unconsumed message stays in the queue.
   * @default 4 days (the SQS default)
   */
  readonly retentionPeriod?: Duration;
  /**
   * Customer-managed KMS key for both queues.
   * @default - SQS-managed server-side encryption (SSE-SQS)
   */
  readonly encryptionKey?: IKey;
  /**
   * Where the dead-letter alarm notifies.
   * @default - no action (the alarm is still created)
   */
  readonly alarmAction?: IAlarmAction;
  /**
   * What the queue carries, for the alarm's description.
   * @default the construct id
   */
  readonly description?: string;
  /**
   * A function consumes the dead-letter queue (its event source mapping receives every message within
   * seconds), so a dead letter is rarely visible: the alarm then counts messages received from the
   * dead-letter queue as well as those visible or in flight there.
   * @default false: the alarm watches visible messages (they wait for an operator)
   */
  readonly deadLetterQueueConsumed?: boolean;
}

/**
 * An SQS queue with its dead-letter queue (14 days' retention) and an alarm that fires as soon as a
 * message reaches the dead-letter queue. Both queues are encrypted and refuse requests without TLS.
 */
export class QueueWithDlq extends Construct {
  readonly queue: Queue;
  readonly deadLetterQueue: Queue;
  readonly deadLetterAlarm: Alarm;
  readonly maxReceiveCount: number;
  /** A function consumes the dead-letter queue (QueueWithDlqProps.deadLetterQueueConsumed). */
  readonly deadLetterQueueConsumed: boolean;

  constructor(scope: Construct, id: string, props: QueueWithDlqProps) {
    super(scope, id);
    if (!Number.isInteger(props.maxReceiveCount) || props.maxReceiveCount < 1) {
      throw new Error(
        `${this.node.path}: maxReceiveCount must be an integer >= 1, got ${props.maxReceiveCount}`,
      );
    }
    const minimumVisibility = visibilityTimeoutSeconds(props.consumerTimeout.toSeconds());
    const visibilityTimeout = props.visibilityTimeout ?? Duration.seconds(minimumVisibility);
    if (
      !Token.isUnresolved(visibilityTimeout.toSeconds()) &&
      visibilityTimeout.toSeconds() < minimumVisibility
    ) {
      throw new Error(
        `${this.node.path}: visibilityTimeout must be at least ${VISIBILITY_TIMEOUT_FACTOR} x the consumer's ` +
          `timeout (${minimumVisibility} s), got ${visibilityTimeout.toSeconds()} s`,
      );
    }
    const encryption = props.encryptionKey
      ? { encryption: QueueEncryption.KMS, encryptionMasterKey: props.encryptionKey }
      : { encryption: QueueEncryption.SQS_MANAGED };

    this.maxReceiveCount = props.maxReceiveCount;
    this.deadLetterQueueConsumed = props.deadLetterQueueConsumed ?? false;
    this.deadLetterQueue = new Queue(this, 'DeadLetterQueue', {
      ...encryption,
      enforceSSL: true,
      retentionPeriod: Duration.days(14),
      // As the work queue's: a consumer of the dead letters (the request function's) has the same timeout.
      visibilityTimeout,
    });
    Validations.of(cfnResource(this.deadLetterQueue)).acknowledge({
      id: 'Serverless-SQSRedrivePolicy',
      reason:
        'This is a dead-letter queue, the last stop: a message nothing could handle waits here 14 days for ' +
        'an operator (DeadLetterAlarm fires) to inspect and redrive it.',
    });
    this.queue = new Queue(this, 'Queue', {
      ...encryption,
      enforceSSL: true,
      visibilityTimeout,
      ...(props.retentionPeriod ? { retentionPeriod: props.retentionPeriod } : {}),
      deadLetterQueue: { queue: this.deadLetterQueue, maxReceiveCount: props.maxReceiveCount },
    });

    const what = props.description ?? id;
    this.deadLetterAlarm = new Alarm(this, 'DeadLetterAlarm', {
      alarmDescription: props.deadLetterQueueConsumed
        ? `${what}: messages reached the dead-letter queue (a message's ${props.maxReceiveCount} receive(s) spent, or its last delivery died); its consumer ends them: look in its logs for why.`
        : `${what}: messages in the dead-letter queue (each one failed ${props.maxReceiveCount} receive(s)); inspect and redrive or delete them.`,
      metric: this.deadLetterMetric(Duration.minutes(1)),
      threshold: 0,
      comparisonOperator: ComparisonOperator.GREATER_THAN_THRESHOLD,
      evaluationPeriods: 1,
      treatMissingData: TreatMissingData.NOT_BREACHING,
    });
    if (props.alarmAction) this.deadLetterAlarm.addAlarmAction(props.alarmAction);
  }

  /**
   * Messages that reached the dead-letter queue, per `period`: what its alarm watches (per minute) and the
   * dashboard plots. Visible messages (Maximum) for a dead-letter queue nobody consumes. A consumed one is
   * emptied within seconds and its gauges are sampled once a minute, so this adds the in-flight gauge and
   * the count of messages received from it (every dead letter is received at least once); FILL: SQS
   * sends no data points for a queue idle for hours.
   */
  deadLetterMetric(period: Duration, label?: string): IMetric {
    const dlq = this.deadLetterQueue;
    const visible = dlq.metricApproximateNumberOfMessagesVisible({
      period,
      statistic: Stats.MAXIMUM,
      ...(label ? { label } : {}),
    });
    if (!this.deadLetterQueueConsumed) return visible;
    return new MathExpression({
      label: label ?? 'messages that reached the dead-letter queue',
      expression: 'FILL(visible, 0) + FILL(inFlight, 0) + FILL(received, 0)',
      usingMetrics: {
        visible: dlq.metricApproximateNumberOfMessagesVisible({ period, statistic: Stats.MAXIMUM }),
        inFlight: dlq.metricApproximateNumberOfMessagesNotVisible({ period, statistic: Stats.MAXIMUM }),
        received: dlq.metricNumberOfMessagesReceived({ period, statistic: Stats.SUM }),
      },
      period,
    });
  }
}
