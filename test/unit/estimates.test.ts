import { describe, expect, it } from 'vitest';
import {
  type DurationEstimate,
  ESTIMATE_MIN_SAMPLES,
  expectedOf,
  isExpired,
  keptSeconds,
  LEARNING_RATE,
  MAX_SPREAD_FACTOR,
  MAX_STEP_FACTOR,
  REQUESTOR_ESTIMATE_TTL_MS,
  withDuration,
  withDurations,
} from '../../shared/core/estimates.ts';

/** Learned duration estimates (issue 15, part 2): a robust running log-mean per label and requestor. */

const learn = (durations: number[], key: { label: string; requestor?: string } = { label: 'small' }) =>
  durations.reduce<DurationEstimate | undefined>(
    (e, d, i) => withDuration(e, key, d, i),
    undefined,
  ) as DurationEstimate;

describe('duration estimates', () => {
  it('starts as the geometric mean of the first durations', () => {
    const e = learn([60, 240]);
    expect(Math.exp(e.logSeconds)).toBeCloseTo(120, 9);
    expect(e).toMatchObject({ label: 'small', samples: 2, version: 2 });
  });

  it('folds several durations into one write (one version more than the one read), as one by one', () => {
    const prev = learn([60, 60, 60]);
    const folded = withDurations(prev, { label: 'small' }, [120, 240, 30], 10) as DurationEstimate;
    const oneByOne = learn([60, 60, 60, 120, 240, 30]);
    expect(folded).toEqual({ ...oneByOne, version: prev.version + 1, updatedAt: 10 });
    expect(withDurations(prev, { label: 'small' }, [], 10)).toBeUndefined();
  });

  it("lets a requestor's estimate lapse REQUESTOR_ESTIMATE_TTL_MS after its last duration, then starts afresh", () => {
    const key = { label: 'small', requestor: 'ci' };
    const own = learn([60, 60, 60], key);
    expect(own.expiresAt).toBe(Math.ceil((2 + REQUESTOR_ESTIMATE_TTL_MS) / 1000));
    expect(isExpired(own, 2 + REQUESTOR_ESTIMATE_TTL_MS - 1_000)).toBe(false);
    const lapsed = 2 + REQUESTOR_ESTIMATE_TTL_MS + 1_000;
    expect(isExpired(own, lapsed)).toBe(true);
    expect(withDuration(own, key, 600, lapsed)).toMatchObject({ samples: 1, version: 4 });
    expect(learn([60]).expiresAt).toBeUndefined(); // a label's does not lapse
  });

  it('is moved at most x2 by one outlier once it is used, and follows a lasting change', () => {
    const steady = learn(Array(20).fill(600));
    const hung = withDuration(steady, { label: 'small' }, 86_400, 99);
    const moved = Math.exp(hung.logSeconds) / 600;
    expect(moved).toBeGreaterThan(1);
    expect(moved).toBeLessThanOrEqual(MAX_STEP_FACTOR ** Math.max(LEARNING_RATE, 1 / 21) + 1e-9);
    // Jobs that now take 10x longer: the estimate gets there within ~100 releases.
    const changed = learn([...Array(20).fill(600), ...Array(100).fill(6000)]);
    expect(Math.exp(changed.logSeconds)).toBeGreaterThan(5000);
  });

  it("prefers the requestor's own estimate once it has enough durations, else the label's", () => {
    const label = learn([600, 600, 600]);
    const few = learn([60, 60], { label: 'small', requestor: 'ci' });
    const enough = learn([60, 60, 60], { label: 'small', requestor: 'ci' });
    expect(expectedOf(label, few)?.seconds).toBeCloseTo(600, 6);
    expect(expectedOf(label, enough)?.seconds).toBeCloseTo(60, 6);
    expect(expectedOf(learn([600, 600]), undefined)).toBeUndefined(); // fewer than ESTIMATE_MIN_SAMPLES
    expect(ESTIMATE_MIN_SAMPLES).toBe(3);
  });

  it('is confident only while the durations stay within about x2 of it; a rough one is still recorded', () => {
    const tight = learn([500, 600, 700, 650, 550]);
    expect(Math.sqrt(tight.logVariance)).toBeLessThan(Math.log(MAX_SPREAD_FACTOR));
    expect(expectedOf(tight, undefined)).toMatchObject({ confident: true });
    const wide = learn([10, 3600, 30, 7200, 60]); // seconds to hours: says little about the next one
    expect(expectedOf(wide, undefined)).toMatchObject({ confident: false });
    // A confident requestor's estimate wins over a rough one of the label, and a confident label's over a
    // rough requestor's.
    const own = learn([60, 70, 65], { label: 'small', requestor: 'lint' });
    expect(expectedOf(wide, own)?.seconds).toBeCloseTo(Math.exp(own.logSeconds), 9);
    const roughOwn = learn([5, 5000, 50], { label: 'small', requestor: 'mixed' });
    expect(expectedOf(tight, roughOwn)).toMatchObject({
      confident: true,
      seconds: Math.exp(tight.logSeconds),
    });
  });

  it('measures a node from ready to released; a node never ready teaches nothing', () => {
    expect(keptSeconds({ readyAt: 1_000, releasedAt: 61_000 })).toBe(60);
    expect(keptSeconds({ releasedAt: 61_000 })).toBeUndefined();
    expect(keptSeconds({ readyAt: 5_000, releasedAt: 5_000 })).toBeUndefined();
  });
});
