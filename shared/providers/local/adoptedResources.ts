import type { LocalEventQueue } from './localEvents.ts';
import { isAlive, type LocalRecord, type RecordFiles } from './localRecords.ts';
import { AdoptedWatch, type SupervisorLogger, stopAdoptedProcess } from './supervisor.ts';

/**
 * How often the processes adopted from an earlier run are checked: they are not our children, so no
 * exit event tells us they died; a dead one is reported `terminated` within this long, as a child is at once.
 */
export const ADOPTED_WATCH_MS = 500;

/**
 * The backing processes a LocalProvider knows only from their records on disk (an earlier run of the
 * provider started them): watched for their death, and stopped by pid, each reported as a child's
 * changes are.
 */
export class AdoptedResources {
  /** Terminations in progress, so that concurrent ones of one resource share one. */
  private readonly stops = new Map<string, Promise<void>>();
  /**
   * Processes adopted from an earlier run (alive when last seen): not our children, so no exit event tells
   * us they died; they are polled, so no node is placed on a dead one's port until the next reaper run.
   */
  private readonly watch = new AdoptedWatch(
    ADOPTED_WATCH_MS,
    (record) => this.died(record),
    (id) => this.stops.has(id),
  );

  constructor(
    private readonly files: RecordFiles,
    private readonly events: LocalEventQueue,
    private readonly logger: SupervisorLogger,
    /** A watched process died: its resource has ended, with this last record. */
    private readonly onEnded: (record: LocalRecord) => void,
  ) {}

  /** Watches the process of a live record that no child of this provider has. */
  add(record: LocalRecord): void {
    this.watch.add(record);
  }

  /** Terminates an adopted resource (concurrent calls share one termination). */
  terminate(resourceId: string): Promise<void> {
    let stopping = this.stops.get(resourceId);
    if (!stopping) {
      stopping = this.stop(resourceId).finally(() => this.stops.delete(resourceId));
      this.stops.set(resourceId, stopping);
    }
    return stopping;
  }

  /** Stops watching (the provider shuts down). */
  close(): void {
    this.watch.stop();
  }

  /** A watched adopted process died: reported `terminated`, as a child's exit is. */
  private async died(record: LocalRecord): Promise<void> {
    const { resourceId } = record;
    this.onEnded(record);
    this.logger.warn('local provider: adopted backing node exited', { resourceId, pid: record.pid });
    await this.files.remove(resourceId).catch(() => {});
    this.events.emit(resourceId, 'terminated');
  }

  /** Stops a resource known only from its state file (started by an earlier run of the provider). */
  private async stop(resourceId: string): Promise<void> {
    this.watch.remove(resourceId);
    const record = await this.files.read(resourceId);
    if (!record) return;
    const alive = () => isAlive(record.pid, resourceId);
    if (!(await alive())) {
      await this.files.remove(resourceId);
      return;
    }
    this.events.emit(resourceId, 'shutting-down');
    await stopAdoptedProcess(record.pid, alive, resourceId, this.logger);
    await this.files.remove(resourceId);
    this.events.emit(resourceId, 'terminated');
  }
}
