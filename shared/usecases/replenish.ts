import { BusyError, CapacityError, DeadlineError, LaunchFailedError } from '../core/errors.ts';
import { parseNodeId } from '../core/ids.ts';
import { isFreeSpare, seatStep, spareMessage, spareRequestId } from '../core/minReady.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../core/records.ts';
import { type Context, deliveryDead, timeLeft } from './context.ts';
import { endSpare, usableSpareHost } from './minReady.ts';
import { requestNodes } from './requestNodes.ts';
import { failRequest } from './requests.ts';

/**
 * Keeps each label's min-ready seats filled (core/minReady.ts): after an allocation that took spares
 * (the request handler) and on the reaper's schedule (with the backing nodes it read: max-age, drains).
 */

/** What one upkeep of a label's seats did. */
export interface UpkeepReport {
  /** Spares placed (or placing) now. */
  made: number;
  /** Spares ended: taken by a delivery that died, on a backing node that takes no new nodes, surplus. */
  ended: number;
  /** Seats whose spare waits for capacity. */
  waiting: number;
  /** Free spares moved onto a fuller backing node (consolidation). */
  moved: number;
  /** Seats left for the next upkeep because the invocation's time ran out (Context.deadline). */
  deferred: number;
  errors: string[];
}

export interface UpkeepOptions {
  /**
   * The live backing nodes (launching or ready, as the reaper read them this run): spares on one that
   * takes no new nodes (past max-age, drained, failed, retiring) are replaced.
   */
  readonly hosts?: ReadonlyMap<string, BackingRecord>;
}

/**
 * Keeps a label's min-ready seats filled: each seat's spare is made (placed like any request, after
 * every waiting one), and a seat whose spare was taken and recorded, or ended, moves on to a new spare
 * (a conditional advance of its generation: two replenishers never make two). Seats above min-ready
 * (it was lowered) lose their free spares. Idempotent and safe to run anywhere, any number at once.
 */
export async function keepMinReady(
  ctx: Context,
  label: string,
  options: UpkeepOptions = {},
): Promise<UpkeepReport> {
  const report: UpkeepReport = { made: 0, ended: 0, waiting: 0, moved: 0, deferred: 0, errors: [] };
  const wanted = ctx.config.minReady.get(label) ?? 0;
  const gens = await ctx.store.seatGenerations(label);
  const seats = new Set([...Array.from({ length: wanted }, (_, k) => k), ...gens.keys()]);
  for (const seat of seats) {
    // Each seat may launch a backing node: none starts once the invocation's time is up.
    if (timeLeft(ctx) <= 0) {
      report.deferred++;
      break;
    }
    try {
      await keepSeat(ctx, label, seat, gens, seat < wanted, options, report);
    } catch (err) {
      if (err instanceof DeadlineError) {
        report.deferred++; // cut short: the next upkeep picks the seat up where it is
        break;
      }
      report.errors.push(`min-ready ${label} seat ${seat}: ${(err as Error).message}`);
    }
  }
  return report;
}

async function keepSeat(
  ctx: Context,
  label: string,
  seat: number,
  gens: ReadonlyMap<number, number>,
  wanted: boolean,
  options: UpkeepOptions,
  report: UpkeepReport,
): Promise<void> {
  let gen = gens.get(seat) ?? 0;
  // Each round either settles the seat or advances it once; a seat advanced by another replenisher
  // meanwhile makes the advance fail, and the next upkeep picks it up.
  for (let round = 0; round < 3; round++) {
    const id = spareRequestId(label, seat, gen);
    const spare = await ctx.store.getRequest(id);
    const node = spare?.nodes[0];
    const takenBy = node?.takenBy;
    const takerId = takenBy ? parseNodeId(takenBy.node)?.requestId : undefined;
    const taker = takerId ? await ctx.store.getRequest(takerId) : undefined;
    const now = ctx.clock.now();
    const step = seatStep(spare, taker, (since) => deliveryDead(since, now, ctx.deliveriesDeadBefore));
    if (!wanted) {
      // Above min-ready now: a waiting spare fails, a free one ends, and so does one taken by a delivery
      // that died without recording it; one in use (or that may still be recorded) is its taker's.
      if (spare?.state === 'requested') {
        await failRequest(ctx, id, spare.bodyHash, 'min-ready was lowered');
      } else if (node && (isFreeSpare(node) || step === 'orphan')) {
        const by = takenBy?.by;
        const mayEnd = step === 'orphan' ? (s: NodeRecord) => s.takenBy?.by === by : isFreeSpare;
        if (await endSpare(ctx, node.id, mayEnd, 'min-ready was lowered')) report.ended++;
      }
      return;
    }
    if (step === 'make') {
      // A seat is recorded before its first spare, so that a lowered min-ready finds it (seatGenerations).
      if (!gens.has(seat)) await ctx.store.openSeat(label, seat);
      await makeSpare(ctx, label, seat, gen, report);
      return;
    }
    if (step === 'keep') {
      if (!options.hosts || !isFreeSpare(node) || !node.backingNodeId) return;
      // One the run did not read (launched since) is read now rather than taken for gone, and so is one
      // that looked unusable as the run read it: it may have become ready since (the reaper's own
      // reconciliation readies launching backing nodes whose `running` event was lost).
      const read = options.hosts.get(node.backingNodeId);
      if (read && usableSpareHost(read, now)) return;
      const host = await ctx.store.getBacking(node.backingNodeId);
      if (host && usableSpareHost(host, now)) return;
      // Its backing node takes no new nodes (max-age, drained, failed): replaced now, so it never
      // keeps that backing node alive, and no request gets a node there.
      if (
        !(await endSpare(ctx, node.id, isFreeSpare, `backing node ${node.backingNodeId} takes no new nodes`))
      ) {
        return;
      }
      report.ended++;
    } else if (step === 'orphan' && node) {
      const by = takenBy?.by;
      const ended = await endSpare(
        ctx,
        node.id,
        (s) => s.takenBy?.by === by,
        'taken by a delivery that died before recording it',
      );
      if (!ended) continue;
      report.ended++;
    }
    if (!(await ctx.store.advanceSeat(label, seat, gen))) return;
    gen++;
  }
}

/** Places a seat's spare (again, when it waits): an ordinary request, served after every other. */
async function makeSpare(
  ctx: Context,
  label: string,
  seat: number,
  gen: number,
  report: UpkeepReport,
): Promise<void> {
  try {
    const out = await requestNodes(ctx, spareMessage(label, seat, gen));
    if (out.kind === 'placed') report.made++;
  } catch (err) {
    if (err instanceof CapacityError || err instanceof BusyError) {
      report.waiting++;
      return;
    }
    if (err instanceof LaunchFailedError) return; // the request failed; the next upkeep advances the seat
    throw err;
  }
}

/** The labels of a placed request's nodes that took spares: the seats an upkeep refills. */
export function labelsTaken(r: RequestRecord): string[] {
  return [...new Set(r.nodes.filter((n) => n.spare !== undefined).map((n) => n.label))];
}
