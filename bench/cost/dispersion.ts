/** How much a trace's arrival rate moves, for the readiness summary (readiness.ts). */

/** The window of rateDispersion: long against a boot time, short against a day's swing. */
export const DISPERSION_WINDOW_S = 900;

/**
 * The variance over the mean of the arrivals counted in consecutive DISPERSION_WINDOW_S windows (the
 * index of dispersion): about 1 when arrivals keep one Poisson rate, the larger the more the rate moves
 * (a day's swing, bursts). Where it is about 1 the cheapest hold for a share is one number, which a
 * forecast can find but not beat.
 */
export function rateDispersion(arrivalsMs: readonly number[]): number {
  if (arrivalsMs.length === 0) return Number.NaN;
  // A loop, not Math.min(...): a trace of a few hundred thousand arrivals overflows the call's arguments.
  let first = Number.POSITIVE_INFINITY;
  let last = Number.NEGATIVE_INFINITY;
  for (const t of arrivalsMs) {
    first = Math.min(first, t);
    last = Math.max(last, t);
  }
  const counts = new Array<number>(
    Math.max(1, Math.floor((last - first) / (DISPERSION_WINDOW_S * 1000))),
  ).fill(0);
  for (const t of arrivalsMs) {
    const i = Math.floor((t - first) / (DISPERSION_WINDOW_S * 1000));
    if (i < counts.length) counts[i] = (counts[i] as number) + 1; // the last part-window left out
  }
  const mean = counts.reduce((a, b) => a + b, 0) / counts.length;
  const variance = counts.reduce((a, c) => a + (c - mean) ** 2, 0) / Math.max(1, counts.length - 1);
  return mean > 0 ? variance / mean : Number.NaN;
}
