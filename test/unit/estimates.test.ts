import { describe, expect, it } from 'vitest';
import {
  anonymousPart,
  type DurationEstimate,
  ESTIMATE_MIN_SAMPLES,
  expectedOf,
  isExpired,
  keptSeconds,
  LEARNING_RATE,
  labelWide,
  MAX_PARTS,
  MAX_SPREAD_FACTOR,
  MAX_STEP_FACTOR,
  PART_WEIGHT_CAP,
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

/** The label's item after each duration, taught in turn by each of `from` (round-robin). */
const taught = (durations: number[], ...from: string[]) =>
  durations.reduce<DurationEstimate | undefined>(
    (e, d, i) =>
      withDurations(
        e,
        { label: 'small' },
        from.map((f) => ({ seconds: d, from: f })),
        i,
      ),
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
    const share = { ...oneByOne.parts?.[0], updatedAt: 10 }; // the share of the requests naming none
    expect(folded).toEqual({ ...oneByOne, version: prev.version + 1, updatedAt: 10, parts: [share] });
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
    const label = taught([600, 600, 600], 'a', 'b');
    const few = learn([60, 60], { label: 'small', requestor: 'ci' });
    const enough = learn([60, 60, 60], { label: 'small', requestor: 'ci' });
    expect(expectedOf(label, few)?.seconds).toBeCloseTo(600, 6);
    expect(expectedOf(label, enough)?.seconds).toBeCloseTo(60, 6);
    expect(expectedOf(taught([600], 'a', 'b'), undefined)).toBeUndefined(); // fewer than ESTIMATE_MIN_SAMPLES
    expect(ESTIMATE_MIN_SAMPLES).toBe(3);
    // A request naming no requestor: its own is the share of those that name none.
    const anonymous = anonymousPart(withDurations(label, { label: 'small' }, [60, 60, 60], 9));
    expect(Math.exp(anonymous?.logSeconds ?? 0)).toBeCloseTo(60, 6);
  });

  it('is confident only while the durations stay within about x2 of it; a rough one is still recorded', () => {
    const tight = taught([500, 600, 700, 650, 550], 'a', 'b');
    expect(Math.sqrt(labelWide(tight)?.logVariance ?? 9)).toBeLessThan(Math.log(MAX_SPREAD_FACTOR));
    expect(expectedOf(tight, undefined)).toMatchObject({ confident: true });
    const wide = taught([10, 3600, 30, 7200, 60], 'a', 'b'); // seconds to hours: says little about the next one
    expect(expectedOf(wide, undefined)).toMatchObject({ confident: false });
    // A confident requestor's estimate wins over a rough one of the label, and a confident label's over a
    // rough requestor's.
    const own = learn([60, 70, 65], { label: 'small', requestor: 'lint' });
    expect(expectedOf(wide, own)?.seconds).toBeCloseTo(Math.exp(own.logSeconds), 9);
    const roughOwn = learn([5, 5000, 50], { label: 'small', requestor: 'mixed' });
    expect(expectedOf(tight, roughOwn)).toMatchObject({
      confident: true,
      seconds: Math.exp(labelWide(tight)?.logSeconds ?? 0),
    });
  });

  it("weighs requestors, not releases, in the label's estimate: none outweighs all the others (issue 25, defect 4)", () => {
    // One requestor alone makes no label-wide estimate, however many releases.
    const alone = taught(Array(100).fill(1), 'ci');
    expect(labelWide(alone)).toBeUndefined();
    expect(alone.samples).toBe(100); // every release is still counted on the item
    // Past PART_WEIGHT_CAP durations a requestor gains no more say, and never more than the others together.
    const flooded = (settled: DurationEstimate) =>
      withDurations(settled, { label: 'small' }, Array(500).fill({ seconds: 1, from: 'ci' }), 9);
    // Beside one other requestor: halfway in log, no further; beside two, a third of the way.
    const beside1 = flooded(taught(Array(PART_WEIGHT_CAP).fill(600), 'build'));
    expect(Math.exp(labelWide(beside1)?.logSeconds ?? 0)).toBeCloseTo(Math.sqrt(600), 6);
    expect(expectedOf(beside1, undefined)).toMatchObject({ confident: false });
    const settled = taught(Array(PART_WEIGHT_CAP).fill(600), 'build', 'test');
    const beside2 = flooded(settled);
    expect(Math.exp(labelWide(beside2)?.logSeconds ?? 0)).toBeCloseTo(600 ** (2 / 3), 6);
    expect(expectedOf(beside2, undefined)).toMatchObject({ confident: false });
    // A small requestor counts by its durations, up to the cap.
    const one = withDurations(settled, { label: 'small' }, [{ seconds: 60, from: 'lint' }], 9);
    const w = PART_WEIGHT_CAP;
    expect(labelWide(one)?.logSeconds).toBeCloseTo((2 * w * Math.log(600) + Math.log(60)) / (2 * w + 1), 9);
  });

  it('keeps the shares of the MAX_PARTS most recently taught requestors: a bounded item', () => {
    let e: DurationEstimate | undefined;
    for (let i = 0; i < MAX_PARTS + 10; i++) e = withDuration(e, { label: 'small' }, 60, i, `job-${i}`);
    expect(e?.parts).toHaveLength(MAX_PARTS);
    expect(e?.parts?.[0]?.requestor).toBe(`job-${MAX_PARTS + 9}`);
    expect(e?.parts?.some((p) => p.requestor === 'job-0')).toBe(false);
  });

  it('measures a node from ready to released; a node never ready teaches nothing', () => {
    expect(keptSeconds({ readyAt: 1_000, releasedAt: 61_000 })).toBe(60);
    expect(keptSeconds({ releasedAt: 61_000 })).toBeUndefined();
    expect(keptSeconds({ readyAt: 5_000, releasedAt: 5_000 })).toBeUndefined();
  });
});
