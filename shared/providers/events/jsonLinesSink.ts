import { appendFile } from 'node:fs/promises';
import type { Clock } from '../../core/clock.ts';
import { type EventSink, POOL_EVENT_SOURCE, type PoolEventType } from '../../core/observability.ts';
import { inertJson } from '../../core/text.ts';

/**
 * The embedded pool's event bus: one EventBridge-shaped event per line in a file, so a user can
 * `tail -f .metastatic/events.jsonl` (or feed it to jq) the way a rule would consume the bus on AWS.
 * Each line is JSON whose control, format and separator characters are all escaped (`\uHHHH`): the
 * values are as published, and a raw `tail -f` shows nothing a terminal would act on or hide.
 */
export class JsonLinesEventSink implements EventSink {
  private sequence = 0;

  constructor(
    private readonly path: string,
    private readonly clock: Clock,
  ) {}

  async publish(type: PoolEventType, detail: Record<string, unknown>): Promise<void> {
    const at = this.clock.now();
    const event = {
      version: '0',
      id: `${at.toString(36)}-${process.pid}-${this.sequence++}`,
      'detail-type': type,
      source: POOL_EVENT_SOURCE,
      time: new Date(at).toISOString(),
      detail,
    };
    await appendFile(this.path, `${inertJson(JSON.stringify(event))}\n`);
  }
}
