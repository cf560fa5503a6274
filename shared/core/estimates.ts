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
  /** Durations learned so far (it stops counting at SAMPLES_CAP). */
  samples: z.number().int().positive(),
  version: z.number().int().positive(),
  updatedAt: z.number(),
});
export type DurationEstimate = z.infer<typeof DurationEstimate>;

/** An estimate is used once it has learned this many durations. */
export const ESTIMATE_MIN_SAMPLES = 3;
/** The share a new duration gets once many are known: the last ~20 durations weigh most. */
export const LEARNING_RATE = 0.05;
/** Once it is used, one duration moves the estimate by at most this factor, up or down. */
export const MAX_STEP_FACTOR = 2;
/** `samples` stops counting here (it only decides the share of a new duration). */
const SAMPLES_CAP = 1_000_000;

/** The estimate after one more duration (seconds > 0). */
export function withDuration(
  prev: DurationEstimate | undefined,
  key: { readonly label: string; readonly requestor?: string },
  seconds: number,
  now: number,
): DurationEstimate {
  const x = Math.log(Math.max(seconds, 0.001));
  if (!prev) {
    return {
      label: key.label,
      ...(key.requestor === undefined ? {} : { requestor: key.requestor }),
      logSeconds: x,
      samples: 1,
      version: 1,
      updatedAt: now,
    };
  }
  const share = Math.max(LEARNING_RATE, 1 / (prev.samples + 1));
  const maxStep = Math.log(MAX_STEP_FACTOR);
  let step = x - prev.logSeconds;
  if (prev.samples >= ESTIMATE_MIN_SAMPLES) step = Math.max(-maxStep, Math.min(maxStep, step));
  return {
    ...prev,
    logSeconds: prev.logSeconds + share * step,
    samples: Math.min(SAMPLES_CAP, prev.samples + 1),
    version: prev.version + 1,
    updatedAt: now,
  };
}

/**
 * The expected duration (seconds) a node of a request without a hint is placed with: the requestor's
 * own estimate for the label once it has learned enough, else the label's, else none (today's order).
 */
export function estimatedSeconds(
  label: DurationEstimate | undefined,
  requestor: DurationEstimate | undefined,
): number | undefined {
  for (const e of [requestor, label]) {
    if (e && e.samples >= ESTIMATE_MIN_SAMPLES) return Math.exp(e.logSeconds);
  }
  return undefined;
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
