import {
  Alarm,
  ComparisonOperator,
  type IAlarmAction,
  type IMetric,
  MathExpression,
  Metric,
  Stats,
  TreatMissingData,
} from 'aws-cdk-lib/aws-cloudwatch';
import type { Rule } from 'aws-cdk-lib/aws-events';
import { Duration } from 'aws-cdk-lib/core';
import type { Construct } from 'constructs';
import type { PoolFunction } from './poolFunction.ts';
import { clampDuration, METRICS_NAMESPACE, POWERTOOLS_SERVICE_NAME } from './poolProps.ts';
import type { QueueWithDlq } from './queueWithDlq.ts';

/** What the pool's alarms watch. */
export interface PoolAlarmsProps {
  readonly poolId: string;
  readonly reaperRate: Duration;
  readonly alarmAction: IAlarmAction | undefined;
  readonly requestQueue: QueueWithDlq;
  /** Lease renewals: one dead-lettered is a lease that may have lapsed under a running job. */
  readonly leaseQueue: QueueWithDlq;
  readonly fulfilQueue: QueueWithDlq;
  readonly reaperFunction: PoolFunction;
  /** The rules that bring EC2 events to the fulfil queue. */
  readonly ec2Rules: readonly Rule[];
}

/**
 * The alarms an operator of the pool needs (created in `scope`, the pool): dead letters on any queue,
 * failed launches, requests waiting for capacity, a stalled request queue, a failing reaper, and EC2 events
 * EventBridge could not deliver.
 */
export function poolAlarms(scope: Construct, o: PoolAlarmsProps): Alarm[] {
  const reaperPeriod = clampDuration(o.reaperRate, Duration.minutes(1), Duration.days(1));
  const reaperRuns = Math.max(
    1,
    Math.min(5, Math.floor(Duration.days(1).toSeconds() / reaperPeriod.toSeconds())),
  );
  return [
    o.requestQueue.deadLetterAlarm,
    o.leaseQueue.deadLetterAlarm,
    o.fulfilQueue.deadLetterAlarm,
    addAlarm(scope, 'LaunchFailedAlarm', o.alarmAction, {
      alarmDescription: 'metastatic: backing-node launches failed in the last 5 minutes (LaunchFailed > 0).',
      metric: new Metric({
        namespace: METRICS_NAMESPACE,
        metricName: 'LaunchFailed',
        dimensionsMap: { service: POWERTOOLS_SERVICE_NAME, pool: o.poolId },
        statistic: Stats.SUM,
        period: Duration.minutes(5),
      }),
      threshold: 0,
    }),
    // A request waiting for capacity comes back every visibility timeout (3 minutes) and reports its
    // age each time, so every 5-minute period of a wait has a data point.
    addAlarm(scope, 'RequestsWaitingAlarm', o.alarmAction, {
      alarmDescription: 'metastatic: a request has waited more than 15 minutes for capacity (CapacityWait).',
      metric: new Metric({
        namespace: METRICS_NAMESPACE,
        metricName: 'CapacityWait',
        dimensionsMap: { service: POWERTOOLS_SERVICE_NAME, pool: o.poolId },
        statistic: Stats.MAXIMUM,
        period: Duration.minutes(5),
      }),
      threshold: Duration.minutes(15).toMilliseconds(),
    }),
    // SQS leaves messages received three times or more out of this metric: it sees requests nobody
    // receives (the request function failing before it reads them), not requests that wait.
    addAlarm(scope, 'RequestQueueStalledAlarm', o.alarmAction, {
      alarmDescription:
        'metastatic: a message has sat in the request queue for more than 15 minutes without being received.',
      metric: o.requestQueue.queue.metricApproximateAgeOfOldestMessage({
        statistic: Stats.MAXIMUM,
        period: Duration.minutes(1),
      }),
      threshold: Duration.minutes(15).toSeconds(),
    }),
    // One period per scheduled run (a failed run is not retried), so 5 periods are 5 runs in a row;
    // CloudWatch evaluates at most one day, so a slow schedule is judged on fewer runs.
    addAlarm(scope, 'ReaperErrorsAlarm', o.alarmAction, {
      alarmDescription: `metastatic: the reaper failed in ${reaperRuns} consecutive scheduled runs.`,
      metric: o.reaperFunction.function.metricErrors({
        statistic: Stats.SUM,
        period: reaperPeriod,
      }),
      threshold: 0,
      evaluationPeriods: reaperRuns,
    }),
    // EventBridge could not deliver EC2 events to the fulfil queue, nor to its dead-letter queue (a
    // customer-managed key EventBridge may not use fails both): the pool stops hearing of its instances.
    addAlarm(scope, 'Ec2EventsDeliveryAlarm', o.alarmAction, {
      alarmDescription:
        'metastatic: EventBridge failed to deliver EC2 events to the fulfil queue (FailedInvocations or ' +
        "InvocationsFailedToBeSentToDlq of the EC2 rules > 0); check the queues' key policy and queue policy.",
      metric: ec2DeliveryFailures(o.ec2Rules.map((r) => r.ruleName)),
      threshold: 0,
    }),
  ];
}

function addAlarm(
  scope: Construct,
  id: string,
  action: IAlarmAction | undefined,
  props: { alarmDescription: string; metric: IMetric; threshold: number; evaluationPeriods?: number },
): Alarm {
  const alarm = new Alarm(scope, id, {
    ...props,
    evaluationPeriods: props.evaluationPeriods ?? 1,
    comparisonOperator: ComparisonOperator.GREATER_THAN_THRESHOLD,
    treatMissingData: TreatMissingData.NOT_BREACHING,
  });
  if (action) alarm.addAlarmAction(action);
  return alarm;
}

/**
 * Failed deliveries of the EC2 rules (AWS/Events, dimension RuleName: the default bus), per 5 minutes:
 * FailedInvocations (failed for good) plus InvocationsFailedToBeSentToDlq (the dead-letter queue refused
 * them too). EventBridge sends these only when they are not zero, hence FILL.
 */
function ec2DeliveryFailures(ruleNames: readonly string[]): IMetric {
  const usingMetrics: Record<string, IMetric> = {};
  const terms: string[] = [];
  ruleNames.forEach((RuleName, i) => {
    for (const [prefix, metricName] of [
      ['failed', 'FailedInvocations'],
      ['lost', 'InvocationsFailedToBeSentToDlq'],
    ] as const) {
      const id = `${prefix}${i}`;
      usingMetrics[id] = new Metric({
        namespace: 'AWS/Events',
        metricName,
        dimensionsMap: { RuleName },
        statistic: Stats.SUM,
        period: Duration.minutes(5),
      });
      terms.push(`FILL(${id}, 0)`);
    }
  });
  return new MathExpression({
    label: 'EC2 events EventBridge failed to deliver',
    expression: terms.join(' + '),
    usingMetrics,
    period: Duration.minutes(5),
  });
}
