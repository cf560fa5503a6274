import type { ReadyAuto } from '../../core/model.ts';
import { PoolEventType } from '../../core/observability.ts';
import type { MinReadyState, ReadinessPort } from '../../core/poolStore.ts';
import {
  freeSlotsRunningAnyway,
  holdChanged,
  launchToReadyOf,
  type ReadyHold,
  readyNeed,
  sparesWanted,
} from '../../core/readyRoom.ts';
import type { BackingRecord } from '../../core/records.ts';
import { type Context, emit } from '../context.ts';
import { foldForecast } from './forecasts.ts';

/**
 * min-ready auto, the reaper's decision for one label: how many ready, unassigned nodes
 * (spares) to hold now. The label's forecast is folded up to now (with the launch-to-ready time of its
 * backing nodes as this run read them), the ready room for one launch-to-ready time at its
 * ready-target is computed (core/forecast.ts readyNeed), free slots on backing nodes that run anyway
 * count first, and the rest, at most max-ready, are spares. The decision is recorded beside the seats
 * (a conditional write, only when it changed: a request reads it with the seats, to know how many
 * there are). Returns the hold (its seats are the ones to fill) and the seats as read; the seats above
 * are emptied by the upkeep (replenish.ts), so ready room goes when the forecast falls.
 */
export async function decideHold(
  ctx: Context<ReadinessPort>,
  label: string,
  auto: ReadyAuto,
  hosts: ReadonlyMap<string, BackingRecord>,
): Promise<Decided> {
  const model = await foldForecast(ctx, label, launchToReadyOf(hosts.values(), label));
  const now = ctx.clock.now();
  const need = readyNeed(model, now, auto.share, auto.maxReady);
  const freeSlots = freeSlotsRunningAnyway(hosts.values(), label, now);
  const decided = {
    seats: sparesWanted(need.target, freeSlots, auto.maxReady),
    target: need.target,
    perMinute: need.perMinute,
    freeSlots,
    at: now,
  };
  const state = await ctx.store.minReadyState(label);
  const prev = state.hold;
  if (!holdChanged(prev, decided)) return { hold: prev, state };
  const next: ReadyHold = { ...decided, version: (prev?.version ?? 0) + 1 };
  if (await ctx.store.putReadyHold(label, next)) {
    if ((prev?.seats ?? 0) !== next.seats) {
      const detail = {
        label,
        seats: next.seats,
        target: next.target,
        perMinute: Number(next.perMinute.toFixed(3)),
        freeSlots,
      };
      ctx.log.info('min-ready auto: ready room held', detail);
      // Only the run whose write won publishes it: one event per change.
      await emit(ctx, PoolEventType.readyRoomChanged, { ...detail, previousSeats: prev?.seats ?? 0 });
    }
    return { hold: next, state: { ...state, hold: next } };
  }
  // Another reaper decided meanwhile, from the same reads: its word stands.
  const current = await ctx.store.minReadyState(label);
  return { hold: current.hold, state: current };
}

/**
 * The hold decided, and the label's seats as the decision read them (with the hold as it stands): the
 * upkeep that follows starts from them (replenish.ts UpkeepOptions.state) instead of reading them again.
 */
export interface Decided {
  readonly hold: ReadyHold | undefined;
  readonly state: MinReadyState;
}
