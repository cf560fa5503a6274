import { z } from 'zod';
import { SPARE_ID_PREFIX } from './ids.ts';
import type { BackingRecord } from './records.ts';

/**
 * Arrival forecasts per label (predictive readiness, issue 27): how many requests a label will get in
 * the next minutes, learned from the requests themselves, so that the pool can hold as much ready room
 * as arrivals within one launch-to-ready time need — and no more.
 *
 * The model is two parts, both exponentially weighted, both bounded in size whatever the request rate:
 *
 * - a **weekly profile**: the arrival rate in each of the week's 168 hours (hour of day x day of week),
 *   each hour moved towards what that hour saw, a week's weight at a time (PROFILE_WEIGHT). It knows that
 *   Monday 08:00 is busy before Monday 08:00 comes, so ready room rises *ahead* of a daily pattern;
 * - a **short-horizon rate**: arrivals per minute over the last minutes (SHORT_HALF_LIFE_MIN), which reacts
 *   to a burst the profile has never seen within a minute or two, and lets go within minutes.
 *
 * The forecast for a horizon is the larger of the two at the horizon's busiest point (a burst is not
 * averaged away by a quiet profile, a known busy hour is not forgotten in a quiet minute before it), and the ready target is the least
 * number of ready slots that lets the wanted share of the arrivals within one launch-to-ready time find
 * one, arrivals being Poisson at the forecast rate (`readyTarget`). Pure functions: the store keeps one
 * item per label, folded by the reaper once a minute from counts the request function adds up.
 */

/** Hours in the weekly profile (a week). */
export const PROFILE_HOURS = 168;
/**
 * The share of a new observation of one hour of the week in its profile bucket: about the last four
 * weeks weigh most (a team that changes its schedule is followed within a month).
 */
export const PROFILE_WEIGHT = 0.25;
/**
 * Half-life of the short-horizon rate, in minutes: the rate is about the last 7 minutes' (a 2-minute
 * half-life, ~3 minutes, chased Poisson noise: at 2 arrivals a minute its estimate varied by +-40%, the
 * forecast being the larger of it and the profile, so ready room was made on an upward swing and emptied
 * on the next, each time a launch). Measured with `npm run cost` on the four traces, predictive 0.9,
 * half-lives 2 / 5 / 8: instance-hours 63.2 / 63.0 / 62.9 (steady), 47.2 / 46.5 / 45.5 (bursty),
 * 96.8 / 96.4 / 96.2 (diurnal), backing nodes launched on diurnal 105 / 96 / 82, the share served without
 * a wait within 0.7 points on every trace. 5 keeps a burst's second and third minutes covered (a push of
 * 20 jobs in a minute asks for 4 ready slots at 0.9, not 3 as with 8).
 */
export const SHORT_HALF_LIFE_MIN = 5;
/** Minutes folded one by one when the model catches up on a gap; a longer gap is folded as one span. */
const MAX_CATCH_UP_MIN = 24 * 60;

export const ArrivalModel = z.object({
  label: z.string(),
  /** Arrivals per minute in each hour of the week (index: `hourOfWeek`), as learned so far. */
  profile: z.array(z.number().nonnegative()).length(PROFILE_HOURS),
  /** How many times each hour of the week has been observed (it stops counting at 1,000). */
  seen: z.array(z.number().int().nonnegative()).length(PROFILE_HOURS),
  /** Arrivals per minute, exponentially weighted over the last minutes. */
  shortRate: z.number().nonnegative(),
  /** The first minute (epoch minutes) not folded in yet: everything before it is in the model. */
  nextMinute: z.number().int().nonnegative(),
  /** Arrivals counted in the hour being observed (folded into its bucket when the hour ends). */
  hourCount: z.number().nonnegative(),
  /** Arrivals recorded within the minute `nextMinute` (not folded yet: that minute has not ended). */
  pending: z.number().nonnegative().default(0),
  /**
   * Seconds from launch to ready of the label's backing nodes, as the reaper last saw them (mean of those
   * it read): the horizon of the ready target. Absent until one was seen (DEFAULT_LAUNCH_TO_READY_S).
   */
  launchToReadyS: z.number().positive().optional(),
  /** When it was last written (epoch ms). */
  updatedAt: z.number().default(0),
  version: z.number().int().positive(),
});
export type ArrivalModel = z.infer<typeof ArrivalModel>;

/** The hour of the week (0 = Monday 00:00-01:00 UTC) of an epoch minute. */
export function hourOfWeek(epochMinute: number): number {
  // 1970-01-01 was a Thursday: day 3 of a week that starts on Monday.
  const hours = Math.floor(epochMinute / 60);
  return (((hours + 3 * 24) % PROFILE_HOURS) + PROFILE_HOURS) % PROFILE_HOURS;
}

/** An empty model, observing from `epochMinute`. */
export function emptyModel(label: string, epochMinute: number): ArrivalModel {
  return {
    label,
    profile: Array(PROFILE_HOURS).fill(0),
    seen: Array(PROFILE_HOURS).fill(0),
    shortRate: 0,
    nextMinute: epochMinute,
    hourCount: 0,
    pending: 0,
    updatedAt: 0,
    version: 1,
  };
}

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

/** The horizon of the ready target while no backing node of the label has been seen booting. */
export const DEFAULT_LAUNCH_TO_READY_S = 120;

/** The epoch minute of an instant (epoch ms). */
export const minuteOf = (ms: number): number => Math.floor(ms / 60_000);

/**
 * The model (undefined: none stored yet) after `arrivals` more requests recorded at `now` (epoch ms),
 * as one conditional write makes it: its version one more than prev's. The minutes that ended since the
 * last write are folded (`observe`) with the arrivals of the minute it left pending and these ones
 * (recorded together: spread over them); within the same minute they are only added to `pending`. With
 * no arrivals it only folds (the reaper's call: a quiet label's rate decays without any request).
 * Undefined when there is nothing to write (no arrivals, and no minute ended).
 */
export function withArrivals(
  prev: ArrivalModel | undefined,
  label: string,
  arrivals: number,
  now: number,
): ArrivalModel | undefined {
  const minute = minuteOf(now);
  const base = prev ?? emptyModel(label, minute);
  const pending = base.pending + Math.max(0, arrivals);
  if (minute > base.nextMinute) {
    const folded = observe(base, minute, pending);
    return { ...folded, pending: 0, updatedAt: now, version: prev ? prev.version + 1 : 1 };
  }
  if (arrivals <= 0 && prev) return undefined;
  return { ...base, pending, updatedAt: now, version: prev ? base.version + 1 : 1 };
}

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

const SHORT_DECAY = 2 ** (-1 / SHORT_HALF_LIFE_MIN);

/**
 * A rate below this (arrivals per minute: one in 2,000 years) is 0. A decaying rate never reaches 0 by
 * itself, and DynamoDB refuses a number below 1e-130: the short rate gets there after about 36 hours
 * without an arrival (a quiet weekend), and every fold of the label would then fail.
 */
export const NEGLIGIBLE_RATE = 1e-9;
const settled = (rate: number): number => (rate < NEGLIGIBLE_RATE ? 0 : rate);

/** One hour's count folded into its bucket: the first observation of an hour is taken whole. */
function foldHour(profile: number[], seen: number[], hour: number, perMinute: number): void {
  const weight = (seen[hour] ?? 0) === 0 ? 1 : PROFILE_WEIGHT;
  profile[hour] = settled((profile[hour] ?? 0) * (1 - weight) + perMinute * weight);
  seen[hour] = Math.min(1_000, (seen[hour] ?? 0) + 1);
}

/**
 * The model after the minutes from its `nextMinute` up to (not including) `untilMinute`, in which
 * `arrivals` requests came (counted together: the caller does not know in which minute each came, only
 * that they came since the last fold, so they are spread evenly). Minutes already folded are ignored
 * (folding is idempotent per minute: a second reaper folding the same span adds nothing).
 */
export function observe(model: ArrivalModel, untilMinute: number, arrivals: number): ArrivalModel {
  const minutes = untilMinute - model.nextMinute;
  if (minutes <= 0) return model;
  const profile = [...model.profile];
  const seen = [...model.seen];
  let { shortRate, hourCount } = model;
  const perMinute = Math.max(0, arrivals) / minutes;
  let minute = model.nextMinute;
  // A gap longer than a day: the hours it spans all get the same rate, folded hour by hour (bounded by
  // the profile's size: a gap of weeks is one week of buckets), and the short rate decays over it at once.
  if (minutes > MAX_CATCH_UP_MIN) {
    const hours = Math.min(PROFILE_HOURS, Math.floor(minutes / 60));
    for (let h = 0; h < hours; h++)
      foldHour(profile, seen, hourOfWeek(untilMinute - 60 * (hours - h)), perMinute);
    shortRate = settled(perMinute + (shortRate - perMinute) * SHORT_DECAY ** minutes);
    return {
      ...model,
      profile,
      seen,
      shortRate,
      hourCount: 0,
      nextMinute: untilMinute,
      version: model.version + 1,
    };
  }
  for (; minute < untilMinute; minute++) {
    shortRate = settled(shortRate * SHORT_DECAY + perMinute * (1 - SHORT_DECAY));
    hourCount += perMinute;
    if ((minute + 1) % 60 === 0) {
      // The hour ends with this minute: its count (arrivals per minute over the hour) goes into its bucket.
      foldHour(profile, seen, hourOfWeek(minute), hourCount / 60);
      hourCount = 0;
    }
  }
  return {
    ...model,
    profile,
    seen,
    shortRate,
    hourCount,
    nextMinute: untilMinute,
    version: model.version + 1,
  };
}

/**
 * Expected arrivals per minute at the busiest point of the `horizonMinutes` after `atMinute`: the larger
 * of the short-horizon rate and the profile's rate in the busiest hour the horizon touches (an hour never
 * observed is unknown, not quiet: it says nothing). The busiest point, not the mean: room launched now is
 * ready one launch-to-ready time later, and must be there when the busy hour starts, not on average.
 */
export function forecastRate(model: ArrivalModel, atMinute: number, horizonMinutes: number): number {
  const last = atMinute + Math.max(1, Math.ceil(horizonMinutes)) - 1;
  let peak = 0;
  for (let hour = Math.floor(atMinute / 60); hour <= Math.floor(last / 60); hour++) {
    const bucket = hourOfWeek(hour * 60);
    if ((model.seen[bucket] ?? 0) > 0) peak = Math.max(peak, model.profile[bucket] ?? 0);
  }
  return Math.max(model.shortRate, peak);
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
