/**
 * The reaper's steps after its reconciliation (usecases/reap/reap.ts), in their usual order, and how a run
 * that ran out of time hands over to the next one. Each run is bounded by its invocation's time: a run
 * cut short leaves the rest of its work where the next run finds it (the reap partitions). Without a
 * rotation, a step with a burst of work (hundreds of idle backing nodes to retire) would use up run after
 * run, and the steps after it (request timeouts, leases, min-ready) would not run for as long as the burst
 * lasts. So the next run starts with the step after the one the time ran out in, and comes round to that
 * one last; once a run finishes every step, the next starts in the usual order again.
 */
export const REAPER_STEPS = [
  'retire',
  'deadlines',
  'drain',
  'claims',
  'readying',
  'failed',
  'capacity',
  'request-timeout',
  'pending-timeout',
  'lease-expiry',
  'min-ready',
] as const;
export type ReaperStep = (typeof REAPER_STEPS)[number];

/** The steps of a run that starts with `first` (unknown or unset: the usual order), each once. */
export function stepOrder(first: string | undefined): ReaperStep[] {
  const at = REAPER_STEPS.indexOf(first as ReaperStep);
  return at <= 0 ? [...REAPER_STEPS] : [...REAPER_STEPS.slice(at), ...REAPER_STEPS.slice(0, at)];
}

/**
 * The step the next run starts with, given this run's order and the index of the last step it started:
 * the one after it when the run left work for later (`deferred`), else undefined (the usual order).
 */
export function nextFirstStep(
  order: readonly ReaperStep[],
  lastStarted: number,
  deferred: boolean,
): ReaperStep | undefined {
  if (!deferred || order.length === 0) return undefined;
  const next = order[(lastStarted + 1) % order.length];
  return next === REAPER_STEPS[0] ? undefined : next;
}
