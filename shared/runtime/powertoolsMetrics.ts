import { type Metrics, MetricUnit } from '@aws-lambda-powertools/metrics';
import type { MetricName, MetricSink } from '../core/observability.ts';

/**
 * The metrics port on Powertools: CloudWatch EMF, flushed by the Lambda entry point after each
 * invocation (`metrics.publishStoredMetrics()`), dimension `service` from POWERTOOLS_SERVICE_NAME.
 * The gauges (SlotsInUse, IdleBackingNodes) are emitted once per reaper run, so their Maximum over a
 * period is the reading.
 */
export class PowertoolsMetricSink implements MetricSink {
  constructor(private readonly metrics: Metrics) {}

  count(name: MetricName, value = 1): void {
    this.metrics.addMetric(name, MetricUnit.Count, value);
  }

  milliseconds(name: MetricName, ms: number): void {
    this.metrics.addMetric(name, MetricUnit.Milliseconds, ms);
  }
}
