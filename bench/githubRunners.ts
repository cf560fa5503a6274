/**
 * GitHub Actions jobs in packed slots (issue 43), measured on an embedded pool with the GitHub bridge and
 * a GitHub API stand-in (testkit/githubPool.ts): a backing node is booted by a first job, then N jobs one
 * after another, each timed from its signed `queued` webhook to its runner's start report (a node on the
 * already-running backing node, a JIT configuration, an ssh session starting the runner), and from its
 * runner's exit to its node's release; then a burst of B jobs queued at once (4 slots per backing node,
 * 2 backing nodes: 8 run, the rest wait for a slot). GitHub API calls are counted by the stand-in. Alone:
 * `npx tsx bench/githubRunners.ts [--jobs N] [--burst B]`.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { GithubPool, jobPayload } from '../testkit/githubPool.ts';
import { quantile } from './common.ts';

const fmtMs = (ms: number) => `${Math.round(ms)} ms`;

/** One installation's REST budget an hour (GitHub Apps; 15,000 on Enterprise Cloud). */
const HOURLY_BUDGET = 5_000;

async function oneJob(pool: GithubPool, jobId: number): Promise<{ toRunner: number; toRelease: number }> {
  const sent = performance.now();
  const answer = await pool.deliver(jobPayload('queued', jobId));
  if (answer.status !== 202) throw new Error(`job ${jobId}: ${answer.status} ${answer.text}`);
  const runner = await pool.runnerOf(jobId);
  const started = performance.now();
  pool.github.finishJob(runner.name);
  await pool.released(jobId);
  return { toRunner: started - sent, toRelease: performance.now() - started };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { jobs: { type: 'string', default: '20' }, burst: { type: 'string', default: '16' } },
  });
  const jobs = Number(values.jobs);
  const burst = Number(values.burst);
  const pool = await GithubPool.start();
  try {
    const cold = await oneJob(pool, 1); // boots the backing node
    const warm: { toRunner: number; toRelease: number }[] = [];
    for (let i = 0; i < jobs; i += 1) warm.push(await oneJob(pool, 100 + i));
    await pool.settled();
    const burstStart = performance.now();
    const ids = Array.from({ length: burst }, (_, i) => 10_000 + i);
    await Promise.all(ids.map((id) => pool.deliver(jobPayload('queued', id))));
    await Promise.all(
      ids.map(async (id) => {
        const runner = await pool.runnerOf(id);
        pool.github.finishJob(runner.name);
        await pool.released(id);
      }),
    );
    const burstMs = performance.now() - burstStart;
    const runs = 1 + jobs + burst;
    const { tokens, jitConfigs } = pool.github.calls;
    const perJob = (tokens + jitConfigs) / runs;
    const rows: [string, string][] = [
      ['cold: webhook to runner started (a backing node boots)', fmtMs(cold.toRunner)],
      [
        'warm: webhook to runner started, p50',
        fmtMs(
          quantile(
            warm.map((w) => w.toRunner),
            0.5,
          ),
        ),
      ],
      [
        'warm: webhook to runner started, p90',
        fmtMs(
          quantile(
            warm.map((w) => w.toRunner),
            0.9,
          ),
        ),
      ],
      [
        'warm: runner exit to node released, p50',
        fmtMs(
          quantile(
            warm.map((w) => w.toRelease),
            0.5,
          ),
        ),
      ],
      [
        'warm: runner exit to node released, p90',
        fmtMs(
          quantile(
            warm.map((w) => w.toRelease),
            0.9,
          ),
        ),
      ],
      [`burst of ${burst} queued at once, all run and released`, fmtMs(burstMs)],
      [`GitHub calls for ${runs} jobs (tokens + jitconfig)`, `${tokens} + ${jitConfigs}`],
      ['GitHub calls per job', perJob.toFixed(3)],
      [
        `1,000 queued jobs in an hour: share of one installation's ${HOURLY_BUDGET} calls`,
        `${((1 + 1000) / HOURLY_BUDGET).toFixed(2)} (1 token + 1,000 jitconfig)`,
      ],
    ];
    for (const [what, figure] of rows) console.log(`${what.padEnd(74)} ${figure}`);
  } finally {
    await pool.close();
  }
}

await main();
