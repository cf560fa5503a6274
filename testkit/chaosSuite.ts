import { expect, it } from 'vitest';
import { formatSummary, runChaos } from './chaos.ts';
import { parseSeed } from './chaosRandom.ts';

/**
 * The chaos suite in `npm test` (see testkit/chaos.ts): the whole flow on the embedded engines and the
 * fake EC2, with launch failures, capacity errors, throttling, instance deaths, every message delivered
 * twice and a handler crash injected at each step boundary in turn; invariants checked throughout and at
 * the end. It runs at CHAOS_REQUESTS (default 100) with seed 1, once with and once without a max-servers
 * on the metastatic pool (the second with the label's `min-ready: auto` instead of min-ready 3: its
 * ready nodes follow the forecast, never above max-ready), each in a file of its own so the two run side
 * by side;
 * `npm run test:chaos` runs the full size with a fresh seed (bench/chaos.ts). The seed is printed:
 * CHAOS_SEED=<seed> replays the same choices, and CHAOS_TRACE=<id>,<id> adds every write touching those
 * ids to a failure's report.
 */
export function chaosTest(options: { nodeCap: boolean; readyAuto?: boolean; pool: string }): void {
  const requests = Number(process.env.CHAOS_REQUESTS ?? 100);
  // A fixed seed by default, so the gate is the same run every time (handlers still interleave on real
  // I/O); `npm run test:chaos` draws a fresh seed per run to keep finding new schedules.
  const seed = parseSeed(process.env.CHAOS_SEED ?? '1');
  const trace = (process.env.CHAOS_TRACE ?? '').split(',').filter((s) => s !== '');
  // 100 requests take 40-60 s here on a quiet machine and 110 s beside busy neighbours (load 7 on the
  // two cores, measured): three times that and more.
  const timeout = Math.max(360_000, requests * 3_600);
  it(`keeps every invariant under faults, ${options.pool} (${requests} requests, seed ${seed})`, {
    timeout,
  }, async () => {
    console.log(`chaos: seed ${seed}, ${requests} requests (replay with CHAOS_SEED=${seed})`);
    // The reaper at the cadence it has on AWS relative to the jobs (chaos.ts, reaperEveryTicks).
    // A violation throws a ChaosFailure naming the ids, the seed and the figures.
    const report = await runChaos({
      requests,
      seed,
      trace,
      nodeCap: options.nodeCap,
      readyAuto: options.readyAuto ?? false,
      reaperEveryTicks: 10,
    });
    console.log(formatSummary(report));
    expect(report.violations).toEqual([]);
    expect(report.fulfilled + report.failed).toBe(requests);
    // The faults really happened: a run that injected nothing would prove nothing.
    expect(report.crashes).toBeGreaterThan(0);
    expect(report.crashesByKind.reaper).toBeGreaterThan(0);
    // With max-servers, some died half-way through a capacity transaction (rolled back from its intent).
    if (options.nodeCap) expect(report.boundaries.insideTransactions).toBeGreaterThan(0);
    expect(report.duplicatesDelivered).toBeGreaterThan(0);
    expect(report.launches).toBeGreaterThan(0);
    expect(report.cancelsSent).toBeGreaterThan(0);
    expect(report.byShape).toBeGreaterThan(0);
    // min-ready was exercised: ready nodes made (the no-overshoot invariant is checked above), and with
    // min-ready 3 taken too. With `auto` a take needs a request to arrive after the forecast has risen,
    // which depends on the schedule, not on the code: of seeds 1-10 at 100 requests, 6 had a take on
    // c4f775e and 5 after the remembered candidates (a different 5; as many ready nodes made, 51 and 52,
    // and takes, 11 and 13), so a take is not what this run is gated on; the embedded tests of
    // `min-ready: auto` take one on purpose (test/embedded/minReady.test.ts, "a request takes a held ready node").
    expect(report.minReady.made).toBeGreaterThan(0);
    if (!options.readyAuto) expect(report.minReady.taken).toBeGreaterThan(0);
  });
}
