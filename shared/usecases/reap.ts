import { markRetiring, markStopped } from '../core/backing.ts';
import { ConflictError } from '../core/errors.ts';
import { reapDecision } from '../core/reaper.ts';
import type { BackingRecord } from '../core/records.ts';
import { keys, reapPartition } from '../store/table.ts';
import type { Context } from './context.ts';

export interface ReapReport {
  /** Backing nodes marked retiring this run. */
  readonly retired: string[];
  /** Backing nodes whose resource is confirmed gone this run. */
  readonly stopped: string[];
  /** Retirements lost to a concurrent change (an allocation won): the backing node stays. */
  readonly conflicts: number;
  readonly errors: string[];
  /** The earliest instant an idle backing node seen this run becomes due (schedule the next run by it). */
  readonly nextCheckAt?: number;
}

/**
 * One reaper run. Finds empty backing nodes by Query on the reap index, decides with the pure rules
 * (core/reaper.ts), and retires in two phases: first a conditional write (still empty, unchanged since
 * read) marks it retiring, so no allocation can land on it; then the resource is terminated and the
 * record marked stopped. Retiring/failed records left by a crash are finished on the next run.
 */
export async function reap(ctx: Context): Promise<ReapReport> {
  const report: { -readonly [K in keyof ReapReport]: ReapReport[K] } = {
    retired: [],
    stopped: [],
    conflicts: 0,
    errors: [],
  };
  const labels = new Map(
    ctx.config.metastaticPools.flatMap((p) =>
      [...p.labels.values()].map((l) => [`${p.key}#${l.name}`, l] as const),
    ),
  );
  for (const b of await ctx.store.queryReap(reapPartition.idle)) {
    const decision = reapDecision(b, labels.get(`${b.poolKey}#${b.label}`), ctx.clock.now());
    if (!decision.retire) {
      if (decision.recheckAt !== undefined) {
        report.nextCheckAt = Math.min(report.nextCheckAt ?? Number.POSITIVE_INFINITY, decision.recheckAt);
      }
      continue;
    }
    try {
      await ctx.store.putBacking(markRetiring(b, ctx.clock.now(), decision.reason), {
        version: b.version,
        states: ['launching', 'ready'],
        used: 0,
      });
      report.retired.push(b.id);
      ctx.log.info('backing node retiring', { backingNodeId: b.id, reason: decision.reason });
    } catch (err) {
      if (err instanceof ConflictError) {
        report.conflicts++;
        continue;
      }
      throw err;
    }
  }
  const toStop = [
    ...(await ctx.store.queryReap(reapPartition.retiring)),
    ...(await ctx.store.queryReap(reapPartition.failed)),
  ];
  for (const b of toStop) {
    try {
      if (await stop(ctx, b)) report.stopped.push(b.id);
    } catch (err) {
      report.errors.push(`${b.id}: ${(err as Error).message}`);
      ctx.log.error('stopping backing node failed; retried next run', { backingNodeId: b.id, error: err });
    }
  }
  return report;
}

/** Terminates the resource, then records the backing node stopped and frees its place in the backing pool. */
async function stop(ctx: Context, b: BackingRecord): Promise<boolean> {
  if (b.resourceId) {
    const provider = ctx.providers.forPool(b.backingPoolKey);
    await provider.terminate(b.resourceId);
  }
  try {
    await ctx.store.putBacking(markStopped(b, ctx.clock.now()), { version: b.version, states: [b.state] });
  } catch (err) {
    if (err instanceof ConflictError) return false;
    throw err;
  }
  await ctx.store.unreserve(keys.backingPool(b.backingPoolKey), [b.id]);
  ctx.log.info('backing node stopped', { backingNodeId: b.id, resourceId: b.resourceId });
  return true;
}
