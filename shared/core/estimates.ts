import { z } from 'zod';

/**
 * Learned duration estimates (duration-aware placement without a hint): how long nodes of a label are
 * kept, per label and per label and requestor, learned from the nodes released. A request without
 * `expected-duration` is placed as if it had said the estimate (core/backing.ts, compareByExpectedEnd).
 *
 * The estimate is a running mean of log-durations, robust to outliers: while it has seen few durations
 * it is their plain log-mean; then each new duration moves it by a fixed share (EWMA, so it follows a
 * label whose jobs change), and never by more than a factor MAX_STEP_FACTOR, so one job that hung for
 * a day does not make every later job look long. Its exponential is the geometric mean: the median of
 * log-normal durations, which CI jobs roughly follow.
 */
export const DurationEstimate = z.object({
  label: z.string(),
  /** Absent: the label's estimate over every requestor. */
  requestor: z.string().optional(),
  /** Natural logarithm of seconds. */
  logSeconds: z.number(),
  /** How widely the durations spread around it: the running variance of their logarithms. */
  logVariance: z.number().nonnegative().default(0),
  /** Durations learned so far (it stops counting at SAMPLES_CAP). */
  samples: z.number().int().positive(),
  version: z.number().int().positive(),
  updatedAt: z.number(),
  /**
   * A requestor's estimate only: when it lapses, in epoch seconds (the table's TTL attribute), renewed by
   * each write. Readers take a lapsed one for none (isExpired): TTL deletes it only within days.
   */
  expiresAt: z.number().int().positive().optional(),
});
export type DurationEstimate = z.infer<typeof DurationEstimate>;

/** An estimate is used once it has learned this many durations. */
export const ESTIMATE_MIN_SAMPLES = 3;
/** The share a new duration gets once many are known: the last ~20 durations weigh most. */
export const LEARNING_RATE = 0.05;
/** Once it is used, one duration moves the estimate by at most this factor, up or down. */
export const MAX_STEP_FACTOR = 2;
/**
 * An estimate is used only while the durations it learned stay within about this factor of it (their
 * log standard deviation is at most its logarithm): a label whose jobs run from seconds to hours says
 * little about the next one, and placing by a guess that wrong packs worse than not guessing.
 */
export const MAX_SPREAD_FACTOR = 2;
/** A duration moves the spread by at most this factor's logarithm, squared (one hung job is one outlier). */
const MAX_SPREAD_STEP_FACTOR = 16;
/** `samples` stops counting here (it only decides the share of a new duration). */
const SAMPLES_CAP = 1_000_000;
/**
 * A requestor's estimate lapses this long after its last duration, and the table's TTL deletes it: a
 * requestor named once (a CI job's own id) leaves no item behind for good. A label's is kept.
 */
export const REQUESTOR_ESTIMATE_TTL_MS = 30 * 24 * 3600_000;

/** Whether an estimate has lapsed (a requestor's, REQUESTOR_ESTIMATE_TTL_MS after its last duration). */
export function isExpired(e: DurationEstimate, now: number): boolean {
  return e.expiresAt !== undefined && e.expiresAt * 1000 <= now;
}

/**
 * The estimate after one more duration (seconds > 0). A lapsed one starts afresh (its version goes on:
 * the item is there until TTL deletes it).
 */
export function withDuration(
  prev: DurationEstimate | undefined,
  key: { readonly label: string; readonly requestor?: string },
  seconds: number,
  now: number,
): DurationEstimate {
  const x = Math.log(Math.max(seconds, 0.001));
  const expiry =
    key.requestor === undefined ? {} : { expiresAt: Math.ceil((now + REQUESTOR_ESTIMATE_TTL_MS) / 1000) };
  if (!prev || isExpired(prev, now)) {
    return {
      label: key.label,
      ...(key.requestor === undefined ? {} : { requestor: key.requestor }),
      logSeconds: x,
      logVariance: 0,
      samples: 1,
      version: (prev?.version ?? 0) + 1,
      updatedAt: now,
      ...expiry,
    };
  }
  const share = Math.max(LEARNING_RATE, 1 / (prev.samples + 1));
  const maxStep = Math.log(MAX_STEP_FACTOR);
  const diff = x - prev.logSeconds;
  const step = prev.samples >= ESTIMATE_MIN_SAMPLES ? Math.max(-maxStep, Math.min(maxStep, diff)) : diff;
  const spreadStep = Math.min(Math.abs(diff), Math.log(MAX_SPREAD_STEP_FACTOR));
  return {
    ...prev,
    logSeconds: prev.logSeconds + share * step,
    // The exponentially weighted variance (its first samples: their population variance).
    logVariance: (1 - share) * (prev.logVariance + share * spreadStep * spreadStep),
    samples: Math.min(SAMPLES_CAP, prev.samples + 1),
    version: prev.version + 1,
    updatedAt: now,
    ...expiry,
  };
}

/**
 * The estimate after several durations, in order: one write's worth (its version one more than prev's,
 * which the write is conditional on).
 */
export function withDurations(
  prev: DurationEstimate | undefined,
  key: { readonly label: string; readonly requestor?: string },
  durations: readonly number[],
  now: number,
): DurationEstimate | undefined {
  let next = prev;
  for (const seconds of durations) next = withDuration(next, key, seconds, now);
  return next && next !== prev ? { ...next, version: (prev?.version ?? 0) + 1 } : undefined;
}

/** What the pool expects of a node without a hint: seconds, and whether it is sure enough to place by it. */
export interface Expected {
  readonly seconds: number;
  /** Its durations stay within about MAX_SPREAD_FACTOR of it: placement orders candidates by it. */
  readonly confident: boolean;
}

/**
 * The expected duration of a node of a request without a hint: the requestor's own estimate for the
 * label once it has learned ESTIMATE_MIN_SAMPLES durations, else the label's, else none (today's order).
 * A confident one (durations within about MAX_SPREAD_FACTOR of it; the requestor's first, then the
 * label's) orders the node's candidates; any one is recorded as the node's expected end, so that nodes
 * placed by theirs know when its backing node is expected to empty.
 */
export function expectedOf(
  label: DurationEstimate | undefined,
  requestor: DurationEstimate | undefined,
): Expected | undefined {
  const known = [requestor, label].filter(
    (e): e is DurationEstimate => e !== undefined && e.samples >= ESTIMATE_MIN_SAMPLES,
  );
  const sure = known.find((e) => Math.sqrt(e.logVariance) <= Math.log(MAX_SPREAD_FACTOR));
  const best = sure ?? known[0];
  return best ? { seconds: Math.exp(best.logSeconds), confident: sure !== undefined } : undefined;
}

/** How long a released node was kept: from ready to released, in seconds; undefined if never ready. */
export function keptSeconds(node: {
  readonly readyAt?: number;
  readonly releasedAt?: number;
}): number | undefined {
  if (node.readyAt === undefined || node.releasedAt === undefined) return undefined;
  const seconds = (node.releasedAt - node.readyAt) / 1000;
  return seconds > 0 ? seconds : undefined;
}
