import { BusyError, CapacityError, DeadlineError, LaunchFailedError } from '../../core/errors.ts';
import { parseNodeId } from '../../core/ids.ts';
import {
  backingOff,
  backoffAfterFailure,
  backoffCleared,
  endsBackoff,
  isFreeSpare,
  type LabelBackoff,
  seatStep,
  spareMessage,
  spareRequestId,
} from '../../core/minReady.ts';
import type { MinReadyState } from '../../core/poolStore.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../../core/records.ts';
import { deliveryDead, type ServeContext, timeLeft } from '../context.ts';
import { requestNodes } from '../place/requestNodes.ts';
import { failRequest } from '../place/requests.ts';
import { consolidateSpares, type FreeSpare } from './consolidateSpares.ts';
import { endSpare, finishMove, type SparesSeen, seatsOf, usableSpareHost } from './minReady.ts';

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
  /** Seats not refilled because the label backs off (its spares keep failing to launch). */
  backedOff: number;
  errors: string[];
}

export interface UpkeepOptions {
  /**
   * The live backing nodes (launching or ready, as the reaper read them this run): spares on one that
   * takes no new nodes (past max-age, drained, failed, retiring) are replaced.
   */
  readonly hosts?: ReadonlyMap<string, BackingRecord>;
  /**
   * The refill right after a delivery took spares (the request function): what the take read of the
   * seats and wrote of the spares, and the taker's request as placed. The upkeep starts from them instead
   * of reading the seats, the taken spares and their taker again: fewer DynamoDB calls per take.
   */
  readonly taken?: { readonly seen: SparesSeen; readonly taker: RequestRecord };
  /**
   * Seats to fill (min-ready auto: the reaper's decision, readyAuto.ts). Unset: the label's min-ready,
   * or for an auto label the seats its last decision holds.
   */
  readonly wanted?: number;
  /**
   * The label's seats as the caller read them a moment ago (the reaper's decision, readyAuto.ts, reads
   * them to write the hold): the upkeep starts from them instead of reading them again. As with `taken`,
   * a seat that moved on since makes its advance fail (conditional on the generation): the next upkeep
   * picks it up.
   */
  readonly state?: MinReadyState;
}

/**
 * Keeps a label's min-ready seats filled: each seat's spare is made (placed like any request, after
 * every waiting one), and a seat whose spare was taken and recorded, or ended, moves on to a new spare
 * (a conditional advance of its generation: two replenishers never make two). Seats above min-ready
 * (it was lowered) lose their free spares. A label whose spares keep failing to launch backs off
 * (core/minReady.ts MIN_READY_BACKOFF): no new spare until its wait is over, then one at a time until
 * one works. Idempotent and safe to run anywhere, any number at once; it stops when the invocation's
 * time is up (the rest `deferred`).
 */
export async function keepMinReady(
  ctx: ServeContext,
  label: string,
  options: UpkeepOptions = {},
): Promise<UpkeepReport> {
  const report: UpkeepReport = {
    made: 0,
    ended: 0,
    waiting: 0,
    moved: 0,
    deferred: 0,
    backedOff: 0,
    errors: [],
  };
  const taken = options.taken;
  const state = taken?.seen.seats.get(label) ?? options.state ?? (await ctx.store.minReadyState(label));
  const wanted = options.wanted ?? seatsOf(ctx, label, state.hold);
  // Requests known as they are (undefined: known absent), instead of read.
  const known = new Map<string, RequestRecord | undefined>(taken?.seen.spares);
  if (taken) known.set(taken.taker.id, taken.taker);
  const upkeep: Upkeep = {
    ctx,
    label,
    gens: state.gens,
    options,
    report,
    backoff: state.backoff,
    free: [],
    known,
    read: new Map(),
  };
  // The seats to fill, and the ones above them that may still hold a node to end. A seat marked vacant
  // (its node ended: markSeatVacant) has nothing left to end, so an upkeep reads nodes in proportion to
  // the seats in use, not to every seat ever opened (a forecast that once rose to max-ready).
  const vacant = state.vacant ?? new Set<number>();
  const seats = new Set([
    ...Array.from({ length: wanted }, (_, k) => k),
    ...[...state.gens.keys()].filter((k) => k < wanted || !vacant.has(k)),
  ]);
  if (!taken) await readSeats(upkeep, seats);
  for (const seat of seats) {
    // Each seat may launch a backing node: none starts once the invocation's time is up.
    if (timeLeft(ctx) <= 0) {
      report.deferred++;
      break;
    }
    try {
      await keepSeat(upkeep, seat, seat < wanted);
    } catch (err) {
      if (err instanceof DeadlineError) {
        report.deferred++; // cut short: the next upkeep picks the seat up where it is
        break;
      }
      report.errors.push(`min-ready ${label} seat ${seat}: ${(err as Error).message}`);
    }
  }
  // The reaper's upkeep (it read the backing nodes): free spares onto the fullest backing nodes.
  if (options.hosts && upkeep.free.length > 0 && timeLeft(ctx) > 0) {
    try {
      await consolidateSpares(ctx, label, upkeep.free, upkeep.report);
    } catch (err) {
      if (err instanceof DeadlineError) report.deferred++;
      else report.errors.push(`min-ready ${label} moves: ${(err as Error).message}`);
    }
  }
  return report;
}

/** One upkeep of a label's seats: what every seat's step shares. */
interface Upkeep {
  readonly ctx: ServeContext;
  readonly label: string;
  readonly gens: ReadonlyMap<number, number>;
  readonly options: UpkeepOptions;
  readonly report: UpkeepReport;
  /** The label's backoff as last read or written by this upkeep. */
  backoff: LabelBackoff | undefined;
  /** Free spares on usable backing nodes, as read (reaper only): what consolidate may move. */
  readonly free: FreeSpare[];
  /** Requests this upkeep knows without a read (UpkeepOptions.taken; undefined: known absent). */
  readonly known: Map<string, RequestRecord | undefined>;
  /** Requests read together at the start (readSeats; undefined: absent), each used once. */
  readonly read: Map<string, RequestRecord | undefined>;
}

/** A request as the upkeep knows it, else as read at its start (once), else as read now. */
function requestOf(upkeep: Upkeep, id: string): Promise<RequestRecord | undefined> {
  if (upkeep.known.has(id)) return Promise.resolve(upkeep.known.get(id));
  if (upkeep.read.has(id)) {
    const r = upkeep.read.get(id);
    upkeep.read.delete(id); // a later round (after a write) reads it as it is then
    return Promise.resolve(r);
  }
  return upkeep.ctx.store.getRequest(id);
}

/**
 * Every seat's spare in one read, then the requests that took them in another: what each seat's step
 * reads first, which it read one seat at a time (a round trip a seat; with hundreds of seats in a
 * fleet, hundreds a reaper run). Each is used once, by the seat's first round, as a read of its own
 * would be: what changes meanwhile makes that round's conditional write fail, as it would then.
 */
async function readSeats(upkeep: Upkeep, seats: ReadonlySet<number>): Promise<void> {
  const { ctx, label, gens } = upkeep;
  const spares = [...seats].map((seat) => spareRequestId(label, seat, gens.get(seat) ?? 0));
  if (spares.length < 2) return; // one read either way
  const found = await ctx.store.getRequests(spares);
  for (const id of spares) upkeep.read.set(id, found.get(id));
  const takers = [...found.values()].flatMap((spare) => {
    const takenBy = spare.nodes[0]?.takenBy;
    const taker = takenBy ? parseNodeId(takenBy.node)?.requestId : undefined;
    return taker !== undefined && !upkeep.read.has(taker) && !upkeep.known.has(taker) ? [taker] : [];
  });
  if (takers.length === 0) return;
  const takersFound = await ctx.store.getRequests(takers);
  for (const id of takers) upkeep.read.set(id, takersFound.get(id));
}

async function keepSeat(upkeep: Upkeep, seat: number, wanted: boolean): Promise<void> {
  const { ctx, label, gens, options, report } = upkeep;
  let gen = gens.get(seat) ?? 0;
  let opened = gens.has(seat);
  // Each round either settles the seat or advances it once; a seat advanced by another replenisher
  // meanwhile makes the advance fail, and the next upkeep picks it up.
  for (let round = 0; round < 3; round++) {
    const id = spareRequestId(label, seat, gen);
    const spare = await requestOf(upkeep, id);
    const node = spare?.nodes[0];
    const takenBy = node?.takenBy;
    const takerId = takenBy ? parseNodeId(takenBy.node)?.requestId : undefined;
    const taker = takerId ? await requestOf(upkeep, takerId) : undefined;
    const now = ctx.clock.now();
    const step = seatStep(spare, taker, (since) => deliveryDead(since, now, ctx.deliveriesDeadBefore));
    // A spare that became ready since the label's last failure: it launches again.
    if (endsBackoff(upkeep.backoff, node)) await clearBackoff(upkeep);
    // A move cut short before it gave back the slot the spare left (moveSpare): finished first.
    if (spare && node?.movedFrom) {
      await finishMove(ctx, spare);
      upkeep.known.delete(id); // read as it is now in the next round
      continue;
    }
    if (!wanted) {
      // Above min-ready now: a waiting spare fails, a free one ends, and so does one taken by a delivery
      // that died without recording it; one in use (or that may still be recorded) is its taker's.
      if (spare?.state === 'requested') {
        await failRequest(ctx, id, spare.bodyHash, lowered(ctx, label));
      } else if (node && (isFreeSpare(node) || step === 'orphan')) {
        const by = takenBy?.by;
        const mayEnd = step === 'orphan' ? (s: NodeRecord) => s.takenBy?.by === by : isFreeSpare;
        if (await endSpare(ctx, node.id, mayEnd, lowered(ctx, label))) {
          report.ended++;
          await ctx.store.markSeatVacant(label, seat, gen);
        }
      } else if (opened && ended(node)) {
        // Ended already (by its taker's release, or an earlier upkeep): nothing to do until the seat is
        // wanted again, so later upkeeps need not read it (released and failed are final).
        await ctx.store.markSeatVacant(label, seat, gen);
      }
      return;
    }
    if (step === 'make') {
      // Launches of the label keep failing: no new spare before its wait is over (one already waiting
      // for capacity is not a new one: it is placed again, as any waiting request).
      if (spare === undefined && backingOff(upkeep.backoff, now)) {
        report.backedOff++;
        return;
      }
      // A seat is recorded before its first spare, so that a lowered min-ready finds it (seatGenerations).
      if (!opened) await ctx.store.openSeat(label, seat);
      if ((await makeSpare(ctx, label, seat, gen, report)) !== 'failed') return;
      continue; // every launch attempt failed: the seat moves on now, and the label backs off
    }
    if (step === 'keep') {
      if (!options.hosts || !isFreeSpare(node) || !node.backingNodeId) return;
      // One the run did not read (launched since) is read now rather than taken for gone, and so is one
      // that looked unusable as the run read it: it may have become ready since (the reaper's own
      // reconciliation readies launching backing nodes whose `running` event was lost).
      const read = options.hosts.get(node.backingNodeId);
      if (read && usableSpareHost(read, now)) {
        if (spare) upkeep.free.push({ spare, host: read });
        return;
      }
      const host = await ctx.store.getBacking(node.backingNodeId);
      if (host && usableSpareHost(host, now)) {
        if (spare) upkeep.free.push({ spare, host });
        return;
      }
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
    opened = true;
    // The new generation's spare: when the advance followed a take, it is not made yet (another
    // replenisher that made it meanwhile is met by the spare's own request, which is idempotent).
    if (upkeep.options.taken) upkeep.known.set(spareRequestId(label, seat, gen), undefined);
    // The advance is won once per spare: a spare that failed without ever being ready counts once
    // against its label (failed waiting for capacity or a launch, or its backing node failed under it).
    if (spare?.state === 'failed' && node?.readyAt === undefined) {
      await recordFailure(upkeep, spare.reason ?? `min-ready node ${id} failed`);
    }
  }
}

/** A spare's node that has ended (both states are final: nodeTransitions). */
const ended = (n: NodeRecord | undefined): boolean => n?.state === 'released' || n?.state === 'failed';

/** Why a spare above the seats ends: min-ready lowered, or the forecast fell (auto). */
const lowered = (ctx: ServeContext, label: string) =>
  ctx.config.readyAuto?.has(label) ? 'min-ready auto: the forecast fell' : 'min-ready was lowered';

/** One more failed spare of the label: its backoff grows (a conditional write; re-read on a conflict). */
async function recordFailure(upkeep: Upkeep, reason: string): Promise<void> {
  const { ctx, label } = upkeep;
  for (let round = 0; round < 3; round++) {
    const next = backoffAfterFailure(upkeep.backoff, ctx.clock.now(), reason);
    if (await ctx.store.putLabelBackoff(label, next)) {
      upkeep.backoff = next;
      ctx.log.warn('min-ready launches of a label back off', {
        label,
        failures: next.failures,
        retryAt: new Date(next.retryAt).toISOString(),
        reason: next.reason,
      });
      return;
    }
    upkeep.backoff = (await ctx.store.minReadyState(label)).backoff; // another replenisher wrote first
  }
}

/** A spare of the label became ready since its last failure: the backoff is over. */
async function clearBackoff(upkeep: Upkeep): Promise<void> {
  const { ctx, label } = upkeep;
  const current = upkeep.backoff;
  if (!current) return;
  const next = backoffCleared(current);
  if (await ctx.store.putLabelBackoff(label, next)) {
    upkeep.backoff = next;
    ctx.log.info('min-ready launches of a label work again', { label, after: current.failures });
  } else {
    upkeep.backoff = (await ctx.store.minReadyState(label)).backoff; // written meanwhile: as it is now
  }
}

/**
 * Places a seat's spare (again, when it waits): an ordinary request, served after every other.
 * `failed`: every launch attempt failed (the request ended failed).
 */
async function makeSpare(
  ctx: ServeContext,
  label: string,
  seat: number,
  gen: number,
  report: UpkeepReport,
): Promise<'placed' | 'waiting' | 'failed' | 'other'> {
  try {
    const out = await requestNodes(ctx, spareMessage(label, seat, gen));
    if (out.kind === 'placed') report.made++;
    return out.kind === 'placed' ? 'placed' : out.request.state === 'failed' ? 'failed' : 'other';
  } catch (err) {
    if (err instanceof CapacityError || err instanceof BusyError) {
      report.waiting++;
      return 'waiting';
    }
    if (err instanceof LaunchFailedError) return 'failed'; // the request failed
    throw err;
  }
}

/** The labels of a placed request's nodes that took spares: the seats an upkeep refills. */
export function labelsTaken(r: RequestRecord): string[] {
  return [...new Set(r.nodes.filter((n) => n.spare !== undefined).map((n) => n.label))];
}
