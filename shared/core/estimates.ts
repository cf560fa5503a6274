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
/**
 * One requestor's share of a label's estimate (the requests that name none share one, `requestor` absent):
 * its own running log-mean, kept in the label's item so the label-wide estimate can weigh requestors
 * instead of releases (labelWide). Kept while among the MAX_PARTS most recently taught: like the label's
 * item, a share does not lapse.
 */
export const EstimatePart = z.object({
  requestor: z.string().optional(),
  logSeconds: z.number(),
  logVariance: z.number().nonnegative(),
  samples: z.number().int().positive(),
  updatedAt: z.number(),
});
export type EstimatePart = z.infer<typeof EstimatePart>;

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
  /**
   * The label's item only: each requestor's share, the MAX_PARTS most recently taught. The label-wide
   * estimate placement uses is built from these (labelWide); `logSeconds`, `logVariance` and `samples`
   * above stay every release's running mean, shown but not placed by.
   */
  parts: z.array(EstimatePart).optional(),
});
export type DurationEstimate = z.infer<typeof DurationEstimate>;

/** A duration to learn, and who taught it (the request's requestor; absent: a request that named none). */
export interface Taught {
  readonly seconds: number;
  readonly from?: string | undefined;
}

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
 * Requestors a label's item keeps a share of (the most recently taught): a bounded item whatever the
 * number of requestors (a CI job's own id as requestor makes one per job).
 */
export const MAX_PARTS = 32;
/**
 * A requestor's weight in the label-wide estimate grows with its durations up to this many (about the
 * EWMA's memory, 1 / LEARNING_RATE): past it, more releases by one requestor buy no more say.
 */
export const PART_WEIGHT_CAP = 20;

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
  from?: string,
): DurationEstimate {
  const x = Math.log(Math.max(seconds, 0.001));
  const expiry =
    key.requestor === undefined ? {} : { expiresAt: Math.ceil((now + REQUESTOR_ESTIMATE_TTL_MS) / 1000) };
  // The label's item keeps each requestor's share (`from`: who taught this duration).
  const parts = key.requestor === undefined ? { parts: withPart(prev?.parts ?? [], from, x, now) } : {};
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
      ...parts,
    };
  }
  return { ...prev, ...learned(prev, x), version: prev.version + 1, updatedAt: now, ...expiry, ...parts };
}

type Stats = Pick<DurationEstimate, 'logSeconds' | 'logVariance' | 'samples'>;

/** A running log-mean after one more log-duration `x`: the rule withDuration describes. */
function learned(prev: Stats, x: number): Stats {
  const share = Math.max(LEARNING_RATE, 1 / (prev.samples + 1));
  const maxStep = Math.log(MAX_STEP_FACTOR);
  const diff = x - prev.logSeconds;
  const step = prev.samples >= ESTIMATE_MIN_SAMPLES ? Math.max(-maxStep, Math.min(maxStep, diff)) : diff;
  const spreadStep = Math.min(Math.abs(diff), Math.log(MAX_SPREAD_STEP_FACTOR));
  return {
    logSeconds: prev.logSeconds + share * step,
    // The exponentially weighted variance (its first samples: their population variance).
    logVariance: (1 - share) * (prev.logVariance + share * spreadStep * spreadStep),
    samples: Math.min(SAMPLES_CAP, prev.samples + 1),
  };
}

/** The label's parts after one more duration from `from`: its part learns it, the newest MAX_PARTS kept. */
function withPart(
  parts: readonly EstimatePart[],
  from: string | undefined,
  x: number,
  now: number,
): EstimatePart[] {
  const prev = parts.find((p) => p.requestor === from);
  const stats = prev ? learned(prev, x) : { logSeconds: x, logVariance: 0, samples: 1 };
  const part: EstimatePart = { ...(from === undefined ? {} : { requestor: from }), ...stats, updatedAt: now };
  const others = parts.filter((p) => p.requestor !== from);
  return [part, ...others.sort((a, b) => b.updatedAt - a.updatedAt)].slice(0, MAX_PARTS);
}

/**
 * The label-wide estimate, as placement uses it: the requestors' parts pooled, each weighing its
 * durations up to PART_WEIGHT_CAP, and none more than all the others together. So one requestor (or the
 * requests that name none, taken as one) cannot make the label's estimate alone, and can pull it at most
 * halfway (in log) toward its own durations; the spread between requestors counts in its variance, so
 * requestors that disagree leave it rough (not confident). A label taught by one requestor only has none:
 * that requestor's requests use their own. Requestors are not authenticated: a sender naming many
 * requestors is not bounded by this (docs/threat-model.md).
 */
export function labelWide(label: DurationEstimate | undefined): Stats | undefined {
  const parts = label?.parts ?? [];
  const weights = parts.map((p) => Math.min(p.samples, PART_WEIGHT_CAP));
  const total = weights.reduce((a, b) => a + b, 0);
  const capped = weights.map((w) => Math.min(w, total - w));
  const sum = capped.reduce((a, b) => a + b, 0);
  if (sum <= 0) return undefined;
  const mean = parts.reduce((acc, p, i) => acc + (capped[i] as number) * p.logSeconds, 0) / sum;
  const variance =
    parts.reduce(
      (acc, p, i) => acc + (capped[i] as number) * (p.logVariance + (p.logSeconds - mean) ** 2),
      0,
    ) / sum;
  return { logSeconds: mean, logVariance: variance, samples: Math.floor(sum) };
}

/** The part of the label's item that the requests naming no requestor taught: their own estimate. */
export function anonymousPart(label: DurationEstimate | undefined): Stats | undefined {
  return label?.parts?.find((p) => p.requestor === undefined);
}

/**
 * The estimate after several durations, in order: one write's worth (its version one more than prev's,
 * which the write is conditional on).
 */
export function withDurations(
  prev: DurationEstimate | undefined,
  key: { readonly label: string; readonly requestor?: string },
  durations: readonly (number | Taught)[],
  now: number,
): DurationEstimate | undefined {
  let next = prev;
  for (const d of durations) {
    next =
      typeof d === 'number'
        ? withDuration(next, key, d, now)
        : withDuration(next, key, d.seconds, now, d.from);
  }
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
 * label once it has learned ESTIMATE_MIN_SAMPLES durations (a request naming no requestor: the share of
 * those that name none, anonymousPart), else the label-wide one (labelWide), else none (today's order).
 * A confident one (durations within about MAX_SPREAD_FACTOR of it; the requestor's first, then the
 * label's) orders the node's candidates; any one is recorded as the node's expected end, so that nodes
 * placed by theirs know when its backing node is expected to empty.
 */
export function expectedOf(
  label: DurationEstimate | undefined,
  own: Stats | undefined,
): Expected | undefined {
  const known = [own, labelWide(label)].filter(
    (e): e is Stats => e !== undefined && e.samples >= ESTIMATE_MIN_SAMPLES,
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
