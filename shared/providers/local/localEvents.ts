import type { Clock } from '../../core/clock.ts';
import { type InstanceState, type StateChangeEvent, stateChangeEvent } from '../../core/stateChanges.ts';
import type { SupervisorLogger } from './supervisor.ts';

/** The `source` of the local provider's state-change events (EC2's are `aws.ec2`). */
export const LOCAL_EVENT_SOURCE = 'metastatic.local';

/**
 * The local provider's state changes, reported as EC2-shaped events: handed to `onEvent` one at a time,
 * in the order they happened (a handler still running delays the next event). A failing handler is
 * logged, and the next event is delivered all the same.
 */
export class LocalEventQueue {
  private events: Promise<void> = Promise.resolve();

  constructor(
    private readonly onEvent: (event: StateChangeEvent) => Promise<void> | void,
    private readonly region: string,
    private readonly clock: Clock,
    private readonly logger: SupervisorLogger,
  ) {}

  /** Queues an event; events reach `onEvent` one at a time, in order. A failing handler is logged. */
  emit(resourceId: string, state: InstanceState): void {
    const event = stateChangeEvent({
      resourceId,
      state,
      source: LOCAL_EVENT_SOURCE,
      region: this.region,
      at: this.clock.now(),
    });
    this.events = this.events.then(async () => {
      try {
        await this.onEvent(event);
      } catch (err) {
        this.logger.error('local provider: event handler failed', { resourceId, state, error: String(err) });
      }
    });
  }

  /** Resolves once every event emitted so far has been handed to `onEvent`. */
  async flush(): Promise<void> {
    let current: Promise<void>;
    do {
      current = this.events;
      await current;
    } while (current !== this.events);
  }
}
