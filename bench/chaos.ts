/**
 * The chaos suite at full size (or any size): the same run as test/chaos/*.test.ts (see
 * testkit/chaos.ts), with progress lines, for longer runs than `npm test` affords.
 *
 *   npm run test:chaos                                  1,000 requests, a fresh seed
 *   npm run test:chaos -- --requests 300 --seed 42      a size, a seed (replay)
 *   npm run test:chaos -- --runs 5                      five runs with consecutive seeds
 *   npm run test:chaos -- --no-node-cap                 the metastatic pool without max-servers
 *   npm run test:chaos -- --ready-auto                  the label with min-ready: auto (max-ready 4)
 *   npm run test:chaos -- --reaper-every 10             the reaper every 10 ticks (1 s virtual), as in
 *                                                       `npm test`; default: every tick (most interleavings)
 *   npm run test:chaos -- --seed 42 --trace req-18/,bn-0123456789abcdef
 *                                                       every write touching those ids, with a failure
 *
 * CHAOS_REQUESTS / CHAOS_SEED / CHAOS_TRACE are read too (flags win). Exits 1 on the first run that
 * breaks an invariant, printing the violations (with ids) and the seed to replay it.
 */
import { ChaosFailure, formatFailure, formatSummary, runChaos } from '../testkit/chaos.ts';
import { parseSeed } from '../testkit/chaosRandom.ts';

function flag(name: string): string | undefined {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  if (i < 0) return undefined;
  const value = args[i + 1];
  if (value === undefined || value.startsWith('--')) throw new Error(`--${name} needs a value`);
  return value;
}

function positive(text: string, what: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${what} must be a positive integer, got ${text}`);
  return n;
}

async function main(): Promise<number> {
  const requests = positive(flag('requests') ?? process.env.CHAOS_REQUESTS ?? '1000', '--requests');
  const runs = positive(flag('runs') ?? '1', '--runs');
  const reaperEveryTicks = positive(flag('reaper-every') ?? '1', '--reaper-every');
  const firstSeed = parseSeed(flag('seed') ?? process.env.CHAOS_SEED);
  const trace = (flag('trace') ?? process.env.CHAOS_TRACE ?? '').split(',').filter((s) => s !== '');
  for (let i = 0; i < runs; i++) {
    const seed = (firstSeed + i) >>> 0;
    console.log(`chaos: run ${i + 1}/${runs}, seed ${seed}, ${requests} requests`);
    try {
      const report = await runChaos({
        requests,
        seed,
        trace,
        nodeCap: !process.argv.includes('--no-node-cap'),
        readyAuto: process.argv.includes('--ready-auto'),
        reaperEveryTicks,
        // A Scan of a large table is not free: check less often on long runs.
        checkEveryTicks: requests > 300 ? 50 : 20,
        progress: (line) => console.log(`  ${line}`),
      });
      console.log(formatSummary(report));
    } catch (err) {
      if (!(err instanceof ChaosFailure)) throw err;
      console.error(formatFailure(err.report));
      return 1;
    }
  }
  return 0;
}

process.exitCode = await main();
