import { MetricName, PoolEventType } from '../core/observability.ts';
import type { RequestRecord } from '../core/records.ts';
import { type Context, emit } from './context.ts';

/** Publishes the end of a request (fulfilled or failed) and counts failures. */
export async function requestSettled(ctx: Context, r: RequestRecord): Promise<void> {
  if (r.state === 'fulfilled') {
    await emit(ctx, PoolEventType.requestFulfilled, {
      requestId: r.id,
      requestor: r.requestor,
      labels: r.labels,
      nodes: r.nodes.map((n) => ({
        id: n.id,
        label: n.label,
        state: n.state,
        host: n.host,
        port: n.port,
        backingNodeId: n.backingNodeId,
        slot: n.slot,
      })),
    });
  } else if (r.state === 'failed') {
    ctx.metrics?.count(MetricName.requestsFailed);
    await emit(ctx, PoolEventType.requestFailed, {
      requestId: r.id,
      requestor: r.requestor,
      labels: r.labels,
      reason: r.reason,
    });
  }
}
