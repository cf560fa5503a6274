import type { Clock } from '../core/clock.ts';
import type { Log } from '../core/log.ts';
import type { ResolvedConfig } from '../core/model.ts';
import type { ReapReport } from '../usecases/reap/reapReport.ts';

/**
 * The embedded pool's stand-in for the reaper's EventBridge schedule: runs the reaper every `interval`
 * seconds and, sooner, at a time asked for (an idle backing node becoming due, a grace-time ending), so
 * that an empty backing node goes when its grace-time ends, not up to an interval later. One run at a time.
 * A release starts a grace-time, whether a release message's or a lapsed lease's (released by a run of
 * the reaper itself): both prompt a run for when the shortest grace-time ends (`released`).
 */
export class ReaperSchedule {
  private timer: NodeJS.Timeout | undefined;
  private dueAt: number | undefined;
  private reaping: Promise<unknown> | undefined;
  private stopped = false;
  /** Whether the schedule runs (schedule() was called): only then does a release prompt a run. */
  private started = false;

  constructor(
    private readonly reap: () => Promise<ReapReport>,
    /** Seconds between runs (fractions allowed; at least 10 ms). */
    private readonly interval: number,
    private readonly clock: Clock,
    private readonly log: Log,
    /** `shortestGraceMs`: the shortest grace-time of the pool's labels (none: no label, nothing to prompt). */
    private readonly prompt: { readonly shortestGraceMs?: number } = {},
  ) {}

  /** Runs the reaper now (waits for a run already in progress first). */
  async runNow(): Promise<ReapReport> {
    await this.reaping;
    const run = this.reap().then((report) => {
      // Nodes whose client lease lapsed were released by this run: prompted as a release message is.
      if (report.leasesExpired?.length) this.released();
      return report;
    });
    this.reaping = run.catch(() => undefined);
    return run;
  }

  /**
   * Schedules the next run at `at` (ms since the epoch) or an interval from now, whichever is sooner; a
   * run already due sooner stays. Each run schedules the next: at its report's nextCheckAt, if any.
   */
  schedule(at?: number): void {
    if (this.stopped) return;
    this.started = true;
    const intervalMs = Math.max(10, this.interval * 1000);
    const now = this.clock.now();
    const due = Math.min(now + intervalMs, at ?? Number.POSITIVE_INFINITY);
    if (this.timer && this.dueAt !== undefined && this.dueAt <= due) return;
    clearTimeout(this.timer);
    this.dueAt = due;
    this.timer = setTimeout(
      async () => {
        this.timer = undefined;
        this.dueAt = undefined;
        let next: number | undefined;
        try {
          next = (await this.runNow()).nextCheckAt;
        } catch (err) {
          this.log.error('reaper run failed', { error: err });
        }
        this.schedule(next === undefined ? undefined : next + 10);
      },
      Math.max(0, due - now),
    );
  }

  /**
   * A node was released: its backing node's grace-time starts now, so a run is due when the shortest
   * grace-time ends (one for a later one is scheduled by that run's nextCheckAt). Nothing while the
   * schedule does not run (a pool whose tests run the reaper themselves).
   */
  released(): void {
    if (!this.started || this.prompt.shortestGraceMs === undefined) return;
    this.schedule(this.clock.now() + this.prompt.shortestGraceMs + 10);
  }

  /** No run is scheduled any more (a run in progress goes on: see `settled`). */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /** Resolves once the run in progress, if any, has ended. */
  async settled(): Promise<void> {
    await this.reaping;
  }
}

/** The shortest grace-time of a pool's metastatic labels, ms; undefined when it has none. */
export function shortestGraceMs(config: ResolvedConfig): number | undefined {
  const graces = config.metastaticPools.flatMap((p) => [...p.labels.values()].map((l) => l.graceTime));
  return graces.length > 0 ? Math.min(...graces) * 1000 : undefined;
}
