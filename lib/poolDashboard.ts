import {
  type Alarm,
  AlarmStatusWidget,
  Dashboard,
  GraphWidget,
  type IMetric,
  Metric,
  Stats,
} from 'aws-cdk-lib/aws-cloudwatch';
import { Duration } from 'aws-cdk-lib/core';
import type { Construct } from 'constructs';
import { MetricName } from '../shared/core/observability.ts';
import type { PoolFunction } from './poolFunction.ts';
import { METRICS_NAMESPACE, POWERTOOLS_SERVICE_NAME } from './poolProps.ts';
import type { QueueWithDlq } from './queueWithDlq.ts';

/** What the pool's dashboard shows. */
export interface PoolDashboardProps {
  readonly poolId: string;
  readonly requestQueue: QueueWithDlq;
  readonly fulfilQueue: QueueWithDlq;
  readonly reaperFunction: PoolFunction;
  readonly alarms: readonly Alarm[];
}

const PERIOD = Duration.minutes(5);
const WIDTH = 8;
const HEIGHT = 6;

/**
 * One CloudWatch dashboard per pool (created in `scope`, the pool): requests in, fulfilled and failed;
 * time to fulfilled (p50, p95); nodes waiting; slots used and free; backing nodes by state; launches and
 * launch failures; requests that waited for a boot and how long; the forecast and the ready room held
 * (min-ready auto); reaper runs and errors; what reached the dead-letter queues; the pool's alarms. The pool's
 * metrics come from its functions (Powertools EMF, namespace METRICS_NAMESPACE, dimensions service and
 * pool); the gauges (slots, backing nodes by state, nodes waiting) are recorded by each reaper run. Its
 * name is CloudFormation's (a dashboard name is unique in the account): the stack outputs it.
 */
export function poolDashboard(scope: Construct, o: PoolDashboardProps): Dashboard {
  const pool = (name: MetricName, statistic: string, label: string): IMetric =>
    new Metric({
      namespace: METRICS_NAMESPACE,
      metricName: name,
      dimensionsMap: { service: POWERTOOLS_SERVICE_NAME, pool: o.poolId },
      statistic,
      period: PERIOD,
      label,
    });
  const graph = (
    title: string,
    left: IMetric[],
    more: Partial<{ stacked: boolean; leftLabel: string }> = {},
  ) =>
    new GraphWidget({
      title,
      left,
      width: WIDTH,
      height: HEIGHT,
      ...(more.stacked ? { stacked: true } : {}),
      ...(more.leftLabel ? { leftYAxis: { label: more.leftLabel, showUnits: false } } : {}),
    });

  const dashboard = new Dashboard(scope, 'Dashboard', { defaultInterval: Duration.hours(3) });
  dashboard.addWidgets(
    graph('Requests', [
      pool(MetricName.requestsReceived, Stats.SUM, 'in'),
      pool(MetricName.requestsFulfilled, Stats.SUM, 'fulfilled'),
      pool(MetricName.requestsFailed, Stats.SUM, 'failed'),
    ]),
    graph(
      'Time to fulfilled',
      [
        pool(MetricName.timeToFulfilled, Stats.p(50), 'p50'),
        pool(MetricName.timeToFulfilled, Stats.p(95), 'p95'),
      ],
      { leftLabel: 'ms' },
    ),
    graph('Nodes waiting', [
      pool(MetricName.nodesWaiting, Stats.MAXIMUM, 'nodes waiting'),
      pool(MetricName.capacityWait, Stats.MAXIMUM, 'longest wait for capacity (ms)'),
    ]),
  );
  dashboard.addWidgets(
    graph(
      'Slots',
      [pool(MetricName.slotsInUse, Stats.MAXIMUM, 'used'), pool(MetricName.slotsFree, Stats.MAXIMUM, 'free')],
      { stacked: true },
    ),
    graph(
      'Backing nodes by state',
      [
        pool(MetricName.backingLaunching, Stats.MAXIMUM, 'launching'),
        pool(MetricName.backingActive, Stats.MAXIMUM, 'ready, in use'),
        pool(MetricName.idleBackingNodes, Stats.MAXIMUM, 'ready, idle'),
        pool(MetricName.backingRetiring, Stats.MAXIMUM, 'retiring'),
        pool(MetricName.backingFailed, Stats.MAXIMUM, 'failed'),
      ],
      { stacked: true },
    ),
    graph('Launches', [
      pool(MetricName.launchSucceeded, Stats.SUM, 'launched'),
      pool(MetricName.launchFailed, Stats.SUM, 'launch failed'),
      pool(MetricName.reaped, Stats.SUM, 'stopped'),
    ]),
  );
  dashboard.addWidgets(
    // What users feel: how many requests had to wait for a backing node to boot, and how long.
    graph('Waits for a boot', [
      pool(MetricName.requestsFulfilled, Stats.SUM, 'fulfilled'),
      pool(MetricName.requestsWaitedForBoot, Stats.SUM, 'waited for a boot'),
    ]),
    graph(
      'Wait for a boot',
      [pool(MetricName.waitForBoot, Stats.p(50), 'p50'), pool(MetricName.waitForBoot, Stats.p(95), 'p95')],
      { leftLabel: 'ms' },
    ),
    // min-ready auto: the forecast and the ready room held from it (empty without such a label).
    graph('Forecast and ready room', [
      pool(MetricName.forecastArrivals, Stats.MAXIMUM, 'forecast arrivals / min'),
      pool(MetricName.readyRoomHeld, Stats.MAXIMUM, 'ready nodes held'),
    ]),
  );
  const fn = o.reaperFunction.function;
  dashboard.addWidgets(
    graph('Reaper runs', [
      fn.metricInvocations({ period: PERIOD, statistic: Stats.SUM, label: 'runs' }),
      fn.metricErrors({ period: PERIOD, statistic: Stats.SUM, label: 'errors' }),
    ]),
    // What the dead-letter alarms watch: the request DLQ is consumed by the request function within
    // seconds, so its visible messages alone would show almost nothing (QueueWithDlq.deadLetterMetric).
    graph('Dead-letter queues', [
      o.requestQueue.deadLetterMetric(PERIOD, 'request DLQ'),
      o.fulfilQueue.deadLetterMetric(PERIOD, 'fulfil DLQ'),
    ]),
    new AlarmStatusWidget({ title: 'Alarms', alarms: [...o.alarms], width: WIDTH, height: HEIGHT }),
  );
  return dashboard;
}
