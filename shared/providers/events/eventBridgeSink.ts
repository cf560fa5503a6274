import { type EventBridgeClient, PutEventsCommand } from '@aws-sdk/client-eventbridge';
import { type EventSink, POOL_EVENT_SOURCE, type PoolEventType } from '../../core/observability.ts';

/**
 * Publishes pool events to an EventBridge bus (the account's default bus unless configured). With a pool
 * id, every event's detail carries it as `poolId`, so rules can tell pools sharing a bus apart.
 */
export class EventBridgeSink implements EventSink {
  constructor(
    private readonly client: EventBridgeClient,
    private readonly busName: string = 'default',
    private readonly poolId?: string,
  ) {}

  async publish(type: PoolEventType, detail: Record<string, unknown>): Promise<void> {
    const out = await this.client.send(
      new PutEventsCommand({
        Entries: [
          {
            EventBusName: this.busName,
            Source: POOL_EVENT_SOURCE,
            DetailType: type,
            Detail: JSON.stringify(this.poolId === undefined ? detail : { ...detail, poolId: this.poolId }),
          },
        ],
      }),
    );
    // PutEvents reports per-entry failures in a 200 response; surface them.
    if ((out.FailedEntryCount ?? 0) > 0) {
      const entry = out.Entries?.[0];
      throw new Error(
        `PutEvents rejected ${type}: ${entry?.ErrorCode ?? 'unknown'} ${entry?.ErrorMessage ?? ''}`.trim(),
      );
    }
  }
}
