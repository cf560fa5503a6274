/**
 * A reference model of the pool's rules, in memory, for cross-checking the simulator: the same
 * placement order (fullest, or Nodepool's oldest within the first page of 10 fullest candidates the
 * free index returns), launches on demand, boot, release, and the reaper's retirement rule (empty for
 * grace-time since the last release and launched at least min-retention-time ago) on the same grid.
 * Written from the rules, not from the code: when it and the real code disagree, one of them has a
 * surprise in it. It is not used for any figure.
 */
import { backingNodeId, nodeId } from '../../shared/core/ids.ts';
import { EventQueue } from './queue.ts';
import { EVENT_RANK, POOL_KEY, requestIdOf, type SimOptions, waitStats } from './simulate.ts';
import type { Job, Trace } from './traces.ts';

export interface ModelResult {
  readonly instanceSeconds: number;
  readonly backingLaunched: number;
  readonly waitMeanS: number;
  readonly waitP95S: number;
  readonly warmHits: number;
}

interface Backing {
  readonly id: string;
  readonly label: string;
  readonly launchedAt: number;
  readonly readyAt: number;
  used: number;
  lastUsedAt: number;
  retiredAt?: number;
}

type ModelEvent =
  | { readonly kind: 'end'; readonly job: Job; readonly backing: Backing }
  | { readonly kind: 'arrival'; readonly job: Job }
  | { readonly kind: 'reap' };

/** The free index's page size (placement.ts reads one page of this many candidates at a time). */
const PAGE = 10;

export function model(trace: Trace, o: SimOptions): ModelResult {
  const queue = new EventQueue<ModelEvent>((e) => EVENT_RANK[e.kind]);
  const backings: Backing[] = [];
  const tickMs = o.reaperTickS * 1000;
  const onGrid = (t: number) => (tickMs > 0 ? Math.ceil(t / tickMs) * tickMs : t);
  const reapsAt = new Set<number>();
  const scheduleReap = (t: number) => {
    const at = onGrid(t);
    if (reapsAt.has(at)) return;
    reapsAt.add(at);
    queue.push(at, { kind: 'reap' });
  };
  const waits: number[] = [];
  let warmHits = 0;
  let nodesLive = 0;
  for (const job of trace.jobs) queue.push(job.arrivalMs, { kind: 'arrival', job });

  for (let q = queue.pop(); q; q = queue.pop()) {
    const now = q.at;
    const e = q.event;
    if (e.kind === 'arrival') {
      const job = e.job;
      if (o.maxServers !== undefined && nodesLive + 1 > o.maxServers) {
        queue.push(now + o.retryS * 1000, { kind: 'arrival', job });
        continue;
      }
      nodesLive++;
      // The free index's order (fewest free slots, then oldest), one page of it, then the policy's.
      const free = backings
        .filter((b) => b.label === job.label && b.retiredAt === undefined && b.used < o.slots)
        .sort(
          (a, b) =>
            o.slots - a.used - (o.slots - b.used) || a.launchedAt - b.launchedAt || (a.id < b.id ? -1 : 1),
        );
      const page = free.slice(0, PAGE);
      if (o.policy === 'oldest') page.sort((a, b) => a.launchedAt - b.launchedAt || (a.id < b.id ? -1 : 1));
      else page.sort((a, b) => b.used - a.used || a.launchedAt - b.launchedAt || (a.id < b.id ? -1 : 1));
      let b = page[0];
      if (!b) {
        const id = backingNodeId(POOL_KEY, job.label, nodeId(requestIdOf(job), 0), 1);
        b = {
          id,
          label: job.label,
          launchedAt: now,
          readyAt: now + o.bootS * 1000,
          used: 0,
          lastUsedAt: now,
        };
        backings.push(b);
      }
      b.used++;
      const start = Math.max(now, b.readyAt);
      if (start === now) warmHits++;
      waits.push((start - job.arrivalMs) / 1000);
      queue.push(start + job.durationMs, { kind: 'end', job, backing: b });
    } else if (e.kind === 'end') {
      nodesLive--;
      e.backing.used--;
      e.backing.lastUsedAt = now;
      if (e.backing.used === 0) scheduleReap(now + o.graceS * 1000);
    } else {
      reapsAt.delete(now);
      let next: number | undefined;
      for (const b of backings) {
        if (b.retiredAt !== undefined || b.used > 0) continue;
        const at = Math.max(b.lastUsedAt + o.graceS * 1000, b.launchedAt + o.minRetentionS * 1000);
        if (now >= at) b.retiredAt = now;
        else next = Math.min(next ?? Number.POSITIVE_INFINITY, at);
      }
      if (next !== undefined) scheduleReap(next);
    }
  }
  const w = waitStats(waits);
  return {
    instanceSeconds: backings.reduce((s, b) => s + ((b.retiredAt as number) - b.launchedAt), 0) / 1000,
    backingLaunched: backings.length,
    waitMeanS: w.mean,
    waitP95S: w.p95,
    warmHits,
  };
}
