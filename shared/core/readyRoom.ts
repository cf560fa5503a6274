import { z } from 'zod';
import { type ArrivalModel, DEFAULT_LAUNCH_TO_READY_S, forecastRate, minuteOf } from './forecast.ts';
import { SPARE_ID_PREFIX } from './ids.ts';
import type { BackingRecord } from './records.ts';

/**
 * Ready room (`min-ready: auto`): from a label's arrival forecast (forecast.ts), how many ready slots it
 * needs for a share of its arrivals to find one, how many of those are spares once the free slots of
 * backing nodes that run anyway count, and what the reaper decided (the hold kept beside the seats).
 */

/**
 * What the reaper's min-ready step decided for a label with `min-ready: auto` (kept beside its seats, so
 * the one Query a request makes to find a spare also says how many seats are in use): how many spares
 * it holds, from which target and forecast. Written conditionally on its version when it changes.
 */
export const ReadyHold = z.object({
  /** Spares held now: seats 0 .. seats - 1 are filled, the ones above emptied. */
  seats: z.number().int().nonnegative(),
  /** Ready slots wanted (readyNeed), free slots on backing nodes that run anyway counted first. */
  target: z.number().int().nonnegative(),
  /** The forecast it was decided from, arrivals per minute. */
  perMinute: z.number().nonnegative(),
  /** Free slots on backing nodes that run anyway, as the reaper read them. */
  freeSlots: z.number().int().nonnegative(),
  /** When it was decided (epoch ms). */
  at: z.number(),
  version: z.number().int().positive(),
});
export type ReadyHold = z.infer<typeof ReadyHold>;

/** Below this forecast (one arrival an hour) a label holds no ready room. */
export const MIN_FORECAST_PER_MINUTE = 1 / 60;

/** What the forecast says a label needs now: for `metastatic status` and the min-ready step. */
export interface ReadyNeed {
  /** Forecast arrivals per minute at the busiest point of the horizon (forecastRate). */
  readonly perMinute: number;
  /** The horizon: one launch-to-ready time, in minutes. */
  readonly horizonMinutes: number;
  /** Ready slots wanted (readyTarget), capped by max-ready. */
  readonly target: number;
}

/**
 * The ready room a label needs at `now` (epoch ms) to let `share` of its arrivals within one
 * launch-to-ready time find a ready slot, at most `maxReady`. No model yet: none.
 */
export function readyNeed(
  model: ArrivalModel | undefined,
  now: number,
  share: number,
  maxReady: number,
): ReadyNeed {
  const horizonMinutes = (model?.launchToReadyS ?? DEFAULT_LAUNCH_TO_READY_S) / 60;
  if (!model) return { perMinute: 0, horizonMinutes, target: 0 };
  const perMinute = forecastRate(model, minuteOf(now), horizonMinutes);
  // Any rate above 0 wants a slot (one serves nearly every arrival of a tiny rate): below the floor a
  // label holds nothing, or one that saw a request long ago would pin an instance for ever.
  if (perMinute < MIN_FORECAST_PER_MINUTE) return { perMinute, horizonMinutes, target: 0 };
  return { perMinute, horizonMinutes, target: readyTarget(perMinute * horizonMinutes, share, maxReady) };
}

/**
 * How many ready, unassigned nodes (spares) the pool holds for a label to reach `target` ready slots:
 * free slots on backing nodes that run anyway count first (they cost nothing extra), the rest are
 * spares, at most `maxReady`. "Run anyway": the backing node holds some node that is not a spare
 * (a free slot beside only spares would go with them, so counting it would let the spares go, then the
 * backing node, then want them back).
 */
export function sparesWanted(target: number, freeSlotsRunningAnyway: number, maxReady: number): number {
  return Math.max(0, Math.min(maxReady, target - Math.max(0, freeSlotsRunningAnyway)));
}

/**
 * The least number of ready slots `k` that lets `share` of the arrivals in one launch-to-ready time find
 * one, arrivals being Poisson with mean `expected` (forecast rate x launch-to-ready minutes): the
 * smallest k with E[min(N, k)] >= share x E[N], where E[min(N, k)] = sum over j < k of P(N > j). At most
 * `max`. A share of 0, or no arrivals expected, needs none.
 */
export function readyTarget(expected: number, share: number, max: number): number {
  if (!(expected > 0) || !(share > 0) || max <= 0) return 0;
  const wanted = Math.min(1, share) * expected;
  const limit = Number.isFinite(max) ? Math.floor(max) : Math.ceil(expected + 10 * Math.sqrt(expected) + 10);
  if (expected > POISSON_EXACT_UP_TO) {
    // e^-mean underflows: the normal approximation, E[min(N, k)] = mean - sd x L((k - mean) / sd), with L
    // the standard normal loss function; the least such k by bisection.
    const sd = Math.sqrt(expected);
    const served = (k: number) => expected - sd * normalLoss((k - expected) / sd);
    let [lo, hi] = [0, limit];
    if (served(hi) < wanted) return limit;
    while (lo < hi) {
      const mid = Math.floor((lo + hi) / 2);
      if (served(mid) >= wanted) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
  let pmf = Math.exp(-expected); // P(N = 0)
  let cdf = pmf; // P(N <= 0)
  let served = 0; // E[min(N, k)] for k = 0
  for (let k = 1; k <= limit; k++) {
    served += 1 - cdf; // + P(N > k - 1) = P(N >= k)
    if (served >= wanted - 1e-9) return k;
    pmf *= expected / k;
    cdf += pmf;
  }
  return limit;
}

/** Above this mean the Poisson terms are computed with the normal approximation (e^-745 underflows). */
const POISSON_EXACT_UP_TO = 500;

/** The standard normal loss function L(z) = E[(Z - z)+] = phi(z) - z (1 - Phi(z)). */
function normalLoss(z: number): number {
  const phi = Math.exp((-z * z) / 2) / Math.sqrt(2 * Math.PI);
  return phi - z * (1 - normalCdf(z));
}

/** Phi(z), from erf (Abramowitz and Stegun 7.1.26: absolute error below 1.5e-7). */
function normalCdf(z: number): number {
  const x = Math.abs(z) / Math.SQRT2;
  const t = 1 / (1 + 0.3275911 * x);
  const poly =
    t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  const erf = 1 - poly * Math.exp(-x * x);
  return z >= 0 ? (1 + erf) / 2 : (1 - erf) / 2;
}

/** A backing node as the ready-room count needs it. */
type Host = Pick<
  BackingRecord,
  | 'label'
  | 'poolKey'
  | 'state'
  | 'slots'
  | 'used'
  | 'slotMap'
  | 'drained'
  | 'noNewNodesAfter'
  | 'launchedAt'
  | 'readyAt'
>;

/** Whether a backing node takes new nodes now: ready, not drained, within max-age. */
const takesNodes = (b: Host, now: number) =>
  b.state === 'ready' && !b.drained && (b.noNewNodesAfter === undefined || now < b.noNewNodesAfter);

/**
 * Free slots of `label` on backing nodes that run anyway (ready, taking nodes, and holding some node
 * that is not the pool's own ready node): ready room that costs nothing extra. A node on a taken ready
 * node keeps the ready node's id in the slot map, so a backing node held only by such nodes is not
 * counted (it runs anyway, but the count errs towards holding more, never fewer).
 */
export function freeSlotsRunningAnyway(hosts: Iterable<Host>, label: string, now: number): number {
  let free = 0;
  for (const b of hosts) {
    if (b.label !== label || !takesNodes(b, now)) continue;
    if (!Object.values(b.slotMap).some((id) => !id.startsWith(SPARE_ID_PREFIX))) continue;
    free += Math.max(0, b.slots - b.used);
  }
  return free;
}

/** The mean seconds from launch to ready of the label's backing nodes read (undefined: none seen). */
export function launchToReadyOf(hosts: Iterable<Host>, label: string): number | undefined {
  let sum = 0;
  let n = 0;
  for (const b of hosts) {
    if (b.label !== label || b.readyAt === undefined || b.readyAt <= b.launchedAt) continue;
    sum += (b.readyAt - b.launchedAt) / 1000;
    n++;
  }
  return n > 0 ? Math.round(sum / n) || undefined : undefined;
}

/**
 * Whether a new hold is worth writing over the stored one: what it holds or why changed, or the stored
 * one is older than HOLD_REFRESH_MS (`metastatic status` shows when it was decided).
 */
export function holdChanged(prev: ReadyHold | undefined, next: Omit<ReadyHold, 'version'>): boolean {
  if (!prev) return true;
  return (
    prev.seats !== next.seats ||
    prev.target !== next.target ||
    prev.freeSlots !== next.freeSlots ||
    Math.abs(prev.perMinute - next.perMinute) > 0.05 * Math.max(prev.perMinute, next.perMinute, 0.1) ||
    next.at - prev.at >= HOLD_REFRESH_MS
  );
}

export const HOLD_REFRESH_MS = 10 * 60_000;
