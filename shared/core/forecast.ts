import { z } from 'zod';

/**
 * Arrival forecasts per label (predictive readiness): how many requests a label will get in the next
 * minutes, learned from the requests themselves, so that the pool can hold as much ready room as arrivals
 * within one launch-to-ready time need — and no more.
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
 * averaged away by a quiet profile, a known busy hour is not forgotten in a quiet minute before it), and the ready room is the least
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

/**
 * The most arrivals of a label one requestor counts in a minute: a push fanning out up to 30 jobs at once
 * counts whole (the synthetic `bursty` trace's busiest minute has 32), a sender pouring in more counts as
 * 30. Requests naming no requestor count as one requestor, as in the learned durations
 * (core/estimates.ts): a sender cannot escape the bound by naming none.
 */
export const REQUESTOR_ARRIVALS_PER_MINUTE = 30;
/**
 * Requestors the label's item keeps counts of (those that counted most in the minute, then in the hour):
 * a bounded item whatever the number of requestors (with 32 requestors of 256 characters, about 10 KB
 * more). A requestor it forgot starts again at 0 (a sender naming many requestors is one more voice each,
 * as in the learned durations: docs/threat-model.md).
 */
export const MAX_COUNTED_REQUESTORS = 32;

/** What one requestor's arrivals of a label counted lately (ArrivalModel.byRequestor). */
export const RequestorArrivals = z.object({
  /** Absent: the requests that name none. */
  requestor: z.string().optional(),
  /** The epoch minute `inMinute` is of. */
  minute: z.number().int().nonnegative(),
  /** Arrivals counted in that minute, at most REQUESTOR_ARRIVALS_PER_MINUTE. */
  inMinute: z.number().nonnegative(),
  /** The epoch hour (minute / 60) `inHour` is of. */
  hour: z.number().int().nonnegative(),
  /** Arrivals counted in that hour and not taken back: the most its quick releases take back. */
  inHour: z.number().nonnegative(),
});
export type RequestorArrivals = z.infer<typeof RequestorArrivals>;

/**
 * Arrivals of one requestor (`requestor` absent: the requests that name none) to record in one write:
 * `count` > 0 requests placed, < 0 requests released within QUICK_RELEASE_MS of their placement, taken
 * back (withArrivals).
 */
export interface ArrivalCount {
  readonly requestor?: string | undefined;
  readonly count: number;
}

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
   * Each requestor's arrivals counted in the minute and hour being observed (at most
   * MAX_COUNTED_REQUESTORS): what bounds a requestor's count per minute and what its quick releases may
   * take back (withArrivals). Absent from items an older version wrote: none.
   */
  byRequestor: z.array(RequestorArrivals).max(MAX_COUNTED_REQUESTORS).default([]),
  /**
   * Seconds from launch to ready of the label's backing nodes, as the reaper last saw them (mean of those
   * it read): the horizon of the ready room. Absent until one was seen (DEFAULT_LAUNCH_TO_READY_S).
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
    byRequestor: [],
    updatedAt: 0,
    version: 1,
  };
}

/** The horizon of the ready room while no backing node of the label has been seen booting. */
export const DEFAULT_LAUNCH_TO_READY_S = 120;

/** The epoch minute of an instant (epoch ms). */
export const minuteOf = (ms: number): number => Math.floor(ms / 60_000);

/**
 * The model (undefined: none stored yet) after the arrivals a writer counted since its last write,
 * recorded at `now` (epoch ms), as one conditional write makes it: its version one more than prev's.
 *
 * First the minutes that ended since the last write are folded (`observe`): the arrivals pending were
 * recorded within the minute `nextMinute`, so they are that minute's, and the minutes after it saw none
 * (a writer writes at the end of the invocation that counted them, so what it writes is the current
 * minute's: they go to `pending`). With no arrivals it only folds (the reaper's call: a quiet label's
 * rate decays without any request).
 *
 * Each requestor's arrivals count up to REQUESTOR_ARRIVALS_PER_MINUTE a minute (`byRequestor` keeps what
 * each counted; `arrivals` as a number: the requests that name none). A negative count takes back the
 * requestor's quick releases (requests released within seconds of their placement) from what was not
 * folded into the weekly profile yet, the minute pending first, then the hour's count, and never more
 * than that requestor counted in the hour: its arrival was counted when it was placed (the next minutes'
 * ready room saw it), but it teaches the weeks ahead nothing, and no requestor can take back another's
 * arrivals. Undefined when there is nothing to write (nothing counted or taken back, and no minute
 * ended).
 */
export function withArrivals(
  prev: ArrivalModel | undefined,
  label: string,
  arrivals: number | readonly ArrivalCount[],
  now: number,
): ArrivalModel | undefined {
  const minute = minuteOf(now);
  const base = prev ?? emptyModel(label, minute);
  let model = base;
  if (minute > base.nextMinute) {
    // The pending arrivals are the minute nextMinute's; the minutes after it, up to this one, saw none.
    model = observe(observe(base, base.nextMinute + 1, base.pending), minute, 0);
    model = { ...model, pending: 0 };
  }
  const folded = model !== base;
  const hour = Math.floor(minute / 60);
  const counts = typeof arrivals === 'number' ? [{ count: arrivals }] : arrivals;
  const entries = (model.byRequestor ?? [])
    .filter((e) => e.minute === minute || (e.hour === hour && e.inHour > 0))
    .map((e) => ({
      ...e,
      ...(e.minute === minute ? {} : { minute, inMinute: 0 }),
      ...(e.hour === hour ? {} : { hour, inHour: 0 }),
    }));
  let { pending, hourCount } = model;
  let changed = false;
  for (const { requestor, count } of counts) {
    if (!(count !== 0 && Number.isFinite(count))) continue;
    let entry = entries.find((e) => e.requestor === requestor);
    if (count > 0) {
      if (!entry) {
        entry = { ...(requestor === undefined ? {} : { requestor }), minute, inMinute: 0, hour, inHour: 0 };
        entries.push(entry);
      }
      const counted = Math.min(count, Math.max(0, REQUESTOR_ARRIVALS_PER_MINUTE - entry.inMinute));
      if (counted <= 0) continue;
      entry.inMinute += counted;
      entry.inHour += counted;
      pending += counted;
      changed = true;
    } else if (entry && entry.inHour > 0) {
      const back = Math.min(-count, entry.inHour);
      entry.inHour -= back;
      const fromPending = Math.min(back, pending);
      pending -= fromPending;
      hourCount = settled(Math.max(0, hourCount - (back - fromPending)));
      changed = true;
    }
  }
  if (prev && !changed && !folded) return undefined;
  // The ones that counted most in this minute, then in this hour, first: at most MAX_COUNTED_REQUESTORS
  // (the item stays bounded; a heavy requestor is the last one forgotten).
  const byRequestor = entries
    .filter((e) => e.inMinute > 0 || e.inHour > 0)
    .sort((a, b) => b.inMinute - a.inMinute || b.inHour - a.inHour)
    .slice(0, MAX_COUNTED_REQUESTORS);
  return {
    ...model,
    pending,
    hourCount,
    byRequestor,
    updatedAt: now,
    version: prev ? prev.version + 1 : 1,
  };
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
