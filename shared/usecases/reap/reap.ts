import { markDrained } from '../../core/backing.ts';
import { DeadlineError } from '../../core/errors.ts';
import { needsMaxAgeDrain } from '../../core/lifecycle.ts';
import { MetricName } from '../../core/observability.ts';
import type { ReaperCursor } from '../../core/poolStore.ts';
import { nextFirstStep, type ReaperStep, stepOrder } from '../../core/reaperSteps.ts';
import type { BackingRecord } from '../../core/records.ts';
import { forEachBounded, WRITES_IN_FLIGHT } from '../bounded.ts';
import { unlessConflict } from '../conflicts.ts';
import { type Context, timeLeft } from '../context.ts';
import { endOverduePending } from '../place/pending.ts';
import { endExpiredRequests, nodesWaiting } from '../place/waiting.ts';
import { flushArrivals } from '../ready/forecasts.ts';
import { markNodesReady } from '../ready/nodesReady.ts';
import { decideHold } from '../ready/readyAuto.ts';
import { keepMinReady } from '../ready/replenish.ts';
import { failBadBacking, settleFailedNodes } from '../release/failure.ts';
import { endLapsedLeases } from '../release/leases.ts';
import {
  checkClaims,
  enforceDeadlines,
  lookUpAll,
  markRetiringIfDue,
  READYING_WINDOW_MS,
} from './reapChecks.ts';
import type { MutableReport, ReapReport } from './reapReport.ts';
import { type RunningLaunch, readyRunning, reconcile, reconcileCapacity, stopMany } from './reconcile.ts';

/**
 * One reaper run. Everything it looks at comes from Queries on the reap index (every backing node
 * that is not stopped sits in exactly one partition) and from the providers' own lists of tagged
 * resources, which are the truth about what runs. Reconciliation comes first, every run; then the steps
 * of core/reaperSteps.ts:
 * 1. reconciliation both ways (a vanished resource must not be retired as if idle): a record whose
 *    resource is gone fails; tagged resources with no live record are terminated (a batch per provider);
 *    then launching records whose resource runs are checked and made ready if they are (a lost event),
 *    several at once and for at most RUNNING_CHECKS_MS of the run (reconcile.ts readyRunning);
 * 2. `retire`: empty backing nodes are retired by the rules of core/lifecycle.ts, two-phase: a
 *    conditional write (still empty, unchanged since read) marks each due one retiring so no allocation
 *    can land on it; then those and the ones left retiring by earlier runs are terminated in batches
 *    (reconcile.ts stopMany: one TerminateInstances for up to 1,000) and, once the provider confirms them
 *    gone, marked stopped;
 * 3. `deadlines`: launching backing nodes past launch-timeout / boot-timeout fail and their nodes move;
 * 4. `drain`: ready backing nodes past max-age are drained (no new nodes; they go when empty);
 * 5. `claims`: claims no recorded node confirmed within the slot lease are given back; `readying`: nodes
 *    left pending on a backing node ready in the last three minutes are readied (their readying was cut
 *    short);
 * 6. `failed`: failed backing nodes are settled, and the empty ones terminated (as in `retire`);
 * 7. `capacity`: places in max-servers sets held by no live backing node or node past the slot lease are
 *    given back (backing nodes whose slots an earlier step of the run changed are read again first);
 * 8. `request-timeout`: requests still waiting past their request-timeout end `failed` (WAITING
 *    partition, waiting.ts); `pending-timeout`: requests still pending past launch-retries x
 *    (launch-timeout + boot-timeout) after their placement (PENDING partition, pending.ts);
 * 9. `lease-expiry`: requests whose client lease lapsed are released, held nodes kept (LEASE partition of
 *    the free index, only the lapsed ones read; leases.ts);
 * 10. `min-ready`: min-ready seats are refilled (replenish.ts), a label whose spares keep failing backing
 *    off, and free spares moved onto the fullest backing nodes.
 * Every step is bounded by the invocation's time (Context.deadline): what it does not reach is left
 * where the next run finds it (counted `deferred`, not an error). A run cut short makes the next one
 * start with the step after the one it was cut short in (core/reaperSteps.ts), so a burst of work in
 * one step cannot starve the others run after run. A crash anywhere leaves records in partitions the
 * next run picks up.
 */
export async function reap(ctx: Context): Promise<ReapReport> {
  const report: MutableReport = {
    retired: [],
    stopped: [],
    failed: [],
    moved: 0,
    orphans: [],
    reclaimedSlots: 0,
    reclaimedPlaces: 0,
    nodesReadied: 0,
    expiredRequests: [],
    minReadyMade: 0,
    minReadyEnded: 0,
    minReadyMoved: 0,
    conflicts: 0,
    errors: [],
    deferred: 0,
    stepMs: {},
  };
  const stepMs = report.stepMs as Record<string, number>;
  /** Wall time of each part of the run, for the run's log line and the bench (bench/reaper.ts). */
  const timed = async (name: string, work: () => Promise<void>) => {
    const t0 = performance.now();
    try {
      await work();
    } finally {
      stepMs[name] = Math.round(performance.now() - t0);
    }
  };
  const guard = async (what: string, id: string, work: () => Promise<void>) => {
    if (timeLeft(ctx) <= 0) {
      report.deferred++;
      return;
    }
    try {
      await work();
    } catch (err) {
      if (err instanceof DeadlineError) {
        report.deferred++;
        return;
      }
      report.errors.push(`${what} ${id}: ${(err as Error).message}`);
      ctx.log.error(`reaper: ${what} failed; retried next run`, { backingNodeId: id, error: err as Error });
    }
  };

  const read0 = performance.now();
  const idle = await ctx.store.backingInPhase('idle');
  const launching = await ctx.store.backingInPhase('launching');
  const active = await ctx.store.backingInPhase('active');
  const retiring = await ctx.store.backingInPhase('retiring');
  stepMs.read = Math.round(performance.now() - read0);

  // 1. Reconciliation first: a vanished resource must not be retired as if it were idle.
  const gone = new Set<string>();
  let running: RunningLaunch[] = [];
  await timed('reconcile', () =>
    guard('reconcile', '-', async () => {
      running = await reconcile(ctx, [...idle, ...launching, ...active], report, gone);
    }),
  );
  // Launching backing nodes whose resource runs (a lost event, or one still being tried) are checked
  // before the deadlines step fails any, within a bounded part of the run and several at once: a
  // scale-up's hundreds of console reads do not hold back the steps.
  await timed('running', () => guard('running', '-', () => readyRunning(ctx, running, report)));

  // The FAILED partition, read once a run (by the `failed` or the `capacity` step, whichever runs first):
  // what the `failed` step then settled stays in the capacity step's view as it was read, which only
  // keeps their places one run longer (a backing node's end gives its place back itself).
  let failedNow: BackingRecord[] | undefined;
  const readFailed = async () => {
    failedNow ??= await ctx.store.backingInPhase('failed');
    return failedNow;
  };
  // Backing nodes an earlier step of this run changed the slots of (a claim given back, failed): the
  // capacity step reads them again, so a place their slot no longer holds is given back this run.
  const changed = new Set<string>();
  const steps: Record<ReaperStep, () => Promise<void>> = {
    retire: async () => {
      // Each mark is a conditional write of its own item: several in flight (bounded.ts), not one after
      // the other (hundreds of idle backing nodes took most of a run: bench/reaper.ts).
      const marked: BackingRecord[] = [];
      await forEachBounded(
        idle.filter((b) => !gone.has(b.id)),
        WRITES_IN_FLIGHT,
        (b) =>
          guard('retire', b.id, async () => {
            const next = await markRetiringIfDue(ctx, b, report);
            if (next) marked.push(next);
          }),
      );
      // Those just marked and those earlier runs left retiring: terminated in batches.
      const ids = new Set(marked.map((b) => b.id));
      await guard('stop', '-', () =>
        stopMany(ctx, [...marked, ...retiring.filter((b) => !ids.has(b.id))], report),
      );
    },
    deadlines: async () => {
      for (const b of [...launching, ...idle.filter((x) => x.state === 'launching')]) {
        if (gone.has(b.id) || report.retired.includes(b.id)) continue;
        await guard('deadline', b.id, async () => {
          if (await enforceDeadlines(ctx, b, report)) changed.add(b.id);
        });
      }
    },
    drain: async () => {
      for (const b of active) {
        if (gone.has(b.id) || !needsMaxAgeDrain(b, ctx.clock.now())) continue;
        await guard('drain', b.id, async () => {
          await unlessConflict(() =>
            ctx.store.putBacking(markDrained(b, 'max-age reached'), { version: b.version }),
          );
        });
      }
    },
    claims: async () => {
      for (const b of [...launching, ...active]) {
        if (gone.has(b.id)) continue;
        await guard('lease', b.id, async () => {
          if (await checkClaims(ctx, b, report)) changed.add(b.id);
        });
      }
    },
    // Nodes still pending on a backing node that became ready lately: their readying was cut short (a
    // crash after the backing node's write, an event already consumed) and nothing else would come back
    // to it. Only a backing node that became ready lately can hold pending nodes (later ones are placed
    // ready): a few reaper periods after readyAt, as long as a delivery or a run that readies them can last.
    readying: async () => {
      for (const b of active) {
        if (gone.has(b.id) || b.readyAt === undefined || ctx.clock.now() - b.readyAt > READYING_WINDOW_MS)
          continue;
        await guard('ready', b.id, async () => {
          report.nodesReadied += await markNodesReady(ctx, b, failBadBacking);
        });
      }
    },
    // Failed backing nodes: settle their nodes, then terminate the empty ones until confirmed gone.
    failed: async () => {
      let failed: BackingRecord[] | undefined;
      let looks = new Map<string, { gone: boolean }>();
      await guard('settle', '-', async () => {
        const read = await readFailed();
        looks = await lookUpAll(ctx, read);
        failed = read;
      });
      if (!failed) return; // not read, or its resources not looked up: the next run
      const empty: BackingRecord[] = [];
      for (const b of failed) {
        await guard('settle', b.id, async () => {
          const look = looks.get(b.id);
          if (b.resourceId && !look) throw new Error(`resource ${b.resourceId} could not be looked up`);
          const resourceGone = look?.gone ?? true;
          const settled = await settleFailedNodes(ctx, b, resourceGone);
          report.moved += settled.rehomed;
          const current = await ctx.store.getBacking(b.id);
          if (current?.state === 'failed' && current.used === 0) empty.push(current);
        });
      }
      await guard('stop', '-', () => stopMany(ctx, empty, report));
    },
    // Places in max-servers sets that nothing live holds (their delivery died) are given back.
    capacity: async () => {
      await guard('capacity', '-', async () => {
        const live = new Map(
          [...idle, ...launching, ...active, ...(await readFailed()), ...retiring].map(
            (b) => [b.id, b] as const,
          ),
        );
        for (const id of changed) {
          const now = await ctx.store.getBacking(id);
          if (now && now.state !== 'stopped') live.set(id, now);
          else live.delete(id);
        }
        await reconcileCapacity(ctx, [...live.values()], report);
      });
    },
    // Requests still waiting past their request-timeout end, whatever became of their message.
    'request-timeout': async () => {
      await guard('request-timeout', '-', async () => {
        const ended = await endExpiredRequests(ctx);
        report.expiredRequests.push(...ended.expired);
        if (!ended.complete) report.deferred++;
      });
    },
    // ...and requests placed but pending past their deadline: each attempt's launch and boot timeouts passed.
    'pending-timeout': async () => {
      await guard('pending-timeout', '-', async () => {
        const ended = await endOverduePending(ctx);
        report.expiredRequests.push(...ended.expired);
        if (!ended.complete) report.deferred++;
      });
    },
    // Client leases that lapsed (before min-ready in the usual order, so the seats it frees are refilled
    // this run).
    'lease-expiry': async () => {
      await guard('lease-expiry', '-', async () => {
        const ended = await endLapsedLeases(ctx);
        report.leasesExpired = [...(report.leasesExpired ?? []), ...ended.expired];
        if (!ended.complete) report.deferred++;
      });
    },
    // min-ready: every label's seats refilled, spares on backing nodes that take no new nodes replaced
    // (before max-age lets them go), seats above a lowered min-ready emptied, free spares moved onto the
    // fullest backing nodes.
    'min-ready': async () => {
      const forecast = { perMinute: 0, held: 0 };
      const hosts = new Map(
        [...idle, ...launching, ...active].filter((b) => !gone.has(b.id)).map((b) => [b.id, b] as const),
      );
      // Arrivals this instance counted and has not written yet (the embedded pool's request handler).
      await guard('min-ready', 'forecasts', () => flushArrivals(ctx));
      for (const label of ctx.config.metastaticLabelNames) {
        await guard('min-ready', label, async () => {
          // min-ready auto: how many to hold now, from the label's forecast (readyAuto.ts).
          const auto = ctx.config.readyAuto?.get(label);
          const decided = auto ? await decideHold(ctx, label, auto, hosts) : undefined;
          if (decided?.hold) {
            forecast.perMinute += decided.hold.perMinute;
            forecast.held += decided.hold.seats;
          }
          // The seats the decision read are the upkeep's (not read again).
          const kept = await keepMinReady(ctx, label, {
            hosts,
            ...(decided ? { wanted: decided.hold?.seats ?? 0, state: decided.state } : {}),
          });
          report.minReadyMade += kept.made;
          report.minReadyEnded += kept.ended;
          report.minReadyMoved += kept.moved;
          report.deferred += kept.deferred;
          report.errors.push(...kept.errors);
        });
      }
      // The forecast and the ready room it holds (gauges: each run's reading), when a label forecasts.
      if (ctx.config.readyAuto?.size) {
        ctx.metrics?.count(MetricName.forecastArrivals, forecast.perMinute);
        ctx.metrics?.count(MetricName.readyRoomHeld, forecast.held);
      }
    },
  };
  // The steps, starting where the last run that ran out of time left off (core/reaperSteps.ts).
  let cursor: ReaperCursor | undefined;
  try {
    cursor = await ctx.store.reaperCursor();
  } catch (err) {
    ctx.log.warn('reaper: could not read where to start; the usual order', { error: (err as Error).message });
  }
  const order = stepOrder(cursor?.first);
  let lastStarted = -1;
  for (const [i, step] of order.entries()) {
    if (timeLeft(ctx) <= 0) {
      report.deferred++; // this step and the ones after it: the next run's
      break;
    }
    lastStarted = i;
    await timed(step, steps[step]);
  }
  const next = nextFirstStep(order, lastStarted, report.deferred > 0);
  if (next !== cursor?.first) {
    // A concurrent run that wrote first had the same view of the work; its word stands.
    await ctx.store.putReaperCursor(next, cursor?.version).catch((err: unknown) => {
      ctx.log.warn('reaper: could not record where the next run starts', { error: (err as Error).message });
    });
  }
  // Gauges, from what this run read.
  const taking = [...launching, ...active, ...idle];
  ctx.metrics?.count(
    MetricName.slotsInUse,
    taking.reduce((n, b) => n + b.used, 0),
  );
  ctx.metrics?.count(
    MetricName.slotsFree,
    taking.reduce((n, b) => n + Math.max(0, b.slots - b.used), 0),
  );
  ctx.metrics?.count(MetricName.idleBackingNodes, idle.length);
  ctx.metrics?.count(MetricName.backingLaunching, launching.length);
  ctx.metrics?.count(MetricName.backingActive, active.length);
  ctx.metrics?.count(MetricName.backingRetiring, retiring.length);
  // From the capacity step's read (none when that step did not run: a missing reading, not a wrong one).
  if (failedNow) ctx.metrics?.count(MetricName.backingFailed, failedNow.length);
  const waiting = ctx.metrics ? await nodesWaiting(ctx) : undefined;
  if (waiting !== undefined) ctx.metrics?.count(MetricName.nodesWaiting, waiting);
  return report;
}
