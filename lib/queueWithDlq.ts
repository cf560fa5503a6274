import { Duration, Token, Validations } from 'aws-cdk-lib';
import {
  Alarm,
  ComparisonOperator,
  type IAlarmAction,
  Stats,
  TreatMissingData,
} from 'aws-cdk-lib/aws-cloudwatch';
import type { IKey } from 'aws-cdk-lib/aws-kms';
import { Queue, QueueEncryption } from 'aws-cdk-lib/aws-sqs';
import { Construct } from 'constructs';
import { cfnResource } from './cfnResource.ts';

/** AWS's guidance for a queue that feeds a Lambda function: visibility >= 6 x the function's timeout. */
export const VISIBILITY_TIMEOUT_FACTOR = 6;

export interface QueueWithDlqProps {
  /** Receives of a message before it moves to the dead-letter queue. */
  readonly maxReceiveCount: number;
  /**
   * The timeout of the function that consumes the queue. The visibility timeout is derived from it so
   * that a message is never redelivered while a batch that holds it may still be running.
   */
  readonly consumerTimeout: Duration;
  /**
   * Visibility timeout of the queue; must be at least 6 x `consumerTimeout`.
   * @default 6 x consumerTimeout
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
}

/**
 * An SQS queue with its dead-letter queue (14 days' retention) and an alarm that fires as soon as the
 * dead-letter queue holds a message. Both queues are encrypted and refuse requests without TLS.
 */
export class QueueWithDlq extends Construct {
  readonly queue: Queue;
  readonly deadLetterQueue: Queue;
  readonly deadLetterAlarm: Alarm;
  readonly maxReceiveCount: number;

  constructor(scope: Construct, id: string, props: QueueWithDlqProps) {
    super(scope, id);
    if (!Number.isInteger(props.maxReceiveCount) || props.maxReceiveCount < 1) {
      throw new Error(
        `${this.node.path}: maxReceiveCount must be an integer >= 1, got ${props.maxReceiveCount}`,
      );
    }
    const minimumVisibility = props.consumerTimeout.toSeconds() * VISIBILITY_TIMEOUT_FACTOR;
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

    this.deadLetterAlarm = new Alarm(this, 'DeadLetterAlarm', {
      alarmDescription: `${props.description ?? id}: messages in the dead-letter queue (each one failed ${props.maxReceiveCount} receive(s)); inspect and redrive or delete them.`,
      metric: this.deadLetterQueue.metricApproximateNumberOfMessagesVisible({
        period: Duration.minutes(1),
        statistic: Stats.MAXIMUM,
      }),
      threshold: 0,
      comparisonOperator: ComparisonOperator.GREATER_THAN_THRESHOLD,
      evaluationPeriods: 1,
      treatMissingData: TreatMissingData.NOT_BREACHING,
    });
    if (props.alarmAction) this.deadLetterAlarm.addAlarmAction(props.alarmAction);
  }
}
